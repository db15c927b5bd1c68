// chat.js: the Chat view: a conversation with the served model in its chat template, each answer token a chip
// that shows the distribution it was drawn from (as the Next token view's generation does).
// The server keeps no conversation: each message is sent with the whole conversation before it (/api/chat,
// the answers with the ids they were sent, so the model reads exactly what it wrote). The conversation lives in
// this tab (sessionStorage, so a reload keeps it), never in the address: it soon outgrows one. The sampling
// settings are the address's, shared with the Next token view.
"use strict";
(() => {
  const {el} = TK;
  const SHOW = 10;                 // bars per distribution
  const MESSAGES_MAX = 65;         // pipeline/chat_views.py MESSAGES_MAX: a system message and 32 turns
  const REQUEST_BYTES = 60000;     // the server reads a request line of 64 KiB at most; room left for the rest
  const STORE = "tk-chat:";        // sessionStorage key, + the model's name and vocabulary size
  let convo = null;                // {key, system, turns: [{user, answer}], selected: {turn, step}, which, error}
  let pending = null;              // the answer on its way: {turn, promise}
  let redrawLive = null;           // the latest drawing's redraw of its conversation, or null when left

  function storeKey(info) { return STORE + info.model.name + ":" + info.model.config.vocab_size; }

  function load(key) {
    let saved = null;
    try { saved = JSON.parse(sessionStorage.getItem(key) || "null"); } catch (error) { saved = null; }
    const ok = saved && typeof saved.system === "string" && Array.isArray(saved.turns) &&
      saved.turns.every((t) => t && typeof t.user === "string" && t.answer && Array.isArray(t.answer.ids));
    return {key, system: ok ? saved.system : "", turns: ok ? saved.turns : [], selected: null, which: null, error: ""};
  }

  function save() {
    try { sessionStorage.setItem(convo.key, JSON.stringify({system: convo.system, turns: convo.turns})); }
    catch (error) { /* storage full or off: the conversation still lives until the tab reloads */ }
  }

  // The messages /api/chat reads for `text`: the system message, the latest turns that fit one request (the
  // oldest left out first), the new message last. {messages, json, left}: left = the turns left out.
  function messagesFor(text, limitChars) {
    const system = convo.system.trim() ? [{role: "system", content: convo.system}] : [];
    for (let left = 0; left <= convo.turns.length; left++) {
      const messages = [...system];
      for (const turn of convo.turns.slice(left)) {
        messages.push({role: "user", content: turn.user}, {role: "assistant", content: turn.answer.content, ids: turn.answer.ids});
      }
      messages.push({role: "user", content: text});
      const json = JSON.stringify(messages);
      if (messages.length <= MESSAGES_MAX && json.length <= limitChars && encodeURIComponent(json).length <= REQUEST_BYTES) {
        return {messages, json, left};
      }
    }
    return null;
  }

  // Probability bars, as the Next token view draws them; `drawn`: the id marked as the one drawn; `key`:
  // "p" (the distribution drawn from) or "p_model" (the model's own softmax).
  const partial = (token) => /\\x[0-9a-f]{2}/.test(token);
  const greedy = (settings) => Number(settings.temperature) === 0;

  function settingsLine(s) {
    return [greedy(s) ? "temperature 0 (greedy)" : `temperature ${s.temperature}`, s.top_k ? `top-k ${s.top_k}` : null,
      s.top_p ? `top-p ${s.top_p}` : null, greedy(s) ? null : `seed ${s.seed}`].filter(Boolean).join(" · ");
  }

  // One answer's bubble: a chip per token (and the pick that ended the turn), with what stopped it.
  function answerBubble(turn, i, select) {
    const answer = turn.answer;
    const chips = answer.steps.map((step, j) => {
      const chip = TK.chip({id: step.id, text: step.token, partial: partial(step.token)}, j, {tag: "button", class: "chat-token"});
      chip.dataset.turn = i;
      chip.dataset.step = j;
      chip.removeAttribute("title");
      chip.setAttribute("aria-label", `answer ${i + 1}, token ${j + 1}: ${TK.visible(step.token)}, id ${step.id}`);
      chip.addEventListener("click", () => select(i, j));
      return chip;
    });
    if (answer.end_step) {
      const end = answer.end_step;
      const chip = TK.chip({id: end.id, text: end.token, special: true}, answer.steps.length, {tag: "button", class: "chat-token chat-end"});
      chip.dataset.turn = i;
      chip.dataset.step = "end";
      chip.removeAttribute("title");
      chip.setAttribute("aria-label", `answer ${i + 1}: ended by ${end.token}, id ${end.id}`);
      chip.addEventListener("click", () => select(i, "end"));
      chips.push(chip);
    }
    const stops = {end: "ended its turn", turn: "ended its turn", length: "reached the new-token limit",
      context: "filled the context", interrupted: "was interrupted"};
    const meta = [`${answer.ids.length} token${answer.ids.length === 1 ? "" : "s"}`, stops[answer.stop] || answer.stop,
      settingsLine(answer.settings)];
    if (answer.dropped_turns) meta.push(`the ${answer.dropped_turns} oldest turn${answer.dropped_turns === 1 ? "" : "s"} dropped for the context`);
    if (answer.left_out) meta.push(`the ${answer.left_out} oldest not sent (one request holds no more)`);
    return el("div", {class: "bubble assistant", dataset: {turn: i}},
      el("div", {class: "chips"}, chips.length ? chips : el("span", {class: "muted"}, answer.content || "(no tokens)")),
      el("div", {class: "bubble-meta"}, meta.join(" · ")));
  }

  TK.register("chat", {
    title: "Chat",
    needs: ["model"],
    noText: true,
    async render(target, state, info, ctx) {
      if (TK.FILE) {  // a `tk explain --html` file: no model runs here
        target.append(el("p", {class: "muted", id: "chat-absent"},
          "This file holds no model to talk with: the Chat view needs the server (tk serve RUN_OR_MODEL)."));
        return;
      }
      const status = await TK.api("/api/chat", {}, {fresh: true});
      if (!status.available) { target.append(el("p", {class: "muted", id: "chat-absent"}, status.why)); return; }
      if (!convo || convo.key !== storeKey(info)) convo = load(storeKey(info));
      const tokens = info.tokenizer ? info.tokenizer.vocab_size : info.model.config.vocab_size;
      const limitChars = (info.limits && info.limits.text_chars) || 20000;
      const settings = {n: state.n, temperature: state.temperature, top_k: state.top_k, top_p: state.top_p, seed: state.seed};

      const fields = TK.sampling.fields("chat", state, info);
      const reset = el("button", {type: "button", id: "chat-reset", title: "forget the turns (the system message stays)"}, "Reset");
      const system = el("textarea", {id: "chat-system", rows: 2, spellcheck: "false", "aria-label": "system message",
        placeholder: "none (optional)"});
      system.value = convo.system;
      system.addEventListener("input", () => { convo.system = system.value; save(); });
      const input = el("textarea", {id: "chat-input", rows: 2, spellcheck: "false", "aria-label": "your message",
        placeholder: "Type a message; Enter sends, Shift+Enter starts a new line"});
      const send = el("button", {type: "submit", id: "chat-send", class: "primary"}, "Send");
      const form = el("form", {id: "chat-form"}, input, el("span", {class: "chat-buttons"}, send, reset));
      const note = el("p", {id: "chat-note", class: "small", role: "status"});
      const log = el("div", {id: "chat-log", "aria-label": "the conversation"});
      const head = el("div", {id: "chat-step"});
      const barsBox = el("div", {id: "chat-bars-box"});

      function select(i, j) {
        convo.selected = {turn: i, step: j};
        drawLog(false);
      }

      function drawBars() {
        const sel = convo.selected;
        const turn = sel && convo.turns[sel.turn];
        const step = turn && turn.answer && (sel.step === "end" ? turn.answer.end_step : turn.answer.steps[sel.step]);
        if (!step) {
          head.replaceChildren(el("p", {class: "muted"}, "Click a token of an answer to see the distribution it was drawn from."));
          barsBox.replaceChildren();
          return;
        }
        const answer = turn.answer;
        const which = convo.which || (greedy(answer.settings) ? "p_model" : "p");
        const pick = (key) => el("button", {type: "button", class: "which" + (which === key ? " on" : ""), dataset: {which: key},
          "aria-pressed": which === key ? "true" : "false", onclick: () => { convo.which = key; drawBars(); }},
        key === "p" ? "drawn from" : "the model's");
        const drawnRow = step.top.find((row) => row.id === step.id);
        const where = sel.step === "end" ? `the end of answer ${sel.turn + 1}` : `answer ${sel.turn + 1}, token ${sel.step + 1} of ${answer.steps.length}`;
        head.dataset.turn = sel.turn;
        head.dataset.step = sel.step;
        head.dataset.which = which;
        head.replaceChildren(
          el("p", {}, el("b", {}, where + ": "), "drew ", el("span", {class: "tok"}, TK.visibleNodes(step.token)),
            ` (id ${step.id}` + (drawnRow ? `, p = ${TK.pct(drawnRow[which])})` : ", outside the top shown)")),
          el("div", {class: "controls"}, el("span", {class: "muted"}, "bars:"), pick("p"), pick("p_model")),
          el("p", {class: "muted small", id: "chat-which"}, which === "p"
            ? `The distribution the token was drawn from: the model's probabilities after ${settingsLine(answer.settings)}` +
              (greedy(answer.settings) ? ", which puts all of it on the most likely token." : " (top-k and top-p set the rest to 0).")
            : "The model's own probabilities (the softmax of its scores), before temperature, top-k and top-p."));
        const rows = which === "p" ? step.top.filter((row) => row.p > 0) : step.top;
        const shown = rows.reduce((sum, row) => sum + (row[which] || 0), 0);
        barsBox.replaceChildren(TK.sampling.bars(rows, {id: "chat-bars", drawn: step.id, key: which, tokens}), el("p", {class: "muted small"}, 1 - shown <= 1e-9
          ? "Every other token has probability 0."
          : `The other ${TK.int(info.model.config.vocab_size - rows.length)} ids share ${TK.pct(Math.max(0, 1 - shown))}.`));
      }

      function drawLog(scroll) {
        const bubbles = [];
        if (convo.system.trim()) bubbles.push(el("div", {class: "bubble system"}, el("b", {}, "system: "), convo.system));
        convo.turns.forEach((turn, i) => {
          bubbles.push(el("div", {class: "bubble user", dataset: {turn: i}}, turn.user));
          bubbles.push(answerBubble(turn, i, select));
        });
        if (pending) {
          bubbles.push(el("div", {class: "bubble user"}, pending.text));
          bubbles.push(el("div", {class: "bubble assistant pending", id: "chat-pending"}, "…"));
        }
        if (!bubbles.length) bubbles.push(el("p", {class: "muted", id: "chat-empty"}, "No messages yet: type one below."));
        log.replaceChildren(...bubbles);
        for (const chip of log.querySelectorAll(".chat-token")) {
          const on = convo.selected && String(convo.selected.turn) === chip.dataset.turn && String(convo.selected.step) === chip.dataset.step;
          chip.classList.toggle("selected", on);
          chip.setAttribute("aria-pressed", on ? "true" : "false");
        }
        send.disabled = reset.disabled = !!pending;  // an answer on its way belongs to the conversation it was asked in
        note.className = "small" + (convo.error ? " error" : " muted");
        note.textContent = convo.error || (convo.turns.length ? `${convo.turns.length} turn${convo.turns.length === 1 ? "" : "s"}; ` +
          `the model reads at most ${TK.int(status.context_length)} tokens, the oldest turns dropped first.` : "");
        if (scroll) requestAnimationFrame(() => { log.scrollTop = log.scrollHeight; });  // once it is in the page
        drawBars();
      }

      async function ask(text) {
        const fit = messagesFor(text, limitChars);
        if (!fit) { convo.error = "this message is too long to send in one request: shorten it"; drawLog(false); return false; }
        const asked = {...settings};
        convo.error = "";
        pending = {text};
        drawLog(true);
        try {
          const answer = await TK.api("/api/chat", {messages: fit.json, ...asked, show: SHOW}, {fresh: true});
          convo.turns.push({user: text, answer: {...answer, settings: asked, left_out: fit.left}});
          convo.selected = {turn: convo.turns.length - 1, step: answer.steps.length ? 0 : "end"};
          save();
          return true;
        } catch (error) {
          convo.error = error.message;
          return false;
        } finally {
          pending = null;
          if (redrawLive) redrawLive(true);
        }
      }

      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const text = input.value;
        if (!text.trim() || pending) return;
        input.value = "";
        if (!(await ask(text)) && ctx.live() && !input.value) input.value = text;  // refused: the text stays to edit
        if (ctx.live()) input.focus();
      });
      input.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); form.requestSubmit(); }
      });
      reset.addEventListener("click", () => {
        convo.turns = [];
        convo.selected = null;
        convo.error = "";
        save();
        drawLog(false);
      });

      redrawLive = drawLog;
      ctx.onLeave(() => { if (redrawLive === drawLog) redrawLive = null; });
      const template = status.template === "own" ? "its own chat template (imported with it)" : "tk's chat template";
      target.append(el("div", {class: "chat-grid"},
        el("section", {class: "card", id: "chat-card"},
          el("h2", {}, "Chat"),
          el("p", {class: "muted"}, `A conversation with the model in ${template}, answered as tk chat answers. Each ` +
            "answer token is a chip: click one for the distribution it was drawn from. The conversation stays in this tab " +
            "(not in the address)."),
          el("div", {class: "controls sampling"}, Object.values(fields).map((f) => f.box)),
          el("details", {id: "chat-system-box", open: convo.system.trim() ? true : null},
            el("summary", {}, "System message"), system),
          log, form, note),
        el("section", {class: "card", id: "chat-dist-card"}, el("h2", {}, "The distribution of a token"), head, barsBox)));
      drawLog(true);
    },
  });
})();
