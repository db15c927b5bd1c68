// explain.js: TK.explain, the widgets the attention view (attention.js) and the worked examples (examples.js)
// draw with: numbers with their hooks, vectors, an explain step's matrix, heatmaps and thumbnails, the colour
// scale, and the attention maps as the server packs them (unpackWeights: their float32 bytes, exact).
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

  // What a worked example printed beside the exact row: its verdict (transformer/explanation.py's Printed) as a badge.
  const VERDICTS = {agrees: "✓ agrees", rounding: "≈ rounded differently", differs: "≠ differs"};
  function badge(p) {
    const verdict = p.verdict in VERDICTS ? p.verdict : p.agrees ? "agrees" : "differs";
    return el("span", {class: "badge " + verdict, dataset: {agrees: p.agrees ? "1" : "0", verdict}}, VERDICTS[verdict]);
  }

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
          tr.append(el("td", {class: "printed"}, p ? [el("span", {class: "mono"}, p.text), " ", badge(p)] : ""));
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


  TK.explain = {el, fmt, colour, ink, rgb, full, value, vector, matrix, heatmap, thumb, legend, tokenChip, ask, goKeep,
    unpackWeights};
})();
