"""Corpus -> token-id files (memory-mapped) -> (B, T) training batches from a seeded generator.

A run's corpus (`pipeline.sources`: a `CorpusSpec`, opened as a `RunCorpus`) is encoded once
with the tokenizer into `tokens.npy` beside the run (the validation corpus into
`val_tokens.npy`; uint16 when the vocabulary fits, else uint32) and opened with
`np.load(mmap_mode="r")`, so a corpus larger than memory still trains: a batch reads only its
windows. `tokens.json` records what each file was made from (the corpus fingerprint, the
tokenizer's fingerprint, the eot token, the special-token policy); while they still match, a file is reused instead of
encoding again.

Without `val`, the last `val_fraction` of the tokens is the validation split. Training batches
are random windows drawn by a `np.random.Generator` whose whole state fits in a few uint64 words
(`rng_to_array` / `rng_from_array`), so a checkpoint can resume the exact batch sequence.

This module writes no file contents itself (`bpe` encodes into the files, `pipeline.checkpoint`
writes the JSON); it renames finished files (and the pending copies of streams) into place.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit.bpe import TokenizerError
from tokenkit.bpe import io as bpe_io
from tokenkit.common import atomic
from tokenkit.common.errors import FileError
from tokenkit.pipeline import checkpoint
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.sources import CorpusSpec, check_eot, open_corpus, remove_pending, store_streams

_MASK64 = (1 << 64) - 1
# What a token file's ids depend on: the fields of `TokenData.key()` and of a run's data record.
KEY_FIELDS = ("corpus_fingerprint", "val_fingerprint", "tokenizer_fingerprint", "eot", "specials")


def same_ids(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether ids made as `recorded` says (a `record_key`) are the ids `wanted` asks for: the same
    KEY_FIELDS, except that ids encoded under the refusing policy serve every policy. That
    encoding succeeded, so the text held no special-token text, and allowing it or reading it as
    text would change nothing (a --allow-special given for `tk pipeline --prompt` keeps the run).

    >>> key = {"corpus_fingerprint": "c", "eot": None, "specials": "refuse"}
    >>> same_ids(key, {**key, "specials": "allow"}), same_ids({**key, "specials": "allow"}, key)
    (True, False)
    """
    if recorded.get("specials") == "refuse":
        return all(recorded.get(k) == v for k, v in wanted.items() if k != "specials")
    return all(recorded.get(k) == v for k, v in wanted.items())


def record_key(record: Mapping[str, Any]) -> dict[str, Any]:
    """The KEY_FIELDS of a recorded data table (a run's, or a tokens.json entry); a v1 record's
    `corpus_sha256` is its fingerprint (for one plain file, the fingerprint is the sha256); a
    record without `specials` (made before the policy was recorded) refused such text."""
    key = {name: record.get(name) for name in KEY_FIELDS}
    if key["specials"] is None:
        key["specials"] = "refuse"
    if key["corpus_fingerprint"] is None and "corpus_sha256" in record:
        key["corpus_fingerprint"] = record["corpus_sha256"]
    return key


# --- the token-id files and their cache ------------------------------------------------------


