"""`Tokenizer`: byte-level BPE encode/decode, special tokens, training entry point.

What it does: turns text into token ids and back with a list of merges (merge r makes id 256 + r);
recognises special tokens only where the caller allows them (tiktoken's policy): the codec and
its policy, as tiktoken's `Encoding`. `train` and `encode_file` are thin entry points: a corpus is
read by bpe/corpus.py, counted by `bpe.pretokenize.count_chunks`, learnt by
`bpe.trainer.train_merges`, and encoded in worker processes by bpe/encode_corpus.py.

What it deliberately does not do: learn merges (bpe/trainer.py), split text into chunks
(bpe/pretokenize.py), read corpora or run processes (bpe/corpus.py, bpe/encode_corpus.py), or
touch files (bpe/io.py does, for it).

Encoding, in short: split the text at allowed special tokens, split each stretch with the pattern
into chunks, and turn each chunk into ids by repeatedly merging the adjacent pair with the lowest
rank. Text repeats a lot, so each distinct chunk is merged once and its ids are cached. Two
options of Hugging Face tokenizers change that, for tokenizers imported from them:
`ignore_merges` (Llama 3's: a chunk that is itself a token is that token, unmerged) and
`normalizer="nfc"` (Qwen2's: each stretch is put in Unicode NFC before it is split).

>>> tok = Tokenizer([(97, 97), (256, 97)])            # "aa" -> 256, then "aa"+"a" -> 257
>>> tok.encode("aaabdaaabac")
[257, 98, 100, 257, 98, 97, 99]
>>> tok.decode([257, 98])
'aaab'
"""

from __future__ import annotations

import hashlib
import heapq
import os
import time
import unicodedata
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate, pairwise, repeat
from pathlib import Path

import numpy as np
import regex

from tokenkit.bpe import encode_corpus, interop, io
from tokenkit.bpe.corpus import Corpus, as_corpus
from tokenkit.bpe.encoder import ChunkCache, PairTable, PieceCache, WordCache
from tokenkit.bpe.errors import DisallowedSpecialError, TokenizerError
from tokenkit.bpe.layout import canonical, listed
from tokenkit.bpe.patterns import GPT2_PATTERN, PATTERNS, resolve_pattern
from tokenkit.bpe.pretokenize import count_chunks, split_text
from tokenkit.bpe.replay import Replay, replay_merges
from tokenkit.bpe.trainer import train_merges
from tokenkit.common import gcpause

_NO_MERGE = 1 << 62  # "rank" of a pair that has no merge; larger than any id
_LONG_CHUNK = 64  # from this many bytes on, merge with a heap instead of rescanning the chunk
_CACHE_LIMIT = 1 << 20  # distinct chunks kept in the cache before it is emptied and refilled
_CACHE_MAX_CHUNK = 256  # longer chunks are rare; caching them would only cost memory
_WORD_CACHE_LIMIT = 1 << 18  # distinct words (and pieces) kept (GPT-2's pattern), like _CACHE_LIMIT
MERGE_COUNTS = 1024  # merges whose pair count the tokenizer file records (a few KB; the rest are small)
NORMALIZERS = ("nfc",)  # Unicode normalizations a tokenizer may apply before splitting (HF's NFC)
_TIKTOKEN_WHOLE = "tiktoken looks whole chunks up before merging and would give {id} for that text"
# with ignore_merges tk gives the token for its bytes too, but not inside a longer chunk
_TIKTOKEN_IGNORE_MERGES = (
    "tiktoken merges by the rank of the merged bytes, so it can make {id} inside a longer chunk where these "
    "merges do not"
)


@dataclass
class TrainReport:
    """What happened during `Tokenizer.train`.

    merges_learned: number of merges; stop_reason: why training stopped (the trainer's words:
    "vocab_size", "min_frequency" or "no_pairs"); seconds: wall time of counting + merging;
    counts: the pair count of each merge, in rank order; unique_chunks: distinct pre-token
    chunks in the corpus; corpus_bytes: size of the corpus. `corpus_tokens` (its length in
    tokens under the new tokenizer, specials read as plain text) and `bytes_per_token` are
    computed on first use, so that training time does not include them.
    """

    merges_learned: int
    stop_reason: str
    seconds: float
    counts: list[int] = field(repr=False)
    unique_chunks: int
    corpus_bytes: int
    _count_tokens: Callable[[], int] = field(repr=False, compare=False)

    @cached_property
    def corpus_tokens(self) -> int:
        return self._count_tokens()

    @property
    def bytes_per_token(self) -> float:
        return self.corpus_bytes / max(self.corpus_tokens, 1)


def describe_merge(vocab: Sequence[bytes], rank: int, pair: tuple[int, int], count: int) -> str:
    """One readable line per merge, for learners watching training.

    >>> describe_merge([bytes([i]) for i in range(256)], 0, (116, 104), 1234)
    "merge 0: 't' + 'h' -> 'th'  (id 256, count 1234)"
    """
    a, b = pair
    show = lambda bs: repr(bs.decode("utf-8", errors="backslashreplace"))  # noqa: E731
    merged = f"{show(vocab[a])} + {show(vocab[b])} -> {show(vocab[a] + vocab[b])}"
    return f"merge {rank}: {merged}  (id {256 + rank}, count {count})"


