"""Split regexes between engines: Python's `regex` (tk), Oniguruma (Hugging Face tokenizers) and
fancy-regex (tiktoken).

An exported tokenizer must split text in the other library exactly as tk does, and an imported one
as it did there. The engines agree on most of what split patterns use (`\\p{L}`, classes, `?+`,
`*+`, `++`, `(?i:...)`, `(?>...)`, lookarounds), but not on all of it (tests/test_interop.py checks
each point below against the libraries):

- `X{n,m}+` (and `{n}+`, `{n,}+`): possessive in Python and fancy-regex, "one or more X{n,m}" in
  Oniguruma, which reads GPT-4's `\\p{N}{1,3}+` as any run of digits. Written for Oniguruma as the
  atomic group `(?>X{n,m})`, read from it as `(?:X{n,m})+`. Likewise `X{n}?`: exactly n in Python,
  "X{n} or nothing" in Oniguruma.
- `^` and `$`: in Python (without the m flag) the start of the text, and its end or the place
  before a final newline; in Oniguruma those of every line; fancy-regex's `$` is the very end only.
  Python's `\\Z` is the very end (Oniguruma's `\\z`); Oniguruma's `\\Z` is Python's `$`.
- Oniguruma's flag m is Python's s (`.` matches a newline), and Oniguruma has no s.
- In a class, `[` and `&&` (and fancy-regex's `~~`) are nested classes and set operations in the
  other engines, plain characters in Python's (version 0): written escaped.
- A code point by number or name: `\\x{...}` in Oniguruma and fancy-regex; `\\U........` and
  `\\N{...}` in Python. `\\h` is a hex digit in Oniguruma (read as `[0-9a-fA-F]`) and
  fancy-regex, something else in Python (refused on export).

What it deliberately does not do: carry every construct across. What it cannot translate exactly
is refused with a one-line TokenizerError, never approximated: flags other than i and s (m in
Oniguruma), a Python flag group anywhere but at the start, nested classes and `&&` read from
Oniguruma, POSIX classes for fancy-regex (ASCII-only there), exotic groups. It does not check that
a regex compiles (the engines do). Some differences are no matter of spelling and stay: a repeated
group whose pass may be empty, like `(?:^\\s*|a){2}`, is repeated otherwise by Oniguruma; `regex`
knows a newer Unicode, so characters assigned since are no letters or digits to the others; and
`\\w` and `(?i)` differ on a few characters. The built-in patterns meet none of these.
"""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass, field

from tokenkit.bpe.errors import TokenizerError

__all__ = ["from_oniguruma", "to_fancy_regex", "to_oniguruma"]

