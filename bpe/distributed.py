"""`bpe-train` counting and `encode_file` over MPI ranks, each rank on its own share of the bytes.

What it does:
- `split_files`: cuts the corpus (files one after the other) into one contiguous stretch per rank,
  of about equal bytes, at places where the split pattern always splits (`bpe.corpus.find_file_cut`
  for GPT-2's and GPT-4's patterns; file boundaries only for custom patterns and "none"), so that
  the chunks of the stretches are exactly the chunks of the whole corpus.
- `train`: every rank counts its stretch (`count_chunks`, `workers` processes per rank, default
  1), the counts travel to rank 0 as arrays (chunk bytes as uint8, offsets and counts as int64,
  `common.mpi.reduce_to_root`), and rank 0 merges (`Tokenizer.train`) — the same counts as one
  process, so the same file, byte for byte.
- `encode_file`: the files' ~1 MB tasks (`bpe.encode_corpus.file_tasks`) in contiguous blocks,
  one block per rank. Every rank encodes its block into an unnamed temporary file (memory stays at a
  piece, and an aborted job leaves nothing behind) and tells rank 0 its count; only then does
  rank 0 open the .npy and stream into it its own ids, then each other rank's, received in rank
  order as raw uint16/uint32 buffers of a million ids. Same ids, same file.

Only plain files (`bpe.corpus.Corpus.plain_files`: regular, uncompressed, not JSONL) are split
over ranks; the CLI refuses the rest under MPI, since a stream or a compressed file can only be
read from its start by one process.

What it deliberately does not do: import mpi4py (it is handed a communicator, see
`common.mpi.world`), print, or write anything on ranks other than 0 (apart from their temporary
file of ids).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, pairwise

import numpy as np

from tokenkit.bpe import io
from tokenkit.bpe.corpus import Corpus, FileRange, find_file_cut
from tokenkit.bpe.encode_corpus import encoded_tasks, eot_id, file_tasks
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.patterns import BUILTIN, resolve_pattern
from tokenkit.bpe.pretokenize import count_chunks
from tokenkit.bpe.tokenizer import Tokenizer
from tokenkit.common import progress
from tokenkit.common.mpi import recv_arrays, reduce_to_root, send_arrays

__all__ = ["Split", "encode_file", "pack_counts", "split_files", "train", "unpack_counts"]

_SEND_IDS = 1 << 20  # ids per message when a rank hands its ids to rank 0


@dataclass(frozen=True)
class Split:
    """How the work was shared: bytes per rank, in rank order."""

    bytes_per_rank: list[int]

    def describe(self) -> str:
        """
        >>> Split([1000, 999]).describe()
        '2 MPI ranks, bytes per rank: 1,000 / 999'
        """
        return f"{len(self.bytes_per_rank)} MPI ranks, bytes per rank: " + " / ".join(
            f"{n:,}" for n in self.bytes_per_rank
        )


def split_files(paths: list[str], sizes: list[int], n: int, cuttable: bool) -> list[list[FileRange]]:
    """The corpus (the files one after the other) in `n` contiguous stretches, one per rank.

    Stretch k starts at the first safe cut at or after k/n of the bytes (cuttable: a
    `bpe.corpus.find_file_cut` cut, else the next file boundary), so stretches may be empty.
    """
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
    total = starts[-1]
    cuts = [0]
    for k in range(1, n):
        target = max(-(-k * total // n), cuts[-1])
        i = max(j for j in range(len(paths)) if starts[j] <= target) if target < total else len(paths) - 1
        offset = target - starts[i]
        if 0 < offset < sizes[i]:
            found = find_file_cut(paths[i], offset, sizes[i]) if cuttable else None
            offset = sizes[i] if found is None else found
        cuts.append(min(starts[i] + offset, total))
    cuts.append(total)
    shares = []
    for a, b in pairwise(cuts):
        share = []
        for path, size, start in zip(paths, sizes, starts[:-1], strict=True):  # starts also has the end
            lo, hi = max(a, start), min(b, start + size)
            if lo < hi:
                share.append(FileRange(path, lo - start, hi - start))
        shares.append(share)
    return shares


def pack_counts(counts: dict[bytes, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """{chunk: count} as three arrays: the chunks' bytes, their offsets (n + 1), their counts.

    >>> [a.tolist() for a in pack_counts({b"ab": 2, b"c": 5})]
    [[97, 98, 99], [0, 2, 3], [2, 5]]
    """
    data = np.frombuffer(b"".join(counts), dtype=np.uint8)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in counts], out=offsets[1:])
    return data, offsets, np.fromiter(counts.values(), dtype=np.int64, count=len(counts))


def unpack_counts(arrays: list[np.ndarray]) -> dict[bytes, int]:
    """The inverse of `pack_counts`.

    >>> unpack_counts(pack_counts({b"ab": 2, b"c": 5}))
    {b'ab': 2, b'c': 5}
    """
    data, offsets, counts = arrays
    raw = data.tobytes()
    bounds = offsets.tolist()
    return {raw[a:b]: n for (a, b), n in zip(pairwise(bounds), counts.tolist(), strict=True)}


def _add_counts(mine: dict[bytes, int], theirs: dict[bytes, int]) -> dict[bytes, int]:
    for chunk, n in theirs.items():
        mine[chunk] = mine.get(chunk, 0) + n
    return mine


_COUNT_DTYPES = (np.uint8, np.int64, np.int64)


def train(
    comm, corpus: Corpus, *, pattern: str = "gpt2", workers: int = 1, quiet: bool = False, **options
) -> tuple[Tokenizer | None, Split]:
    """`Tokenizer.train` on a corpus of plain files, counted over the ranks of `comm`: the
    tokenizer on rank 0, None on the others.

    options: the rest of `Tokenizer.train`'s (vocab_size, min_frequency, special_tokens, on_merge, ...).
    Progress bars, if any, are rank 0's (its own share).
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    files = _plain_files(corpus)
    paths = [str(p) for p, _ in files]
    sizes = [size for _, size in files]
    regex_ = resolve_pattern(pattern)
    shares = split_files(paths, sizes, n, cuttable=regex_ in BUILTIN)
    split = Split([sum(r.end - r.start for r in share) for share in shares])

    def count_share(sources, regex_, workers, quiet) -> dict[bytes, int]:
        mine = count_chunks(shares[rank], regex_, workers=workers, quiet=quiet) if shares[rank] else {}
        total = reduce_to_root(comm, mine, _add_counts, pack_counts, unpack_counts, _COUNT_DTYPES)
        return None if total is None else {chunk: total[chunk] for chunk in sorted(total)}

    if rank:
        count_share(paths, regex_, workers, True)
        return None, split
    return Tokenizer.train(corpus, pattern=pattern, workers=workers, quiet=quiet, count=count_share, **options), split


