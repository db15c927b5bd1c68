// bpe.js: the BPE replay: the text going from bytes to tokens merge by merge (step buttons, a slider,
// the `step` address parameter), and the training's first merges with their counts. With a second tokenizer
// (`tk serve -c`), a switch replays either one (the `which` address parameter: "" the main one, "compare").
"use strict";
(() => {
  const {el} = TK;
  const CHECKPOINT = 64;  // keep every 64th sequence, so moving back replays at most 63 steps

  // A token's text as a small mono label (whitespace visible), from the answer's pieces.
  function label(pieces, id) {
    const piece = pieces[id];
    if (!piece) return el("span", {class: "tok muted", title: "id " + id}, "#" + id);
    return el("span", {class: "tok" + (piece.partial ? " partial" : ""), title: `id ${id} · bytes ${TK.hex(piece.bytes)}`},
      piece.text === "" ? "∅" : TK.visibleNodes(piece.text));
  }

  // The stepper's icons, drawn (a font may lack ⏮ ⏭).
  const ICONS = {first: "M3 3h2v10H3zM13 3 6 8l7 5z", prev: "M11 3 4 8l7 5z", next: "M5 3l7 5-7 5z", last: "M3 3l7 5-7 5zM11 3h2v10h-2z"};
  const icon = (name) => TK.svg("svg", {viewBox: "0 0 16 16", width: 12, height: 12, "aria-hidden": "true", class: "icon"},
    TK.svg("path", {d: ICONS[name], fill: "currentColor"}));

  function pairLabel(pieces, pair) { return el("span", {class: "pair"}, label(pieces, pair[0]), " + ", label(pieces, pair[1])); }

  // The sequence after `k` steps, as items {id, start, end, chunk}; checkpoints make any k cheap.
  function replayer(answer) {
    const size = (id) => (answer.pieces[id] ? answer.pieces[id].bytes.length / 2 : 1);
    const chunkOf = new Array(answer.initial.length).fill(null);
    answer.chunks.forEach(([s, e], c) => { for (let i = s; i < e; i++) chunkOf[i] = c; });
    let at = 0;
    const first = answer.initial.map((id, i) => {
      const item = {id, start: at, end: at + size(id), chunk: chunkOf[i] == null ? "s" + i : chunkOf[i]};
      at = item.end;
      return item;
    });
    const saved = new Map([[0, first]]);
    function apply(seq, step, k) {
      const out = [];
      let p = 0;
      for (let i = 0; i < seq.length; i++) {
        if (p < step.at.length && step.at[p] === i) {
          const a = seq[i], b = seq[i + 1];
          if (!b || a.id !== step.pair[0] || b.id !== step.pair[1] || a.chunk !== b.chunk) {
            throw new Error(`the replay's step ${k + 1} does not fit the sequence (position ${i})`);
          }
          out.push({id: step.new_id, start: a.start, end: b.end, chunk: a.chunk, made: true});
          p++;
          i++;
        } else out.push(seq[i].made ? {...seq[i], made: false} : seq[i]);
      }
      return out;
    }
    let lastK = 0, lastSeq = first;
    return (k) => {
      if (k === lastK) return lastSeq;
      if (k === lastK + 1) {  // one step on, the common case (play, the arrow keys)
        lastSeq = apply(lastSeq, answer.steps[lastK], lastK);
        lastK = k;
        if (k % CHECKPOINT === 0) saved.set(k, lastSeq);
        return lastSeq;
      }
      let from = Math.floor(k / CHECKPOINT) * CHECKPOINT;
      while (!saved.has(from)) from -= CHECKPOINT;
      let seq = saved.get(from);
      for (let s = from; s < k; s++) {
        seq = apply(seq, answer.steps[s], s);
        if ((s + 1) % CHECKPOINT === 0) saved.set(s + 1, seq);
      }
      lastK = k;
      lastSeq = seq;
      return seq;
    };
  }

  // The switch between the two tokenizers of `tk serve -c`: the replay starts again at the last step.
  function chooser(info, which) {
    const select = el("select", {id: "bpe-which", onchange: (event) => TK.go({which: event.target.value, step: ""})},
      el("option", {value: ""}, info.tokenizer.name), el("option", {value: "compare"}, info.compare.name));
    select.value = which;
    return el("div", {class: "controls"}, el("label", {for: "bpe-which"}, "Replay the tokenizer "), select);
  }

  TK.register("bpe", {
    title: "BPE replay",
    needs: ["tokenizer"],
    async render(target, state, info, ctx) {
      if (state.text === "") { target.append(el("p", {class: "muted"}, "Type some text above to watch it go from bytes to tokens.")); return; }
      // with -c, either tokenizer can be replayed (`which`, kept in the address); without, the main one
      const which = info.compare && state.which === "compare" ? "compare" : "";
      const answer = await TK.api("/api/bpe", {text: state.text, specials: state.specials, which});
      const {steps, pieces} = answer;
      const at = replayer(answer);
      // colour each piece by the final token it ends up in, so colours stay put while pieces merge
      const finalAt = [];
      {
        let pos = 0;
        answer.ids.forEach((id, t) => { const n = pieces[id] ? pieces[id].bytes.length / 2 : 1; for (let b = 0; b < n; b++) finalAt[pos + b] = t; pos += n; });
      }
      const last = steps.length;
      let k = state.step === "" ? last : Math.max(0, Math.min(last, parseInt(state.step, 10) || 0));

      const slider = el("input", {type: "range", id: "bpe-slider", min: 0, max: last, value: k, step: 1,
        "aria-label": "merge step (0 = bytes)"});
      const count = el("span", {class: "step-count", id: "bpe-count"});
      const button = (id, name, title, to) => el("button", {type: "button", id, title, "aria-label": title,
        onclick: () => { stop(); show(to()); }}, icon(name));
      const first = button("bpe-first", "first", "to the bytes (step 0)", () => 0);
      const prev = button("bpe-prev", "prev", "one merge back (←)", () => k - 1);
      const next = button("bpe-next", "next", "one merge on (→)", () => k + 1);
      const end = button("bpe-last", "last", "to the tokens (the last step)", () => last);
      const play = el("button", {type: "button", id: "bpe-play", title: "replay the merges"}, "Play");
      const caption = el("div", {class: "step-caption", id: "bpe-step", "aria-live": "polite"});
      const seqBox = el("div", {class: "bpe-seq chips", id: "bpe-seq"});
      const rows = steps.map((step, s) => el("tr", {class: "pick", dataset: {step: s + 1, rank: step.rank},
        onclick: () => { stop(); show(s + 1); }},
      el("td", {class: "num"}, s + 1), el("td", {class: "num"}, step.rank), el("td", {}, pairLabel(pieces, step.pair)),
      el("td", {class: "num"}, step.new_id), el("td", {}, label(pieces, step.new_id)), el("td", {class: "num"}, step.at.length)));
      const list = el("div", {class: "scroll", id: "bpe-steps"}, el("table", {},
        el("thead", {}, el("tr", {}, el("th", {class: "num"}, "step"), el("th", {class: "num"}, "rank"), el("th", {}, "pair"),
          el("th", {class: "num"}, "new id"), el("th", {}, "token"), el("th", {class: "num"}, "places"))),
        el("tbody", {}, rows)));

      let timer = null;
      function stop() { clearInterval(timer); timer = null; play.textContent = "Play"; }
      play.addEventListener("click", () => {
        if (timer) return stop();
        if (k >= last) show(0);
        play.textContent = "Pause";
        timer = setInterval(() => { if (k >= last) stop(); else show(k + 1); }, Math.max(120, Math.min(600, 12000 / Math.max(1, last))));
      });
      ctx.onLeave(stop);

      let frame = 0;
      function show(to, remember = true) {
        k = Math.max(0, Math.min(last, to));
        slider.value = k;
        if (remember) TK.remember({step: k === last ? "" : String(k)});
        cancelAnimationFrame(frame);
        frame = requestAnimationFrame(paint);
        if (!target.isConnected) paint();  // the first paint, before the view is in the page
      }
      const pieceOf = (id) => pieces[id] || {bytes: "", text: "#" + id, partial: false};
      const chipOf = (item, marks) => {
        const piece = pieceOf(item.id);
        return TK.chip({id: item.id, text: piece.text, bytes: piece.bytes, start: item.start, end: item.end,
          partial: piece.partial}, finalAt[item.start] || 0, {class: marks || null});
      };
      let shown = -1;  // the step the chips show
      // One step on: only the merged pairs change (thousands of chips take long to lay out again).
      function paintStep(seq) {
        const step = steps[k - 1];
        const chips = [...seqBox.querySelectorAll(".chip")];
        if (chips.length !== seq.length + step.at.length) return false;
        if (step.at.some((i) => /\n$/.test(pieceOf(chips[i].dataset.id | 0).text) || /\n$/.test(pieceOf(chips[i + 1].dataset.id | 0).text))) return false;
        for (const chip of seqBox.querySelectorAll(".merged, .next-pair")) chip.classList.remove("merged", "next-pair");
        step.at.forEach((i, j) => {
          chips[i].replaceWith(chipOf(seq[i - j], "merged"));
          chips[i + 1].remove();
        });
        return true;
      }
      function paint() {
        const seq = at(k);
        const upcoming = k < last ? new Set(steps[k].at.flatMap((i) => [i, i + 1])) : new Set();
        if (k === shown) {
          // the chips show this step already (the first paint, then its frame)
        } else if (shown >= 0 && k === shown + 1 && paintStep(seq)) {
          if (upcoming.size) {
            const chips = seqBox.querySelectorAll(".chip");
            for (const i of upcoming) chips[i].classList.add("next-pair");
          }
        } else {
          const groups = [];
          let group = null;
          seq.forEach((item, i) => {
            if (!group || group.chunk !== item.chunk) { group = {chunk: item.chunk, box: el("span", {class: "chunk"})}; groups.push(group); }
            group.box.append(chipOf(item, [item.made && k > 0 ? "merged" : "", upcoming.has(i) ? "next-pair" : ""].join(" ").trim()));
            if (pieceOf(item.id).text.endsWith("\n")) { groups.push({chunk: null, box: el("br")}); group = null; }
          });
          seqBox.replaceChildren(...groups.map((g) => g.box));
        }
        shown = k;
        seqBox.dataset.step = k;
        seqBox.dataset.tokens = seq.length;
        count.textContent = `step ${k} / ${last}`;
        first.disabled = prev.disabled = k === 0;
        next.disabled = end.disabled = k === last;
        if (k === 0) {
          caption.replaceChildren(el("b", {}, "Step 0: the bytes. "),
            `${TK.int(answer.initial.length)} bytes, one token each, in ${TK.int(answer.chunks.length)} pre-token chunks ` +
            "(the tokenizer's pattern cuts the text first; a merge never crosses a chunk's edge).",
            last ? el("span", {class: "muted"}, " Next: ", pairLabel(pieces, steps[0].pair), ` (rank ${steps[0].rank}).`) : "");  // not null: replaceChildren would write "null"
        } else {
          const step = steps[k - 1];
          caption.replaceChildren(el("b", {}, `Step ${k}: merge rank ${step.rank}. `),
            pairLabel(pieces, step.pair), " → ", label(pieces, step.new_id), ` new id ${step.new_id}, in ${step.at.length} ` +
            `${step.at.length === 1 ? "place" : "places"}; ${TK.int(seq.length)} tokens now.`,
            k < last ? el("span", {class: "muted"}, " Next: ", pairLabel(pieces, steps[k].pair), ` (rank ${steps[k].rank}).`)
              : el("span", {class: "muted"}, " No pair left has a merge: these are the tokens."));
        }
        caption.dataset.step = k;
        if (k > 0) { caption.dataset.rank = steps[k - 1].rank; caption.dataset.newId = steps[k - 1].new_id; }
        else { delete caption.dataset.rank; delete caption.dataset.newId; }
        for (const row of rows) row.classList.toggle("current", +row.dataset.step === k);
        const row = rows[k - 1];
        if (row && list.isConnected) {
          const top = row.offsetTop - list.clientHeight / 2;
          list.scrollTop = Math.max(0, top);
        }
      }
      slider.addEventListener("input", () => { stop(); show(+slider.value); });
      const keys = (event) => {
        const tag = (document.activeElement && document.activeElement.tagName) || "";
        if (["INPUT", "TEXTAREA", "SELECT"].includes(tag) || event.altKey || event.ctrlKey || event.metaKey) return;
        if (event.key === "ArrowRight") { stop(); show(k + 1); event.preventDefault(); }
        if (event.key === "ArrowLeft") { stop(); show(k - 1); event.preventDefault(); }
      };
      document.addEventListener("keydown", keys);
      ctx.onLeave(() => document.removeEventListener("keydown", keys));

      const bytesN = answer.initial.length, tokensN = answer.ids.length;
      if (info.compare) target.append(chooser(info, which));
      target.append(
        el("p", {class: "lead"}, "BPE starts from the text's bytes and merges the pair with the lowest rank " +
          "(the pair learned first) wherever it occurs, again and again, until no pair left was learned. " +
          `Here ${TK.int(bytesN)} bytes become ${TK.int(tokensN)} tokens in ${TK.int(last)} merges. ` +
          "Colours follow the final tokens; ← → step through."),
        el("div", {class: "stepper"}, first, prev, next, end, play, slider, count),
        caption, seqBox);

      const merges = answer.first_merges || [];
      const most = Math.max(1, ...merges.map((m) => m.count || 0));
      const trained = el("div", {class: "scroll", id: "bpe-first-merges"}, el("table", {},
        el("thead", {}, el("tr", {}, el("th", {class: "num"}, "rank"), el("th", {}, "pair"), el("th", {class: "num"}, "new id"),
          el("th", {}, "token"), el("th", {}, "count"))),
        el("tbody", {}, merges.map((m) => el("tr", {dataset: {rank: m.rank, count: m.count == null ? "" : m.count}},
          el("td", {class: "num"}, m.rank), el("td", {}, pairLabel(pieces, m.pair)), el("td", {class: "num"}, m.new_id),
          el("td", {}, el("span", {class: "tok"}, TK.visibleNodes(m.text))),
          el("td", {class: "num", style: {textAlign: "left"}}, m.count == null ? el("span", {class: "muted"}, "—") : [
            el("span", {class: "countbar", style: {width: (60 * m.count / most).toFixed(1) + "px"}}), TK.int(m.count)]))))));
      const unrecorded = merges.length && merges.every((m) => m.count == null);
      target.append(el("div", {class: "columns"},
        el("section", {}, el("h3", {}, "This text's merges"), steps.length ? list : el("p", {class: "muted"}, "No merge applies: every token is a byte.")),
        el("section", {}, el("h3", {}, `How the tokenizer was trained: its first ${merges.length} merges`),
          el("p", {class: "muted small"}, unrecorded ? "This tokenizer did not record how often each pair occurred (an imported one, perhaps)."
            : "Training counted every adjacent pair in the corpus and merged the most frequent, then counted again."),
          trained)));
      show(k, false);
      ctx.onLeave(() => cancelAnimationFrame(frame));
    },
  });
})();
