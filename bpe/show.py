"""How a token is shown, the one place. A token is bytes, and a byte-level BPE token may hold only
part of a character (GPT-2's "é" is b"\\xc3" then b"\\xa9"). tk shows it as its text where the
bytes are UTF-8, and writes each byte that is only part of a character as \\xNN.

Two forms of that one spelling:
- `token_str` (plain): JSON's "text", the page, `Tokenizer.token_pieces`. The bytes travel beside
  it where they matter (the page's `piece` gives their hex and a `partial` flag).
- `token_repr` (quoted, as Python's repr quotes text): what tk prints for people, in tables and
  one-line reports. Quotes show the spaces; escapes tell a byte (\\xc3) from a backslash (\\\\)
  and from a control character (\\r, and \\u0085 for the C1 controls, whose \\x85 would read as a byte).

What this module does not do: decode a whole text (`Tokenizer.decode` replaces bad bytes with
U+FFFD, as text should be), label ids that have no token (pipeline/run.py's `pad_label`).
"""

from __future__ import annotations

import re

__all__ = ["token_repr", "token_str"]

# In repr's output: an escaped backslash (kept), a byte that is part of a character (repr's
# \udcNN of surrogateescape), or a C1 control (repr's \x80..\x9f).
_ESCAPES = re.compile(r"\\\\|\\udc([89a-f][0-9a-f])|\\x([89][0-9a-f])")


def _respell(m: re.Match) -> str:
    byte, control = m.groups()
    if byte is not None:
        return "\\x" + byte
    if control is not None:
        return "\\u00" + control
    return m.group()


def token_str(raw: bytes) -> str:
    """A token's text, each byte that is only part of a character written \\xNN.

    >>> token_str(b" the"), token_str(b"\\xc3"), token_str("é".encode())
    (' the', '\\\\xc3', 'é')
    """
    return raw.decode("utf-8", errors="backslashreplace")


def token_repr(raw: bytes) -> str:
    """A token quoted: `token_str`'s spelling inside repr's quotes and escapes, unambiguous.

    >>> print(token_repr(b" the"), token_repr(b"\\r"), token_repr(b"\\xc3"), token_repr(b"caf\\xc3\\xa9\\xc3"))
    ' the' '\\r' '\\xc3' 'café\\xc3'
    """
    return _ESCAPES.sub(_respell, repr(raw.decode("utf-8", errors="surrogateescape")))
