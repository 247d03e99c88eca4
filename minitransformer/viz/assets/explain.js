// The walkthrough player. It reads the page's data from the JSON script element and builds
// every element with createElement/textContent: no text from the data is ever parsed as HTML.
// Sentences are messages {m: key, a: {name: value}} rendered from the embedded catalogue of
// the language shown; the language toggle re-renders them and leaves the data untouched.
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("explain-data").textContent);
  const I18N = DATA.i18n || { langs: ["en"], names: {}, html: {}, messages: { en: {} } };
  const state = { step: 0, layer: DATA.layer || 0, head: DATA.head || 0, timer: null,
                  lang: DATA.lang || I18N.langs[0] };
  const $ = (id) => document.getElementById(id);

  // A message in the current language ({name} replaced by its argument, itself maybe a
  // message); plain strings and numbers (formulas, tokens) come back as they are.
  function tr(x) {
    if (x === null || x === undefined) return "";
    if (typeof x !== "object") return String(x);
    const template = I18N.messages[state.lang][x.m];
    if (template === undefined) return x.m;
    return template.replace(/\{(\w+)\}/g, (all, name) =>
      Object.prototype.hasOwnProperty.call(x.a || {}, name) ? tr(x.a[name]) : all);
  }
  const ui = (key, args) => tr({ m: "ui." + key, a: args || {} });

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // "{layer}" and "{head}" in titles (left by tr, never user text) follow the selection.
  function fill(text) {
    return tr(text).replaceAll("{layer}", String(state.layer))
      .replaceAll("{head}", String(state.head));
  }

  function pick(block) {
    if (block.scope === "layer") return block.values[state.layer];
    if (block.scope === "head") return block.values[state.layer][state.head];
    return block.values;
  }

  function fmt(v) {
    if (v === null) return "\u2212\u221e";
    const a = Math.abs(v);
    if (a >= 1000) return v.toExponential(1).replace("-", "\u2212");
    const text = v.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : 2);
    return Number(text) === 0 ? text.replace("-", "") : text.replace("-", "\u2212");
  }

  function colour(v, kind, scale) {
    if (kind === "prob") {
      const t = Math.max(0, Math.min(1, v));
      return [`rgb(${Math.round(255 - 208 * t)},${Math.round(255 - 160 * t)},` +
              `${Math.round(255 - 76 * t)})`, t > 0.55];
    }
    const t = scale > 0 ? Math.max(-1, Math.min(1, v / scale)) : 0;
    const r = t < 0 ? 255 + 150 * t : 255, g = 255 - 175 * Math.abs(t),
      b = t > 0 ? 255 - 150 * t : 255;
    return [`rgb(${Math.round(r)},${Math.round(g)},${Math.round(b)})`, Math.abs(t) > 0.7];
  }

  const CJK = /[\u2E80-\u9FFF\uAC00-\uD7AF\uF900-\uFAFF\uFF00-\uFFEF]/;

  function matrix(block) {
    const values = pick(block);
    const cols = values.length ? values[0].length : 0;
    const showNumbers = cols <= 16 && values.length <= 40;
    let scale = 0;
    for (const row of values) for (const v of row) if (v !== null) scale = Math.max(scale, Math.abs(v));
    const colLabels = (block.cols || Array.from({ length: cols }, (_, j) => String(j))).map(tr);
    const upright = colLabels.every((c) => c.length <= 2);
    const table = el("table", {
      id: block.id,
      class: "matrix" + (showNumbers ? " numbers" : "") + (upright ? "" : " vertical"),
      "data-layer": state.layer, "data-head": state.head,
      "data-rows": values.length, "data-cols": cols,
    });
    const head = el("thead"), hr = el("tr");
    hr.appendChild(el("th"));
    // in a vertical header, CJK stands upright (reading down), other text turns to read up
    colLabels.forEach((c) => hr.appendChild(el("th", CJK.test(c) ? { scope: "col", class: "cjk" }
      : { scope: "col" }, c)));
    head.appendChild(hr);
    table.appendChild(head);
    const body = el("tbody");
    values.forEach((row, i) => {
      const line = el("tr");
      line.appendChild(el("th", { scope: "row" }, block.rows ? block.rows[i] : String(i)));
      row.forEach((v, j) => {
        const td = el("td", { "data-value": v === null ? "-Infinity" : v });
        td.title = `${block.rows ? block.rows[i] : i} \u2192 ${colLabels[j]}: ` +
          (v === null ? ui("masked") : String(v));
        if (v === null) {
          td.className = "masked";
          if (showNumbers) td.textContent = "\u2212\u221e";
        } else {
          const [bg, dark] = colour(v, block.color, scale);
          td.style.background = bg;
          if (dark) td.style.color = "#fff";
          if (showNumbers) td.textContent = fmt(v);
        }
        line.appendChild(td);
      });
      body.appendChild(line);
    });
    table.appendChild(body);
    const wrap = el("div", { class: "heatmap" });
    wrap.appendChild(table);
    wrap.appendChild(legend(block.color, scale));
    return wrap;
  }

  // The colour scale beside every heatmap: probabilities from 0 to 1, other values from
  // -max to +max of what is shown (blue below zero, red above).
  function legend(kind, scale) {
    const box = el("div", { class: "legend", "data-kind": kind === "prob" ? "prob" : "value" });
    const stops = kind === "prob" ? [0, 0.25, 0.5, 0.75, 1] : [-1, -0.5, 0, 0.5, 1];
    const colours = stops.map((t) => colour(kind === "prob" ? t : t * scale, kind, scale)[0]);
    const bar = el("span", { class: "bar" });
    bar.style.background = `linear-gradient(to right, ${colours.join(", ")})`;
    const lo = kind === "prob" ? "0" : fmt(-scale), hi = kind === "prob" ? "1" : fmt(scale);
    box.appendChild(el("span", { class: "lo" }, lo));
    box.appendChild(bar);
    box.appendChild(el("span", { class: "hi" }, hi));
    return box;
  }

  function tokens(block) {
    const box = el("div", { class: "tokens", id: block.id });
    block.tokens.forEach((t, i) => {
      const chip = el("div", { class: "token", "data-index": i, "data-token-id": block.ids[i] });
      chip.appendChild(el("span", { class: "text" }, t));
      chip.appendChild(el("span", { class: "id" }, ui("token_id", { i: i, id: block.ids[i] })));
      box.appendChild(chip);
    });
    return box;
  }

  function topk(block) {
    const list = el("ol", { class: "topk", id: block.id });
    const top = block.items.length ? block.items[0].prob : 1;
    block.items.forEach((it) => {
      const li = el("li", { "data-token-id": it.id, "data-prob": it.prob, "data-token": it.token });
      li.appendChild(el("span", { class: "tok" }, it.token));
      const bar = el("span", { class: "bar" });
      bar.style.width = `${Math.max(2, Math.round(220 * it.prob / top))}px`;
      li.appendChild(bar);
      li.appendChild(el("span", { class: "num" }, ui("topk_num", {
        pct: (100 * it.prob).toFixed(2), logit: it.logit.toFixed(2), id: it.id })));
      list.appendChild(li);
    });
    return list;
  }

  const RENDER = { matrix, tokens, topk };

  function render() {
    const s = DATA.steps[state.step];
    const stage = $("stage");
    stage.replaceChildren();
    const sec = el("section", { class: "step", id: "step", "data-step": state.step + 1,
                               "data-step-id": s.id });
    sec.appendChild(el("h2", { id: "step-title" }, `${state.step + 1}. ${fill(s.title)}`));
    if (s.formulas && s.formulas.length) {
      sec.appendChild(el("div", { class: "formula", id: "formulas" },
        s.formulas.map(tr).join("\n")));
    }
    (s.text || []).forEach((p) => sec.appendChild(el("p", {}, tr(p))));
    const blocks = el("div", { class: "blocks" });
    // what a learner came for first: the next-token probabilities above the large heatmaps
    const ordered = (s.blocks || []).filter((b) => b.kind === "topk")
      .concat((s.blocks || []).filter((b) => b.kind !== "topk"));
    for (const b of ordered) {
      const card = el("div", { class: "block" });
      if (b.title) card.appendChild(el("h3", {}, fill(b.title)));
      card.appendChild(RENDER[b.kind](b));
      if (b.note) card.appendChild(el("p", { class: "note" }, tr(b.note)));
      blocks.appendChild(card);
    }
    sec.appendChild(blocks);
    stage.appendChild(sec);
    $("counter").textContent = ui("counter", { i: state.step + 1, n: DATA.steps.length });
    $("prev").disabled = state.step === 0;
    $("next").disabled = state.step === DATA.steps.length - 1;
    document.querySelectorAll("#dots button").forEach((d, i) =>
      d.classList.toggle("current", i === state.step));
  }

  function go(i) {
    state.step = Math.max(0, Math.min(DATA.steps.length - 1, i));
    render();
  }

  function stop() {
    if (state.timer !== null) clearInterval(state.timer);
    state.timer = null;
    $("play").textContent = ui("autoplay");
    $("play").setAttribute("aria-pressed", "false");
  }

  function play() {
    if (state.timer !== null) return stop();
    if (state.step === DATA.steps.length - 1) go(0);
    $("play").textContent = ui("pause");
    $("play").setAttribute("aria-pressed", "true");
    state.timer = setInterval(() => {
      if (state.step >= DATA.steps.length - 1) return stop();
      go(state.step + 1);
    }, DATA.autoplay_ms || 4000);
  }

  function options(select, n, names, chosen) {
    select.replaceChildren();
    for (let i = 0; i < n; i++) select.appendChild(el("option", { value: i }, tr(names[i])));
    select.value = String(chosen);
  }

  // Everything outside the step that has words: header, toolbar, selectors, the toggle.
  function chrome() {
    const lang = state.lang, other = I18N.langs.find((l) => l !== lang) || lang;
    document.documentElement.lang = I18N.html[lang] || lang;
    document.title = tr(DATA.title);
    $("title").textContent = tr(DATA.title);
    $("subtitle").textContent = tr(DATA.subtitle);
    $("toolbar").setAttribute("aria-label", ui("toolbar"));
    $("prev").textContent = ui("prev");
    $("next").textContent = ui("next");
    $("play").textContent = ui(state.timer === null ? "autoplay" : "pause");
    $("layer-label").textContent = ui("layer");
    $("head-label").textContent = ui("head");
    options($("layer"), DATA.n_layer, DATA.layer_names ||
      Array.from({ length: DATA.n_layer }, (_, i) => ({ m: "ui.layer_n", a: { n: String(i) } })),
      state.layer);
    options($("head"), DATA.n_head,
      Array.from({ length: DATA.n_head }, (_, i) => ({ m: "ui.head_n", a: { n: String(i) } })),
      state.head);
    const toggle = $("lang");
    toggle.hidden = other === lang;
    toggle.textContent = I18N.names[other] || other;
    toggle.setAttribute("lang", I18N.html[other] || other);
    toggle.setAttribute("data-lang", other);
    toggle.title = ui("switch", { name: I18N.names[other] || other });
    document.querySelectorAll("#dots button").forEach((d, i) => { d.title = fill(DATA.steps[i].title); });
  }

  function switchLanguage() {
    state.lang = $("lang").getAttribute("data-lang");
    chrome();
    render();
  }

  function init() {
    const layers = $("layer"), heads = $("head");
    if (DATA.n_layer <= 1 && DATA.n_head <= 1) $("selectors").hidden = true;
    layers.addEventListener("change", () => { state.layer = Number(layers.value); render(); });
    heads.addEventListener("change", () => { state.head = Number(heads.value); render(); });
    $("prev").addEventListener("click", () => { stop(); go(state.step - 1); });
    $("next").addEventListener("click", () => { stop(); go(state.step + 1); });
    $("play").addEventListener("click", play);
    $("lang").addEventListener("click", switchLanguage);
    DATA.steps.forEach((s, i) => {
      const d = el("button", { type: "button", "data-goto": i }, String(i + 1));
      d.addEventListener("click", () => { stop(); go(i); });
      $("dots").appendChild(d);
    });
    document.addEventListener("keydown", (e) => {
      if (e.target && e.target.tagName === "SELECT") return;
      if (e.key === "ArrowRight") { stop(); go(state.step + 1); }
      if (e.key === "ArrowLeft") { stop(); go(state.step - 1); }
    });
    chrome();
    go(0);
    document.body.setAttribute("data-ready", "true");
  }

  init();
})();
