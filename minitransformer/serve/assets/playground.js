"use strict";
// The playground: streams completions from /v1/completions and asks /api/ what the model
// computes at a token. Model output and prompts only ever reach the page as textContent.
// Its words come from playground-words.js (the catalogues), loaded before it.
(() => {
  const $ = (id) => document.getElementById(id);
  const words = window.playgroundWords;  // playground-words.js
  const { t } = words;
  const setStatus = words.status;
  const state = { info: null, key: "", prompt: "", generated: "", count: 0, nPrompt: 0,
                  controller: null, inspect: null, pos: null, masked: null, filled: null };

  function headers() {
    const h = { "Content-Type": "application/json" };
    if (state.key) h.Authorization = "Bearer " + state.key;
    return h;
  }

  async function api(path, body) {
    const init = body === undefined ? { headers: headers() }
      : { method: "POST", headers: headers(), body: JSON.stringify(body) };
    const r = await fetch(path, init);
    const data = await r.json();
    if (!r.ok) {
      const e = new Error(data.error ? data.error.message : r.statusText);
      e.status = r.status;
      throw e;
    }
    return data;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function options(select, n, extra) {
    const chosen = select.value;
    select.replaceChildren();
    for (let i = 0; i < n; i++) select.append(new Option(String(i), String(i)));
    if (extra) select.append(new Option(t(extra), "all"));
    if (chosen && [...select.options].some((o) => o.value === chosen)) select.value = chosen;
  }

  // -- GPT runs: generate ------------------------------------------------------------------
  function addToken(text, pos, prompt) {
    const span = el("span", prompt ? "token prompt" : "token", text);
    span.dataset.pos = String(pos);
    if (text.includes("\n")) span.classList.add("nl");  // a visible, clickable mark (CSS)
    if (pos === state.pos) span.classList.add("selected");
    $("output").append(span);
  }

  async function renderTokens(text, nPrompt) {
    const tok = await api("/api/tokenize", { text });
    $("output").replaceChildren();
    tok.texts.forEach((t, i) => addToken(t, i, i < nPrompt));
    return tok.ids.length;
  }

  function request() {
    const body = { model: state.info.model, prompt: state.prompt, stream: true, logprobs: 0,
                   max_tokens: Number($("max_tokens").value),
                   temperature: Number($("temperature").value),
                   top_p: Number($("top_p").value), top_k: Number($("top_k").value) };
    if ($("seed").value !== "") body.seed = Number($("seed").value);
    return body;
  }

  function onChunk(chunk) {
    if (chunk.error) throw new Error(chunk.error.message);
    const choice = chunk.choices[0];
    state.generated += choice.text;
    for (const t of choice.logprobs ? choice.logprobs.tokens : []) {
      addToken(t, state.nPrompt + state.count, false);
      state.count += 1;
    }
    if (choice.finish_reason) state.finish = choice.finish_reason;
  }

  async function readStream(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).replace(/^data: /, "");
        buffer = buffer.slice(cut + 2);
        if (line === "[DONE]") return;
        onChunk(JSON.parse(line));
      }
    }
  }

  async function generate() {
    if (state.controller) state.controller.abort();
    state.prompt = $("prompt").value;
    Object.assign(state, { generated: "", count: 0, finish: null, pos: null });
    $("inspect").hidden = true;
    delete document.body.dataset.generated;
    $("generate").disabled = true;
    $("stop").disabled = false;
    const controller = new AbortController();
    state.controller = controller;
    try {
      state.nPrompt = await renderTokens(state.prompt, Infinity);
      setStatus("status", ["play.generating"]);
      const r = await fetch("/v1/completions", { method: "POST", headers: headers(),
        body: JSON.stringify(request()), signal: controller.signal });
      if (!r.ok) {
        const data = await r.json();
        throw new Error(data.error ? data.error.message : r.statusText);
      }
      await readStream(r);
      await renderTokens(state.prompt + state.generated, state.nPrompt);
      const reason = state.finish || "none";
      setStatus("status", ["play.done", { n: state.count,
                                          reason: { m: "play.finish." + reason, raw: reason } }]);
      document.body.dataset.generated = String(state.count);
    } catch (e) {
      if (e.name === "AbortError") setStatus("status", ["play.stopped_after", { n: state.count }]);
      else setStatus("status", e.message, true);
    } finally {
      if (state.controller === controller) state.controller = null;
      $("generate").disabled = false;
      $("stop").disabled = true;
    }
  }

  // -- GPT runs: one position --------------------------------------------------------------
  function renderProbs(data) {
    const body = $("probs").tBodies[0];
    body.replaceChildren();
    const most = data.top.length ? data.top[0].prob : 1;  // bars relative to the likeliest
    for (const row of data.top) {
      const tr = el("tr");
      tr.append(el("td", "tok", row.token));
      const p = el("td", "prob", row.prob.toFixed(4));
      p.dataset.prob = String(row.prob);
      const bar = el("span", "bar");
      bar.style.width = `${Math.round((row.prob / most) * 240)}px`;
      const cell = el("td");
      cell.append(bar);
      tr.append(p, cell);
      body.append(tr);
    }
  }

  function renderAttention() {
    const data = state.inspect;
    if (!data) return;
    const box = $("attention");
    box.replaceChildren();
    const layer = data.attention[Number($("layer").value)];
    const keys = data.tokens;  // the window: its kept start tokens, then offset .. position
    if ($("head").value === "all") {
      const grid = el("div", "grid");
      grid.style.gridTemplateColumns = `auto repeat(${keys.length}, 1.4em)`;
      layer.forEach((weights, h) => {
        grid.append(el("span", "label", t("ui.head_n", { n: h })));
        weights.forEach((w, j) => {
          const c = el("span", "cell");
          c.style.opacity = String(Math.max(w, 0.02));
          c.title = `${keys[j]}: ${w.toFixed(3)}`;
          c.dataset.weight = String(w);
          grid.append(c);
        });
      });
      box.append(grid);
      return;
    }
    const weights = layer[Number($("head").value)];
    const most = Math.max(...weights);
    weights.forEach((w, j) => {
      const row = el("div", "att-row");
      const value = el("span", "weight", w.toFixed(3));
      value.dataset.weight = String(w);
      const bar = el("span", "bar");
      bar.style.width = `${Math.round((w / most) * 240)}px`;
      row.append(el("span", "label tok", keys[j]), value, bar);
      box.append(row);
    });
  }

  function renderPosition() {  // the window's start too once it no longer starts the text
    const d = state.inspect;
    if (!d) return;
    const key = d.kept === 1 ? "play.at_pos_kept_one" : d.kept ? "play.at_pos_kept"
      : d.offset ? "play.at_pos_window" : "play.at_pos";
    $("at-pos").textContent = t(key, { pos: d.position, start: d.offset, last: d.kept - 1 });
  }

  async function inspect(pos) {
    state.pos = pos;
    for (const s of $("output").querySelectorAll(".token")) {
      s.classList.toggle("selected", Number(s.dataset.pos) === pos);
    }
    try {
      const data = await api("/api/inspect", { text: state.prompt + state.generated,
                                               position: pos, top: 10,
                                               prompt: Math.max(1, state.nPrompt) });
      state.inspect = data;
      $("at-token").textContent = data.tokens[data.tokens.length - 1];
      renderPosition();
      renderProbs(data);
      renderAttention();
      $("inspect").hidden = false;
      Object.assign($("inspect").dataset, { position: data.position, offset: data.offset });
    } catch (e) {
      setStatus("status", e.message, true);
    }
  }

  // -- GPT runs: the eight-step walkthrough of the current text, in a new tab ---------------
  async function walkthrough() {
    const text = state.prompt ? state.prompt + state.generated : $("prompt").value;
    $("walkthrough").disabled = true;
    try {
      const data = await api("/api/walkthrough", { text, lang: words.lang, tail: true });
      const tab = window.open(data.url, "_blank");
      if (tab) tab.opener = null;
      else setStatus("status", ["play.open_walkthrough"], false, data.url);  // popup blocked
      document.body.dataset.walkthrough = data.url;
    } catch (e) {
      setStatus("status", e.message, true);
    } finally {
      $("walkthrough").disabled = false;
    }
  }

  // -- encoder-decoder runs ----------------------------------------------------------------
  async function translate() {
    setStatus("t-status", ["play.translating"]);
    try {
      const data = await api("/api/translate", { text: $("source").value,
                                                 beam: Number($("beam").value) });
      $("translation").textContent = data.translation;
      const box = $("alignment");
      box.replaceChildren();
      if (data.cross_attention) {
        const a = data.cross_attention;
        const grid = el("div", "grid");
        grid.style.gridTemplateColumns = `auto repeat(${a.source.length}, 1.4em)`;
        grid.append(el("span", "label", ""));
        for (const s of a.source) grid.append(el("span", "label col", s));
        a.weights.forEach((row, i) => {
          grid.append(el("span", "label", a.target[i]));
          row.forEach((w, j) => {
            const c = el("span", "cell");
            c.style.opacity = String(Math.max(w, 0.02));
            c.title = `${a.target[i]} \u2192 ${a.source[j]}: ${w.toFixed(3)}`;
            c.dataset.weight = String(w);
            grid.append(c);
          });
        });
        box.append(grid);
      }
      setStatus("t-status", data.note || "");
    } catch (e) {
      setStatus("t-status", e.message, true);
    }
  }

  // -- masked-LM encoder runs -------------------------------------------------------------
  function renderFilled(data) {
    state.filled = data;
    const box = $("filled");
    box.replaceChildren();
    const best = new Map(data.slots.map((s) => [s.position, s.predictions[0]]));
    data.texts.forEach((t, i) => {
      const span = el("span", best.has(i) ? "token slot" : "token", best.has(i)
        ? best.get(i).text : t);
      if (t.includes("\n")) span.classList.add("nl");
      span.dataset.pos = String(i);
      box.append(span);
    });
    const slots = $("slots");
    slots.replaceChildren();
    data.slots.forEach((slot, n) => {
      const panel = el("div", "panel slot-panel");
      panel.append(el("h3", "", t("play.slot", { n: n + 1, pos: slot.position })));
      const table = el("table");
      for (const p of slot.predictions) {
        const tr = el("tr");
        const prob = el("td", "prob", p.prob.toFixed(4));
        prob.dataset.prob = String(p.prob);
        tr.append(el("td", "tok", p.token), prob);
        table.append(tr);
      }
      panel.append(table);
      slots.append(panel);
    });
  }

  async function fill() {
    setStatus("m-status", "");
    try {
      const data = await api("/api/fill-mask", { text: $("masked").value, top: 5 });
      state.masked = data.texts;
      renderFilled(data);
      $("slots").dataset.slots = String(data.slots.length);
    } catch (e) {
      setStatus("m-status", e.message, true);
    }
  }

  function maskToken(pos) {
    const texts = state.masked.slice();
    texts[pos] = "[MASK]";
    $("masked").value = texts.join("");
    fill();
  }

  // -- start -------------------------------------------------------------------------------
  function wire() {
    for (const id of ["temperature", "top_k", "top_p", "max_tokens"]) {
      $(id).addEventListener("input", () => { $(`${id}-out`).textContent = $(id).value; });
    }
    $("generate").addEventListener("click", generate);
    $("stop").addEventListener("click", () => state.controller && state.controller.abort());
    $("output").addEventListener("click", (ev) => {
      const t = ev.target.closest(".token");
      if (t) inspect(Number(t.dataset.pos));
    });
    $("walkthrough").addEventListener("click", walkthrough);
    $("layer").addEventListener("change", renderAttention);
    $("head").addEventListener("change", renderAttention);
    $("translate").addEventListener("click", translate);
    $("fill").addEventListener("click", fill);
    $("filled").addEventListener("click", (ev) => {
      const t = ev.target.closest(".token");
      if (t && state.masked) maskToken(Number(t.dataset.pos));
    });
    $("key").addEventListener("change", () => { state.key = $("key").value; start(); });
    $("lang").addEventListener("click", () => {
      words.lang = $("lang").dataset.lang;
      relabel();
    });
  }

  // Every word on the page in the language chosen: the marked elements and status lines
  // (playground-words.js), then what was built from the data already here.
  function relabel() {
    words.relabel();
    if (state.info) {
      options($("head"), state.info.n_head, "play.all_heads");
      if (!state.info.completions && !state.info.translate && !state.info.fill_mask) {
        $("other-text").textContent = t("play.no_view", { title: state.info.title });
      }
    }
    renderPosition();
    renderAttention();
    if (state.filled) renderFilled(state.filled);
  }

  function show(info) {
    state.info = info;
    document.body.dataset.ready = "true";
    $("keybox").hidden = !info.auth;
    setStatus("model", ["play.model_line", { title: info.title, model: info.model }]);
    // the boxes open with text of the run's own corpus, which its model can read; none such:
    // an empty box (the page's own ROMEO: would fail at the first Generate)
    if (!state.prompt) $("prompt").value = info.prompt || "";
    if (info.masked) $("masked").value = info.masked;
    if (info.completions) {
      $("gpt").hidden = false;
      const cap = Math.min(info.max_tokens, 1024);
      $("max_tokens").max = String(cap);
      if (Number($("max_tokens").value) > cap) $("max_tokens").value = String(cap);
      $("max_tokens-out").textContent = $("max_tokens").value;
      options($("layer"), info.n_layer);
      options($("head"), info.n_head, "play.all_heads");
    } else if (info.translate) {
      $("seq2seq").hidden = false;
    } else if (info.fill_mask) {
      $("encoder").hidden = false;
    } else {
      $("other").hidden = false;
      $("other-text").textContent = t("play.no_view", { title: info.title });
    }
  }

  async function start() {
    try {
      show(await api("/api/info"));
    } catch (e) {
      if (e.status === 401) {
        $("keybox").hidden = false;
        setStatus("model", ["play.need_key"]);
      } else {
        setStatus("model", e.message);
      }
    }
  }

  wire();
  setStatus("model", ["play.loading"]);
  relabel();
  start();
})();