@dataclass
class TokenData:
    """The encoded corpus: `ids` is a read-only memmap (N,) of the whole training corpus, and
    `val_ids` one of the validation corpus (None: the validation split is held out of `ids`).

    `pending` maps run files (token files; copies of streams, from `RunCorpus.pending`) to the
    temp files holding them until `commit_tokens` renames them into place (a run commits only
    once it is known to start).
    """

    ids: np.ndarray
    vocab_size: int
    spec: CorpusSpec
    corpus_fingerprint: str
    tokenizer_fingerprint: str
    reused: bool  # True when every cached token file was used as is
    val_ids: np.ndarray | None = None
    val_fingerprint: str | None = None
    pending: dict[str, Path] = field(default_factory=dict)

    @property
    def corpus(self) -> str:
        """The inputs, for messages."""
        return self.spec.describe()

    def split(self, val_fraction: float, context_length: int) -> tuple[np.ndarray, np.ndarray]:
        """(train, val) views: the validation corpus's ids, or the last `val_fraction` of the tokens."""
        if self.val_ids is None:
            n_train = split_point(len(self.ids), val_fraction, context_length)
            return self.ids[:n_train], self.ids[n_train:]
        need = context_length + 1
        if len(self.ids) < need or len(self.val_ids) < need:
            raise PipelineError(
                f"corpus too small: {len(self.ids)} train / {len(self.val_ids)} validation (--val) tokens, but each "
                f"needs at least {need} (context {context_length} + 1); "
                "use bigger corpora or a smaller --context-length"
            )
        return self.ids, self.val_ids

    def key(self) -> dict[str, Any]:
        """What the ids depend on; a run records it to detect a changed corpus or tokenizer."""
        return {
            "corpus_fingerprint": self.corpus_fingerprint,
            "val_fingerprint": self.val_fingerprint,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "eot": self.spec.eot,
            "specials": self.spec.specials,
        }

    def files(self) -> dict[str, dict[str, Any]]:
        """tokens.json's entry for each token file: what it was made from."""
        common = {
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "eot": self.spec.eot,
            "specials": self.spec.specials,
            **self.spec.reading(),
        }
        entries = {
            checkpoint.TOKENS_FILE: {
                **common,
                "inputs": list(self.spec.inputs),
                "corpus_fingerprint": self.corpus_fingerprint,
                "n_tokens": int(len(self.ids)),
                "dtype": self.ids.dtype.name,
            }
        }
        if self.val_ids is not None:
            entries[checkpoint.VAL_TOKENS_FILE] = {
                **common,
                "inputs": list(self.spec.val),
                "corpus_fingerprint": self.val_fingerprint,
                "n_tokens": int(len(self.val_ids)),
                "dtype": self.val_ids.dtype.name,
            }
        return entries

    def discard(self) -> None:
        """Remove the pending temp files (the run did not start)."""
        remove_pending(self.pending)


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


def _cache_entries(run_dir: Path) -> dict[str, dict[str, Any]]:
    """tokens.json as {file name: entry}; a v1 file (one flat entry for tokens.npy) read as such."""
    cached = checkpoint.read_json(run_dir / checkpoint.TOKENS_META_FILE)
    if not isinstance(cached, dict):
        return {}
    if "corpus_sha256" in cached:  # v1
        return {checkpoint.TOKENS_FILE: cached}
    return {name: entry for name, entry in cached.items() if isinstance(entry, dict)}


def cached_tokens(run_dir: str | os.PathLike, name: str, key: dict[str, Any], dtype) -> np.ndarray | None:
    """run_dir/NAME (tokens.npy, val_tokens.npy) memory-mapped when tokens.json says it was made
    with `key` (corpus_fingerprint, tokenizer_fingerprint, eot, specials), else None."""
    run_dir = Path(run_dir)
    entry = _cache_entries(run_dir).get(name)
    if entry is None or not same_ids(record_key(entry), key) or not (run_dir / name).exists():
        return None
    ids = _open_ids(run_dir / name)
    if ids is None or ids.dtype != dtype or len(ids) != entry.get("n_tokens"):
        return None
    return ids


