"""The encoder's hot path: caches that look many chunks up at once and merge the new ones together.

What it does: turns a list of pre-token chunks (str) into their ids as one buffer of raw
unsigned integers (uint16 or uint32, native order), looking each chunk up in a dict at C speed
(`map(ids.get, chunks)`, `b"".join`: no Python code per chunk) and merging all new chunks of a
call together with NumPy (`merge_batch`), one round of merges for every chunk at a time. For
GPT-2's split pattern two levels come first: the pieces between single spaces (`PieceCache`,
cut by `str.split`, no regex) and, for what they leave, whole words (`WordCache`); only new
words are split into chunks.

What it deliberately does not do: split text into chunks with a custom pattern
(bpe/pretokenize.py; GPT-2's pattern for ASCII words is here, in the stdlib's `re`), handle special
tokens or the tokenizer's policy (bpe/tokenizer.py). `merge_batch` is a different algorithm
(rounds over many chunks at once, in NumPy); its plain twin, the one-chunk-at-a-time merge it
must equal, is `bpe.merge.merge_chunk`, and tests compare the two on many random inputs.

>>> table = PairTable([(97, 97), (256, 97)])       # "aa" -> 256, then "aa"+"a" -> 257
>>> ids, lengths = merge_batch(np.array([97, 97, 97, 98, 97, 97]), np.array([4, 2]), table)
>>> ids.tolist(), lengths.tolist()
([257, 98, 256], [2, 1])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain, compress, filterfalse, repeat
from operator import is_, not_

import numpy as np

from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.words import GPT2_ASCII, WHITESPACE, regular_word, split_words

NO_MERGE = np.iinfo(np.int32).max - 1  # "merged id" of a pair that has no merge; larger than any id
END = NO_MERGE + 1  # merge_batch's rank at a chunk's last place, where no pair starts
_BATCH_BYTES = 1 << 18  # bytes of new chunks merged per merge_batch call (~40 bytes of arrays each)


class PairTable:
    """The merges as a hash table in NumPy arrays: (left, right) -> rank key (256 + rank), for
    many pairs at once; `made[key - 256]` is the id the merge makes, None when that is the key
    (the canonical layout, `bpe.layout`). Pairs of ids below 256, which every chunk of the
    canonical layout starts with, are a direct 256 x 256 table. `monotone`: no merge creates a
    pair that outranks it, so all places of one pair may merge at once (`merge_batch`)."""

    _MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of key * this

    def __init__(
        self, merges: Sequence[tuple[int, int]], made: Sequence[int] | None = None, monotone: bool = True
    ) -> None:
        self.made = None if made is None else np.asarray(made, dtype=np.int32)
        self.monotone = monotone
        pairs = np.fromiter(chain.from_iterable(merges), dtype=np.int64, count=2 * len(merges)).reshape(-1, 2)
        self.n_ids = 256 + len(merges) if made is None else max(256 + len(merges), int(pairs.max(initial=0)) + 1)
        bits = max(8, int(4 * len(merges)).bit_length())  # at most a quarter full: probes stay short
        self._shift = np.uint64(64 - bits)
        keys = pairs[:, 0] * self.n_ids + pairs[:, 1]
        # Linear probing, built at once: taken in the order of their home slots, each key goes to
        # its home or the slot after the previous key's, whichever is later (a running maximum).
        # Probes run past the last home slot instead of wrapping, into slack kept empty.
        home = self._home(keys)
        order = np.argsort(home)  # any order among keys of one home
        rank = np.arange(len(keys))
        slot = np.maximum.accumulate(home[order] - rank) + rank
        size = max(1 << bits, int(slot[-1]) + 2 if len(keys) else 1)  # + 1: the last probe ends on an empty slot
        self._keys = np.full(size, -1, dtype=np.int64)
        self._ids = np.full(size, NO_MERGE, dtype=np.int32)
        self._keys[slot] = keys[order]
        self._ids[slot] = 256 + order
        self._bytes = np.full(256 * 256, NO_MERGE, dtype=np.int32)
        small = (pairs[:, 0] < 256) & (pairs[:, 1] < 256)
        self._bytes[pairs[small, 0] * 256 + pairs[small, 1]] = 256 + np.flatnonzero(small)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64) * self._MULTIPLIER) >> self._shift).astype(np.int64)

    def lookup(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Rank key of each pair (left[i], right[i]), NO_MERGE where the pair has none."""
        keys = left.astype(np.int64) * self.n_ids + right
        slot = self._home(keys)
        there = self._keys[slot]  # the key in each one's slot
        wrong = np.flatnonzero((there != keys) & (there != -1))
        while wrong.size:  # collided with another key: look one slot further
            slot[wrong] = at = slot[wrong] + 1
            there[wrong] = self._keys[at]
            wrong = wrong[(there[wrong] != keys[wrong]) & (there[wrong] != -1)]
        found = self._ids[slot]
        found[there != keys] = NO_MERGE
        return found

    def lookup_bytes(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """`lookup` for pairs of byte ids (both < 256)."""
        return self._bytes[left * 256 + right]  # ids below 256: no overflow in int32


def merge_batch(ids: np.ndarray, lengths: np.ndarray, table: PairTable) -> tuple[np.ndarray, np.ndarray]:
    """Merge many chunks at once: `ids` holds the chunks' byte ids one after the other, `lengths`
    their sizes (each >= 1); returns the merged ids and the new lengths, chunk by chunk.

    Each round, every chunk merges all occurrences of its lowest-rank pair, left to right (in a
    run like a a a of the pair (a, a), the first and third position merge). That is what merging
    the leftmost lowest pair one at a time does (`bpe.merge.merge_chunk`) when a merge only
    creates pairs of higher rank (`table.monotone`); otherwise each round merges the leftmost
    occurrence alone. A chunk with no pair left to merge leaves the working set.
    Example, merges (a,a)->256, (256,a)->257: [a,a,a,b] -> [256,a,b] -> [257,b].
    """
    ids = np.array(ids, dtype=np.int32)
    lengths = np.array(lengths, dtype=np.int64)
    which = np.arange(lengths.size)  # the caller's index of each chunk still merging
    # rank[i]: merged id of (ids[i], ids[i + 1]), NO_MERGE if none; END at a chunk's last place
    rank = np.full(ids.size, END, dtype=np.int32)
    inside = np.ones(ids.size, dtype=bool)
    inside[np.cumsum(lengths) - 1] = False
    inside = np.flatnonzero(inside)
    small = table.made is None and (ids.size == 0 or ids.max() < 256)
    lookup = table.lookup_bytes if small else table.lookup
    rank[inside] = lookup(ids[inside], ids[inside + 1])
    out_ids, out_which, out_lengths = [], [], []
    while ids.size:
        starts = np.cumsum(lengths) - lengths
        best = np.minimum.reduceat(rank, starts)  # each chunk's lowest merged id (= rank)
        done = best >= NO_MERGE  # nothing left to merge: these chunks leave the working set
        best[done] = -1  # matches no pair
        target = np.repeat(best, lengths)
        hit = rank == target
        if not table.monotone:  # the leftmost hit of each chunk alone
            at = np.flatnonzero(hit)
            chunk = np.repeat(np.arange(lengths.size), lengths)[at]
            hit[at[1:][chunk[1:] == chunk[:-1]]] = False
        after = np.empty_like(hit)  # hit[i - 1]: position i is the right half of a merging pair
        after[0] = False
        after[1:] = hit[:-1]
        if (hit & after).any():  # runs of one pair (x, x): every other hit, from the run's start
            pos = np.arange(hit.size)
            run_start = np.maximum.accumulate(np.where(hit & ~after, pos, 0))
            hit &= (pos - run_start) % 2 == 0
            after[1:] = hit[:-1]
        merged_at = np.flatnonzero(hit)
        ids[merged_at] = target[merged_at] if table.made is None else table.made[target[merged_at] - 256]
        rank[merged_at] = rank[merged_at + 1]  # END stays END: the right half was its chunk's last
        if done.any():
            gone = np.repeat(done, lengths)
            out_ids.append(ids[gone])
            out_which.append(which[done])
            out_lengths.append(lengths[done])
            lengths = (lengths - np.add.reduceat(hit, starts, dtype=np.int64))[~done]
            which = which[~done]
            keep = ~(after | gone)
            new_at = merged_at - np.cumsum(~keep)[merged_at]  # places once the dropped ones are gone
        else:
            lengths -= np.add.reduceat(hit, starts, dtype=np.int64)
            keep = ~after
            new_at = merged_at - np.arange(merged_at.size)  # one right half dropped before each
        ids, rank = ids[keep], rank[keep]
        # Only the pairs next to a merged token changed: (new, next) and (previous, new).
        changed = np.concatenate([new_at, new_at[new_at > 0] - 1])  # a repeat writes the same rank twice
        following = np.minimum(changed + 1, ids.size - 1)
        rank[changed] = np.where(rank[changed] == END, END, table.lookup(ids[changed], ids[following]))
    return _in_order(out_ids, out_which, out_lengths)


def _in_order(
    ids: list[np.ndarray], which: list[np.ndarray], lengths: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
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
    subclass would slow down); the keys not found are computed together (`_compute`), put in
    the dict, and every key looked up again (a second C-speed pass, not a Python loop over the
    new ones). Keys longer than `max_key` are computed but not kept (rare and long: not worth the
    memory).
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
        self._ids.update(zip(new, self._compute(new), strict=True))
        values = list(map(self._ids.__getitem__, keys))  # a second pass at C speed, not a loop over the new
        self._forget_long(new)
        return values

    def _forget_long(self, keys: Iterable[str]) -> None:
        """Drop those of `keys` longer than max_key (computed, used once, not worth keeping)."""
        if max(map(len, keys), default=0) > self._max_key:
            for key in keys:
                if len(key) > self._max_key:
                    del self._ids[key]

    def _keep(self, found: dict[str, bytes]) -> None:
        """Remember `found`, but for its keys longer than max_key."""
        self._ids.update(found)
        self._forget_long(found)

    def ids_bytes(self, keys: list[str]) -> bytes:
        """The ids of all `keys`, one after the other, as raw bytes."""
        return b"".join(self.values_of(keys))


def _nones(values: list) -> list[int]:
    """The places where `values` is None, found by C-speed scans: for a few in many."""
    at = []
    i = -1
    try:
        while True:
            i = values.index(None, i + 1)
            at.append(i)
    except ValueError:
        return at


def _slices(buf: bytes, ends: np.ndarray) -> list[bytes]:
    """`buf` cut before each of `ends` (byte offsets, the last one len(buf))."""
    starts = np.concatenate([[0], ends[:-1]])
    return list(map(buf.__getitem__, map(slice, starts.tolist(), ends.tolist())))


class ChunkCache(_BatchCache):
    """Pre-token chunk (str) -> its ids as raw bytes of `dtype`; new chunks are merged together
    with `merge_batch`. With `whole` (token bytes -> id: HF's ignore_merges), a new chunk whose
    bytes are a token is that token, and only the others are merged."""

    def __init__(
        self,
        table: PairTable,
        byte_ids: Sequence[int] | None,
        dtype,
        max_chunk: int,
        whole: dict[bytes, int] | None = None,
    ) -> None:
        super().__init__(max_chunk)
        self._table = table
        # byte -> its id: a bytes.translate table when every id is below 256, else an array; None for identity
        fits = byte_ids is None or max(byte_ids) < 256
        self._byte_ids = None if byte_ids is None else bytes(byte_ids) if fits else np.asarray(byte_ids, np.int32)
        self._dtype = np.dtype(dtype)
        self._whole = whole

    def _compute(self, chunks: list[str]) -> list[bytes]:
        try:
            raw = list(map(str.encode, chunks, repeat("utf-8"), repeat("surrogateescape")))
        except UnicodeEncodeError:
            raise TokenizerError(
                "text contains a lone surrogate that is not an escaped byte; it cannot be encoded as UTF-8"
            ) from None
        if self._whole is None:
            return self._merged(raw)
        found = list(map(self._whole.get, raw))
        if found.count(None) == len(found):
            return self._merged(raw)
        at = _nones(found)
        out = [np.array(i, dtype=self._dtype).tobytes() if i is not None else b"" for i in found]
        for k, value in zip(at, self._merged(list(map(raw.__getitem__, at))), strict=True):
            out[k] = value
        return out

    def _merged(self, raw: list[bytes]) -> list[bytes]:
        """The ids of each chunk's bytes, merged together in batches."""
        lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
        ends = np.cumsum(lengths)
        out: list[bytes] = []
        start = 0
        while start < len(raw):  # batches of about _BATCH_BYTES: NumPy's temporaries stay small
            stop = max(start + 1, int(np.searchsorted(ends, ends[start] + _BATCH_BYTES)))
            data = b"".join(raw[start:stop])
            if isinstance(self._byte_ids, bytes):
                data = data.translate(self._byte_ids)
            byte_ids = np.frombuffer(data, dtype=np.uint8)
            if isinstance(self._byte_ids, np.ndarray):
                byte_ids = self._byte_ids[byte_ids]
            ids, new_lengths = merge_batch(byte_ids, lengths[start:stop], self._table)
            out += _slices(ids.astype(self._dtype).tobytes(), np.cumsum(new_lengths) * self._dtype.itemsize)
            start = stop
        return out


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

    def text_ids(self, text: str) -> bytes:
        """The ids of `text`, as raw bytes."""
        return self.ids_bytes(split_words(text))

    def ids_bytes(self, words: list[str]) -> bytes:
        """The ids of all `words` (the words of one text, in order), as raw bytes."""
        if not words:
            return b""
        # Every word but the text's first and last starts with whitespace and ends with something
        # else; those can be joined and split together (`_compute`). The other two are split alone.
        head = tail = b""
        if not regular_word(words[0]):
            head = self._chunks.ids_bytes(self._split(words[0]))
            words = words[1:]
        if words and not regular_word(words[-1]):
            tail = self._chunks.ids_bytes(self._split(words[-1]))
            words = words[:-1]
        return b"".join([head, *self.values_of(words), tail]) if head or tail else super().ids_bytes(words)

    def _compute(self, words: list[str]) -> list[bytes]:
        # Joined and split together: the same chunks as each word split alone, in order. The
        # words that are all ASCII (most, in English) are split by the stdlib's `re`, faster.
        is_ascii = np.fromiter(map(str.isascii, words), dtype=bool, count=len(words))
        if is_ascii.all() or not is_ascii.any():
            ordered, where = words, None
            chunks = (GPT2_ASCII.findall if is_ascii.all() else self._split)("".join(words))
        else:
            where = np.concatenate([np.flatnonzero(is_ascii), np.flatnonzero(~is_ascii)])
            ordered = list(map(words.__getitem__, where.tolist()))  # the ASCII words first
            n_ascii = int(is_ascii.sum())
            chunks = GPT2_ASCII.findall("".join(ordered[:n_ascii])) + self._split("".join(ordered[n_ascii:]))
        values = self._chunks.values_of(chunks)  # all new words' chunks at once: one merge_batch
        chunk_ends = np.cumsum(np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)))
        word_ends = np.cumsum(np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered)))
        last = np.searchsorted(chunk_ends, word_ends)  # the chunk that ends each word
        byte_ends = np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)))
        out = _slices(b"".join(values), byte_ends[last])
        if where is None:
            return out
        return list(map(out.__getitem__, np.argsort(where, kind="stable").tolist()))  # back in the words' order


