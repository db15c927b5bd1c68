"""The encoder's hot path: caches that look many chunks up at once and merge the new ones together.

What it does: turns a list of pre-token chunks (str) into their ids as one buffer of raw
unsigned integers (uint16 or uint32, native order), looking each chunk up in a dict at C speed
(`map(ids.get, chunks)`, `b"".join`: no Python code per chunk) and merging all new chunks of a
call together with NumPy (`merge_batch`), one round of merges for every chunk at a time. For
GPT-2's split pattern a first level (`WordCache`) looks whole words up before any chunk: a
simpler split and fewer lookups.

What it deliberately does not do: split text into chunks (bpe/pretokenize.py), handle special
tokens or the tokenizer's policy (bpe/tokenizer.py). The plain one-chunk-at-a-time merge that
this must equal is `Tokenizer._merge_short`; tests compare the two on many random inputs.

>>> table = PairTable([(97, 97), (256, 97)])       # "aa" -> 256, then "aa"+"a" -> 257
>>> ids, lengths = merge_batch(np.array([97, 97, 97, 98, 97, 97]), np.array([4, 2]), table)
>>> ids.tolist(), lengths.tolist()
([257, 98, 256], [2, 1])
"""

from __future__ import annotations

import re
from itertools import compress, repeat
from operator import is_, not_
from typing import Sequence

import numpy as np

from bpe.errors import TokenizerError

NO_MERGE = np.iinfo(np.int32).max  # "merged id" of a pair that has no merge; larger than any id
_BATCH_BYTES = 1 << 18  # bytes of new chunks merged per merge_batch call (~40 bytes of arrays each)


