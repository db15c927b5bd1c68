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

A merge touches only the positions of the merged pair: it fixes the counts of the pairs on
either side and links out the right token. The work of a whole training run is proportional
to the number of merge sites, never merges x corpus size. A chunk may be as long as a whole
file (pattern "none"): a merge still touches only its own occurrences.

What this module deliberately does not do: read files, split text, or know special tokens.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from heapq import heapify, heappop, heappush, heapreplace

import numpy as np
from tqdm import tqdm

from bpe.errors import TokenizerError

__all__ = ["TrainResult", "train_merges"]


@dataclass(frozen=True)
class TrainResult:
    """What `train_merges` learned.

    merges: pairs of ids in rank order; merge r turns (a, b) into id 256 + r.
    counts: counts[r] is how often merges[r] occurred (chunk-weighted) when it was chosen.
    stop_reason: "vocab_size", "min_frequency" or "no_pairs" (every chunk is one token).
    """

    merges: list[tuple[int, int]]
    counts: list[int]
    stop_reason: str


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
    with tqdm(
        total=max_merges, desc="merging", unit=" merges", disable=quiet or not sys.stderr.isatty()
    ) as bar:
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
            pair = (key >> state.shift, key & state.id_mask)
            state.merge(key, pair[0], pair[1], 256 + len(merges))
            merges.append(pair)
            counts.append(count)
            if on_merge is not None:
                on_merge(len(merges) - 1, pair, count)
            if len(merges) & 63 == 0:  # a bar refresh per merge would cost more than some merges
                bar.update(64)
        bar.update(len(merges) & 63)
    return TrainResult(merges, counts, stop_reason)


_BULK_SITES = 128  # from about this many candidate sites, numpy beats the per-site Python loop


