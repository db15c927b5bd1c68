"""A Hugging Face `tokenizer.json` read into tk's parts, refusing in one line what tk cannot reproduce.

What it does, as pure functions on parsed JSON (no files): `from_hf` reads a tokenizer.json dict
into tk's parts (merges, every id's bytes, special tokens, split pattern, and the options
`ignore_merges`, `normalizer`, `bos`, `text_tokens`). Each component of HF's pipeline is checked
to do nothing tk would not do: the pre-tokenizer must be ByteLevel, Split + ByteLevel or Digits +
ByteLevel (its Oniguruma regex read back in Python's dialect, bpe/regex_dialect.py); the
normalizer none or NFC; the post-processor one that adds nothing but a model's BOS; the decoder
ByteLevel; SentencePiece-style tokenizers (Llama 2's) are named as such. The vocabulary and its
280k merges (Llama 3's) are read at C speed when nothing is wrong, and by a plain loop that names
the first fault otherwise. `check_transformers_class` says what transformers' own classes do to
a directory's tokenizer.json (GPT2Tokenizer and Qwen2Tokenizer read it their own way).

What it deliberately does not do: write tokenizer.json (`bpe.interop.to_hf`), read files
(bpe/library_files.py), or build a `Tokenizer` (bpe/formats.py).

>>> from tokenkit.bpe.interop import to_hf, token_bytes
>>> from_hf(to_hf(token_bytes([(97, 98)], list(range(256))), [(97, 98)], {}, None))["merges"]
[(97, 98)]
"""

from __future__ import annotations

from itertools import accumulate, chain, compress, repeat
from operator import is_

import numpy as np
import regex

from tokenkit.bpe.bytelevel import bytes_to_unicode
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.interop import TIKTOKEN_GPT2, TIKTOKEN_GPT2_OLD, check_custom_pattern, check_hf_special, pattern_name
from tokenkit.bpe.patterns import GPT2_PATTERN, GPT4_PATTERN
from tokenkit.bpe.regex_dialect import from_oniguruma, to_oniguruma

__all__ = ["DIGITS_GPT2", "QWEN2_PATTERN", "check_transformers_class", "from_hf"]

# HF's Digits(individual_digits) then ByteLevel's GPT-2 regex on the stretches between digits
# (SmolLM's and StarCoder's pre-tokenizer), as one regex: each digit alone, and whitespace before a
# digit ends its run there (`(?!\S)` holds at the end of a stretch).
DIGITS_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""

# Split regexes that Oniguruma reads as a built-in pattern: the ones tk writes, and tiktoken's
# spellings of GPT-2's (`\s++$` ends only the text there too). GPT-4's own spelling is not one.
_HF_BUILTIN = {
    to_oniguruma(GPT4_PATTERN): GPT4_PATTERN,
    GPT2_PATTERN: GPT2_PATTERN,
    TIKTOKEN_GPT2: GPT2_PATTERN,
    TIKTOKEN_GPT2_OLD: GPT2_PATTERN,
}


def _steps(value, key: str, what: str) -> list:
    """The steps of a tokenizer.json component, its Sequences (nested ones too) opened; [] for none.

    >>> _steps({"type": "Sequence", "processors": [{"type": "ByteLevel"}]}, "processors", "t")
    [{'type': 'ByteLevel'}]
    """
    if value is None:
        return []
    if isinstance(value, dict) and value.get("type") == "Sequence":
        inner = value.get(key)
        if not isinstance(inner, list):
            raise TokenizerError(f"{what}: a Sequence without its list of {key}")
        return [step for v in inner for step in _steps(v, key, what)]
    return [value]


