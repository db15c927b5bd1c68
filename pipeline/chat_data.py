"""Conversations as fine-tuning data: rendered with the chat template, packed into rows, batched.

A `tk train-model --chat DATA.jsonl` run reads its conversations (`bpe.conversations`: one JSON
object per line, each mistake one line naming its line number) and renders each with tk's chat
template (`bpe.chat_template.render`: ids and the mask of the tokens that count, the assistant's
content and its `<|end|>`). Each conversation then goes whole into a row of T + 1 tokens, T the
model's context (a row gives T inputs and their T targets): in file order, into the current row
while it fits, else into a new one (next-fit packing); the rest of a row is padding (the END
token, counting nothing). A target counts when the mask says so, else it is IGNORE
(`transformer.loss`): the loss is the mean over the assistant's tokens alone. Conversations in one
row are not hidden from each other (no attention mask; as nanoGPT's concatenated documents): a
later one may read an earlier one, which does not change what the loss counts.

**A conversation longer than a row is refused**, in one line naming its file, line and length,
never cut: a cut would train on an answer without its question or on half an answer, and
silently; the fix (shorten it, split it, drop it) is the user's. So no turn is ever cut.

The held-out conversations are `--val FILE`'s, or the last `val_fraction` of the file's
conversations (at least one each side), packed apart. Training batches are rows drawn with
replacement by the run's generator (`rng.integers` over the rows, the same PCG64 state a
pretraining run checkpoints: `data.rng_to_array`), so a resumed run draws the same rows. An
evaluation reads the first `eval_batches x batch_size` held-out rows once each, in order (the
last batch may be shorter), and its loss is the mean over every counted target of them.

Bounds: the files are bpe.conversations' (a regular file, bounded lines, bounded parse), the
rows are held in memory as the tokenizer's id dtype with a bool mask.

What it deliberately does not do: read the conversations or render them (bpe), grow the model
or its tokenizer (pipeline/chat_start.py), train (pipeline/train.py), or cache the packed rows
on disk (they are rebuilt from the file, checked by its fingerprint, on resume and on each MPI
rank).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit.bpe import TokenizerError
from tokenkit.bpe.chat_template import END, render
from tokenkit.bpe.conversations import MAX_FILE_BYTES, WHAT, iter_conversations
from tokenkit.common import readfile
from tokenkit.common.errors import FileError
from tokenkit.pipeline import data
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.loss import IGNORE

CHAT_KEY = "chat"  # a run's data record holds it when the run fine-tunes on conversations
PACKING = "next-fit"


@dataclass(frozen=True)
class ChatSpec:
    """What a fine-tuning run reads: `path` the conversations, `val` the held-out ones (None: the
    last val_fraction of `path`'s)."""

    path: str
    val: str | None = None

    def describe(self, val: bool = False) -> str:
        return (self.val or "") if val else self.path


@dataclass(frozen=True)
class Packed:
    """Rows of packed conversations: `ids` (R, T + 1) in the tokenizer's id dtype, `mask` (R, T + 1)
    bool (True: the token counts as a target), `counted` (R,) int64 the targets that count in
    each row (mask[:, 1:]), `conversations` how many went in."""

    ids: np.ndarray
    mask: np.ndarray
    counted: np.ndarray
    conversations: int

    def __len__(self) -> int:
        return len(self.ids)


def file_fingerprint(path: str | Path) -> str:
    """sha256 of a conversations file's bytes (a regular file of at most MAX_FILE_BYTES)."""
    digest = hashlib.sha256()
    with readfile.open_regular(path, MAX_FILE_BYTES, WHAT) as (f, _):
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def rendered(path: str | Path, tokenizer, context_length: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, mask) of each conversation of `path`, in order; PipelineError naming the file and
    line for a mistake in it or a conversation longer than a row (context_length + 1 tokens)."""
    row = context_length + 1
    try:
        for conversation in iter_conversations(path):
            r = render(tokenizer, conversation)
            if len(r.ids) > row:
                raise PipelineError(
                    f"{path}:{conversation.line}: the conversation is {len(r.ids):,} tokens in the chat template, "
                    f"more than the {row:,} a row holds (the model's context of {context_length:,} tokens, plus one); "
                    "conversations are never cut: shorten or split it, or drop the line"
                )
            yield r.ids, r.mask
    except (TokenizerError, FileError) as err:
        raise PipelineError(str(err)) from None


def pack(conversations: list[tuple[np.ndarray, np.ndarray]], context_length: int, pad: int, dtype) -> Packed:
    """Next-fit packing (see the module docstring) of (ids, mask) pairs, each at most
    context_length + 1 tokens, into rows of context_length + 1; `pad` fills the rest of a row.

    >>> a, b = (np.array([1, 2, 3]), np.array([0, 1, 1], bool)), (np.array([4, 5]), np.array([0, 1], bool))
    >>> p = pack([a, b], 3, 9, np.uint16)
    >>> p.ids.tolist(), p.mask.astype(int).tolist(), p.counted.tolist()
    ([[1, 2, 3, 9], [4, 5, 9, 9]], [[0, 1, 1, 0], [0, 1, 0, 0]], [2, 1])
    """
    row = context_length + 1
    starts, used = [], row  # the row each conversation starts in, and where
    for ids, _ in conversations:
        if used + len(ids) > row:
            starts.append((len(starts) and starts[-1][0] + 1, 0))
            used = 0
        else:
            starts.append((starts[-1][0], used))
        used += len(ids)
    n_rows = starts[-1][0] + 1 if starts else 0
    out = np.full((n_rows, row), pad, dtype=dtype)
    mask = np.zeros((n_rows, row), dtype=bool)
    for (r, at), (ids, m) in zip(starts, conversations, strict=True):
        out[r, at : at + len(ids)] = ids
        mask[r, at : at + len(ids)] = m
    counted = mask[:, 1:].sum(axis=1, dtype=np.int64)
    return Packed(out, mask, counted, len(conversations))


def get_batch(packed: Packed, batch_size: int, rng: np.random.Generator, rows: slice | np.ndarray | None = None):
    """x (B, T) int64, y (B, T) int64 with IGNORE where a target does not count, and the number of
    targets that count in the whole batch: `batch_size` rows drawn with replacement. With `rows`
    (a slice or row indices), only those rows of the batch are returned (an MPI rank's share); the count is still the
    whole batch's, and the generator draws every row, so every rank stays on the same sequence."""
    picks = rng.integers(0, len(packed), size=batch_size)
    counted = int(packed.counted[picks].sum())
    if rows is not None:
        picks = picks[rows]
    return (*_pair(packed, picks), counted)


def _pair(packed: Packed, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(packed.ids[picks], dtype=np.int64)
    return ids[:, :-1], np.where(packed.mask[picks, 1:], ids[:, 1:], IGNORE)


@dataclass(frozen=True, eq=False)
class EvalRows:
    """The held-out rows an evaluation reads: the first `n_rows`, in batches of `batch_size`
    (the last maybe shorter). Iterating gives (x, y, the batch's rows, its counted targets), x
    and y cut to `local_rows(the batch's rows)`: the executor's `local_rows` (all of them in one
    process, an MPI rank's share under mpirun)."""

    packed: Packed
    n_rows: int
    batch_size: int
    local_rows: Callable[[int], slice]

    def batches(self) -> Iterator[tuple[np.ndarray, np.ndarray, int, int]]:
        for lo in range(0, self.n_rows, self.batch_size):
            picks = np.arange(lo, min(lo + self.batch_size, self.n_rows))
            counted = int(self.packed.counted[picks].sum())
            yield (*_pair(self.packed, picks[self.local_rows(len(picks))]), len(picks), counted)

    @property
    def counted(self) -> int:
        """Targets that count in every evaluated row."""
        return int(self.packed.counted[: self.n_rows].sum())


@dataclass
class ChatData:
    """A fine-tuning run's conversations, rendered and packed: `train` and `val` rows, the
    spec, the files' fingerprints and the tokenizer's. Plays the part of `data.TokenData` for
    `TrainingRun` (`split`, `key`, `pending`, `discard`)."""

    spec: ChatSpec
    train: Packed
    val: Packed
    fingerprint: str
    val_fingerprint: str | None
    tokenizer_fingerprint: str
    pending: dict = field(default_factory=dict)  # nothing is written before the run: nothing pending

    @classmethod
    def load(cls, spec: ChatSpec, tokenizer, context_length: int, val_fraction: float) -> ChatData:
        """Read, render and pack `spec`'s conversations for a model of `context_length`; every
        refusal (a bad line, a conversation longer than a row, too few to hold some out) is one
        PipelineError before anything is written."""
        pad = tokenizer.special_tokens[END]
        before = {path: file_fingerprint(path) for path in (spec.path, spec.val) if path is not None}
        train = list(rendered(spec.path, tokenizer, context_length))
        if not train:
            raise PipelineError(f'{spec.path} holds no conversation; each line is one, {{"messages": [...]}}')
        if spec.val is not None:
            val = list(rendered(spec.val, tokenizer, context_length))
            if not val:
                raise PipelineError(f"--val {spec.val} holds no conversation; give held-out conversations")
        elif len(train) < 2:
            raise PipelineError(
                f"{spec.path} holds 1 conversation; fine-tuning holds some out to validate on, so it needs at "
                "least 2 (or give --val FILE)"
            )
        else:
            n_val = min(max(1, round(len(train) * val_fraction)), len(train) - 1)
            train, val = train[:-n_val], train[-n_val:]
        for path, digest in before.items():  # the fingerprint a run records is of the bytes it read
            if file_fingerprint(path) != digest:
                raise PipelineError(f"{path} changed while it was read; run the command again once it is written")
        dtype = tokenizer.ids_dtype
        return cls(
            spec,
            pack(train, context_length, pad, dtype),
            pack(val, context_length, pad, dtype),
            before[spec.path],
            before.get(spec.val),
            tokenizer.fingerprint(),
        )

    def split(self, val_fraction: float, context_length: int) -> tuple[Packed, Packed]:
        """(train, val) rows: made when the conversations were read (`load`)."""
        return self.train, self.val

    def key(self) -> dict[str, Any]:
        """What the rows depend on; a run records it, and a resumed run or an MPI rank checks it."""
        return {
            "chat_fingerprint": self.fingerprint,
            "val_fingerprint": self.val_fingerprint,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
        }

    def record(self) -> dict[str, Any]:
        """The run's data record (train_state.safetensors), as `TrainingRun.data_record` writes it."""
        spec = {"path": self.spec.path, **({"val": self.spec.val} if self.spec.val is not None else {})}
        return {
            CHAT_KEY: spec,
            **self.key(),
            "packing": PACKING,
            "n_conversations": self.train.conversations,
            "n_val_conversations": self.val.conversations,
            "n_rows": len(self.train),
            "n_val_rows": len(self.val),
            "n_counted": int(self.train.counted.sum()),
        }

    def discard(self) -> None:
        """Nothing to remove: a fine-tuning run writes no data files."""

    def eval_rows(self, n_batches: int, batch_size: int, local_rows: Callable[[int], slice]) -> EvalRows:
        return EvalRows(self.val, min(len(self.val), n_batches * batch_size), batch_size, local_rows)

    def unigram_baseline(self, eval_rows: EvalRows, vocab_size: int) -> float:
        """Cross-entropy (nats per counted target) on the evaluated rows' counted targets of the
        training rows' counted targets' frequencies (add-one smoothed): `data.unigram_baseline`
        on the tokens the loss counts."""
        train = self.train.ids[:, 1:][self.train.mask[:, 1:]]
        val = self.val.ids[: eval_rows.n_rows, 1:][self.val.mask[: eval_rows.n_rows, 1:]]
        return data.unigram_baseline(train, val, vocab_size)

    def val_bytes(self, eval_rows: EvalRows, lengths: np.ndarray) -> int:
        """The bytes of the evaluated rows' counted targets (for bits per byte, pipeline/val_bytes.py)."""
        val = self.val.ids[: eval_rows.n_rows, 1:][self.val.mask[: eval_rows.n_rows, 1:]]
        return int(lengths[np.asarray(val, dtype=np.int64)].sum())


def evaluate(model, rows: EvalRows) -> float:
    """The mean loss over every counted target of the evaluated rows (each batch's mean weighted
    by its counted targets), on every rank (each computes its rows)."""
    total, counted = 0.0, 0
    for x, y, batch_rows, n in rows.batches():
        total += model.loss(x, y, batch_rows=batch_rows, counted=n) * n
        counted += n
    return total / counted


def spec_from_record(record: Mapping[str, Any], where: str) -> ChatSpec:
    """The ChatSpec a run recorded (`ChatData.record`); PipelineError when it is not one."""
    value = record.get(CHAT_KEY)
    ok = isinstance(value, dict) and isinstance(value.get("path"), str)
    if not ok or not isinstance(value.get("val"), (str, type(None))):
        raise PipelineError(f"{where}: its record of the conversations it fine-tunes on is damaged")
    return ChatSpec(value["path"], value.get("val"))
