"""Encode a whole corpus to token ids in worker processes, streaming them to a `.npy` file.

What it does: `encode_corpus(tok, corpus, out_path)` gives the ids of every document of a
`bpe.corpus.Corpus`, each encoded on its own (exactly `tok.encode` of its text), one after the
other, with an end-of-text special token's id between documents if asked (`eot`). The work is
cut into tasks of about a megabyte: byte ranges of plain files, cut at the one cut rule's places
(`bpe.corpus.file_ranges`), which the workers read themselves; or the pieces of compressed
files, JSONL records and streams, read here and handed over. Small documents share a task. At
most two tasks per worker are in flight and finished ids go straight to the output, so memory
stays at a few tasks however large the corpus. `bpe.distributed` hands each MPI rank its share
of the same tasks.

What it deliberately does not do: encode text itself (`Tokenizer.encode` does), read files
other than through `bpe.corpus`, or write other than through `bpe.io`. It never imports
bpe/tokenizer.py, which calls it: what it needs of a tokenizer is the `Encodes` protocol, and
worker processes that cannot inherit the tokenizer rebuild it with its own class's `from_tensors`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from typing import NamedTuple, Protocol

import numpy as np

from tokenkit.bpe import io
from tokenkit.bpe.corpus import Corpus, file_ranges, read_range
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.patterns import BUILTIN
from tokenkit.common import pool, processes, progress

__all__ = ["Encoded", "Encodes", "Part", "encode_corpus", "encoded_tasks", "eot_id", "file_tasks", "tasks_of"]

_PIECE_BYTES = 1 << 20  # bytes per task handed to a worker process


class Part(NamedTuple):
    """A stretch of one document: bytes [start, end) of the file at `source`, or `source` itself
    (bytes). `after_document`: a document ends right before it (where an eot id goes)."""

    source: str | bytes
    start: int
    end: int
    after_document: bool


Task = tuple[Part, ...]
Tensors = tuple[dict[str, np.ndarray], dict[str, str]]


class Encodes(Protocol):
    """What encoding a corpus uses of a tokenizer (`bpe.tokenizer.Tokenizer` is one). Its special
    policy (`Tokenizer.special_policy`: a `bpe.tokenizer.SpecialPolicy`) is checked once and
    handed to every task as it is."""

    @property
    def pattern_regex(self) -> str | None: ...  # the split regex: a built-in one may be cut into pieces

    @property
    def special_tokens(self) -> dict[str, int]: ...

    @property
    def ids_dtype(self) -> type: ...

    def special_policy(self, allowed_special, disallowed_special) -> Hashable: ...

    def encode_raw(self, text: str, policy) -> bytes: ...

    def warm_up(self) -> None: ...

    def to_tensors(self) -> Tensors: ...

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> Encodes: ...


@dataclass(frozen=True)
class Encoded:
    """What `encode_corpus` made: the ids (memory-mapped when written to a file), the bytes of
    text they encode, and the number of documents."""

    ids: np.ndarray
    n_bytes: int
    n_documents: int


def eot_id(tok: Encodes, eot: str | None) -> int | None:
    """The id of the special token `eot` (None: no separator); TokenizerError if it is none of tok's."""
    if eot is None:
        return None
    specials = tok.special_tokens
    if eot not in specials:
        known = ", ".join(specials) or "none"
        raise TokenizerError(
            f"--eot {eot!r} is not a special token of this tokenizer (it has: {known}); train it with --special {eot!r}"
        )
    return specials[eot]


def encode_corpus(
    tok: Encodes,
    corpus: Corpus,
    out_path: str | os.PathLike | None = None,
    *,
    workers: int | None = None,
    quiet: bool = False,
    allowed_special: Iterable[str] | str = (),
    disallowed_special: Iterable[str] | str = "all",
    eot: str | None = None,
    bos: int | None = None,
) -> Encoded:
    """The ids of every document of `corpus`, in order, `eot`'s id between documents and the id
    `bos` before each (what a model of a tokenizer with a BOS reads: `Tokenizer.encode_for_model`).

    With `out_path` (.npy) the ids are streamed there task by task, atomically, and `ids` is
    that file memory-mapped read-only. workers: processes (default: all cores; 1: here).
    """
    policy = tok.special_policy(allowed_special, disallowed_special)
    sep = eot_id(tok, eot)
    lead = np.array([] if bos is None else [bos], dtype=tok.ids_dtype)
    between = np.array([i for i in (sep, bos) if i is not None], dtype=tok.ids_dtype).tobytes()
    workers = processes.default_workers() if workers is None else workers
    if (wrong := processes.bad_worker_count(workers)) is not None:  # before any work: a task list 2x workers long
        raise TokenizerError(wrong)
    done = {"bytes": 0, "documents": 0}
    with progress.bar(total=corpus.size, desc="encoding", quiet=quiet) as bar:

        def advance(task: Task) -> None:
            n = sum(p.end - p.start for p in task)
            done["bytes"] += n
            done["documents"] += sum(p.after_document for p in task)
            bar.update(n)

        pieces = _led(lead, encoded_tasks(tok, tasks_of(tok, corpus), workers, policy, between, advance))
        if out_path is None:
            ids = np.concatenate([np.zeros(0, dtype=tok.ids_dtype), *pieces])
        elif io.save_ids_stream(out_path, tok.ids_dtype, pieces) == 0:
            ids = np.zeros(0, dtype=tok.ids_dtype)
        else:
            ids = io.load_ids(out_path)
    n_documents = done["documents"] + (done["bytes"] > 0)  # the first document has no boundary before it
    return Encoded(ids, done["bytes"], n_documents)


