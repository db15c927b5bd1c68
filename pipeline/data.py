"""Corpus -> token-id files (memory-mapped) -> (B, T) training batches from a seeded generator.

A run's corpus is a `CorpusSpec`: its inputs (files, directories, compressed files, JSONL;
read by `bpe.corpus.Corpus`, the one place a corpus is read), how to read them (`glob`,
`text_field`, `binary`), the special token put between documents (`eot`), and optionally an
explicit validation corpus (`val`) read the same way. The spec and the corpus's fingerprint
(`Corpus.fingerprint`: for one plain file its sha256) are what a run records and what `--resume`
checks.

A run reads its corpus several times (tokenizer, encoding, fingerprint, the resume check), and a
stream (stdin, a pipe) can be read only once. So `store_streams` copies each stream's bytes,
once and as they came (still compressed, still JSONL), into the run directory as
`corpus.stream` (`val.stream` for the validation corpus), and from then on the run reads that
file: the spec names it (and remembers what it was, "stdin", for messages), and `--resume`
and the pipeline's up-to-date check read it again. The copy waits in a temp file until the run
starts, as fresh token ids do.

The corpus is encoded once with the tokenizer into `tokens.npy` beside the run (the validation
corpus into `val_tokens.npy`; uint16 when the vocabulary fits, else uint32) and opened with
`np.load(mmap_mode="r")`, so a corpus larger than memory still trains: a batch reads only its
windows. `tokens.json` records what each file was made from (the corpus fingerprint, the
tokenizer's fingerprint, the eot token); while they still match, a file is reused instead of
encoding again.

Without `val`, the last `val_fraction` of the tokens is the validation split. Training batches
are random windows drawn by a `np.random.Generator` whose whole state fits in a few uint64 words
(`rng_to_array` / `rng_from_array`), so a checkpoint can resume the exact batch sequence.

This module writes no file contents itself besides the copies of streams (`bpe` encodes into
the files, `pipeline.checkpoint` writes the JSON); it renames finished files into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bpe import Corpus, TokenizerError
from bpe.corpus import BLOCK_BYTES
from bpe.encode_corpus import eot_id
from common import atomic
from pipeline import checkpoint
from pipeline.errors import PipelineError

_MASK64 = (1 << 64) - 1
# What a token file's ids depend on: the fields of `TokenData.key()` and of a run's data record.
KEY_FIELDS = ("corpus_fingerprint", "val_fingerprint", "tokenizer_fingerprint", "eot")


# --- what a run trains on --------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusSpec:
    """A run's corpus as the user gave it: inputs, how to read them, the separator, validation.

    inputs: files and directories (as given); glob, text_field, binary: as `bpe.corpus.Corpus`
    reads them; eot: a special token whose id goes between documents in the token files; val:
    inputs of an explicit validation corpus (read with the same options), used instead of the
    held-out fraction; streams: (path, what it was) of each input that is a run's copy of a stream
    (`store_streams`), e.g. ("runs/a/corpus.stream", "stdin").

    >>> CorpusSpec.of("tales.txt").to_dict()["inputs"]
    ['tales.txt']
    >>> CorpusSpec(("runs/a/corpus.stream",), streams=(("runs/a/corpus.stream", "stdin"),)).describe()
    'stdin (runs/a/corpus.stream)'
    """

    inputs: tuple[str, ...]
    glob: str | None = None
    text_field: str | None = None
    binary: bool = False
    eot: str | None = None
    val: tuple[str, ...] = ()
    streams: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, corpus: CorpusSpec | RunCorpus | str | os.PathLike | Iterable[str | os.PathLike]) -> CorpusSpec:
        """A spec from a spec, an opened corpus, one path, or a list of paths."""
        if isinstance(corpus, CorpusSpec):
            return corpus
        if isinstance(corpus, RunCorpus):
            return corpus.spec
        if isinstance(corpus, (str, os.PathLike)):
            return cls((os.fspath(corpus),))
        return cls(tuple(os.fspath(p) for p in corpus))

    def to_dict(self) -> dict[str, Any]:
        record = {"inputs": list(self.inputs), "glob": self.glob, "text_field": self.text_field, "binary": self.binary,
                  "eot": self.eot, "val": list(self.val)}
        streams = self._streams()
        if streams:
            record["streams"] = streams
        return record

    def _streams(self) -> dict[str, str]:
        """{copy: what it was} for the copies of streams among the inputs."""
        return {path: origin for path, origin in self.streams if path in self.inputs or path in self.val}

    @classmethod
    def from_record(cls, record: Mapping[str, Any], where: str = "the run") -> CorpusSpec:
        """The spec a run recorded (`to_dict`'s, or a v1 run's one path under "corpus")."""
        value = record.get("corpus")
        if isinstance(value, str):  # v1: one file
            return cls((value,))
        ok = (isinstance(value, dict) and isinstance(value.get("inputs"), list) and isinstance(value.get("val", []), list)
              and isinstance(value.get("streams", {}), dict))
        try:
            spec = cls(tuple(value["inputs"]), value.get("glob"), value.get("text_field"), bool(value.get("binary", False)),
                       value.get("eot"), tuple(value.get("val", [])), tuple(value.get("streams", {}).items())) if ok else None
        except (TypeError, KeyError):
            spec = None
        names = spec.inputs + spec.val + tuple(x for pair in spec.streams for x in pair) if spec is not None else ()
        if spec is None or not all(isinstance(p, str) for p in names) or not spec.inputs:
            raise PipelineError(f"{where} records no readable corpus; it is corrupt")
        return spec

    def reading(self) -> dict[str, Any]:
        """How the inputs are read (what tokens.json records beside each file's inputs)."""
        return {"glob": self.glob, "text_field": self.text_field, "binary": self.binary}

    def describe(self, val: bool = False) -> str:
        """The inputs (or the validation inputs) for messages: 'a.txt', 'a.txt, b.txt', 'a, b, c and 2 more';
        a copy of a stream as 'stdin (runs/a/corpus.stream)'."""
        streams = self._streams()
        names = [f"{streams[n]} ({n})" if n in streams else n for n in (self.val if val else self.inputs)]
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    def stream_inputs(self) -> list[str]:
        """The inputs and validation inputs that are streams: "-" (stdin) and pipes."""
        return [name for name in self.inputs + self.val if name == "-" or _is_pipe(name)]

    def kept_in(self, run_dir: str | os.PathLike) -> CorpusSpec:
        """This spec with its copies of streams where they are now: in `run_dir`, under their own
        names (the spec records them as the run's path was given, from wherever it was run)."""
        moved = {path: str(Path(run_dir) / Path(path).name) for path in self._streams()}
        if not moved:
            return self
        return dataclasses.replace(self, inputs=tuple(moved.get(p, p) for p in self.inputs),
                                   val=tuple(moved.get(p, p) for p in self.val),
                                   streams=tuple((moved[p], origin) for p, origin in self._streams().items()))

    def open(self, warn: Callable[[str], None] | None = None, names: Mapping[str, str] | None = None) -> RunCorpus:
        """The inputs opened for reading (one-line PipelineError for a missing input, stdin given
        twice, a device, an empty file or directory); `warn` hears of inputs that do not look like
        text; `names` renames inputs in messages (as `bpe.corpus.Corpus`'s). Streams are not read yet."""
        _check_streams(self.inputs + self.val)
        val = _open(self.val, self, warn, "validation corpus", names) if self.val else None
        return RunCorpus(self, _open(self.inputs, self, warn, "corpus", names), val, warn=warn)


@dataclass
class RunCorpus:
    """A CorpusSpec opened: the training and validation `bpe.corpus.Corpus`, and their
    fingerprints, each read once (then remembered).

    `pending`: copies of streams (`store_streams`) still in temp files, by their name in the run
    directory; `prepare_tokens` takes them over, to commit them with the token files. Once
    committed, the fingerprints stay known but the temp files are gone: open the spec again to
    read the corpus once more. `warn`: what the inputs were opened with.
    """

    spec: CorpusSpec
    train: Corpus
    val: Corpus | None
    warn: Callable[[str], None] | None = field(default=None, repr=False)
    pending: dict[str, Path] = field(default_factory=dict)
    _fingerprints: dict[str, str] = field(default_factory=dict, repr=False)

    def fingerprint(self) -> str:
        if "train" not in self._fingerprints:
            self._fingerprints["train"] = self.train.fingerprint()
        return self._fingerprints["train"]

    def val_fingerprint(self) -> str | None:
        if self.val is None:
            return None
        if "val" not in self._fingerprints:
            self._fingerprints["val"] = self.val.fingerprint()
        return self._fingerprints["val"]

    def discard(self) -> None:
        """Remove the pending copies of streams (the run did not start)."""
        _remove(self.pending)


def open_corpus(corpus, warn: Callable[[str], None] | None = None) -> RunCorpus:
    """`corpus` (a RunCorpus, a CorpusSpec, a path or a list of paths) opened."""
    return corpus if isinstance(corpus, RunCorpus) else CorpusSpec.of(corpus).open(warn)


def _open(inputs: tuple[str, ...], spec: CorpusSpec, warn, what: str, names: Mapping[str, str] | None = None) -> Corpus:
    try:
        corpus = Corpus([Path(p) for p in inputs], glob=spec.glob, text_field=spec.text_field, binary=spec.binary, warn=warn,
                        names=names)
    except TokenizerError as err:
        raise PipelineError(f"--val: {err}" if what != "corpus" else str(err)) from None
    if corpus.size == 0:
        raise PipelineError(f"{what} {spec.describe(what != 'corpus')} is empty; give a text file with some text")
    return corpus


def _is_pipe(name: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(name).st_mode)
    except (OSError, ValueError):
        return False  # missing: Corpus says so


def _check_streams(names: tuple[str, ...]) -> None:
    """One line when a stream is given twice (as CORPUS and --val, say): it can be read only once."""
    if names.count("-") > 1:
        raise PipelineError("stdin (-) is given twice; it can be read only once: give the other input as a file")
    seen: dict[tuple[int, int], str] = {}
    for name in names:
        if name != "-" and _is_pipe(name):
            st = os.stat(name)
            if (st.st_dev, st.st_ino) in seen:
                raise PipelineError(f"the pipe {name} is given twice; it can be read only once: give the other input as a file")
            seen[(st.st_dev, st.st_ino)] = name


def store_streams(corpus: RunCorpus, run_dir: str | os.PathLike, say: Callable[[str], None] = lambda msg: None) -> RunCorpus:
    """`corpus` with each of its streams (stdin, pipes) copied into `run_dir` and read from there.

    Each stream's bytes are copied once, in blocks, as they come (a compressed or JSONL stream
    stays so: the same options read the same documents from the copy), to `corpus.stream`
    (`val.stream` for the validation corpus; `corpus.2.stream`, ... for further streams). The
    returned corpus's spec names the copies, and remembers what each was ("stdin"). A copy
    waits in a temp file (`RunCorpus.pending`) until the run starts (`commit_tokens`, once
    `prepare_tokens` took it over); one identical to the file already there is not kept. Call it
    holding the run directory's lock. An empty stream is a one-line PipelineError and leaves no
    file behind; so does any failure here.
    """
    spec = corpus.spec
    if not spec.stream_inputs():
        return corpus
    run_dir = Path(run_dir)
    pending: dict[str, Path] = {}
    names: dict[str, str] = {}  # path read -> the stream's name in messages
    streams = dict(spec.streams)
    fields: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # field -> (recorded inputs, inputs read)
    try:
        for key, base, what in (("inputs", checkpoint.CORPUS_STREAM_FILE, "corpus"), ("val", checkpoint.VAL_STREAM_FILE, "validation corpus")):
            recorded, read = [], []
            for name in getattr(spec, key):
                if name != "-" and not _is_pipe(name):
                    recorded.append(name)
                    read.append(name)
                    continue
                count = sum(1 for p in recorded if p in streams) + 1  # corpus.stream, corpus.2.stream, ...
                kept = run_dir / (base if count == 1 else base.replace(".stream", f".{count}.stream"))
                origin = "stdin" if name == "-" else f"pipe {name}"
                path, size = _copy_stream(name, kept, origin, what)
                if path != kept:
                    pending[kept.name] = path
                say(f"{what}: read {size:,} bytes from {origin}, to keep as {kept} when the run starts")
                names[str(path)] = origin
                streams[str(kept)] = origin
                recorded.append(str(kept))
                read.append(str(path))
            fields[key] = (tuple(recorded), tuple(read))
        kept_spec = dataclasses.replace(spec, inputs=fields["inputs"][0], val=fields["val"][0], streams=tuple(streams.items()))
        opened = dataclasses.replace(spec, inputs=fields["inputs"][1], val=fields["val"][1]).open(corpus.warn, names)
    except BaseException:
        _remove(pending)
        raise
    return RunCorpus(kept_spec, opened.train, opened.val, warn=corpus.warn, pending=pending)


def _copy_stream(name: str, kept: Path, origin: str, what: str) -> tuple[Path, int]:
    """Copy the stream `name` ("-" or a pipe), in blocks, to a temp file beside `kept`: (the file
    to read it from, its size). When `kept` already holds these very bytes, the temp goes again
    and `kept` is the file to read; on any failure the temp goes too."""
    tmp = atomic.temp_path(kept)
    digest, size = hashlib.sha256(), 0
    try:
        source = sys.stdin.buffer if name == "-" else open(name, "rb")
    except OSError as err:
        raise PipelineError(f"cannot read {origin}: {err.strerror or err}") from None
    try:
        with atomic.create_temp(tmp) as out:
            while block := _read_block(source, origin, size):
                out.write(block)
                digest.update(block)
                size += len(block)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):  # a failed read is a PipelineError: this is the disk
            raise atomic.write_error(kept, err) from None
        raise
    finally:
        if name != "-":
            source.close()
    if size == 0 or _same_bytes(kept, size, digest.hexdigest()):
        tmp.unlink()
        if size == 0:
            raise PipelineError(f"{what} {origin} is empty (the stream ended before its first byte); give it some text")
        return kept, size
    return tmp, size


