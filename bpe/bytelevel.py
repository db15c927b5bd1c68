"""GPT-2's byte-level alphabet: each of the 256 bytes as a printable character.

Byte-level BPE vocabularies (GPT-2's files, Hugging Face's tokenizer.json) write a token's bytes as
a string of these characters, so that every token is visible and free of spaces.

What it deliberately does not do: read or write files (bpe/io.py) or convert whole tokenizers
(bpe/interop.py); both use this one copy of the table.
"""

from __future__ import annotations

__all__ = ["bytes_to_unicode"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character, in GPT-2's token-id order.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, and a
    few others) are shifted to U+0100 onwards, so every token is a visible, space-free string.
    The dict's order is the order of GPT-2's byte tokens: ids 0..255.

    >>> table = bytes_to_unicode()
    >>> table[ord("a")], table[ord(" ")], list(table)[:3]
    ('a', 'Ġ', [33, 34, 35])
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}
