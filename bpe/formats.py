"""A `Tokenizer` from other libraries' files, and their files from a `Tokenizer`.

What it does: the bodies of `Tokenizer.from_gpt2`, `from_hf`, `from_tiktoken` and `export_files`,
and `source_format`/`from_files`: which of the three importers a list of paths is for, by its
shape (what `tk bpe-import` and `tk eval -t` read).
An importer reads the files (bpe/library_files.py), converts them to tk's parts (bpe/interop.py,
bpe/hf_import.py) and builds the tokenizer with the class it is given; an exporter refuses, in one
line and before anything is written, what the format cannot say, and returns the files' bytes.
A chat template goes both ways with Hugging Face's files: read from a directory into the
tokenizer's training record, written as tokenizer_config.json's `chat_template`
(bpe/jinja_template.py). Both need `check_whole_tokens`: tiktoken looks a whole chunk up before
merging, and HF tokenizers do with `ignore_merges`, which gives the merges' ids only when every
token's bytes merge back into that token (`bpe.merge.merge_ids`).

What it deliberately does not do: read or write files itself (bpe/library_files.py), encode, or
know the formats' details (bpe/interop.py, bpe/hf_import.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from tokenkit.bpe import interop, jinja_template, library_files
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.hf_import import check_transformers_class
from tokenkit.bpe.layout import Layout
from tokenkit.bpe.merge import merge_ids
from tokenkit.bpe.names import EXPORT_FORMATS
from tokenkit.bpe.patterns import PATTERNS, resolve_pattern
from tokenkit.common import gcpause

__all__ = [
    "EXPORT_FORMATS",
    "check_whole_tokens",
    "export_files",
    "from_files",
    "from_gpt2",
    "from_hf",
    "from_tiktoken",
    "source_format",
]

_TIKTOKEN_WHOLE = "tiktoken looks whole chunks up before merging and would give {id} for that text"
# with ignore_merges tk gives the token for its bytes too, but not inside a longer chunk
_TIKTOKEN_IGNORE_MERGES = (
    "tiktoken merges by the rank of the merged bytes, so it can make {id} inside a longer chunk where these "
    "merges do not"
)

T = TypeVar("T")  # the tokenizer class an importer builds (`bpe.tokenizer.Tokenizer`)


def check_whole_tokens(layout: Layout, why: str, action: str) -> None:
    """Refuse a vocabulary where some token's bytes do not merge back into that token, saying
    `why` that matters (a template: "{id}" is the token's id) and what cannot be done."""
    for i in layout.merged_tokens:
        ids = merge_ids([layout.byte_ids[b] for b in layout.id_bytes[i]], layout.pair_id, layout.made)
        if ids != [i]:
            raise TokenizerError(
                f"token {i} ({layout.id_bytes[i]!r}) is not what its own bytes merge into ({ids}); "
                f"{why.format(id=i)}, so this vocabulary cannot be {action}"
            )


# ------------------------------------------------------------------------------------ importers


def source_format(sources: Sequence[str | os.PathLike]) -> str | None:
    """Which library's tokenizer `sources` name, by their shape, reading nothing: "gpt2" (two
    files: GPT-2's vocabulary and merges, in that order), "tiktoken" (a NAME.tiktoken rank file),
    "hf" (a .json file, taken for a tokenizer.json; a directory holding tokenizer.json or
    vocab.json + merges.txt), or None: one path that is none of those (tk's own files, a run
    directory). More than two paths is a TokenizerError.

    >>> source_format(["encoder.json", "vocab.bpe"]), source_format(["o200k.tiktoken"]), source_format(["x.json"])
    ('gpt2', 'tiktoken', 'hf')
    >>> print(source_format(["tok.safetensors"]))
    None
    """
    if len(sources) == 2:
        return "gpt2"
    if len(sources) != 1:
        raise TokenizerError("give one file (tokenizer.json, a .tiktoken file, a directory) or GPT-2's two files")
    path = Path(sources[0])
    if path.suffix == ".tiktoken":
        return "tiktoken"
    if path.suffix == ".json":
        return "hf"
    # lexists, as find_hf looks: a FIFO named tokenizer.json is refused by its reader, not passed over
    if path.is_dir() and any(all(os.path.lexists(path / n) for n in names) for names in _HF_DIRECTORY):
        return "hf"
    return None


_HF_DIRECTORY = (("tokenizer.json",), ("vocab.json", "merges.txt"))  # what `library_files.find_hf` finds


def from_files(
    cls: type[T], sources: Sequence[str | os.PathLike], pattern: str | None = None, special_tokens: Iterable[str] = ()
) -> T:
    """The tokenizer of other libraries' files, by `source_format` (one path that is none of its
    formats is read as a tokenizer.json, whose reader then says what it is not): GPT-2's pair
    (split with `pattern`, default gpt2), a tiktoken rank file (`pattern` and `special_tokens` for
    a bare one), a tokenizer.json or a directory of one (which holds its own pattern)."""
    kind = source_format(sources) or "hf"
    if kind == "gpt2":
        return from_gpt2(cls, *sources, pattern=pattern or "gpt2")
    if kind == "tiktoken":
        return from_tiktoken(cls, sources[0], pattern, special_tokens)
    return from_hf(cls, sources[0])


def from_gpt2(
    cls: type[T], vocab_path: str | os.PathLike, merges_path: str | os.PathLike, *, pattern: str = "gpt2"
) -> T:
    """`Tokenizer.from_gpt2`: GPT-2's encoder.json + vocab.bpe, or vocab.json + merges.txt."""
    parts = library_files.read_gpt2(vocab_path, merges_path)
    return cls(
        parts["merges"],
        special_tokens=parts["special_tokens"],
        pattern=pattern,
        byte_order=parts["byte_order"],
        training={"imported": "gpt2 vocabulary + merges files"},
    )


def from_hf(cls: type[T], path: str | os.PathLike) -> T:
    """`Tokenizer.from_hf`: a tokenizer.json, or a directory holding tokenizer.json or vocab.json +
    merges.txt (GPT-2's pair, split with GPT-2's pattern).

    The result gives the library's ids, with `ignore_merges` and an NFC normalizer as the file
    sets them; what tk cannot reproduce (other normalizers, prefix spaces, merges out of id order,
    post-processors that add tokens, SentencePiece-style tokenizers, ...) is refused in one line.
    For a directory, also what transformers' class for it does (a GPT2Tokenizer splits with
    GPT-2's pattern whatever tokenizer.json says, a Qwen2Tokenizer with Qwen2's:
    `bpe.hf_import.check_transformers_class`), and its chat template, kept in the tokenizer's
    training record (`bpe.jinja_template.from_hf`).
    """
    with gcpause.paused():  # a tokenizer.json makes a tuple or list per merge, and no cycles
        files = library_files.find_hf(path)
        parts = (
            library_files.read_hf(files[0])
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
        template = None
        if Path(path).is_dir():  # transformers' configs there decide how it reads the files
            tokenizer_config, model_config = library_files.read_hf_configs(path)
            parts = check_transformers_class(tokenizer_config, model_config, parts, str(path))
            template = jinja_template.from_hf(tokenizer_config, library_files.read_hf_chat_template(path), str(path))
        if len(files) == 2:
            return jinja_template.with_template(from_gpt2(cls, *files), template)
        training = {"imported": "Hugging Face tokenizer.json"}
        if template is not None:  # kept with what it was imported from (`jinja_template.template_of`)
            training[jinja_template.CHAT_TEMPLATE] = template.record()
        try:
            tok = cls(
                parts["merges"],
                special_tokens=parts["special_tokens"],
                pattern=parts["pattern"],
                vocab=parts["vocab"],
                training=training,
                ignore_merges=parts["ignore_merges"],
                normalizer=parts["normalizer"],
                bos=parts["bos"],
                text_tokens=parts["text_tokens"],
            )
        except TokenizerError as err:
            raise TokenizerError(f"{files[0]}: {err}") from None
        if "dropped" in parts:  # tokenizer.json's ignore_merges, which transformers drops: fine if it changes nothing
            check_whole_tokens(
                tok.layout,
                f"{files[0]} sets ignore_merges, with which HF tokenizers give {{id}} for that text",
                f"read as transformers' {parts['dropped']} reads it (without ignore_merges)",
            )
        return tok


def from_tiktoken(
    cls: type[T], path: str | os.PathLike, pattern: str | None = None, special_tokens: Iterable[str] = ()
) -> T:
    """`Tokenizer.from_tiktoken`: a rank file, its pattern and specials from the `NAME_tiktoken.json`
    beside it or, for a bare one, from the arguments."""
    ranks, meta = library_files.read_tiktoken(path)
    parts = interop.from_tiktoken(ranks, str(path))
    n_tokens = 256 + len(parts["merges"])
    specials = list(special_tokens)
    if meta is not None:
        meta_path = library_files.tiktoken_meta_path(path)
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
        pattern=pattern if pattern in PATTERNS else interop.pattern_name(pattern),  # tiktoken's gpt2 pat_str is "gpt2"
        byte_order=parts["byte_order"],
        training={"imported": "tiktoken rank file"},
    )
    check_whole_tokens(tok.layout, _TIKTOKEN_WHOLE, "imported")
    return tok


# ------------------------------------------------------------------------------------ exporters


def export_files(tok, format: str = "gpt2") -> dict[str, bytes]:
    """`Tokenizer.export_files`: the files of `format` ("gpt2", "hf" or "tiktoken") for `tok`,
    name -> contents, validated (TokenizerError) and not written."""
    if format == "gpt2":
        return _gpt2_files(tok)
    if format == "hf":
        options = tok.options
        data = interop.to_hf(tok.vocab, tok.merges, tok.special_tokens, tok.pattern_regex, **options)
        config, special_map = interop.hf_configs(tok.special_tokens, tok.bos, options["text_tokens"])
        return library_files.hf_files(data, *_with_chat_template(tok, config, special_map))
    if format == "tiktoken":
        return _tiktoken_files(tok)
    raise TokenizerError(f"unknown export format {format!r}; use one of {', '.join(EXPORT_FORMATS)}")


def _with_chat_template(tok, config: dict, special_map: dict) -> tuple[dict, dict]:
    """tokenizer_config.json and special_tokens_map.json with the tokenizer's chat template, where
    transformers 4 and 5 read it (`chat_template`): its own (imported) one with the special tokens'
    texts it names that the tokenizer has, or tk's when it has tk's tokens; as they were otherwise."""
    template = jinja_template.template_of(tok)
    if template is None and all(t in tok.special_tokens for t in jinja_template.TK_TOKENS):
        template = jinja_template.tk_template(tok.bos)
    if template is None:
        return config, special_map
    named = {k: v for k, v in template.tokens.items() if v in tok.special_tokens}
    return {**config, **named, "chat_template": template.source}, {**special_map, **named}


def _gpt2_files(tok) -> dict[str, bytes]:
    if any(v not in (False, None) for v in tok.options.values()):
        what = (
            "ignore_merges"
            if tok.ignore_merges
            else f"its {tok.normalizer.upper()} normalizer"
            if tok.normalizer
            else f"that a model expects {tok.bos} first"
            if tok.bos
            else "added tokens that are part of the text"
        )
        raise TokenizerError(
            f"vocab.json + merges.txt cannot say {what}, which changes ids; export it with --format hf"
        )
    if tok.listed:
        raise TokenizerError(
            "vocab.json + merges.txt make merge r id 256 + r, which this listed vocabulary does not; "
            "export it with --format hf"
        )
    return library_files.gpt2_files(tok.vocab, tok.merges, tok.special_tokens)


def _tiktoken_files(tok) -> dict[str, bytes]:
    if tok.listed:
        raise TokenizerError(
            "tiktoken's ranks are its ids and merge any pair whose bytes are a token; this listed "
            "vocabulary's merges do not follow its ids, so export it with --format hf"
        )
    layout = tok.layout
    ranks = interop.to_tiktoken(tok.merges, [t[0] for t in layout.id_bytes[:256]])
    interop.check_tiktoken_specials(tok.special_tokens, "exported to tiktoken")
    if tok.bos is not None or tok.text_tokens:
        what = f"that a model expects {tok.bos} before every text" if tok.bos else "text's added tokens"
        raise TokenizerError(f"tiktoken's files cannot say {what}; export it with --format hf")
    if tok.normalizer is not None:
        raise TokenizerError(
            f"the tokenizer puts text in {tok.normalizer.upper()} before splitting and tiktoken has no "
            "normalizer, so it cannot be exported to tiktoken"
        )
    why = _TIKTOKEN_IGNORE_MERGES if tok.ignore_merges else _TIKTOKEN_WHOLE
    check_whole_tokens(layout, why, "exported to tiktoken")
    pat_str = interop.tiktoken_pat_str(tok.pattern_regex)
    return library_files.tiktoken_files(ranks, pat_str, tok.special_tokens, tok.pattern)
