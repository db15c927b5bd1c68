"""The merges of one text replayed step by step, in the order the tokenizer's ranks give them.

What it does: from the byte ids of a text's pre-token chunks, lists every step that turns them
into tokens. A step is the lowest-rank pair that can merge anywhere in the text, merged at all
its occurrences in every chunk (left to right, without overlap: in a a a the first two merge);
its positions are indices into the whole sequence (all chunks one after the other) as it was
before the step. Chunks never merge across each other.

Why the text's steps in rank order give what encoding gives: inside one chunk, encoding merges
the lowest-rank pair first, and a merge only creates pairs of higher rank (they hold the new id,
256 + rank), so each chunk's merges come in increasing rank, each rank once. Interleaving the
chunks by rank changes no chunk's own order. A listed vocabulary may break that (`bpe.layout`:
Llama 3's makes "abcd" from "abc" + "d" before it makes "abc"); where it does (`monotone`
false), a step is one merge: the lowest-rank pair, leftmost, as encoding merges.

`replay_merges` does it with a heap over one linked list (`bpe.merge.Linked`: O(n log n) in the
text's bytes) and finds each step's positions with a Fenwick tree of the tokens still there; `replay_merges_naive`
below is the plain version, a rescan of the whole sequence per step, which the tests hold it to.

>>> steps, ids = replay_merges([[97, 97, 97, 98], [97, 97]], {(97, 97): 256, (256, 97): 257})
>>> [(s.new_id, s.at) for s in steps], ids
([(256, [0, 4]), (257, [0])], [257, 98, 256])

What it deliberately does not do: split text into chunks or handle special tokens (the
tokenizer does, `Tokenizer.replay`), or know about files.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from tokenkit.bpe.merge import Linked

__all__ = ["MergeStep", "Replay", "replay_merges", "replay_merges_naive"]


@dataclass(frozen=True)
class MergeStep:
    """One step: `pair`, merge `rank`, became `new_id` at positions `at` of the sequence before
    the step (the left half's index, ascending)."""

    new_id: int
    pair: tuple[int, int]
    at: list[int]
    rank: int


@dataclass(frozen=True)
class Replay:
    """A text from bytes to tokens (`Tokenizer.replay`).

    initial: the ids before any merge, one per byte (a special token is one id from the start);
    chunks: the pre-token chunks as (start, end) indices into `initial`, a special token its own;
    steps: the merges in rank order (`MergeStep`); ids: the sequence after the last step, which
    is what `Tokenizer.encode` gives.
    """

    initial: list[int]
    chunks: list[tuple[int, int]]
    steps: list[MergeStep]
    ids: list[int]


class _Alive:
    """A Fenwick tree of 0/1 flags: which of n places still hold a token, and how many before one."""

    def __init__(self, n: int) -> None:
        self._n = n
        tree = [0] * (n + 1)
        for i in range(1, n + 1):  # all ones, built in O(n)
            tree[i] += 1
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        self._tree = tree

    def remove(self, i: int) -> None:
        i += 1
        while i <= self._n:
            self._tree[i] -= 1
            i += i & -i

    def before(self, i: int) -> int:
        """Tokens still there at places < i."""
        total = 0
        while i > 0:
            total += self._tree[i]
            i -= i & -i
        return total


def replay_merges(
    chunks: Sequence[Sequence[int]],
    pair_id: Mapping[tuple[int, int], int],
    made: Sequence[int] | None = None,
    monotone: bool = True,
) -> tuple[list[MergeStep], list[int]]:
    """(the steps that merge `chunks` (each a list of ids) into tokens, the ids after the last
    step); pair_id[(a, b)] is the pair's rank key (256 + rank), absent for a pair with no merge;
    made[rank] the id it makes (None: the key itself); `monotone` as above.

    One linked list holds every chunk (`bpe.merge.Linked`, as `merge_chunk_heap` merges one),
    and its heap pops lowest rank first and, for one rank, left to right: the pops of one rank
    are one step. An entry is checked when popped (a neighbour may have merged since).
    """
    linked = Linked(chunks, pair_id)
    heap = linked.heap
    alive = _Alive(len(linked.val))
    steps: list[MergeStep] = []
    while heap:
        new = heap[0][0]
        at: list[int] = []
        pair = None
        removed = 0  # right halves removed earlier in this step: all to the left of the next place
        new_id = new if made is None else made[new - 256]
        while heap and heap[0][0] == new and (monotone or not at):
            _, i = heapq.heappop(heap)
            if not linked.holds(i, new):
                continue  # stale
            pair = (linked.val[i], linked.val[linked.nxt[i]])
            at.append(alive.before(i) + removed)
            alive.remove(linked.merge_at(i, new_id))  # pushes a later step's pairs (higher ranks when monotone)
            removed += 1
        if at:
            steps.append(MergeStep(new_id, pair, at, new - 256))
    return steps, linked.ids()


def replay_merges_naive(
    chunks: Sequence[Sequence[int]],
    pair_id: Mapping[tuple[int, int], int],
    made: Sequence[int] | None = None,
    monotone: bool = True,
) -> tuple[list[MergeStep], list[int]]:
    """`replay_merges`, plainly: before each step, look at every adjacent pair of every chunk for
    the lowest rank, then merge it in each chunk left to right without overlap (only its first
    place when not `monotone`)."""
    seqs = [list(chunk) for chunk in chunks]
    steps: list[MergeStep] = []
    while True:
        found = [pair_id[p] for s in seqs for p in pairwise(s) if p in pair_id]
        if not found:
            return steps, [v for s in seqs for v in s]
        new = min(found)
        new_id = new if made is None else made[new - 256]
        at: list[int] = []
        offset = 0
        pair = None
        for c, s in enumerate(seqs):
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and pair_id.get((s[i], s[i + 1])) == new and (monotone or not at):
                    pair = (s[i], s[i + 1])
                    at.append(offset + i)
                    out.append(new_id)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            offset += len(s)
            seqs[c] = out
        steps.append(MergeStep(new_id, pair, at, new - 256))