def _led(lead: np.ndarray, pieces: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """`pieces` with `lead` before the first of them (none: nothing, an empty corpus stays empty)."""
    pieces = iter(pieces)
    first = next(pieces, None)
    if first is not None:
        if lead.size:
            yield lead
        yield first
        yield from pieces


def tasks_of(tok: Encodes, corpus: Corpus) -> Iterator[Task]:
    """The corpus as tasks: plain files as byte ranges, anything else as pieces read here.

    With a custom pattern or "none" no safe place to cut is known: each document is one part.
    """
    files = corpus.plain_files()
    if files is not None:
        return iter(file_tasks(tok, files))
    cuttable = tok.pattern_regex in BUILTIN
    specials = [s.encode("utf-8") for s in tok.special_tokens]
    parts = (
        Part(p.data, 0, len(p.data), p.starts_document)
        for p in corpus.pieces(_PIECE_BYTES if cuttable else None, specials)
    )
    return _grouped(_first_is_no_boundary(parts))


def file_tasks(tok: Encodes, files: list[tuple[str, int]]) -> list[Task]:
    """Tasks over plain files: each file in ranges of about a megabyte (whole with a custom
    pattern or "none"), small files grouped."""
    cuttable = tok.pattern_regex in BUILTIN
    specials = [s.encode("utf-8") for s in tok.special_tokens]
    parts = []
    for path, size in files:
        ranges = file_ranges(path, size, _PIECE_BYTES, specials) if cuttable else [(0, size)]
        parts.extend(Part(str(path), a, b, a == 0) for a, b in ranges if b > a)
    return list(_grouped(_first_is_no_boundary(parts)))


def _first_is_no_boundary(parts: Iterable[Part]) -> Iterator[Part]:
    parts = iter(parts)
    first = next(parts, None)
    if first is not None:
        yield first._replace(after_document=False)
        yield from parts


def _grouped(parts: Iterable[Part]) -> Iterator[Task]:
    """Consecutive parts in tasks of about _PIECE_BYTES (a part is never split)."""
    task: list[Part] = []
    n = 0
    for part in parts:
        task.append(part)
        n += part.end - part.start
        if n >= _PIECE_BYTES:
            yield tuple(task)
            task, n = [], 0
    if task:
        yield tuple(task)


def encoded_tasks(
    tok: Encodes,
    tasks: Iterable[Task],
    workers: int,
    policy: Hashable,
    between: bytes,
    progress: Callable[[Task], None],
) -> Iterator[np.ndarray]:
    """The ids of each task, in order, `between` (raw ids: an eot, a BOS) where a document begins
    after another. In worker processes, at most two tasks per worker are in flight, so that
    finished ids do not pile up in memory."""
    tasks = iter(tasks)
    head = list(islice(tasks, 2 * workers))  # enough to know whether workers are worth starting
    if workers == 1 or len(head) <= 1:  # here, task by task: memory stays at one task
        for task in chain(head, tasks):
            ids = _encode_task(tok, task, policy, between)
            progress(task)
            yield np.frombuffer(ids, dtype=tok.ids_dtype)
        return
    global _worker_tok
    if pool.forked():  # workers inherit this tokenizer (and its warm cache)
        _worker_tok, packed = tok, None
        tok.warm_up()  # its tables built once here, not in every worker
    else:  # spawn: each worker rebuilds it from the tensors, with the tokenizer's own class
        packed = type(tok).from_tensors, tok.to_tensors()
    n = min(workers, len(head))
    # common.pool: stopped at once by an error, Ctrl-C or SIGTERM (its workers killed and reaped,
    # their pipes never read again), whatever a worker was writing at that moment.
    try:
        with pool.TaskPool(n, _worker_encode, init=_worker_init, init_args=(packed, policy, between)) as p:
            taken: deque = deque()  # the tasks handed to the pool whose ids have not come out yet

            def todo() -> Iterator[Task]:
                for task in chain(head, tasks):
                    taken.append(task)
                    yield task

            for raw in p.map(todo(), window=2 * n):  # tasks taken ahead: finished ids do not pile up
                progress(taken.popleft())
                yield np.frombuffer(raw, dtype=tok.ids_dtype)
    except pool.PoolError as err:
        raise TokenizerError(f"an encoding worker failed: {err}; try --workers 1") from None
    finally:
        _worker_tok = None


def _encode_task(tok: Encodes, task: Task, policy: Hashable, between: bytes) -> bytes:
    """The ids of one task's parts as raw bytes of `tok.ids_dtype` (no per-id pickling on the way
    back from a worker), `between` before each part that starts a new document."""
    out = []
    for part in task:
        if part.after_document and between:
            out.append(between)
        if isinstance(part.source, bytes):
            text = part.source.decode("utf-8", errors="surrogateescape")
        else:
            text = read_range(part.source, part.start, part.end)
        out.append(tok.encode_raw(text, policy))  # = tok.encode(text, ...) as raw ids
    return out[0] if len(out) == 1 else b"".join(out)


# Worker processes of encode_corpus hold the tokenizer here: forked ones inherit it from the
# parent, others build it once from the tensors; its chunk cache stays warm across tasks.
_worker_tok: Encodes | None = None
_worker_args: tuple = ()  # policy, between


def _worker_init(packed: tuple[Callable[..., Encodes], Tensors] | None, *args) -> None:
    """First thing in an encoding worker (after common.pool's die_with_parent): rebuild the
    tokenizer with `from_tensors` (its class's, pickled by name) unless it was inherited through
    fork (`packed` None); keep the special-token policy and separator of every task."""
    global _worker_tok, _worker_args
    _worker_args = args
    if packed is not None:
        from_tensors, tensors = packed
        _worker_tok = from_tensors(*tensors)


def _worker_encode(task: Task) -> bytes:
    return _encode_task(_worker_tok, task, *_worker_args)