def _pattern_of_hf(pre, what: str) -> str | None:
    """The split regex of a tokenizer.json pre-tokenizer (None for no split), or TokenizerError.

    tk reads ByteLevel (with GPT-2's regex or none), Split + ByteLevel and Digits (each digit
    alone) + ByteLevel with GPT-2's regex, also when they come wrapped in Sequences (as some
    converters write them)."""

    def byte_level(p) -> bool:  # a ByteLevel pre-tokenizer we can read; returns its use_regex
        if not isinstance(p, dict) or p.get("type") != "ByteLevel":
            raise TokenizerError(
                f"{what}: pre-tokenizer {_type(p)} is not supported; tk reads byte-level BPE "
                "(ByteLevel, or Split + ByteLevel)"
            )
        if p.get("add_prefix_space", False):
            raise TokenizerError(
                f"{what}: ByteLevel add_prefix_space adds a space to the text; tk encodes the text as it is"
            )
        return bool(p.get("use_regex", True))

    steps = _steps(pre, "pretokenizers", what)
    if len(steps) == 1:
        return GPT2_PATTERN if byte_level(steps[0]) else None
    if len(steps) == 2 and isinstance(steps[0], dict) and steps[0].get("type") == "Digits":
        if steps[0].get("individual_digits") is not True or not byte_level(steps[1]):
            raise TokenizerError(
                f"{what}: pre-tokenizer Digits must split each digit alone (individual_digits) before a ByteLevel "
                "with its regex; tk reads that one (SmolLM's)"
            )
        return DIGITS_GPT2
    if len(steps) != 2 or not isinstance(steps[0], dict) or steps[0].get("type") != "Split":
        first = next((_type(p) for p in steps if not (isinstance(p, dict) and p.get("type") in ("Split", "ByteLevel"))),
                     None)  # fmt: skip
        named = f" (it holds {first})" if first else ""
        raise TokenizerError(f"{what}: pre-tokenizer Sequence must be [Split, ByteLevel] for tk{named}")
    split = steps[0]
    pattern = split.get("pattern")
    if not isinstance(pattern, dict) or not isinstance(pattern.get("Regex", pattern.get("String")), str):
        raise TokenizerError(f"{what}: the Split pre-tokenizer has no pattern")
    if split.get("behavior") != "Isolated" or split.get("invert", False):
        raise TokenizerError(
            f"{what}: Split behavior {split.get('behavior')!r} (invert {split.get('invert')}) is not supported; "
            "tk keeps matches and gaps as chunks (Isolated)"
        )
    if byte_level(steps[1]):
        raise TokenizerError(f"{what}: ByteLevel after Split must not split again (use_regex false)")
    if "Regex" not in pattern:
        found = regex.escape(pattern["String"])
    else:  # an Oniguruma regex, read with its meaning there
        try:
            found = _HF_BUILTIN.get(pattern["Regex"]) or from_oniguruma(pattern["Regex"])
        except TokenizerError as err:
            raise TokenizerError(f"{what}: {err}") from None
    try:
        check_custom_pattern(found, "imported")
    except regex.error as err:
        raise TokenizerError(f"{what}: the Split regex does not compile in Python's regex module ({err})") from None
    return found


def _check_post_processor(post, what: str) -> str | None:
    """The BOS token a post-processor puts before every text (None for none), refusing one that
    adds tokens otherwise: tk's ids are the text's tokens, and a model's input is BOS + those.

    Accepted: ByteLevel (it trims offsets only), a template whose single form is the text ("$A")
    and whose pair form the two texts ("$A $B"), as transformers writes when it saves a
    tokenizer, and Llama 3's, whose single form is "<|begin_of_text|> $A" (its pair form does not
    matter: tk encodes no pairs), alone or in a Sequence. Other templates holding a special token,
    BERT's and RoBERTa's processors add tokens elsewhere.
    """
    bos = None
    for step in _steps(post, "processors", what):
        kind = step.get("type") if isinstance(step, dict) else None
        if kind == "ByteLevel":
            continue
        if kind == "TemplateProcessing":
            leading = _template_bos(step)
            if leading is not None and bos is None:
                bos = leading
                continue
            found = _template_adds(step, what)
            if found is None:
                continue
            added, where = found
        elif kind in ("BertProcessing", "RobertaProcessing"):
            added, where = (step.get("cls") or [None])[0], "every text"
        else:
            raise TokenizerError(
                f"{what}: post-processor {_type(step)} may add tokens; tk reads ByteLevel and templates that add none"
            )
        raise TokenizerError(
            f"{what}: the post-processor ({kind}) adds {added!r} to {where} (transformers' add_special_tokens=True); "
            "tk adds no token to a text but a model's BOS, so its ids would differ; to import the tokenizer "
            'without it, set "post_processor": null (tk then gives the ids of add_special_tokens=False)'
        )
    return bos


def _template_bos(step: dict) -> str | None:
    """The special token of a template whose single form is that token, then the text (Llama 3's)."""
    single = step.get("single")
    if not isinstance(single, list) or len(single) != 2 or not all(isinstance(p, dict) for p in single):
        return None
    special, text = single[0].get("SpecialToken"), single[1].get("Sequence")
    if not isinstance(special, dict) or not isinstance(text, dict) or text.get("id") != "A":
        return None
    name = special.get("id")
    return name if isinstance(name, str) else None


