"""Corpus -> token-id file (memory-mapped) -> (B, T) training batches from a seeded generator.

The corpus is encoded once with the tokenizer's `encode_file` into `tokens.npy` beside the run
(uint16 when the vocabulary fits, else uint32) and opened with `np.load(mmap_mode="r")`, so a
corpus larger than memory still trains: a batch reads only its windows. `tokens.json` records
what the file was made from (sha256 of the corpus bytes, the tokenizer's fingerprint); when
both still match, the file is reused instead of encoding again.

The last `val_fraction` of the tokens is the validation split. Training batches are random
windows drawn by a `np.random.Generator` whose whole state fits in a few uint64 words
(`rng_to_array` / `rng_from_array`), so a checkpoint can resume the exact batch sequence.

This module writes no file contents itself (`bpe` encodes into the file, `pipeline.checkpoint`
writes the JSON); it only renames finished ids into place.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common import atomic
from pipeline import checkpoint
from pipeline.errors import PipelineError

_MASK64 = (1 << 64) - 1


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB pieces (memory stays flat for any size)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def check_corpus(corpus: str | os.PathLike) -> Path:
    """The corpus path, or a one-line PipelineError when it cannot be trained on."""
    path = Path(corpus)
    if not path.exists():
        raise PipelineError(f"corpus not found: {path}")
    if path.is_dir():
        raise PipelineError(f"corpus {path} is a directory; give a text file")
    if path.stat().st_size == 0:
        raise PipelineError(f"corpus {path} is empty; give a text file with some text")
    return path


# --- the token-id file and its cache ---------------------------------------------------------


@dataclass
class TokenData:
    """The encoded corpus: `ids` is a read-only memmap (N,) of the whole corpus.

    `pending` is the temp file holding freshly encoded ids until `commit_tokens` renames it to
    tokens.npy (a run commits only once it is known to start); None when nothing is pending.
    """

    ids: np.ndarray
    vocab_size: int
    corpus: str
    corpus_sha256: str
    tokenizer_fingerprint: str
    reused: bool  # True when the cached tokens.npy was used as is
    pending: Path | None = None

    def split(self, val_fraction: float, context_length: int) -> tuple[np.ndarray, np.ndarray]:
        """(train, val) views of the memmap: val is the last `val_fraction` of the tokens."""
        n_train = split_point(len(self.ids), val_fraction, context_length)
        return self.ids[:n_train], self.ids[n_train:]

    def key(self) -> dict[str, str]:
        """What the ids depend on; a run records it to detect a changed corpus or tokenizer."""
        return {"corpus_sha256": self.corpus_sha256, "tokenizer_fingerprint": self.tokenizer_fingerprint}

    def discard(self) -> None:
        """Remove the pending temp file (the run did not start)."""
        if self.pending is not None:
            self.pending.unlink(missing_ok=True)
            self.pending = None


def split_point(n_tokens: int, val_fraction: float, context_length: int) -> int:
    """Index where validation starts: the last `val_fraction` of `n_tokens`.

    Both parts must hold at least one window of `context_length + 1` tokens.

    >>> split_point(1000, 0.1, 8)
    900
    """
    if not 0.0 < val_fraction < 1.0:
        raise PipelineError(f"val fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    n_val = int(round(n_tokens * val_fraction))
    n_train = n_tokens - n_val
    need = context_length + 1
    if n_train < need or n_val < need:
        raise PipelineError(
            f"corpus too small: {n_tokens} tokens give {n_train} train / {n_val} validation tokens, "
            f"but each split needs at least {need} (context {context_length} + 1); use a bigger corpus, "
            "a smaller --context-length or another --val-fraction"
        )
    return n_train


def cached_tokens(run_dir: str | os.PathLike, key: dict[str, str], dtype) -> np.ndarray | None:
    """run_dir/tokens.npy memory-mapped when tokens.json says it was made with `key`, else None."""
    run_dir = Path(run_dir)
    tokens_path = run_dir / checkpoint.TOKENS_FILE
    cached = checkpoint.read_json(run_dir / checkpoint.TOKENS_META_FILE)
    if not (isinstance(cached, dict) and all(cached.get(k) == v for k, v in key.items()) and tokens_path.exists()):
        return None
    ids = _open_ids(tokens_path)
    if ids is None or ids.dtype != dtype or len(ids) != cached.get("n_tokens"):
        return None
    return ids


def prepare_tokens(
    corpus: str | os.PathLike,
    tokenizer,
    run_dir: str | os.PathLike,
    *,
    quiet: bool = False,
    corpus_sha256: str | None = None,
    commit: bool = True,
) -> TokenData:
    """Encode `corpus` for `run_dir/tokens.npy`, or reuse it when corpus and tokenizer are unchanged.

    Returns the ids memory-mapped; the split is made later (`split_point`) because it depends
    on training settings, not on the encoding. With `commit=False` fresh ids stay in a temp
    file beside tokens.npy (`TokenData.pending`) until `commit_tokens`, so that nothing in the
    run directory is replaced before the run is known to start.
    """
    corpus = check_corpus(corpus)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    digest = corpus_sha256 or sha256_file(corpus)
    fingerprint = tokenizer.fingerprint()
    dtype = np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
    key = {"corpus_sha256": digest, "tokenizer_fingerprint": fingerprint}
    ids = cached_tokens(run_dir, key, dtype)
    tokens = TokenData(
        ids=ids, vocab_size=tokenizer.vocab_size, corpus=str(corpus), corpus_sha256=digest,
        tokenizer_fingerprint=fingerprint, reused=ids is not None,
    )
    if ids is None:
        tmp = atomic.temp_path(run_dir / checkpoint.TOKENS_FILE)
        try:
            tokenizer.encode_file(corpus, out_path=tmp, quiet=quiet)
            tokens.ids = _open_ids(tmp)
            if tokens.ids is None:
                raise PipelineError(f"encoding {corpus} wrote an unreadable {tmp}")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tokens.pending = tmp
        if commit:
            commit_tokens(tokens, run_dir)
    if len(tokens.ids) == 0:
        tokens.discard()
        raise PipelineError(f"corpus {corpus} encodes to no tokens")
    return tokens


def commit_tokens(tokens: TokenData, run_dir: str | os.PathLike) -> None:
    """Rename pending ids to run_dir/tokens.npy and record what they were made from in tokens.json."""
    if tokens.pending is None:
        return
    run_dir = Path(run_dir)
    try:
        atomic.commit(tokens.pending, run_dir / checkpoint.TOKENS_FILE)
    except OSError as err:
        tokens.discard()
        raise PipelineError(str(atomic.write_error(run_dir / checkpoint.TOKENS_FILE, err))) from None
    tokens.pending = None
    checkpoint.write_json(
        run_dir / checkpoint.TOKENS_META_FILE,
        {**tokens.key(), "corpus": tokens.corpus, "n_tokens": int(len(tokens.ids)), "dtype": tokens.ids.dtype.name},
    )


def open_tokens(run_dir: str | os.PathLike, tokenizer, corpus: str, key: dict[str, str], n_tokens: int) -> TokenData:
    """run_dir/tokens.npy as another process committed it (an MPI rank joining rank 0's run),
    memory-mapped; a one-line PipelineError when this process cannot see it whole."""
    path = Path(run_dir) / checkpoint.TOKENS_FILE
    ids = _open_ids(path)
    if ids is None or len(ids) != n_tokens:
        seen = "cannot read it" if ids is None else f"sees {len(ids):,} tokens instead of {n_tokens:,}"
        raise PipelineError(f"{path}: this process {seen}; every rank needs the run directory on a filesystem they all see")
    return TokenData(ids=ids, vocab_size=tokenizer.vocab_size, corpus=corpus, corpus_sha256=key["corpus_sha256"],
                     tokenizer_fingerprint=key["tokenizer_fingerprint"], reused=True)


def _open_ids(path: Path) -> np.ndarray | None:
    try:
        ids = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if ids.ndim != 1 or ids.dtype not in (np.uint16, np.uint32):
        return None
    return ids


def unigram_baseline(train: np.ndarray, val: np.ndarray, vocab_size: int, chunk: int = 1 << 24) -> float:
    """Cross-entropy (nats/token) on `val` of the train split's token frequencies (add-one smoothed).

    The loss of a model that ignores context entirely: a trained model must beat it to have
    learned anything from the order of tokens. Counted in pieces so a memmap stays on disk.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(train), chunk):
        counts += np.bincount(np.asarray(train[i : i + chunk]), minlength=vocab_size)[:vocab_size]
    log_p = np.log((counts + 1) / (counts.sum() + vocab_size))
    total = 0.0
    for i in range(0, len(val), chunk):
        total += float(log_p[np.asarray(val[i : i + chunk])].sum())
    return -total / len(val)