def prepare_tokens(
    corpus,
    tokenizer,
    run_dir: str | os.PathLike,
    *,
    quiet: bool = False,
    commit: bool = True,
) -> TokenData:
    """Encode `corpus` (a RunCorpus, CorpusSpec or path) for `run_dir/tokens.npy` (and its
    validation corpus for `val_tokens.npy`), or reuse each file when its corpus, the tokenizer,
    the eot token and the special-token policy (`spec.specials`) are unchanged.

    Returns the ids memory-mapped; the split is made later (`TokenData.split`) because it depends
    on training settings, not on the encoding. With `commit=False` fresh ids stay in temp files
    beside the token files (`TokenData.pending`) until `commit_tokens`, so that nothing in the
    run directory is replaced before the run is known to start. Streams among the inputs are
    copied into the run directory first (`store_streams`); pending copies of streams are taken
    over from the corpus, to be committed or discarded with the ids.
    """
    rc = open_corpus(corpus)
    check_eot(tokenizer, rc.spec)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = tokenizer.fingerprint()
    dtype = np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
    rc = store_streams(rc, run_dir)
    spec = rc.spec
    tokens = TokenData(
        ids=None,
        vocab_size=tokenizer.vocab_size,
        spec=spec,
        corpus_fingerprint="",
        tokenizer_fingerprint=fingerprint,
        reused=True,
        pending=rc.pending,
    )
    rc.pending = {}  # the tokens' now: committed or discarded with the ids
    try:
        tokens.corpus_fingerprint, tokens.val_fingerprint = rc.fingerprint(), rc.val_fingerprint()
        parts = [(checkpoint.TOKENS_FILE, rc.train, tokens.corpus_fingerprint, "corpus")]
        if rc.val is not None:
            parts.append((checkpoint.VAL_TOKENS_FILE, rc.val, tokens.val_fingerprint, "validation corpus"))
        for name, source, digest, what in parts:
            key = {
                "corpus_fingerprint": digest,
                "tokenizer_fingerprint": fingerprint,
                "eot": spec.eot,
                "specials": spec.specials,
            }
            ids = cached_tokens(run_dir, name, key, dtype)
            if ids is None:
                tokens.reused = False
                tmp = atomic.temp_path(run_dir / name)
                tokens.pending[name] = tmp
                tokenizer.encode_file(
                    source, out_path=tmp, quiet=quiet, eot=spec.eot, for_model=True, **spec.encode_options()
                )
                ids = _open_ids(tmp)
                if ids is None:
                    raise PipelineError(f"encoding the {what} wrote an unreadable {tmp}")
            if len(ids) == 0:
                raise PipelineError(f"{what} {spec.describe(what != 'corpus')} encodes to no tokens")
            if name == checkpoint.TOKENS_FILE:
                tokens.ids = ids
            else:
                tokens.val_ids = ids
        if tokens.reused and spec.specials != "refuse":
            entries = _cache_entries(run_dir)
            if all(record_key(entries[name])["specials"] == "refuse" for name, *_ in parts):
                # ids made under the refusing policy (see same_ids) are recorded as such, so that the
                # run stays up to date for every policy, not only for the one given this time
                tokens.spec = replace(spec, specials="refuse")
    except BaseException:
        tokens.discard()
        raise
    if commit:
        commit_tokens(tokens, run_dir)
    return tokens


def commit_tokens(tokens: TokenData, run_dir: str | os.PathLike, *, into: str | os.PathLike | None = None) -> None:
    """Rename pending ids (and copies of streams) into place and record what every token file
    was made from in tokens.json.

    The entries of the files being replaced leave tokens.json first, so a crash between the
    renames and the final write leaves files that are merely not reused, never wrongly reused.
    `into`: where the files go instead of `run_dir` (a new run's staging, `rundir.NewRun`, whose
    files arrive together later); its tokens.json starts from run_dir's entries.
    """
    if not tokens.pending:
        return
    run_dir = Path(run_dir)
    dest = run_dir if into is None else Path(into)
    cached = _cache_entries(run_dir)
    entries = {name: entry for name, entry in cached.items() if name not in tokens.pending}
    if dest == run_dir and len(entries) < len(cached):
        checkpoint.write_json(run_dir / checkpoint.TOKENS_META_FILE, entries)
    for name, tmp in list(tokens.pending.items()):
        try:
            atomic.commit(tmp, dest / name)
        except OSError as err:
            tokens.discard()
            raise PipelineError(str(atomic.write_error(dest / name, err))) from None
        except FileError as err:  # a device, FIFO or socket where the file goes: left as it is
            tokens.discard()
            raise PipelineError(str(err)) from None
        del tokens.pending[name]
    entries.update(tokens.files())
    checkpoint.write_json(dest / checkpoint.TOKENS_META_FILE, entries)


