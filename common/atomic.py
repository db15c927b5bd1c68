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

A set of files that belong together (an export: config.json beside the weights it describes)
is replaced as one by `replace_files`: the new set is written into a sibling temp directory,
which then takes the directory's place in one rename, so a reader, a crash or a kill finds the
whole old set or the whole new one. The directory's other entries are moved across first and
survive; a writer killed midway leaves a note (`.NAME.tk-PID-RANDOM.swap`) beside the
directory, and the next `replace_files` for it puts back what had been moved and removes the
rest (`recover_replacements`). A directory that cannot be swapped (a locked run directory,
others' files in it) gets a set of files in one step through a staging subdirectory:
`commit_staged` writes a note of the moves before making them, and `recover_staged` finishes a
noted commit or drops staged files that were never committed.

What it deliberately does not do: decide what goes in a file (the format modules do) or lock a
run directory (that lock is `pipeline.rundir`'s; `replace_files` only serialises writers of
one parent directory while it swaps).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ModuleNotFoundError:  # pragma: no cover - not POSIX: writers of one parent are not serialised
    fcntl = None  # type: ignore[assignment]

from tokenkit.common import readfile
from tokenkit.common.errors import FileError

_TEMP = re.compile(r"^\..+\.tk-(\d+)-[0-9a-f]{8}\.tmp$")
# replace_files' temp directory (.tmp), the old directory set aside (.old) and the note (.swap)
_SWAP = re.compile(r"^\.(.+)\.tk-(\d+)-([0-9a-f]{8})\.(tmp|old|swap)$")

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


def _check_target(path: Path) -> None:
    for link in (path.parent, path):  # a dangling link is named as one: replacing it would lose it silently
        if os.path.islink(link) and not link.exists():
            raise FileError(f"{readfile.describe_missing(link)}; remove the link or give another path")
    if not path.parent.is_dir():
        raise FileError(f"{path}: directory {path.parent} does not exist; create it first")
    if path.is_dir():
        raise FileError(f"{path}: is a directory; give a file name")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path` for the caller to write whole; on success it becomes `path`.

    For writers that take a path rather than a file object. On any exception the temp is removed
    and `path` is untouched.
    """
    path = Path(path)
    _check_target(path)
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
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def create_temp(tmp: str | os.PathLike) -> BinaryIO:
    """`tmp` (a `temp_path` name) created and opened for writing: never through a name someone
    else made (O_EXCL), with mode 0o666 & ~umask like any output file."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, "wb")


Data = bytes | Callable[[BinaryIO], None]


def _write_into(f: BinaryIO, data: Data) -> None:
    if callable(data):
        data(f)
    else:
        f.write(data)


def write_atomic(path: str | os.PathLike, data: Data) -> None:
    """Write `data` (bytes, or a function that writes into the open binary file) to `path` atomically."""
    with atomic_path(path) as tmp:
        with create_temp(tmp) as f:
            _write_into(f, data)


def _read_note(path: Path) -> bytes:
    """A note this module wrote (any size: one too big to read would look like no note at all)."""
    return readfile.read_bytes(path, readfile.NO_LIMIT, "a note of tk's")


def _alive(pid: int) -> bool:
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
            match = _TEMP.match(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                pid = int(match.group(1))
                if pid != os.getpid() and not _alive(pid):
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


# --- a directory's set of files, replaced as one -----------------------------------------------


def replace_files(directory: str | os.PathLike, files: Mapping[str, Data], *, remove: Iterable[str] = ()) -> list[str]:
    """Give `directory` the new `files` (name -> bytes, or a function writing into the open file)
    as one change: a reader finds all the old files of the set or all the new ones, never some of
    each, and so does the next reader after a crash, a kill or a full disk at any moment.

    The new files are written into a temp directory beside `directory` (`.NAME.tk-PID-RANDOM.tmp`),
    which then takes its place in one rename (Linux's RENAME_EXCHANGE; elsewhere two renames,
    between which the directory is briefly absent, never mixed). Every entry of `directory` that
    is not in the set (a README, .git, a user's notes) is moved across first and keeps its name
    and inode; the old files of the set, and the names in `remove`, leave with the old directory,
    which is then deleted. The directory keeps its permissions; a new one gets the umask's. A
    symlink to a directory keeps pointing at the replaced directory.

    Returns the names of `remove` that were there. A failure is a one-line FileError, the
    directory as it was; a killed writer's leftovers are cleared by the next call for the same
    directory (`recover_replacements`).
    """
    given = Path(directory)
    if os.path.islink(given) and not given.exists():  # realpath would make its missing target, silently
        raise FileError(f"{readfile.describe_missing(given)}; remove the link or give another directory")
    directory = Path(os.path.realpath(directory))
    names = set(files) | set(remove)
    for name in names:
        if not name or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"replace_files: {name!r} is not a plain file name")
    if directory.exists() and not directory.is_dir():
        raise FileError(f"{directory}: exists and is not a directory; give a directory")
    created = _make_parents(directory.parent)
    try:
        with _serialised(directory.parent):
            recover_replacements(directory)
            return _Swap(directory, names).run(files, remove)
    except OSError as err:
        raise write_error(directory, err) from None
    finally:
        if not directory.exists():
            for made in reversed(created):  # a failed first write leaves no directory it made
                with contextlib.suppress(OSError):
                    made.rmdir()


class _Swap:
    """One `replace_files` call: its temp directory, note and moved entries, for undoing."""

    def __init__(self, directory: Path, names: set[str]) -> None:
        self.directory = directory
        self.names = names  # the set: what the new directory gets, and what the old one loses
        stem = directory.with_name(f".{directory.name}.tk-{os.getpid()}-{secrets.token_hex(4)}")
        self.tmp, self.old, self.note = (Path(f"{stem}.{suffix}") for suffix in ("tmp", "old", "swap"))

    def run(self, files: Mapping[str, Data], remove: Iterable[str]) -> list[str]:
        d = self.directory
        existing = _entries(d) if d.is_dir() else None
        for name in sorted(self.names & set(existing or ())):
            if existing[name]:
                raise FileError(f"{d / name} is a directory where a file goes; move it away or write elsewhere")
        try:
            self._write_new(files, None if existing is None else stat.S_IMODE(os.stat(d).st_mode))
            if existing is None:
                os.rename(self.tmp, d)  # nothing to keep: the new directory appears whole
                fsync_dir(d.parent)
                return []
            self._write_note()
            for name in sorted(set(existing) - self.names):  # the directory's other entries come along
                os.rename(d / name, self.tmp / name)
            self._swap_in()
        except BaseException:
            with contextlib.suppress(OSError):  # before the swap: moved entries go back, the new files go
                if self.tmp.is_dir():
                    _drain(self.tmp, d, self.names)
                self.note.unlink(missing_ok=True)
            raise
        fsync_dir(d.parent)
        with contextlib.suppress(OSError):  # the new set is in place; what is left is cleared next time
            for leftover in (self.tmp, self.old):
                if leftover.is_dir():
                    _drain(leftover, d, self.names)
            self.note.unlink()
        return [name for name in remove if name in existing]

    def _write_new(self, files: Mapping[str, Data], mode: int | None) -> None:
        os.mkdir(self.tmp)
        if mode is not None:
            os.chmod(self.tmp, mode)  # the directory's own permissions, as the user set them
        for name, data in files.items():
            with create_temp(self.tmp / name) as f:
                _write_into(f, data)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(self.tmp)

    def _write_note(self) -> None:
        """The set's names, beside the directory, before any entry moves: the recovery's guide. A
        note cut short by a kill means nothing had moved yet."""
        with create_temp(self.note) as f:
            f.write(json.dumps({"names": sorted(self.names)}).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.directory.parent)

    def _swap_in(self) -> None:
        if _exchange(self.tmp, self.directory):
            return
        os.rename(self.directory, self.old)  # no atomic exchange here: absent for a moment, never mixed
        try:
            os.rename(self.tmp, self.directory)
        except BaseException:
            os.rename(self.old, self.directory)
            raise


def _entries(directory: Path) -> dict[str, bool]:
    """Name -> is a directory (not a link to one), for every entry of `directory`."""
    with os.scandir(directory) as it:
        return {e.name: e.is_dir(follow_symlinks=False) for e in it}


def _drain(leftover: Path, directory: Path, names: set[str] | None) -> None:
    """Empty a temp or old directory of `replace_files`: files of the set (`names`; None: all, when
    no entry was ever moved in) are deleted, any other entry goes back into `directory` unless
    that name is taken there (then it stays, and so does `leftover`)."""
    for name, is_dir in _entries(leftover).items():
        if (names is None or name in names) and not is_dir:
            os.unlink(leftover / name)
        elif not os.path.lexists(directory / name):
            os.rename(leftover / name, directory / name)
    with contextlib.suppress(OSError):
        os.rmdir(leftover)


def recover_replacements(directory: str | os.PathLike) -> None:
    """Finish what `replace_files` calls for `directory` left when their process died: the old
    directory is put back where the new one never arrived, entries moved across go back, and
    the temp directories and notes go. Entries of live writers are left alone."""
    directory = Path(os.path.realpath(directory))
    parent = directory.parent
    stale: set[str] = set()  # .NAME.tk-PID-RANDOM of dead writers
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            match = _SWAP.match(entry.name)
            if match and match.group(1) == directory.name:
                pid = int(match.group(2))
                if pid != os.getpid() and not _alive(pid):
                    stale.add(entry.name[: -len(match.group(4)) - 1])
    for stem in sorted(stale):
        tmp, old, note = (parent / f"{stem}.{suffix}" for suffix in ("tmp", "old", "swap"))
        names: set[str] | None = None  # no note, or one cut short: nothing had moved in, all is ours
        with contextlib.suppress(FileError, OSError, ValueError, KeyError, TypeError):
            names = set(json.loads(_read_note(note))["names"])
        with contextlib.suppress(OSError):
            if not os.path.lexists(directory) and old.is_dir():
                os.rename(old, directory)  # killed between the two renames: the old one is whole
            for leftover in (tmp, old):
                if leftover.is_dir():
                    _drain(leftover, directory, names)
            if not tmp.exists() and not old.exists():
                note.unlink(missing_ok=True)


def _make_parents(path: Path) -> list[Path]:
    """Create `path` and its missing parents; returns those created, outermost first."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for made in reversed(missing):
        try:
            made.mkdir()
        except FileExistsError:
            pass
        except OSError as err:
            raise write_error(made, err) from None
    return list(reversed(missing))


@contextlib.contextmanager
def _serialised(parent: Path) -> Iterator[None]:
    """Hold an exclusive lock on `parent` (flock on the directory itself, where the system allows),
    so two writers never interleave their moves in it."""
    fd = None
    with contextlib.suppress(OSError):
        fd = os.open(parent, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.lru_cache(maxsize=1)
def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):  # not glibc, not Linux
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one step; False where the system or file system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


# --- files staged in a subdirectory, moved in together --------------------------------------------

_COMMIT_NOTE = ".commit"


def commit_staged(directory: str | os.PathLike, staged: str | os.PathLike, *, remove: Iterable[str] = ()) -> None:
    """Move the files of `staged` (a subdirectory of `directory` that one writer, holding the
    directory's lock, filled) into `directory` and delete the names in `remove` there, as one
    step that a kill cannot leave half done: a note of the moves is written first, and
    `recover_staged` finishes them after a crash. Until the note exists the staged files are not
    part of `directory`, and a crash leaves it as it was."""
    directory, staged = Path(directory), Path(staged)
    with os.scandir(staged) as it:
        names = sorted(e.name for e in it if e.is_file() and e.name != _COMMIT_NOTE and not _TEMP.match(e.name))
    note = {"move": names, "remove": sorted(set(remove) - set(names))}
    write_atomic(staged / _COMMIT_NOTE, json.dumps(note).encode("utf-8"))
    try:
        _finish_staged(directory, staged, note)
    except OSError as err:
        raise write_error(directory, err) from None


def recover_staged(directory: str | os.PathLike, staged: str | os.PathLike) -> str | None:
    """What a writer that died left in `staged`: its commit is finished when its note was written
    ("committed"), else its files are removed ("discarded"); None when there is nothing. Call it
    holding the directory's lock."""
    directory, staged = Path(directory), Path(staged)
    if not staged.is_dir():
        return None
    try:
        note = json.loads(_read_note(staged / _COMMIT_NOTE))
        moves, removes = list(note["move"]), list(note["remove"])
    except (FileError, OSError, ValueError, KeyError, TypeError):  # no note (a rename writes it whole): never committed
        discard_staged(staged)
        return "discarded"
    _finish_staged(directory, staged, {"move": moves, "remove": removes})
    return "committed"


def _finish_staged(directory: Path, staged: Path, note: dict) -> None:
    for name in note["remove"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / Path(name).name)
    for name in note["move"]:
        name = Path(name).name
        if os.path.lexists(staged / name):  # else moved before a crash
            os.replace(staged / name, directory / name)
    fsync_dir(directory)
    discard_staged(staged)  # the note last: what a kill interrupts here is finished next time


def discard_staged(staged: str | os.PathLike) -> None:
    """Remove a staging directory and the files in it (all a writer's own: staged files and temps)."""
    staged = Path(staged)
    with contextlib.suppress(FileNotFoundError):
        with os.scandir(staged) as it:
            names = [e.name for e in it if not e.is_dir(follow_symlinks=False)]
        for name in sorted(names, key=lambda n: n == _COMMIT_NOTE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged / name)
        with contextlib.suppress(OSError):
            os.rmdir(staged)