_ENGINES = {"oniguruma": "Hugging Face tokenizers (Oniguruma)", "fancy": "tiktoken (fancy-regex)"}
# Inline flags each way (source, target): tk's s is Oniguruma's m; other flags are refused.
_FLAGS = {
    ("python", "oniguruma"): {"i": "i", "s": "m"},
    ("python", "fancy"): {"i": "i", "s": "s"},
    ("oniguruma", "python"): {"i": "i", "m": "s"},
}
_INTERVAL = re.compile(r"\{(\d*)(,?)(\d*)\}")
_FLAG_GROUP = re.compile(r"\(\?([A-Za-z]*)(?:-([A-Za-z]+))?([:)])")
_POSIX = re.compile(r"\[:\^?[A-Za-z]+:\]")
_BRACED = {"p": "{", "P": "{", "x": "{", "N": "{", "k": "<'", "g": "<'"}  # escapes with a bracketed argument
_CLOSER = {"{": "}", "<": ">", "'": "'"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


def to_oniguruma(pattern: str) -> str:
    """`pattern` (Python's `regex`) spelt so that Oniguruma splits the same: a tokenizer.json's Split regex.

    >>> print(to_oniguruma(r"\\p{N}{1,3}+|\\s++$"))
    (?>\\p{N}{1,3})|\\s++\\Z
    """
    return _Translation(pattern, "python", "oniguruma").run()


def to_fancy_regex(pattern: str) -> str:
    """`pattern` (Python's `regex`) spelt so that fancy-regex splits the same: a tiktoken pat_str.

    >>> print(to_fancy_regex(r"\\w+$|[[]"))
    \\w+(?=\\n?\\z)|[\\[]
    """
    return _Translation(pattern, "python", "fancy").run()


def from_oniguruma(pattern: str) -> str:
    """A tokenizer.json's Split regex (Oniguruma) spelt so that Python's `regex` splits the same.

    The one subtle case: a counted repeat followed by `+` is a second repeat there, so
    `\\p{N}{1,3}+` (one or more runs of 1-3 digits: any run of digits) becomes `(?:\\p{N}{1,3})+`.

    >>> print(from_oniguruma(r"\\p{N}{1,3}+| ?\\p{L}++|\\s+$"))
    (?:\\p{N}{1,3})+| ?\\p{L}++|\\s+(?m:$)
    """
    return _Translation(pattern, "oniguruma", "python").run()


@dataclass
class _Frame:
    """A group being read: its opening as written out, and its items so far."""

    opener: str
    auto: bool = False  # opened by Oniguruma's `(?i)`, which lasts to the end of the enclosing group
    items: list[list[str]] = field(default_factory=list)  # [text, kind]; kind: atom, repeated or other


def _escape_end(p: str, i: int) -> int:
    """Where the escape at p[i] (a backslash) ends: `\\p{L}`, `\\pL`, `\\x{41}`, `\\x41`, `\\u0041`,
    `\\k<name>`, `\\12`, `\\d`... (one past the text's end when it is cut short)."""
    c, j = p[i + 1], i + 2
    if c in _BRACED and j < len(p) and p[j] in _BRACED[c]:
        k = p.find(_CLOSER[p[j]], j + 1)
        return len(p) if k < 0 else k + 1
    if c in "pPc":  # \pL, \cX: one more character
        return min(j + 1, len(p))
    if c in _HEX_DIGITS:
        n = _HEX_DIGITS[c]
        while n and j < len(p) and p[j] in string.hexdigits:
            j, n = j + 1, n - 1
        return j
    if c.isdigit():  # a back-reference or an octal escape: all its digits
        while j < len(p) and p[j].isdigit():
            j += 1
    return j


class _Translation:
    """One pass over a regex, item by item, writing it out for the target engine.

    Each group keeps its items apart (an escape, a class, a character, a whole group, a repeat of
    one of them), so that a quantifier can wrap exactly the item it repeats.
    """

    def __init__(self, pattern: str, source: str, target: str) -> None:
        self.p, self.source, self.target = pattern, source, target
        self.flags = _FLAGS[source, target]
        self.frames = [_Frame("")]
        self.prefix = ""  # flag groups at the very start: they apply to the whole pattern

    def refuse(self, what: str) -> TokenizerError:
        shown = repr(self.p) if len(self.p) <= 60 else repr(self.p[:50]) + "..."
        if self.source == "python":
            return TokenizerError(
                f"the split pattern {shown} uses {what}, which {_ENGINES[self.target]} reads otherwise"
            )
        return TokenizerError(
            f"the split regex {shown} uses {what}, which tk cannot read as {_ENGINES[self.source]} does"
        )

    def run(self) -> str:
        p, i = self.p, 0
        while i < len(p):
            c = p[i]
            if c == "\\":
                if i + 1 == len(p):
                    raise self.refuse("a lone backslash at its end")
                j = _escape_end(p, i)
                self.add(self.escape(p[i:j], in_class=False), "atom")
            elif c == "[":
                j = self.char_class(i)
            elif c == "(":
                j = self.open(i)
            elif c == ")":
                self.close()
                j = i + 1
            elif c == "|":
                self.add("|", "other")
                j = i + 1
            elif c in "^$":
                self.add(self.anchor(c), "other")
                j = i + 1
            elif c in "*+?" or (c == "{" and self.interval(i)):
                j = self.quantifier(i)
            elif c in "{}":  # a brace that is no repeat: a plain character, escaped for every engine
                self.add("\\" + c, "atom")
                j = i + 1
            else:
                self.add(c, "atom")
                j = i + 1
            i = j
        while self.frames[-1].auto:
            self.pop()
        if len(self.frames) > 1:
            raise self.refuse("a group that is never closed")
        return self.prefix + "".join(text for text, _ in self.frames[0].items)

    def add(self, text: str, kind: str) -> None:
        self.frames[-1].items.append([text, kind])

    # ------------------------------------------------------------------------- repeats

    def interval(self, i: int) -> tuple[str, bool, int] | None:
        """The counted repeat at p[i] ("{"): (its text for the target, exactly n?, where it ends),
        or None when the brace is a plain character. Python reads `{,}` as `{0,}`, Oniguruma as text."""
        m = _INTERVAL.match(self.p, i)
        if m is None:
            return None
        lo, comma, hi = m.groups()
        if not comma:
            return (m.group(), True, m.end()) if lo else None
        if self.source == "oniguruma" and not lo and not hi:
            return None
        return f"{{{lo or 0},{hi}}}", False, m.end()  # {,m} is {0,m}: fancy-regex needs the 0

    def quantifier(self, i: int) -> int:
        p = self.p
        counted = self.interval(i) if p[i] == "{" else None
        base, exact, j = counted if counted else (p[i], False, i + 1)
        suffix = ""
        if j < len(p) and p[j] in "?+":
            # In Oniguruma a counted repeat takes no `+` (and `{n}` no `?`): that is a second repeat.
            if not (self.source == "oniguruma" and counted and (p[j] == "+" or exact)):
                suffix, j = p[j], j + 1
        items = self.frames[-1].items
        if not items or items[-1][1] == "other":
            raise self.refuse(f"a repeat {p[i:j]!r} of nothing")
        text, kind = items[-1]
        if kind == "repeated":  # a repeat of a repeat (Oniguruma): Python needs a group around the first
            text = f"(?:{text})"
        if self.target == "oniguruma" and counted and suffix == "+":
            text = f"(?>{text}{base})"  # possessive: an atomic group, which both engines read alike
        elif self.target == "oniguruma" and exact and suffix == "?":
            text += base  # lazy exactly-n is exactly n; `{n}?` would be "or nothing" there
        else:
            text += base + suffix
        items[-1] = [text, "repeated"]
        return j

    # ------------------------------------------------------------------- single items

    def escape(self, text: str, in_class: bool) -> str:
        c = text[1]
        if c == "h":
            if self.source == "python":
                raise self.refuse("\\h (a hex digit there)")
            return "0-9a-fA-F" if in_class else "[0-9a-fA-F]"
        if c == "H" and self.source == "oniguruma" and not in_class:
            return "[^0-9a-fA-F]"
        if self.source == "python":
            if text == "\\Z":
                return "\\z"
            if c == "U" and len(text) == 10:
                return f"\\x{{{int(text[2:], 16):X}}}"
            if c == "N" and text.startswith("\\N{"):
                try:
                    return f"\\x{{{ord(unicodedata.lookup(text[3:-1])):X}}}"
                except KeyError:
                    raise self.refuse(f"an unknown character name {text}") from None
            return text
        if text == "\\Z" and not in_class:
            return "$"
        if text == "\\z" and not in_class:
            return "\\Z"
        if c == "k" and text.startswith("\\k<") and not in_class:  # a back-reference by name
            return f"(?P={text[3:-1]})"
        if c == "x" and text.startswith("\\x{"):
            try:
                return f"\\U{int(text[3:-1], 16):08X}"
            except ValueError:
                raise self.refuse(f"a bad code point {text}") from None
        return text

    def anchor(self, c: str) -> str:
        if self.target == "oniguruma":
            return "\\A" if c == "^" else "\\Z"
        if self.target == "fancy":
            return "^" if c == "^" else "(?=\\n?\\z)"
        # From Oniguruma: the start of every line but the empty one after a final newline, and
        # the end of every line.
        return "(?m:^)(?!\\Z)" if c == "^" else "(?m:$)"

    def char_class(self, i: int) -> int:
        """Read the class at p[i] ("["), add it as one item and return where it ends."""
        p, out, j = self.p, ["["], i + 1
        if p.startswith("^", j):
            out.append("^")
            j += 1
        if p.startswith("]", j):  # a leading ] is a character in all three engines
            out.append("\\]")
            j += 1
        while j < len(p):
            c = p[j]
            if c == "]":
                self.add("".join(out) + "]", "atom")
                return j + 1
            if c == "\\" and j + 1 < len(p):
                k = _escape_end(p, j)
                out.append(self.escape(p[j:k], in_class=True))
                j = k
                continue
            posix = _POSIX.match(p, j)
            if posix and self.target == "fancy":
                raise self.refuse(f"the POSIX class {posix.group()} (ASCII-only there)")
            if posix:
                out.append(posix.group())
                j = posix.end()
                continue
            if self.source == "oniguruma" and (c == "[" or p.startswith("&&", j)):
                raise self.refuse("a nested character class" if c == "[" else "a class intersection &&")
            out.append("\\" + c if self.source == "python" and c in "[&~" else c)
            j += 1
        raise self.refuse("a character class that is never closed")

    # --------------------------------------------------------------------------- groups

    def open(self, i: int) -> int:
        """Read the group opening at p[i] ("("), push its frame (or add the whole item), return its end."""
        p = self.p
        if not p.startswith("(?", i):
            self.frames.append(_Frame("("))
            return i + 1
        for plain in ("(?:", "(?>", "(?=", "(?!", "(?<=", "(?<!"):
            if p.startswith(plain, i):
                self.frames.append(_Frame(plain))
                return i + len(plain)
        if p.startswith("(?#", i):  # a comment: dropped
            end = p.find(")", i)
            if end < 0:
                raise self.refuse("a comment that is never closed")
            return end + 1
        named = re.compile(r"\(\?P?<(\w+)>").match(p, i)
        if named:
            opener = f"(?<{named.group(1)}>" if self.target == "oniguruma" else f"(?P<{named.group(1)}>"
            self.frames.append(_Frame(opener))
            return named.end()
        backref = re.compile(r"\(\?P=(\w+)\)").match(p, i)
        if backref:
            self.add(f"\\k<{backref.group(1)}>" if self.target == "oniguruma" else backref.group(), "atom")
            return backref.end()
        flags = _FLAG_GROUP.match(p, i)
        if flags is None:
            raise self.refuse(f"the group {p[i : i + 4]!r}...")
        on, off, end = flags.groups()
        written = "(?" + self.flag_letters(on) + ("-" + self.flag_letters(off) if off else "")
        if end == ":":
            self.frames.append(_Frame(written + ":"))
        elif len(self.frames) == 1 and not self.frames[0].items:  # at the start: for the whole pattern
            self.prefix += written + ")"
        elif self.source == "oniguruma":  # to the end of the enclosing group, `|` included
            self.frames.append(_Frame(written + ":", auto=True))
        else:
            raise self.refuse(f"the flag group {flags.group()} after the start")
        return flags.end()

    def flag_letters(self, letters: str) -> str:
        for letter in letters:
            if letter not in self.flags:
                raise self.refuse(f"the flag {letter}")
        return "".join(self.flags[letter] for letter in letters)

    def close(self) -> None:
        while self.frames[-1].auto:
            self.pop()
        if len(self.frames) == 1:
            raise self.refuse("a ) that closes no group")
        self.pop()

    def pop(self) -> None:
        frame = self.frames.pop()
        self.add(frame.opener + "".join(text for text, _ in frame.items) + ")", "atom")
