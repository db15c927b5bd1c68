"""JSON from files, parsed without risk: one-line FileError instead of a traceback.

`json.loads` recurses once per nesting level; a file nested 100,000 deep would end in a
RecursionError, so nesting beyond MAX_DEPTH is refused before parsing. Sizes are the caller's
to bound (a file's length bounds its text).

>>> loads('{"a": [1, 2]}')
{'a': [1, 2]}
>>> try:
...     loads("[" * 100 + "]" * 100, "config")
... except FileError as err:
...     print(err)
config is nested deeper than 64 levels (tokenkit never nests that deep; the file is damaged or hostile)
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from tokenkit.common.errors import FileError

MAX_DEPTH = 64
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def depth(text: str) -> int:
    """The deepest nesting of [ ] and { } outside strings (0 for a scalar).

    >>> depth('{"a": [1, "]]]"]}')
    2
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)  # C loops: a tokenizer.json has 500k


def loads(text: str | bytes, what: str = "JSON text") -> Any:
    """Parse JSON, refusing invalid text and nesting deeper than MAX_DEPTH (FileError naming `what`)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise FileError(f"{what} is not UTF-8 text") from None
    if depth(text) > MAX_DEPTH:
        raise FileError(
            f"{what} is nested deeper than {MAX_DEPTH} levels "
            "(tokenkit never nests that deep; the file is damaged or hostile)"
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FileError(f"{what} is not valid JSON ({first})") from None