class PairTable:
    """The merges as a hash table in NumPy arrays: (left, right) -> merged id (= 256 + rank), for
    many pairs at once. Byte pairs, which every chunk starts with, are a direct 256 x 256 table."""

    _MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of key * this

    def __init__(self, merges: Sequence[tuple[int, int]]) -> None:
        self.n_ids = 256 + len(merges)
        pairs = np.array(merges, dtype=np.int64).reshape(-1, 2)
        bits = max(8, int(4 * len(merges)).bit_length())  # at most a quarter full: probes stay short
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self._keys = np.full(1 << bits, -1, dtype=np.int64)
        self._ids = np.full(1 << bits, NO_MERGE, dtype=np.int32)
        keys = pairs[:, 0] * self.n_ids + pairs[:, 1]
        todo, slot = np.arange(len(keys)), self._home(keys)
        while todo.size:  # linear probing, all keys at once: the first key to claim a free slot gets it
            free = self._keys[slot] == -1
            first = np.unique(slot[free], return_index=True)[1]
            won = np.flatnonzero(free)[first]
            self._keys[slot[won]] = keys[todo[won]]
            self._ids[slot[won]] = 256 + todo[won]
            lost = np.ones(todo.size, dtype=bool)
            lost[won] = False
            todo, slot = todo[lost], (slot[lost] + 1) & self._mask
        self._bytes = np.full(256 * 256, NO_MERGE, dtype=np.int32)
        small = (pairs[:, 0] < 256) & (pairs[:, 1] < 256)
        self._bytes[pairs[small, 0] * 256 + pairs[small, 1]] = 256 + np.flatnonzero(small)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64) * self._MULTIPLIER) >> self._shift).astype(np.int64)

    def lookup(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Merged id of each pair (left[i], right[i]), NO_MERGE where the pair has none."""
        keys = left.astype(np.int64) * self.n_ids + right
        slot = self._home(keys)
        found = self._ids[slot]
        wrong = np.flatnonzero((self._keys[slot] != keys) & (self._keys[slot] != -1))
        while wrong.size:  # collided with another key: look one slot further
            slot[wrong] = (slot[wrong] + 1) & self._mask
            at = slot[wrong]
            found[wrong] = self._ids[at]
            wrong = wrong[(self._keys[at] != keys[wrong]) & (self._keys[at] != -1)]
        return np.where(self._keys[slot] == keys, found, NO_MERGE)

    def lookup_bytes(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """`lookup` for pairs of byte ids (both < 256)."""
        return self._bytes[left * 256 + right]  # ids below 256: no overflow in int32


def merge_batch(ids: np.ndarray, lengths: np.ndarray, table: PairTable) -> tuple[np.ndarray, np.ndarray]:
    """Merge many chunks at once: `ids` holds the chunks' byte ids one after the other, `lengths`
    their sizes (each >= 1); returns the merged ids and the new lengths, chunk by chunk.

    Each round, every chunk merges all occurrences of its lowest-rank pair, left to right (in a
    run like a a a of the pair (a, a), the first and third position merge). That is what merging
    the leftmost lowest pair one at a time does (`Tokenizer._merge_short`), because a merge only
    creates pairs of higher rank. A chunk with no pair left to merge leaves the working set.
    Example, merges (a,a)->256, (256,a)->257: [a,a,a,b] -> [256,a,b] -> [257,b].
    """
    ids = np.array(ids, dtype=np.int32)
    lengths = np.array(lengths, dtype=np.int64)
    which = np.arange(lengths.size)  # the caller's index of each chunk still merging
    end = np.zeros(ids.size, dtype=bool)  # the last position of a chunk
    end[np.cumsum(lengths) - 1] = True
    rank = np.full(ids.size, NO_MERGE, dtype=np.int32)  # merged id of (ids[i], ids[i + 1]) in one chunk
    inside = np.flatnonzero(~end)
    lookup = table.lookup_bytes if ids.size == 0 or ids.max() < 256 else table.lookup
    rank[inside] = lookup(ids[inside], ids[inside + 1])
    out_ids, out_which, out_lengths = [], [], []
    while ids.size:
        starts = np.cumsum(lengths) - lengths
        best = np.minimum.reduceat(rank, starts)  # each chunk's lowest merged id (= rank)
        done = best == NO_MERGE  # nothing left to merge: these chunks leave the working set
        best[done] = -1  # matches no pair
        target = np.repeat(best, lengths)
        hit = rank == target
        after = np.empty_like(hit)  # hit[i - 1]: position i is the right half of a merging pair
        after[0] = False
        after[1:] = hit[:-1]
        if (hit & after).any():  # runs of one pair (x, x): every other hit, from the run's start
            pos = np.arange(hit.size)
            run_start = np.maximum.accumulate(np.where(hit & ~after, pos, 0))
            hit &= (pos - run_start) % 2 == 0
            after[1:] = hit[:-1]
        merged_at = np.flatnonzero(hit)
        ids[merged_at] = target[merged_at]
        end[merged_at] = end[merged_at + 1]  # the right half's place at the chunk's end, if it had it
        drop = after
        if done.any():
            gone = np.repeat(done, lengths)
            out_ids.append(ids[gone])
            out_which.append(which[done])
            out_lengths.append(lengths[done])
            lengths = (lengths - np.add.reduceat(hit, starts, dtype=np.int64))[~done]
            which = which[~done]
            drop = after | gone
        else:
            lengths -= np.add.reduceat(hit, starts, dtype=np.int64)
        new_at = merged_at - np.cumsum(drop)[merged_at]  # positions once the dropped ones are gone
        ids, rank, end = ids[~drop], rank[~drop], end[~drop]
        # Only the pairs next to a merged token changed: (new, next) and (previous, new).
        changed = np.concatenate([new_at, new_at[new_at > 0] - 1])  # a repeat writes the same rank twice
        following = np.minimum(changed + 1, ids.size - 1)
        rank[changed] = np.where(end[changed], NO_MERGE, table.lookup(ids[changed], ids[following]))
    return _in_order(out_ids, out_which, out_lengths)


def _in_order(ids: list[np.ndarray], which: list[np.ndarray], lengths: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The chunks that left `merge_batch` round by round, back in the caller's order."""
    ids = np.concatenate([np.zeros(0, dtype=np.int32), *ids])
    which = np.concatenate([np.zeros(0, dtype=np.int64), *which])
    lengths = np.concatenate([np.zeros(0, dtype=np.int64), *lengths])
    order = np.argsort(which)
    sorted_lengths = lengths[order]
    source = (np.cumsum(lengths) - lengths)[order]  # where each chunk starts in `ids`
    target = np.cumsum(sorted_lengths) - sorted_lengths  # and where it goes
    return ids[np.arange(ids.size) + np.repeat(source - target, sorted_lengths)], sorted_lengths


class _BatchCache:
    """key (str) -> ids as raw bytes, computing the keys it has not seen yet in one batch.

    `values_of` looks every key up at C speed (`map(ids.get, keys)` on a plain dict, which a dict
    subclass would slow down); the keys not found are computed together (`_compute`) and only
    their places in the result are filled afterwards. Keys longer than `max_key` are computed but
    not kept (rare and long: not worth the memory).
    """

    def __init__(self, max_key: int) -> None:
        self._ids: dict[str, bytes] = {}
        self._max_key = max_key

    def __len__(self) -> int:
        return len(self._ids)

    def clear(self) -> None:
        self._ids.clear()

    def _compute(self, keys: list[str]) -> list[bytes]:
        raise NotImplementedError

    def values_of(self, keys: list[str]) -> list[bytes]:
        """The ids of each key, as raw bytes."""
        values = list(map(self._ids.get, keys))
        if None not in values:
            return values
        new = list(dict.fromkeys(compress(keys, map(is_, values, repeat(None)))))  # each missing key once
        found = dict(zip(new, self._compute(new)))
        values = list(map(found.get, keys, values))  # the new ones filled in; the others as they were
        if max(map(len, new)) > self._max_key:
            for key in new:
                if len(key) > self._max_key:
                    del found[key]
        self._ids.update(found)
        return values

    def ids_bytes(self, keys: list[str]) -> bytes:
        """The ids of all `keys`, one after the other, as raw bytes."""
        return b"".join(self.values_of(keys))


def _slices(buf: bytes, ends: np.ndarray) -> list[bytes]:
    """`buf` cut before each of `ends` (byte offsets, the last one len(buf))."""
    starts = np.concatenate([[0], ends[:-1]])
    return list(map(buf.__getitem__, map(slice, starts.tolist(), ends.tolist())))


class ChunkCache(_BatchCache):
    """Pre-token chunk (str) -> its ids as raw bytes of `dtype`; new chunks are merged together
    with `merge_batch`."""

    def __init__(self, table: PairTable, byte_ids: bytes | None, dtype, max_chunk: int) -> None:
        super().__init__(max_chunk)
        self._table = table
        self._byte_ids = byte_ids  # bytes.translate table from a byte to its id, None for identity
        self._dtype = np.dtype(dtype)

    def _compute(self, chunks: list[str]) -> list[bytes]:
        try:
            raw = list(map(str.encode, chunks, repeat("utf-8"), repeat("surrogateescape")))
        except UnicodeEncodeError:
            raise TokenizerError(
                "text contains a lone surrogate that is not an escaped byte; it cannot be encoded as UTF-8"
            ) from None
        lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
        ends = np.cumsum(lengths)
        out: list[bytes] = []
        start = 0
        while start < len(raw):  # batches of about _BATCH_BYTES: NumPy's temporaries stay small
            stop = max(start + 1, int(np.searchsorted(ends, ends[start] + _BATCH_BYTES)))
            data = b"".join(raw[start:stop])
            if self._byte_ids is not None:
                data = data.translate(self._byte_ids)
            ids, new_lengths = merge_batch(np.frombuffer(data, dtype=np.uint8), lengths[start:stop], self._table)
            out += _slices(ids.astype(self._dtype).tobytes(), np.cumsum(new_lengths) * self._dtype.itemsize)
            start = stop
        return out


# Whitespace as the `regex` module's \s (Unicode White_Space), which GPT-2's split pattern uses;
# tests check it against the module. The stdlib's \s also holds U+001C..U+001F.
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_WS = re.escape(WHITESPACE)
# A word: a run of whitespace, then a run of anything else; text ending in whitespace ends with a
# word of whitespace alone. The stdlib's `re` runs this simple pattern faster than `regex`.
_WORD = re.compile(f"[{_WS}]*[^{_WS}]+|[{_WS}]+")


# GPT-2's split pattern (bpe.pretokenize.GPT2_PATTERN) for text that is all ASCII, in the stdlib's
# `re`, which runs it 2.4x faster than `regex`: on ASCII, \p{L} is [A-Za-z], \p{N} is [0-9] and
# \s (Unicode White_Space) is re.ASCII's \s; tests compare the two.
GPT2_ASCII = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""", re.ASCII)


def split_words(text: str) -> list[str]:
    """`text` cut before every whitespace run that follows something else.

    >>> split_words("Hi there,\\n\\n  you. ")
    ['Hi', ' there,', '\\n\\n  you.', ' ']
    """
    return _WORD.findall(text)


class WordCache(_BatchCache):
    """Word (see `split_words`) -> its ids as raw bytes, for GPT-2's split pattern, which never puts
    a non-space character and the whitespace after it in one chunk: so a word's chunks do not
    depend on the text around it, and a text's chunks are its words' chunks one after the other.

    Words are fewer than chunks (" said," is one word, two chunks), so this first level saves
    split and lookup work; new words are split together (`split`) and looked up in `chunks`.
    """

    def __init__(self, chunks: ChunkCache, split, max_word: int) -> None:
        super().__init__(max_word)
        self._chunks = chunks
        self._split = split

    def ids_bytes(self, words: list[str]) -> bytes:
        """The ids of all `words` (the words of one text, in order), as raw bytes."""
        if not words:
            return b""
        # Every word but the text's first and last starts with whitespace and ends with something
        # else; those can be joined and split together (`_compute`). The other two are split alone.
        head = tail = b""
        if not _regular(words[0]):
            head = self._chunks.ids_bytes(self._split(words[0]))
            words = words[1:]
        if words and not _regular(words[-1]):
            tail = self._chunks.ids_bytes(self._split(words[-1]))
            words = words[:-1]
        return b"".join([head, *self.values_of(words), tail]) if head or tail else super().ids_bytes(words)

    def _compute(self, words: list[str]) -> list[bytes]:
        # The words that are all ASCII (most, in English) are split by the stdlib's `re`.
        ascii_words = list(map(str.isascii, words))
        if all(ascii_words):
            return self._compute_split(words, GPT2_ASCII.findall)
        if not any(ascii_words):
            return self._compute_split(words, self._split)
        ascii_values = iter(self._compute_split(list(compress(words, ascii_words)), GPT2_ASCII.findall))
        other_values = iter(self._compute_split(list(compress(words, map(not_, ascii_words))), self._split))
        return [next(ascii_values) if a else next(other_values) for a in ascii_words]

    def _compute_split(self, words: list[str], split) -> list[bytes]:
        chunks = split("".join(words))  # the same chunks as each word split alone, in order
        values = self._chunks.values_of(chunks)
        chunk_ends = np.cumsum(np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)))
        word_ends = np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)))
        last = np.searchsorted(chunk_ends, word_ends)  # the chunk that ends each word
        byte_ends = np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)))
        return _slices(b"".join(values), byte_ends[last])


def _regular(word: str) -> bool:
    return word[0] in WHITESPACE and word[-1] not in WHITESPACE
