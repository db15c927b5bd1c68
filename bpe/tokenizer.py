"""`Tokenizer`: byte-level BPE encode/decode, and the special-token policy; the package's front door.

What it does: turns text into token ids and back with a list of merges (merge r makes id 256 + r);
recognises special tokens only where the caller allows them (tiktoken's policy, `SpecialPolicy`):
the codec and its policy, as tiktoken's `Encoding`. The rest are thin entry points: `train`
(bpe/train_corpus.py), `encode_file` (bpe/encode_corpus.py: worker processes), `save`/`load`
(bpe/io.py), and the importers and exporters of other libraries' files (bpe/formats.py).

What it deliberately does not do: merge (bpe/merge.py), learn merges (bpe/trainer.py), split text
into chunks (bpe/pretokenize.py), cache chunks' ids (bpe/text_encoder.py), read corpora or run
processes, or touch files.

Encoding, in short: split the text at allowed special tokens, split each stretch with the pattern
into chunks, and turn each chunk into ids by repeatedly merging the adjacent pair with the lowest
rank (`bpe.merge.merge_chunk`). Text repeats a lot, so each distinct chunk is merged once and its
ids are cached (`bpe.text_encoder`). Two
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
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from pathlib import Path

import numpy as np

from tokenkit.bpe import encode_corpus, formats, io, library_files, train_corpus
from tokenkit.bpe.corpus import Corpus, Source, as_corpus
from tokenkit.bpe.errors import DisallowedSpecialError, TokenizerError
from tokenkit.bpe.layout import Layout, canonical, listed
from tokenkit.bpe.literals import LiteralFinder
from tokenkit.bpe.patterns import resolve_pattern
from tokenkit.bpe.replay import Replay, replay_merges
from tokenkit.bpe.show import token_str
from tokenkit.bpe.text_encoder import TextEncoder
from tokenkit.bpe.train_corpus import TrainReport

_CACHE_LIMIT = 1 << 20  # distinct chunks kept in the cache before it is emptied and refilled
_CACHE_MAX_CHUNK = 256  # longer chunks are rare; caching them would only cost memory
_WORD_CACHE_LIMIT = 1 << 18  # distinct words (and pieces) kept (GPT-2's pattern), like _CACHE_LIMIT
NORMALIZERS = ("nfc",)  # Unicode normalizations a tokenizer may apply before splitting (HF's NFC)


@dataclass(frozen=True)
class SpecialPolicy:
    """How a text's special tokens are read (tiktoken's policy, checked against one tokenizer's
    special tokens by `Tokenizer.special_policy`): those `allowed` as their token, finding one of
    those `disallowed` is a DisallowedSpecialError, and the others are plain text."""

    allowed: frozenset[str]
    disallowed: frozenset[str]


_PLAIN = SpecialPolicy(frozenset(), frozenset())  # every text plain, its special-looking text too


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
        _layout: Layout | None = None,
    ) -> None:

        if _layout is not None:  # built and checked by the file's reader (`from_tensors`)
            layout = _layout
        elif vocab is None:
            merges = [(int(a), int(b)) for a, b in merges]
            layout = canonical(merges, byte_order, special_tokens)
        elif byte_order is not None or not isinstance(special_tokens, dict):
            raise TokenizerError("a listed vocabulary gives the bytes' ids and takes special tokens as a dict of ids")
        else:
            layout = listed(vocab, [(int(a), int(b)) for a, b in merges], special_tokens)
        self._layout = layout
        self._merges = layout.merges
        self._specials = layout.specials
        self._id_bytes = layout.id_bytes

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
        self._pattern_name = pattern
        self._pattern = resolve_pattern(pattern) if _pattern_regex is False else _pattern_regex
        self._training = dict(training or {})
        self._text = TextEncoder(layout, self._pattern, normalizer, ignore_merges, self.ids_dtype)  # and its caches
        self._special_finders: dict[frozenset, LiteralFinder] = {}
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
        `merge_counts` (the pair count of each of the first `bpe.train_corpus.MERGE_COUNTS` merges), or what it was
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
    def options(self) -> dict:
        """The settings beside the merges that change ids, as the tokenizer file records them:
        ignore_merges, normalizer, bos and text_tokens (a sorted list, None when there are none)."""
        text = sorted(self._text_tokens) or None
        return {"ignore_merges": self._ignore_merges, "normalizer": self._normalizer, "bos": self._bos,
                "text_tokens": text}  # fmt: skip

    @property
    def pattern_regex(self) -> str | None:
        """The split regex in use (the pattern's, resolved), None for no split."""
        return self._pattern

    @property
    def layout(self) -> Layout:
        """Which bytes each id stands for and which id each merge makes (see `bpe.layout`)."""
        return self._layout

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.options.items() if v not in (False, None))
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self._merges)}, pattern={self._pattern_name!r}, "
            f"specials={list(self._specials)}{options})"
        )

    # ------------------------------------------------------------------------------- training

    @classmethod
    def train(cls, sources: Corpus | Source | Iterable[Source], **options) -> Tokenizer:
        """Learn merges from a corpus (files, directories, texts as bytes, or a `bpe.corpus.Corpus`);
        the result carries `train_report`. The options (vocab_size, min_frequency, pattern,
        special_tokens, workers, verbose, quiet, on_merge, count) are `bpe.train_corpus.train`'s.

        >>> Tokenizer.train([b"aaabdaaabac"], vocab_size=259, min_frequency=1, quiet=True).merges
        [(97, 97), (97, 98), (256, 257)]
        """
        return train_corpus.train(cls, sources, **options)

    # ------------------------------------------------------------------------------- encoding

    def _chunk_ids(self, chunk: str) -> tuple[int, ...]:
        """Ids of one pre-token chunk, merged with the plain loop (no cache)."""
        return self._text.chunk_ids(chunk)

    def count_tokens(self, chunk_counts: Mapping[bytes, int]) -> int:
        """The length in tokens of a corpus counted as {chunk: count} (`bpe.pretokenize`), specials
        read as plain text (see `bpe.text_encoder.TextEncoder.count_tokens`)."""
        return self._text.count_tokens(chunk_counts)

    def _special_finder(self, names: frozenset) -> LiteralFinder:
        found = self._special_finders.get(names)
        if found is None:
            found = self._special_finders[names] = LiteralFinder(names)
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
            self.encode_raw(text, self._policy(allowed_special, disallowed_special)), dtype=self.ids_dtype
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

    def special_policy(
        self, allowed_special: Iterable[str] | str = (), disallowed_special: Iterable[str] | str = "all"
    ) -> SpecialPolicy:
        """`encode`'s two arguments as one checked value, for encoding many texts alike (each worker
        of `encode_file` gets one): a name that is none of the special tokens is a TokenizerError,
        and the text tokens are always read as their token."""
        allowed = self._special_set(allowed_special, "allowed_special") | self._text_tokens
        disallowed = (
            set(self._specials) - allowed
            if disallowed_special == "all"
            else self._special_set(disallowed_special, "disallowed_special") - self._text_tokens
        )
        return SpecialPolicy(frozenset(allowed), frozenset(disallowed))

    def _policy(self, allowed_special, disallowed_special) -> SpecialPolicy:
        """`special_policy`, but a tokenizer without special tokens reads every text as plain text,
        whatever the arguments name (as `encode` always has)."""
        return self.special_policy(allowed_special, disallowed_special) if self._specials else _PLAIN

    def _segments(self, text: str, policy: SpecialPolicy) -> list[str | int]:
        """`text` cut at the special tokens the policy allows: its stretches of plain text (str,
        possibly empty) and the special tokens' ids (int), in order. A special token the policy
        disallows raises DisallowedSpecialError (see `encode`).

        >>> tok = Tokenizer([], special_tokens=["<|end|>"])
        >>> tok._segments("a<|end|>b", tok.special_policy("all"))
        ['a', 256, 'b']
        """
        if policy.disallowed:
            hit = self._special_finder(policy.disallowed).search(text)
            if hit:
                raise DisallowedSpecialError(hit[2])
        if not policy.allowed:
            return [text]
        segments: list[str | int] = []
        start = 0
        for begin, end, name in self._special_finder(policy.allowed).finditer(text):
            segments += [text[start:begin], self._specials[name]]
            start = end
        segments.append(text[start:])
        return segments

    def encode_raw(self, text: str, policy: SpecialPolicy) -> bytes:
        """`encode` of a str under a `special_policy`, as the raw bytes of an `ids_dtype` array
        (what file encoding writes, and its workers send back)."""
        segments = self._segments(text, policy)
        if len(segments) == 1:
            return self._text.encode(text)
        return b"".join(
            np.array(s, dtype=self.ids_dtype).tobytes() if isinstance(s, int) else self._text.encode(s)
            for s in segments
        )

    def warm_up(self) -> None:
        """Build the encoder's tables now (its pair table takes a moment for a big vocabulary):
        once before forking worker processes, which then inherit them."""
        self._text.chunk_cache  # noqa: B018  (built on first use)

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
        pieces: list[list[int]] = []  # each chunk's ids before merging; a special token's id alone
        for segment in self._segments(text, self._policy(allowed_special, disallowed_special)):
            if isinstance(segment, int):
                pieces.append([segment])
            else:  # normalized and split as encoding does it, stretch by stretch between specials
                pieces += map(self._text.start_ids, self._text.chunks(segment))
        steps, ids = replay_merges(pieces, self._layout.pair_id, self._layout.made, self._layout.monotone)
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
        return [token_str(self._id_bytes[i]) for i in self._ids_list(ids)]

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
            self.options,
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
            _layout=parts.get("layout"),
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

    # ------------------------------------------------------------- other libraries' files

    @classmethod
    def from_gpt2(
        cls, vocab_path: str | os.PathLike, merges_path: str | os.PathLike, *, pattern: str = "gpt2"
    ) -> Tokenizer:
        """Import GPT-2's files: encoder.json + vocab.bpe, or vocab.json + merges.txt.

        The result encodes every text to GPT-2's own ids ("hello world" -> [31373, 995]).
        """
        return formats.from_gpt2(cls, vocab_path, merges_path, pattern=pattern)

    @classmethod
    def from_hf(cls, path: str | os.PathLike) -> Tokenizer:
        """Import a Hugging Face byte-level BPE tokenizer (a tokenizer.json, or a directory of one or of
        vocab.json + merges.txt) with the library's exact ids, refusing in one line what tk cannot
        reproduce (see `bpe.formats.from_hf`)."""
        return formats.from_hf(cls, path)

    @classmethod
    def from_tiktoken(
        cls, path: str | os.PathLike, pattern: str | None = None, special_tokens: Iterable[str] = ()
    ) -> Tokenizer:
        """Import a tiktoken rank file (base64 token bytes and rank per line; ranks become ids).

        The split pattern and special tokens come from `NAME_tiktoken.json` beside `NAME.tiktoken`
        (as `export_tiktoken` writes it) or, for a bare rank file, from `pattern` (a name, or
        tiktoken's pat_str) and `special_tokens` (numbered after the ranks, in order).
        """
        return formats.from_tiktoken(cls, path, pattern, special_tokens)

    EXPORT_FORMATS = formats.EXPORT_FORMATS

    def export(self, directory: str | os.PathLike, format: str = "gpt2", *, overwrite: bool = False) -> list[Path]:
        """Write the tokenizer into `directory` in another library's format; returns the paths.

        "gpt2": vocab.json + merges.txt; "hf": Hugging Face's tokenizer.json (`export_hf`);
        "tiktoken": tokenizer.tiktoken + tokenizer_tiktoken.json (`export_tiktoken`). A vocabulary
        the format cannot express exactly is refused (TokenizerError) before anything is written.
        The files arrive together (a reader never sees a new one beside an old one) and the
        directory's other files stay; files of the format already there are replaced only with
        `overwrite`.
        """
        return library_files.write_files(directory, self.export_files(format), overwrite=overwrite)

    def export_files(self, format: str = "gpt2") -> dict[str, bytes]:
        """The files `export` writes, name -> contents, validated (TokenizerError) and not written."""
        return formats.export_files(self, format)

    def export_gpt2(self, directory: str | os.PathLike, *, overwrite: bool = False) -> tuple[Path, Path]:
        """Write vocab.json + merges.txt (GPT-2's format) into `directory`; returns both paths."""
        vocab_file, merges_file = self.export(directory, "gpt2", overwrite=overwrite)
        return vocab_file, merges_file

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


__all__ = ["SpecialPolicy", "Tokenizer"]
