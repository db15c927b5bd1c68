"""One corpus input opened for reading: decompressed when its first bytes say so, read exactly.

What it does: `Reader(inp, raw)` opens an `Input` (a file, a byte range of one, stdin or a pipe)
and gives exactly n bytes per `read(n)` (fewer only at the end), decompressing gzip, bzip2, xz
and zstd (`codec_of` knows them by their first bytes, not their names; zstd with the `zstandard`
package or Python's `compression.zstd`, `zstd_available`). A stream's first bytes cannot be read
twice, so they are put back in front of it. A corrupt, truncated or unreadable input is one
TokenizerError naming it and the tool that checks it.

What it deliberately does not do: decide what to read (bpe/corpus.py expands inputs into
documents), parse JSONL, or look at whether the bytes are text.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import sys
from collections.abc import Callable
from typing import BinaryIO, NamedTuple

from tokenkit.bpe.errors import TokenizerError

__all__ = ["Input", "Reader", "codec_of", "zstd_available"]

_CODECS = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))
_TOOLS = {"gzip": "gzip -t", "bzip2": "bzip2 -t", "xz": "xz -t", "zstd": "zstd -t"}


def codec_of(head: bytes) -> str | None:
    """The compression format that `head` (a file's first bytes) starts, or None.

    >>> codec_of(b"\\x1f\\x8b\\x08"), codec_of(b"BZh91AY"), codec_of(b"plain text")
    ('gzip', 'bzip2', None)
    """
    for magic, name in _CODECS:
        if head.startswith(magic):
            return name
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0":
        return "bzip2"
    return None


def zstd_available() -> bool:
    """Whether zstd files can be read here (`pip install tokenkit[zstd]`, or Python 3.14+)."""
    try:
        from compression import zstd  # noqa: F401  (Python >= 3.14)
    except ImportError:
        try:
            import zstandard  # noqa: F401
        except ImportError:
            return False
    return True


class Input(NamedTuple):
    """One input of a corpus, resolved (`bpe.corpus.Corpus`)."""

    name: str  # as shown in messages
    kind: str  # "text" (bytes in memory), "file", "range" (FileRange) or "stream" (stdin, pipe)
    path: str | None = None
    data: bytes | None = None
    start: int = 0
    end: int | None = None  # a file's size, a range's end; None for streams
    codec: str | None = None  # known beforehand for regular files; sniffed as they are read for streams


class Reader:
    """An input opened for reading: decompressed unless `raw`; `read(n)` gives exactly n bytes
    (fewer only at the end) and turns a corrupt or unreadable file into one TokenizerError."""

    def __init__(self, inp: Input, raw: bool) -> None:
        self.inp, self.raw, self.codec = inp, raw, inp.codec
        self.done = 0  # bytes of text given out so far

    def __enter__(self) -> Reader:
        inp = self.inp
        try:
            if inp.path == "-":
                self._file = None
                source: BinaryIO = sys.stdin.buffer
            else:
                source = self._file = open(inp.path, "rb")
                if inp.start:
                    self._file.seek(inp.start)
        except OSError as err:
            raise TokenizerError(f"cannot read corpus file {inp.name}: {err.strerror}") from None
        if inp.kind == "range":
            source = _Stretch(source, inp.end - inp.start)
        if inp.kind == "stream":  # the format shows in the first bytes, which cannot be read twice
            head = self._guarded(lambda: _read_full(source, 6))
            self.codec = None if self.raw else codec_of(head)
            source = _Prefixed(head, source)
        self._stream = source if self.raw or self.codec is None else _decompressor(self.codec, source, inp.name)
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()

    def read(self, n: int) -> bytes:
        data = self._guarded(lambda: _read_full(self._stream, n))
        self.done += len(data)
        return data

    def _guarded(self, read: Callable[[], bytes]) -> bytes:
        try:
            return read()
        except TokenizerError:
            raise
        except EOFError:
            raise TokenizerError(
                f"{self.inp.name}: the {self.codec} data ends early (a truncated file?); check it with "
                f"{_TOOLS.get(self.codec, 'its tool')}"
            ) from None
        except Exception as err:  # gzip.BadGzipFile, zlib.error, lzma.LZMAError, OSError, zstd's errors
            if self.codec is None and isinstance(err, OSError):
                raise TokenizerError(f"cannot read corpus file {self.inp.name}: {err.strerror or err}") from None
            msg = " ".join(str(err).split()) or type(err).__name__
            where = f" after {self.done:,} bytes of text" if self.done else ""
            raise TokenizerError(
                f"{self.inp.name}: corrupt {self.codec} data{where} ({msg}); "
                f"check it with {_TOOLS.get(self.codec, 'its tool')}"
            ) from None


def _decompressor(codec: str, source: BinaryIO, name: str) -> BinaryIO:
    if codec == "gzip":
        return gzip.GzipFile(fileobj=source, mode="rb")
    if codec == "bzip2":
        return bz2.BZ2File(source, mode="rb")
    if codec == "xz":
        return lzma.LZMAFile(source, mode="rb")
    try:
        from compression import zstd  # Python >= 3.14

        return zstd.ZstdFile(source, mode="rb")
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        raise TokenizerError(
            f"{name} is zstd-compressed; install zstandard (pip install 'tokenkit[zstd]') "
            "or decompress it first (zstd -d)"
        ) from None
    return _ZstdStream(source, zstandard)


class _ZstdStream:
    """zstd frames one after the other, decompressed with the `zstandard` package; a last frame
    cut short is an EOFError, as gzip, bz2 and lzma say it (its stream_reader just stops).

    Compressed input goes in 8 KiB at a time, which bounds what one step can inflate to.
    """

    def __init__(self, source, zstandard) -> None:
        self._source, self._new = source, zstandard.ZstdDecompressor().decompressobj
        self._d = self._new()
        self._out: list[bytes] = []
        self._have = 0
        self._started = False  # a frame is open

    def read(self, n: int) -> bytes:
        while self._have < n:
            if self._started and self._d.eof:  # a frame ended: the next one starts in what is left
                data, self._d, self._started = self._d.unused_data, self._new(), False
            else:
                data = b""
            data = data or self._source.read(8192)
            if not data:
                if self._started:
                    raise EOFError("the last frame is cut short")
                break
            self._started = True
            chunk = self._d.decompress(data)
            self._out.append(chunk)
            self._have += len(chunk)
        joined = b"".join(self._out)
        out, rest = joined[:n], joined[n:]
        self._out, self._have = [rest], len(rest)
        return out


def _read_full(stream, n: int) -> bytes:
    """n bytes of `stream`, fewer only at its end (pipes and decompressors may return less)."""
    data = stream.read(n)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n and (more := stream.read(n - got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _Prefixed:
    """`head` (already read from `stream`) followed by the rest of `stream`."""

    def __init__(self, head: bytes, stream) -> None:
        self._head, self._stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n is None or n < 0:
                data, self._head = self._head + self._stream.read(), b""
                return data
            data, self._head = self._head[:n], self._head[n:]
            return data
        return self._stream.read(n)

    def readable(self) -> bool:
        return True


class _Stretch:
    """The next `n` bytes of an open file, as a stream that ends there."""

    def __init__(self, f: BinaryIO, n: int):
        self._f, self._left = f, n

    def read(self, n: int | None = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._f.read(n)
        self._left -= len(data)
        return data
