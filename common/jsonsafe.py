"""JSON from files, parsed without risk: one-line FileError instead of a traceback.

`json.loads` recurses once per nesting level; a file nested 100,000 deep would end in a
RecursionError, so nesting beyond MAX_DEPTH is refused before parsing. A text with no more than
MAX_DEPTH opening brackets anywhere cannot nest deeper, so it skips the count (a training log's
line has one; `depth` costs tens of microseconds a call in NumPy's setup alone). Sizes are the
caller's to bound (a file's length bounds its text), and so is what the parse makes of them: a
value costs 50 to 70 bytes as a Python object, so `[[],[],...]` takes 20 times its length, and a
caller that reads a large file gives `max_items`, which `items` checks before parsing. Text
that does not begin as JSON does (a file of zeros) is refused before it is decoded.

>>> loads('{"a": [1, 2]}')
{'a': [1, 2]}
>>> try:
...     loads("[" * 100 + "]" * 100, "config")
... except FileError as err:
...     print(err)
config is nested deeper than 64 levels (tokenkit never nests that deep; the file is damaged or hostile)
>>> try:
...     loads("[[], [], [], [], []]", "vocab.json", max_items=4)
... except FileError as err:
...     print(err)
vocab.json holds 5 JSON values or more, more than the 4 such a file holds (the file is damaged or hostile)
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from tokenkit.common.errors import FileError

MAX_DEPTH = 64
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STRING_BYTES = re.compile(_STRING.pattern.encode("ascii"), re.DOTALL)  # UTF-8: no character holds `"` or `\`
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_BLANK = re.compile(rb"[ \t\r\n]*")
_STARTS = b'[{"-0123456789tfn'  # the bytes a JSON value begins with
_AT_ONCE_BYTES = 64 << 20  # longer texts take the regex: `_depth_at_once` holds a few bytes per byte of text
_AT_ONCE_MARKS = 8 << 20  # and 8 bytes per quote and bracket, in a few arrays


def depth(text: str | bytes) -> int:
    """The deepest nesting of [ ] and { } outside strings (0 for a scalar).

    Found with NumPy where every string is closed and every quote outside strings unescaped
    (all valid JSON: `_depth_at_once`) and the text is not huge, otherwise by removing the
    strings with a regex (a tokenizer.json holds 500k of them).

    >>> depth('{"a": [1, "]]]"]}'), depth(b"[[1]]"), depth('"open [[')
    (2, 2, 2)
    """
    if isinstance(text, str):  # up to 4 bytes a character
        raw = text.encode("utf-8", "surrogatepass") if 4 * len(text) <= _AT_ONCE_BYTES else None
    else:
        raw = bytes(text) if len(text) <= _AT_ONCE_BYTES else None
    found = None if raw is None else _depth_at_once(raw)
    if found is not None:
        return found
    # bytes: the quotes, backslashes and brackets are ASCII, the same characters whatever the rest decodes to
    return _depth_plain(text if isinstance(text, str) else bytes(text).decode("utf-8", "surrogateescape"))


def _depth_plain(text: str) -> int:
    """`depth` by removing the strings, then everything but brackets."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)  # C loops: a tokenizer.json has 500k


