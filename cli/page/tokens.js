// tokens.js: the text cut into tokens, as chips with their ids and bytes; with a --compare tokenizer,
// both side by side with the spans they cut differently marked.
"use strict";
(() => {
  const {el} = TK;

  // The chips of one tokenization, newlines kept as line breaks so the text keeps its shape.
  function chips(tokens, differ) {
    const box = el("div", {class: "chips"});
    let d = 0;
    tokens.forEach((token, i) => {
      while (d < differ.length && differ[d][1] <= token.start) d++;
      const cut = d < differ.length && differ[d][0] < token.end && token.start < differ[d][1];
      box.append(TK.chip(token, i, {class: cut ? "differ" : null}));
      if (token.text.endsWith("\n")) box.append(el("br"));
    });
    if (!tokens.length) box.append(el("span", {class: "muted"}, "no tokens: the text is empty"));
    return box;
  }

  function stat(value, label, title) {
    return el("div", {class: "stat", title}, el("span", {class: "stat-value"}, value), el("span", {class: "stat-label"}, label));
  }

  // One tokenizer's panel: its name, the counts, the chips and the ids with a copy button.
  function panel(answer, about, differ, copyId, role) {
    const chars = [...TK.readState().text].length;
    const head = el("div", {class: "panel-head"},
      el("h2", {}, about ? about.name : answer.tokenizer),
      about ? el("span", {class: "muted mono small"}, `vocab ${TK.int(about.vocab_size)} · ${about.pattern} pattern`) : null);
    const stats = el("div", {class: "stats"},
      stat(TK.int(answer.n_tokens), "tokens"),
      stat(TK.int(answer.n_bytes), "bytes", "the text's UTF-8 bytes"),
      stat(answer.n_tokens ? answer.bytes_per_token.toFixed(2) : "—", "bytes / token", "higher: fewer tokens for the same text"),
      stat(TK.int(chars), "characters"));
    const ids = el("div", {class: "ids-row"},
      el("code", {class: "ids", id: copyId === "copy-ids" ? "ids" : "ids-" + role}, "[" + answer.ids.join(", ") + "]"),
      TK.copyButton({id: copyId, title: "copy the ids as a list"}, "Copy ids", () => "[" + answer.ids.join(", ") + "]"));
    return el("section", {class: "panel", dataset: {role}}, head, stats, chips(answer.tokens, differ), ids);
  }

  // The details of the chip under the pointer (or the last one clicked / focused).
  function detail() {
    return el("div", {id: "chip-detail", class: "chip-detail muted", "aria-live": "polite"},
      "Point at a token to see its id and bytes. Whitespace shows as · (space) ↵ (newline) → (tab); ",
      el("span", {class: "chip-sample partial"}, "\\xNN"), " marks bytes that are part of a character.");
  }

  function describe(chip) {
    const token = chip.querySelector(".chip-text").textContent;
    return [el("span", {class: "mono"}, token), "  ", el("b", {}, "id " + chip.dataset.id), "  bytes ",
      el("span", {class: "mono"}, TK.hex(chip.dataset.bytes)), `  at bytes ${chip.dataset.start}–${chip.dataset.end}`,
      chip.classList.contains("partial") ? "  (part of a character)" : "",
      chip.classList.contains("differ") ? "  (the other tokenizer cuts these bytes differently)" : ""];
  }

  // Pointing at a chip lights the chips over the same bytes, in both panels.
  function hover(root) {
    const info = root.querySelector("#chip-detail");
    let lit = [];
    const light = (chip) => {
      for (const c of lit) c.classList.remove("hl");
      lit = [];
      if (!chip) return;
      const start = +chip.dataset.start, end = +chip.dataset.end;
      for (const other of root.querySelectorAll(".panel")) {
        for (const c of other.querySelectorAll(".chip")) {
          if (+c.dataset.start < end && start < +c.dataset.end) { c.classList.add("hl"); lit.push(c); }
        }
      }
      info.classList.remove("muted");
      info.replaceChildren(...describe(chip));
    };
    root.addEventListener("mouseover", (event) => {
      const chip = event.target.closest(".chip");
      if (chip && root.contains(chip)) light(chip);
    });
    root.addEventListener("mouseleave", () => light(null));
  }

  TK.register("tokens", {
    title: "Tokens",
    needs: ["tokenizer"],
    async render(target, state, info) {
      const params = {text: state.text, specials: state.specials};
      const both = !!info.compare;
      const controls = el("div", {class: "controls"});
      if (Object.keys(info.tokenizer.special_tokens || {}).length || (info.compare && Object.keys(info.compare.special_tokens || {}).length)) {
        const select = el("select", {id: "specials", disabled: !!TK.FILE, title: TK.FILE ? "as tk explain read it" : null,
          onchange: (event) => TK.go({specials: event.target.value})},
          el("option", {value: ""}, "refused (an error)"), el("option", {value: "allow"}, "read as special tokens"),
          el("option", {value: "text"}, "read as plain text"));
        select.value = state.specials;
        controls.append(el("label", {for: "specials"}, "Text that looks like a special token is "), select);
      }
      // the controls stay when the text is refused: the specials control is how to make it acceptable
      let answer;
      try {
        answer = both ? await TK.api("/api/compare", params) : {main: await TK.api("/api/tokens", params), differ: []};
      } catch (error) {
        target.append(controls, el("p", {class: "error"}, error.message));
        return;
      }
      const panels = el("div", {class: both ? "panels two" : "panels"},
        panel(answer.main, info.tokenizer, answer.differ, "copy-ids", "main"));
      if (both) panels.append(panel(answer.compare, info.compare, answer.differ, "copy-ids-compare", "compare"));
      target.append(controls, detail(), panels);
      if (both) {
        const bytes = new TextEncoder().encode(state.text);
        const decoder = new TextDecoder();
        const spans = answer.differ;
        target.append(el("section", {class: "differ-list"},
          el("h3", {}, spans.length ? `Cut differently in ${spans.length} ${spans.length === 1 ? "place" : "places"}` : "Both tokenizers cut this text the same way"),
          spans.length ? el("p", {class: "muted small"}, "The chips over these bytes are underlined in both panels.") : null,
          el("div", {class: "differ-spans"}, spans.slice(0, 200).map(([s, e]) =>
            el("span", {class: "differ-span mono", dataset: {start: s, end: e}, title: `bytes ${s}–${e}`},
              TK.visibleNodes(decoder.decode(bytes.slice(s, e)))))),
          spans.length > 200 ? el("p", {class: "muted small"}, `and ${spans.length - 200} more`) : null));
      }
      hover(target);
    },
  });
})();
