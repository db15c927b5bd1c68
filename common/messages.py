"""How a value and an error read inside a one-line message: `short(value)` and `one_line(err)`.

Every package says its mistakes in one line, and the values in them come from users and files
(a settings file may hold a 5,000-digit number, an error text may span lines); these two keep
such a line short and whole, in the same words everywhere.

What it deliberately does not do: write anything, or decide what a message says.
"""

from __future__ import annotations

from typing import Any

_LONGEST = 40  # a value up to this long is shown whole
_KEPT = 30  # a longer one: this much of it, then "..."
_HUGE_BITS = 200  # an integer this wide is named by its width: its digits would be noise (or fail to print)


def short(value: Any, *, quoted: bool = True) -> str:
    """`value` for a one-line message: its repr (its str with `quoted=False`, for text a user
    typed), cut to 30 characters and "..." when longer than 40; a huge integer by its width.

    >>> short("gpt5")
    "'gpt5'"
    >>> short("inf", quoted=False)
    'inf'
    >>> short("x" * 50, quoted=False)
    'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'
    >>> short(10**100)
    'a 333-bit integer'
    """
    if isinstance(value, int) and value.bit_length() >= _HUGE_BITS:
        return f"a {value.bit_length():,}-bit integer"
    text = repr(value) if quoted else str(value)
    return text if len(text) <= _LONGEST else text[:_KEPT] + "..."


def one_line(err: BaseException, *, named: bool = False) -> str:
    """`err`'s message on one line (its type's name when it has none); `named` puts the type's
    name first, for an error no package foresaw.

    >>> one_line(ValueError("two\\n   lines"))
    'two lines'
    >>> one_line(KeyError("x"), named=True)
    "KeyError: 'x'"
    """
    if named:
        return " ".join(f"{type(err).__name__}: {err}".split())
    return " ".join(str(err).split()) or type(err).__name__
