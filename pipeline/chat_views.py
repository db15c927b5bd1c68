"""What the page's Chat view shows, as JSON-ready dicts: whether the served model can chat, and the
assistant's answer to a conversation with the distribution each of its tokens was drawn from.

    chat_status(model, tok)                       # /api/chat with no conversation
    chat_view(model, tok, messages, n=40, ...)    # /api/chat?messages=[...]

The server keeps no conversation: the page sends the whole conversation with each message, and
`chat_view` replays it into a fresh `pipeline.chat_session.ChatSession` (the system message, each
earlier turn with the answer as the page kept it: its ids, else its text encoded; `add_turn`),
then has the session answer the last user message, watching each pick (`ChatSession.observe`).
So an answer is a function of the conversation and the settings alone: greedy, it is the answer
`tk chat --temperature 0` gives after the same turns; sampled, the session's generator is seeded
afresh with `seed` for each answer (`tk chat --seed` draws a whole session's answers from one
generator, so its first answer is the page's). The oldest turns are dropped, after the system
message, when the conversation does not fit the model's context, as `tk chat` drops them
(`dropped_turns` says how many).

Each answer token is `views.drawn_step`'s, the shape /api/generate's steps have: `p` in the
distribution it was drawn from (after temperature, top-k and top-p; one-hot when greedy) and
`p_model`, the model's own softmax. The pick that ended the turn (`<|end|>`, the model's end token
or a role's) is `end_step`, so the page can show why the answer stopped.

What it deliberately does not do: read request parameters or hold locks (cli/serve_api.py and
cli/serve.py do), keep a conversation between requests, or render templates itself
(pipeline/chat_session.py and bpe/ do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tokenkit.bpe.conversations import Conversation
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.jinja_template import template_of
from tokenkit.pipeline.chat_session import ChatSession, Dropped, Reply, not_for_chat
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.views import drawn_step

__all__ = ["MESSAGES_MAX", "NO_TEMPLATE", "chat_status", "chat_view", "unavailable"]

MESSAGES_MAX = 65  # a system message and 32 turns: each turn is replayed at every answer
_AS_TEXT = {"allowed_special": (), "disallowed_special": ()}  # an answer's special-looking text stays text
NO_TEMPLATE = "this model has no chat template; fine-tune one with tk train-model --chat"


def unavailable(tok) -> str | None:
    """The one line saying why the model of `tok` cannot chat, or None when it can."""
    return NO_TEMPLATE if not_for_chat(tok) else None


def template_kind(tok) -> str | None:
    """ "own" (the tokenizer keeps its model's Jinja template), "tk" (tk's template's tokens), or
    None (no template)."""
    if template_of(tok) is not None:
        return "own"
    return None if not_for_chat(tok) else "tk"


def chat_status(model, tok) -> dict[str, Any]:
    """/api/chat without a conversation: whether the model can chat (`why` not, in one line), in
    which template, and the bounds of a conversation."""
    return {
        "available": unavailable(tok) is None,
        "why": unavailable(tok),
        "template": template_kind(tok),
        "context_length": model.config.context_length,
        "messages": MESSAGES_MAX,
    }


def _conversation(messages: Sequence[Any]) -> tuple[str | None, list[tuple[str, str, list[int] | None]], str]:
    """(system, [(user, answer, the answer's ids or None)], the last user message) of the page's
    messages, checked: their count, their order and types (`bpe.conversations`), and each
    assistant's `ids` when given (a list of whole numbers; the session checks them further)."""
    if isinstance(messages, list) and len(messages) > MESSAGES_MAX:
        raise PipelineError(
            f"the conversation holds {len(messages)} messages, more than the {MESSAGES_MAX} the chat takes: "
            "reset it (its oldest turns no longer fit the model's context anyway)"
        )
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise PipelineError('messages must be a JSON list of {"role": ..., "content": ...} objects')
    try:
        Conversation.of(messages, prompt=True)
    except TokenizerError as err:
        raise PipelineError(str(err)) from None
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    body = messages[1:] if system is not None else messages
    turns = []
    for user, answer in zip(body[:-1:2], body[1:-1:2], strict=True):
        ids = answer.get("ids")
        if ids is not None and (not isinstance(ids, list) or any(type(i) is not int for i in ids)):
            raise PipelineError("an assistant message's ids must be a list of whole numbers (token ids)")
        turns.append((user["content"], answer["content"], ids))
    return system, turns, body[-1]["content"]


def chat_view(
    model,
    tok,
    messages: Sequence[Any],
    *,
    n: int = 40,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = 0,
    show: int = 10,
) -> dict[str, Any]:
    """/api/chat: the assistant's answer to `messages` (HF-style dicts: an optional system message,
    then the user and the assistant in turns, ending with the user's; an assistant's may carry the
    `ids` the page was sent for it), at most `n` tokens. PipelineError (one line) for a model
    without a chat template, a conversation out of order, or a last message that does not fit
    the context. The answer: `content`, `ids`, `stop` (as `tk chat --json`'s), `steps` (one per
    token, `views.drawn_step`), `end_step` (the pick that ended the turn, or None),
    `dropped_turns`, `prompt_tokens` (the conversation as the model read it before answering),
    `context_length` and `template`."""
    why = unavailable(tok)
    if why:
        raise PipelineError(why)
    system, turns, question = _conversation(messages)
    session = ChatSession(
        model, tok, system=system, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=n
    )
    picks: list[tuple[int, np.ndarray, np.ndarray]] = []
    prompt: list[int] = []

    def observe(token: int, logits: np.ndarray, probs: np.ndarray) -> None:
        if not picks:  # the first pick: the conversation as the model read it
            prompt.append(len(session.ids))
        picks.append((token, logits, probs))

    try:
        for user, content, ids in turns:
            session.add_turn(user, tok.encode(content, **_AS_TEXT) if ids is None else ids)
        session.observe = observe
        dropped, reply = 0, None
        for event in session.reply(question):
            if isinstance(event, Dropped):
                dropped += event.turns
            elif isinstance(event, Reply):
                reply = event
    finally:
        session.close()
    steps = [drawn_step(tok, token, logits, probs, show) for token, logits, probs in picks[: len(reply.ids)]]
    ended = picks[len(reply.ids)] if reply.stop in ("end", "turn") else None
    return {
        "role": "assistant",
        "content": reply.content,
        "ids": list(reply.ids),
        "stop": reply.stop,
        "steps": steps,
        "end_step": None if ended is None else drawn_step(tok, *ended, show),
        "dropped_turns": dropped,
        "prompt_tokens": prompt[0] if prompt else len(session.ids),
        "context_length": session.context,
        "template": template_kind(tok),
    }
