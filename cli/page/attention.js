// attention.js: the attention view: every layer and head as a small heatmap, the chosen head large, and the
// worked arithmetic of one query. The server sends the chosen head whole (/api/attention) and, once per text,
// every head as a thumbnail (/api/thumbnails): its weights, or above 48 tokens block means. The widgets it
// draws with are TK.explain's (explain.js, loaded before this file); the arithmetic reads /api/explain's steps
// by the names transformer/trace.py declares, and its sizes (head dim, MLP width) from those steps' shapes.
"use strict";
(() => {
  const {visible} = TK;
  const {el, fmt, colour, value, vector, tokenChip, heatmap, legend, thumb, ask, goKeep, unpackWeights} = TK.explain;
  const KEYS_SHOWN = 24;      // key rows of the arithmetic shown at first for a long text (the heaviest)

  // The explain steps the arithmetic reads, by transformer/trace.py's names (tests/test_trace.py checks them):
  // a block's under h.{layer}., the model's as they are, RMSNorm's rows under their norm's name.
  const BLOCK_KEY = {q: "attn.q", qPre: "attn.q_pre", k: "attn.k", kPre: "attn.k_pre", v: "attn.v",
    scoresRaw: "attn.scores_raw", scores: "attn.scores", weights: "attn.weights", mix: "attn.mix",
    headOut: "attn.head_out", out: "attn.out", ln1: "ln_1", resid1: "resid_1", ln2: "ln_2", pre: "mlp.pre",
    gate: "mlp.gate", siluGate: "mlp.silu_gate", up: "mlp.up", act: "mlp.act", mlpOut: "mlp.out", resid2: "resid_2"};
  const MODEL_KEY = {x0: "x0", layerInput: "layer_input", ropeAngle: "rope_angle"};
  const NORM_KEY = {rms: "rms", scaled: "scaled", gain: "gain"};

  // ---------------------------------------------------------------- the attention view
  function intParam(text, name, n) {
    const x = Number(text);
    if (!Number.isInteger(x) || x < 0 || x >= n) {
      throw new Error(`${name} ${text} does not exist: the model has ${n} ${name}${n === 1 ? "" : "s"}, 0..${n - 1}`);
    }
    return x;
  }

  // Whether a text's thumbnails are block means (above 48 tokens), not their heads' own weights.
  const pooled = (thumbs) => thumbs.thumbnail_edges.length - 1 < thumbs.tokens.length;

  // Every head's thumbnail (att.thumbnails[layer][head]; cell i covers positions edges[i]..edges[i + 1] - 1); a click
  // shows the head large, or with the ablation switch on knocks it out (ablation.js), crossed out while it is.
  function overview(att, layer, head, causal, state, effect) {
    const A = TK.ablation;
    const size = Math.max(28, Math.min(60, Math.floor(360 / att.n_heads)));
    const edges = att.thumbnail_edges, T = att.tokens.length;
    const widths = edges.slice(1).map((e, i) => e - edges[i]);
    const blocks = pooled(att);
    const lo = Math.min(...widths), hi = Math.max(...widths), block = lo === hi ? String(lo) : `${lo}-${hi}`;
    // a cell is masked when every key of its block comes after every query of its block
    const masked = causal ? (i, j) => edges[j] >= edges[i + 1] : () => false;
    const grid = el("div", {class: "thumbs", dataset: {block}});
    grid.style.gridTemplateColumns = `max-content repeat(${att.n_heads}, ${size + 6}px)`;
    grid.append(el("span"));
    for (let h = 0; h < att.n_heads; h++) grid.append(el("span", {class: "muted thumb-head"}, `head ${h}`));
    for (let l = 0; l < att.n_layers; l++) {
      grid.append(el("span", {class: "muted thumb-layer"}, `layer ${l}`));
      for (let h = 0; h < att.n_heads; h++) {
        const on = l === layer && h === head, part = `${l}.${h}`, out = A.has(state, part);
        const self = `.thumb[data-layer="${l}"][data-head="${h}"]`;
        const what = `layer ${l}, head ${h}` + (out ? " (knocked out)" : "");
        const button = el("button", {type: "button", class: "thumb" + (on ? " selected" : "") + (out ? " knocked" : ""),
          dataset: {layer: l, head: h, knocked: out ? "1" : null},
          "aria-pressed": (A.clicking ? out : on) ? "true" : "false", "aria-label": what, title: what,
          onclick: () => goKeep(A.clicking ? {ablate: A.toggled(state, part)} : {layer: String(l), head: String(h)}, self)},
        thumb(unpackWeights(att.thumbnails[l][h]), masked, size, blocks ? widths : null));
        Object.assign(button.style, {width: `${size + 6}px`, height: `${size + 6}px`});
        grid.append(button);
      }
    }
    const side = lo === hi ? `${lo} × ${lo}` : `${lo}–${hi} × ${lo}–${hi}`;
    return el("div", {class: "overview"}, el("h3", {class: "overview-head"}, "every layer and head ", A.toggleSwitch("heads")), grid,
      el("p", {class: "muted note"}, A.clicking ? "click a head to knock it out, again to put it back" : "click one to show it large"),
      effect,
      blocks ? el("p", {class: "muted note", id: "thumb-note"}, `${T} tokens: each thumbnail cell is the mean of a ` +
        `${side} block of weights, coloured by the mean × the block's keys (its share of its queries' attention); ` +
        "the large map is the head's own weights.") : null);
  }

  const row = (label, ...content) => el("div", {class: "eq"}, el("span", {class: "eq-label"}, label), el("span", {class: "eq-body"}, content));

  // The worked arithmetic of query i, from /api/explain's steps.
  function arithmetic(doc, i, cfg, tokens, layer, head) {
    const step = {};
    for (const s of doc.steps) step[s.key] = s;
    const h = `h.${layer}.`, pre = cfg.norm !== "post";
    const K = Object.fromEntries(Object.entries(BLOCK_KEY).map(([name, key]) => [name, h + key]));
    const normKey = (norm, part) => `${norm}.${NORM_KEY[part]}`;
    const hd = step[K.q].shape[1];  // the explain step's width: the model's head size
    const inputKey = layer > 0 ? MODEL_KEY.layerInput : MODEL_KEY.x0;
    const rowOf = (key) => step[key].value[i];
    const vec = (key, r = i) => vector(step[key].value[r], {key, row: r});
    const keys = [];
    const causal = cfg.causal !== false;
    for (let j = 0; j < tokens.length; j++) if (!(causal && j > i)) keys.push(j);
    const a = keys.map((j) => step[K.scores].value[i][j]);
    const top = Math.max(...a);
    const e = a.map((x) => Math.exp(x - top));
    const sum = e.reduce((x, y) => x + y, 0);
    const w = keys.map((j) => step[K.weights].value[i][j]);
    const diff = Math.max(...e.map((x, n) => Math.abs(x / sum - w[n])));
    const me = tokenChip(tokens[i].text, i);

    // the rows shown: every key, or for a long text the heavy ones (w >= 0.005; 8 to KEYS_SHOWN) and the query itself
    const nHeavy = Math.max(8, Math.min(KEYS_SHOWN, w.filter((x) => x >= 0.005).length));
    const heavy = new Set(keys.map((j, n) => [w[n], j]).sort((x, y) => y[0] - x[0]).slice(0, nHeavy).map((p) => p[1]).concat([i]));
    const keyTable = (all, columns) => {
      const body = [];
      let skipped = 0;
      keys.forEach((j, n) => {
        if (!all && keys.length > KEYS_SHOWN + 8 && !heavy.has(j)) { skipped++; return; }
        if (skipped) { body.push(el("tr", {class: "skip"}, el("td", {colspan: 9, class: "muted"}, `… ${skipped} lighter key${skipped === 1 ? "" : "s"}`))); skipped = 0; }
        body.push(el("tr", {}, columns.map(([, cell, cls]) => el("td", {class: cls}, cell(j, n)))));
      });
      if (skipped) body.push(el("tr", {class: "skip"}, el("td", {colspan: 9, class: "muted"}, `… ${skipped} lighter key${skipped === 1 ? "" : "s"}`)));
      return el("table", {class: "arith-table"}, el("thead", {}, el("tr", {}, columns.map(([title, , cls]) => el("th", {scope: "col", class: cls}, title)))),
        el("tbody", {}, body));
    };
    const expandable = (columns) => {
      const box = el("div", {class: "table-wrap"});
      const draw = (all) => box.replaceChildren(keyTable(all, columns), ...(keys.length > KEYS_SHOWN + 8 ? [el("button", {type: "button",
        class: "more", "aria-expanded": all ? "true" : "false", onclick: () => draw(!all)},
      all ? "only the heaviest keys" : `all ${keys.length} keys`)] : []));
      draw(false);
      return box;
    };
    const swatch = (x) => { const s = el("span", {class: "swatch"}); s.style.background = colour(x); return s; };
    const keyChip = (j) => tokenChip(tokens[j].text, j);
    // Llama-family pieces, known by their steps: rotary q and k, RMSNorm's scale, SwiGLU's gate, shared K/V heads
    const rope = K.qPre in step, swiglu = K.gate in step;
    const rmsOf = (name) => normKey(name, "rms") in step;
    const nKv = cfg.n_kv_heads || cfg.n_heads, group = cfg.n_heads / nKv, kvHead = Math.floor(head / group);
    const mates = Array.from({length: group}, (_, n) => kvHead * group + n);
    const shared = group > 1 ? `head ${head} reads K/V head ${kvHead}, shared with heads ${mates.slice(0, -1).join(", ")} and ${mates[mates.length - 1]}` : null;
    const kvTag = group > 1 ? ` (K/V head ${kvHead})` : "";

    const scoreTable = expandable([
      ["key j", keyChip],
      ...(rope ? [[["k", el("sub", {}, "j"), " before rotation", kvTag], (j) => vec(K.kPre, j), "left"],
        [["angles j × inv_freq"], (j) => vec(MODEL_KEY.ropeAngle, j), "left"]] : []),
      [["k", el("sub", {}, "j"), rope ? " rotated" : "", rope ? "" : kvTag], (j) => vec(K.k, j), "left"],
      [["q", el("sub", {}, i), " · k", el("sub", {}, "j")], (j) => value(step[K.scoresRaw].value[i][j], {key: K.scoresRaw, row: i, col: j})],
      [["a", el("sub", {}, "j"), ` = q·k / √${hd}`], (j) => value(step[K.scores].value[i][j], {key: K.scores, row: i, col: j})],
      [["exp(a", el("sub", {}, "j"), " − max)"], (j, n) => value(e[n], {derived: "exp", row: i, col: j})],
      [["w", el("sub", {}, "j"), " = exp / Σ"], (j, n) => el("span", {class: "wcell"}, swatch(w[n]), value(w[n], {key: K.weights, row: i, col: j}))],
    ]);
    const mixTable = expandable([
      ["key j", keyChip],
      [["w", el("sub", {}, "j")], (j, n) => value(w[n], {key: K.weights, row: i, col: j})],
      [["v", el("sub", {}, "j"), kvTag], (j) => vec(K.v, j), "left"],
    ]);
    const later = causal && i < tokens.length - 1
      ? el("p", {class: "muted"}, `keys ${i + 1}..${tokens.length - 1} come after the query: masked (score −∞, weight 0), not listed.`) : null;
    // r_i written out: every term for up to 4 keys, else the 3 heaviest (in position order) and "…"
    const terms = keys.map((j, n) => [w[n], j]).sort((x, y) => y[0] - x[0]).slice(0, keys.length > 4 ? 3 : 4).sort((x, y) => x[1] - y[1]);
    const lnIn = pre ? K.ln1 : inputKey;
    const mlpIn = pre ? K.ln2 : K.ln1;
    const stats = (values) => {
      const mean = values.reduce((x, y) => x + y, 0) / values.length;
      const variance = values.reduce((x, y) => x + (y - mean) ** 2, 0) / values.length;
      return [value(mean, {derived: "mean", row: i}), value(Math.sqrt(variance), {derived: "std", row: i})];
    };
    const [mean1, std1] = rmsOf(mlpIn) ? [null, null] : stats(rowOf(K.resid1));
    // RMSNorm's rows: rms of the input, input / rms, and that times the gain (the norm's output)
    const rmsRows = (name, input) => [
      row(["rms of ", input, " = √(mean(x²) + ε)"], value(step[normKey(name, "rms")].value[i][0], {key: normKey(name, "rms"), row: i, col: 0})),
      row([input, " / rms"], vec(normKey(name, "scaled"))),
      row("gain", vector(step[normKey(name, "gain")].value, {key: normKey(name, "gain")})),
      row([input, " / rms · gain = ", name.slice(h.length)], vec(name))];
    const section = (title, ...content) => el("section", {class: "arith-step"}, el("h4", {}, title), content);

    const S = (name, index) => [name, el("sub", {}, String(index))];  // a name with its subscript
    return [
      section(["1. the query at ", me],
        row([S("x", i), layer > 0 ? ", entering the layer" : " = x0 (embedding + position)"], vec(inputKey)),
        pre && rmsOf(lnIn) ? [el("p", {class: "muted note"}, "RMSNorm ln_1: no mean is subtracted; the row is divided by its rms."),
          rmsRows(lnIn, S("x", i))] : null,
        pre && !rmsOf(lnIn) ? row(["ln_1(", S("x", i), "), the attention's input"], vec(lnIn)) : null,
        rope ? [
          row([S("q", i), " before rotation = ln_1(", S("x", i), ") W", el("sub", {}, "Q")], vec(K.qPre)),
          row(["angles ", i, " × inv_freq"], vec(MODEL_KEY.ropeAngle)),
          row([S("q", i), " rotated (RoPE)"], vec(K.q)),
          el("p", {class: "muted note"}, `RoPE: dimension d turns with d + ${hd / 2} by angle d mod ${hd / 2} of the position ` +
            `(q_d cos − q_{d+${hd / 2}} sin, q_{d+${hd / 2}} cos + q_d sin); each key's k turns by its own position (below).`),
        ] : row([S("q", i), " = ", pre ? ["ln_1(", S("x", i), ")"] : S("x", i), " W", el("sub", {}, "Q")], vec(K.q)),
        el("p", {class: "muted note"}, shared ? `W_Q: head ${head}'s ${hd} columns of c_attn's first ${cfg.n_heads * hd}.`
          : `W_Q: head ${head}'s ${hd} columns of c_attn's first third.`),
        shared ? el("p", {class: "note gqa", dataset: {kvHead}}, shared + ": its keys and values below are K/V head " +
          `${kvHead}'s.`) : null),
      section("2. scores, exp and softmax over the keys",
        el("p", {class: "formula"}, S("a", "j"), " = ", S("q", i), " · ", S("k", "j"), ` / √${hd}  (× ${fmt(1 / Math.sqrt(hd), 6)})`,
          el("br"), S("w", "j"), " = exp(", S("a", "j"), " − max) / Σ", el("sub", {}, "k"), " exp(", S("a", "k"), " − max)"),
        scoreTable, later,
        row(["max ", S("a", "j")], value(top, {derived: "max", row: i})),
        row(["Σ exp(", S("a", "j"), " − max)"], value(sum, {derived: "sum-exp", row: i})),
        row(["Σ ", S("w", "j")], value(w.reduce((x, y) => x + y, 0), {derived: "sum-w", row: i})),
        el("p", {class: "muted note"}, "exp(a_j − max) and its sum (in italics) are computed on this page from the scaled scores a_j " +
          "(subtracting the largest score keeps exp from overflowing and changes no weight); the weights w_j are the model's own. " +
          `exp / Σ here and the model's w_j differ by at most ${diff.toExponential(1)} (the model computes in float32).`)),
      section(["3. the weighted sum of the values: ", S("r", i), " = Σ ", S("w", "j"), " ", S("v", "j")],
        mixTable,
        row([S("r", i), " = ", terms.map(([x, j], n) => [n ? " + " : "", fmt(x, 4), " ", S("v", j)]), keys.length > 4 ? " + …" : ""],
          vec(K.mix))),
      section(`4. head ${head}'s share of the output projection`,
        row([S("r", i), ` · c_proj[${head * hd}..${(head + 1) * hd - 1}]`], vec(K.headOut)),
        el("p", {class: "muted note"}, step[K.headOut].note)),
      section("5. the output projection (all heads)",
        row([S("o", i), ` = [r of heads 0..${cfg.n_heads - 1}] · c_proj + b`], vec(K.out))),
      section("6. the residual",
        row([S("x", i)], vec(inputKey)),
        row(["+ ", S("o", i)], vec(K.out)),
        row(["= resid_1"], vec(K.resid1))),
      rmsOf(mlpIn) ? section(`7. RMSNorm ${pre ? "ln_2 (the MLP's input)" : "ln_1 of the residual"}`, rmsRows(mlpIn, "resid_1"))
        : section(`7. LayerNorm ${pre ? "ln_2 (the MLP's input)" : "ln_1 of the residual"}`,
          row("mean, std of resid_1", mean1, ",  ", std1),
          row(["(resid_1 − mean) / √(var + ε) · γ + β"], vec(mlpIn))),
      section(`8. the MLP (${cfg.activation.toUpperCase()}), back to d_model = ${cfg.d_model}`,
        swiglu ? [
          row(`pre-activation [gate | up] (${step[K.pre].shape[1]})`, vec(K.pre)),
          row("gate", vec(K.gate)),
          row("SiLU(gate) = gate · sigmoid(gate)", vec(K.siluGate)),
          row("up", vec(K.up)),
          row("SiLU(gate) × up", vec(K.act)),
        ] : [
          row(`pre-activation (${step[K.pre].shape[1]})`, vec(K.pre)),
          row(`after ${cfg.activation.toUpperCase()}`, vec(K.act)),
        ],
        row("c_proj (back to d_model)", vec(K.mlpOut)),
        row(pre ? "resid_2 = resid_1 + MLP" : "resid_2 = ln_1 + MLP", vec(K.resid2)),
        pre ? null : row("ln_2 (the layer's output)", vec(K.ln2))),
    ];
  }

  TK.register("attention", {
    title: "Attention",
    needs: ["model"],
    async render(root, state, info) {
      if (state.text === "") { root.append(el("p", {class: "muted"}, "Type some text above: every head's attention over it shows here.")); return; }
      const cfg = info.model.config;
      const layer = intParam(state.layer, "layer", cfg.n_layers), head = intParam(state.head, "head", cfg.n_heads);
      const wantQuery = state.query !== "";
      const ofText = {text: state.text, specials: state.specials};
      // this text's thumbnails, when the page holds them: up to 48 tokens they are the heads' own weights too
      const known = TK.kept("/api/thumbnails", ofText);
      const held = known && await known.catch(() => null);
      const atHand = held && !pooled(held);
      const headAsked = atHand ? null : ask("/api/attention", {...ofText, layer, head});
      // the arithmetic's answer failing (a `tk explain --html` file holds one head's) leaves the heatmaps drawn;
      // query: the server sends that row of each per-token step only (50x less JSON for 64 tokens)
      const docAsked = wantQuery ? ask("/api/explain", {...ofText, layer, head, query: state.query})
        .catch((error) => ({error: error.message})) : null;
      // the ablation's card (none without one), or while the switch is on its place, so that a first click moves nothing
      const effectAsked = TK.ablation.panel(state, TK.ablation.clicking ? "a head" : null);
      // the head before the thumbnails: its forward pass pools every head, which the server then sends without another
      const att = atHand ? {tokens: held.tokens, weights: held.thumbnails[layer][head]} : await headAsked;
      const thumbs = held || await ask("/api/thumbnails", ofText);
      const doc = await docAsked;
      const effect = await effectAsked;
      const T = att.tokens.length;
      let query = null, queryError = null;
      if (wantQuery) {
        const q = Number(state.query);
        if (Number.isInteger(q) && q >= 0 && q < T) query = q;
        else queryError = `query ${state.query} is not a position of this text (0..${T - 1})`;
      }
      const labels = att.tokens.map((t, i) => `${i} ${visible(t.text)}`);
      const weights = unpackWeights(att.weights);
      const causal = cfg.causal !== false;
      const hd = cfg.d_model / cfg.n_heads;  // GPTConfig.head_dim (n_heads divides d_model)
      const pick = (q) => goKeep({query: String(q)}, ".heatmap");
      const map = heatmap(weights, {rows: labels, cols: labels, masked: causal ? (q, k) => k > q : null, query,
        onQuery: pick, caption: `attention weights of layer ${layer}, head ${head}: rows are queries, columns are keys`});
      const main = el("div", {class: "att-main"},
        el("h2", {}, `layer ${layer}, head ${head}`, el("span", {class: "muted sub"},
          `  ${T} token${T === 1 ? "" : "s"} · d_head ${hd} · ${causal ? "causal" : "bidirectional"}`)),
        legend(), map, query == null ? null : el("button", {type: "button", class: "more jump",
          onclick: () => document.getElementById("arith").scrollIntoView({block: "start"})},
        `↓ the worked arithmetic of query ${query}`));
      const arith = el("section", {id: "arith", "aria-label": "worked arithmetic"});
      const choose = el("select", {"aria-label": "query position", onchange: (event) =>
        goKeep({query: event.target.value}, "#arith select")},
      el("option", {value: ""}, "choose a query…"),
      att.tokens.map((t, i) => el("option", {value: i, selected: i === query}, `${i} ${visible(t.text)}`)));
      arith.append(el("h3", {}, "the worked arithmetic of one query ", choose));
      if (queryError) arith.append(el("p", {class: "error"}, queryError));
      if (query != null && doc.error) {
        arith.append(el("p", {class: "error", id: "arith-error"}, doc.error));
      } else if (query == null) {
        arith.append(el("p", {class: "muted"}, "Click a row of the heatmap (a query token) to see how this head " +
          "computes its output there, with the model's own numbers."));
      } else {
        arith.append(el("p", {class: "muted"}, `Query ${query}, layer ${layer}, head ${head}: the model's numbers ` +
          "(from the same trace as tk explain --json); hover a number for its full precision."),
        ...arithmetic(doc, query, cfg, att.tokens, layer, head));
      }
      root.append(el("div", {class: "att-top"}, overview(thumbs, layer, head, causal, state, effect), main), arith);
    },
  });
})();
