// ablation.js: the heads and MLPs the page knocks out, and what that does to the next token.
// The set is the address's `ablate`: a SPEC as `tk predict-next --ablate` takes it (`L.H` block L's head H,
// `L.mlp` block L's MLP, comma-separated), each part zeroed. The switch (`toggleSwitch`) makes clicks on the
// Attention view's thumbnails and the Model view's MLP blocks knock parts out and back in, instead of opening
// them; `panel` draws /api/next?ablate=SPEC (what `tk predict-next --ablate SPEC --json` prints): the
// next-token bars after, each with its probability before, the KL divergence in nats, the tokens that moved most.
"use strict";
TK.ablation = (() => {
  const {el} = TK;
  const SHOW = 10;   // bars of the ablated distribution (next.js's SHOW: the same request)
  const MOVED = 5;   // tokens that moved most, shown
  let clicking = false;  // whether clicks on thumbnails and MLP blocks knock parts out (else they open them)

  // The parts of the address's SPEC, as written (the server says what is wrong with a bad one).
  function parts(state) { return (state.ablate || "").split(",").map((part) => part.trim()).filter(Boolean); }

  // Parts in the model's order: by layer, its heads by number, then its MLP (so one set is one address).
  function order(a, b) {
    const [la, ha] = a.split("."), [lb, hb] = b.split(".");
    if (la !== lb) return Number(la) - Number(lb);
    return (ha === "mlp") - (hb === "mlp") || Number(ha) - Number(hb);
  }

  const spec = (list) => [...new Set(list)].sort(order).join(",");
  const has = (state, part) => parts(state).includes(part);

  // The SPEC with `part` knocked out, or back in when it was.
  function toggled(state, part) {
    const now = parts(state);
    return spec(now.includes(part) ? now.filter((p) => p !== part) : [...now, part]);
  }

  // A KL divergence in nats: four decimals, or three significant digits below 0.01 (a barely trained model's).
  const nats = (x) => (x >= 0.01 || x === 0 ? TK.fmt(x, 4) : x.toExponential(2).replace("-", "−")) + " nats";

  const named = (part) => part.endsWith(".mlp") ? `block ${part.split(".")[0]}'s MLP`
    : `block ${part.split(".")[0]}'s head ${part.split(".")[1]}`;

  // The switch between clicks that open a part and clicks that knock it out; `where` says what it knocks out here.
  function toggleSwitch(where) {
    if (TK.FILE) return null;  // a `tk explain --html` file holds no ablated answers
    const box = el("input", {type: "checkbox", id: "ablate-switch", checked: clicking,
      onchange: (event) => { clicking = event.target.checked; TK.draw(); }});
    return el("label", {class: "ablate-switch", title: "knock parts out of the model and see the next token change"},
      box, ` click to knock out ${where}`);
  }

  // A row of the ablated distribution: the bar after, the probability before as a line over it.
  function row(entry) {
    const width = (p) => (100 * p).toFixed(2) + "%";
    return el("div", {class: "abl-row", role: "listitem", dataset: {id: entry.id, p: entry.p, before: entry.before},
      "aria-label": `${TK.visible(entry.token)}, id ${entry.id}, ${TK.pct(entry.before)} before, ${TK.pct(entry.p)} after`},
    el("span", {class: "bar-token"}, entry.token === "" ? "∅" : TK.visibleNodes(entry.token)),
    el("span", {class: "bar-track abl-track"},
      el("span", {class: "bar-fill", style: {width: width(entry.p)}}),
      el("span", {class: "abl-before", style: {left: width(entry.before)}, title: `before: ${TK.pct(entry.before)}`})),
    el("span", {class: "bar-p"}, TK.pct(entry.p)),
    el("span", {class: "abl-was"}, TK.pct(entry.before)));
  }

  function movedRow(entry) {
    const delta = entry.after - entry.before;
    return el("tr", {dataset: {id: entry.id, before: entry.before, after: entry.after}},
      el("td", {}, el("span", {class: "tok"}, entry.token === "" ? "∅" : TK.visibleNodes(entry.token))),
      el("td", {class: "num"}, TK.pct(entry.before)), el("td", {class: "num"}, "→ " + TK.pct(entry.after)),
      el("td", {class: "num " + (delta < 0 ? "down" : "up")}, (delta < 0 ? "−" : "+") + TK.pct(Math.abs(delta))));
  }

  // The chips of the parts knocked out, each a button that puts it back, and one that puts them all back.
  function chips(list) {
    return el("div", {class: "abl-parts", id: "abl-parts"}, el("b", {}, "Knocked out: "),
      list.map((part) => el("button", {type: "button", class: "abl-part", dataset: {part}, title: `put ${named(part)} back`,
        "aria-label": `put ${named(part)} back`, onclick: () => TK.go({ablate: spec(list.filter((p) => p !== part))}, true)},
      part, el("span", {"aria-hidden": "true"}, " ×"))),
      el("button", {type: "button", class: "more", id: "abl-clear", onclick: () => TK.go({ablate: ""}, true)}, "put all back"));
  }

  // The card of what the address's ablation does to the next token after the text; without one, null, or with
  // `empty` (what a click knocks out there) the card saying so, which keeps its place on the page.
  // `quote`: say the text (a view that does not show it: the Model view's).
  async function panel(state, empty = null, quote = false) {
    const list = parts(state);
    if (!list.length) {
      return empty && el("section", {class: "card abl-card", id: "abl-card", "aria-label": "ablation"},
        el("p", {class: "muted"}, `Nothing is knocked out. Click ${empty} to knock it out: the next token after the text, ` +
          "before and after, shows here."));
    }
    const card = el("section", {class: "card abl-card", id: "abl-card", "aria-label": "ablation"}, chips(list));
    if (state.text === "") {
      card.append(el("p", {class: "muted"}, "Type a text (in the Attention or Next token view): the next token after it shows here."));
      return card;
    }
    let doc;
    try {
      doc = await TK.api("/api/next", {text: state.text, top_k: SHOW, ablate: state.ablate, specials: state.specials});
    } catch (error) {
      card.append(el("p", {class: "error", id: "abl-error"}, error.message));
      return card;
    }
    const mode = doc.ablation.mode === "zero" ? "each zeroed" : "each replaced by its mean";
    const text = state.text.length > 60 ? state.text.slice(0, 59) + "…" : state.text;
    card.append(
      el("p", {class: "abl-kl"}, "The next token after ", quote ? el("span", {class: "abl-text", title: state.text}, `“${text}”`)
        : "the text", `, ${mode}: KL divergence (unablated ‖ ablated) `,
        el("b", {id: "abl-kl", class: "num", dataset: {kl: doc.kl}, title: String(doc.kl)}, nats(doc.kl))),
      el("div", {class: "abl-grid"},
        el("div", {}, el("h3", {}, "after (bars), before (lines)"),
          el("div", {class: "bars abl-bars", id: "abl-bars", role: "list"}, doc.top.map(row))),
        el("div", {}, el("h3", {}, "moved most"),
          el("table", {class: "abl-moved", id: "abl-moved"}, el("tbody", {}, doc.moved.slice(0, MOVED).map(movedRow))))));
    return card;
  }

  return {parts, spec, has, toggled, named, panel, toggleSwitch, get clicking() { return clicking; }};
})();