def encode_file(
    comm,
    tok: Tokenizer,
    corpus: Corpus,
    out_path=None,
    *,
    workers: int = 1,
    quiet: bool = False,
    allowed_special=(),
    disallowed_special="all",
    eot: str | None = None,
) -> tuple[np.ndarray | None, Split]:
    """`tok.encode_file` of a corpus of plain files over the ranks of `comm`: the ids on rank 0
    (memory-mapped when written to `out_path`), None on the others."""
    rank, n = comm.Get_rank(), comm.Get_size()
    files = _plain_files(corpus)
    policy = tok.special_policy(allowed_special, disallowed_special)
    sep = eot_id(tok, eot)
    tasks = file_tasks(tok, files)
    spans, done = [], 0
    for task in tasks:  # each task as a stretch of the corpus, the files one after the other
        nbytes = sum(p.end - p.start for p in task)
        spans.append((done, done + nbytes))
        done += nbytes
    blocks = _blocks(spans, n)
    first = sum(len(b) for b in blocks[:rank])
    share = tasks[first : first + len(blocks[rank])]
    split = Split([sum(b - a for a, b in block) for block in blocks])
    bar = progress.bar(total=split.bytes_per_rank[rank], desc="encoding", quiet=quiet or rank > 0)
    with bar:
        advance = lambda task: bar.update(sum(p.end - p.start for p in task))  # noqa: E731
        between = np.array([] if sep is None else [sep], dtype=tok.ids_dtype).tobytes()
        pieces = encoded_tasks(tok, share, workers, policy, between, advance)
        own, count = io.spill_ids(pieces, tok.ids_dtype)  # unnamed: nothing is left behind if the job is aborted
    empty = np.zeros(0, dtype=tok.ids_dtype)
    with own:
        if rank:
            send_arrays(comm, 0, [np.array([count], dtype=np.int64)])
            for block in _blocks_of(own, tok.ids_dtype):
                send_arrays(comm, 0, [block])
            return None, split
        # Every rank has encoded its share (or aborted the job) before rank 0 starts the output file.
        for r in range(1, n):
            recv_arrays(comm, r, [np.int64])
        everything = chain(_blocks_of(own, tok.ids_dtype), *(_received(comm, r, tok.ids_dtype) for r in range(1, n)))
        if out_path is None:
            return np.concatenate([empty, *everything]), split
        if io.save_ids_stream(out_path, tok.ids_dtype, everything) == 0:
            return empty, split
    return io.load_ids(out_path), split


def _plain_files(corpus: Corpus) -> list[tuple[str, int]]:
    files = corpus.plain_files()
    if files is None:
        raise TokenizerError(
            "under MPI give plain text files or directories of them: stdin, pipes, compressed files and JSONL "
            "are read from their start by one process (run tk without mpirun, or decompress and extract first)"
        )
    return files


def _blocks(ranges: list[tuple[int, int]], n: int) -> list[list[tuple[int, int]]]:
    """`ranges` (in file order) in n contiguous blocks of about equal bytes.

    >>> _blocks([(0, 4), (4, 10), (10, 15)], 2)
    [[(0, 4), (4, 10)], [(10, 15)]]
    """
    total = ranges[-1][1] - ranges[0][0] if ranges else 0
    blocks: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    if total == 0:
        blocks[0] = list(ranges)
        return blocks
    for a, b in ranges:  # a range goes to the rank whose share holds its middle
        blocks[min(n - 1, (a + b) * n // (2 * total))].append((a, b))
    return blocks


def _blocks_of(f, dtype) -> Iterator[np.ndarray]:
    """The ids spilled into `f` in blocks of _SEND_IDS, then one empty block, which tells the
    receiving end that this rank is done."""
    yield from io.read_id_blocks(f, dtype, _SEND_IDS)
    yield np.zeros(0, dtype=dtype)


def _received(comm, source: int, dtype) -> Iterator[np.ndarray]:
    """What rank `source` sends from `_blocks_of`, block by block, up to its empty block."""
    while len(ids := recv_arrays(comm, source, [dtype])[0]):
        yield ids
