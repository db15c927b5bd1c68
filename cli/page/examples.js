// examples.js: the worked examples of `tk explain --example`, in the attention view's visual language
// (TK.explain's heatmap and matrices, from explain.js, loaded before this file).
"use strict";
(() => {
  const {el} = TK;
  const X = TK.explain;
  // Each example named by what it shows (the server's "what" is the line under it).
  const NAMES = {
    "attention-lookup": "attention as a fuzzy lookup",
    "sitting": "“The cat sat”",
    "chai": "“The chai is hot”",
    "one-layer": "the one-layer toy",
  };

  function picker(examples, current) {
    return el("nav", {class: "examples-nav", "aria-label": "worked examples"}, examples.map((e) =>
      el("a", {href: "?view=examples&example=" + encodeURIComponent(e.name), class: "example-link" + (e.name === current ? " active" : ""),
        "aria-current": e.name === current ? "page" : null, dataset: {example: e.name},
        onclick: (event) => { event.preventDefault(); X.goKeep({example: e.name, query: ""}, `.example-link[data-example="${e.name}"]`); }},
      el("span", {class: "example-name"}, NAMES[e.name] || e.name), el("span", {class: "muted example-what"}, e.what))));
  }

  TK.register("examples", {
    title: "Worked examples",
    noText: true,
    async render(root, state, info) {
      const examples = (info && info.examples && info.examples.length ? info.examples
        : Object.keys(NAMES).map((name) => ({name, what: ""})));
      const doc = await X.ask("/api/example", {name: state.example});
      const weights = doc.steps.find((s) => /(^|\.)weights$/.test(s.key));
      const scores = doc.steps.find((s) => /(^|\.)scores$/.test(s.key));
      const Tq = weights.value.length;
      let query = state.query === "" ? null : Number(state.query);
      if (!(Number.isInteger(query) && query >= 0 && query < Tq)) query = null;
      const pick = (q) => X.goKeep({query: String(q)}, ".heatmap");
      const masked = scores ? (q, k) => scores.value[q][k] == null : null;
      const map = X.heatmap(doc.attention_all_heads[0], {rows: weights.rows, cols: weights.cols, masked, query, onQuery: pick,
        caption: "attention weights: rows are queries, columns are keys"});
      // a step's rows are the queries when they carry the weights' row labels: those mark the chosen query
      const sameRows = (s) => s.rows && s.rows.length === weights.rows.length && s.rows.every((r, i) => r === weights.rows[i]);
      // a step takes a whole line when its table would not fit half of one (its width guessed in characters)
      const wide = (s) => {
        const cols = s.cols || [], rows = s.rows || [""];
        const chars = Math.max(...rows.map((r) => r.length)) + cols.slice(0, 12).reduce((n, c) => n + Math.max(c.length, 9) + 2, 0) +
          (/weights$/.test(s.key) ? 9 : 0) + (s.example_printed ? Math.max(...s.example_printed.map((p) => p.text.length)) + 14 : 0);
        return chars > 62;
      };
      const steps = doc.steps.map((s, n) => el("section", {class: "example-step" + (wide(s) ? " wide" : ""), dataset: {key: s.key}},
        el("h4", {}, el("span", {class: "muted"}, `${n + 1}. `), s.title,
          el("span", {class: "muted shape"}, "  " + (s.shape.length ? s.shape.join(" × ") : "scalar"))),
        s.note ? el("p", {class: "step-note"}, s.note) : null,
        X.matrix(s, {query: sameRows(s) ? query : null, heat: s === weights})));
      const printed = doc.steps.some((s) => s.example_printed);
      root.append(
        picker(examples, state.example),
        el("h2", {}, doc.title),
        doc.notes.length ? el("ul", {class: "example-notes"}, doc.notes.map((note) => el("li", {}, note))) : null,
        el("div", {class: "example-top"},
          el("div", {class: "att-main"}, el("h3", {}, "attention weights"), X.legend(!!scores && scores.value.some((r) => r.some((x) => x == null))), map),
          el("div", {class: "example-key"}, el("h3", {}, "reading the steps"),
            el("p", {}, "Each step is the library's own op run on the example's numbers, in float64: every value is " +
              "exact (hover for all its digits)."),
            printed ? el("p", {}, "Beside a row the example worked by hand: what it printed, ",
              el("span", {class: "badge agrees"}, "✓ agrees"), " when that is the exact value rounded to the digits printed, ",
              el("span", {class: "badge rounding"}, "≈ rounded differently"), " when each number is off by at most one in its " +
              "last digit and by under 1% (a slip of rounding, the arithmetic right), ",
              el("span", {class: "badge differs"}, "≠ differs"), " when its arithmetic went wrong (the exact value is at left).") : null,
            el("p", {class: "muted"}, "Click a row of the heatmap to mark that query in every step."))),
        el("div", {class: "example-steps"}, steps));
    },
  });
})();