def _template_adds(step: dict, what: str) -> tuple[object, str] | None:
    """(token, to what) of the first special token a TemplateProcessing adds; None when it adds
    nothing: its single form is "$A" and its pair form "$A $B" (type ids do not matter)."""
    texts = {}
    for form, where in (("single", "every text"), ("pair", "a pair of texts")):
        pieces = step.get(form)
        if not isinstance(pieces, list) or not all(isinstance(p, dict) and len(p) == 1 for p in pieces):
            raise TokenizerError(f"{what}: the post-processor's {form} template is not a list of pieces")
        for piece in pieces:
            special = piece.get("SpecialToken")
            if special is not None:
                return (special.get("id") if isinstance(special, dict) else special), where
        texts[form] = [p["Sequence"].get("id") if isinstance(p.get("Sequence"), dict) else p for p in pieces]
    if texts != {"single": ["A"], "pair": ["A", "B"]}:
        raise TokenizerError(
            f"{what}: the post-processor's template repeats or reorders the texts ({texts}); tk encodes a text as it is"
        )
    return None


def _type(value) -> str:
    return repr(value.get("type")) if isinstance(value, dict) else type(value).__name__


def _sentencepiece_style(data: dict) -> str | None:
    """What makes a tokenizer.json SentencePiece-style (Llama 2's, Mistral v0.1's), or None:
    a Unigram model, or BPE over a Metaspace pre-tokenizer or with byte fallback, whose
    tokens are UTF-8 pieces with '▁' for spaces, not GPT-2's byte stand-ins."""
    model = data["model"]
    if model.get("type") == "Unigram":
        return "a Unigram model"
    if model.get("byte_fallback"):
        return "BPE with byte_fallback"
    for key, inner in (("pre_tokenizer", "pretokenizers"), ("decoder", "decoders"), ("normalizer", "normalizers")):
        try:
            steps = _steps(data.get(key), inner, "")
        except TokenizerError:
            continue
        kinds = {step.get("type") for step in steps if isinstance(step, dict) and isinstance(step.get("type"), str)}
        if "Metaspace" in kinds or (key == "normalizer" and "Prepend" in kinds):
            return f"a Metaspace {key}" if "Metaspace" in kinds else "a normalizer that prepends '▁'"
    return None


def from_hf(data, what: str = "tokenizer.json") -> dict:
    """Parts of a byte-level BPE tokenizer from a `tokenizer.json` dict.

    Returns merges, byte_order, special_tokens, pattern (tk's name or regex) and the options
    ignore_merges (the model looks a whole chunk up before merging) and normalizer ("nfc" or
    None). A SentencePiece-style tokenizer is refused naming what makes it one.
    """
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise TokenizerError(f"{what}: not a Hugging Face tokenizer.json (no model)")
    model = data["model"]
    style = _sentencepiece_style(data)
    if style is not None:
        raise TokenizerError(
            f"{what}: a SentencePiece-style tokenizer ({style}, as Llama 2's and Mistral v0.1's); tk reads "
            "byte-level BPE, GPT-2's kind (Llama 3 and Qwen2 use it)"
        )
    if model.get("type", "BPE") != "BPE":
        raise TokenizerError(f"{what}: model type {model.get('type')!r} is not BPE; tk reads byte-level BPE tokenizers")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"):
        if model.get(key):  # None, "", 0 and false are all "off"
            raise TokenizerError(f"{what}: model {key} = {model.get(key)!r} changes ids; tk reads plain byte-level BPE")
    if model.get("ignore_merges") not in (None, False, True):
        raise TokenizerError(f"{what}: model ignore_merges must be true or false, got {model['ignore_merges']!r}")
    normalizers = _steps(data.get("normalizer"), "normalizers", what)  # an empty Sequence does nothing
    if normalizers and normalizers != [{"type": "NFC"}]:
        raise TokenizerError(
            f"{what}: normalizer {_type(data['normalizer'])} changes the text; tk encodes the text as it is "
            "(or in NFC, HF's NFC normalizer)"
        )
    bos = _check_post_processor(data.get("post_processor"), what)
    decoders = _steps(data.get("decoder"), "decoders", what)
    if decoders and not (
        len(decoders) == 1 and isinstance(decoders[0], dict) and decoders[0].get("type") == "ByteLevel"
    ):
        raise TokenizerError(f"{what}: decoder {_type(data.get('decoder'))} is not ByteLevel")
    pattern = pattern_name(_pattern_of_hf(data.get("pre_tokenizer"), what))
    vocab, merges_in = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not set(map(type, vocab.values())) <= {int} or not isinstance(merges_in, list):
        raise TokenizerError(f"{what}: model vocab must map token strings to ids and merges must be a list")
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    specials, text_tokens = _hf_specials(data, vocab, byte_of, what)
    if bos is not None and bos not in specials:
        raise TokenizerError(f"{what}: the post-processor adds {bos!r}, which is not one of the added tokens")
    if bos is not None and _template_ids(data["post_processor"], bos) not in (None, [specials[bos]]):
        raise TokenizerError(f"{what}: the post-processor gives {bos!r} another id than its added token")
    tokens = _hf_tokens(vocab, specials, byte_of, what)
    merges = _hf_merges(merges_in, vocab, tokens, what)
    return {
        "vocab": tokens,
        "merges": merges,
        "special_tokens": specials,
        "pattern": pattern,
        "ignore_merges": model.get("ignore_merges") is True,
        "normalizer": "nfc" if normalizers else None,
        "bos": bos,
        "text_tokens": text_tokens,
    }


