"""A chat model's greedy answers to held-out questions, their accuracy as a record, and a short
conversation about a held-out story: what `tk pipeline --chat` reports (pipeline/chat_pipeline.py).

What it does: `answerer(model, tok)` is pipeline/chat_accuracy.py's answerer through
`ChatSession` at temperature 0: a held-out prompt's system message and earlier turns (the data's
own answers, not the model's) go into the session as they are, and the model answers the last
question; the session's ids are exactly `bpe.chat_template.render(prompt, generation_prompt=True)`
(tests/test_chat_pipeline.py checks it). `score(...)` is `chat_accuracy.accuracy` with it, and
`record(...)` the JSON a run keeps of it. `conversation(...)` has the model answer every user turn
of one held-out prompt itself, the transcript `tk pipeline --chat` ends with.

`grown(path)` is the base model as fine-tuning starts from it: its tokenizer with the chat
template's tokens and a row for each (`chat_start.with_chat_tokens`), so that the base, which never
saw the template, can be asked the same questions ("before fine-tuning").

What it deliberately does not do: train, read the held-out file (chat_accuracy.read_held_out), or
print anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenkit.bpe.chat_template import END, ROLE_TOKENS
from tokenkit.bpe.conversations import Conversation
from tokenkit.pipeline.chat_accuracy import Accuracy, HeldOut, accuracy
from tokenkit.pipeline.chat_session import ChatSession, Reply, Turn
from tokenkit.pipeline.chat_start import with_chat_tokens
from tokenkit.pipeline.start_from import StartFrom
from tokenkit.transformer import GPT

ANSWER_TOKENS = 32  # a right answer is a short sentence (at most 13 tokens in the bundled data)
_AS_TEXT = {"allowed_special": (), "disallowed_special": ()}  # a message's special-looking text stays text


def grown(path: str | Path, device: str = "cpu") -> tuple[GPT, Any]:
    """(model, tokenizer) of the model at `path` with the chat template's tokens added as
    fine-tuning adds them (each new row the mean of the old ones); as it is when it has them."""
    init, _ = with_chat_tokens(StartFrom.load(path))
    return GPT.from_params(init.model_config, init.params, device=device), init.tokenizer


def session_for(model, tok, prompt: Conversation, max_new_tokens: int = ANSWER_TOKENS) -> tuple[ChatSession, str]:
    """(a greedy session holding `prompt` but its last user message, that message): the system
    message set, each earlier turn put in with the data's own answer, closed as the template
    closes it."""
    messages = list(prompt.messages)
    system = messages.pop(0).content if messages[0].role == "system" else None
    session = ChatSession(model, tok, system=system, temperature=0.0, max_new_tokens=max_new_tokens)
    special = tok.special_tokens
    for user, answer in zip(messages[:-1:2], messages[1:-1:2], strict=True):
        user_ids = [special[ROLE_TOKENS["user"]], *tok.encode(user.content, **_AS_TEXT), special[END]]
        user_ids.append(special[ROLE_TOKENS["assistant"]])
        session.turns.append(Turn(user.content, user_ids, tok.encode(answer.content, **_AS_TEXT), stop="end"))
    return session, messages[-1].content


def reply(session: ChatSession, text: str) -> Reply:
    """The session's whole answer to `text` (its last event)."""
    *_, last = session.reply(text)
    return last


def answerer(model, tok, max_new_tokens: int = ANSWER_TOKENS) -> Callable[[Conversation], str]:
    """A held-out prompt -> the model's greedy answer to its last question (`session_for`)."""

    def answer(prompt: Conversation) -> str:
        session, question = session_for(model, tok, prompt, max_new_tokens)
        try:
            return reply(session, question).content
        finally:
            session.close()

    return answer


def score(model, tok, items: Sequence[HeldOut], max_new_tokens: int = ANSWER_TOKENS) -> Accuracy:
    """`chat_accuracy.accuracy` of the model's greedy answers on `items`."""
    return accuracy(items, answerer(model, tok, max_new_tokens))


def as_record(acc: Accuracy, *, answers: bool = True) -> dict[str, Any]:
    """An Accuracy as JSON: right, total, fraction, by_kind {kind: [right, total]}, and each
    answer given (line, kind, key, answer, right) when `answers`."""
    out: dict[str, Any] = {
        "right": acc.right,
        "total": acc.total,
        "fraction": acc.fraction,
        "by_kind": {kind: [r, n] for kind, (r, n) in acc.by_kind.items()},
    }
    if answers:
        out["answers"] = [
            {"line": s.line, "kind": s.kind, "key": s.key, "answer": s.answer, "right": s.right} for s in acc.scored
        ]
    return out


def conversation(model, tok, item: HeldOut, max_new_tokens: int = ANSWER_TOKENS) -> list[tuple[str, str, str]]:
    """The model's own conversation about `item`'s story: [(role, text, stop)] with every user
    turn of its prompt asked in order and answered by the model (greedy), the system message
    first if any (its stop "")."""
    messages = list(item.prompt.messages)
    out: list[tuple[str, str, str]] = []
    system = None
    if messages[0].role == "system":
        system = messages.pop(0).content
        out.append(("system", system, ""))
    session = ChatSession(model, tok, system=system, temperature=0.0, max_new_tokens=max_new_tokens)
    try:
        for message in messages:
            if message.role != "user":
                continue  # the model's own answer stands in its place
            answer = reply(session, message.content)
            out += [("user", message.content, ""), ("assistant", answer.content, answer.stop)]
    finally:
        session.close()
    return out


def pick_story(items: Sequence[HeldOut]) -> HeldOut:
    """The held-out item the closing conversation is about: the first that asks more than one
    question (the first item when none does)."""
    return next((item for item in items if item.prompt.roles.count("user") > 1), items[0])
