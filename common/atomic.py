"""The one atomic writer: a file is replaced whole or not at all, and a crash leaves only our temps.

`write_atomic(path, data_or_writer)` writes to a temp file beside `path`, flushes and fsyncs it,
renames it over `path` (`os.replace`, atomic on POSIX) and fsyncs the directory, so the rename
itself survives a power cut. Readers see the old file or the new one, never half of one.

Temp files are named `.NAME.tk-PID-RANDOM.tmp`: recognisably ours, with the writer's PID, so
`remove_stale_temps` can delete exactly the temps of writers that died (a SIGKILL mid-write)
and never a file it did not create. Files are created with mode 0o666 and the umask applies,
as for any other program's output; nothing is chmod'ed.

A write that fails (read-only file system, full disk, no permission) removes its temp and
raises one-line FileError naming the path and what to do; Ctrl-C and other exceptions remove
the temp and propagate unchanged.

What it deliberately does not do: decide what goes in a file (the format modules do), lock a
run directory (that lock is `pipeline.rundir`'s), replace a set of files as one (`atomic_dir`)
or move staged files in together (`staging`); both build on this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from tokenkit.common import readfile
from tokenkit.common.errors import FileError

TEMP_NAME = re.compile(r"^\..+\.tk-(\d+)-[0-9a-f]{8}\.tmp$")
_HINTS = {
    errno.ENOSPC: "the disk is full; free some space or write elsewhere",
    errno.EDQUOT: "the disk quota is exceeded; free some space or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "permission denied; write elsewhere or fix the directory's permissions",
    errno.EPERM: "permission denied; write elsewhere or fix the directory's permissions",
    errno.ENOENT: "the directory does not exist; create it first",
}


def write_error(path: str | os.PathLike, err: OSError) -> FileError:
    """The one-line FileError for an OSError met while writing `path` (a full disk: with the free
    space left where it was writing)."""
    hint = _HINTS.get(err.errno, "check the path and the disk")
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = hint.replace("; ", f" ({_free_space(Path(path).parent)}); ", 1)
    return FileError(f"{path}: cannot write ({err.strerror or err}); {hint}")


def _free_space(directory: Path) -> str:
    """What is free in `directory` ("80.3 GB free in /data"), for the message of a full disk."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return f"free space in {directory} unknown"
    return f"{free / 1e9:,.1f} GB free in {directory}" if free >= 1e8 else f"{free:,} bytes free in {directory}"


def temp_path(path: str | os.PathLike) -> Path:
    """A fresh temp name beside `path` that `remove_stale_temps` recognises as ours."""
    path = Path(path)
    return path.with_name(f".{path.name}.tk-{os.getpid()}-{secrets.token_hex(4)}.tmp")


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_output(path: str | os.PathLike) -> None:
    """One-line FileError unless `path` is a place to write a file: a regular file (replaced whole)
    or a new name in an existing directory. Commands call it before any work; `commit` asks again
    right before its rename.

    Never replaced: a device node (/dev/null), a FIFO, a socket, or a link to one. A write goes to
    a temp file renamed over the path, which would put a regular file where the node was (for
    /dev/null, the machine's); tk does not stream into such a path either, since a half-written
    output could not be told from a whole one. A dangling link is named as one and kept.
    """
    path = Path(path)
    for link in (path.parent, path):  # a dangling link is named as one: replacing it would lose it silently
        if os.path.islink(link) and not link.exists():
            raise FileError(f"{readfile.describe_missing(link)}; remove the link or give another path")
    if not path.parent.is_dir():
        raise FileError(f"{path}: directory {path.parent} does not exist; create it first")
    _check_not_special(path)


def _check_not_special(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode  # through links: a link to /dev/null is a device here
    except OSError:  # nothing there (or a dangling link: named by check_output)
        return
    if stat.S_ISDIR(mode):
        raise FileError(f"{path}: is a directory; give a file name")
    if not stat.S_ISREG(mode):
        via = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
        raise FileError(
            f"{path}: is {readfile.kind_of(mode)}{via}, not a regular file; tk writes only regular files "
            "(it would replace the node): give a file path, and read or copy the file from there"
        )


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path` for the caller to write whole; on success it becomes `path`.

    For writers that take a path rather than a file object. On any exception the temp is removed
    and `path` is untouched.
    """
    path = Path(path)
    check_output(path)
    tmp = temp_path(path)
    try:
        yield tmp
        commit(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError):
            raise write_error(path, err) from None
        raise


def commit(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """fsync `tmp`, rename it over `path`, fsync the directory (the last steps of an atomic write)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _check_not_special(Path(path))  # again: a node made at the path since check_output is not replaced either
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def create_temp(tmp: str | os.PathLike) -> BinaryIO:
    """`tmp` (a `temp_path` name) created and opened for writing: never through a name someone
    else made (O_EXCL), with mode 0o666 & ~umask like any output file."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, "wb")


Data = bytes | Callable[[BinaryIO], None]


def write_into(f: BinaryIO, data: Data) -> None:
    if callable(data):
        data(f)
    else:
        f.write(data)


def write_atomic(path: str | os.PathLike, data: Data) -> None:
    """Write `data` (bytes, or a function that writes into the open binary file) to `path` atomically."""
    with atomic_path(path) as tmp:
        with create_temp(tmp) as f:
            write_into(f, data)


def read_note(path: Path) -> bytes:
    """A note tk's writers wrote (any size: one too big to read would look like no note at all)."""
    return readfile.read_bytes(path, readfile.NO_LIMIT, "a note of tk's")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    # a zombie (killed, not yet reaped) is not writing anything
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    return True


def stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Our temp files in `directory` whose writer is no longer alive."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            match = TEMP_NAME.match(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                pid = int(match.group(1))
                if pid != os.getpid() and not alive(pid):
                    found.append(Path(entry.path))
    return found


def remove_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Delete the temps of writers that died mid-write (only names `temp_path` makes); returns them."""
    removed = []
    for tmp in stale_temps(directory):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed
