"""What a run trains on: the corpus as the user gave it (`CorpusSpec`), opened (`RunCorpus`).

A run's corpus is a `CorpusSpec`: its inputs (files, directories, compressed files, JSONL;
read by `bpe.corpus.Corpus`, the one place a corpus is read), how to read them (`glob`,
`text_field`, `binary`), the special token put between documents (`eot`), what text that looks
like a special token becomes (`specials`: one of SPECIALS), and optionally an explicit validation
corpus (`val`) read the same way. The spec and the corpus's fingerprint
(`Corpus.fingerprint`: for one plain file its sha256) are what a run records and what `--resume`
checks.

A run reads its corpus several times (tokenizer, encoding, fingerprint, the resume check), and a
stream (stdin, a pipe) can be read only once. So `store_streams` copies each stream's bytes,
once and as they came (still compressed, still JSONL), into the run directory as
`corpus.stream` (`val.stream` for the validation corpus), and from then on the run reads that
file: the spec names it (and remembers what it was, "stdin", for messages), and `--resume`
and the pipeline's up-to-date check read it again. The copy waits in a temp file until the run
starts, as fresh token ids do.

This module writes only those copies; `pipeline.data` encodes the opened corpus.
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

from tokenkit.bpe import Corpus, TokenizerError
from tokenkit.bpe.corpus import BLOCK_BYTES
from tokenkit.bpe.encode_corpus import eot_id
from tokenkit.common import atomic
from tokenkit.pipeline import checkpoint
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.names import SPECIALS


@dataclass(frozen=True)
class CorpusSpec:
    """A run's corpus as the user gave it: inputs, how to read them, the separator, validation.

    inputs: files and directories (as given); glob, text_field, binary: as `bpe.corpus.Corpus`
    reads them; eot: a special token whose id goes between documents in the token files; val:
    inputs of an explicit validation corpus (read with the same options), used instead of the
    held-out fraction; specials: how text that looks like a special token of the tokenizer is
    encoded (SPECIALS: "refuse" is an error, "allow" reads the special token, "text" its bytes; a
    run recorded before the field existed refused); streams: (path, what it was) of each input
    that is a run's copy of a stream (`store_streams`), e.g. ("runs/a/corpus.stream", "stdin").

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
    specials: str = "refuse"

    def __post_init__(self) -> None:
        if self.specials not in SPECIALS:
            raise PipelineError(f"unknown special-token policy {self.specials!r}; one of {', '.join(SPECIALS)}")

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
        record = {
            "inputs": list(self.inputs),
            "glob": self.glob,
            "text_field": self.text_field,
            "binary": self.binary,
            "eot": self.eot,
            "val": list(self.val),
            "specials": self.specials,
        }
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
        ok = (
            isinstance(value, dict)
            and isinstance(value.get("inputs"), list)
            and isinstance(value.get("val", []), list)
            and isinstance(value.get("streams", {}), dict)
        )
        try:
            spec = (
                cls(
                    tuple(value["inputs"]),
                    value.get("glob"),
                    value.get("text_field"),
                    bool(value.get("binary", False)),
                    value.get("eot"),
                    tuple(value.get("val", [])),
                    tuple(value.get("streams", {}).items()),
                    value.get("specials") or "refuse",
                )
                if ok
                else None
            )
        except (TypeError, KeyError, PipelineError):
            spec = None
        names = spec.inputs + spec.val + tuple(x for pair in spec.streams for x in pair) if spec is not None else ()
        if spec is None or not all(isinstance(p, str) for p in names) or not spec.inputs:
            raise PipelineError(f"{where} records no readable corpus; it is corrupt")
        return spec

    def encode_options(self) -> dict[str, Any]:
        """`specials` as keyword arguments of `Tokenizer.encode_file`."""
        return dict(SPECIALS[self.specials])

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
        return dataclasses.replace(
            self,
            inputs=tuple(moved.get(p, p) for p in self.inputs),
            val=tuple(moved.get(p, p) for p in self.val),
            streams=tuple((moved[p], origin) for p, origin in self._streams().items()),
        )

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
            try:
                self._fingerprints["val"] = self.val.fingerprint()
            except TokenizerError as err:  # read with the corpus's options: say so
                also = (
                    f" (--text-field {self.spec.text_field} reads it as JSON lines too)" if self.spec.text_field else ""
                )
                raise PipelineError(f"--val: {err}{also}") from None
        return self._fingerprints["val"]

    def discard(self) -> None:
        """Remove the pending copies of streams (the run did not start)."""
        remove_pending(self.pending)


def open_corpus(corpus, warn: Callable[[str], None] | None = None) -> RunCorpus:
    """`corpus` (a RunCorpus, a CorpusSpec, a path or a list of paths) opened."""
    return corpus if isinstance(corpus, RunCorpus) else CorpusSpec.of(corpus).open(warn)


def _open(inputs: tuple[str, ...], spec: CorpusSpec, warn, what: str, names: Mapping[str, str] | None = None) -> Corpus:
    try:
        corpus = Corpus(
            [Path(p) for p in inputs],
            glob=spec.glob,
            text_field=spec.text_field,
            binary=spec.binary,
            warn=warn,
            names=names,
        )
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
                raise PipelineError(
                    f"the pipe {name} is given twice; it can be read only once: give the other input as a file"
                )
            seen[(st.st_dev, st.st_ino)] = name


def store_streams(
    corpus: RunCorpus, run_dir: str | os.PathLike, say: Callable[[str], None] = lambda msg: None
) -> RunCorpus:
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
        for key, base, what in (
            ("inputs", checkpoint.CORPUS_STREAM_FILE, "corpus"),
            ("val", checkpoint.VAL_STREAM_FILE, "validation corpus"),
        ):
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
        kept_spec = dataclasses.replace(
            spec, inputs=fields["inputs"][0], val=fields["val"][0], streams=tuple(streams.items())
        )
        opened = dataclasses.replace(spec, inputs=fields["inputs"][1], val=fields["val"][1]).open(corpus.warn, names)
    except BaseException:
        remove_pending(pending)
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


def remove_pending(pending: dict[str, Path]) -> None:
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
