// lens.js: inside the model. The logit lens (/api/lens) as a grid of layer boundaries x positions, each cell
// coloured by the probability that boundary gives the whole model's prediction at that position, its top tokens
// on hover; and, for the position clicked, the direct logit attribution of the predicted token (/api/attribution)
// as bars: the embeddings, each head (a link to its attention), each MLP and the biases. Every number is the
// server's (transformer/lens.py, transformer/attribution.py); this file only lays them out.
// Hooks: a cell data-layer/data-pos/data-p/data-rank/data-top; a tip row data-id/data-p; a bar data-part
// (token_embedding, position_embedding, head, mlp, attn_bias, mlp_bias, norm_bias), data-layer, data-head, data-value.
"use strict";
(() => {
  const {el, visible, visibleNodes} = TK;
  const {colour, ink} = TK.explain;
  // A number as the server sent it: null is a damaged model's NaN (JSON holds none), never a masked −∞ here.
  const full = (x) => (x == null ? "NaN" : String(x));
  const fmt = (x, digits) => (x == null ? "NaN" : TK.explain.fmt(x, digits));

  // A cell's width: the window's room shared by the positions, from a stripe (no text) to a token's text.
  const cellWidth = (T) => Math.max(16, Math.min(64, Math.floor((window.innerWidth - 260) / T)));
  const shown = (text) => (text === "" ? "∅" : visible(text));
  const boundary = (layer) => (layer.layer === 0 ? "embeddings" : `after block ${layer.layer - 1}`);

  function legend() {
    const bar = el("span", {class: "legend-bar"});
    bar.style.background = `linear-gradient(to right, ${[0, .25, .5, .75, 1].map(colour).join(", ")})`;
    return el("div", {class: "legend", "aria-label": "colour scale: probability 0 white to 1 deep blue"},
      el("span", {class: "muted"}, "p(the model's prediction)"), el("span", {class: "mono"}, "0"), bar, el("span", {class: "mono"}, "1"),
      el("span", {class: "muted lens-rank-key"}, "corner number: the rank of the text's next token (0 = first choice)"));
  }

  // The tip of one cell: the boundary's top tokens as [token, probability], the prediction's probability, the next token's rank.
  function tipBody(answer, l, t) {
    const layer = answer.lens[l], label = (id) => answer.labels[String(id)];
    const predicted = answer.predicted[t], tokens = answer.tokens;
    const rank = layer.next_rank[t];
    return [
      el("div", {class: "tip-head"}, el("b", {}, boundary(layer)), ` · position ${t} `, el("span", {class: "tok"}, shown(tokens[t].text))),
      el("table", {class: "tip-top"}, el("tbody", {}, layer.top[t].map(([id, p]) => el("tr", {dataset: {id, p: full(p)},
        class: [id === predicted ? "is-predicted" : "", t + 1 < tokens.length && id === tokens[t + 1].id ? "is-next" : ""].join(" ").trim() || null},
      el("td", {}, el("span", {class: "tok"}, visibleNodes(label(id) === "" ? "∅" : label(id)))), el("td", {class: "num"}, TK.pct(p)))))),
      el("div", {class: "muted"}, "p(", el("span", {class: "tok"}, shown(label(predicted))), ") = ",
        el("span", {class: "num"}, TK.pct(layer.predicted_probability[t]))),
      t + 1 < tokens.length ? el("div", {class: "muted"}, "next token ", el("span", {class: "tok"}, shown(tokens[t + 1].text)),
        `: rank ${rank}`) : el("div", {class: "muted"}, "the last position: no next token in the text"),
    ];
  }

  // The grid: a row per boundary (the embeddings first, the model's output last), a column per position.
  function grid(answer, position, pick) {
    const T = answer.tokens.length, width = cellWidth(T), words = width >= 28;
    const box = el("div", {class: "lens-grid", id: "lens-grid", role: "group", "aria-label": "logit lens: layers by positions"});
    box.style.gridTemplateColumns = `max-content repeat(${T}, ${width}px)`;
    box.append(el("div", {class: "lens-corner muted"}, "position →"));
    answer.tokens.forEach((token, t) => box.append(el("button", {type: "button", class: "lens-pos" + (t === position ? " selected" : ""),
      dataset: {pos: t}, tabindex: "-1", title: `position ${t}: ${JSON.stringify(token.text)} (click: its attribution)`, onclick: () => pick(t)},
    el("span", {class: "pos"}, t), words ? el("span", {class: "lens-pos-text"}, shown(token.text)) : null)));
    answer.lens.forEach((layer, l) => {
      box.append(el("div", {class: "lens-label muted", dataset: {layer: l}}, l === answer.lens.length - 1 ? [boundary(layer), el("br"),
        el("span", {class: "small"}, "(the model's output)")] : boundary(layer)));
      for (let t = 0; t < T; t++) {
        const p = layer.predicted_probability[t], top = layer.top[t][0][0], rank = layer.next_rank[t];
        // one cell in the tab order (the chosen position's output); the arrow keys move between the others
        const cell = el("button", {type: "button", class: "lens-cell" + (t === position ? " selected" : ""),
          tabindex: l === answer.lens.length - 1 && t === position ? "0" : "-1",
          dataset: {layer: l, pos: t, p: full(p), rank: rank == null ? "" : rank, top},
          "aria-label": `${boundary(layer)}, position ${t}: first choice ${shown(answer.labels[String(top)])}, ` +
            `p(prediction) ${TK.pct(p)}` + (rank == null ? "" : `, next token's rank ${rank}`)},
        words ? el("span", {class: "lens-top"}, shown(answer.labels[String(top)])) : null,
        words && rank != null ? el("span", {class: "lens-rank"}, rank > 999 ? "999+" : rank) : null);
        Object.assign(cell.style, {background: colour(p || 0), color: ink(p || 0)});
        box.append(cell);
      }
    });
    box.append(el("div", {class: "lens-label muted"}, "next token"));
    for (let t = 0; t < T; t++) {
      box.append(el("div", {class: "lens-next", dataset: {pos: t}}, words && t + 1 < T ? shown(answer.tokens[t + 1].text) : ""));
    }
    box.addEventListener("keydown", (event) => {
      const cell = event.target.closest(".lens-cell"), step = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]}[event.key];
      if (!cell || !step) return;
      const l = Math.max(0, Math.min(answer.lens.length - 1, +cell.dataset.layer + step[0]));
      const t = Math.max(0, Math.min(T - 1, +cell.dataset.pos + step[1]));
      const next = box.querySelector(`.lens-cell[data-layer="${l}"][data-pos="${t}"]`);
      cell.tabIndex = -1;
      next.tabIndex = 0;
      next.focus();
      event.preventDefault();
    });
    return box;
  }

  // The floating tip, beside the cell hovered or focused, kept within the window.
  function tipFor(answer, box) {
    const tip = el("div", {class: "tip lens-tip", id: "lens-tip", role: "tooltip", hidden: true});
    const show = (cell) => {
      tip.replaceChildren(...tipBody(answer, +cell.dataset.layer, +cell.dataset.pos));
      tip.dataset.layer = cell.dataset.layer;
      tip.dataset.pos = cell.dataset.pos;
      tip.hidden = false;
      const r = cell.getBoundingClientRect(), w = tip.offsetWidth, h = tip.offsetHeight;
      const left = r.right + 8 + w <= window.innerWidth ? r.right + 8 : Math.max(4, r.left - 8 - w);
      Object.assign(tip.style, {left: `${left}px`, top: `${Math.max(4, Math.min(window.innerHeight - h - 4, r.top))}px`});
    };
    const hide = () => { tip.hidden = true; };
    box.addEventListener("mouseover", (event) => { const cell = event.target.closest(".lens-cell"); if (cell) show(cell); });
    box.addEventListener("mouseleave", hide);
    box.addEventListener("focusin", (event) => { const cell = event.target.closest(".lens-cell"); if (cell) show(cell); });
    box.addEventListener("focusout", hide);
    return tip;
  }

  // ---------------------------------------------------------------- the attribution's bars
  function bars(doc, cfg, position) {
    const rows = [];
    const bar = (part, label, value, extra = {}) => rows.push({part, label, value, ...extra});
    bar("token_embedding", "token embedding", doc.embeddings.token, {group: "embeddings"});
    if (cfg.positional !== "rope") bar("position_embedding", "position embedding", doc.embeddings.position, {group: "embeddings"});
    for (let l = 0; l < doc.n_layers; l++) {
      for (let h = 0; h < doc.n_heads; h++) bar("head", `head ${h}`, doc.heads[l][h], {group: `block ${l}`, layer: l, head: h});
      bar("mlp", "MLP", doc.mlps[l], {group: `block ${l}`, layer: l});
    }
    const b = doc.biases;
    const biased = b.attn.some((x) => x !== 0) || b.mlp.some((x) => x !== 0) || b.norm !== 0;
    if (biased) {
      for (let l = 0; l < doc.n_layers; l++) {
        bar("attn_bias", `block ${l} attn.c_proj`, b.attn[l], {group: "biases", layer: l});
        bar("mlp_bias", `block ${l} mlp.c_proj`, b.mlp[l], {group: "biases", layer: l});
      }
      bar("norm_bias", cfg.norm === "post" ? "the norms' biases" : "ln_f's bias", b.norm, {group: "biases"});
    }
    const most = Math.max(1e-12, ...rows.map((r) => Math.abs(r.value || 0)));
    // a model of many heads (GPT-2's 144) lays its groups side by side, in columns, rather than one long list
    const chart = el("div", {class: "attr-chart" + (rows.length > 40 ? " attr-columns" : ""), id: "attr-bars", role: "list"});
    let box = null;
    for (const r of rows) {
      if (!box || box.dataset.group !== r.group) {
        box = el("div", {class: "attr-rows", dataset: {group: r.group}});
        chart.append(el("section", {class: "attr-box"}, el("div", {class: "attr-group muted"}, r.group), box));
      }
      const v = r.value || 0, half = (50 * Math.abs(v) / most).toFixed(2) + "%";
      const fill = el("span", {class: "attr-fill " + (v < 0 ? "neg" : "pos")});
      Object.assign(fill.style, v < 0 ? {right: "50%", width: half} : {left: "50%", width: half});
      const attrs = {class: "attr-bar", role: "listitem", dataset: {part: r.part, layer: r.layer, head: r.head, value: full(r.value)},
        title: `${r.group} ${r.label}: ${full(r.value)}`};
      const body = [el("span", {class: "attr-label"}, r.label), el("span", {class: "attr-track"}, el("span", {class: "attr-zero"}), fill),
        el("span", {class: "attr-value num"}, fmt(r.value, 4))];
      box.append(r.part === "head"
        ? TK.linkTo({view: "attention", layer: String(r.layer), head: String(r.head), query: String(position)},
          {...attrs, "aria-label": `block ${r.layer} head ${r.head}: ${fmt(r.value, 4)}; open its attention at query ${position}`}, ...body)
        : el("div", attrs, ...body));
    }
    return chart;
  }

  function attribution(doc, cfg) {
    const t = doc.position, tokens = doc.tokens;
    const norm = cfg.norm_type === "rmsnorm" ? "1/rms" : "1/std";
    return [
      el("h2", {}, "Direct logit attribution: position ", el("span", {class: "tok"}, `${t} ${shown(tokens[t].text)}`), " → ",
        el("span", {class: "tok", id: "attr-token", dataset: {id: doc.token}}, shown(doc.token_text))),
      el("p", {class: "muted"}, `The logit of this prediction (`, el("span", {class: "num", id: "attr-logit", dataset: {value: full(doc.logit)}},
        fmt(doc.logit, 4)), `) split into what each part of the model wrote into the residual stream: the shares add up to `,
      el("span", {class: "num", id: "attr-sum", dataset: {value: full(doc.sum)}}, fmt(doc.sum, 4)),
      ". A head's bar opens its attention at this position."),
      el("p", {class: "note", id: "attr-frozen"}, `The final norm's scale is frozen at its actual value (${norm} = ${fmt(doc.scale, 4)} here), ` +
        "the standard linearisation: each share is that part's direct effect, not what it does through later layers."),
      bars(doc, cfg, t),
    ];
  }

  TK.register("lens", {
    title: "Lens",
    needs: ["model"],
    async render(target, state, info, ctx) {
      if (state.text === "") { target.append(el("p", {class: "muted"}, "Type some text above: what the model would predict after each layer shows here.")); return; }
      const cfg = info.model.config;
      const ofText = {text: state.text, specials: state.specials};
      const answer = await TK.api("/api/lens", ofText);
      const T = answer.tokens.length;
      const position = state.position === "" ? T - 1 : Number(state.position);
      const asked = TK.api("/api/attribution", {...ofText, position: state.position === "" ? T - 1 : state.position})
        .catch((error) => ({error: error.message}));
      // a position picked: drawn again (the lens is kept), the keyboard's focus back on what was clicked
      const pick = (t, l) => TK.explain.goKeep({position: String(t)},
        l == null ? `.lens-pos[data-pos="${t}"]` : `.lens-cell[data-layer="${l}"][data-pos="${t}"]`);
      const box = grid(answer, position, pick);
      box.addEventListener("click", (event) => {
        const cell = event.target.closest(".lens-cell");
        if (cell) pick(+cell.dataset.pos, +cell.dataset.layer);
      });
      const tip = tipFor(answer, box);
      ctx.onLeave(() => tip.remove());
      document.body.append(tip);
      target.append(el("section", {class: "card", id: "lens-card"},
        el("h2", {}, "Logit lens: what the model would predict after each layer"),
        el("p", {class: "muted"}, "Each layer's residual stream at each position, put through the model's own final norm and output head. " +
          "A cell shows its first choice, coloured by the probability it gives the token the whole model predicts there " +
          "(the last row's first choice); hover it for its top tokens, click it for the attribution below."),
        legend(), el("div", {class: "lens-scroll"}, box)));
      const doc = await asked;
      const card = el("section", {class: "card", id: "attr-card"});
      if (doc.error) card.append(el("p", {class: "error", id: "attr-error"}, doc.error));
      else card.append(...attribution(doc, cfg));
      target.append(card);
    },
  });
})();
