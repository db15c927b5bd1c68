"""Text that holds no special tokens, to ids: normalise, split, and look every chunk up in caches.

What it does: `TextEncoder` is one tokenizer's encoding of plain text (the stretches between
special tokens), as the raw bytes of an id array. The text is put in NFC when the tokenizer has
that normalizer (HF normalizes each stretch between special tokens), split with the pattern,
and every chunk looked up in the chunk cache, merging only the chunks not seen before (chunks,
not whole words: new text brings few new chunks; BENCHMARKS.md). With GPT-2's pattern the pieces
between single spaces are looked up first, then whole words, and only new words are split into
chunks: cheaper splits and fewer lookups (`bpe.encoder.PieceCache`, `WordCache`). With
`ignore_merges` (Llama 3's) a chunk whose bytes are a token is that token, unmerged.
`chunk_ids` merges one chunk with the plain loop instead (`bpe.merge.merge_ids`, no cache).

What it deliberately does not do: special tokens and their policy (bpe/tokenizer.py), merge many
chunks at once (bpe/encoder.py), or split with a pattern itself (bpe/pretokenize.py).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

import numpy as np

from tokenkit.bpe.encoder import ChunkCache, PairTable, PieceCache, WordCache
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.layout import Layout
from tokenkit.bpe.merge import merge_ids
from tokenkit.bpe.patterns import GPT2_PATTERN
from tokenkit.bpe.pretokenize import split_text

__all__ = ["TextEncoder"]

_CACHE_LIMIT = 1 << 20  # distinct chunks kept in the cache before it is emptied and refilled
_CACHE_MAX_CHUNK = 256  # longer chunks are rare; caching them would only cost memory
_WORD_CACHE_LIMIT = 1 << 18  # distinct words (and pieces) kept (GPT-2's pattern), like _CACHE_LIMIT


class TextEncoder:
    """Plain text -> ids for one tokenizer's `layout`, split with `pattern_regex` (None: no split),
    with its `normalizer` ("nfc" or None) and `ignore_merges`; ids as raw bytes of `ids_dtype`.
    The caches are built on first use (`chunk_cache`) and kept, bounded, across calls."""

    def __init__(
        self, layout: Layout, pattern_regex: str | None, normalizer: str | None, ignore_merges: bool, ids_dtype
    ) -> None:
        self.layout = layout
        self.pattern_regex = pattern_regex
        self.normalizer = normalizer
        self.ignore_merges = ignore_merges
        self.ids_dtype = ids_dtype
        self._identity = layout.byte_ids == list(range(256))
        self._whole: dict[bytes, int] | None = None  # token bytes -> id, for ignore_merges (`token_of`)
        self._cache: ChunkCache | None = None  # chunk -> ids, built on first use (`chunk_cache`)
        self._word_cache: WordCache | None = None  # word -> ids, for GPT-2's pattern
        self._piece_cache: PieceCache | None = None  # space-separated piece -> ids, in front of the words

    def chunks(self, text: str) -> list[str]:
        """The pre-token chunks of `text` as the tokenizer sees it (after its normalizer)."""
        return split_text(self._normalized(text), self.pattern_regex)

    def start_ids(self, chunk: str) -> list[int]:
        """A chunk's ids before any merge: its bytes' ids, or with ignore_merges the one token its
        bytes are (never merged)."""
        try:
            raw = chunk.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:
            raise TokenizerError(
                "text contains a lone surrogate that is not an escaped byte; it cannot be encoded as UTF-8"
            ) from None
        if self.ignore_merges and len(raw) > 1 and raw in self.token_of:
            return [self.token_of[raw]]
        return list(raw) if self._identity else [self.layout.byte_ids[b] for b in raw]

    def chunk_ids(self, chunk: str) -> tuple[int, ...]:
        """Ids of one pre-token chunk, merged with the plain loop (no cache)."""
        return tuple(merge_ids(self.start_ids(chunk), self.layout.pair_id, self.layout.made))

    @property
    def token_of(self) -> dict[bytes, int]:
        """The bytes of every merged token -> its id (ignore_merges looks chunks up in it), built
        on first use; two ids with the same bytes are refused (which would the chunk be?)."""
        if self._whole is None:
            whole: dict[bytes, int] = {}
            id_bytes = self.layout.id_bytes
            for i in self.layout.merged_tokens:
                if whole.setdefault(id_bytes[i], i) != i:
                    raise TokenizerError(
                        f"ids {whole[id_bytes[i]]} and {i} have the same bytes {id_bytes[i]!r}; with "
                        "ignore_merges a chunk of those bytes would be either"
                    )
            self._whole = whole
        return self._whole

    @property
    def chunk_cache(self) -> ChunkCache:
        """The chunk cache, built on first use (its pair table takes a moment for a big vocabulary)."""
        if self._cache is None:
            layout = self.layout
            byte_ids = None if self._identity else layout.byte_ids
            whole = self.token_of if self.ignore_merges else None
            table = PairTable(layout.merges, layout.made, layout.monotone)
            self._cache = ChunkCache(table, byte_ids, self.ids_dtype, _CACHE_MAX_CHUNK, whole)
            if self.pattern_regex == GPT2_PATTERN:
                split = lambda text: split_text(text, GPT2_PATTERN)  # noqa: E731
                self._word_cache = WordCache(self._cache, split, _CACHE_MAX_CHUNK)
                self._piece_cache = PieceCache(self._word_cache, _CACHE_MAX_CHUNK)
        return self._cache

    def encode(self, text: str) -> bytes:
        """Ids of text that holds no special tokens (anything special-looking is plain text), as
        raw bytes of `ids_dtype`."""
        text = self._normalized(text)
        cache = self.chunk_cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        if self._piece_cache is None:
            return cache.ids_bytes(split_text(text, self.pattern_regex))
        for level in (self._piece_cache, self._word_cache):
            if len(level) > _WORD_CACHE_LIMIT:
                level.clear()
        return self._piece_cache.text_ids(text)

    def count_tokens(self, chunk_counts: Mapping[bytes, int]) -> int:
        """The length in tokens of a corpus counted as {chunk: count} (`bpe.pretokenize`). Encoding
        each distinct chunk once, weighted by its count, is encoding the corpus; going through the
        chunk cache leaves it warm for encoding that corpus next."""
        texts = [chunk.decode("utf-8", "surrogateescape") for chunk in chunk_counts]
        itemsize = np.dtype(self.ids_dtype).itemsize
        lengths = map(len, self.chunk_cache.values_of(texts))
        return sum(n_bytes // itemsize * n for n_bytes, n in zip(lengths, chunk_counts.values(), strict=True))

    def _normalized(self, text: str) -> str:
        return text if self.normalizer is None else unicodedata.normalize("NFC", text)