class Tokenizer:
    """A byte-level BPE tokenizer.

    Ids 0-255 are the 256 bytes (in `byte_order`, identity unless imported from GPT-2), id 256 + r
    is the result of merge r, and special tokens follow the merges. A vocabulary imported from a
    tokenizer.json that does not fit that is listed instead (`vocab`: every id's bytes; see
    `bpe.layout`): Llama 3's, where several merges make one token, and SmolLM's, specials first.

    `ignore_merges`: a chunk whose bytes are a token is that token without merging (HF's
    `ignore_merges`, Llama 3's tokenizer: its vocabulary has tokens its merges never make).
    `normalizer="nfc"`: the text between special tokens is put in Unicode NFC first (HF's NFC
    normalizer, Qwen2's). Both change ids, so both are stored in the tokenizer's file.

    Build one with `Tokenizer.train`, `Tokenizer.load`, `Tokenizer.from_gpt2`, `Tokenizer.from_hf`,
    `Tokenizer.from_tiktoken` or `Tokenizer.from_tensors`; the constructor takes the merges directly.
    """

    def __init__(
        self,
        merges: Iterable[tuple[int, int]],
        *,
        special_tokens: Iterable[str] | dict[str, int] = (),
        pattern: str = "gpt2",
        byte_order: Sequence[int] | None = None,
        vocab: Sequence[bytes | None] | None = None,
        training: dict | None = None,
        ignore_merges: bool = False,
        normalizer: str | None = None,
        bos: str | None = None,
        text_tokens: Iterable[str] | None = None,
        _pattern_regex: str | None | bool = False,
    ) -> None:

        merges = [(int(a), int(b)) for a, b in merges]
        if vocab is None:
            layout = canonical(merges, byte_order, special_tokens)
        elif byte_order is not None or not isinstance(special_tokens, dict):
            raise TokenizerError("a listed vocabulary gives the bytes' ids and takes special tokens as a dict of ids")
        else:
            layout = listed(vocab, merges, special_tokens)
        self._layout = layout
        self._merges = layout.merges
        self._specials = layout.specials
        self._id_bytes = layout.id_bytes
        self._byte_ids = layout.byte_ids
        self._identity = layout.byte_ids == list(range(256))
        self._made = layout.made  # rank -> id made, None when it is 256 + rank

        if not isinstance(ignore_merges, bool):
            raise TokenizerError(f"ignore_merges must be true or false, got {ignore_merges!r}")
        if normalizer is not None and normalizer not in NORMALIZERS:
            raise TokenizerError(f"normalizer must be one of {', '.join(NORMALIZERS)} or None, got {normalizer!r}")
        if bos is not None and bos not in self._specials:
            known = ", ".join(self._specials) or "none"
            raise TokenizerError(f"bos {bos!r} must be one of the special tokens ({known})")
        text = frozenset(text_tokens or ())
        if not text <= set(self._specials) or bos in text:
            raise TokenizerError(
                f"text_tokens {sorted(text - set(self._specials) or {bos})[0]!r} must be a special token, not the bos"
            )
        self._ignore_merges = ignore_merges
        self._normalizer = normalizer
        self._bos = bos
        self._text_tokens = text
        self._whole: dict[bytes, int] | None = None  # token bytes -> id, for ignore_merges (`_token_of`)
        self._pattern_name = pattern
        self._pattern = resolve_pattern(pattern) if _pattern_regex is False else _pattern_regex
        self._training = dict(training or {})
        self._cache: ChunkCache | None = None  # chunk -> ids, built on first use (`_chunk_cache`)
        self._word_cache: WordCache | None = None  # word -> ids, for GPT-2's pattern (`_encode_ordinary`)
        self._piece_cache: PieceCache | None = None  # space-separated piece -> ids, in front of the words
        self._special_res: dict[frozenset, regex.Pattern] = {}
        self.train_report: TrainReport | None = None
        self._fingerprint: str | None = None

    # ---------------------------------------------------------------------------------- views

    @property
    def merges(self) -> list[tuple[int, int]]:
        """Merged pairs in rank order; merge r makes `merged_id(r)` (256 + r unless the vocabulary is listed)."""
        return list(self._merges)

    def merged_id(self, rank: int) -> int:
        """The id merge `rank` makes."""
        return self._layout.merged_id(rank)

    @property
    def listed(self) -> bool:
        """Whether the ids are listed one by one (imported: several merges make one token, or the
        specials come first) rather than derived from the merges (see `bpe.layout`)."""
        return not self._layout.canonical

    @property
    def vocab(self) -> list[bytes | None]:
        """Each token's bytes, by id, up to the last token that is not special (so specials
        excluded, but a listed vocabulary's specials before that are None)."""
        special = set(self._specials.values())
        last = max(i for i in range(len(self._id_bytes)) if i not in special)
        return [None if i in special else t for i, t in enumerate(self._id_bytes[: last + 1])]

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return len(self._id_bytes)

    @property
    def pattern(self) -> str:
        """The split pattern as given: 'gpt2', 'gpt4', 'none' or a regex."""
        return self._pattern_name

    @property
    def training(self) -> dict:
        """How the tokenizer was made, as its file records it: `train`'s settings, stop reason and
        `merge_counts` (the pair count of each of the first MERGE_COUNTS merges), or what it was
        imported from."""
        return dict(self._training)

    @property
    def ignore_merges(self) -> bool:
        """Whether a chunk that is itself a token is that token, unmerged (HF's ignore_merges)."""
        return self._ignore_merges

    @property
    def normalizer(self) -> str | None:
        """The Unicode normalization applied before splitting ("nfc"), or None."""
        return self._normalizer

    @property
    def bos(self) -> str | None:
        """The special token a model of this tokenizer expects before every text (Llama 3's
        `<|begin_of_text|>`, which its tokenizer.json's template adds), or None. `encode` gives a
        text's own ids and never adds it; `encode_for_model` does."""
        return self._bos

    @property
    def text_tokens(self) -> frozenset[str]:
        """Added tokens that are part of the text (HF's added tokens that are not special, Qwen2.5's
        `<tool_call>`): always read as their token, whatever the special-token policy says."""
        return self._text_tokens

    @property
    def _options(self) -> dict:
        text = sorted(self._text_tokens) or None
        return {"ignore_merges": self._ignore_merges, "normalizer": self._normalizer, "bos": self._bos,
                "text_tokens": text}  # fmt: skip

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self._options.items() if v not in (False, None))
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self._merges)}, pattern={self._pattern_name!r}, "
            f"specials={list(self._specials)}{options})"
        )

    # ------------------------------------------------------------------------------- training

    @classmethod
    def train(
        cls,
        sources: Corpus | str | os.PathLike | bytes | Iterable[str | os.PathLike | bytes],
        *,
        vocab_size: int | None = None,
        min_frequency: int | None = 2,
        pattern: str = "gpt2",
        special_tokens: Iterable[str] = (),
        workers: int | None = None,
        verbose: bool = False,
        quiet: bool = False,
        on_merge: Callable[[int, tuple[int, int], int], None] | None = None,
        count: Callable[..., dict[bytes, int]] = count_chunks,
    ) -> Tokenizer:
        """Learn merges from a corpus; the result carries `train_report`.

        sources: a `bpe.corpus.Corpus` (compressed files, JSONL, stdin, ...), or file paths,
        directories and texts (bytes), or one of them alone; merges never cross two documents
        (files, texts, JSONL records). vocab_size counts everything:
        256 bytes + merges + special tokens. Training stops at vocab_size or when the best pair
        occurs fewer than min_frequency times, whichever comes first. on_merge(rank, pair, count)
        is called after each merge; verbose=True prints each merge to stderr instead.
        count(corpus, regex, workers=, quiet=) counts the chunks; `bpe.distributed` passes one
        that counts over MPI ranks.
        """

        specials = list(special_tokens)
        if vocab_size is not None and vocab_size < 256 + len(specials):
            need = f"256 byte tokens + {len(specials)} special tokens" if specials else "256 byte tokens"
            raise TokenizerError(
                f"vocab size {vocab_size} is too small: the {need} need at least {256 + len(specials)}"
            )
        if min_frequency is not None and min_frequency < 1:
            raise TokenizerError(f"--min-frequency must be at least 1, got {min_frequency}")
        corpus = as_corpus(sources)
        regex_ = resolve_pattern(pattern)
        start = time.perf_counter()
        counts = count(corpus, regex_, workers=workers, quiet=quiet)
        if not counts:
            raise TokenizerError("the corpus is empty; give a file with some text")
        if verbose and on_merge is None:
            vocab = [bytes([i]) for i in range(256)]

            def on_merge(rank, pair, count):
                vocab.append(vocab[pair[0]] + vocab[pair[1]])
                io.print_line(describe_merge(vocab, rank, pair, count))

        result = train_merges(
            counts,
            vocab_size=None if vocab_size is None else vocab_size - len(specials),
            min_frequency=min_frequency,
            quiet=quiet,
            on_merge=on_merge,
        )
        seconds = time.perf_counter() - start
        training = {
            "vocab_size": vocab_size,
            "min_frequency": min_frequency,
            "pattern": pattern,
            "special_tokens": specials,
            "merges_learned": len(result.merges),
            "stop_reason": result.stop_reason,
            "merge_counts": list(result.counts[:MERGE_COUNTS]),  # shown beside the first merges (tk serve)
        }
        tok = cls(result.merges, special_tokens=specials, pattern=pattern, training=training, _pattern_regex=regex_)
        corpus_bytes = sum(len(chunk) * n for chunk, n in counts.items())

        def count_tokens() -> int:
            # Encoding each distinct chunk once, weighted by its count, is encoding the corpus;
            # going through the chunk cache leaves it warm for encoding that corpus next.
            texts = [chunk.decode("utf-8", "surrogateescape") for chunk in counts]
            return sum(len(ids) * n for ids, n in zip(tok._chunk_values(texts), counts.values(), strict=True))

        tok.train_report = TrainReport(
            merges_learned=len(result.merges),
            stop_reason=result.stop_reason,
            seconds=seconds,
            counts=list(result.counts),
            unique_chunks=len(counts),
            corpus_bytes=corpus_bytes,
            _count_tokens=count_tokens,
        )
        return tok

    # ------------------------------------------------------------------------------- encoding

    @cached_property
    def _pair_id(self) -> dict[tuple[int, int], int]:
        """Pair -> its rank key, 256 + rank: in the canonical layout that is also the id it makes.
        Built on first use: one chunk at a time and replays read it, the batch encoder does not."""
        return {pair: 256 + r for r, pair in enumerate(self._merges)}

    def _merge_short(self, ids: list[int]) -> list[int]:
        """Merge the lowest-rank pair, leftmost first, until no pair has a merge.

        `ranks[i]` is the rank key (256 + rank) of (ids[i], ids[i+1]), which is also the id the
        merge makes unless the vocabulary is listed (`_made`); a merge rewrites one slot and
        refreshes only its two neighbours. Quadratic in the worst case, which beats a heap for
        the few bytes of a typical chunk.
        Example, merges (a,a)->256, (256,a)->257: aaab -> [256,a,b] -> [257,b].
        """
        get, made = self._pair_id.get, self._made
        ranks = list(map(get, pairwise(ids), repeat(_NO_MERGE)))
        while True:
            new = min(ranks)
            if new == _NO_MERGE:
                return ids
            i = ranks.index(new)
            ids[i] = new = new if made is None else made[new - 256]
            del ids[i + 1]
            del ranks[i]
            if i < len(ranks):
                ranks[i] = get((new, ids[i + 1]), _NO_MERGE)
            if i:
                ranks[i - 1] = get((ids[i - 1], new), _NO_MERGE)
            if not ranks:
                return ids

    def _merge_long(self, ids: list[int]) -> list[int]:
        """Same result as `_merge_short` in O(n log n): a linked list of tokens and a heap of
        (rank, position) candidates, checked when popped (entries go stale as neighbours merge).

        Lowest rank first and equal ranks left to right, and every pair a merge creates is pushed,
        so the order of merges is exactly the rescanning one.
        """
        get, made = self._pair_id.get, self._made
        n = len(ids)
        val = list(ids)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = [(r, i) for i, r in enumerate(map(get, pairwise(ids))) if r is not None]
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            new, i = pop(heap)
            j = nxt[i]
            if val[i] < 0 or j < 0 or get((val[i], val[j])) != new:
                continue  # stale: a neighbour changed since this entry was pushed
            new = new if made is None else made[new - 256]
            val[i], val[j] = new, -1
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                r = get((new, val[k]))
                if r is not None:
                    push(heap, (r, i))
            p = prv[i]
            if p >= 0:
                r = get((val[p], new))
                if r is not None:
                    push(heap, (r, p))
        return [v for v in val if v >= 0]

    def _chunk_ids(self, chunk: str) -> tuple[int, ...]:
        """Ids of one pre-token chunk (no cache)."""
        try:
            raw = chunk.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:
            raise TokenizerError(
                "text contains a lone surrogate that is not an escaped byte; it cannot be encoded as UTF-8"
            ) from None
        ids = list(raw) if self._identity else [self._byte_ids[b] for b in raw]
        if len(ids) < 2:
            return tuple(ids)
        if self._ignore_merges and raw in self._token_of:
            return (self._token_of[raw],)
        return tuple(self._merge_long(ids) if len(ids) >= _LONG_CHUNK else self._merge_short(ids))

    @property
    def _token_of(self) -> dict[bytes, int]:
        """The bytes of every merged token -> its id (ignore_merges looks chunks up in it), built
        on first use; two ids with the same bytes are refused (which would the chunk be?)."""
        if self._whole is None:
            whole: dict[bytes, int] = {}
            for i in self._merged_tokens:
                if whole.setdefault(self._id_bytes[i], i) != i:
                    raise TokenizerError(
                        f"ids {whole[self._id_bytes[i]]} and {i} have the same bytes {self._id_bytes[i]!r}; with "
                        "ignore_merges a chunk of those bytes would be either"
                    )
            self._whole = whole
        return self._whole

    @property
    def _merged_tokens(self) -> list[int]:
        """The ids of the tokens of two bytes or more, ascending (special tokens aside)."""
        return [i for i in self._layout.regular_ids if len(self._id_bytes[i]) > 1]

    @property
    def _chunk_cache(self) -> ChunkCache:
        """The chunk cache, built on first use (its pair table takes a moment for a big vocabulary)."""
        if self._cache is None:
            byte_ids = None if self._identity else self._byte_ids
            whole = self._token_of if self._ignore_merges else None
            table = PairTable(self._merges, self._made, self._layout.monotone)
            self._cache = ChunkCache(table, byte_ids, self.ids_dtype, _CACHE_MAX_CHUNK, whole)
            if self._pattern == GPT2_PATTERN:
                split = lambda text: split_text(text, GPT2_PATTERN)  # noqa: E731
                self._word_cache = WordCache(self._cache, split, _CACHE_MAX_CHUNK)
                self._piece_cache = PieceCache(self._word_cache, _CACHE_MAX_CHUNK)
        return self._cache

    def _encode_ordinary(self, text: str) -> bytes:
        """Ids of text that holds no special tokens (anything special-looking is plain text), as
        raw bytes of `ids_dtype`.

        Split with the pattern, then look every chunk up in the cache, merging only the chunks
        not seen before (chunks, not whole words: new text brings few new chunks; BENCHMARKS.md).
        With GPT-2's pattern, the pieces between single spaces are looked up first, then whole
        words, and only new words are split into chunks: cheaper splits and fewer lookups (see
        `bpe.encoder.PieceCache` and `WordCache`). A tokenizer with a normalizer applies it first
        (HF normalizes each stretch between special tokens, as this is called).
        """
        if self._normalizer is not None:
            text = unicodedata.normalize("NFC", text)
        cache = self._chunk_cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        if self._piece_cache is None:
            return cache.ids_bytes(split_text(text, self._pattern))
        for level in (self._piece_cache, self._word_cache):
            if len(level) > _WORD_CACHE_LIMIT:
                level.clear()
        return self._piece_cache.text_ids(text)

    def _chunk_values(self, chunks: list[str]) -> list[array]:
        """The ids of each chunk, through the chunk cache (merging the chunks not seen yet)."""
        code = "H" if self.ids_dtype == np.uint16 else "I"
        return list(map(array, repeat(code), self._chunk_cache.values_of(chunks)))

    def _special_re(self, names: frozenset) -> regex.Pattern:
        found = self._special_res.get(names)
        if found is None:
            # Longest first: at the same starting point the longer special wins.
            alternatives = sorted(names, key=lambda s: (-len(s), s))
            found = self._special_res[names] = regex.compile("|".join(regex.escape(s) for s in alternatives))
        return found

    def _special_set(self, value, what: str) -> set[str]:
        if value == "all":
            return set(self._specials)
        if isinstance(value, str):
            value = {value}
        names = set(value)
        unknown = names - set(self._specials)
        if unknown:
            known = ", ".join(self._specials) or "none"
            raise TokenizerError(
                f"{what} names {sorted(unknown)[0]!r}, which is not a special token of this tokenizer (it has: {known})"
            )
        return names

    def encode(
        self,
        text: str | bytes,
        *,
        allowed_special: Iterable[str] | str = (),
        disallowed_special: Iterable[str] | str = "all",
    ) -> list[int]:
        """Token ids of `text` (str, or bytes: any bytes, not only UTF-8).

        Special tokens follow tiktoken's policy: text that looks like a special token is only
        encoded as that token when it is in `allowed_special` ("all" allows every one). A
        special token that is neither allowed nor excluded from `disallowed_special` (default
        "all") raises DisallowedSpecialError (a TokenizerError), because it usually means untrusted
        text is trying to inject control tokens; pass `disallowed_special=()` to encode such text as
        plain bytes instead. When allowed specials overlap, the leftmost match wins, and at the same
        start the longest (as in HF tokenizers; see `export_tiktoken` for tiktoken).

        >>> tok = Tokenizer([], special_tokens=["<|end|>"])
        >>> tok.encode("hi<|end|>", allowed_special="all")
        [104, 105, 256]
        >>> len(tok.encode("hi<|end|>", disallowed_special=()))
        9
        """
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="surrogateescape")
        elif not isinstance(text, str):
            raise TokenizerError(f"encode takes str or bytes, got {type(text).__name__}")
        return np.frombuffer(
            self._encode_bytes(text, allowed_special, disallowed_special), dtype=self.ids_dtype
        ).tolist()

    def encode_for_model(
        self,
        text: str | bytes,
        *,
        allowed_special: Iterable[str] | str = (),
        disallowed_special: Iterable[str] | str = "all",
    ) -> list[int]:
        """What a model reads for `text`: `encode(text)`, after the `bos` token when the tokenizer
        has one (transformers' add_special_tokens=True, for the templates tk reads).

        >>> Tokenizer([], special_tokens=["<s>"], bos="<s>").encode_for_model("hi")
        [256, 104, 105]
        """
        ids = self.encode(text, allowed_special=allowed_special, disallowed_special=disallowed_special)
        return ids if self._bos is None else [self._specials[self._bos], *ids]

    def _segments(self, text: str, allowed_special, disallowed_special) -> list[str | int]:
        """`text` cut at the special tokens the policy allows: its stretches of plain text (str,
        possibly empty) and the special tokens' ids (int), in order. A special token the policy
        disallows raises DisallowedSpecialError (see `encode`).

        >>> Tokenizer([], special_tokens=["<|end|>"])._segments("a<|end|>b", "all", "all")
        ['a', 256, 'b']
        """
        if not self._specials:
            return [text]
        allowed = self._special_set(allowed_special, "allowed_special") | self._text_tokens  # text: always read
        disallowed = (
            set(self._specials) - allowed
            if disallowed_special == "all"
            else self._special_set(disallowed_special, "disallowed_special") - self._text_tokens
        )
        if disallowed:
            hit = self._special_re(frozenset(disallowed)).search(text)
            if hit:
                raise DisallowedSpecialError(hit.group())
        if not allowed:
            return [text]
        segments: list[str | int] = []
        start = 0
        for hit in self._special_re(frozenset(allowed)).finditer(text):
            segments += [text[start : hit.start()], self._specials[hit.group()]]
            start = hit.end()
        segments.append(text[start:])
        return segments

    def _encode_bytes(self, text: str, allowed_special, disallowed_special) -> bytes:
        """`encode` of a str, as raw bytes of `ids_dtype` (what file encoding writes and sends)."""
        segments = self._segments(text, allowed_special, disallowed_special)
        if len(segments) == 1:
            return self._encode_ordinary(text)
        return b"".join(
            np.array(s, dtype=self.ids_dtype).tobytes() if isinstance(s, int) else self._encode_ordinary(s)
            for s in segments
        )

    def replay(
        self,
        text: str | bytes,
        *,
        allowed_special: Iterable[str] | str = (),
        disallowed_special: Iterable[str] | str = "all",
    ) -> Replay:
        """`text` from bytes to tokens, merge by merge (see `bpe.replay`): its byte ids (a special
        token, read as `encode` reads it, is one id and a chunk of its own; with ignore_merges, so
        is a chunk that is a token), its pre-token chunks, and the steps in rank order, on the
        text as the tokenizer sees it (after its normalizer). The result's `ids` are `encode(text)`'s.

        >>> r = Tokenizer([(97, 97), (256, 97)]).replay("aaab aa")
        >>> r.chunks, [(s.new_id, s.at) for s in r.steps], r.ids
        ([(0, 4), (4, 7)], [(256, [0, 5]), (257, [0])], [257, 98, 32, 256])
        """
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="surrogateescape")
        elif not isinstance(text, str):
            raise TokenizerError(f"replay takes str or bytes, got {type(text).__name__}")
        pieces: list[list[int]] = []
        for segment in self._segments(text, allowed_special, disallowed_special):
            if isinstance(segment, int):
                pieces.append([segment])
                continue
            if self._normalizer is not None:  # as _encode_ordinary: each stretch between specials
                segment = unicodedata.normalize("NFC", segment)
            for chunk in split_text(segment, self._pattern):
                try:
                    raw = chunk.encode("utf-8", errors="surrogateescape")
                except UnicodeEncodeError:
                    raise TokenizerError(
                        "text contains a lone surrogate that is not an escaped byte; it cannot be encoded as UTF-8"
                    ) from None
                if self._ignore_merges and len(raw) > 1 and raw in self._token_of:
                    pieces.append([self._token_of[raw]])  # a whole token from the start, never merged
                    continue
                pieces.append(list(raw) if self._identity else [self._byte_ids[b] for b in raw])
        steps, ids = replay_merges(pieces, self._pair_id, self._made, self._layout.monotone)
        bounds = list(accumulate(map(len, pieces), initial=0))
        return Replay([i for piece in pieces for i in piece], list(pairwise(bounds)), steps, ids)

    def _ids_list(self, ids) -> list[int]:
        if isinstance(ids, np.ndarray):
            if ids.dtype.kind not in "iu":
                raise TokenizerError(f"token ids must be integers, got {ids.dtype}")
            ids = ids.reshape(-1).tolist()
        else:
            ids = list(ids)
        if ids:
            lo, hi = min(ids), max(ids)
            if lo < 0 or hi >= len(self._id_bytes):
                bad = lo if lo < 0 else hi
                raise TokenizerError(
                    f"token id {bad} is out of range for this tokenizer (ids are 0..{len(self._id_bytes) - 1})"
                )
        return ids

    def decode_bytes(self, ids: Iterable[int] | np.ndarray) -> bytes:
        """The exact bytes of `ids` (special tokens as their UTF-8 text)."""
        return b"".join(map(self._id_bytes.__getitem__, self._ids_list(ids)))

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 (e.g. half a character) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_pieces(self, ids: Iterable[int]) -> list[str]:
        """Each id's text on its own (partial UTF-8 shown as \\x escapes), for showing boundaries."""
        return [self._id_bytes[i].decode("utf-8", errors="backslashreplace") for i in self._ids_list(ids)]

    @property
    def ids_dtype(self) -> type:
        """uint16 when every id fits in it, else uint32 (for arrays of ids)."""
        return np.uint16 if self.vocab_size <= 1 << 16 else np.uint32

    def encode_file(
        self,
        path: Corpus | str | os.PathLike,
        out_path: str | os.PathLike | None = None,
        workers: int | None = None,
        quiet: bool = False,
        *,
        allowed_special: Iterable[str] | str = (),
        disallowed_special: Iterable[str] | str = "all",
        eot: str | None = None,
        for_model: bool = False,
    ) -> np.ndarray:
        """Ids of a whole corpus as a 1-D array: each document encoded as `encode` encodes its
        text (its exact bytes), one after the other, the id of the special token `eot` between
        documents when given. `for_model`: each document as `encode_for_model` encodes it, after
        the tokenizer's BOS when it has one (a model's training data).

        path: a file, a directory, "-" (stdin), or a `bpe.corpus.Corpus` (compressed files,
        JSONL, ...). uint16 when the vocabulary fits, else uint32. With `out_path` (.npy) the
        ids are streamed there, atomically, and the result is that file memory-mapped read-only:
        memory stays at a few pieces however large the corpus. The work runs in `workers`
        processes (default: all cores; 1: here), in pieces of about a megabyte cut where the
        split pattern always splits; with a custom pattern or 'none' no such place is known,
        so each document is one piece. See `bpe.encode_corpus`.
        """
        return encode_corpus.encode_corpus(
            self,
            as_corpus(path),
            out_path,
            workers=workers,
            quiet=quiet,
            allowed_special=allowed_special,
            disallowed_special=disallowed_special,
            eot=eot,
            bos=self._specials[self._bos] if for_model and self._bos is not None else None,
        ).ids

    def _special_args(self, allowed_special, disallowed_special) -> tuple[list[str], list[str] | str]:
        """The special-token policy of encode_file, checked once and made plain for worker processes."""
        allowed = sorted(self._special_set(allowed_special, "allowed_special"))
        disallowed = (
            disallowed_special
            if disallowed_special == "all"
            else sorted(self._special_set(disallowed_special, "disallowed_special"))
        )
        return allowed, disallowed

    # ----------------------------------------------------------------------------- files

    def to_tensors(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The tensors and string metadata of `tokenizer.safetensors` (see bpe/io.py)."""
        special = set(self._specials.values())
        tokens = [None if i in special else t for i, t in enumerate(self._id_bytes)] if self.listed else self.vocab
        return io.pack(
            self._merges,
            tokens,
            self._specials,
            self._pattern_name,
            self._pattern,
            self._training,
            self._options,
            listed=self.listed,
        )

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> Tokenizer:
        """Rebuild a tokenizer from `to_tensors` output, validating everything."""
        parts = io.unpack(tensors, metadata)
        return cls(
            parts["merges"],
            special_tokens=parts["special_tokens"],
            pattern=parts["pattern"],
            byte_order=parts.get("byte_order"),
            vocab=parts.get("vocab"),
            training=parts["training"],
            _pattern_regex=parts["pattern_regex"],
            **parts["options"],
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write `tokenizer.safetensors` atomically; same tokenizer, same bytes."""
        io.write_tokenizer_file(path, *self.to_tensors())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        return cls.from_tensors(*io.read_tokenizer_file(path))

    def fingerprint(self) -> str:
        """sha256 (hex) of the tokenizer file's bytes: equal fingerprints, equal tokenizers."""
        if self._fingerprint is None:  # a tokenizer never changes, so hash its file once
            self._fingerprint = hashlib.sha256(io.serialize(*self.to_tensors())).hexdigest()
        return self._fingerprint

    @classmethod
    def from_gpt2(
        cls, vocab_path: str | os.PathLike, merges_path: str | os.PathLike, *, pattern: str = "gpt2"
    ) -> Tokenizer:
        """Import GPT-2's files: encoder.json + vocab.bpe, or vocab.json + merges.txt.

        The result encodes every text to GPT-2's own ids ("hello world" -> [31373, 995]).
        """
        parts = io.read_gpt2(vocab_path, merges_path)
        return cls(
            parts["merges"],
            special_tokens=parts["special_tokens"],
            pattern=pattern,
            byte_order=parts["byte_order"],
            training={"imported": "gpt2 vocabulary + merges files"},
        )

    EXPORT_FORMATS = ("gpt2", "hf", "tiktoken")

    def export(self, directory: str | os.PathLike, format: str = "gpt2", *, overwrite: bool = False) -> list[Path]:
        """Write the tokenizer into `directory` in another library's format; returns the paths.

        "gpt2": vocab.json + merges.txt; "hf": Hugging Face's tokenizer.json (`export_hf`);
        "tiktoken": tokenizer.tiktoken + tokenizer_tiktoken.json (`export_tiktoken`). A vocabulary
        the format cannot express exactly is refused (TokenizerError) before anything is written.
        The files arrive together (a reader never sees a new one beside an old one) and the
        directory's other files stay; files of the format already there are replaced only with
        `overwrite`.
        """
        return io.write_files(directory, self.export_files(format), overwrite=overwrite)

    def export_files(self, format: str = "gpt2") -> dict[str, bytes]:
        """The files `export` writes, name -> contents, validated (TokenizerError) and not written."""
        if format == "gpt2":
            if any(v not in (False, None) for v in self._options.values()):
                what = (
                    "ignore_merges"
                    if self._ignore_merges
                    else f"its {self._normalizer.upper()} normalizer"
                    if self._normalizer
                    else f"that a model expects {self._bos} first"
                    if self._bos
                    else "added tokens that are part of the text"
                )
                raise TokenizerError(
                    f"vocab.json + merges.txt cannot say {what}, which changes ids; export it with --format hf"
                )
            if self.listed:
                raise TokenizerError(
                    "vocab.json + merges.txt make merge r id 256 + r, which this listed vocabulary does not; "
                    "export it with --format hf"
                )
            return io.gpt2_files(self.vocab, self._merges, self._specials)
        if format == "hf":
            data = interop.to_hf(self.vocab, self._merges, self._specials, self._pattern, **self._options)
            return io.hf_files(data, *interop.hf_configs(self._specials, self._bos, self._options["text_tokens"]))
        if format == "tiktoken":
            if self.listed:
                raise TokenizerError(
                    "tiktoken's ranks are its ids and merge any pair whose bytes are a token; this listed "
                    "vocabulary's merges do not follow its ids, so export it with --format hf"
                )
            ranks = interop.to_tiktoken(self._merges, self._byte_order)
            interop.check_tiktoken_specials(self._specials, "exported to tiktoken")
            if self._bos is not None or self._text_tokens:
                what = f"that a model expects {self._bos} before every text" if self._bos else "text's added tokens"
                raise TokenizerError(f"tiktoken's files cannot say {what}; export it with --format hf")
            if self._normalizer is not None:
                raise TokenizerError(
                    f"the tokenizer puts text in {self._normalizer.upper()} before splitting and tiktoken has no "
                    "normalizer, so it cannot be exported to tiktoken"
                )
            self._check_whole_tokens(
                _TIKTOKEN_IGNORE_MERGES if self._ignore_merges else _TIKTOKEN_WHOLE, "exported to tiktoken"
            )
            pat_str = interop.tiktoken_pat_str(self._pattern)
            return io.tiktoken_files(ranks, pat_str, self._specials, self._pattern_name)
        raise TokenizerError(f"unknown export format {format!r}; use one of {', '.join(self.EXPORT_FORMATS)}")

    def export_gpt2(self, directory: str | os.PathLike, *, overwrite: bool = False) -> tuple[Path, Path]:
        """Write vocab.json + merges.txt (GPT-2's format) into `directory`; returns both paths."""
        vocab_file, merges_file = self.export(directory, "gpt2", overwrite=overwrite)
        return vocab_file, merges_file

    @property
    def _byte_order(self) -> list[int]:
        return [t[0] for t in self._id_bytes[:256]]

    def export_hf(self, directory: str | os.PathLike, *, overwrite: bool = False) -> list[Path]:
        """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `directory`
        (created if missing), which `tokenizers.Tokenizer.from_file` and transformers'
        `AutoTokenizer.from_pretrained` read with our exact ids; returns the three paths."""
        return self.export(directory, "hf", overwrite=overwrite)

    def export_tiktoken(self, directory: str | os.PathLike, *, overwrite: bool = False) -> list[Path]:
        """Write tokenizer.tiktoken (tiktoken's rank file: our ids are the ranks) and
        tokenizer_tiktoken.json (pat_str, special_tokens) into `directory`; returns both paths.

        Special tokens one of which begins another are refused: tiktoken does not read the
        longest of them, as tk does (`interop.check_tiktoken_specials`)."""
        return self.export(directory, "tiktoken", overwrite=overwrite)

    def _check_whole_tokens(self, why: str, action: str) -> None:
        """Refuse a vocabulary where some token's bytes do not merge back into that token, saying
        `why` that matters (a template: "{id}" is the token's id) and what cannot be done."""
        for i in self._merged_tokens:
            ids = self._merged_ids(self._id_bytes[i])
            if ids != [i]:
                raise TokenizerError(
                    f"token {i} ({self._id_bytes[i]!r}) is not what its own bytes merge into ({ids}); "
                    f"{why.format(id=i)}, so this vocabulary cannot be {action}"
                )

    def _merged_ids(self, raw: bytes) -> list[int]:
        """The ids the merges alone make of `raw` (ignore_merges aside)."""
        ids = [self._byte_ids[b] for b in raw]
        return self._merge_long(ids) if len(ids) >= _LONG_CHUNK else self._merge_short(ids) if len(ids) > 1 else ids

    @classmethod
    def from_hf(cls, path: str | os.PathLike) -> Tokenizer:
        """Import a Hugging Face byte-level BPE tokenizer: a tokenizer.json, or a directory holding
        tokenizer.json or vocab.json + merges.txt (GPT-2's pair, split with GPT-2's pattern).

        The result gives the library's ids, with `ignore_merges` and an NFC normalizer as the
        file sets them; what tk cannot reproduce (other normalizers, prefix spaces, merges out of
        id order, post-processors that add tokens, SentencePiece-style tokenizers, ...) is refused
        in one line. For a directory, also what transformers' class for it does (a GPT2Tokenizer
        splits with GPT-2's pattern whatever tokenizer.json says, a Qwen2Tokenizer with Qwen2's:
        `interop.check_transformers_class`).
        """
        with gcpause.paused():  # a tokenizer.json makes a tuple or list per merge, and no cycles
            return cls._from_hf(path)

    @classmethod
    def _from_hf(cls, path: str | os.PathLike) -> Tokenizer:
        files = io.find_hf(path)
        parts = (
            io.read_hf(files[0])
            if len(files) == 1
            else {
                "pattern": "gpt2",
                "special_tokens": {},
                "ignore_merges": False,
                "normalizer": None,
                "bos": None,
                "text_tokens": None,
            }  # fmt: skip
        )
        if Path(path).is_dir():  # transformers' configs there decide how it reads the files
            parts = interop.check_transformers_class(*io.read_hf_configs(path), parts, str(path))
        if len(files) == 2:
            return cls.from_gpt2(*files)
        try:
            tok = cls(
                parts["merges"],
                special_tokens=parts["special_tokens"],
                pattern=parts["pattern"],
                vocab=parts["vocab"],
                training={"imported": "Hugging Face tokenizer.json"},
                ignore_merges=parts["ignore_merges"],
                normalizer=parts["normalizer"],
                bos=parts["bos"],
                text_tokens=parts["text_tokens"],
            )
        except TokenizerError as err:
            raise TokenizerError(f"{files[0]}: {err}") from None
        if "dropped" in parts:  # tokenizer.json's ignore_merges, which transformers drops: fine if it changes nothing
            tok._check_whole_tokens(
                f"{files[0]} sets ignore_merges, with which HF tokenizers give {{id}} for that text",
                f"read as transformers' {parts['dropped']} reads it (without ignore_merges)",
            )
        return tok

    @classmethod
    def from_tiktoken(
        cls, path: str | os.PathLike, pattern: str | None = None, special_tokens: Iterable[str] = ()
    ) -> Tokenizer:
        """Import a tiktoken rank file (base64 token bytes and rank per line; ranks become ids).

        The split pattern and special tokens come from `NAME_tiktoken.json` beside `NAME.tiktoken`
        (as `export_tiktoken` writes it) or, for a bare rank file, from `pattern` (a name, or
        tiktoken's pat_str) and `special_tokens` (numbered after the ranks, in order).
        """
        ranks, meta = io.read_tiktoken(path)
        parts = interop.from_tiktoken(ranks, str(path))
        n_tokens = 256 + len(parts["merges"])
        specials = list(special_tokens)
        if meta is not None:
            meta_path = io.tiktoken_meta_path(path)
            if pattern is not None or specials:
                raise TokenizerError(f"{meta_path} gives the pattern and special tokens; do not give them again")
            pattern = meta.get("pattern") or interop.pattern_of_pat_str(meta["pat_str"])
            if meta.get("pattern") and interop.tiktoken_pat_str(resolve_pattern(pattern)) != meta["pat_str"]:
                raise TokenizerError(
                    f"{meta_path}: pattern {pattern[:40]!r} is not the one of its pat_str; the file was altered"
                )
            specials = meta["special_tokens"]
            if sorted(specials.values()) != list(range(n_tokens, n_tokens + len(specials))):
                raise TokenizerError(
                    f"{meta_path}: special tokens must have consecutive ids right after the ranks ({n_tokens}...)"
                )
        elif pattern is None:
            raise TokenizerError(
                f"{path}: a .tiktoken file does not hold its split pattern; give it (--pattern gpt2|gpt4|none|REGEX)"
            )
        interop.check_tiktoken_specials(specials, "imported from tiktoken")
        tok = cls(
            parts["merges"],
            special_tokens=specials,
            pattern=pattern
            if pattern in PATTERNS
            else interop.pattern_name(pattern),  # tiktoken's gpt2 pat_str is "gpt2"
            byte_order=parts["byte_order"],
            training={"imported": "tiktoken rank file"},
        )
        tok._check_whole_tokens(_TIKTOKEN_WHOLE, "imported")
        return tok


__all__ = ["MERGE_COUNTS", "Tokenizer", "TrainReport", "describe_merge"]
