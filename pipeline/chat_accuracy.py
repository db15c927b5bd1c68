"""Held-out answer accuracy of a chat model: the exact match of the answer's key word.

What it does: reads a held-out file of conversations (bpe/conversations.py's JSONL, as
corpora/tiny_dialogues_test.jsonl holds them) whose lines also say what their last answer must
give: "kind" (the question's kind, e.g. "hero"), "key" (the word, e.g. "Tom") and "choices" (every
key that kind of question can have, the key among them). An answerer, any function from the
conversation without its last assistant turn (a prompt: `Conversation`, ending with the user's
question) to the text of an answer, is scored on every line; `baseline` scores the trivial
answerer that ignores the story and gives the most frequent key of each kind, the floor beside
which a model's figure means something.

The rule, exact match of the key word (`is_right`):
- **words** are the maximal runs of letters (`str.isalpha`) of the text, after Unicode NFC
  normalisation, compared case-folded: punctuation, quotes, spaces and digits only separate words,
  and case does not count ("tom", "TOM." and '"Tom"' are the word Tom; accents do: "Zoe" is not
  "Zoë"; "Tommy" and "T.o.m" are not Tom);
- **the answer's key words** are its words that are among the line's choices;
- the answer is **right** when its key words are exactly one word (said any number of times) and
  it is the key. An answer naming no choice is wrong, and so is one naming two ("Tom or Ben"), so
  hedging, or listing every name, scores nothing. Words outside the choices are free: "Tom found it
  under a rock." is right for the hero Tom.

A held-out line's own answer is right by this rule (tests/test_dialogues.py checks it of the
bundled file), so a model that answers as its fine-tuning data does can score 100%.

Bounds: the file is a regular file of at most MAX_FILE_BYTES, each line's parse at most the values
bpe/conversations.py allows a conversation plus MAX_CHOICES; a line that is not a conversation, or
lacks a kind, a one-word key or choices holding it, is one PipelineError naming the file and line.

What it deliberately does not do: generate answers (the caller's answerer does: a model, greedy or
sampled), read the train split, or know the dialogue corpus's kinds (each line carries its own).

>>> is_right("Tom found it.", "Tom", ["Ben", "Tom"]), is_right("Tom or Ben?", "Tom", ["Ben", "Tom"])
(True, False)
>>> is_right('"What a lovely BALL!"', "ball", ["ball", "key"]), is_right("Zoe.", "Zoë", ["Tom", "Zoë"])
(True, False)
"""

from __future__ import annotations

import os
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenkit.bpe.conversations import MAX_JSON_VALUES, Conversation
from tokenkit.bpe.errors import TokenizerError
from tokenkit.common import jsonsafe, readfile
from tokenkit.common.errors import FileError
from tokenkit.pipeline.errors import PipelineError

__all__ = ["MAX_CHOICES", "MAX_FILE_BYTES", "Accuracy", "HeldOut", "Scored", "accuracy", "baseline"]
__all__ += ["is_right", "majority_keys", "read_held_out", "words"]

MAX_FILE_BYTES = 256 * readfile.MIB  # a held-out set is read whole: the bundled one is 0.2 MB
MAX_CHOICES = 10_000  # keys a kind of question may have
WHAT = "a JSONL file of held-out conversations"


def words(text: str) -> list[str]:
    """The words of `text` as the rule reads them: runs of letters, NFC-normalised, case-folded.

    >>> words('Tom said, "What a lovely BALL!" 3x')
    ['tom', 'said', 'what', 'a', 'lovely', 'ball', 'x']
    """
    out, word = [], []
    for ch in unicodedata.normalize("NFC", text) + " ":
        if ch.isalpha():
            word.append(ch)
        elif word:
            out.append("".join(word).casefold())
            word = []
    return out


def is_right(answer: str, key: str, choices: Sequence[str]) -> bool:
    """Whether `answer` gives `key` and no other of `choices` (the rule of the module docstring);
    `key` is one word (ValueError otherwise)."""
    key_words = words(key)
    if len(key_words) != 1:
        raise ValueError(f"the key {key!r} is not one word")
    (key_word,) = key_words
    named = set(words(answer)) & {w for c in choices for w in words(c)}
    return named == {key_word}


@dataclass(frozen=True)
class HeldOut:
    """One held-out line: `prompt` (the conversation without its last answer, ending with the
    user's question), `answer` (that last answer, the data's own), `kind`, `key`, `choices`, and
    `line` (its line in the file)."""

    prompt: Conversation
    answer: str
    kind: str
    key: str
    choices: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Scored:
    """One answer given: the held-out line it answers, the text, and whether it is right."""

    line: int
    kind: str
    key: str
    answer: str
    right: bool


