"""GPT-2's words: the pieces its split pattern never crosses, and that pattern on ASCII at C speed.

GPT-2's split pattern (`bpe.patterns.GPT2_PATTERN`) never puts a non-space character and the
whitespace after it in one chunk, so a text cut before every whitespace run that follows
something else (`split_words`) splits into the chunks of its words, one word after the other.
Regular words (they start with whitespace and end with something else: every word but a text's
first and last) can also be joined and split together, giving the same chunks in order. Both the
encoder's word cache (`bpe.encoder.WordCache`) and the trainer's counting (`bpe.pretokenize`)
stand on this: words repeat far more than text does, and most are ASCII, which the stdlib's `re`
splits faster than `regex` (`GPT2_ASCII`). tests/test_encoder.py checks each claim against the
pattern itself.

What it deliberately does not do: hold any other pattern's rule (GPT-4's puts "end.\\n" in one
chunk, so its words are not independent), or encode.
"""

from __future__ import annotations

import re

__all__ = ["GPT2_ASCII", "WHITESPACE", "regular_word", "split_words"]

# Whitespace as the `regex` module's \s (Unicode White_Space), which GPT-2's split pattern uses;
# tests check it against the module. The stdlib's \s also holds U+001C..U+001F.
WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_WS = re.escape(WHITESPACE)
# A word: a run of whitespace, then a run of anything else; text ending in whitespace ends with a
# word of whitespace alone. The stdlib's `re` runs this simple pattern faster than `regex`.
_WORD = re.compile(f"[{_WS}]*[^{_WS}]+|[{_WS}]+")


# GPT-2's split pattern for text that is all ASCII, in the stdlib's `re`, which runs it 2.4x
# faster than `regex`: on ASCII, \p{L} is [A-Za-z], \p{N} is [0-9] and \s (Unicode White_Space)
# is re.ASCII's \s; tests compare the two.
GPT2_ASCII = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""", re.ASCII)


def split_words(text: str) -> list[str]:
    """`text` cut before every whitespace run that follows something else.

    >>> split_words("Hi there,\\n\\n  you. ")
    ['Hi', ' there,', '\\n\\n  you.', ' ']
    """
    return _WORD.findall(text)


def regular_word(word: str) -> bool:
    """Whether `word` starts with whitespace and ends with something else: such words joined
    split into their own chunks, one word after the other."""
    return word[0] in WHITESPACE and word[-1] not in WHITESPACE
