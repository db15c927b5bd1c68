"""The one bounded reader: every file tk reads back (tokenizers, models, states, settings, logs,
token ids, JSON) is opened here, checked to be a regular file of bounded size, then read.

A path may name anything: a FIFO that nobody writes (opening it for reading would block
forever), `/dev/zero` (endless), `/dev/urandom`, a directory, a dangling link. `open_regular`
opens with O_NONBLOCK, so opening a FIFO returns at once, then looks at what it opened (fstat,
never the path a second time): anything but a regular file is refused, and so is a file larger
than the caller's `limit` for its kind, before a byte is read or allocated. Symbolic links to
regular files are followed, as every other program does. `read_bytes` reads exactly the size
that fstat gave.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     try:
...         read_bytes(d, 1 << 20, "a settings file")
...     except FileError as err:
...         print(str(err).replace(d, "DIR"))
DIR is a directory, not a regular file; give a settings file

What it deliberately does not do: read corpora (`bpe.corpus` streams those, pipes included) or
interpret what it reads; the format modules do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tokenkit.common.errors import FileError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# Per-kind limits, each far above any real file of the kind and far below what would hurt to hold:
SETTINGS_LIMIT = 1 * MIB  # a settings file (--config) holds a few hundred bytes
JSON_LIMIT = 16 * MIB  # an index of shards: ~100 bytes a tensor, under 1 MB for thousands of tensors
# transformers' small JSON files (config.json, generation_config.json, tokenizer_config.json,
# special_tokens_map.json) hold a model's settings and its special tokens: 1-60 KB (Llama 3's
# tokenizer_config.json, 256 added tokens and a chat template, is 50 KB), so 4 MiB is 80 times that
HF_CONFIG_LIMIT = 4 * MIB
# tokenizer.json and vocab.json are parsed whole into Python objects (~10 times their size): the
# largest published tokenizer.json, Gemma 3's (262k tokens, 514k merges), is 33 MB
TOKENIZER_JSON_LIMIT = 128 * MIB
TOKENIZER_LIMIT = 1 * GIB  # merges.txt, .tiktoken, tokenizer.safetensors: ~1-20 MB, read as bytes
LOG_LIMIT = 4 * GIB  # log.jsonl: ~150 bytes a step, so ten million steps of a run
NO_LIMIT = None  # model weights, states and token ids: memory-mapped or read a tensor at a time

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a file of this st_mode is, in words ("a FIFO (named pipe)", "a directory", ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def describe_missing(path: str | os.PathLike) -> str:
    """Why `path` cannot be opened when it does not exist: a dangling link names its target.

    >>> describe_missing("/nonexistent/x")
    '/nonexistent/x: no such file'
    """
    if os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"{path} is a dangling symbolic link (to {target}, which does not exist)"
    return f"{path}: no such file"


@contextlib.contextmanager
def open_regular(
    path: str | os.PathLike, limit: int | None, what: str, advice: str | None = None
) -> Iterator[tuple[BinaryIO, int]]:
    """(the open file, its size) for a regular file of at most `limit` bytes (None: any size).
    Otherwise one-line FileError naming `path` and what it is, then `advice` (default: "give
    `what`", e.g. what="a tokenizer file")."""
    path = Path(path)
    advice = advice or f"give {what}"
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise _open_error(path, err, advice) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileError(f"{path} is {kind_of(st.st_mode)}, not a regular file; {advice}")
        if limit is not None and st.st_size > limit:
            raise FileError(
                f"{path} is {st.st_size:,} bytes, more than {what} can be ({_size(limit)} at most); "
                "it is damaged or another kind of file"
            )
        os.set_blocking(fd, True)  # O_NONBLOCK was for the open alone
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f, st.st_size


def read_bytes(path: str | os.PathLike, limit: int | None, what: str, advice: str | None = None) -> bytes:
    """The whole of a regular file of at most `limit` bytes (`open_regular`), exactly the size it
    had when opened; one-line FileError otherwise."""
    with open_regular(path, limit, what, advice) as (f, size):
        try:
            data = f.read(size)
        except OSError as err:
            raise FileError(f"{path}: cannot read ({err.strerror or err})") from None
    if len(data) != size:
        raise FileError(f"{path} shrank from {size:,} to {len(data):,} bytes while it was read; read it again")
    return data


def _open_error(path: Path, err: OSError, advice: str) -> FileError:
    if err.errno == errno.ENOENT:
        return FileError(f"{describe_missing(path)}; {advice}")
    if err.errno == errno.ENXIO:  # a socket: what is there says more than "no such device"
        with contextlib.suppress(OSError):
            return FileError(f"{path} is {kind_of(os.stat(path).st_mode)}, not a regular file; {advice}")
    if err.errno == errno.ELOOP:
        return FileError(f"{path} is a symbolic link that loops; {advice}")
    return FileError(f"{path}: cannot read ({err.strerror or err}); {advice}")


def _size(n: int) -> str:
    """
    >>> _size(16 << 20), _size(1 << 30), _size(1000)
    ('16 MiB', '1 GiB', '1,000 bytes')
    """
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit:,} {name}"
    return f"{n:,} bytes"
