// sampling.js: TK.sampling, the widgets the Next token view (next.js) and the Chat view (chat.js) share:
// a distribution as probability bars, and the sampling settings (new tokens, temperature, top-k, top-p,
// seed) as fields that change the address. Each bar is also data-id/data-p at full precision.
"use strict";
(() => {
  const {el} = TK;

  // Probability bars of `top` (rows {id, token, [key]}); `drawn`: the id to mark as the one sampled;
  // `onpick(row)` makes each bar a button, but for a token that is part of a character or an id at or past
  // `tokens` (a padded vocabulary's, shown as <pad id N>: no text to add).
  function bars(top, {id, drawn = null, onpick = null, tokens = Infinity, key = "p"}) {
    return el("div", {class: "bars", id, role: "list"}, top.map((row) => {
      const p = row[key];
      const partial = /\\x[0-9a-f]{2}/.test(row.token);
      const padding = row.id >= tokens;  // shown as the label the server sends, not as a text's characters
      const tag = onpick && !partial && !padding ? "button" : "div";
      return el(tag, {class: "bar" + (row.id === drawn ? " drawn" : ""), role: tag === "div" ? "listitem" : null,
        type: tag === "button" ? "button" : null, dataset: {id: row.id, p},
        title: tag === "button" ? "add this token to the text" : null,
        "aria-label": `${padding ? row.token : TK.visible(row.token)}, id ${row.id}, probability ${TK.pct(p)}` +
          (row.id === drawn ? ", drawn" : ""),
        onclick: tag === "button" ? () => onpick(row) : null},
      el("span", {class: "bar-token" + (padding ? " pad" : "")},
        padding ? row.token : row.token === "" ? "∅" : TK.visibleNodes(row.token)),
      el("span", {class: "bar-track"}, el("span", {class: "bar-fill", style: {width: (100 * (p || 0)).toFixed(2) + "%"}})),
      el("span", {class: "bar-p"}, TK.pct(p)),
      el("span", {class: "bar-id"}, "#" + row.id));
    }));
  }

  function numberField(id, label, value, attrs) {
    const input = el("input", {type: "number", id, value, ...attrs});
    return {input, box: el("span", {class: "field stacked"}, el("label", {for: id}, label), input)};
  }

  // The five settings as fields with ids `${prefix}-n`, `${prefix}-temperature`, ...; a valid change goes
  // into the address (TK.go), which redraws the view.
  function fields(prefix, state, info) {
    const limits = info.limits || {};
    const found = {
      n: numberField(`${prefix}-n`, "new tokens", state.n, {min: 0, max: limits.new_tokens || 200, step: 1}),
      temperature: numberField(`${prefix}-temperature`, "temperature", state.temperature, {min: 0, max: 10, step: 0.1}),
      top_k: numberField(`${prefix}-top-k`, "top-k", state.top_k, {min: 1, max: limits.top_k || 100, step: 1, placeholder: "all"}),
      top_p: numberField(`${prefix}-top-p`, "top-p", state.top_p, {min: 0.01, max: 1, step: 0.05, placeholder: "1"}),
      seed: numberField(`${prefix}-seed`, "seed", state.seed, {min: 0, max: 4294967295, step: 1}),
    };
    for (const [key, field] of Object.entries(found)) {
      field.input.addEventListener("change", () => {
        if (!field.input.checkValidity()) { field.input.reportValidity(); return; }
        TK.go({[key]: field.input.value.trim()});
      });
    }
    return found;
  }

  TK.sampling = {bars, fields};
})();
