"""bpe/show.py, the one spelling of a token, against a plain character-by-character reference on
random byte strings."""

from __future__ import annotations

import random

import pytest

from tokenkit.bpe.show import token_repr, token_str


def _units(raw: bytes) -> list[str | int]:
    """raw as characters (str) where a whole UTF-8 character starts, and single bytes (int) where none does."""
    units, i = [], 0
    while i < len(raw):
        for n in range(1, 5):
            try:
                char = raw[i : i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            units.append(char)
            i += n
            break
        else:
            units.append(raw[i])
            i += 1
    return units


def _plain(raw: bytes) -> str:
    return "".join(u if isinstance(u, str) else f"\\x{u:02x}" for u in _units(raw))


def _quoted(raw: bytes) -> str:
    units = _units(raw)
    text = "".join(u for u in units if isinstance(u, str))
    quote = '"' if "'" in text and '"' not in text else "'"
    named = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", quote: "\\" + quote}
    out = []
    for u in units:
        if isinstance(u, int):
            out.append(f"\\x{u:02x}")
        elif u in named:
            out.append(named[u])
        elif u.isprintable():
            out.append(u)
        elif 0x80 <= ord(u) <= 0x9F:  # a C1 control: \u, so that it never reads as a byte
            out.append(f"\\u{ord(u):04x}")
        elif ord(u) < 0x100:
            out.append(f"\\x{ord(u):02x}")
        elif ord(u) < 0x10000:
            out.append(f"\\u{ord(u):04x}")
        else:
            out.append(f"\\U{ord(u):08x}")
    return quote + "".join(out) + quote


def _random_tokens(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    pieces = ["a", " the", "'", '"', "\\", "é", "€", "😀", "\n", "\x85", "\x00", "\u200b", "\\xc3", "\\udc85"]
    tokens = []
    for _ in range(n):
        raw = b""
        for _ in range(rng.randint(0, 5)):
            if rng.random() < 0.5:
                raw += rng.choice(pieces).encode()
            else:
                raw += bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.3:  # cut inside a character, as a byte-level token may be
            raw = raw[: rng.randint(0, len(raw))]
        tokens.append(raw)
    return tokens


@pytest.mark.parametrize("seed", range(4))
def test_both_forms_agree_with_the_character_by_character_reference(seed):
    for raw in _random_tokens(3000, seed):
        assert token_str(raw) == _plain(raw), raw
        assert token_repr(raw) == _quoted(raw), raw


def test_the_quoted_form_tells_every_token_apart():
    """Two different tokens never print alike: a byte (\\x85) is not a backslash (\\\\x85) nor a
    character (U+0085 prints \\u0085)."""
    tokens = set(_random_tokens(20000, 9)) | {b"\x85", "\x85".encode(), b"\\x85", b"\xc3", "Ã".encode()}
    shown = {token_repr(raw) for raw in tokens}
    assert len(shown) == len(tokens)


def test_valid_text_prints_as_python_prints_it():
    for raw in _random_tokens(3000, 5):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not any(0x80 <= ord(c) <= 0x9F for c in text):
            assert token_repr(raw) == repr(text)
        assert token_str(raw) == text