def _template_ids(post, name: str) -> list | None:
    """The ids a template's special_tokens table gives `name` (None when it gives none)."""
    for step in _steps(post, "processors", "post_processor"):
        table = step.get("special_tokens") if isinstance(step, dict) else None
        entry = table.get(name) if isinstance(table, dict) else None
        if isinstance(entry, dict):
            return entry.get("ids")
    return None


def _hf_specials(
    data: dict, vocab: dict[str, int], byte_of: dict[str, int], what: str
) -> tuple[dict[str, int], list[str] | None]:
    """The special tokens of a tokenizer.json (its added tokens), name -> id, each checked to be
    read by Hugging Face as tk reads it, and the names of those that are not special (read
    whatever the policy: `text_tokens`; None when there are none)."""
    specials: dict[str, int] = {}
    text_tokens = []
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise TokenizerError(f"{what}: added_tokens must be a list")
    for t in added:
        if not isinstance(t, dict) or not isinstance(t.get("content"), str) or type(t.get("id")) is not int:
            raise TokenizerError(f"{what}: an added token lacks content or id")
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word") or t.get("normalized"):
            raise TokenizerError(
                f"{what}: added token {t['content']!r} strips, matches single words or is normalized; "
                "tk matches it exactly"
            )
        check_hf_special(t["content"], t["id"], vocab, byte_of, "tk would give it other ids or bytes")
        if specials.setdefault(t["content"], t["id"]) != t["id"] or list(specials.values()).count(t["id"]) > 1:
            raise TokenizerError(f"{what}: added token {t['content']!r} or its id {t['id']} is listed twice")
        if not t.get("special", False):
            text_tokens.append(t["content"])
    return specials, sorted(text_tokens) or None


def _hf_merges(merges_in: list, vocab: dict[str, int], tokens: list, what: str) -> list[tuple[int, int]]:
    """The merges of a tokenizer.json ("left right" strings or [left, right] lists) as pairs of
    ids, refusing one that is neither or names no token of `tokens` (Llama 3's file has 280k:
    read at C speed when all is well, `_hf_merges_at_once`)."""
    found = _hf_merges_at_once(merges_in, vocab, tokens)
    if found is not None:
        return found
    merges = []
    for r, m in enumerate(merges_in):
        pair = m.split(" ") if type(m) is str else m
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or type(pair[1]) is not str:
            raise TokenizerError(f"{what}: merge {r} is {str(m)[:40]!r}, expected 'left right' or [left, right]")
        a, b = vocab.get(pair[0]), vocab.get(pair[1])
        if a is None or b is None or tokens[a] is None or tokens[b] is None:
            raise TokenizerError(f"{what}: merge {r} {pair!r} uses a token missing from the vocab")
        merges.append((a, b))
    return merges


