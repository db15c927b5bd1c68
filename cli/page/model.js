// model.js: the loaded model drawn as its blocks (embeddings, each layer's attention and MLP, the head)
// with their shapes and parameter counts, each a link to the view that shows it at work (an MLP: the lens view,
// whose attribution bars give each MLP's share of the prediction); with the ablation switch on (ablation.js) a
// click on an MLP's blocks knocks that MLP out instead, and the card above shows the next token before and after.
"use strict";
(() => {
  const {el} = TK;
  const TITLES = {tokens: "Tokens", bpe: "BPE replay", attention: "Attention", lens: "Lens", next: "Next token", training: "Training",
    model: "Model", examples: "Examples"};

  // The layer a block belongs to: its `layer`, else the number in a name like "h.3.attn"; null outside the layers.
  function layerOf(block) {
    if (Number.isInteger(block.layer)) return block.layer;
    const found = /(?:^|\.)(?:h|layers?|blocks?)\.(\d+)(?:\.|$)/.exec(block.name);
    return found ? Number(found[1]) : null;
  }

  function card(block, total, state) {
    const layer = layerOf(block);
    const view = TK.VIEWS.includes(block.view) ? block.view : null;
    const mlp = view === "lens" && layer != null ? `${layer}.mlp` : null;  // an MLP's blocks link to the lens
    const out = mlp != null && TK.ablation.has(state, mlp), knocking = mlp != null && TK.ablation.clicking;
    // the attention's blocks name the heads knocked out of their layer (a click on a thumbnail does that)
    const heads = view === "attention" && block.heads && layer != null
      ? TK.ablation.parts(state).filter((p) => p.startsWith(`${layer}.`) && p !== `${layer}.mlp`).map((p) => p.split(".")[1]) : [];
    const share = total ? block.parameters / total : 0;
    const minor = block.parameters > 0 && share < 0.01;  // layer norms: a few hundred numbers
    // a block's own place in its view: the attention of its layer, or (an MLP) the lens with its attribution bar
    const patch = !view ? null : view === "attention" && layer != null ? {view, layer: String(layer), head: "0", query: ""}
      : view === "lens" ? {view, position: ""} : {view};
    const where = view === "attention" && layer != null && !minor ? ` · layer ${layer}`
      : view === "lens" && layer != null ? ` · block ${layer}'s MLP` : "";
    const body = [
      el("span", {class: "block-name"}, block.name),
      el("span", {class: "block-what"}, block.what),
      block.shape && block.shape.length ? el("span", {class: "block-shape", title: "shape"}, block.shape.join(" × ")) : null,
      // the count and its share each kept whole: a narrow block breaks the line between them only
      el("span", {class: "block-params", title: `${(100 * share).toFixed(2)}% of the model's parameters`},
        !block.parameters ? "no parameters of its own" : el("span", {}, `${TK.int(block.parameters)} parameters`),
        block.parameters && !minor ? el("span", {}, ` · ${(100 * share).toFixed(1)}%`) : null),
      minor ? null : el("span", {class: "block-share"}, el("div", {style: {width: (100 * share).toFixed(1) + "%"}})),
      heads.length ? el("span", {class: "block-knocked"}, `${heads.length === 1 ? "head" : "heads"} ${heads.join(", ")} knocked out`) : null,
      knocking ? el("span", {class: "block-go"}, out ? `put block ${layer}'s MLP back` : `knock out block ${layer}'s MLP`)
        : view ? el("span", {class: "block-go"}, `${TITLES[view] || view}${where} →`) : null,
    ];
    const attrs = {class: "block" + (minor ? " small" : "") + (out ? " knocked" : ""), dataset: {name: block.name,
      parameters: block.parameters, layer: layer == null ? null : layer, view: view || null, knocked: out ? "1" : null},
      title: !view ? null : view === "lens" ? `see ${block.name}'s share of the prediction in the Lens view's attribution`
        : `see ${block.name} at work in the ${TITLES[view] || view} view`};
    if (knocking) {
      return el("button", {...attrs, type: "button", "aria-pressed": out ? "true" : "false",
        title: `${out ? "put back" : "knock out"} block ${layer}'s MLP (zeroed)`,
        onclick: () => TK.go({ablate: TK.ablation.toggled(state, mlp)}, true)}, ...body);
    }
    return view ? TK.linkTo(patch, attrs, ...body) : el("div", attrs, ...body);
  }

  function row(blocks, total, joiner, state) {
    const out = el("div", {class: "arch-row"});
    blocks.forEach((block, i) => {
      if (i) out.append(el("span", {class: "arch-plus", "aria-hidden": "true"}, joiner));
      out.append(card(block, total, state));
    });
    return out;
  }

  const down = (text) => el("div", {class: "arch-arrow", "aria-hidden": "true"}, "↓", text ? el("span", {class: "muted small"}, " " + text) : null);

  TK.register("model", {
    title: "Model",
    needs: ["model"],
    noText: true,
    async render(target, state, info) {
      const effectAsked = TK.ablation.panel(state, TK.ablation.clicking ? "an MLP's blocks" : null, true);
      const model = await TK.api("/api/model");
      const c = model.config || {};
      const total = model.parameters;
      const blocks = model.blocks || [];
      const pre = [], post = [], layers = new Map();
      for (const block of blocks) {
        const layer = layerOf(block);
        if (layer != null) { if (!layers.has(layer)) layers.set(layer, []); layers.get(layer).push(block); }
        else if (layers.size) post.push(block);
        else pre.push(block);
      }
      target.append(el("div", {class: "stats", id: "model-stats"},
        stat(TK.int(total), "parameters"), stat(c.n_layers, "layers"), stat(c.n_heads, "heads per layer"),
        stat(c.d_model, "d_model (width)"), stat(c.context_length, "context (tokens)"), stat(TK.int(c.vocab_size), "vocabulary")));
      target.append(el("p", {class: "lead"}, "The model as its blocks, in the order a token's vector goes through them. " +
        "Each block links to the view that shows it at work. ", TK.ablation.toggleSwitch("MLPs")));
      const effect = await effectAsked;
      if (effect) target.append(effect);

      const arch = el("div", {class: "arch", id: "arch"});
      arch.append(el("div", {class: "io"}, "token ids ", el("span", {class: "mono"}, `(up to ${c.context_length})`)), down());
      const embeddings = pre.every((b) => /embed/i.test(b.what));
      if (pre.length) arch.append(row(pre, total, embeddings ? "+" : "→", state), down(c.d_model ? `a vector of ${c.d_model} per token` : ""));
      const sorted = [...layers.keys()].sort((a, b) => a - b);
      sorted.forEach((layer, i) => {
        const own = layers.get(layer);
        const sum = own.reduce((s, b) => s + b.parameters, 0);
        const residual = c.norm === "post" ? "x = norm(x + attention(x)); x = norm(x + mlp(x))"
          : "x = x + attention(norm(x)); x = x + mlp(norm(x))";
        arch.append(el("section", {class: "layer", dataset: {layer}, "aria-label": `layer ${layer}`},
          el("div", {class: "layer-head"}, el("span", {}, el("b", {}, `layer ${layer}`), ` · ${TK.int(sum)} parameters`),
            el("span", {class: "mono"}, residual)),
          row(own, total, "→", state)));
        if (i < sorted.length - 1) arch.append(down());
      });
      if (post.length) arch.append(down(), row(post, total, "→", state));
      arch.append(down(), el("div", {class: "io"}, "a probability for each of the ", el("span", {class: "mono"}, TK.int(c.vocab_size)),
        " tokens, at every position"));
      target.append(arch);

      const rows = Object.entries(c).map(([key, value]) => el("tr", {}, el("td", {}, key), el("td", {class: "mono"}, String(value))));
      target.append(el("section", {class: "config"}, el("h3", {}, "Configuration"),
        el("table", {id: "model-config"}, el("tbody", {}, rows))));
    },
  });

  function stat(value, label) {
    return el("div", {class: "stat"}, el("span", {class: "stat-value"}, value == null ? "—" : String(value)), el("span", {class: "stat-label"}, label));
  }
})();
