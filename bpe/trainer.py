"""Learn byte-level BPE merges from counted chunks, incrementally and exactly.

The input is what `bpe.pretokenize.count_chunks` returns: every distinct pre-token chunk
(bytes) with how often it occurs. Training starts from the 256 byte ids and repeatedly merges
the most frequent adjacent pair into a new id (merge r makes id 256 + r), exactly as the
textbook loop does — but without ever rescanning the corpus:

- every distinct chunk is laid out once in flat arrays (ids, next, prev, weight per position),
  a doubly linked list whose links never cross from one chunk into the next;
- `counts` holds every adjacent pair's frequency (occurrences weighted by chunk count);
- `where` maps a pair to the positions where it starts; entries are never deleted eagerly,
  they are checked when used (a stale position no longer holds the pair);
- a heap of encoded (-count, pair) picks the next merge; entries go stale when counts drop and
  are re-pushed with the current count when they reach the top (lazy invalidation).

The plain version is `train_merges_naive` below (minbpe's loop over `bpe.merge.pair_counts` and
`merge_pair`: recount every pair of every chunk before each merge); the tests hold this one to
it, merge for merge, on many random corpora.

A merge touches only the positions of the merged pair: it fixes the counts of the pairs on
either side and links out the right token. The work of a whole training run is proportional
to the number of merge sites, never merges x corpus size. A chunk may be as long as a whole
file (pattern "none"): a merge still touches only its own occurrences.

Constant factors, since this loop is the hot one: pairs are single int keys (`pack_pair`), the
position arrays are array.array (fast to index from Python) and numpy views of the same memory,
and the few early merges with hundreds of thousands of sites (" t", "he", ...) run as whole-array
numpy operations, while the long tail of small merges runs as a plain Python loop (timings in
BENCHMARKS.md).

What this module deliberately does not do: read files, split text, or know special tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from heapq import heapify, heappop, heappush, heapreplace

import numpy as np

from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.merge import merge_pair, pair_counts
from tokenkit.common import progress

__all__ = ["TrainResult", "pack_pair", "train_merges", "train_merges_naive", "unpack_pair"]


@dataclass(frozen=True)
class TrainResult:
    """What `train_merges` learned.

    merges: pairs of ids in rank order; merge r turns (a, b) into id 256 + r.
    counts: counts[r] is how often merges[r] occurred (chunk-weighted) when it was chosen.
    stop_reason: "vocab_size", "min_frequency" or "no_pairs" (every chunk is one token).
    tokens: the corpus's length in tokens once the merges are made (chunk-weighted): what
        encoding it with them gives, since a merge never makes a pair that outranks it
        (tests compare the two), read off the trainer's final state for free.
    """

    merges: list[tuple[int, int]]
    counts: list[int]
    stop_reason: str
    tokens: int


def train_merges(
    chunk_counts: Mapping[bytes, int],
    *,
    vocab_size: int | None = None,
    min_frequency: int | None = None,
    quiet: bool = False,
    on_merge: Callable[[int, tuple[int, int], int], None] | None = None,
) -> TrainResult:
    """Learn merges from `{chunk bytes: count}` until a stop rule holds.

    Stops when 256 + len(merges) == vocab_size, when the best pair occurs fewer than
    `min_frequency` times, or when no adjacent pair is left, whichever comes first; at least
    one of the two rules must be given. Merges never cross chunk boundaries.

    Ties: among pairs with the same count, the smallest (left id, right id) wins. Inside a
    chunk, overlapping occurrences are merged left to right ("aaa" -> "aa" "a"), and counts are
    of adjacent pairs, overlaps included ("aaa" holds (a, a) twice).

    `on_merge(rank, (a, b), count)` is called after each merge (for a verbose trace).

    >>> r = train_merges({b"aaabdaaabac": 1}, vocab_size=259)
    >>> r.merges, r.counts, r.stop_reason
    ([(97, 97), (97, 98), (256, 257)], [4, 2, 2], 'vocab_size')
    """
    if vocab_size is None and min_frequency is None:
        raise TokenizerError("give a vocab size or a minimum frequency (or both) to stop training")
    if vocab_size is not None and vocab_size < 256:
        raise TokenizerError(f"vocab size {vocab_size} is below 256: every byte needs an id; use at least 256")
    if min_frequency is not None and min_frequency < 1:
        raise TokenizerError(f"min frequency {min_frequency} must be at least 1")
    max_merges = None if vocab_size is None else vocab_size - 256

    state = _State(chunk_counts, max_merges)
    merges: list[tuple[int, int]] = []
    counts: list[int] = []
    stop_reason = "no_pairs"
    with progress.bar(total=max_merges, desc="merging", unit=" merges", quiet=quiet) as bar:
        while True:
            if max_merges is not None and len(merges) >= max_merges:
                stop_reason = "vocab_size"
                break
            best = state.pop_best()
            if best is None:
                break
            count, key = best
            if min_frequency is not None and count < min_frequency:
                stop_reason = "min_frequency"
                break
            pair = unpack_pair(key, state.shift)
            state.merge(key, pair[0], pair[1], 256 + len(merges))
            merges.append(pair)
            counts.append(count)
            if on_merge is not None:
                on_merge(len(merges) - 1, pair, count)
            if len(merges) & 63 == 0:  # a bar refresh per merge would cost more than some merges
                bar.update(64)
        bar.update(len(merges) & 63)
    single_bytes = sum(n for chunk, n in chunk_counts.items() if len(chunk) == 1)  # never in the state
    return TrainResult(merges, counts, stop_reason, state.tokens() + single_bytes)


def train_merges_naive(
    chunk_counts: Mapping[bytes, int], vocab_size: int | None = None, min_frequency: int | None = None
) -> TrainResult:
    """`train_merges`, the obvious way: before every merge, recount every adjacent pair of every
    chunk (weighted by its count), take the most frequent (ties: the smallest pair), and rewrite
    every chunk left to right. O(merges x corpus): for reading and for tests, not for use.

    >>> train_merges_naive({b"aaabdaaabac": 1}, vocab_size=259).merges
    [(97, 97), (97, 98), (256, 257)]
    """
    words = [(list(chunk), n) for chunk, n in chunk_counts.items()]
    merges: list[tuple[int, int]] = []
    counts: list[int] = []

    def result(stop_reason: str) -> TrainResult:
        return TrainResult(merges, counts, stop_reason, sum(len(seq) * n for seq, n in words))

    while True:
        if vocab_size is not None and 256 + len(merges) >= vocab_size:
            return result("vocab_size")
        stats: dict[tuple[int, int], int] = {}
        for seq, n in words:
            pair_counts(seq, stats, weight=n)
        if not stats:
            return result("no_pairs")
        pair = min(stats, key=lambda p: (-stats[p], p))
        if min_frequency is not None and stats[pair] < min_frequency:
            return result("min_frequency")
        words = [(merge_pair(seq, pair, 256 + len(merges)), n) for seq, n in words]
        merges.append(pair)
        counts.append(stats[pair])


def pack_pair(a: int, b: int, shift: int) -> int:
    """The pair (a, b) as one int key, `a` in the high bits: keys sort as the tuples do.

    >>> pack_pair(3, 5, 4), unpack_pair(pack_pair(3, 5, 4), 4)
    (53, (3, 5))
    """
    return (a << shift) | b


def unpack_pair(key: int, shift: int) -> tuple[int, int]:
    """The pair of a `pack_pair` key."""
    return key >> shift, key & ((1 << shift) - 1)


_BULK_SITES = 128  # from about this many candidate sites, numpy beats the per-site Python loop


class _State:
    """The flat linked-list corpus, pair counts, pair -> positions index and the lazy heap.

    A pair (a, b) is keyed by the int `pack_pair(a, b, shift)`; that key sorts like the tuple, so the
    heap's int entries `-count * 2**(2*shift) + key` pop the highest count first and, among
    equal counts, the smallest pair: the documented tie rule, with no tuples to allocate.

    `where[key]` is a list of positions (pairs born in a small merge) or `(array, start, end)`,
    a slice of a sorted array that is only cut out if the pair is ever merged: most pairs never
    are, and one array per pair would cost more than the rest of a big merge. Either way the
    positions are ascending: merges visit sites left to right and file new pairs in that order.
    """

    def __init__(self, chunk_counts: Mapping[bytes, int], max_merges: int | None) -> None:
        chunks = [c for c in chunk_counts if len(c) > 1]  # a single byte holds no pair
        weights = np.fromiter((chunk_counts[c] for c in chunks), dtype=np.int64, count=len(chunks))
        if weights.size and weights.min() < 1:
            raise TokenizerError("chunk counts must be positive integers")
        lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
        n = int(lengths.sum())
        if n >= 2**31 - 1:
            raise TokenizerError("the corpus has 2 GiB or more of distinct chunk bytes; split it into smaller sources")
        flat = np.frombuffer(b"".join(chunks), dtype=np.uint8)
        ends = np.cumsum(lengths)  # one past each chunk's last position

        most_merges = n if max_merges is None else min(max_merges, n)  # each merge removes >= 1 position
        self.shift = (255 + most_merges).bit_length()
        self.key_span = 1 << (2 * self.shift)

        # array.array: compact, and as fast to index from Python as a list. The numpy views share
        # the same memory, for merges with so many sites that whole-array operations pay off.
        # Links: -1 ends a chunk, so no pair ever spans two chunks.
        self.ids, self.ids_np = _shared("i", flat)
        self.nxt, self.nxt_np = _shared("i", np.arange(1, n + 1, dtype=np.int32))
        self.prv, self.prv_np = _shared("i", np.arange(-1, n - 1, dtype=np.int32))
        if n:
            self.nxt_np[ends - 1] = -1
            self.prv_np[ends[:-1]] = -1
        wide = weights.size and weights.max() >= 2**31
        weights = weights if wide else weights.astype(np.int32)  # no int64 temporary per position
        self.wt, self.wt_np = _shared("q" if wide else "i", np.repeat(weights, lengths))
        del flat, weights, lengths, ends

        # Initial pair counts and positions: one O(n) radix sort of the 16-bit byte pairs.
        starts = np.flatnonzero(self.nxt_np >= 0).astype(np.int32)
        pairs = (self.ids_np[starts].astype(np.uint16) << 8) | self.ids_np[starts + 1].astype(np.uint16)
        order = np.argsort(pairs, kind="stable")  # stable: positions stay ascending per pair
        pairs, starts = pairs[order], starts[order]
        del order
        self.counts: dict[int, int] = {}
        self.where: dict[int, list[int] | tuple[np.ndarray, int, int]] = {}
        for pair, count, lo, hi in _groups(pairs, self.wt_np[starts]):
            key = pack_pair(pair >> 8, pair & 255, self.shift)
            self.counts[key] = count
            self.where[key] = (starts, lo, hi)
        span = self.key_span
        self.heap = [key - c * span for key, c in self.counts.items()]
        heapify(self.heap)

    def tokens(self) -> int:
        """The chunks' length in tokens now, chunk-weighted: the positions not linked out."""
        return int(self.wt_np[self.ids_np >= 0].sum(dtype=np.int64))

    def pop_best(self) -> tuple[int, int] | None:
        """Remove and return (count, key) of the best current pair, or None when none is left."""
        heap, counts, span = self.heap, self.counts, self.key_span
        while heap:
            entry = heap[0]
            key = entry % span
            count = (key - entry) // span
            current = counts.get(key, 0)
            if current == count:
                heappop(heap)
                return count, key
            if current:  # the count dropped since this entry was pushed: re-file it
                heapreplace(heap, key - current * span)
            else:
                heappop(heap)
        return None

    def merge(self, key: int, a: int, b: int, new: int) -> None:
        """Replace every live (a, b) by `new`, fixing neighbouring pair counts and the index.

        Positions are checked when used: one that no longer holds (a, b) is stale and skipped.
        A position's id only ever changes to a brand-new id, so a stale entry never comes back
        to life. In a run like "aaa" occurrences overlap: they are merged left to right.

        Sites are visited left to right, so a left neighbour may already be `new` (two
        occurrences touching: "abab"), a right neighbour never is. Pair keys are `pack_pair`,
        written out: a call per site would cost more than the site's work.
        """
        positions = self.where.pop(key)
        if type(positions) is tuple:
            array_, lo, hi = positions
            if a != b and hi - lo >= _BULK_SITES:
                return self._merge_bulk(key, a, b, new, array_[lo:hi])
            positions = array_[lo:hi].tolist()
        elif a != b and len(positions) >= _BULK_SITES:
            return self._merge_bulk(key, a, b, new, np.array(positions, dtype=np.int64))
        ids, nxt, prv, wt = self.ids, self.nxt, self.prv, self.wt
        counts, shift = self.counts, self.shift
        new_hi = new << shift
        b_hi = b << shift
        born_counts: dict[int, int] = {}  # pairs containing `new`, created by this merge
        born_where: dict[int, list[int]] = {}
        for i in positions:
            if ids[i] != a:
                continue  # stale: this position was merged or linked out since it was filed
            j = nxt[i]
            if j < 0 or ids[j] != b:
                continue
            w = wt[i]
            p = prv[i]
            if p >= 0:
                x = ids[p]
                if x == new:  # the left neighbour was merged a moment ago in this same pass
                    born_counts[new_hi | a] -= w
                else:
                    counts[(x << shift) | a] -= w
                k = (x << shift) | new
                if k in born_counts:
                    born_counts[k] += w
                    born_where[k].append(p)
                else:
                    born_counts[k] = w
                    born_where[k] = [p]
            n = nxt[j]
            if n >= 0:
                y = ids[n]
                counts[b_hi | y] -= w
                k = new_hi | y
                if k in born_counts:
                    born_counts[k] += w
                    born_where[k].append(i)
                else:
                    born_counts[k] = w
                    born_where[k] = [i]
                prv[n] = i
            nxt[i] = n
            ids[i] = new
            ids[j] = -1
        del counts[key]  # only now: in a run like "aaa" the overlapping (a, a) is decremented on the way
        self._add_pairs((k, c, born_where[k]) for k, c in born_counts.items() if c > 0)

    def _add_pairs(self, born) -> None:
        """File the pairs a merge created, (key, count, positions) each: counted, indexed, queued."""
        counts, where, heap, span = self.counts, self.where, self.heap, self.key_span
        for k, c, positions in born:
            counts[k] = c
            where[k] = positions
            heappush(heap, k - c * span)

    def _merge_bulk(self, key: int, a: int, b: int, new: int, i: np.ndarray) -> None:
        """`merge` for a != b with many sites, in whole-array operations.

        With a != b two occurrences never overlap, but they can touch ("abab"): then the pair
        between them, (b, a), is lost once (as the right neighbour of the first occurrence),
        and the pair born between them, (new, new), is counted once (as the first's right pair).
        """
        ids, nxt, prv, wt = self.ids_np, self.nxt_np, self.prv_np, self.wt_np
        counts, shift = self.counts, self.shift
        i = i[ids[i] == a]
        j = nxt[i]
        i, j = i[j >= 0], j[j >= 0]
        live = ids[j] == b
        i, j = i[live], j[live]
        w = wt[i]
        left, right = prv[i], nxt[j]
        has_left, has_right = left >= 0, right >= 0
        left, w_left = left[has_left], w[has_left]
        i_right, right, w_right = i[has_right], right[has_right], w[has_right]
        left_ids, right_ids = ids[left], ids[right]  # before any change

        ids[j] = -1
        ids[i] = new
        nxt[i] = -1
        nxt[i_right] = right
        prv[right] = i_right
        # A left neighbour that was the right half of another occurrence is linked out now; the
        # pair there was counted from that occurrence's side.
        own = ids[left] != -1
        left, left_ids, w_left = left[own], left_ids[own], w_left[own]

        for x, lost, _, _ in _groups(left_ids, w_left, keep_order=False):
            counts[pack_pair(x, a, shift)] -= lost
        for y, lost, _, _ in _groups(right_ids, w_right, keep_order=False):
            counts[pack_pair(b, y, shift)] -= lost
        del counts[key]

        # Born pairs: (x, new) at each left neighbour, (new, y) at each merged site with a right
        # neighbour (y is `new` itself where two occurrences touched).
        for neighbour_ids, sites, weights, side in ((left_ids, left, w_left, 0), (ids[right], i_right, w_right, 1)):
            order = np.argsort(neighbour_ids.astype(np.uint16) if new < 65536 else neighbour_ids, kind="stable")
            sites = sites[order]  # stable: ascending within each neighbour id
            self._add_pairs(
                (pack_pair(new, x, shift) if side else pack_pair(x, new, shift), count, (sites, lo, hi))
                for x, count, lo, hi in _groups(neighbour_ids[order], weights[order])
            )


def _shared(typecode: str, values: np.ndarray) -> tuple[array, np.ndarray]:
    """An array.array holding `values`, and a numpy view of the very same memory."""
    store = array(typecode)
    dtype = np.dtype(typecode)  # "i" -> int32, "q" -> int64, as array.array lays them out
    store.frombytes(memoryview(np.ascontiguousarray(values, dtype=dtype)).cast("B"))
    return store, np.frombuffer(store, dtype=dtype)


def _groups(values: np.ndarray, weights: np.ndarray, keep_order: bool = True):
    """Runs of equal values in sorted `values`: (value, weight sum, start, end) per run.

    With keep_order=False the values are sorted here first (the starts then index nothing useful).
    """
    if not values.size:
        return []
    if not keep_order:
        order = np.argsort(values)
        values, weights = values[order], weights[order]
    first = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    sums = np.add.reduceat(weights, first, dtype=np.int64)
    bounds = first.tolist()
    return zip(values[first].tolist(), sums.tolist(), bounds, bounds[1:] + [len(values)], strict=True)
