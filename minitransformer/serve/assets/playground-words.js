"use strict";
// The playground's words. Every word shown is a message of the catalogues embedded in the
// page (the walkthrough's, viz/assets/i18n): the elements marked data-i18n (their text) or
// data-i18n-ATTR (an attribute) and the status lines are rendered from them, and rendered
// again in the other language when the toggle is pressed; the data on the page stays as it is.
window.playgroundWords = (() => {
  const $ = (id) => document.getElementById(id);
  const I18N = JSON.parse($("i18n").textContent);
  const words = { lang: document.documentElement.dataset.lang || I18N.langs[0] };
  const lines = {};  // element id -> [line, error, link]

  // A message in the current language: {name} replaced by args[name].
  function t(key, args) {
    const template = I18N.messages[words.lang][key];
    if (template === undefined) return key;
    return template.replace(/\{(\w+)\}/g, (all, name) => {
      if (!args || !Object.prototype.hasOwnProperty.call(args, name)) return all;
      const v = args[name];  // a message itself ({m: key, raw: text if there is none}), or text
      if (v === null || typeof v !== "object") return String(v);
      return I18N.messages[words.lang][v.m] !== undefined ? t(v.m, v.a) : String(v.raw);
    });
  }

  // A line that is either a message [key, args] or text from the server (an error).
  const say = (line) => (Array.isArray(line) ? t(line[0], line[1]) : line);

  function show(id) {
    const [line, error, link] = lines[id];
    if (link) {
      const a = document.createElement("a");
      Object.assign(a, { href: link, target: "_blank", rel: "noopener", textContent: say(line) });
      $(id).replaceChildren(a);
    } else {
      $(id).textContent = say(line);
    }
    $(id).classList.toggle("error", Boolean(error));
  }

  // The line shown in element ``id`` (a link to ``link`` if given), kept for the toggle.
  function status(id, line, error, link) {
    lines[id] = [line, error, link || null];
    show(id);
  }

  // The marked elements, the title, the toggle itself and every status line in words.lang.
  function relabel() {
    const lang = words.lang, other = I18N.langs.find((l) => l !== lang) || lang;
    document.documentElement.lang = I18N.html[lang] || lang;
    document.documentElement.dataset.lang = lang;
    for (const e of document.querySelectorAll("[data-i18n]")) e.textContent = t(e.dataset.i18n);
    for (const attr of ["title", "placeholder", "aria-label"]) {
      for (const e of document.querySelectorAll(`[data-i18n-${attr}]`)) {
        e.setAttribute(attr, t(e.getAttribute(`data-i18n-${attr}`)));
      }
    }
    document.title = t("play.title");
    const toggle = $("lang");
    toggle.hidden = other === lang;
    toggle.textContent = I18N.names[other] || other;
    toggle.lang = I18N.html[other] || other;
    toggle.dataset.lang = other;
    toggle.title = t("ui.switch", { name: I18N.names[other] || other });
    for (const id of Object.keys(lines)) show(id);
  }

  return Object.assign(words, { t, say, status, relabel });
})();
