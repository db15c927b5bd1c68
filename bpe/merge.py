"""The merge loop, once: how a chunk of ids becomes tokens, and the two steps training repeats.

What it does, as plain functions on lists of ids (minbpe's `get_stats` and `merge`, then its
`_encode_chunk`):
- `pair_counts(ids)`: how often each adjacent pair occurs (what training picks the next merge from);
- `merge_pair(ids, pair, new_id)`: every occurrence of one pair replaced, left to right;
- `merge_chunk(ids, pair_id)`: a chunk's tokens: merge the pair with the lowest rank, leftmost
  first, until no adjacent pair has a merge. `merge_chunk_heap` gives the same result in
  O(n log n) for long chunks, over a linked list (`Linked`) whose relinking after a merge
  (`Linked.merge_at`) `bpe.replay` shares; `merge_ids` picks one of the two by length.

The merges come as `pair_id`: pair -> its rank key, 256 + rank, which orders the merges and is
also the id a merge makes in the canonical layout; `made[rank]` gives the id it makes otherwise
(a listed vocabulary, `bpe.layout`). The fast paths are built on these and tested against them:
`bpe.encoder.merge_batch` (many chunks at once, in NumPy), `bpe.replay.replay_merges` (a whole
text, step by step), `bpe.trainer.train_merges` (incremental counts).

What it deliberately does not do: split text into chunks, cache, learn which merges to make
(bpe/trainer.py), or know about special tokens and files.

Minbpe's example: merges (a,a) -> 256, (a,b) -> 257, (256,257) -> 258 turn "aaabdaaabac" into
[258, d, 258, a, c]:

>>> pair_id = {(97, 97): 256, (97, 98): 257, (256, 257): 258}
>>> merge_chunk(list(b"aaabdaaabac"), pair_id)
[258, 100, 258, 97, 99]
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from itertools import pairwise, repeat

__all__ = ["LONG_CHUNK", "Linked", "merge_chunk", "merge_chunk_heap", "merge_ids", "merge_pair", "pair_counts"]

NO_MERGE = 1 << 62  # rank key of a pair that has no merge; larger than any id
LONG_CHUNK = 64  # from this many ids on, `merge_ids` merges with a heap instead of rescanning

PairId = Mapping[tuple[int, int], int]


def pair_counts(ids: Sequence[int], counts: dict | None = None, weight: int = 1) -> dict[tuple[int, int], int]:
    """How often each adjacent pair occurs in `ids`, overlaps included, each occurrence counted
    `weight` times (a chunk's count in the corpus), added to `counts` when given.

    >>> pair_counts([97, 97, 97, 98])
    {(97, 97): 2, (97, 98): 1}
    """
    counts = {} if counts is None else counts
    for pair in pairwise(ids):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """`ids` with every occurrence of `pair` replaced by `new_id`, left to right without overlap
    (in a a a the first two merge).

    >>> merge_pair([97, 97, 97, 98], (97, 97), 256)
    [256, 97, 98]
    """
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_chunk(ids: list[int], pair_id: PairId, made: Sequence[int] | None = None) -> list[int]:
    """The tokens of one chunk: merge the lowest-rank pair, leftmost first, until no pair has a
    merge (`ids` is merged in place and returned).

    minbpe recounts the pairs (`pair_counts`) before every merge; here `ranks[i]`, the rank key
    of (ids[i], ids[i+1]), is kept beside the ids, and a merge rewrites one slot and refreshes
    only its two neighbours. Quadratic in the worst case, which beats a heap for the few bytes
    of a typical chunk (`merge_chunk_heap` for long ones).
    Example, merges (a,a) -> 256, (256,a) -> 257: aaab -> [256,a,b] -> [257,b].

    >>> merge_chunk([97, 97, 97, 98], {(97, 97): 256, (256, 97): 257})
    [257, 98]
    """
    get = pair_id.get
    ranks = list(map(get, pairwise(ids), repeat(NO_MERGE)))
    while ranks:
        new = min(ranks)
        if new == NO_MERGE:
            break
        i = ranks.index(new)
        ids[i] = new = new if made is None else made[new - 256]
        del ids[i + 1]
        del ranks[i]
        if i < len(ranks):
            ranks[i] = get((new, ids[i + 1]), NO_MERGE)
        if i:
            ranks[i - 1] = get((ids[i - 1], new), NO_MERGE)
    return ids


class Linked:
    """Chunks of ids in one linked list (no link from one chunk into the next), with a heap of
    the merges waiting: (rank key, place of the pair's left half), lowest rank first and, for one
    rank, left to right. An entry goes stale when a neighbour merges first, so it is checked
    when popped (`holds`). `merge_chunk_heap` and `bpe.replay.replay_merges` run on it.
    """

    def __init__(self, chunks: Sequence[Sequence[int]], pair_id: PairId) -> None:
        self.val: list[int] = [v for chunk in chunks for v in chunk]  # -1 where a token was merged away
        n = len(self.val)
        self.nxt = list(range(1, n + 1))  # -1: the end of a chunk
        self.prv = list(range(-1, n - 1))  # -1: the start of a chunk
        if n:
            self.nxt[-1] = -1
        end = -1
        for chunk in chunks[:-1]:
            end += len(chunk)
            if 0 <= end < n - 1:  # an empty chunk adds no place and no cut
                self.nxt[end], self.prv[end + 1] = -1, -1
        self.get = get = pair_id.get
        val, nxt = self.val, self.nxt
        self.heap = [(r, i) for i in range(n - 1) if nxt[i] >= 0 and (r := get((val[i], val[i + 1]))) is not None]
        heapq.heapify(self.heap)

    def holds(self, i: int, key: int) -> bool:
        """Whether the pair at place i is still the one of rank key `key` (the entry is not stale)."""
        j = self.nxt[i]
        return self.val[i] >= 0 and j >= 0 and self.get((self.val[i], self.val[j])) == key

    def merge_at(self, i: int, new_id: int) -> int:
        """Merge the pair at place i into `new_id`: its right half is linked out (its place is
        returned), and the pairs the new token forms with its neighbours join the heap."""
        val, nxt, prv, get, heap = self.val, self.nxt, self.prv, self.get, self.heap
        j = nxt[i]
        val[i], val[j] = new_id, -1
        k = nxt[j]
        nxt[i] = k
        if k >= 0:
            prv[k] = i
            r = get((new_id, val[k]))
            if r is not None:
                heapq.heappush(heap, (r, i))
        p = prv[i]
        if p >= 0:
            r = get((val[p], new_id))
            if r is not None:
                heapq.heappush(heap, (r, p))
        return j

    def ids(self) -> list[int]:
        """The ids still there, in order."""
        return [v for v in self.val if v >= 0]


def merge_chunk_heap(ids: Sequence[int], pair_id: PairId, made: Sequence[int] | None = None) -> list[int]:
    """`merge_chunk`'s result in O(n log n): a linked list of tokens and a heap of candidate
    merges (`Linked`). Lowest rank first and equal ranks left to right, and every pair a merge
    creates is pushed, so the merges come in exactly `merge_chunk`'s order.

    >>> merge_chunk_heap(list(b"aaabdaaabac"), {(97, 97): 256, (97, 98): 257, (256, 257): 258})
    [258, 100, 258, 97, 99]
    """
    linked = Linked([ids], pair_id)
    heap, pop = linked.heap, heapq.heappop
    while heap:
        key, i = pop(heap)
        if linked.holds(i, key):
            linked.merge_at(i, key if made is None else made[key - 256])
    return linked.ids()


def merge_ids(ids: list[int], pair_id: PairId, made: Sequence[int] | None = None) -> list[int]:
    """`merge_chunk`'s result, with the heap from LONG_CHUNK ids on."""
    if len(ids) >= LONG_CHUNK:
        return merge_chunk_heap(ids, pair_id, made)
    return merge_chunk(ids, pair_id, made)