def open_tokens(
    run_dir: str | os.PathLike,
    tokenizer,
    spec: Mapping[str, Any],
    key: dict[str, Any],
    n_tokens: int,
    n_val_tokens: int | None = None,
) -> TokenData:
    """run_dir's token files as another process committed them (an MPI rank joining rank 0's
    run; those of a run replacing another's are still in its staging directory), memory-mapped;
    a one-line PipelineError when this process cannot see them whole."""
    found = {}
    for name, n in ((checkpoint.TOKENS_FILE, n_tokens), (checkpoint.VAL_TOKENS_FILE, n_val_tokens)):
        if n is None:
            continue
        path = Path(run_dir) / checkpoint.STAGED_DIR / name
        if not path.exists():
            path = Path(run_dir) / name
        ids = _open_ids(path)
        if ids is None or len(ids) != n:
            seen = "cannot read it" if ids is None else f"sees {len(ids):,} tokens instead of {n:,}"
            raise PipelineError(
                f"{path}: this process {seen}; every rank needs the run directory on a filesystem they all see"
            )
        found[name] = ids
    return TokenData(
        ids=found[checkpoint.TOKENS_FILE],
        vocab_size=tokenizer.vocab_size,
        spec=CorpusSpec.from_record({"corpus": dict(spec)}),
        corpus_fingerprint=key["corpus_fingerprint"],
        tokenizer_fingerprint=key["tokenizer_fingerprint"],
        reused=True,
        val_ids=found.get(checkpoint.VAL_TOKENS_FILE),
        val_fingerprint=key.get("val_fingerprint"),
    )


def _open_ids(path: Path) -> np.ndarray | None:
    """A token file memory-mapped (`bpe.io.load_ids`: header checked, regular file), or None when
    it is damaged or not the kind tk writes: the tokens are then encoded again."""
    try:
        ids = bpe_io.load_ids(path)
    except TokenizerError:
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
    return np.array([s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, st["has_uint32"], st["uinteger"]], dtype=np.uint64)


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


def get_batch(
    ids: np.ndarray,
    batch_size: int,
    context_length: int,
    rng: np.random.Generator,
    rows: slice | np.ndarray | None = None,
):
    """Random windows: x (B, T) int64 and y (B, T) = x shifted by one token.

    Window starts are uniform over every position that leaves room for T + 1 tokens. With
    `rows` (a slice, or row indices: a rank's rows of each micro-batch), only those rows of the
    batch are read (an MPI rank's share): the generator still draws the whole batch's starts, so
    every rank stays on the same sequence.
    """
    starts = rng.integers(0, len(ids) - context_length, size=batch_size)
    if rows is not None:
        starts = starts[rows]
    windows = np.asarray(ids[starts[:, None] + np.arange(context_length + 1)], dtype=np.int64)  # (B, T+1)
    return windows[:, :-1], windows[:, 1:]


def eval_batches(
    ids: np.ndarray, n_batches: int, batch_size: int, context_length: int, seed: int, rows: slice | None = None
) -> EvalBatches:
    """The same `n_batches` validation batches every time (their own generator, seeded from `seed`).

    Fixed windows make successive evaluations comparable, and never drawing from the training
    generator keeps a resumed run's batches identical to an uninterrupted one.
    """
    return EvalBatches(ids, n_batches, batch_size, context_length, seed, rows)


@dataclass(frozen=True, eq=False)
class EvalBatches(Sequence):
    """`eval_batches`' batches, drawn afresh on each pass from a generator seeded the same way:
    memory holds one batch, however many an evaluation asks for."""

    ids: np.ndarray
    n_batches: int
    batch_size: int
    context_length: int
    seed: int
    rows: slice | None = None

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self):
        rng = np.random.default_rng([self.seed, 0x5EED])
        for _ in range(self.n_batches):
            yield get_batch(self.ids, self.batch_size, self.context_length, rng, self.rows)

    def __getitem__(self, i: int):
        if not 0 <= i < self.n_batches:
            raise IndexError(i)
        return next(itertools.islice(iter(self), i, None))
