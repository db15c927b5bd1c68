"""A model's loss on held-out text, in units that compare across tokenizers (`tk eval -m`).

Three figures of one sum, the cross-entropy of every scored token:
- loss: nats per token, the mean (what training reports, in its own vocabulary's tokens);
- bits per byte: the summed losses in bits over the texts' UTF-8 bytes. A vocabulary of longer
  tokens has fewer, harder tokens; per byte, two tokenizers' models compare (nanochat and
  modded-nanogpt report it);
- perplexity: exp(loss).

Texts longer than the context are scored with a sliding window, as transformers' perplexity guide
does it: windows of `context` tokens begin every `stride` tokens, and each scores only the tokens
no earlier window scored, each predicted from the window's tokens before it. With a stride below
the context every token of a document after its first is scored once, with at least
`context - stride` tokens before it; a smaller stride gives more, at the cost of more forward
passes. A stride equal to the context gives disjoint windows, and then each window's first token,
which nothing in its window precedes, is not scored (as in the guide). Each document is scored
apart, so no prediction reads across a boundary.

How: `passes` groups the windows of one width into forward passes of up to LOGITS_BYTES of
logits, decided by the documents alone; `window_nats` runs them (all, or one MPI rank's share:
pipeline/eval_ranks.py), unembedding only the positions each window scores (`GPT.logits_at`:
half of them at the default stride), and keeps each window's sum; `summed` adds the windows with math.fsum,
whose correctly rounded total is the same bits whatever the order or the split.

What it does not do: read files or flags (cli/eval_commands.py does, through bpe.corpus), or
train (the validation loss of training is pipeline/train.py's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.runtime import keep_freed_memory

LOGITS_BYTES = 256 << 20  # a forward pass's logits at most, (windows, T, V) float32: the memory scoring takes


@dataclass(frozen=True)
class Window:
    """One forward pass over a document's ids[begin:end - 1], predicting ids[begin + 1:end]; the
    predictions of ids[first:end] are scored (the others were scored by an earlier window)."""

    begin: int
    end: int
    first: int


def windows(n_ids: int, context: int, stride: int) -> list[Window]:
    """The sliding windows over `n_ids` ids, transformers' perplexity guide's loop.

    >>> [(w.begin, w.end, w.first) for w in windows(10, 4, 2)]
    [(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    >>> [(w.begin, w.end, w.first) for w in windows(3, 8, 4)]
    [(0, 3, 1)]
    """
    if not 1 <= stride <= context:
        raise PipelineError(f"the stride must be from 1 to the context ({context}), got {stride}")
    out, prev_end = [], 0
    for begin in range(0, n_ids, stride):
        end = min(begin + context, n_ids)
        first = max(prev_end, begin + 1)  # the window's own first token is predicted by nothing in it
        if first < end:
            out.append(Window(begin, end, first))
        prev_end = end
        if end == n_ids:
            break
    return out


def default_stride(context: int) -> int:
    """Half the context: each token scored after at least half a window of text."""
    return max(1, context // 2)


def row_losses(xp, logits, targets) -> np.ndarray:
    """logits (K, V), targets (K,) on the model's device -> each row's cross-entropy in nats (K,),
    float64 on the host: log-sum-exp minus the target's logit, the sums in float64. `logits` is
    overwritten (exponentiated in place: no second array of its size)."""
    picked = xp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0].astype(xp.float64)
    peak = logits.max(axis=-1, keepdims=True)
    logits -= peak
    xp.exp(logits, out=logits)
    log_total = xp.log(logits.sum(axis=-1, dtype=xp.float64)) + peak[:, 0].astype(xp.float64)
    return as_host(log_total - picked)


@dataclass
class Score:
    """Summed cross-entropy of `tokens` scored tokens of `documents` texts holding `bytes` bytes."""

    nats: float = 0.0
    tokens: int = 0
    bytes: int = 0
    documents: int = 0
    skipped: int = 0  # documents of fewer than two tokens: nothing to predict

    @property
    def loss(self) -> float:
        return self.nats / self.tokens

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "bytes": self.bytes,
            "loss": self.loss,
            "bits_per_byte": self.bits_per_byte,
            "perplexity": self.perplexity,
            "documents": self.documents,
            "skipped_documents": self.skipped,
        }


Group = list[tuple[np.ndarray, Window]]  # one forward pass: windows of one width, with their documents' ids


def passes(
    documents: Iterable[tuple[Sequence[int], int]],
    context: int,
    stride: int,
    per_pass: int,
    score: Score,
    progress: Callable[[int], None] = lambda n: None,
) -> Iterator[Group]:
    """The forward passes that score `documents`, in order: windows of one width together,
    `per_pass` at most, a pass yielded as soon as it is full, the part-full ones at the end. Which
    windows share a pass depends on the documents alone, so every process that reads the same
    documents makes the same passes. The counts (tokens, bytes, documents, skipped) are added to
    `score` as the documents are taken in; `progress(n)` is told each document's bytes."""
    waiting: dict[int, Group] = {}
    for ids, n_bytes in documents:
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) < 2:
            score.skipped += 1
            continue
        for w in windows(len(ids), context, stride):
            group = waiting.setdefault(w.end - w.begin, [])
            group.append((ids, w))
            score.tokens += w.end - w.first
            if len(group) == per_pass:
                yield group
                waiting[w.end - w.begin] = []
        score.documents += 1
        score.bytes += n_bytes
        progress(n_bytes)
    for group in waiting.values():
        if group:
            yield group


def pass_nats(model, group: Group) -> np.ndarray:
    """One forward pass over `group` -> each window's summed nats of its scored tokens (len(group),)
    float64. Only the scored positions are unembedded: with the default stride, half the window."""
    xp = model.xp
    x = np.stack([ids[w.begin : w.end - 1] for ids, w in group])
    counts = np.array([w.end - w.first for _, w in group])
    rows = np.repeat(np.arange(len(group)), counts)
    positions = np.concatenate([np.arange(w.first - w.begin - 1, w.end - w.begin - 1) for _, w in group])
    targets = np.concatenate([ids[w.first : w.end] for ids, w in group])
    logits = model.logits_at(x, xp.asarray(rows), xp.asarray(positions))  # (scored, V)
    losses = row_losses(xp, logits, xp.asarray(targets))
    return np.add.reduceat(losses, np.concatenate([[0], np.cumsum(counts)[:-1]]))


def window_nats(
    model,
    documents: Iterable[tuple[Sequence[int], int]],
    *,
    stride: int | None = None,
    progress: Callable[[int], None] = lambda n: None,
    share: tuple[int, int] = (0, 1),
) -> tuple[np.ndarray, Score]:
    """(each window's nats, float64, for the passes of this `share`, in order; the Score's counts,
    its nats not yet summed). `share` (k, n): only every n-th pass from the k-th is run, as one of
    n MPI ranks does (pipeline/eval_ranks.py); the counts are the whole corpus's on every share.
    A one-line PipelineError when there is nothing to score, on every share alike."""
    context = model.config.context_length
    stride = default_stride(context) if stride is None else stride
    per_pass = max(1, LOGITS_BYTES // (context * model.config.vocab_size * 4))
    k, n = share
    keep_freed_memory()  # each pass frees and allocates the same activation-sized arrays: no page faults anew
    score, parts = Score(), []
    for i, group in enumerate(passes(documents, context, stride, per_pass, score, progress)):
        if i % n == k:
            parts.append(pass_nats(model, group))
    if score.tokens == 0:
        raise PipelineError(
            "nothing to score: every document is shorter than two tokens; give longer texts"
            if score.skipped
            else "the corpus is empty; give at least one file or text with some content"
        )
    return np.concatenate([np.zeros(0), *parts]), score


def summed(score: Score, parts: Iterable[np.ndarray]) -> Score:
    """`score` with its nats, the sum of every window's (`parts`: the shares' `window_nats`).
    math.fsum rounds the exact sum once, so the total is the same bits in any order and for
    any split of the windows into shares: one process and N ranks agree exactly."""
    score.nats = math.fsum(float(v) for part in parts for v in part.tolist())
    return score


def score_documents(
    model,
    documents: Iterable[tuple[Sequence[int], int]],
    *,
    stride: int | None = None,
    progress: Callable[[int], None] = lambda n: None,
) -> Score:
    """Score each (ids, UTF-8 bytes of its text) document; `stride` defaults to half the context.
    `progress(n)` is told each document's bytes as it is taken in."""
    nats, score = window_nats(model, documents, stride=stride, progress=progress)
    return summed(score, [nats])


def score_texts(model, tokenizer, texts: Iterable[bytes], policy: dict, **options) -> Score:
    """`score_documents` of each text as the model reads it (`Tokenizer.encode_for_model`, under
    the special-token `policy`)."""
    return score_documents(model, ((tokenizer.encode_for_model(t, **policy), len(t)) for t in texts), **options)
