"""The split patterns by name, and the regex a name or a custom pattern stands for.

- "gpt2": GPT-2's pattern (the default).
- "gpt4": GPT-4's (tiktoken's cl100k_base) pattern; "cl100k" is an alias.
- "none": no splitting (None): each document is one chunk.
- anything else: a custom regex for the `regex` module, checked to compile.

What it deliberately does not do: split or count (bpe/pretokenize.py), or say what another
library's regex engine makes of a pattern (bpe/regex_dialect.py). It sits below every module that
names a pattern, so that naming one never pulls in the corpus reader or worker processes.

>>> resolve_pattern("cl100k") == GPT4_PATTERN, resolve_pattern("none")
(True, None)
"""

from __future__ import annotations

from functools import lru_cache

import regex

from tokenkit.bpe.errors import TokenizerError

__all__ = ["BUILTIN", "GPT2_PATTERN", "GPT4_PATTERN", "PATTERNS", "compile_pattern", "resolve_pattern"]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
PATTERNS: dict[str, str | None] = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "cl100k": GPT4_PATTERN, "none": None}
BUILTIN = frozenset({GPT2_PATTERN, GPT4_PATTERN})  # they match every character and always split at find_cut's cuts


def resolve_pattern(name_or_regex: str | None) -> str | None:
    """The regex for a pattern name ("gpt2", "gpt4"/"cl100k"), None for "none", else the regex itself.

    >>> resolve_pattern("none") is None
    True
    >>> resolve_pattern(r"\\w+|\\W+")
    '\\\\w+|\\\\W+'
    """
    if name_or_regex is None:
        return None
    if name_or_regex in PATTERNS:
        return PATTERNS[name_or_regex]
    if not name_or_regex:
        raise TokenizerError("the split pattern is empty; use gpt2, gpt4, none or a regex")
    compile_pattern(name_or_regex)
    return name_or_regex


@lru_cache(maxsize=16)
def compile_pattern(pattern: str) -> regex.Pattern:
    """The compiled regex (cached); one-line TokenizerError when it does not compile."""
    try:
        return regex.compile(pattern)
    except regex.error as err:
        raise TokenizerError(f"bad split pattern {pattern!r}: {err}; use gpt2, gpt4, none or a valid regex") from None