def _read_block(source, origin: str, done: int) -> bytes:
    try:
        return source.read(BLOCK_BYTES)
    except OSError as err:
        after = f" after {done:,} bytes" if done else ""
        raise PipelineError(f"cannot read {origin}{after}: {err.strerror or err}") from None


def _same_bytes(path: Path, size: int, sha256: str) -> bool:
    """Whether the regular file `path` holds `size` bytes with this sha256."""
    try:
        if not path.is_file() or path.stat().st_size != size:
            return False
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(BLOCK_BYTES):
                digest.update(block)
    except OSError:
        return False
    return digest.hexdigest() == sha256


def _remove(pending: dict[str, Path]) -> None:
    """Remove the temp files of `pending` (ours: `atomic.temp_path` names) and forget them."""
    for tmp in pending.values():
        tmp.unlink(missing_ok=True)
    pending.clear()


def check_eot(tokenizer, spec: CorpusSpec) -> None:
    """One line when the spec's eot is not a special token of `tokenizer`."""
    try:
        eot_id(tokenizer, spec.eot)
    except TokenizerError as err:
        raise PipelineError(str(err)) from None


def record_key(record: Mapping[str, Any]) -> dict[str, Any]:
    """The KEY_FIELDS of a recorded data table (a run's, or a tokens.json entry); a v1 record's
    `corpus_sha256` is its fingerprint (for one plain file, the fingerprint is the sha256)."""
    key = {name: record.get(name) for name in KEY_FIELDS}
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
                f"needs at least {need} (context {context_length} + 1); use bigger corpora or a smaller --context-length"
            )
        return self.ids, self.val_ids

    def key(self) -> dict[str, Any]:
        """What the ids depend on; a run records it to detect a changed corpus or tokenizer."""
        return {"corpus_fingerprint": self.corpus_fingerprint, "val_fingerprint": self.val_fingerprint,
                "tokenizer_fingerprint": self.tokenizer_fingerprint, "eot": self.spec.eot}

    def files(self) -> dict[str, dict[str, Any]]:
        """tokens.json's entry for each token file: what it was made from."""
        common = {"tokenizer_fingerprint": self.tokenizer_fingerprint, "eot": self.spec.eot, **self.spec.reading()}
        entries = {checkpoint.TOKENS_FILE: {**common, "inputs": list(self.spec.inputs), "corpus_fingerprint": self.corpus_fingerprint,
                                            "n_tokens": int(len(self.ids)), "dtype": self.ids.dtype.name}}
        if self.val_ids is not None:
            entries[checkpoint.VAL_TOKENS_FILE] = {**common, "inputs": list(self.spec.val), "corpus_fingerprint": self.val_fingerprint,
                                                   "n_tokens": int(len(self.val_ids)), "dtype": self.val_ids.dtype.name}
        return entries

    def discard(self) -> None:
        """Remove the pending temp files (the run did not start)."""
        _remove(self.pending)


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
    with `key` (corpus_fingerprint, tokenizer_fingerprint, eot), else None."""
    run_dir = Path(run_dir)
    entry = _cache_entries(run_dir).get(name)
    if entry is None or any(record_key(entry).get(k) != v for k, v in key.items()) or not (run_dir / name).exists():
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
    validation corpus for `val_tokens.npy`), or reuse each file when its corpus, the tokenizer
    and the eot token are unchanged.

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
    tokens = TokenData(ids=None, vocab_size=tokenizer.vocab_size, spec=spec, corpus_fingerprint="",
                       tokenizer_fingerprint=fingerprint, reused=True, pending=rc.pending)
    rc.pending = {}  # the tokens' now: committed or discarded with the ids
    try:
        tokens.corpus_fingerprint, tokens.val_fingerprint = rc.fingerprint(), rc.val_fingerprint()
        parts = [(checkpoint.TOKENS_FILE, rc.train, tokens.corpus_fingerprint, "corpus")]
        if rc.val is not None:
            parts.append((checkpoint.VAL_TOKENS_FILE, rc.val, tokens.val_fingerprint, "validation corpus"))
        for name, source, digest, what in parts:
            key = {"corpus_fingerprint": digest, "tokenizer_fingerprint": fingerprint, "eot": spec.eot}
            ids = cached_tokens(run_dir, name, key, dtype)
            if ids is None:
                tokens.reused = False
                tmp = atomic.temp_path(run_dir / name)
                tokens.pending[name] = tmp
                tokenizer.encode_file(source, out_path=tmp, quiet=quiet, eot=spec.eot)
                ids = _open_ids(tmp)
                if ids is None:
                    raise PipelineError(f"encoding the {what} wrote an unreadable {tmp}")
            if len(ids) == 0:
                raise PipelineError(f"{what} {spec.describe(what != 'corpus')} encodes to no tokens")
            if name == checkpoint.TOKENS_FILE:
                tokens.ids = ids
            else:
                tokens.val_ids = ids
    except BaseException:
        tokens.discard()
        raise
    if commit:
        commit_tokens(tokens, run_dir)
    return tokens


def commit_tokens(tokens: TokenData, run_dir: str | os.PathLike) -> None:
    """Rename pending ids (and copies of streams) into place and record what every token file
    was made from in tokens.json.

    The entries of the files being replaced leave tokens.json first, so a crash between the
    renames and the final write leaves files that are merely not reused, never wrongly reused.
    """
    if not tokens.pending:
        return
    run_dir = Path(run_dir)
    entries = _cache_entries(run_dir)
    if any(name in entries for name in tokens.pending):
        kept = {name: entry for name, entry in entries.items() if name not in tokens.pending}
        checkpoint.write_json(run_dir / checkpoint.TOKENS_META_FILE, kept)
    for name, tmp in list(tokens.pending.items()):
        try:
            atomic.commit(tmp, run_dir / name)
        except OSError as err:
            tokens.discard()
            raise PipelineError(str(atomic.write_error(run_dir / name, err))) from None
        del tokens.pending[name]
    entries = {name: entry for name, entry in _cache_entries(run_dir).items()}
    entries.update(tokens.files())
    checkpoint.write_json(run_dir / checkpoint.TOKENS_META_FILE, entries)


def open_tokens(run_dir: str | os.PathLike, tokenizer, spec: Mapping[str, Any], key: dict[str, Any], n_tokens: int,
                n_val_tokens: int | None = None) -> TokenData:
    """run_dir's token files as another process committed them (an MPI rank joining rank 0's
    run), memory-mapped; a one-line PipelineError when this process cannot see them whole."""
    found = {}
    for name, n in ((checkpoint.TOKENS_FILE, n_tokens), (checkpoint.VAL_TOKENS_FILE, n_val_tokens)):
        if n is None:
            continue
        path = Path(run_dir) / name
        ids = _open_ids(path)
        if ids is None or len(ids) != n:
            seen = "cannot read it" if ids is None else f"sees {len(ids):,} tokens instead of {n:,}"
            raise PipelineError(f"{path}: this process {seen}; every rank needs the run directory on a filesystem they all see")
        found[name] = ids
    return TokenData(ids=found[checkpoint.TOKENS_FILE], vocab_size=tokenizer.vocab_size,
                     spec=CorpusSpec.from_record({"corpus": dict(spec)}), corpus_fingerprint=key["corpus_fingerprint"],
                     tokenizer_fingerprint=key["tokenizer_fingerprint"], reused=True,
                     val_ids=found.get(checkpoint.VAL_TOKENS_FILE), val_fingerprint=key.get("val_fingerprint"))


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
