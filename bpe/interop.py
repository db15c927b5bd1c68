"""Conversion between a tokenizer's parts and the formats of Hugging Face `tokenizers` and tiktoken.

What it does, as pure functions on plain values (no files, no BPE):
- `to_hf`: parts -> the dict of a Hugging Face `tokenizer.json` (a byte-level BPE model: GPT-2's
  byte-to-character table, the vocabulary as token string -> id, the merges in rank order,
  special tokens as added tokens). The split pattern becomes HF's ByteLevel pre-tokenizer with
  its own regex (GPT-2's pattern, which is HF's), a Split pre-tokenizer with the regex followed by
  ByteLevel without one (GPT-4's and custom patterns), or ByteLevel alone (no split). HF's regex
  engine is Oniguruma, which reads some constructs otherwise (GPT-4's `\\p{N}{1,3}+` among them):
  the Split regex is written in its dialect (bpe/regex_dialect.py). Reading one back is
  bpe/hf_import.py's, which shares the checks here (`check_custom_pattern`, `check_hf_special`).
- `to_tiktoken` / `from_tiktoken`: parts <-> tiktoken's mergeable ranks (token bytes -> rank; our
  ranks are our ids), its `pat_str` and special tokens. tiktoken keeps only the regex's matches,
  so a custom pattern is widened to keep the text between matches too, as we do, and written in
  the dialect of its engine, fancy-regex. The built-in patterns are tiktoken's own spellings.

Every vocabulary that a format cannot express exactly is refused with one-line TokenizerError:
two ids with the same bytes, a special token the other library would read as another token, for
tiktoken special tokens one of which begins another.

What it deliberately does not do: read or write files (bpe/library_files.py does), or check that
the merges give the same ids as the other library's algorithm where that needs encoding: tiktoken
looks a whole chunk up before merging, which equals merging only when every token's bytes merge
back into that token. bpe/formats.py checks that (`check_whole_tokens`).

>>> hf = to_hf(token_bytes([(97, 98)], list(range(256))), [(97, 98)], {"<|end|>": 257}, pattern_regex=None)
>>> hf["model"]["merges"], hf["added_tokens"][0]["id"], hf["pre_tokenizer"]["use_regex"]
(['a b'], 257, False)
"""

from __future__ import annotations

import re
import string

import regex

from tokenkit.bpe.bytelevel import bytes_to_unicode
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.merge import merge_chunk
from tokenkit.bpe.patterns import GPT2_PATTERN, GPT4_PATTERN
from tokenkit.bpe.regex_dialect import to_fancy_regex, to_oniguruma

# tiktoken's own spellings of the built-in patterns (equivalent to ours; tested against tiktoken)
TIKTOKEN_GPT2 = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
TIKTOKEN_GPT2_OLD = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
WHOLE_TEXT = r"(?s:.+)"  # the pat_str of "none": each stretch between special tokens is one piece
_KNOWN = {GPT2_PATTERN: "gpt2", TIKTOKEN_GPT2: "gpt2", TIKTOKEN_GPT2_OLD: "gpt2", GPT4_PATTERN: "gpt4"}


def token_bytes(merges: list[tuple[int, int]], byte_order: list[int]) -> list[bytes]:
    """Each id's bytes (specials excluded), refusing two ids with the same bytes, which neither
    format can hold (both map a token's text to one id).

    >>> token_bytes([(97, 98)], list(range(256)))[256]
    b'ab'
    """
    vocab = [bytes([b]) for b in byte_order]
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])
    _distinct(vocab)
    return vocab


_PROBE = string.printable + " naïve café 日本語 😀 \u00a0\u3000 it's 2024, don't!  \n\n\t x_y -1.5e3 "


def check_custom_pattern(pattern_regex: str | None, action: str = "exported") -> None:
    """Refuse a custom pattern that matches the empty string at some place of a probe text.

    tk skips empty matches (text up to the next real match stays one chunk), Hugging Face's Split
    cuts there and tiktoken keeps the empty piece and drops the text after it, so such a pattern
    cannot give the same ids. The probe (every printable ASCII character, Unicode letters,
    digits and whitespace) catches `\\w*`, `\\b`, `(?=x)` and the like, though not every case.
    """
    if pattern_regex is None or pattern_regex in (GPT2_PATTERN, GPT4_PATTERN):
        return
    rx = regex.compile(pattern_regex)
    try:
        for i in range(len(_PROBE) + 1):
            m = rx.match(_PROBE, i, timeout=1.0)
            if m is not None and m.end() == i:
                raise TokenizerError(
                    f"the split pattern {pattern_regex[:50]!r} matches the empty string (at {_PROBE[i : i + 8]!r}); "
                    f"Hugging Face and tiktoken split at empty matches where tk does not, so it cannot be {action}"
                )
    except TimeoutError:
        raise TokenizerError(
            f"the split pattern {pattern_regex[:50]!r} takes too long on a short probe text; simplify it"
        ) from None


