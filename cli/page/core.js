// core.js: the page's state (kept in its address), its one way to ask the server, and small DOM helpers.
// Each view is a file that calls TK.register(name, {title, needs, render}); start.js draws the page.
"use strict";
const TK = (() => {
  const VIEWS = ["tokens", "bpe", "attention", "next", "training", "model", "examples"];
  // Parameters the address may hold, with their defaults (docs/serve.md "The page's address").
  const DEFAULTS = {view: "tokens", text: "Once upon a time, there was a little cat.", layer: "0", head: "0",
    query: "", example: "attention-lookup", step: "", temperature: "1", top_k: "", top_p: "", seed: "0", n: "20"};
  const views = {};
  let info = null;           // /api/info, fetched once
  let drawing = 0;           // the latest draw; an older one that finishes late draws nothing

  function readState() {
    const params = new URLSearchParams(location.search);
    const state = {};
    for (const [key, value] of Object.entries(DEFAULTS)) state[key] = params.has(key) ? params.get(key) : value;
    if (!VIEWS.includes(state.view)) state.view = "tokens";
    return state;
  }

  // The address holds only what differs from the defaults, so links stay short.
  function writeState(state, push) {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(state)) if (value !== DEFAULTS[key] && value !== "") params.set(key, value);
    const url = location.pathname + (params.toString() ? "?" + params.toString() : "");
    if (url !== location.pathname + location.search) history[push ? "pushState" : "replaceState"](null, "", url);
  }

  // One way to ask: the inline answers of a `tk explain --html` file first, then the server.
  async function api(path, params = {}) {
    const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v != null));
    const key = path + (query.toString() ? "?" + query.toString() : "");
    const inline = window.TK_DATA;
    if (inline) {
      if (key in inline.answers) return inline.answers[key];
      throw new Error("this file holds one text; run `tk serve` to explore others");
    }
    const response = await fetch(key, {headers: {"Accept": "application/json"}});
    const body = await response.json().catch(() => ({error: `the server answered ${response.status}`}));
    if (!response.ok) throw new Error(body.error || `the server answered ${response.status}`);
    return body;
  }

  // el("div", {class: "chip", dataset: {id: 3}}, "text", child) -> an element.
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "style" && typeof value === "object") Object.assign(node.style, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) if (child != null) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  // A number as the worked examples print it: fixed decimals, a true minus sign.
  function fmt(x, digits = 4) {
    if (x == null) return "−∞";
    if (!isFinite(x)) return x > 0 ? "∞" : "−∞";
    return x.toFixed(digits).replace("-", "−");
  }

  // Whitespace and control characters made visible in a token's text.
  function visible(text) {
    return text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "→").replace(/\r/g, "␍");
  }

  function register(name, view) { views[name] = view; }

  // Redraw the current view from the address; body[data-ready] is "1" once it is drawn.
  async function draw() {
    const ticket = ++drawing;
    const state = readState();
    document.body.dataset.ready = "0";
    document.body.dataset.view = state.view;
    for (const tab of document.querySelectorAll("#tabs a")) tab.classList.toggle("active", tab.dataset.view === state.view);
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
      if (missing.length) target.append(el("p", {class: "error"}, `this view needs a ${missing.join(" and a ")}: ` +
        "start the server as `tk serve RUN_DIR` (or -t TOKENIZER for the tokenizer views)"));
      else await view.render(target, state, info);
      status.textContent = `drawn in ${Math.round(performance.now() - started)} ms`;
    } catch (error) {
      target.replaceChildren(el("p", {class: "error"}, error.message));
      status.textContent = "";
    }
    if (ticket !== drawing) return;  // a newer draw owns the page
    document.getElementById("view").replaceChildren(target);
    document.body.dataset.ready = "1";
  }

  // Change the state: the address first, then a redraw (push: a new history entry, for the back button).
  function go(patch, push = false) {
    writeState({...readState(), ...patch}, push);
    return draw();
  }

  async function start() {
    info = await api("/api/info");
    window.TK_INFO = info;
    const tabs = document.getElementById("tabs");
    for (const name of VIEWS) {
      const title = views[name] ? views[name].title : name;
      tabs.append(el("a", {href: "?view=" + name, dataset: {view: name},
        onclick: (event) => { event.preventDefault(); go({view: name}, true); }}, title));
    }
    document.getElementById("source").textContent = [info.model && info.model.name, info.tokenizer && info.tokenizer.name]
      .filter(Boolean).filter((v, i, a) => a.indexOf(v) === i).join(" · ");
    let typing = null;
    document.getElementById("text").addEventListener("input", (event) => {
      clearTimeout(typing);  // redraw once typing pauses, not at every key
      typing = setTimeout(() => go({text: event.target.value, query: "", step: ""}), 150);
    });
    window.addEventListener("popstate", draw);
    await draw();
  }

  return {VIEWS, DEFAULTS, api, el, fmt, visible, register, draw, go, start, readState,
    get info() { return info; }};
})();
