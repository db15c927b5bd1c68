"""Multiple-choice tasks scored by log-likelihood (`tk eval -m MODEL --task TASK.jsonl`), the way
EleutherAI's lm-evaluation-harness scores HellaSwag and ARC.

A task is JSON lines, one item a line: {"context": "...", "choices": ["...", ...], "gold": i}
(other keys are ignored, or one names the item's group, `group_by`, whose figures come apart).
Each choice is scored by the log-likelihood of its tokens after the context, the sum of their
log-probabilities, and the item is right when the gold choice has the highest:
- `acc`: the highest sum;
- `acc_norm`: the highest sum per UTF-8 byte of the choice, so that a long choice is not wrong
  for being long (lm-evaluation-harness divides by `len(choice)`, the choice's characters: the
  same on ASCII choices).

Tokens, as lm-evaluation-harness splits them (`TemplateLM._encode_pair`): whitespace at the end of
the context moves to the start of the choice; then the context and the whole text are encoded
(`Tokenizer.encode_for_model`: after the BOS, where the tokenizer has one), and the choice's
tokens are the whole's after as many as the context's. So a choice is scored on the tokens the
model reads for the whole text, even where the context's last token would merge across the
boundary. An empty context is the tokenizer's end-of-text token (lm-evaluation-harness's
`prefix_token_id`). A context longer than the model's window loses its first tokens: the model
reads the last `context_length + 1` tokens of context and choice, less the last one (HFLM's
`_loglikelihood_tokens`); `Scores.truncated` counts the items cut.

`score_items` runs every (item, choice) row through the model, longest first, several rows a
forward pass padded at the end (a causal model never reads its padding), and takes the
log-softmax only at the choice's positions.

What it does not do: read flags or print (cli/eval_commands.py), or score held-out text
(pipeline/evaluate.py).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenkit.bpe.errors import TokenizerError
from tokenkit.common import FileError, jsonsafe, readfile
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.runtime import keep_freed_memory

MAX_TASK_BYTES = 256 << 20  # HellaSwag's validation split, 10,042 items, is ~12 MB as such lines
MAX_LINE_ITEMS = 100_000  # JSON values on a line: an item holds its choices, a few to a few dozen
LOGITS_BYTES = 256 << 20  # a forward pass's logits, (rows, T, V) float32: the memory scoring takes
_JSON_PLACE = re.compile(r": line 1 column (\d+) \(char \d+\)")
ADVICE = 'give JSON lines, one item a line: {"context": "...", "choices": ["...", "..."], "gold": 0}'


@dataclass(frozen=True)
class Item:
    """One question: `choices` after `context`, the right one `choices[gold]`; `line` in its file,
    `group` the value of its `group_by` field (None without one)."""

    context: str
    choices: tuple[str, ...]
    gold: int
    line: int
    group: str | None = None


def read_task(path: str | os.PathLike, group_by: str | None = None) -> list[Item]:
    """The items of a task file, each line checked (and given its `group_by` field's value);
    one-line PipelineError naming the line otherwise. The file is read whole, after its size is
    bounded (MAX_TASK_BYTES)."""
    try:
        data = readfile.read_bytes(path, MAX_TASK_BYTES, "a task file (JSON lines)")
    except FileError as err:
        raise PipelineError(str(err)) from None
    if data.startswith(b"\xef\xbb\xbf"):  # a byte order mark
        data = data[3:]
    items = [parse_item(line, n, path, group_by) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    if not items:
        raise PipelineError(f"{path} holds no items; {ADVICE}")
    return items


def parse_item(line: bytes, n: int, path: str | os.PathLike = "the task", group_by: str | None = None) -> Item:
    """One line's item; PipelineError "PATH, line N: what is wrong; ..." otherwise."""
    where = f"{path}, line {n}"
    try:
        record = jsonsafe.loads(line, where, max_items=MAX_LINE_ITEMS)
    except FileError as err:  # json's own "line 1 column 9 (char 8)": the line is the file's line here
        raise PipelineError(_JSON_PLACE.sub(r", column \1", str(err)) + f"; {ADVICE}") from None
    if not isinstance(record, dict):
        raise PipelineError(f"{where}: a JSON {type(record).__name__}, not an object; {ADVICE}")
    missing = [k for k in ("context", "choices", "gold") if k not in record]
    if missing:
        raise PipelineError(f"{where}: no {' or '.join(repr(k) for k in missing)}; {ADVICE}")
    context, choices, gold = record["context"], record["choices"], record["gold"]
    if not isinstance(context, str):
        raise PipelineError(f"{where}: the context is a {_kind(context)}, not a string")
    if not isinstance(choices, list) or not choices:
        raise PipelineError(
            f"{where}: the choices are {'none' if choices == [] else 'a ' + _kind(choices)}; give a list of strings"
        )
    for i, c in enumerate(choices):
        if not isinstance(c, str):
            raise PipelineError(f"{where}: choice {i} is a {_kind(c)}, not a string")
        if not c:
            raise PipelineError(f"{where}: choice {i} is empty; each choice needs text to score")
    if type(gold) is not int or not 0 <= gold < len(choices):
        shown = repr(gold) if type(gold) in (int, float, bool) else f"a {_kind(gold)}"
        raise PipelineError(f"{where}: gold is {shown}; give the index of the right choice, 0 to {len(choices) - 1}")
    for what, text in (("the context", context), *((f"choice {i}", c) for i, c in enumerate(choices))):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise PipelineError(f"{where}: {what} holds a lone surrogate, which is not Unicode text") from None
    group = None
    if group_by is not None:
        group = record.get(group_by)
        if isinstance(group, (bool, dict, list)) or group is None:
            raise PipelineError(f"{where}: no string or number at {group_by!r} (--group-by) to group the item by")
        group = str(group)
    return Item(context, tuple(choices), gold, n, group)


def _kind(value) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def split_pair(context: str, choice: str) -> tuple[str, str]:
    """lm-evaluation-harness's move of the context's end whitespace onto the choice.

    >>> split_pair("Question: ", "yes")
    ('Question:', ' yes')
    """
    spaces = len(context) - len(context.rstrip())
    return (context[:-spaces], context[-spaces:] + choice) if spaces else (context, choice)


def encode_pair(tokenizer, context: str, choice: str, policy: dict, prefix: int | None) -> tuple[list[int], list[int]]:
    """(context ids, choice ids) as lm-evaluation-harness encodes them (the module's docstring);
    `prefix` stands for an empty context (None: there is none to give)."""
    context, choice = split_pair(context, choice)
    ctx = tokenizer.encode_for_model(context, **policy)  # [BOS] alone for an empty context, where there is one
    if not ctx:
        if prefix is None:
            raise PipelineError(
                "the context is empty and the tokenizer has no BOS or end-of-text token to read first; give a context"
            )
        return [prefix], tokenizer.encode(choice, **policy)
    whole = tokenizer.encode_for_model(context + choice, **policy)
    return ctx, whole[len(ctx) :]


@dataclass(frozen=True)
class Row:
    """One choice as the model reads it: `ids` (the window, input and last target), the choice's
    `n` last tokens scored; (item, choice) it belongs to."""

    ids: np.ndarray
    n: int
    item: int
    choice: int


def rows_of(items: Sequence[Item], tokenizer, context_length: int, policy: dict, prefix: int | None):
    """(rows, how many items lost the start of their context) for every choice of every item."""
    rows, truncated = [], set()
    for k, item in enumerate(items):
        for j, choice in enumerate(item.choices):
            try:
                ctx, cont = encode_pair(tokenizer, item.context, choice, policy, prefix)
            except (TokenizerError, PipelineError) as err:
                raise PipelineError(f"line {item.line}: {err}") from None
            if not cont:
                raise PipelineError(
                    f"line {item.line}: choice {j} adds no token after the context (its text merged into the "
                    "context's last token); end the context at a word boundary, and begin the choices with the space"
                )
            if len(cont) > context_length:
                raise PipelineError(
                    f"line {item.line}: choice {j} is {len(cont):,} tokens, more than the model's context "
                    f"({context_length:,}); it cannot be scored whole"
                )
            whole = ctx + cont
            if len(whole) > context_length + 1:
                truncated.add(k)
            rows.append(Row(np.asarray(whole[-(context_length + 1) :], dtype=np.int64), len(cont), k, j))
    return rows, len(truncated)


def row_logprobs(model, rows: Sequence[Row]) -> tuple[np.ndarray, np.ndarray]:
    """One forward pass over `rows` padded at the end -> (the sum of each row's scored tokens'
    log-probabilities (R,) float64, whether each of them was the argmax (R,) bool)."""
    xp = model.xp
    width = max(len(r.ids) for r in rows) - 1
    x = np.zeros((len(rows), width), dtype=np.int64)  # padding after the end: no earlier position reads it
    for i, r in enumerate(rows):
        x[i, : len(r.ids) - 1] = r.ids[:-1]
    # the scored positions: the last n inputs of each row predict its last n ids
    lengths = np.array([len(r.ids) - 1 for r in rows])
    counts = np.array([r.n for r in rows])
    which = np.repeat(np.arange(len(rows)), counts)
    pos = np.concatenate([np.arange(n - c, n) for n, c in zip(lengths, counts, strict=True)])
    targets = np.concatenate([r.ids[-r.n :] for r in rows])
    logits = model.forward(x)  # (R, width, V)
    picked = logits[xp.asarray(which), xp.asarray(pos)].astype(xp.float64)  # (K, V)
    peak = picked.max(axis=-1, keepdims=True)
    log_total = xp.log(xp.exp(picked - peak).sum(axis=-1)) + peak[:, 0]
    target_logit = xp.take_along_axis(picked, xp.asarray(targets)[:, None], axis=-1)[:, 0]
    logprob = as_host(target_logit - log_total)
    greedy = as_host(picked.argmax(axis=-1)) == targets
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.add.reduceat(logprob, starts), np.logical_and.reduceat(greedy, starts)


@dataclass
class Scores:
    """Each item's choices' log-likelihoods and whether each was the greedy continuation."""

    items: list[Item]
    loglikelihoods: list[np.ndarray] = field(default_factory=list)  # per item (choices,) float64
    greedy: list[np.ndarray] = field(default_factory=list)  # per item (choices,) bool
    tokens: list[np.ndarray] = field(default_factory=list)  # per item, each choice's scored tokens
    truncated: int = 0

    @property
    def n(self) -> int:
        return len(self.items)

    def picks(self) -> np.ndarray:
        """The choice with the highest log-likelihood, per item (the first of equals, as np.argmax)."""
        return np.array([int(np.argmax(ll)) for ll in self.loglikelihoods])

    def picks_norm(self) -> np.ndarray:
        """The choice with the highest log-likelihood per UTF-8 byte, per item."""
        return np.array(
            [
                int(np.argmax(ll / np.array([len(c.encode("utf-8")) for c in item.choices], dtype=np.float64)))
                for item, ll in zip(self.items, self.loglikelihoods, strict=True)
            ]
        )

    def golds(self) -> np.ndarray:
        return np.array([item.gold for item in self.items])

    @property
    def acc(self) -> float:
        return self.figures()["acc"]

    @property
    def acc_norm(self) -> float:
        return self.figures()["acc_norm"]

    def figures(self, among: np.ndarray | None = None) -> dict:
        """acc, acc_norm (each with lm-evaluation-harness's standard error, the sample's over
        sqrt(n)) and n, of all items or of those `among` marks."""
        among = np.ones(self.n, dtype=bool) if among is None else among
        right, right_norm = (self.picks() == self.golds())[among], (self.picks_norm() == self.golds())[among]
        return {
            "acc": float(np.mean(right)),
            "acc_stderr": _stderr(right),
            "acc_norm": float(np.mean(right_norm)),
            "acc_norm_stderr": _stderr(right_norm),
            "n": int(among.sum()),
        }

    def groups(self) -> dict[str, dict]:
        """`figures` per group, in the order the groups first appear (none without `group_by`)."""
        names = np.array([item.group for item in self.items], dtype=object)
        return {g: self.figures(names == g) for g in dict.fromkeys(item.group for item in self.items) if g is not None}

    def to_dict(self) -> dict:
        """`--json`'s object: the figures, the groups' where there are groups, then each item's
        line, gold, picks and per-choice figures."""
        picks, norms = self.picks(), self.picks_norm()
        groups = self.groups()
        return {
            **self.figures(),
            "choices": sum(len(item.choices) for item in self.items),
            "truncated": self.truncated,
            **({"groups": groups} if groups else {}),
            "items": [
                {
                    "line": item.line,
                    **({} if item.group is None else {"group": item.group}),
                    "gold": item.gold,
                    "pick": int(p),
                    "pick_norm": int(q),
                    "loglikelihoods": [float(v) for v in ll],
                    "is_greedy": [bool(g) for g in greedy],
                    "tokens": [int(t) for t in tokens],
                }
                for item, p, q, ll, greedy, tokens in zip(
                    self.items, picks, norms, self.loglikelihoods, self.greedy, self.tokens, strict=True
                )
            ],
        }


def _stderr(right: np.ndarray) -> float | None:
    """lm-evaluation-harness's `mean_stderr`: the sample's standard deviation (n - 1) over sqrt(n)."""
    n = len(right)
    if n < 2:
        return None
    mean = float(np.mean(right))
    return math.sqrt(sum((float(r) - mean) ** 2 for r in right) / (n - 1) / n)


@dataclass(frozen=True)
class Plan:
    """Every choice's row, how many items lost the start of their context, and the forward
    passes: each a list of row indices, longest rows first, as many as LOGITS_BYTES of logits
    allow. It depends on the items alone: every MPI rank makes the same (pipeline/eval_ranks.py)."""

    rows: list[Row]
    truncated: int
    batches: list[list[int]]


def plan(model, tokenizer, items: Sequence[Item], policy: dict | None = None) -> Plan:
    """The rows and passes that score `items` under the special-token `policy`."""
    from tokenkit.pipeline.run import eos_id

    keep_freed_memory()  # each pass frees and allocates the same activation-sized arrays: no page faults anew
    prefix = eos_id(tokenizer)  # what an empty context reads, where the tokenizer has no BOS
    rows, truncated = rows_of(items, tokenizer, model.config.context_length, policy or {}, prefix)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].ids))  # longest first, like lengths together
    batches, start = [], 0
    while start < len(order):
        width = len(rows[order[start]].ids) - 1  # the longest left: it sets the pass's width
        take = max(1, LOGITS_BYTES // (max(1, width) * model.config.vocab_size * 4))
        batches.append(order[start : start + take])
        start += take
    return Plan(rows, truncated, batches)


def assemble(items: Sequence[Item], plan: Plan, sums: np.ndarray, greedy: np.ndarray) -> Scores:
    """The Scores of `items` from every row's log-likelihood and greedy flag (in `plan.rows` order)."""
    scores = Scores(list(items), truncated=plan.truncated)
    at = 0
    for item in items:
        k = len(item.choices)
        scores.loglikelihoods.append(sums[at : at + k])
        scores.greedy.append(greedy[at : at + k])
        scores.tokens.append(np.array([r.n for r in plan.rows[at : at + k]]))
        at += k
    return scores


def score_items(
    model,
    tokenizer,
    items: Sequence[Item],
    policy: dict | None = None,
    *,
    progress: Callable[[int], None] = lambda n: None,
) -> Scores:
    """Every choice of every item scored (the module's docstring) under the special-token
    `policy` (`encode`'s arguments); `progress(n)` is told the rows as each pass ends."""
    passes = plan(model, tokenizer, items, policy)
    sums = np.zeros(len(passes.rows), dtype=np.float64)
    greedy = np.zeros(len(passes.rows), dtype=bool)
    for batch in passes.batches:
        sums[batch], greedy[batch] = row_logprobs(model, [passes.rows[i] for i in batch])
        progress(len(batch))
    return assemble(items, passes, sums, greedy)