class PieceCache(_BatchCache):
    """Piece -> its ids as raw bytes, for GPT-2's split pattern: the text people mostly write,
    words between single spaces and newlines, cut at C speed (`str.split`, not a regex).

    The pieces are the text split at spaces, after a space is put before every newline that
    does not follow one (`_pieces`): a piece stands for " " + piece, or for itself when it starts
    with a newline (`_text_of`); they are about as many and as distinct as words. A cut before a
    piece is safe where the character before it is not whitespace (the piece before is "closed":
    not empty, not ending in whitespace), because no chunk of the pattern runs from a non-space
    character into the whitespace after it, and the matching from there on looks only forward.
    So the text is a series of units, each running to the next closed piece: mostly that piece
    alone (" said,", "\nThe"), which this cache keeps; the others (a double space, an indented
    line, three newlines) are joined and kept under the joined key, which holds a space, as no
    piece does. The text's first unit and an open last one go through `words`, and so does the
    whole text when open pieces are many (indented code, CRLF lines): it handles any text.
    """

    def __init__(self, words: WordCache, max_piece: int) -> None:
        super().__init__(max_piece)
        self._words = words

    def _compute(self, keys: list[str]) -> list[bytes]:
        # Each key's text starts after a safe cut and ends with a closed piece: regular words,
        # split together as the word cache splits them.
        return self._words._compute(list(map(str.replace, map(" ".__add__, keys), repeat(" \n"), repeat("\n"))))

    def text_ids(self, text: str) -> bytes:
        """The ids of `text`, as raw bytes."""
        spaced = text.replace("\n", " \n").replace(" \n \n", " \n\n")  # a blank line stays in one piece
        head = spaced[:_SAMPLE]  # enough to tell prose from indented code
        if (head.count("  ") + head.count("\n ") + head.count("\r ")) * _MOSTLY_CLOSED > head.count(" "):
            return self._words.text_ids(text)  # many open pieces
        pieces = spaced.split(" ")
        if len(self._ids) * _COLD < len(pieces):  # few known yet: learn the new pieces first, each once
            self._learn(set(pieces))
        values = list(map(self._ids.get, pieces))  # closed pieces only: an open one always misses
        first = 0  # the first unit runs to the first closed piece, with no space before it
        while first < len(pieces) - 1 and not _closed(pieces[first]):
            first += 1
        head = _text_of(" ".join(pieces[: first + 1]))[1:]  # less the space _text_of put before it
        values[: first + 1] = [self._words.text_ids(head)] + [b""] * first
        if None in values and not self._fill(pieces, values):
            return self._words.text_ids(text)  # many open pieces after all
        return b"".join(values)

    def _learn(self, pieces: Iterable[str]) -> None:
        """Keep the ids of the closed ones among `pieces` (distinct) that are not kept yet."""
        new = list(filterfalse(self._ids.__contains__, pieces))
        new = list(compress(new, map(not_, map(_OPEN_ENDS.__contains__, map(str.__getitem__, new, repeat(_LAST))))))
        if new:
            self._keep(dict(zip(new, self._compute(new), strict=True)))

    def _fill(self, pieces: list[str], values: list) -> bool:
        """Fill in the None places of `values`: new closed pieces, and each unit's ids at its
        first place (b"" at its other places). False, filling nothing, if open pieces are many."""
        at = _nones(values)
        missing = list(map(pieces.__getitem__, at))
        distinct = list(dict.fromkeys(missing))
        is_open = list(map(_OPEN_ENDS.__contains__, map(str.__getitem__, distinct, repeat(_LAST))))  # at C speed
        new = list(compress(distinct, map(not_, is_open))) if True in is_open else distinct
        open_pieces = set(compress(distinct, is_open))
        units: list[tuple[int, int]] = []
        if open_pieces:
            open_at = list(compress(at, map(open_pieces.__contains__, missing)))
            if len(open_at) * _MOSTLY_CLOSED > len(pieces):
                return False
            units = _runs(open_at, len(pieces))
        tail = units.pop() if units and pieces[units[-1][1] - 1][-1:] in _OPEN_ENDS else None  # the text ends open
        keys = [" ".join(pieces[a:b]) for a, b in units]
        unit_values = list(map(self._ids.get, keys))
        new += dict.fromkeys(compress(keys, map(is_, unit_values, repeat(None))))
        found = dict(zip(new, self._compute(new), strict=True)) if new else {}
        found.update(dict.fromkeys(open_pieces, b""))  # placeholders: their units fill them in
        for i, value in zip(at, map(found.__getitem__, missing), strict=True):  # only the missing places
            values[i] = value
        for (a, b), key, value in zip(units, keys, unit_values, strict=True):
            values[a:b] = [found[key] if value is None else value] + [b""] * (b - a - 1)
        if tail is not None:  # not kept: its key could be a piece's
            a, b = tail
            values[a:b] = [self._words.text_ids(_text_of(" ".join(pieces[a:b])))] + [b""] * (b - a - 1)
        for piece in open_pieces:
            del found[piece]
        self._keep(found)
        return True