def _hf_merges_at_once(merges_in: list, vocab: dict[str, int], tokens: list) -> list[tuple[int, int]] | None:
    """`_hf_merges` with one `map` over all names; None where a merge has a fault or the merges
    mix both forms (the plain loop reads those)."""
    names = _merge_names(merges_in)
    if names is None:
        return None
    ids = list(map(vocab.get, names))
    special_ids = set(compress(range(len(tokens)), map(is_, tokens, repeat(None))))  # ids without bytes
    if None in ids or not special_ids.isdisjoint(ids):
        return None  # a name that is no token, or a special token's
    return list(zip(ids[0::2], ids[1::2], strict=True))


def _merge_names(merges_in: list) -> list[str] | None:
    """left, right, left, right... of merges that are all "left right" strings (one space each)
    or all [left, right] lists of strings; None otherwise.

    >>> _merge_names(["a b", "ab c"]), _merge_names([["a", "b"]]), _merge_names(["a b c"])
    (['a', 'b', 'ab', 'c'], ['a', 'b'], None)
    """
    kinds = set(map(type, merges_in))
    if kinds == {str} and set(map(str.count, merges_in, repeat(" "))) == {1}:
        return " ".join(merges_in).split(" ")
    if kinds == {list} and set(map(len, merges_in)) == {2}:
        names = list(chain.from_iterable(merges_in))
        if set(map(type, names)) == {str}:
            return names
    return None


def _hf_tokens(vocab: dict[str, int], specials: dict[str, int], byte_of: dict[str, int], what: str) -> list:
    """Every id's bytes (None at a special token's id) from a byte-level vocab: token strings of
    GPT-2's byte stand-ins -> id. A special token may be in the vocab too, under its own id.

    At C speed for a vocab without faults (`_hf_tokens_at_once`); the loop names the first one."""
    found = _hf_tokens_at_once(vocab, specials)
    if found is not None:
        return found
    n = len(vocab) + len(specials)  # every id below n when nothing is missing: bounded before allocating
    tokens: list[bytes | None] = [None] * n
    special_of = {i: s for s, i in specials.items()}
    for name, i in vocab.items():
        if not 0 <= i < n:
            raise TokenizerError(f"{what}: vocab id {i} of {name[:40]!r} leaves a gap; ids run 0..{n - 1} at most")
        if i in special_of:
            if name != special_of[i]:
                raise TokenizerError(f"{what}: vocab entry {name[:40]!r} has the id of special token {special_of[i]!r}")
            continue
        if tokens[i] is not None:
            raise TokenizerError(f"{what}: two vocab entries have id {i}")
        try:
            tokens[i] = bytes(byte_of[c] for c in name)
        except KeyError:
            raise TokenizerError(
                f"{what}: vocab entry {name[:40]!r} holds characters that are not byte stand-ins; tk reads byte-level "
                "BPE vocabularies (GPT-2's byte-to-character table)"
            ) from None
        if not tokens[i]:
            raise TokenizerError(f"{what}: the vocab holds an empty token (id {i})")
    last = max([-1, *(i for i, t in enumerate(tokens) if t is not None), *specials.values()])
    return tokens[: last + 1]


def _byte_of_code_point() -> np.ndarray:
    """GPT-2's table read backwards as an array: a stand-in's code point -> its byte, -1 where
    a character stands for no byte."""
    table = bytes_to_unicode()
    out = np.full(max(map(ord, table.values())) + 1, -1, dtype=np.int16)
    out[[ord(c) for c in table.values()]] = list(table)
    return out


_BYTE_OF_CODE_POINT = _byte_of_code_point()


