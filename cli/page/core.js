// core.js: the page's state (kept in its address), its one way to ask the server, and small DOM helpers.
// Each view is a file that calls TK.register(name, {title, needs, noText, render}); start.js draws the page.
// render(target, state, info, ctx) fills `target` (not yet in the document); ctx.onLeave(fn) runs fn when
// the view is left or redrawn (stop timers there), ctx.live() says whether this drawing is still the page's.
// A `tk explain --html` file sets window.TK_DATA before this script: the page's answers for its one text
// (answers, errors: request -> answer or message; shared: parts several answers hold, as {"$ref": n}), its
// first view and settings (defaults), what it holds fixed (fixed: text, specials) and what it says of the rest.
"use strict";
const TK = (() => {
  const VIEWS = ["tokens", "bpe", "attention", "lens", "next", "chat", "training", "model", "examples"];
  // Parameters the address may hold, with their defaults (docs/serve.md "The page's address").
  const DEFAULTS = {view: "tokens", text: "Once upon a time, there was a little cat.", layer: "0", head: "0",
    query: "", example: "attention-lookup", step: "", temperature: "1", top_k: "", top_p: "", seed: "0", n: "20",
    specials: "", position: "", which: "", ablate: ""};
  const NO_CACHE = new Set(["/api/info", "/api/training"]);  // answers that change while the server runs
  const CACHE_SIZE = 24;                  // answers kept at most ...
  const CACHE_BYTES = 32 * 1024 * 1024;   // ... and their bytes (as the server sent them) at most
  const SVG_NS = "http://www.w3.org/2000/svg";
  const FILE = window.TK_DATA || null;
  if (FILE) Object.assign(DEFAULTS, FILE.defaults, FILE.fixed);
  const views = {};
  const cache = new Map();   // request -> {answer (a promise), bytes (0 until it came)}, the most recent last
  let cacheBytes = 0;        // the bytes of the answers in `cache`
  let info = null;           // /api/info, fetched once
  let drawing = 0;           // the latest draw; an older one that finishes late draws nothing
  let current = null;        // the drawn view's ctx, whose onLeave functions the next draw runs

  // In a frame whose address cannot change (tokenkit.show's srcdoc iframe: about:srcdoc), the state's
  // query is kept here instead, and read back from here.
  const FRAMED = location.protocol === "about:";
  let framedSearch = "";
  const search = () => (FRAMED ? framedSearch : location.search);

  function readState() {
    const params = new URLSearchParams(search());
    const state = {};
    for (const [key, value] of Object.entries(DEFAULTS)) state[key] = params.has(key) ? params.get(key) : value;
    if (FILE) Object.assign(state, FILE.fixed);  // the file's one text, whatever the address says
    if (!VIEWS.includes(state.view)) state.view = "tokens";
    return state;
  }

  // The address of a state: only what differs from the defaults, so links stay short. An empty text is
  // kept (`text=`): left out, it would read back as the sample sentence.
  function address(state) {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(state)) {
      if (key in DEFAULTS && value != null && String(value) !== DEFAULTS[key] && (value !== "" || key === "text")) params.set(key, value);
    }
    return location.pathname + (params.toString() ? "?" + params.toString() : "");
  }

  function writeState(state, push) {
    const url = address(state);
    if (FRAMED) framedSearch = url.slice(location.pathname.length);
    else if (url !== location.pathname + location.search) history[push ? "pushState" : "replaceState"](null, "", url);
  }

  // The address of the current state changed by `patch` (for <a href>, so a link can be opened in a new tab).
  function link(patch) { return address({...readState(), ...patch}); }

  // The request of `path` with `params`: empty ones left out, the others sorted by name, so that one request
  // is one key (cli/page_file.py writes the same keys into a `tk explain --html` file).
  function request(path, params) {
    // an unset setting ("") is left out; an empty text is still a text
    const entries = Object.entries(params)
      .filter(([k, v]) => v != null && (v !== "" || k === "text"))
      .map(([k, v]) => [k, String(v)]);
    entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    const query = new URLSearchParams(entries).toString();
    return path + (query ? "?" + query : "");
  }

  // An inline answer with its shared parts put in place of their {"$ref": n} (once: in place).
  function unpack(value) {
    if (Array.isArray(value)) {
      if (value.length && typeof value[0] !== "object") return value;  // numbers: nothing inside
      for (let i = 0; i < value.length; i++) value[i] = unpack(value[i]);
    } else if (value && typeof value === "object") {
      const keys = Object.keys(value);
      if (keys.length === 1 && keys[0] === "$ref") return FILE.shared[value.$ref];
      for (const key of keys) value[key] = unpack(value[key]);
    }
    return value;
  }

  // The inline answer of `key` in a `tk explain --html` file (a query's from the whole explanation), or undefined.
  function fileAnswer(path, params, key) {
    if (key in FILE.answers) return unpack(FILE.answers[key]);
    if ("query" in params) {  // the file holds whole explanations: one answers every query
      const whole = request(path, Object.fromEntries(Object.entries(params).filter(([k]) => k !== "query")));
      if (whole in FILE.answers) return unpack(FILE.answers[whole]);
    }
    return undefined;
  }

  function forget(key) {
    const entry = cache.get(key);
    if (entry) { cacheBytes -= entry.bytes; cache.delete(key); }
  }

  // Drop the oldest answers until at most CACHE_SIZE are kept in at most CACHE_BYTES (one larger is not kept).
  function trim() {
    while (cache.size > CACHE_SIZE || cacheBytes > CACHE_BYTES) forget(cache.keys().next().value);
  }

  // A text longer than the model's context: the model's views answer for its last tokens and say how many
  // they dropped (`cut`, the same in every view of one text); draw says it above the view, once.
  let cut = 0;
  function noted(answer, params) {
    const state = readState();
    if (answer && answer.cut && params.text === state.text && (params.specials || "") === state.specials) cut = answer.cut;
    return answer;
  }

  // One way to ask: the inline answers of a `tk explain --html` file, else the server.
  // Answers are kept (CACHE_SIZE, CACHE_BYTES), so going back to a text or a view asks nothing again;
  // pass {fresh: true} (or ask /api/training, /api/info) to ask the server anyway.
  async function api(path, params = {}, options = {}) {
    const key = request(path, params);
    if (FILE) {
      const inline = fileAnswer(path, params, key);
      if (inline !== undefined) return noted(inline, params);
      throw new Error((FILE.errors || {})[key] || (FILE.missing || {})[path] || FILE.note);
    }
    const keep = !options.fresh && !NO_CACHE.has(path);
    if (keep && cache.has(key)) {
      const entry = cache.get(key);
      cache.delete(key);
      cache.set(key, entry);
      return entry.answer.then((answer) => noted(answer, params));
    }
    const entry = {answer: null, bytes: 0};
    entry.answer = (async () => {
      const response = await fetch(key, {headers: {"Accept": "application/json"}});
      const text = await response.text().catch(() => "");
      let body;
      try { body = JSON.parse(text); } catch (error) { body = {error: `the server answered ${response.status}`}; }
      if (!response.ok) throw new Error(body.error || `the server answered ${response.status}`);
      if (cache.get(key) === entry) {  // still kept: count its bytes
        entry.bytes = Number(response.headers.get("Content-Length")) || text.length;
        cacheBytes += entry.bytes;
        trim();
      }
      return body;
    })();
    if (keep) {
      cache.set(key, entry);
      entry.answer.catch(() => { if (cache.get(key) === entry) forget(key); });  // an error is asked again next time
      trim();
    }
    return entry.answer.then((answer) => noted(answer, params));
  }

  // The answer of a request when the page holds it already (kept, or inline in a file), else null: asks nothing.
  function kept(path, params = {}) {
    const key = request(path, params);
    if (FILE) {
      const inline = fileAnswer(path, params, key);
      return inline === undefined ? null : Promise.resolve(inline);
    }
    return cache.has(key) ? cache.get(key).answer : null;
  }

  // What the cache holds: {answers, bytes}, and its bounds {most, mostBytes} (for tests and the curious).
  function cacheUse() { return {answers: cache.size, bytes: cacheBytes, most: CACHE_SIZE, mostBytes: CACHE_BYTES}; }

  function build(node, attrs, children) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (key === "dataset") { for (const [k, v] of Object.entries(value)) if (v != null) node.dataset[k] = v; }
      else if (key === "style" && typeof value === "object") Object.assign(node.style, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) if (child != null) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  // el("div", {class: "chip", dataset: {id: 3}}, "text", child) -> an element.
  function el(tag, attrs = {}, ...children) { return build(document.createElement(tag), attrs, children); }

  // svg("circle", {cx: 1, cy: 2, r: 3}) -> an SVG element (same arguments as el).
  function svg(tag, attrs = {}, ...children) { return build(document.createElementNS(SVG_NS, tag), attrs, children); }

  // A number as the worked examples print it: fixed decimals, a true minus sign.
  function fmt(x, digits = 4) {
    if (x == null) return "−∞";
    if (!isFinite(x)) return x > 0 ? "∞" : "−∞";
    return x.toFixed(digits).replace("-", "−");
  }

  // A count with thousands separators: 500736 -> "500,736".
  function int(n) { return n == null ? "—" : Math.round(n).toLocaleString("en-US"); }

  // A probability as a percentage with about three significant digits: 0.99940 -> "99.9%", 0.000243 -> "0.0243%".
  function pct(p) {
    if (p == null) return "—";
    const x = p * 100;
    if (x === 0) return "0%";
    if (x >= 99.95 && p < 1) return ">99.9%";
    if (x >= 10) return x.toFixed(1) + "%";
    if (x >= 0.01) return x.toPrecision(3) + "%";
    return x.toExponential(1).replace("-", "−") + "%";
  }

  // Hex bytes spaced: "4f6e" -> "4f 6e".
  function hex(bytes) { return (bytes || "").replace(/(..)(?!$)/g, "$1 "); }

  // Whitespace and control characters made visible in a token's text.
  // Other control characters show as their Unicode pictures (\x00 -> ␀, \x7f -> ␡).
  function visible(text) {
    return text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "→").replace(/\r/g, "␍")
      .replace(/[\x00-\x08\x0b-\x0c\x0e-\x1f]/g, (c) => String.fromCharCode(0x2400 + c.charCodeAt(0))).replace(/\x7f/g, "␡");
  }

  // The same, as nodes: the visible whitespace marks are <span class="ws">, drawn lighter than the text.
  function visibleNodes(text) {
    const nodes = [];
    for (const part of text.split(/([\x00-\x20\x7f]+)/)) {
      if (!part) continue;
      if (/^[\x00-\x20\x7f]+$/.test(part)) nodes.push(el("span", {class: "ws"}, visible(part)));
      else nodes.push(part);
    }
    return nodes;
  }

  // A token as a chip: its text (whitespace visible) over its id; data-id, data-start, data-end as the
  // docs' hooks say. token: an /api/tokens token ({id, text, bytes, start, end, partial, special}).
  // `colour` picks one of the 10 chip hues (the position, by default); `ids: false` leaves the id out.
  function chip(token, colour, options = {}) {
    const classes = ["chip", "c" + (((colour % 10) + 10) % 10)];
    if (token.partial) classes.push("partial");
    if (token.special) classes.push("special");
    if (options.class) classes.push(options.class);
    const what = token.partial ? "part of a character: " : token.special ? "special token: " : "";
    return el(options.tag || "span", {
      class: classes.join(" "), dataset: {id: token.id, start: token.start, end: token.end, bytes: token.bytes},
      title: `${what}id ${token.id} · bytes ${hex(token.bytes)}` + (token.start != null ? ` · at ${token.start}–${token.end}` : ""),
      type: options.tag === "button" ? "button" : null,
    }, el("span", {class: "chip-text"}, token.text === "" ? "∅" : visibleNodes(token.text)),
    options.ids === false ? null : el("span", {class: "chip-id"}, String(token.id)));
  }

  // Copy text to the clipboard: navigator.clipboard where allowed, else a hidden textarea and execCommand.
  async function copy(text) {
    try {
      if (navigator.clipboard && window.isSecureContext) { await navigator.clipboard.writeText(text); return true; }
    } catch (error) { /* fall back below */ }
    const area = el("textarea", {readonly: true, style: {position: "fixed", top: "-1000px", opacity: "0"}});
    area.value = text;
    document.body.append(area);
    area.select();
    let done = false;
    try { done = document.execCommand("copy"); } catch (error) { done = false; }
    area.remove();
    return done;
  }

  // A button that copies what `text()` returns and says so for a moment.
  function copyButton(attrs, label, text) {
    const button = el("button", {type: "button", class: "copy", ...attrs}, label);
    button.addEventListener("click", async () => {
      const done = await copy(text());
      button.textContent = done ? "Copied ✓" : "Copy failed";
      setTimeout(() => { button.textContent = label; }, 1500);
    });
    return button;
  }

  // A link to another state that opens without reloading the page (and in a new tab on middle click).
  function linkTo(patch, attrs, ...children) {
    return el("a", {href: link(patch), ...attrs, onclick: (event) => {
      if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
      event.preventDefault();
      go(patch, true);
    }}, ...children);
  }

  function register(name, view) { views[name] = view; }

  // Redraw the current view from the address; body[data-ready] is "1" once it is drawn.
  async function draw() {
    const ticket = ++drawing;
    if (current) { current.leave(); current = null; }
    const leaving = [];
    const ctx = {
      onLeave: (fn) => { leaving.push(fn); },
      live: () => ticket === drawing,
      leave: () => { for (const fn of leaving.splice(0)) try { fn(); } catch (error) { console.error(error); } },
    };
    const state = readState();
    document.body.dataset.ready = "0";
    document.body.dataset.view = state.view;
    for (const tab of document.querySelectorAll("#tabs a")) {
      tab.classList.toggle("active", tab.dataset.view === state.view);
      if (tab.dataset.view === state.view) tab.setAttribute("aria-current", "page"); else tab.removeAttribute("aria-current");
      tab.href = address({...state, view: tab.dataset.view});
    }
    const text = document.getElementById("text");
    if (document.activeElement !== text) text.value = state.text;
    document.getElementById("input").hidden = !!(views[state.view] && views[state.view].noText);
    const target = el("div", {class: "view view-" + state.view});
    const status = document.getElementById("status");
    const started = performance.now();
    try {
      const view = views[state.view];
      if (!view) throw new Error(`the ${state.view} view is missing from this page`);
      const missing = (view.needs || []).filter((what) => !info[what]);
      if (missing.length) target.append(el("p", {class: "error"}, `this view needs a ${missing.join(" and a ")}` + (FILE
        ? `, which this file does not hold. ${FILE.note}` : ": start the server as `tk serve RUN_DIR` (or -t TOKENIZER for the tokenizer views)")));
      else {
        cut = 0;
        await view.render(target, state, info, ctx);
        const context = info.model && info.model.config.context_length;
        if (cut && context) target.prepend(el("p", {class: "muted", id: "cut-note"}, `The text is longer than the ` +
          `model's context of ${int(context)} tokens: the model reads its last ${int(context)}, and the first ` +
          `${int(cut)} are left out here (tk predict-next, generate and explain do the same, and say so).`));
      }
      if (ticket === drawing) status.textContent = `drawn in ${Math.round(performance.now() - started)} ms`;
    } catch (error) {
      target.replaceChildren(el("p", {class: "error"}, error.message));
      if (ticket === drawing) status.textContent = "";
    }
    if (ticket !== drawing) { ctx.leave(); return; }  // a newer draw owns the page
    current = ctx;
    document.getElementById("view").replaceChildren(target);
    document.body.dataset.ready = "1";
  }

  // Change the state: the address first, then a redraw (push: a new history entry, for the back button).
  function go(patch, push = false) {
    writeState({...readState(), ...patch}, push);
    return draw();
  }

  // Change the address without a redraw, for a view that already shows the change (a slider, a click).
  function remember(patch) { writeState({...readState(), ...patch}, false); }

  async function start() {
    info = await api("/api/info");
    window.TK_INFO = info;
    const tabs = document.getElementById("tabs");
    const served = info.views || VIEWS;
    for (const name of VIEWS) {
      const title = (views[name] && views[name].title) || name[0].toUpperCase() + name.slice(1);
      tabs.append(el("a", {href: "?view=" + name, dataset: {view: name}, class: served.includes(name) ? null : "off",
        onclick: (event) => {
          if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
          event.preventDefault();
          go({view: name}, true);
        }}, title));
    }
    document.getElementById("source").textContent = [info.model && info.model.name, info.tokenizer && info.tokenizer.name]
      .filter(Boolean).filter((v, i, a) => a.indexOf(v) === i).join(" · ");
    if (FILE) {  // one text: shown, not edited
      const box = document.getElementById("text");
      box.readOnly = true;
      box.title = FILE.note;
      box.after(el("p", {id: "file-note", class: "muted small"}, FILE.note));
    }
    let typing = null;
    document.getElementById("text").addEventListener("input", (event) => {
      clearTimeout(typing);  // redraw once typing pauses, not at every key
      typing = setTimeout(() => go({text: event.target.value, query: "", step: "", position: ""}), 150);
    });
    window.addEventListener("popstate", draw);
    await draw();
  }

  return {VIEWS, DEFAULTS, FILE, api, kept, cacheUse, request, el, svg, fmt, int, pct, hex, visible, visibleNodes, chip, copy, copyButton,
    register, draw, go, remember, link, linkTo, start, readState,
    get info() { return info; }};
})();