def _depth_at_once(raw: bytes) -> int | None:
    """`depth` of UTF-8 text from the positions of its quotes, backslashes and brackets; None
    where a string is left open or a quote outside strings is escaped (`_depth_plain` reads those).

    A quote closes a string when an even number of backslashes comes right before it, so the
    unescaped quotes open and close strings in turns, and a bracket is outside strings when an
    even number of them comes before it.
    """
    import numpy as np  # here: pipeline/config.py reads JSON with this module, and `tk CMD --help` imports it

    b = np.frombuffer(raw, dtype=np.uint8)
    is_quote = b == ord('"')
    is_bracket = (b == ord("[")) | (b == ord("{")) | (b == ord("]")) | (b == ord("}"))
    if np.count_nonzero(is_quote) + np.count_nonzero(is_bracket) > _AT_ONCE_MARKS:
        return None
    quotes = np.flatnonzero(is_quote)
    escaped = np.zeros(len(quotes), dtype=bool)
    # quotes right after a backslash (few; a quote at 0 looks at the last byte, and no run below ends at 0)
    maybe = np.flatnonzero(b[quotes - 1] == ord("\\"))
    if len(maybe):
        backslashes = np.flatnonzero(b == ord("\\"))
        cuts = np.flatnonzero(np.diff(backslashes) != 1)  # each run of backslashes: its start and its end
        starts, ends = backslashes[np.r_[0, cuts + 1]], backslashes[np.r_[cuts, len(backslashes) - 1]] + 1
        after = quotes[maybe]
        run = np.minimum(np.searchsorted(ends, after), len(ends) - 1)  # the first run that ends at or after it
        escaped[maybe] = (ends[run] == after) & ((after - starts[run]) % 2 == 1)
    turns = quotes[~escaped]
    if len(turns) % 2 or (np.searchsorted(turns, quotes[escaped]) % 2 == 0).any():
        return None
    brackets = np.flatnonzero(is_bracket)
    outside = b[brackets[np.searchsorted(turns, brackets) % 2 == 0]]
    steps = np.where((outside == ord("[")) | (outside == ord("{")), 1, -1)
    return int(np.cumsum(steps).max()) if len(steps) else 0


def _may_nest_deeper(text: str | bytes | bytearray) -> bool:
    """Whether `text` holds more than MAX_DEPTH opening brackets, in strings or not: a nesting
    level needs one, so a text with fewer cannot nest deeper (two C scans, far below `depth`).

    >>> _may_nest_deeper('{"a": [1]}'), _may_nest_deeper("[" * 65), _may_nest_deeper(b'"' + b"{" * 65 + b'"')
    (False, True, True)
    """
    if isinstance(text, str):
        return text.count("[") + text.count("{") > MAX_DEPTH
    return text.count(b"[") + text.count(b"{") > MAX_DEPTH


def items(text: str | bytes, at_most: int | None = None) -> int:
    """How many values a parse of `text` makes, at least: the commas outside strings, plus one
    (a key and its value count once; nesting, bounded by MAX_DEPTH, adds at most that many per
    comma). Counted in the text as it is while that is `at_most` or fewer (a comma in a string
    is rare), outside strings otherwise.

    >>> items('{"a": [1, 2], "b,c": 3}'), items('{"a": [1, 2], "b,c": 3}', at_most=10)
    (3, 4)
    >>> items(b"[[], [], [], []]")
    4
    """
    comma = "," if isinstance(text, str) else b","
    n = text.count(comma) + 1
    if at_most is not None and n <= at_most:
        return n
    strings = _STRING if isinstance(text, str) else _STRING_BYTES
    return strings.sub(comma[:0], text).count(comma) + 1


def loads(text: str | bytes, what: str = "JSON text", *, max_items: int | None = None) -> Any:
    """Parse JSON, refusing invalid text, nesting deeper than MAX_DEPTH and more than `max_items`
    values (`items`), each before the parse (FileError naming `what`)."""
    raw = text  # `depth` reads bytes as they are, without encoding the text a second time
    if isinstance(text, (bytes, bytearray)):
        first = _BLANK.match(text).end()
        if first < len(text) and text[first] < 0x80 and text[first] not in _STARTS:
            # a file of zeros, or of another kind: json.loads' message for its first bytes, before decoding the rest
            _parse(bytes(text[: first + 1]).decode("ascii"), what)
    if max_items is not None:  # on the bytes, before they are decoded
        n = items(text, max_items)
        if n > max_items:
            raise FileError(
                f"{what} holds {n:,} JSON values or more, more than the {max_items:,} such a file holds "
                "(the file is damaged or hostile)"
            )
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise FileError(f"{what} is not UTF-8 text") from None
    if _may_nest_deeper(raw) and depth(raw) > MAX_DEPTH:
        raise FileError(
            f"{what} is nested deeper than {MAX_DEPTH} levels "
            "(tokenkit never nests that deep; the file is damaged or hostile)"
        )
    return _parse(text, what)


def _parse(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FileError(f"{what} is not valid JSON ({first})") from None
