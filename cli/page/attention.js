// attention.js: the attention view (every layer and head as a small heatmap, the chosen head large, the
// worked arithmetic of one query) and TK.explain, the renderers it shares with examples.js. The server sends
// the chosen head whole (/api/attention) and, once per text, every head as a thumbnail (/api/thumbnails): its
// weights, or above 48 tokens block means; each map as its float32 bytes (unpackWeights), exact.
// Every number drawn is also an attribute at full precision: a heatmap cell data-q/data-k/data-w; a value
// of an explain step data-key/data-value (+ data-row, data-col); a value computed here data-derived.
"use strict";
(() => {
  const {visible} = TK;
  // TK.el flattens one level of children; the arithmetic nests deeper
  const el = (tag, attrs, ...children) => TK.el(tag, attrs, ...children.flat(Infinity));
  // TK.fmt, but a tiny number that would show as 0.0000 in exponent form ("3.21e−5") and no "−0.0000"
  const fmt = (x, digits = 4) => {
    if (x != null && x !== 0 && Math.abs(x) < 0.5 * 10 ** -digits) return x.toExponential(2).replace(/-/g, "−");
    const text = TK.fmt(x, digits);
    return /^−0\.?0*$/.test(text) ? text.slice(1) : text;
  };
  const DOM_CELLS_MAX = 160;  // above this many tokens the big heatmap is one canvas (hover for values)
  const VEC_HEAD = 6;         // numbers a long vector shows before its expander
  const VEC_LONG = 8;         // a vector longer than this gets an expander
  const KEYS_SHOWN = 24;      // key rows of the arithmetic shown at first for a long text (the heaviest)

  // ---------------------------------------------------------------- colour: white to a deep blue
  const STOPS = [[255, 255, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225], [107, 174, 214],
    [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];  // ColorBrewer "Blues"
  function rgb(w) {
    const x = Math.min(1, Math.max(0, Number(w) || 0)) * (STOPS.length - 1);
    const i = Math.min(STOPS.length - 2, Math.floor(x)), f = x - i;
    return STOPS[i].map((c, j) => Math.round(c + f * (STOPS[i + 1][j] - c)));
  }
  const colour = (w) => `rgb(${rgb(w).join(",")})`;
  const ink = (w) => (w > 0.55 ? "#fff" : "#1d1d1f");
  const MASKED = [246, 246, 248];

  // ---------------------------------------------------------------- values with their hooks
  const full = (x) => (x == null ? "-inf" : String(x));  // data-value: JSON's null is a masked -inf

  // One number of an explain step: hooks {key, row, col} (row/col omitted when undefined).
  function value(x, hooks = {}, digits = 4) {
    const data = {value: full(x)};
    if (hooks.key != null) data.key = hooks.key;
    if (hooks.row != null) data.row = hooks.row;
    if (hooks.col != null) data.col = hooks.col;
    if (hooks.derived) data.derived = hooks.derived;
    return el("span", {class: "num" + (hooks.derived ? " derived" : ""), dataset: data, title: full(x)}, fmt(x, digits));
  }

  // A row vector: "[a, b, c, d, e, f, …]" with a button that shows all its numbers (and fewer again).
  // The box holds the whole row in data-value (JSON), each number shown its own data-col.
  function vector(values, hooks = {}, digits = 4) {
    const data = {value: JSON.stringify(values)};
    if (hooks.key != null) data.key = hooks.key;
    if (hooks.row != null) data.row = hooks.row;
    if (hooks.derived) data.derived = hooks.derived;
    const box = el("span", {class: "vec", dataset: data});
    const draw = (all) => {
      const n = all ? values.length : Math.min(values.length, VEC_HEAD);
      const parts = ["["];
      for (let j = 0; j < n; j++) {
        if (j) parts.push(", ");
        parts.push(value(values[j], {key: hooks.key, row: hooks.row, col: j, derived: hooks.derived}, digits));
      }
      if (n < values.length) parts.push(", …");
      parts.push("]");
      const children = [el("span", {class: "vec-body"}, parts)];
      if (values.length > VEC_LONG) {
        children.push(el("button", {type: "button", class: "more", "aria-expanded": all ? "true" : "false",
          onclick: () => draw(!all)}, all ? "fewer" : `all ${values.length}`));
      }
      box.replaceChildren(...children);
    };
    draw(values.length <= VEC_LONG);
    return box;
  }

  const tokenChip = (text, position) => el("span", {class: "tok", title: JSON.stringify(text)},
    position == null ? null : el("span", {class: "pos"}, position), visible(text));

  // ---------------------------------------------------------------- matrices (an explain step)
  // A step {key, title, note, rows, cols, value, example_printed} as a labelled table. opts.query: the row
  // to mark; opts.heat: colour the cells by value (attention weights); opts.max: rows/cols before "show all".
  function matrix(step, opts = {}) {
    const v = step.value;
    const two = Array.isArray(v) && Array.isArray(v[0]);
    const m = two ? v : [Array.isArray(v) ? v : [v]];
    const nr = m.length, nc = m[0] ? m[0].length : 0;
    const printed = {};
    for (const p of step.example_printed || []) printed[p.row == null ? 0 : p.row] = p;
    const hasPrinted = Object.keys(printed).length > 0;
    const sums = /weights$/.test(step.key);
    const wrap = el("div", {class: "matrix-wrap"});
    const draw = (all) => {
      const max = opts.max || 12;
      const rr = all ? nr : Math.min(nr, max), cc = all ? nc : Math.min(nc, max);
      const head = el("tr", {}, el("th", {class: "corner"}));
      for (let j = 0; j < cc; j++) head.append(el("th", {scope: "col", class: "col"}, step.cols ? step.cols[j] : j));
      if (cc < nc) head.append(el("th", {class: "col"}, "…"));
      if (sums) head.append(el("th", {scope: "col", class: "col derived"}, "row sum"));
      if (hasPrinted) head.append(el("th", {scope: "col", class: "col printed"}, "the example printed"));
      const body = [];
      for (let i = 0; i < rr; i++) {
        const tr = el("tr", {class: two && opts.query === i ? "selected" : null},
          el("th", {scope: "row", class: "row"}, two && step.rows ? step.rows[i] : ""));
        for (let j = 0; j < cc; j++) {
          const x = m[i][j];
          const td = el("td", {}, value(x, {key: step.key, row: two ? i : null, col: j}));
          if (opts.heat && x != null) Object.assign(td.style, {background: colour(x), color: ink(x)});
          if (x == null) td.classList.add("masked");
          tr.append(td);
        }
        if (cc < nc) tr.append(el("td", {class: "muted"}, "…"));
        if (sums) tr.append(el("td", {}, value(m[i].reduce((a, b) => a + (b || 0), 0), {derived: "row-sum", row: i})));
        if (hasPrinted) {
          const p = printed[i];
          tr.append(el("td", {class: "printed"}, p ? [el("span", {class: "mono"}, p.text), " ",
            el("span", {class: "badge " + (p.agrees ? "agrees" : "differs"), dataset: {agrees: p.agrees ? "1" : "0"}},
              p.agrees ? "✓ agrees" : "≠ differs")] : ""));
        }
        body.push(tr);
      }
      const parts = [el("table", {class: "matrix", dataset: {key: step.key}}, el("thead", {}, head), el("tbody", {}, body))];
      if (rr < nr || cc < nc || all && (nr > max || nc > max)) {
        parts.push(el("button", {type: "button", class: "more", "aria-expanded": all ? "true" : "false",
          onclick: () => draw(!all)}, all ? "show the corner" : `show all ${nr} × ${nc}`));
      }
      wrap.replaceChildren(...parts);
    };
    draw(false);
    return wrap;
  }

  // ---------------------------------------------------------------- heatmaps
  function legend(withMasked = true) {
    const bar = el("span", {class: "legend-bar"});
    bar.style.background = `linear-gradient(to right, ${[0, .25, .5, .75, 1].map(colour).join(", ")})`;
    return el("div", {class: "legend", "aria-label": "colour scale: weight 0 white to 1 deep blue"},
      el("span", {class: "muted"}, "weight"), el("span", {class: "mono"}, "0"), bar, el("span", {class: "mono"}, "1"),
      withMasked ? [el("span", {class: "legend-masked"}), el("span", {class: "muted"}, "masked (a later key)")] : null);
  }

  let lastKey = 0;  // the keyboard cursor's column, kept when the map is drawn again

  // One head's weights (Tq x Tk) as a grid of cells (or one canvas above DOM_CELLS_MAX tokens).
  // opts: rows, cols (labels), masked(q, k), query (selected row), onQuery(q), caption.
  function heatmap(weights, opts = {}) {
    const Tq = weights.length, Tk = Tq ? weights[0].length : 0;
    const rows = opts.rows || weights.map((_, i) => String(i)), cols = opts.cols || (weights[0] || []).map((_, j) => String(j));
    const masked = opts.masked || (() => false);
    const readout = el("div", {class: "readout mono", role: "status"}, "hover a cell (or focus the map, arrow keys, Enter)");
    const cursor = {q: opts.query != null ? opts.query : 0, k: Math.min(lastKey, Tk - 1)};
    const show = (q, k) => {
      const w = weights[q][k];
      readout.replaceChildren(el("span", {class: "muted"}, "query "), el("span", {class: "tok"}, rows[q]), el("span", {class: "muted"}, "  key "),
        el("span", {class: "tok"}, cols[k]), el("span", {class: "muted"}, "  weight "),
        masked(q, k) ? "masked (the key comes after the query)" : el("b", {}, full(w)));
    };
    const select = (q) => { if (opts.onQuery) opts.onQuery(q); };
    const big = Math.max(Tq, Tk) > DOM_CELLS_MAX;
    let map, move;
    if (!big) {
      const size = Math.max(11, Math.min(44, Math.floor(640 / Math.max(Tq, Tk, 1))));
      map = el("div", {class: "heatmap" + (size >= 30 ? " numbers" : ""), tabindex: "0", role: "group",
        "aria-label": opts.caption || "attention weights: rows are queries, columns are keys"});
      Object.assign(map.style, {gridTemplateColumns: `max-content repeat(${Tk}, ${size}px)`,
        gridTemplateRows: `max-content repeat(${Tq}, ${size}px)`});
      map.append(el("div", {class: "corner muted"}, "query ↓  key →"));
      cols.forEach((c, k) => map.append(el("div", {class: "klabel", title: c}, c)));
      const mark = el("div", {class: "cursor-mark", hidden: true});
      for (let q = 0; q < Tq; q++) {
        map.append(el("button", {type: "button", tabindex: "-1", class: "qlabel" + (q === opts.query ? " selected" : ""),
          dataset: {q}, title: "show the arithmetic of this query", onclick: () => select(q)}, rows[q]));
        for (let k = 0; k < Tk; k++) {
          const w = weights[q][k], off = masked(q, k);
          const cell = el("div", {class: "cell" + (off ? " masked" : ""), dataset: {q, k, w: full(w)}});
          if (!off) {
            cell.style.background = colour(w);
            if (size >= 30) { cell.style.color = ink(w); cell.textContent = w.toFixed(2); }
          }
          map.append(cell);
        }
      }
      if (opts.query != null && opts.query < Tq) {
        const row = el("div", {class: "row-mark"});
        Object.assign(row.style, {gridRow: `${opts.query + 2} / ${opts.query + 3}`, gridColumn: `2 / span ${Tk}`});
        map.append(row);
      }
      map.append(mark);
      map.addEventListener("mouseover", (event) => {
        const cell = event.target.closest(".cell");
        if (cell) show(+cell.dataset.q, +cell.dataset.k);
      });
      map.addEventListener("click", (event) => {
        const cell = event.target.closest(".cell");
        if (cell) select(+cell.dataset.q);
      });
      move = () => {
        mark.hidden = false;
        // both ends given: with an auto end Chromium stretched a mark over two rows
        Object.assign(mark.style, {gridRow: `${cursor.q + 2} / ${cursor.q + 3}`, gridColumn: `${cursor.k + 2} / ${cursor.k + 3}`});
        show(cursor.q, cursor.k);
      };
    } else {
      const px = Math.max(1, Math.min(4, Math.floor(960 / Math.max(Tq, Tk))));
      const canvas = el("canvas", {class: "heatmap heatmap-canvas", tabindex: "0", width: Tk * px, height: Tq * px,
        role: "img", "aria-label": (opts.caption || "attention weights") + ": hover or use the arrow keys for values"});
      const image = pixels(weights, masked);
      const paint = (withCursor) => {
        const g = canvas.getContext("2d");
        g.imageSmoothingEnabled = false;
        g.drawImage(image, 0, 0, Tk * px, Tq * px);
        g.lineWidth = 2;
        if (opts.query != null && opts.query < Tq) {
          g.strokeStyle = "#d9480f";
          g.strokeRect(1, opts.query * px - 1, Tk * px - 2, px + 2);
        }
        if (withCursor) { g.strokeStyle = "#1d1d1f"; g.strokeRect(cursor.k * px - 1, cursor.q * px - 1, px + 2, px + 2); }
      };
      paint(false);
      const at = (event) => {
        const box = canvas.getBoundingClientRect();
        const k = Math.floor((event.clientX - box.left) / box.width * Tk), q = Math.floor((event.clientY - box.top) / box.height * Tq);
        return q >= 0 && q < Tq && k >= 0 && k < Tk ? {q, k} : null;
      };
      canvas.addEventListener("mousemove", (event) => { const p = at(event); if (p) show(p.q, p.k); });
      canvas.addEventListener("click", (event) => { const p = at(event); if (p) select(p.q); });
      map = canvas;
      move = () => { paint(true); show(cursor.q, cursor.k); };
    }
    map.addEventListener("keydown", (event) => {
      const step = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]}[event.key];
      if (step) {
        cursor.q = Math.max(0, Math.min(Tq - 1, cursor.q + step[0]));
        cursor.k = lastKey = Math.max(0, Math.min(Tk - 1, cursor.k + step[1]));
        move();
        event.preventDefault();
      } else if (event.key === "Enter" || event.key === " ") {
        select(cursor.q);
        event.preventDefault();
      }
    });
    map.addEventListener("focus", () => { if (map.matches(":focus-visible")) move(); });
    const axes = big ? el("div", {class: "muted note"}, `rows: the queries 0..${Tq - 1} ↓   columns: the keys 0..${Tk - 1} →`) : null;
    const note = big ? el("p", {class: "muted note"}, `${Math.max(Tq, Tk)} tokens: drawn on a canvas (hover or arrow keys ` +
      `for each query, key and weight); up to ${DOM_CELLS_MAX} tokens the map is a grid of cells.`) : null;
    return el("div", {class: "heatmap-wrap"}, readout, axes, el("div", {class: "heatmap-scroll"}, map), note);
  }

  // weights (Tq x Tk) as an offscreen canvas of one pixel per cell (block max above `cap` pixels a side).
  function pixels(weights, masked, cap = Infinity) {
    const Tq = weights.length, Tk = weights[0].length;
    const h = Math.min(Tq, cap), w = Math.min(Tk, cap);
    const canvas = document.createElement("canvas");
    canvas.width = w; canvas.height = h;
    const g = canvas.getContext("2d"), img = g.createImageData(w, h);
    for (let y = 0; y < h; y++) {
      const q0 = Math.floor(y * Tq / h), q1 = Math.max(q0 + 1, Math.floor((y + 1) * Tq / h));
      for (let x = 0; x < w; x++) {
        const k0 = Math.floor(x * Tk / w), k1 = Math.max(k0 + 1, Math.floor((x + 1) * Tk / w));
        let best = -1;
        for (let q = q0; q < q1; q++) for (let k = k0; k < k1; k++) if (!masked(q, k)) best = Math.max(best, weights[q][k]);
        const c = best < 0 ? MASKED : rgb(best), o = 4 * (y * w + x);
        img.data[o] = c[0]; img.data[o + 1] = c[1]; img.data[o + 2] = c[2]; img.data[o + 3] = 255;
      }
    }
    g.putImageData(img, 0, 0);
    return canvas;
  }

  // A small canvas of one head (at most 64 pixels a side: the max of each block above that). widths: for a
  // pooled head (block means), each column's block width: a cell is coloured by mean x width, the block's
  // share of its queries' attention (a row of such shares sums to 1, as a row of weights does).
  function thumb(weights, masked, size, widths = null) {
    const canvas = el("canvas", {width: size * 2, height: size * 2, "aria-hidden": "true"});
    const g = canvas.getContext("2d");
    g.imageSmoothingEnabled = false;
    const shares = widths ? weights.map((row) => Array.from(row, (x, j) => x * widths[j])) : weights;
    g.drawImage(pixels(shares, masked, 64), 0, 0, size * 2, size * 2);
    return canvas;
  }

  // ---------------------------------------------------------------- the server's answers
  const ask = (path, params) => TK.api(path, params);  // kept by core.js, within its bounds

  // A map of weights as the server packs it (views.pack_weights): {shape: [n, m], dtype, triangle, base64}, the
  // numbers little-endian float32 (or float64) row by row; a triangle's row q holds its first q + 1 only (the rest
  // are 0). -> n rows of m numbers (typed arrays: each number reads back as the very double JSON would give).
  function unpackWeights(packed) {
    const [n, m] = packed.shape, wide = packed.dtype === "float64", size = wide ? 8 : 4;
    const text = atob(packed.base64), bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    const cells = packed.triangle ? n * (n + 1) / 2 : n * m;
    if (bytes.length !== cells * size) throw new Error(`attention weights of ${bytes.length} bytes for ${n} x ${m} cells`);
    const data = new DataView(bytes.buffer), out = wide ? new Float64Array(n * m) : new Float32Array(n * m);
    let at = 0;
    for (let q = 0; q < n; q++) {
      const end = packed.triangle ? q + 1 : m;
      for (let k = 0; k < end; k++, at += size) out[q * m + k] = wide ? data.getFloat64(at, true) : data.getFloat32(at, true);
    }
    return Array.from({length: n}, (_, q) => out.subarray(q * m, (q + 1) * m));
  }

  // Draw after the state changes, then give the keyboard focus back to what the user was on.
  async function goKeep(patch, selector) {
    await TK.go(patch, true);
    const node = selector && document.querySelector(selector);
    if (node) node.focus();
  }

  TK.explain = {colour, ink, rgb, full, value, vector, matrix, heatmap, thumb, legend, tokenChip, ask, goKeep, unpackWeights};

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

  // Every head's thumbnail (att.thumbnails[layer][head]; cell i covers positions edges[i]..edges[i + 1] - 1).
  function overview(att, layer, head, causal) {
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
        const on = l === layer && h === head;
        const button = el("button", {type: "button", class: "thumb" + (on ? " selected" : ""), dataset: {layer: l, head: h},
          "aria-pressed": on ? "true" : "false", "aria-label": `layer ${l}, head ${h}`, title: `layer ${l}, head ${h}`,
          onclick: () => goKeep({layer: String(l), head: String(h)}, `.thumb[data-layer="${l}"][data-head="${h}"]`)},
        thumb(unpackWeights(att.thumbnails[l][h]), masked, size, blocks ? widths : null));
        Object.assign(button.style, {width: `${size + 6}px`, height: `${size + 6}px`});
        grid.append(button);
      }
    }
    const side = lo === hi ? `${lo} × ${lo}` : `${lo}–${hi} × ${lo}–${hi}`;
    return el("div", {class: "overview"}, el("h3", {}, "every layer and head"), grid,
      el("p", {class: "muted note"}, "click one to show it large"),
      blocks ? el("p", {class: "muted note", id: "thumb-note"}, `${T} tokens: each thumbnail cell is the mean of a ` +
        `${side} block of weights, coloured by the mean × the block's keys (its share of its queries' attention); ` +
        "the large map is the head's own weights.") : null);
  }

  const row = (label, ...content) => el("div", {class: "eq"}, el("span", {class: "eq-label"}, label), el("span", {class: "eq-body"}, content));

  // The worked arithmetic of query i, from /api/explain's steps.
  function arithmetic(doc, i, cfg, tokens, layer, head) {
    const step = {};
    for (const s of doc.steps) step[s.key] = s;
    const h = `h.${layer}.`, hd = cfg.d_model / cfg.n_heads, pre = cfg.norm !== "post";
    const inputKey = layer > 0 ? "layer_input" : "x0";
    const rowOf = (key) => step[key].value[i];
    const vec = (key, r = i) => vector(step[key].value[r], {key, row: r});
    const keys = [];
    const causal = cfg.causal !== false;
    for (let j = 0; j < tokens.length; j++) if (!(causal && j > i)) keys.push(j);
    const a = keys.map((j) => step[h + "attn.scores"].value[i][j]);
    const top = Math.max(...a);
    const e = a.map((x) => Math.exp(x - top));
    const sum = e.reduce((x, y) => x + y, 0);
    const w = keys.map((j) => step[h + "attn.weights"].value[i][j]);
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
    const rope = (h + "attn.q_pre") in step, swiglu = (h + "mlp.gate") in step;
    const rmsOf = (name) => (name + ".rms") in step;
    const nKv = cfg.n_kv_heads || cfg.n_heads, group = cfg.n_heads / nKv, kvHead = Math.floor(head / group);
    const mates = Array.from({length: group}, (_, n) => kvHead * group + n);
    const shared = group > 1 ? `head ${head} reads K/V head ${kvHead}, shared with heads ${mates.slice(0, -1).join(", ")} and ${mates[mates.length - 1]}` : null;
    const kvTag = group > 1 ? ` (K/V head ${kvHead})` : "";

    const scoreTable = expandable([
      ["key j", keyChip],
      ...(rope ? [[["k", el("sub", {}, "j"), " before rotation", kvTag], (j) => vec(h + "attn.k_pre", j), "left"],
        [["angles j × inv_freq"], (j) => vec("rope_angle", j), "left"]] : []),
      [["k", el("sub", {}, "j"), rope ? " rotated" : "", rope ? "" : kvTag], (j) => vec(h + "attn.k", j), "left"],
      [["q", el("sub", {}, i), " · k", el("sub", {}, "j")], (j) => value(step[h + "attn.scores_raw"].value[i][j], {key: h + "attn.scores_raw", row: i, col: j})],
      [["a", el("sub", {}, "j"), ` = q·k / √${hd}`], (j) => value(step[h + "attn.scores"].value[i][j], {key: h + "attn.scores", row: i, col: j})],
      [["exp(a", el("sub", {}, "j"), " − max)"], (j, n) => value(e[n], {derived: "exp", row: i, col: j})],
      [["w", el("sub", {}, "j"), " = exp / Σ"], (j, n) => el("span", {class: "wcell"}, swatch(w[n]), value(w[n], {key: h + "attn.weights", row: i, col: j}))],
    ]);
    const mixTable = expandable([
      ["key j", keyChip],
      [["w", el("sub", {}, "j")], (j, n) => value(w[n], {key: h + "attn.weights", row: i, col: j})],
      [["v", el("sub", {}, "j"), kvTag], (j) => vec(h + "attn.v", j), "left"],
    ]);
    const later = causal && i < tokens.length - 1
      ? el("p", {class: "muted"}, `keys ${i + 1}..${tokens.length - 1} come after the query: masked (score −∞, weight 0), not listed.`) : null;
    // r_i written out: every term for up to 4 keys, else the 3 heaviest (in position order) and "…"
    const terms = keys.map((j, n) => [w[n], j]).sort((x, y) => y[0] - x[0]).slice(0, keys.length > 4 ? 3 : 4).sort((x, y) => x[1] - y[1]);
    const lnIn = pre ? `${h}ln_1` : inputKey;
    const mlpIn = pre ? `${h}ln_2` : `${h}ln_1`;
    const stats = (values) => {
      const mean = values.reduce((x, y) => x + y, 0) / values.length;
      const variance = values.reduce((x, y) => x + (y - mean) ** 2, 0) / values.length;
      return [value(mean, {derived: "mean", row: i}), value(Math.sqrt(variance), {derived: "std", row: i})];
    };
    const [mean1, std1] = rmsOf(mlpIn) ? [null, null] : stats(rowOf(`${h}resid_1`));
    // RMSNorm's rows: rms of the input, input / rms, and that times the gain (the norm's output)
    const rmsRows = (name, input) => [
      row(["rms of ", input, " = √(mean(x²) + ε)"], value(step[name + ".rms"].value[i][0], {key: name + ".rms", row: i, col: 0})),
      row([input, " / rms"], vec(name + ".scaled")),
      row("gain", vector(step[name + ".gain"].value, {key: name + ".gain"})),
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
          row([S("q", i), " before rotation = ln_1(", S("x", i), ") W", el("sub", {}, "Q")], vec(h + "attn.q_pre")),
          row(["angles ", i, " × inv_freq"], vec("rope_angle")),
          row([S("q", i), " rotated (RoPE)"], vec(h + "attn.q")),
          el("p", {class: "muted note"}, `RoPE: dimension d turns with d + ${hd / 2} by angle d mod ${hd / 2} of the position ` +
            `(q_d cos − q_{d+${hd / 2}} sin, q_{d+${hd / 2}} cos + q_d sin); each key's k turns by its own position (below).`),
        ] : row([S("q", i), " = ", pre ? ["ln_1(", S("x", i), ")"] : S("x", i), " W", el("sub", {}, "Q")], vec(h + "attn.q")),
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
          vec(h + "attn.mix"))),
      section(`4. head ${head}'s share of the output projection`,
        row([S("r", i), ` · c_proj[${head * hd}..${(head + 1) * hd - 1}]`], vec(h + "attn.head_out")),
        el("p", {class: "muted note"}, step[h + "attn.head_out"].note)),
      section("5. the output projection (all heads)",
        row([S("o", i), ` = [r of heads 0..${cfg.n_heads - 1}] · c_proj + b`], vec(h + "attn.out"))),
      section("6. the residual",
        row([S("x", i)], vec(inputKey)),
        row(["+ ", S("o", i)], vec(h + "attn.out")),
        row(["= resid_1"], vec(h + "resid_1"))),
      rmsOf(mlpIn) ? section(`7. RMSNorm ${pre ? "ln_2 (the MLP's input)" : "ln_1 of the residual"}`, rmsRows(mlpIn, "resid_1"))
        : section(`7. LayerNorm ${pre ? "ln_2 (the MLP's input)" : "ln_1 of the residual"}`,
          row("mean, std of resid_1", mean1, ",  ", std1),
          row(["(resid_1 − mean) / √(var + ε) · γ + β"], vec(mlpIn))),
      section(`8. the MLP (${cfg.activation.toUpperCase()}), back to d_model = ${cfg.d_model}`,
        swiglu ? [
          row(`pre-activation [gate | up] (${step[h + "mlp.pre"].shape[1]})`, vec(h + "mlp.pre")),
          row("gate", vec(h + "mlp.gate")),
          row("SiLU(gate) = gate · sigmoid(gate)", vec(h + "mlp.silu_gate")),
          row("up", vec(h + "mlp.up")),
          row("SiLU(gate) × up", vec(h + "mlp.act")),
        ] : [
          row(`pre-activation (${4 * cfg.d_model})`, vec(h + "mlp.pre")),
          row(`after ${cfg.activation.toUpperCase()}`, vec(h + "mlp.act")),
        ],
        row("c_proj (back to d_model)", vec(h + "mlp.out")),
        row(pre ? "resid_2 = resid_1 + MLP" : "resid_2 = ln_1 + MLP", vec(h + "resid_2")),
        pre ? null : row("ln_2 (the layer's output)", vec(h + "ln_2"))),
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
      // the head before the thumbnails: its forward pass pools every head, which the server then sends without another
      const att = atHand ? {tokens: held.tokens, weights: held.thumbnails[layer][head]} : await headAsked;
      const thumbs = held || await ask("/api/thumbnails", ofText);
      const doc = await docAsked;
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
      const hd = cfg.d_model / cfg.n_heads;
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
      root.append(el("div", {class: "att-top"}, overview(thumbs, layer, head, causal), main), arith);
    },
  });
})();