def pattern_name(regex_: str | None) -> str:
    """tk's name for a split regex read from another format (a built-in name when it is one).

    >>> pattern_name(GPT4_PATTERN), pattern_name(None), pattern_name(r"\\w+")
    ('gpt4', 'none', '\\\\w+')
    """
    if regex_ is None:
        return "none"
    return _KNOWN.get(regex_, regex_)


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _distinct(tokens: list[bytes | None]) -> None:
    """Refuse two ids with the same bytes, which neither format can hold (both map a token's
    text to one id)."""
    first: dict[bytes, int] = {}
    for i, t in enumerate(tokens):
        if t is not None and first.setdefault(t, i) != i:
            raise TokenizerError(
                f"ids {first[t]} and {i} have the same bytes {t!r}; Hugging Face and tiktoken map each token's "
                "bytes to one id, so this vocabulary cannot be exported"
            )


def to_hf(
    tokens: list[bytes | None],
    merges: list[tuple[int, int]],
    special_tokens: dict[str, int],
    pattern_regex: str | None,
    *,
    ignore_merges: bool = False,
    normalizer: str | None = None,
    bos: str | None = None,
    text_tokens: list[str] | None = None,
) -> dict:
    """The `tokenizer.json` dict of a tokenizer (ids, merges, specials and options exactly ours);
    tokens[i] is the bytes of id i (None for a special token's). With `bos`, the template that
    adds it before every text (Llama 3's)."""
    check_custom_pattern(pattern_regex)
    _distinct(tokens)
    table = bytes_to_unicode()
    names = ["".join(table[b] for b in token) if token is not None else None for token in tokens]
    vocab = {name: i for i, name in enumerate(names) if name is not None}
    inverse = {c: b for b, c in table.items()}
    added = []
    for s, i in sorted(special_tokens.items(), key=lambda kv: kv[1]):
        check_hf_special(s, i, vocab, inverse, "rename the special token to export")
        added.append(
            {
                "id": i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": s not in (text_tokens or ()),
            }
        )
    if pattern_regex is None:
        pre = _byte_level(False)
    elif pattern_regex == GPT2_PATTERN:  # HF's ByteLevel regex is GPT-2's
        pre = _byte_level(True)
    else:
        # Written for Oniguruma, HF's regex engine, so that it splits as tk does (`\p{N}{1,3}+`...).
        onig = to_oniguruma(pattern_regex)
        split = {"type": "Split", "pattern": {"Regex": onig}, "behavior": "Isolated", "invert": False}
        pre = {"type": "Sequence", "pretokenizers": [split, _byte_level(False)]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if normalizer == "nfc" else None,
        "pre_tokenizer": pre,
        "post_processor": None if bos is None else _bos_template(bos, special_tokens[bos]),
        "decoder": _byte_level(True),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": [f"{names[a]} {names[b]}" for a, b in merges],
        },
    }


def check_hf_special(s: str, i: int, vocab: dict[str, int], inverse: dict[str, int], todo: str) -> None:
    """Refuse a special token that HF would not treat as tk does: one spelled like a vocabulary
    token (HF gives it that token's id) or made of byte stand-ins that decode as other bytes."""
    if vocab.get(s, i) != i:
        raise TokenizerError(
            f"special token {s!r} is spelled like token {vocab[s]} in the byte-level vocabulary, which would give "
            f"it that id; {todo}"
        )
    if all(c in inverse for c in s) and bytes(inverse[c] for c in s) != s.encode("utf-8"):
        raise TokenizerError(
            f"special token {s!r} would decode as other bytes through Hugging Face's ByteLevel decoder (its "
            f"characters are byte stand-ins); {todo}"
        )


# ---------------------------------------------------------------------------------------------
# tiktoken


def tiktoken_pat_str(pattern_regex: str | None) -> str:
    """The `pat_str` that makes tiktoken split as we do.

    tiktoken encodes only the regex's matches; the built-in patterns match every character, and a
    custom one is widened with a second branch that takes the text up to its next match, which we
    keep as a chunk of its own. No split is one piece per stretch between special tokens. The
    built-in patterns are tiktoken's own spellings, which its engine (fancy-regex) reads as tk
    does; a custom one is written in that engine's dialect (`$` is only the very end there, ...).

    >>> tiktoken_pat_str(r"\\d+")
    '(?:\\\\d+)|(?:(?!(?:\\\\d+))(?s:.))+'
    """
    if pattern_regex is None:
        return WHOLE_TEXT
    if pattern_regex in (GPT2_PATTERN, GPT4_PATTERN):
        return pattern_regex
    check_custom_pattern(pattern_regex)
    fancy = to_fancy_regex(pattern_regex)
    return f"(?:{fancy})|(?:(?!(?:{fancy}))(?s:.))+"


