// next.js: the model's next-token distribution as bars, and generation step by step: each new token
// with the distribution it was drawn from (after temperature, top-k, top-p); the seed makes it repeatable. With parts
// knocked out (the address's `ablate`, ablation.js) both are the ablated model's, the bars beside the unablated ones.
"use strict";
(() => {
  const {el} = TK;
  const SHOW = 10;  // bars per distribution
  const {bars} = TK.sampling;

  TK.register("next", {
    title: "Next token",
    needs: ["model"],
    async render(target, state, info, ctx) {
      if (state.text === "") { target.append(el("p", {class: "muted"}, "Type some text above: the model predicts what comes next.")); return; }
      const vocab = info.model.config.vocab_size;
      const tokens = info.tokenizer ? info.tokenizer.vocab_size : vocab;  // fewer when the model is padded
      const sampling = {text: state.text, n: state.n, temperature: state.temperature, top_k: state.top_k,
        top_p: state.top_p, seed: state.seed, show: SHOW, ablate: state.ablate, specials: state.specials};
      // a `tk explain --html` file holds the generation of the default settings only: others get its note
      const [next, gen, effect] = await Promise.all([
        TK.api("/api/next", {text: state.text, top_k: SHOW, specials: state.specials}),
        TK.api("/api/generate", sampling).catch((error) => {
          if (!TK.FILE && !state.ablate) throw error;  // an ablation's error is the card's to say
          return {steps: [], missing: error.message};
        }),
        TK.ablation.panel(state)]);
      const append = TK.FILE ? null : (row) => TK.go({text: state.text + row.token, step: "", query: ""}, true);

      // 1. the next token
      const nextCard = el("section", {class: "card", id: "next-card"},
        el("h2", {}, "Next token"),
        el("p", {class: "muted"}, `After these ${TK.int(next.prompt_ids.length)} tokens the model gives each of its ` +
          (tokens < vocab ? `${TK.int(vocab)} ids (${TK.int(tokens)} tokens and ${TK.int(vocab - tokens)} padding)`
            : `${TK.int(vocab)} tokens`) +
          ` a probability (softmax of the last position's scores). The ${next.top.length} most likely` +
          (append ? "; click one to add it to the text." : ".")),
        bars(next.top, {id: "next-bars", onpick: append, tokens}));
      if (effect) {  // the unablated bars, then what the ablation does to them
        nextCard.append(el("h2", {class: "abl-title"}, "With parts knocked out"), effect);
        effect.classList.remove("card");
      }

      // 2. generation, step by step
      const fields = TK.sampling.fields("gen", state, info);
      const reseed = el("button", {type: "button", id: "gen-reseed", title: "draw again with the next seed"}, "New sample");
      reseed.addEventListener("click", () => TK.go({seed: String((Number(state.seed) + 1) % 4294967296)}));

      const steps = gen.steps;
      let picked = 0;
      const genBox = el("div", {class: "gen chips", id: "gen-tokens"},
        el("span", {class: "prompt", title: `the prompt: ${next.prompt_ids.length} tokens`}, state.text));
      const genChips = steps.map((step, i) => {
        const chip = TK.chip({id: step.id, text: step.token, partial: /\\x[0-9a-f]{2}/.test(step.token)}, i,
          {tag: "button", class: "gen-token"});
        chip.dataset.step = i;
        chip.removeAttribute("title");
        chip.setAttribute("aria-label", `generated token ${i + 1}: ${TK.visible(step.token)}, id ${step.id}`);
        chip.addEventListener("click", () => pick(i));
        genBox.append(chip);
        if (step.token.endsWith("\n")) genBox.append(el("br"));
        return chip;
      });
      const stepHead = el("div", {class: "controls", id: "gen-step"});
      const stepBars = el("div", {id: "step-bars-box"});
      const back = el("button", {type: "button", id: "gen-prev", "aria-label": "the token before"}, "◀");
      const on = el("button", {type: "button", id: "gen-next", "aria-label": "the token after"}, "▶");
      back.addEventListener("click", () => pick(picked - 1));
      on.addEventListener("click", () => pick(picked + 1));

      function pick(i) {
        if (!steps.length) return;
        picked = Math.max(0, Math.min(steps.length - 1, i));
        genChips.forEach((chip, j) => { chip.classList.toggle("selected", j === picked); chip.setAttribute("aria-pressed", j === picked); });
        const step = steps[picked];
        const drawnRow = step.top.find((row) => row.id === step.id);
        stepHead.dataset.step = picked;
        stepHead.replaceChildren(back, on, el("span", {},
          el("b", {}, `Token ${picked + 1} of ${steps.length}: `), "drew ",
          el("span", {class: "tok"}, TK.visibleNodes(step.token)), ` (id ${step.id}` +
          (drawnRow ? `, p = ${TK.pct(drawnRow.p)})` : ", outside the top shown)") + " from:"));
        back.disabled = picked === 0;
        on.disabled = picked === steps.length - 1;
        const possible = step.top.filter((row) => row.p > 0);  // the settings cut the others to 0
        const lost = 1 - possible.reduce((sum, row) => sum + row.p, 0);
        stepBars.replaceChildren(bars(possible, {id: "step-bars", drawn: step.id}),
          el("p", {class: "muted small"}, possible.length < step.top.length || lost <= 1e-12
            ? "Every other token had probability 0 after the settings."
            : `The other ${TK.int(vocab - possible.length)} tokens share ${TK.pct(Math.max(0, lost))}.`));
      }

      const t = Number(state.temperature);
      const settingsNote = [t === 0 ? "temperature 0: always the most likely token" : `temperature ${state.temperature}`,
        state.top_k ? `only the ${state.top_k} most likely` : "no top-k cut",
        state.top_p ? `the smallest set holding ${state.top_p} of the probability` : "no top-p cut",
        `seed ${state.seed}: the same settings draw the same tokens`].join(" · ");

      const genCard = el("section", {class: "card", id: "gen-card"},
        el("h2", {}, "Generation, one token at a time"),
        el("p", {class: "muted"}, "Each new token is drawn from the model's distribution after temperature, top-k and top-p; " +
          "click a generated token to see the distribution it came from."),
        el("div", {class: "controls sampling"}, Object.values(fields).map((f) => f.box), reseed),
        el("p", {class: "muted small", id: "gen-settings"}, settingsNote +
          (state.ablate ? ` · knocked out: ${TK.ablation.parts(state).join(", ")}` : "")),
        genBox,
        gen.missing ? el("p", {class: "error", id: "gen-missing"}, gen.missing)
          : steps.length ? [stepHead, stepBars] : el("p", {class: "muted"}, "No new tokens asked for (new tokens = 0)."));
      target.append(el("div", {class: "grid2 next-grid"}, nextCard, genCard));
      pick(0);
    },
  });
})();