def _hf_tokens_at_once(vocab: dict[str, int], specials: dict[str, int]) -> list | None:
    """`_hf_tokens` without a Python loop per token: the stand-ins of all tokens read in one
    NumPy lookup; None where the vocab has a fault (a gap, an id twice, a character that is no
    stand-in, an empty token, a special token's id under another name)."""
    n = len(vocab) + len(specials)
    names, values = list(vocab), list(vocab.values())
    if values and not (min(values) >= 0 and max(values) < n):
        return None
    ids = np.array(values, dtype=np.int64)
    special_of = {i: s for s, i in specials.items()}
    at_special = np.isin(ids, [i for i in special_of if 0 <= i < n])
    if any(
        names[k] != special_of[i]
        for k, i in zip(np.flatnonzero(at_special).tolist(), ids[at_special].tolist(), strict=True)
    ):
        return None
    regular = ~at_special
    names = list(compress(names, regular.tolist()))
    ids = ids[regular]
    if np.bincount(ids, minlength=n).max(initial=0) > 1 or 0 in map(len, names):
        return None
    code_points = np.frombuffer("".join(names).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    if code_points.size and code_points.max() >= len(_BYTE_OF_CODE_POINT):
        return None
    raw = _BYTE_OF_CODE_POINT[code_points]
    if (raw < 0).any():
        return None
    raw = raw.astype(np.uint8).tobytes()
    ends = list(accumulate(map(len, names)))
    tokens: list[bytes | None] = [None] * n
    for i, token in zip(ids.tolist(), map(raw.__getitem__, map(slice, [0, *ends[:-1]], ends)), strict=True):
        tokens[i] = token
    last = max([int(ids.max(initial=-1)), *specials.values()])
    return tokens[: last + 1]


_GPT2_CLASSES = ("GPT2Tokenizer", "GPT2TokenizerFast")
_QWEN2_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")
# transformers' Qwen2Tokenizer's split (PRETOKENIZE_REGEX in tokenization_qwen2.py); its
# Oniguruma reading is Python's
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def check_transformers_class(tokenizer_config, model_config, parts: dict, what: str) -> dict:
    """The parts of a directory's tokenizer as transformers reads them, or TokenizerError where
    its class reads tokenizer.json otherwise (ids would change).

    transformers (5.x) builds two classes from tokenizer.json's vocabulary and merges with a
    pipeline of their own, whatever tokenizer.json says:
    - GPT2Tokenizer: GPT-2's split and `add_prefix_space` from tokenizer_config.json; when
      tokenizer_config.json names it, or names none and config.json's model_type is gpt2;
    - Qwen2Tokenizer: Qwen2's split, an NFC normalizer, no ignore_merges, and its special tokens
      (unk, eos and pad default to <|endoftext|>) added when the vocabulary lacks them; for
      config.json's model_type qwen2 whatever tokenizer_config.json names, or when it names it.
    Other classes read tokenizer.json as it is. The configs are the parsed JSON files (None when
    absent). Returns `parts`; for Qwen2Tokenizer with ignore_merges false, and the class's name
    as `parts["dropped"]`, where the caller checks that dropping it changes no id.
    """
    config = tokenizer_config if isinstance(tokenizer_config, dict) else {}
    model_type = model_config.get("model_type") if isinstance(model_config, dict) else None
    name, source = config.get("tokenizer_class"), "tokenizer_config.json"
    if model_type == "qwen2":
        name, source = "Qwen2Tokenizer", "config.json's model_type qwen2"
    elif name is None and model_type == "gpt2":
        name, source = "GPT2Tokenizer", "config.json's model_type gpt2"
    pattern = parts["pattern"]
    if name in _GPT2_CLASSES:
        expected = "gpt2"
    elif name in _QWEN2_CLASSES:
        expected = QWEN2_PATTERN
    else:
        return parts
    why = None
    if config.get("add_prefix_space"):
        why = "adds a space before every text (add_prefix_space); tk encodes the text as it is"
    elif pattern != expected:
        whose = "GPT-2's" if expected == "gpt2" else "Qwen2's"
        why = f"splits text with {whose} pattern whatever tokenizer.json's pre-tokenizer says ({pattern[:40]!r})"
    elif name in _QWEN2_CLASSES and parts["normalizer"] != "nfc":
        why = "puts the text in NFC whatever tokenizer.json's normalizer says (it has none)"
    elif name in _QWEN2_CLASSES:
        for key, default in (("unk_token", "<|endoftext|>"), ("eos_token", "<|endoftext|>"),
                             ("pad_token", "<|endoftext|>"), ("bos_token", None)):  # fmt: skip
            token = config.get(key, default)
            token = token.get("content") if isinstance(token, dict) else token
            if token is not None and token not in parts["special_tokens"]:
                why = f"adds its {key} {str(token)[:40]!r} to the vocabulary as a new token, which tokenizer.json lacks"
                break
    if why is not None:
        itself = "give tokenizer.json itself (a checkpoint: tk import-hf --tokenizer-json) to read it as written"
        fix = (
            f"{itself} (transformers reads every qwen2 directory so)"
            if model_type == "qwen2"
            else f'{itself}, or set "tokenizer_class": "PreTrainedTokenizerFast" in tokenizer_config.json'
        )
        raise TokenizerError(f"{what}: transformers loads this directory as {name} ({source}), which {why}; {fix}")
    if name in _QWEN2_CLASSES and parts["ignore_merges"]:
        parts = {**parts, "ignore_merges": False, "dropped": name}
    return parts