class _State:
    """The flat linked-list corpus, pair counts, pair -> positions index and the lazy heap.

    A pair (a, b) is keyed by the int `a << shift | b`; that key sorts like the tuple, so the
    heap's int entries `-count * 2**(2*shift) + key` pop the highest count first and, among
    equal counts, the smallest pair: the documented tie rule, with no tuples to allocate.
    """

    def __init__(self, chunk_counts: Mapping[bytes, int], max_merges: int | None) -> None:
        chunks = [c for c in chunk_counts if len(c) > 1]  # a single byte holds no pair
        weights = np.fromiter((chunk_counts[c] for c in chunks), dtype=np.int64, count=len(chunks))
        if weights.size and weights.min() < 1:
            raise TokenizerError("chunk counts must be positive integers")
        flat = np.frombuffer(b"".join(chunks), dtype=np.uint8)
        n = flat.size
        lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
        ends = np.cumsum(lengths)  # one past each chunk's last position

        most_merges = n if max_merges is None else min(max_merges, n)  # each merge removes >= 1 position
        self.shift = (255 + most_merges).bit_length()
        self.id_mask = (1 << self.shift) - 1
        self.key_span = 1 << (2 * self.shift)

        # Links: -1 ends a chunk, so no pair ever spans two chunks.
        nxt = np.arange(1, n + 1, dtype=np.int64)
        prv = np.arange(-1, n - 1, dtype=np.int64)
        if n:
            nxt[ends - 1] = -1
            prv[ends[:-1]] = -1
        if n >= 2**31 - 1:
            raise TokenizerError("the corpus has 2 GiB or more of distinct chunk bytes; split it into smaller sources")
        # array.array: compact, and as fast to index from Python as a list. The numpy views share
        # the same memory, for merges with so many sites that whole-array operations pay off.
        self.ids = array("i", flat.astype(np.int32).tobytes())
        self.nxt = array("i", nxt.astype(np.int32).tobytes())
        self.prv = array("i", prv.astype(np.int32).tobytes())
        self.wt = array("q", np.repeat(weights, lengths).tobytes())
        self.ids_np = np.frombuffer(self.ids, dtype=np.int32)
        self.nxt_np = np.frombuffer(self.nxt, dtype=np.int32)
        self.prv_np = np.frombuffer(self.prv, dtype=np.int32)
        self.wt_np = np.frombuffer(self.wt, dtype=np.int64)

        # Initial pair counts and positions, grouped in one sort instead of n dict updates.
        starts = np.flatnonzero(nxt >= 0)
        keys = (flat[starts].astype(np.int64) << self.shift) | flat[starts + 1]
        order = np.argsort(keys, kind="stable")  # stable: positions stay ascending per pair
        keys = keys[order]
        pos = starts[order]
        first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if keys.size else keys
        totals = np.add.reduceat(np.repeat(weights, lengths)[pos], first) if keys.size else keys
        uniq = keys[first].tolist()
        self.counts: dict[int, int] = dict(zip(uniq, totals.tolist()))
        # Initial pairs keep their positions as array views; pairs born in a merge use lists.
        self.where: dict[int, object] = dict(zip(uniq, np.split(pos, first[1:])))
        span = self.key_span
        self.heap = [key - c * span for key, c in self.counts.items()]
        heapify(self.heap)

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
        """Replace every live (a, b) by `new`, fixing neighbouring pair counts and the index."""
        ids, nxt, prv, wt = self.ids, self.nxt, self.prv, self.wt
        counts, where, shift = self.counts, self.where, self.shift
        positions = where.pop(key)
        if a != b and len(positions) >= _BULK_SITES:
            self._merge_bulk(key, a, b, new, positions)
            return
        if type(positions) is not list:
            positions = positions.tolist()
        if a == b:  # overlapping runs must be merged left to right, as the naive loop does
            positions.sort()
        new_hi = new << shift
        a_lo = a
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
                    born_counts[new_hi | a_lo] -= w
                else:
                    counts[(x << shift) | a_lo] -= w
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
                if y == new:
                    born_counts[b_hi | new] -= w
                else:
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
        span = self.key_span
        heap = self.heap
        for k, c in born_counts.items():
            if c > 0:
                counts[k] = c
                where[k] = born_where[k]
                heappush(heap, k - c * span)

    def _merge_bulk(self, key: int, a: int, b: int, new: int, positions) -> None:
        """`merge` for a != b with many sites, in whole-array operations.

        With a != b two occurrences never overlap, but they can touch ("abab"): then the pair
        between them, (b, a), is counted as destroyed once (as the right neighbour of the first),
        and the pair born between them, (new, new), once (as the right pair of the first).
        """
        ids, nxt, prv, wt = self.ids_np, self.nxt_np, self.prv_np, self.wt_np
        counts, where, shift, span = self.counts, self.where, self.shift, self.key_span
        i = np.asarray(positions, dtype=np.int64)
        i = i[ids[i] == a]
        j = nxt[i]
        live = j >= 0
        i, j = i[live], j[live]
        live = ids[j] == b
        i, j = i[live], j[live]
        w = wt[i]
        left = prv[i]
        right = nxt[j]
        has_left = left >= 0
        has_right = right >= 0
        left_ids = ids[left[has_left]]  # before any change
        right_ids = ids[right[has_right]]

        ids[j] = -1
        ids[i] = new
        nxt[i] = right
        prv[right[has_right]] = i[has_right]
        # A left neighbour that was the right half of another occurrence is now that occurrence's
        # new token: its pair was counted from that side already.
        own_left = ids[left[has_left]] == -1
        own_left = ~own_left

        dec_keys = np.concatenate(((left_ids[own_left].astype(np.int64) << shift) | a, (b << shift) | right_ids.astype(np.int64)))
        dec_w = np.concatenate((w[has_left][own_left], w[has_right]))
        lost_keys, lost, _ = _group_sums(dec_keys, dec_w)
        for k, d in zip(lost_keys, lost):
            counts[k] -= d
        del counts[key]

        born_keys = np.concatenate(
            ((left_ids[own_left].astype(np.int64) << shift) | new, (new << shift) | ids[right[has_right]].astype(np.int64))
        )
        born_pos = np.concatenate((left[has_left][own_left], i[has_right]))
        born_w = np.concatenate((w[has_left][own_left], w[has_right]))
        order = np.argsort(born_keys, kind="stable")
        born_keys, born_pos, born_w = born_keys[order], born_pos[order], born_w[order]
        uniq, totals, first = _group_sums(born_keys, born_w, presorted=True)
        heap = self.heap
        for k, c, sites in zip(uniq, totals, np.split(born_pos, first[1:])):
            counts[k] = c
            where[k] = sites
            heappush(heap, k - c * span)


def _group_sums(keys: np.ndarray, weights: np.ndarray, presorted: bool = False):
    """(distinct keys, their weight sums) as lists, plus the start of each group in sorted order."""
    if not keys.size:
        return [], [], keys
    if not presorted:
        order = np.argsort(keys)
        keys, weights = keys[order], weights[order]
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[first].tolist(), np.add.reduceat(weights, first).tolist(), first