_WIDENED = re.compile(r"\(\?:(?P<p>.*)\)\|\(\?:\(\?!\(\?:(?P=p)\)\)\(\?s:\.\)\)\+", re.DOTALL)


def pattern_of_pat_str(pat_str: str) -> str:
    """tk's pattern (name or regex) for a tiktoken `pat_str`, undoing `tiktoken_pat_str`."""
    if pat_str == WHOLE_TEXT:
        return "none"
    widened = _WIDENED.fullmatch(pat_str)
    return pattern_name(widened.group("p") if widened else pat_str)


def check_tiktoken_specials(names, action: str) -> None:
    """Refuse special tokens one of which begins another (`<a>` and `<a><b>`): where both match,
    tk (as HF tokenizers) reads the longer one, tiktoken the one its hash map happens to list first
    (an order no file sets; tested with tiktoken 0.14). Specials that only overlap (`ab`, `bc`)
    are fine: both take the leftmost match.

    >>> check_tiktoken_specials(["<|end|>", "<|endoftext|>"], "exported")  # neither begins the other
    """
    ordered = sorted(names)
    for a, b in zip(ordered, ordered[1:], strict=False):  # a string that begins others sorts right before them
        if b.startswith(a):
            raise TokenizerError(
                f"the special token {a!r} begins the special token {b!r}; where both match tk reads the longer one "
                f"and tiktoken whichever its hash map lists first, so these special tokens cannot be {action} "
                "(rename one)"
            )


def to_tiktoken(merges: list[tuple[int, int]], byte_order: list[int]) -> list[tuple[bytes, int]]:
    """tiktoken's mergeable ranks as (token bytes, rank) in rank order: our ranks are our ids."""
    return [(t, i) for i, t in enumerate(token_bytes(merges, byte_order))]


def from_tiktoken(ranks: dict[bytes, int], what: str = "the ranks") -> dict:
    """Merges and byte order of tiktoken mergeable ranks (ranks 0..N-1, the 256 bytes first).

    Each token's merge is found as tiktoken finds it: merging its bytes with the lower ranks only
    (`bpe.merge.merge_chunk` over `_RanksBelow`) must end in exactly two parts (minbpe's
    `recover_merges`, HF's tiktoken converter).
    """
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    if [r for _, r in by_rank] != list(range(len(by_rank))):
        raise TokenizerError(f"{what}: ranks must be 0..{len(by_rank) - 1} without gaps; tk's ids are its ranks")
    if len(by_rank) < 256 or any(len(t) != 1 for t, _ in by_rank[:256]):
        raise TokenizerError(f"{what}: ranks 0-255 must be the 256 single bytes")
    byte_order = [t[0] for t, _ in by_rank[:256]]
    byte_rank = {b: r for r, b in enumerate(byte_order)}
    below = _RanksBelow(ranks, [t for t, _ in by_rank])
    merges = []
    for token, rank in by_rank[256:]:
        below.limit = rank
        parts = merge_chunk([byte_rank[b] for b in token], below)
        if len(parts) != 2:
            raise TokenizerError(f"{what}: token {rank} ({token!r}) is not the merge of two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return {"merges": merges, "byte_order": byte_order}


class _RanksBelow:
    """tiktoken's merge rule as `merge_chunk`'s pair -> rank key: two tokens (ids, which are
    ranks) merge when their bytes together are a token ranked below `limit`, whatever merge made
    them; that token's rank is the key, and the id the merge makes."""

    def __init__(self, ranks: dict[bytes, int], tokens: list[bytes]) -> None:
        self.ranks, self.tokens, self.limit = ranks, tokens, 0

    def get(self, pair: tuple[int, int], default: int | None = None) -> int | None:
        r = self.ranks.get(self.tokens[pair[0]] + self.tokens[pair[1]])
        return r if r is not None and r < self.limit else default


def _bos_template(bos: str, bos_id: int) -> dict:
    """Llama 3's TemplateProcessing: `bos` before each text of a single or a pair."""
    token = {"SpecialToken": {"id": bos, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [token, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [token, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": bos, "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }  # fmt: skip


def hf_configs(
    special_tokens: dict[str, int], bos: str | None = None, text_tokens: list[str] | None = None
) -> tuple[dict, dict]:
    """`tokenizer_config.json` and `special_tokens_map.json` for transformers' AutoTokenizer: the
    fast tokenizer of tokenizer.json as it is (no prefix space, no clean-up of spaces on decode,
    nothing added around the ids). `<|endoftext|>`, when there, is also the end-of-text token;
    text tokens are no special tokens there."""
    names = [s for s in sorted(special_tokens, key=special_tokens.__getitem__) if s not in (text_tokens or ())]
    special_map: dict = {"additional_special_tokens": names} if names else {}
    if "<|endoftext|>" in special_tokens:
        special_map["eos_token"] = "<|endoftext|>"
    if bos is not None:
        special_map["bos_token"] = bos
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
        **special_map,
    }
    return config, special_map
