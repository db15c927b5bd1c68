"""The one rule for where text may be cut: `find_cut`, for streamed counting, parallel and MPI work.

A corpus is read, counted and encoded in pieces of about a megabyte; a piece may end only where
both built-in split patterns always end a chunk, so that splitting the pieces gives the chunks of
splitting the whole text. `bpe.corpus` cuts documents and files with this rule, and through it
`bpe.pretokenize` (counting) and `bpe.encode_corpus` / `bpe.distributed` (encoding).

`cut_pieces` cuts a document's bytes, block by block as they are read, into pieces by it.

What it deliberately does not do: read anything, or split text into chunks (bpe/pretokenize.py):
it looks at bytes already in memory and says where a cut is safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import regex

from tokenkit.bpe.errors import TokenizerError

__all__ = ["CUT_CONTEXT", "MAX_UNCUT_BYTES", "UncutStretch", "cut_pieces", "find_cut"]

_ASCII_WS = frozenset(b" \t\n\r\x0b\x0c")
_SPACE = regex.compile(r"\s")
CUT_CONTEXT = 4  # bytes a cut needs on its right in the buffer (a newline's next character)
_WORD_THEN_PUNCTUATION = regex.compile(rb"[A-Za-z0-9][!-&(-/:-@\[-`{-~]")  # rule 3: no apostrophe
MAX_UNCUT_BYTES = 64 << 20  # a stretch longer than this with no safe place is refused, not held whole


class UncutStretch(TokenizerError):
    """A document's stretch longer than MAX_UNCUT_BYTES without a safe place to cut it."""


def find_cut(buf: bytes, lo: int, hi: int | None = None, *, last: bool = True, specials: Sequence[bytes] = ()) -> int:
    """A safe place to cut `buf` in [lo, hi): the last one (or the first, last=False), or -1.

    The one rule for where text may be cut (streamed counting, parallel and MPI encoding all use
    it). Safe means a boundary that both built-in patterns always have, and where the text before
    it splits the same whether or not the rest follows:
    1. right before an ASCII space that follows a printable non-space ASCII byte ("word| next");
    2. where the stretch searched has none, right after a newline that sits between two
       non-whitespace characters ("end.\\n|Next"), for text with few ASCII spaces (CJK, code, data);
    3. where it has neither, right before printable ASCII punctuation other than an apostrophe
       that follows an ASCII letter or digit ("key|":1", "abc|/def"), for text with no spaces or
       newlines at all (minified JSON, base64): a letter or digit run ends there in both patterns,
       and the punctuation starts the next chunk (an apostrophe could start a contraction).
    No match of either pattern contains a non-space character followed by whitespace, except
    GPT-4's punctuation run that swallows the newlines after it ("end.\\n"), which still ends
    right after the newline. An ASCII byte is never part of a multi-byte UTF-8 character, so
    each piece decodes exactly as its stretch of the whole text does. A cut inside an occurrence
    of one of `specials` is not safe (encoding reads special tokens before splitting).

    The caller gives the context: `buf` holds the byte before `lo` (unless the text starts
    there) and at least CUT_CONTEXT (and each special's length) bytes after a cut, so cuts
    closer than that to the end of `buf` are never returned.

    >>> find_cut(b"one two three four", 0), find_cut(b"one two three four", 0, last=False)
    (13, 3)
    >>> find_cut(b"line\\nnext\\nmore", 0), find_cut(b"  \\t\\n\\t  x", 0)
    (10, -1)
    """
    pad = max([CUT_CONTEXT] + [len(s) - 1 for s in specials])
    hi = min(len(buf) if hi is None else hi, len(buf) - pad + 1)
    lo = max(lo, 1)
    if hi <= lo:  # too little buffer to judge (and a negative end would count from the right)
        return -1

    def clear(i: int) -> bool:  # no special token spans the cut
        return not any(s in buf[max(0, i - len(s) + 1) : i + len(s) - 1] for s in specials)

    for i in _candidates(buf, b" ", lo, hi, last):
        if 0x21 <= buf[i - 1] <= 0x7E and clear(i):
            return i
    for i in _candidates(buf, b"\n", lo - 1, hi - 1, last):
        if i >= 1 and buf[i - 1] not in _ASCII_WS and buf[i + 1] not in _ASCII_WS and clear(i + 1):
            before = buf[max(i - 4, 0) : i].decode("utf-8", "surrogateescape")[-1]
            after = buf[i + 1 : i + 5].decode("utf-8", "surrogateescape")[0]
            if not _SPACE.match(before) and not _SPACE.match(after):
                return i + 1
    found = -1
    for match in _WORD_THEN_PUNCTUATION.finditer(buf, max(lo - 1, 0), max(hi, 0)):
        i = match.start() + 1
        if clear(i):
            found = i
            if not last:
                break
    return found


def _candidates(buf: bytes, byte: bytes, lo: int, hi: int, last: bool) -> Iterator[int]:
    """Positions of `byte` in buf[lo:hi], from the right (last) or from the left."""
    if last:
        i = buf.rfind(byte, lo, hi)
        while i >= 0:
            yield i
            i = buf.rfind(byte, lo, i)
    else:
        i = buf.find(byte, lo, hi)
        while i >= 0:
            yield i
            i = buf.find(byte, i + 1, hi)


def cut_pieces(blocks: Iterable[bytes], piece_bytes: int | None, specials: Sequence[bytes] = ()) -> Iterator[bytes]:
    """The bytes of `blocks` (one document) in pieces of about `piece_bytes`, each ending at a
    safe cut (all in one if None).

    After each block, the buffer is cut at its last safe place. A stretch without any grows
    until MAX_UNCUT_BYTES, then is refused (UncutStretch): tk would hold it, and split it into
    chunks, whole.
    """
    if piece_bytes is None:
        data = b"".join(blocks)
        if data:
            yield data
        return
    margin = max([CUT_CONTEXT] + [len(s) for s in specials]) + 8  # cuts there were not yet eligible
    buf = bytearray()  # grows in place: a long stretch without a cut must not be copied per block
    for block in blocks:
        searched = max(len(buf) - margin, 1)  # what was already searched need not be searched again
        buf += block
        cut = find_cut(buf, searched, specials=specials)
        if cut > 0:
            yield bytes(buf[:cut])
            del buf[:cut]
        elif len(buf) > MAX_UNCUT_BYTES:
            raise UncutStretch(
                f"{len(buf) >> 20} MiB of text with no place where tk may cut it (a space or punctuation after "
                "a word, or a newline between two words); break the text into lines"
            )
    if buf:
        yield bytes(buf)