@dataclass(frozen=True)
class Accuracy:
    """The figure: `right` of `total` answers, `by_kind` {kind: (right, total)} in the order the
    kinds first appear, and every answer (`scored`, in the file's order)."""

    right: int
    total: int
    by_kind: dict[str, tuple[int, int]]
    scored: tuple[Scored, ...]

    @property
    def fraction(self) -> float:
        return self.right / self.total if self.total else 0.0

    def __str__(self) -> str:
        kinds = ", ".join(f"{kind} {r}/{n}" for kind, (r, n) in self.by_kind.items())
        return f"{100 * self.fraction:.1f}% ({self.right} of {self.total}: {kinds})"


def accuracy(items: Sequence[HeldOut], answer: Callable[[Conversation], str]) -> Accuracy:
    """`answer` (prompt -> the answer's text) scored on every held-out item, in order."""
    texts = []
    for item in items:
        text = answer(item.prompt)
        if not isinstance(text, str):
            raise TypeError(f"the answerer gave {type(text).__name__} for line {item.line}, not the answer's text")
        texts.append(text)
    return _score(items, texts)


def majority_keys(items: Sequence[HeldOut]) -> dict[str, str]:
    """{kind: its most frequent key among `items`}, a tie going to the key that sorts first."""
    counts: dict[str, Counter] = {}
    for item in items:
        counts.setdefault(item.kind, Counter())[item.key] += 1
    return {kind: min(c, key=lambda k: (-c[k], k)) for kind, c in counts.items()}


def baseline(items: Sequence[HeldOut]) -> Accuracy:
    """The trivial answerer's figure: each kind's most frequent key among `items` (`majority_keys`),
    whatever the story. No answerer that ignores the story and gives one answer per kind scores
    more on `items`."""
    majority = majority_keys(items)
    return _score(items, [majority[item.kind] for item in items])


def _score(items: Sequence[HeldOut], texts: Sequence[str]) -> Accuracy:
    scored = tuple(
        Scored(item.line, item.kind, item.key, text, is_right(text, item.key, item.choices))
        for item, text in zip(items, texts, strict=True)
    )
    by_kind: dict[str, tuple[int, int]] = {}
    for s in scored:
        r, n = by_kind.get(s.kind, (0, 0))
        by_kind[s.kind] = (r + s.right, n + 1)
    return Accuracy(sum(s.right for s in scored), len(scored), by_kind, scored)


def read_held_out(path: str | os.PathLike) -> list[HeldOut]:
    """Every held-out line of a JSONL file, each checked (see the module docstring); at least one.
    One PipelineError naming the file and line for the first mistake."""
    try:
        data = readfile.read_bytes(path, MAX_FILE_BYTES, WHAT)
    except FileError as err:
        raise PipelineError(str(err)) from None
    items = []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte order mark
            raw = raw[3:]
        if raw.strip():
            items.append(_held_out(raw, f"{path}:{lineno}", lineno))
    if not items:
        raise PipelineError(f"{path} holds no conversations; give {WHAT}, one per line")
    return items


def _held_out(raw: bytes, where: str, lineno: int) -> HeldOut:
    try:
        record = jsonsafe.loads(raw, where, max_items=MAX_JSON_VALUES + MAX_CHOICES)
    except FileError as err:
        raise PipelineError(f"{err}; give one JSON object per line") from None
    if not isinstance(record, dict) or "messages" not in record:
        raise PipelineError(f'{where}: not an object with "messages"; each line is one conversation')
    try:
        whole = Conversation.of(record["messages"], line=lineno)
    except TokenizerError as err:
        raise PipelineError(f"{where}: {err}") from None
    kind, key, choices = record.get("kind"), record.get("key"), record.get("choices")
    if not isinstance(kind, str) or not kind:
        raise PipelineError(f'{where}: no "kind" (the question\'s kind, a string); a held-out line says it')
    if not isinstance(key, str) or len(words(key)) != 1:
        raise PipelineError(f'{where}: "key" is not one word (the word the answer must give, e.g. "Tom")')
    if not isinstance(choices, list) or not all(isinstance(c, str) and len(words(c)) == 1 for c in choices):
        raise PipelineError(f'{where}: "choices" is not a list of one-word keys (every key a {kind} question can have)')
    if len(choices) > MAX_CHOICES:
        raise PipelineError(f'{where}: {len(choices):,} "choices", more than the {MAX_CHOICES:,} a line may hold')
    if words(key)[0] not in {words(c)[0] for c in choices}:
        raise PipelineError(f'{where}: the key {key!r} is not among its "choices"; the choices hold every key')
    prompt = Conversation(whole.messages[:-1], lineno)  # ends with the user's turn: checked as a whole
    return HeldOut(prompt, whole.messages[-1].content, kind, key, tuple(choices), lineno)