def _runs(at: list[int], n: int) -> list[tuple[int, int]]:
    """The units made by open pieces at `at` (ascending, not empty): each run of consecutive
    places and the closed piece after it, as (start, stop) with stop <= n."""
    at = np.array(at)
    breaks = np.flatnonzero(np.diff(at) != 1)
    starts = at[np.concatenate([[0], breaks + 1])]
    stops = np.minimum(at[np.concatenate([breaks, [at.size - 1]])] + 2, n)
    return list(zip(starts.tolist(), stops.tolist(), strict=True))


_LAST = slice(-1, None)
_OPEN_ENDS = frozenset(WHITESPACE) | {""}  # a piece's last character (or "") that leaves it open
_COLD = 4  # a text of more pieces than this times the cache's: its new pieces are learned first
_MOSTLY_CLOSED = 16  # more than one open piece in this many: the text goes to the word level
_SAMPLE = 1 << 16  # characters of a text looked at to guess whether its open pieces are many


def _text_of(key: str) -> str:
    """The text a piece (or joined unit) stands for: a space before it, none before a newline.

    >>> _text_of("said,"), _text_of("\\n\\nThe"), _text_of(" x")
    (' said,', '\\n\\nThe', '  x')
    """
    return (" " + key).replace(" \n", "\n")


def _closed(piece: str) -> bool:
    """Not empty and not ending in whitespace: a safe place to cut after it."""
    return piece[-1:] not in _OPEN_ENDS
