// training.js: the run's loss curves (train and validation against step, the unigram baseline as a line; or
// the validation loss in bits per byte), its learning rate and tokens/s, drawn as inline SVG, and what tk eval
// recorded in the run; while the run is not finished, asked again every 2 s.
"use strict";
(() => {
  const {el, svg} = TK;
  const POLL_MS = 2000;

  // About `count` round tick values between lo and hi.
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  function logTicks(lo, hi) {
    const out = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      for (const m of [1, 2, 5]) { const v = m * Math.pow(10, e); if (v >= lo * 0.999 && v <= hi * 1.001) out.push(+v.toPrecision(6)); }
    }
    return out;
  }

  function short(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return +(v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return +(v / 1e3).toPrecision(3) + "k";
    if (a !== 0 && a < 1e-2) return v.toExponential(0).replace("e-", "e−");
    return String(+v.toPrecision(4));
  }

  // A line chart: series [{name, cls, points: [[x, y, extra]...], dots: "hidden"|"shown"|null, kind}],
  // optional baseline {y, label}; returns a .chart-wrap holding the SVG and its hover tip.
  function chart({width, height, series, baseline, log, yLabel, xLabel, id, format, xMax}) {
    const m = {l: 56, r: 26, t: 12, b: 38};
    const all = series.flatMap((s) => s.points);
    const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]).filter((y) => isFinite(y) && (!log || y > 0));
    if (baseline && isFinite(baseline.y)) ys.push(baseline.y);
    const x0 = Math.min(0, ...xs), x1 = Math.max(1, xMax || 0, ...xs);
    let y0 = log ? Math.min(...ys) / 1.15 : Math.min(0, ...ys), y1 = log ? Math.max(...ys) * 1.15 : Math.max(...ys) * 1.06 || 1;
    if (!ys.length) { y0 = log ? 0.1 : 0; y1 = 1; }
    const fy = log ? (v) => Math.log10(v) : (v) => v;
    const X = (v) => m.l + (width - m.l - m.r) * (v - x0) / (x1 - x0);
    const Y = (v) => m.t + (height - m.t - m.b) * (1 - (fy(v) - fy(y0)) / (fy(y1) - fy(y0)));
    const root = svg("svg", {class: "chart", id, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": `${yLabel} against ${xLabel}`});
    const yt = log ? logTicks(y0, y1) : ticks(y0, y1, 5);
    for (const v of yt) {
      root.append(svg("line", {class: "grid", x1: m.l, x2: width - m.r, y1: Y(v), y2: Y(v)}),
        svg("text", {x: m.l - 8, y: Y(v) + 4, "text-anchor": "end"}, (format || short)(v)));
    }
    for (const v of ticks(x0, x1, Math.max(3, Math.round(width / 110)))) {
      root.append(svg("line", {class: "grid", x1: X(v), x2: X(v), y1: m.t, y2: height - m.b}),
        svg("text", {x: X(v), y: height - m.b + 16, "text-anchor": "middle"}, short(v)));
    }
    root.append(svg("line", {class: "axis", x1: m.l, x2: width - m.r, y1: height - m.b, y2: height - m.b}),
      svg("text", {x: (m.l + width - m.r) / 2, y: height - 4, "text-anchor": "middle"}, xLabel),
      svg("text", {x: 12, y: m.t + (height - m.t - m.b) / 2, "text-anchor": "middle",
        transform: `rotate(-90 12 ${m.t + (height - m.t - m.b) / 2})`}, yLabel));
    if (baseline && isFinite(baseline.y)) {
      root.append(svg("line", {class: "baseline", id: "baseline", x1: m.l, x2: width - m.r, y1: Y(baseline.y), y2: Y(baseline.y),
        dataset: {loss: baseline.y}}),
      svg("text", {x: width - m.r - 4, y: Y(baseline.y) - 6, "text-anchor": "end"}, baseline.label));
    }
    for (const s of series) {
      const pts = s.points.filter((p) => isFinite(p[1]) && (!log || p[1] > 0));
      root.append(svg("polyline", {class: s.cls, points: pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ")}));
      if (s.dots) {
        const g = svg("g", {class: "points-" + s.kind});
        for (const p of pts) {
          g.append(svg("circle", {class: "curve-point", cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: s.dots === "shown" ? 3.2 : 1.5,
            dataset: {step: p[0], loss: p[1], kind: s.kind}}));
        }
        root.append(g);
      }
    }
    // hover: a guide at the nearest step, with each series' value there
    const guide = svg("line", {class: "guide", y1: m.t, y2: height - m.b, visibility: "hidden"});
    const dots = series.map(() => svg("circle", {class: "hover-dot", r: 3.5, visibility: "hidden"}));
    root.append(guide, ...dots);
    const wrap = el("div", {class: "chart-wrap"}, root);
    const tip = el("div", {class: "tip", hidden: true});
    wrap.append(tip);
    const nearest = (points, x) => {
      let lo = 0, hi = points.length - 1;
      if (hi < 0) return null;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (points[mid][0] < x) lo = mid + 1; else hi = mid; }
      if (lo > 0 && Math.abs(points[lo - 1][0] - x) <= Math.abs(points[lo][0] - x)) lo--;
      return points[lo];
    };
    root.addEventListener("mousemove", (event) => {
      const box = root.getBoundingClientRect();
      const sx = (event.clientX - box.left) * width / box.width;
      if (sx < m.l || sx > width - m.r) { hide(); return; }
      const step = x0 + (sx - m.l) / (width - m.l - m.r) * (x1 - x0);
      const main = nearest(series[0].points, step);
      if (!main) return;
      guide.setAttribute("x1", X(main[0])); guide.setAttribute("x2", X(main[0])); guide.setAttribute("visibility", "visible");
      const lines = [el("div", {}, el("b", {}, "step " + TK.int(main[0])))];
      series.forEach((s, i) => {
        const p = nearest(s.points, main[0]);
        const close = p && (s === series[0] || Math.abs(p[0] - main[0]) <= (x1 - x0) / 40);
        dots[i].setAttribute("visibility", close && isFinite(p[1]) ? "visible" : "hidden");
        if (!close) return;
        dots[i].setAttribute("cx", X(p[0])); dots[i].setAttribute("cy", Y(p[1]));
        dots[i].style.fill = s.kind === "val" ? "var(--val)" : "";
        lines.push(el("div", {}, s.name + (p[0] !== main[0] ? ` (step ${TK.int(p[0])})` : "") + " ", el("span", {class: "num"}, (s.tip || short)(p[1]))));
      });
      tip.replaceChildren(...lines);
      tip.hidden = false;
      const left = X(main[0]) / width * box.width;
      tip.style.left = (left > box.width * 0.65 ? left - tip.offsetWidth - 12 : left + 12) + "px";
      tip.style.top = "8px";
    });
    const hide = () => { tip.hidden = true; guide.setAttribute("visibility", "hidden"); dots.forEach((d) => d.setAttribute("visibility", "hidden")); };
    root.addEventListener("mouseleave", hide);
    return wrap;
  }

  function stat(value, label, extra) {
    return el("div", {class: "stat"}, el("span", {class: "stat-value"}, value), el("span", {class: "stat-label"}, label), extra);
  }

  // What `tk eval -m RUN_DIR FILE...` recorded in the run's eval.json: one row per corpus.
  function evaluations(run) {
    const head = el("h3", {}, "Evaluations on held-out text (tk eval)");
    if (run.evaluations_error) return el("section", {id: "evaluations"}, head, el("p", {class: "muted"}, run.evaluations_error));
    const rows = run.evaluations || [];
    if (!rows.length) {
      return el("section", {id: "evaluations"}, head, el("p", {class: "muted"},
        "None recorded: tk eval -m RUN_DIR FILE... measures the run's model on text it has not seen and keeps the result here."));
    }
    const num = (v, digits) => v == null ? "—" : v.toFixed(digits);
    const cols = [["corpus"], ["model step", "num"], ["tokens", "num"], ["bytes", "num"], ["loss (nats / token)", "num"],
      ["bits per byte", "num"], ["perplexity", "num"], ["stride / context", "num"], ["when (UTC)"]];
    const body = rows.map((r) => el("tr", {dataset: {corpus: r.corpus, step: r.step, loss: r.loss, bitsPerByte: r.bits_per_byte}},
      el("td", {class: "eval-corpus"}, r.corpus), el("td", {class: "num"}, TK.int(r.step)), el("td", {class: "num"}, TK.int(r.tokens)),
      el("td", {class: "num"}, TK.int(r.bytes)), el("td", {class: "num"}, num(r.loss, 4)), el("td", {class: "num"}, num(r.bits_per_byte, 4)),
      el("td", {class: "num"}, num(r.perplexity, 3)), el("td", {class: "num"}, `${TK.int(r.stride)} / ${TK.int(r.context)}`),
      el("td", {}, r.utc ? r.utc.replace("T", " ").replace("Z", "") : "—")));
    return el("section", {id: "evaluations"}, head, el("div", {class: "table-wrap"}, el("table", {id: "evaluations-table"},
      el("thead", {}, el("tr", {}, cols.map(([title, cls]) => el("th", {scope: "col", class: cls}, title)))), el("tbody", {}, body))));
  }

  function content(run, log, unit) {
    // the charts' own units are the page's pixels, so their text stays the page's size
    const full = Math.max(300, Math.min(1400, document.getElementById("view").clientWidth - 40));
    const half = full < 860 ? full : Math.floor((full - 20) / 2);  // .grid2 is one column below 900px
    const train = run.train || [], val = run.val || [];
    const last = train[train.length - 1];
    const total = run.config && run.config.steps;
    // the evaluation at step 0 (a run started --init-from) is the base model's: a point of the curve, not a best
    const trained = val.filter((v) => v.step > 0);
    const best = (key) => { const xs = trained.map((v) => v[key]).filter((x) => x != null); return xs.length ? Math.min(...xs) : null; };
    const bestVal = best("val_loss"), bestBpb = best("val_bits_per_byte");
    const lastBpb = val.length ? val[val.length - 1].val_bits_per_byte : null;
    const perByte = unit === "bpb";
    const recent = train.slice(-50).map((t) => t.tokens_per_s).filter((v) => v != null).sort((a, b) => a - b);
    const tps = recent.length ? recent[recent.length >> 1] : null;
    const lossFmt = (v) => v.toFixed(4);
    const progress = total ? el("div", {class: "progress", title: `${run.last_step} of ${total} steps`},
      el("div", {style: {width: Math.min(100, 100 * run.last_step / total).toFixed(1) + "%"}})) : null;
    const stats = el("div", {class: "stats", id: "training-stats", dataset: {lastStep: run.last_step, finished: run.finished ? "1" : "0"}},
      stat(TK.int(run.last_step) + (total ? ` / ${TK.int(total)}` : ""), "steps", progress),
      stat(last ? lossFmt(last.loss) : "—", "train loss (last step)"),
      stat(val.length ? lossFmt(val[val.length - 1].val_loss) : "—", `validation loss, nats / token${bestVal != null ? ` (best ${lossFmt(bestVal)})` : ""}`),
      stat(lastBpb != null ? lossFmt(lastBpb) : "—", `validation bits per byte${bestBpb != null ? ` (best ${lossFmt(bestBpb)})` : ""}`),
      stat(run.unigram_baseline != null ? lossFmt(run.unigram_baseline) : "—", "unigram baseline"),
      stat(tps != null ? TK.int(tps) : "—", "tokens / s"));
    if (!train.length) {
      return [stats, el("p", {class: "muted"}, run.finished ? "This run logged no training step." : "The run has not logged a step yet; this page asks again every 2 s."),
        evaluations(run)];
    }
    // bits per byte: the validation loss alone (a train step's bytes are not counted); per token: both, and the baseline
    const lossSeries = perByte ? [
      {name: "validation", cls: "line-val", kind: "val", dots: "shown", tip: lossFmt,
        points: val.filter((v) => v.val_bits_per_byte != null).map((v) => [v.step, v.val_bits_per_byte])},
    ] : [
      {name: "train", cls: "line-train", kind: "train", dots: "hidden", tip: lossFmt, points: train.map((t) => [t.step, t.loss])},
      {name: "validation", cls: "line-val", kind: "val", dots: "shown", tip: lossFmt, points: val.map((v) => [v.step, v.val_loss])},
    ];
    const lossChart = chart({width: full, height: 340, series: lossSeries, log, id: "loss-chart", xLabel: "step", xMax: total,
      yLabel: (perByte ? "validation loss (bits / byte)" : "loss (nats / token)") + (log ? ", log scale" : ""),
      format: (v) => String(+v.toPrecision(3)),
      baseline: !perByte && run.unigram_baseline != null ? {y: run.unigram_baseline, label: `unigram baseline ${run.unigram_baseline.toFixed(2)}`} : null});
    lossChart.dataset.unit = unit;
    const base = val.length && val[0].step === 0 ? el("span", {}, "step 0: the model the run started from (--init-from)") : null;
    const legend = perByte ? el("div", {class: "legend"},
      el("span", {}, el("span", {class: "key val"}), "validation bits per byte (each evaluation, ○): its loss in bits over its targets' UTF-8 bytes"),
      el("span", {}, "train loss: per token only (a step's bytes are not counted)"), base)
      : el("div", {class: "legend"},
        el("span", {}, el("span", {class: "key train"}), "train loss (each step)"),
        el("span", {}, el("span", {class: "key val"}), "validation loss (each evaluation, ○)"),
        run.unigram_baseline != null ? el("span", {}, el("span", {class: "key base"}),
          "unigram baseline: the loss of guessing by token frequency alone") : null, base);
    const lr = train.filter((t) => t.lr != null).map((t) => [t.step, t.lr]);
    const speed = train.filter((t) => t.tokens_per_s != null).map((t) => [t.step, t.tokens_per_s]);
    const small = el("div", {class: "grid2"},
      el("section", {}, el("h3", {}, "Learning rate"),
        lr.length ? chart({width: half, height: 210, id: "lr-chart", xMax: total, xLabel: "step", yLabel: "learning rate",
          series: [{name: "lr", cls: "line-lr", kind: "lr", points: lr, tip: (v) => v.toExponential(2)}]}) : el("p", {class: "muted"}, "not logged")),
      el("section", {}, el("h3", {}, "Tokens per second"),
        speed.length ? chart({width: half, height: 210, id: "speed-chart", xMax: total, xLabel: "step", yLabel: "tokens / s",
          series: [{name: "tokens/s", cls: "line-tps", kind: "tps", points: speed, tip: (v) => TK.int(v)}]}) : el("p", {class: "muted"}, "not logged")));
    return [stats, legend, lossChart, small, evaluations(run)];
  }

  TK.register("training", {
    title: "Training",
    needs: ["run"],
    noText: true,
    async render(target, state, info, ctx) {
      let run = await TK.api("/api/training");
      let log = false, unit = "nats";
      const status = el("span", {class: "pill", id: "training-status"});
      const logBox = el("input", {type: "checkbox", id: "log-scale"});
      const unitBox = el("select", {id: "loss-unit"}, el("option", {value: "nats"}, "nats per token"),
        el("option", {value: "bpb"}, "bits per byte"));
      const body = el("div", {id: "training-body"});
      const paint = () => {
        status.className = "pill" + (run.finished || TK.FILE ? "" : " live");
        status.textContent = run.finished ? "finished" : TK.FILE ? "as the run was when this file was written"
          : "live: following the run every 2 s";
        // a log written before tk logged bits per byte has none to show
        const none = !(run.val || []).some((v) => v.val_bits_per_byte != null);
        unitBox.disabled = none;
        unitBox.title = none ? "this run's log has no bits per byte (yet, or written before tk logged them)" : "";
        if (none) unit = unitBox.value = "nats";
        body.replaceChildren(...content(run, log, unit));
      };
      logBox.addEventListener("change", () => { log = logBox.checked; paint(); });
      unitBox.addEventListener("change", () => { unit = unitBox.value; paint(); });
      target.append(el("div", {class: "controls"}, el("h2", {}, run.run || info.run), status,
        el("span", {class: "field"}, el("label", {for: "loss-unit"}, "loss in"), unitBox),
        el("span", {class: "field"}, logBox, el("label", {for: "log-scale"}, "log scale"))), body);
      paint();
      if (run.finished || TK.FILE) return;  // a `tk explain --html` file holds the run as it was
      let busy = false;
      const timer = setInterval(async () => {
        if (busy || document.hidden) return;
        busy = true;
        try {
          const fresh = await TK.api("/api/training", {}, {fresh: true});
          if (!ctx.live()) return;
          const changed = fresh.last_step !== run.last_step || fresh.finished !== run.finished ||
            (fresh.val || []).length !== (run.val || []).length || (fresh.train || []).length !== (run.train || []).length ||
            JSON.stringify(fresh.evaluations) !== JSON.stringify(run.evaluations) || fresh.evaluations_error !== run.evaluations_error;
          run = fresh;
          if (changed) paint();
          if (run.finished) clearInterval(timer);
        } catch (error) {
          status.className = "pill";
          status.textContent = "the server did not answer: " + error.message;
        } finally { busy = false; }
      }, POLL_MS);
      ctx.onLeave(() => clearInterval(timer));
    },
  });
})();