# --- random windows --------------------------------------------------------------------------


def rng_to_array(rng: np.random.Generator) -> np.ndarray:
    """The generator's full state as 6 uint64 words (PCG64: 128-bit state and increment, buffered int).

    >>> rng = np.random.default_rng(1); _ = rng.random()
    >>> copy = rng_from_array(rng_to_array(rng)); copy.random() == rng.random()
    True
    """
    st = rng.bit_generator.state
    if st["bit_generator"] != "PCG64":
        raise PipelineError(f"cannot checkpoint a {st['bit_generator']} generator; the pipeline uses PCG64")
    s, inc = st["state"]["state"], st["state"]["inc"]
    return np.array(
        [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, st["has_uint32"], st["uinteger"]], dtype=np.uint64
    )


def rng_from_array(words: np.ndarray) -> np.random.Generator:
    """Inverse of `rng_to_array`."""
    w = [int(x) for x in np.asarray(words, dtype=np.uint64)]
    if len(w) != 6:
        raise PipelineError(f"bad data generator state: expected 6 words, got {len(w)}")
    bit_gen = np.random.PCG64()
    bit_gen.state = {
        "bit_generator": "PCG64",
        "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
        "has_uint32": w[4],
        "uinteger": w[5],
    }
    return np.random.Generator(bit_gen)


def get_batch(ids: np.ndarray, batch_size: int, context_length: int, rng: np.random.Generator, rows: slice | None = None):
    """Random windows: x (B, T) int64 and y (B, T) = x shifted by one token.

    Window starts are uniform over every position that leaves room for T + 1 tokens. With
    `rows`, only those rows of the batch are read (an MPI rank's share): the generator still
    draws the whole batch's starts, so every rank stays on the same sequence.
    """
    starts = rng.integers(0, len(ids) - context_length, size=batch_size)
    if rows is not None:
        starts = starts[rows]
    windows = np.asarray(ids[starts[:, None] + np.arange(context_length + 1)], dtype=np.int64)  # (B, T+1)
    return windows[:, :-1], windows[:, 1:]


def eval_batches(ids: np.ndarray, n_batches: int, batch_size: int, context_length: int, seed: int, rows: slice | None = None):
    """The same `n_batches` validation batches every time (their own generator, seeded from `seed`).

    Fixed windows make successive evaluations comparable, and never drawing from the training
    generator keeps a resumed run's batches identical to an uninterrupted one.
    """
    rng = np.random.default_rng([seed, 0x5EED])
    return [get_batch(ids, batch_size, context_length, rng, rows) for _ in range(n_batches)]
