"""A directory's set of files replaced as one: a reader, a crash or a kill finds the whole old set
or the whole new one.

`replace_files` (an export: config.json beside the weights it describes) writes the new set into
a sibling temp directory, which then takes the directory's place in one rename (Linux's
RENAME_EXCHANGE; elsewhere two renames, between which the directory is briefly absent, never
mixed). The directory's other entries are moved across first and survive; a writer killed
midway leaves a note (`.NAME.tk-PID-RANDOM.swap`) beside the directory, and the next
`replace_files` for it puts back what had been moved and removes the rest
(`recover_replacements`).

A directory that cannot be renamed (a mount point: an empty tmpfs, a Docker volume, whose
rename is EBUSY and across whose edge nothing moves, EXDEV; or one in a parent tk may not write)
has its contents replaced instead: the new set is written into a hidden staging subdirectory
(`.tk-replace-PID-RANDOM`), which `common.staging` then moves into place file by file after a
note of the moves (its `.commit`). A crash or a full disk still leaves the whole old set or,
once the note is written, the whole new one after the next call; but a reader during those
renames (milliseconds) may find some files of each, and can tell by the staging subdirectory
holding its note.

What it deliberately does not do: write one file (`atomic`, whose temps, fsyncs and one-line
errors it uses), move staged files in (`staging` does, for a locked run directory too), or lock
a run directory (that lock is `pipeline.rundir`'s; `replace_files` only
serialises writers of one parent directory while it swaps).
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
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

try:
    import fcntl
except ModuleNotFoundError:  # pragma: no cover - not POSIX: writers of one parent are not serialised
    fcntl = None  # type: ignore[assignment]

from tokenkit.common import atomic, readfile, staging
from tokenkit.common.errors import FileError

# replace_files' temp directory (.tmp), the old directory set aside (.old) and the note (.swap)
_SWAP = re.compile(r"^\.(.+)\.tk-(\d+)-([0-9a-f]{8})\.(tmp|old|swap)$")
# the staging subdirectory of a directory replaced in place (a mount point)
_IN_PLACE = re.compile(r"^\.tk-replace-(\d+)-[0-9a-f]{8}$")
_MOUNTINFO = "/proc/self/mountinfo"
_MOUNTINFO_LIMIT = 64 * readfile.MIB  # ~150 bytes a mount


def replace_files(
    directory: str | os.PathLike, files: Mapping[str, atomic.Data], *, remove: Iterable[str] = ()
) -> list[str]:
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

    A directory that cannot be renamed (`_swappable`) gets its files replaced in place instead
    (`_replace_in_place`): the same end, all old or all new after a crash, but a reader during
    the moves may find some of each.

    Returns the names of `remove` that were there. A failure is a one-line FileError, the
    directory as it was; a killed writer's leftovers are cleared by the next call for the same
    directory (`recover_replacements`).
    """
    check_output_dir(directory)  # before realpath, which would make a dangling link's missing target
    directory = Path(os.path.realpath(directory))
    names = set(files) | set(remove)
    for name in names:
        if not name or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"replace_files: {name!r} is not a plain file name")
    created = _make_parents(directory.parent)
    try:
        with _serialised(directory.parent):
            recover_replacements(directory)
            if directory.is_dir() and not _swappable(directory):
                return _replace_in_place(directory, names, files, remove)
            try:
                return _Swap(directory, names).run(files, remove)
            except OSError as err:  # undone: a mount point the mount table did not name, say
                if err.errno not in (errno.EBUSY, errno.EXDEV) or not directory.is_dir():
                    raise
            return _replace_in_place(directory, names, files, remove)
    except OSError as err:
        raise atomic.write_error(directory, err) from None
    finally:
        if not directory.exists():
            for made in reversed(created):  # a failed first write leaves no directory it made
                with contextlib.suppress(OSError):
                    made.rmdir()


def check_output_dir(directory: str | os.PathLike) -> None:
    """One-line FileError unless `directory` is a place for `replace_files` to write: a directory
    (or a link to one) or a new name. Commands call it before any work; it also clears what a
    killed replacement in place left inside the directory (its staging subdirectory: `.tk-...`),
    so that the command finds the directory as that replacement's all-old or all-new end."""
    given = Path(directory)
    if os.path.islink(given) and not given.exists():  # realpath would make its missing target, silently
        raise FileError(f"{readfile.describe_missing(given)}; remove the link or give another directory")
    try:
        mode = os.stat(given).st_mode
    except OSError:
        return
    if not stat.S_ISDIR(mode):
        raise FileError(f"{given}: is {readfile.kind_of(mode)}, not a directory; give a directory")
    real = Path(os.path.realpath(given))
    with _serialised(real.parent):
        _recover_in_place(real)


class _Swap:
    """One `replace_files` call: its temp directory, note and moved entries, for undoing."""

    def __init__(self, directory: Path, names: set[str]) -> None:
        self.directory = directory
        self.names = names  # the set: what the new directory gets, and what the old one loses
        stem = directory.with_name(f".{directory.name}.tk-{os.getpid()}-{secrets.token_hex(4)}")
        self.tmp, self.old, self.note = (Path(f"{stem}.{suffix}") for suffix in ("tmp", "old", "swap"))

    def run(self, files: Mapping[str, atomic.Data], remove: Iterable[str]) -> list[str]:
        d = self.directory
        existing = _entries(d) if d.is_dir() else None
        _check_set(d, self.names, existing or {})
        try:
            self._write_new(files, None if existing is None else stat.S_IMODE(os.stat(d).st_mode))
            if existing is None:
                os.rename(self.tmp, d)  # nothing to keep: the new directory appears whole
                atomic.fsync_dir(d.parent)
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
        atomic.fsync_dir(d.parent)
        with contextlib.suppress(OSError):  # the new set is in place; what is left is cleared next time
            for leftover in (self.tmp, self.old):
                if leftover.is_dir():
                    _drain(leftover, d, self.names)
            self.note.unlink()
        return [name for name in remove if name in existing]

    def _write_new(self, files: Mapping[str, atomic.Data], mode: int | None) -> None:
        os.mkdir(self.tmp)
        if mode is not None:
            os.chmod(self.tmp, mode)  # the directory's own permissions, as the user set them
        _write_files(self.tmp, files)

    def _write_note(self) -> None:
        """The set's names, beside the directory, before any entry moves: the recovery's guide. A
        note cut short by a kill means nothing had moved yet."""
        with atomic.create_temp(self.note) as f:
            f.write(json.dumps({"names": sorted(self.names)}).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        atomic.fsync_dir(self.directory.parent)

    def _swap_in(self) -> None:
        if _exchange(self.tmp, self.directory):
            return
        os.rename(self.directory, self.old)  # no atomic exchange here: absent for a moment, never mixed
        try:
            os.rename(self.tmp, self.directory)
        except BaseException:
            os.rename(self.old, self.directory)
            raise


def _check_set(directory: Path, names: set[str], existing: Mapping[str, bool]) -> None:
    """One-line FileError, before anything is written, where a name of the set is a directory or
    a device, FIFO or socket (refused, never replaced)."""
    for name in sorted(names & set(existing)):
        if existing[name]:
            raise FileError(f"{directory / name} is a directory where a file goes; move it away or write elsewhere")
        atomic.check_output(directory / name)


def _write_files(folder: Path, files: Mapping[str, atomic.Data]) -> None:
    """Write `files` into the new, empty `folder`, each and the folder made durable."""
    for name, data in files.items():
        with atomic.create_temp(folder / name) as f:
            atomic.write_into(f, data)
            f.flush()
            os.fsync(f.fileno())
    atomic.fsync_dir(folder)


def _swappable(directory: Path) -> bool:
    """Whether the existing `directory` can be replaced by renames in its parent: not a mount
    point (rename(2) refuses to move one, EBUSY, and moves nothing across its edge, EXDEV; a
    bind mount of the same file system, as Docker's volumes, is named only by the mount table)
    and in a parent this process may write."""
    if os.path.ismount(directory) or os.fsencode(directory) in _mount_points():
        return False
    return os.access(directory.parent, os.W_OK | os.X_OK)


def _mount_points() -> set[bytes]:
    """The mount points of this process's mount table (Linux's /proc/self/mountinfo, its fifth
    field, octal escapes undone); empty elsewhere."""
    try:
        with open(_MOUNTINFO, "rb") as f:
            table = f.read(_MOUNTINFO_LIMIT)
    except OSError:
        return set()
    unescape = functools.partial(re.compile(rb"\\([0-7]{3})").sub, lambda m: bytes([int(m.group(1), 8) & 0xFF]))
    return {unescape(fields[4]) for fields in map(bytes.split, table.splitlines()) if len(fields) > 4}


def _replace_in_place(
    directory: Path, names: set[str], files: Mapping[str, atomic.Data], remove: Iterable[str]
) -> list[str]:
    """`replace_files` for a directory that cannot be renamed: the new set is written into a
    staging subdirectory (`.tk-replace-PID-RANDOM`), then `staging.commit_staged` notes the moves
    and makes them (the names in `remove` deleted, the new files renamed over the old). A failure
    before the note leaves the directory as it was and no staging folder; after it, the moves
    are finished (now, or by the next call's `recover_replacements`). The directory's other
    entries are never touched."""
    existing = _entries(directory)
    _check_set(directory, names, existing)
    staged = directory / f".tk-replace-{os.getpid()}-{secrets.token_hex(4)}"
    os.mkdir(staged)
    try:
        _write_files(staged, files)
        staging.commit_staged(directory, staged, remove=[name for name in remove if name not in files])
    except BaseException:
        with contextlib.suppress(OSError):  # no note: the staged files go; a note: the moves are finished
            staging.recover_staged(directory, staged)
        raise
    return [name for name in remove if name in existing]


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
    the temp directories and notes go; in a directory replaced in place, a staging subdirectory
    with its note is moved in, one without is removed (`staging.recover_staged`). Entries of
    live writers are left alone."""
    directory = Path(os.path.realpath(directory))
    _recover_in_place(directory)
    parent = directory.parent
    stale: set[str] = set()  # .NAME.tk-PID-RANDOM of dead writers
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            match = _SWAP.match(entry.name)
            if match and match.group(1) == directory.name:
                pid = int(match.group(2))
                if pid != os.getpid() and not atomic.alive(pid):
                    stale.add(entry.name[: -len(match.group(4)) - 1])
    for stem in sorted(stale):
        tmp, old, note = (parent / f"{stem}.{suffix}" for suffix in ("tmp", "old", "swap"))
        names: set[str] | None = None  # no note, or one cut short: nothing had moved in, all is ours
        with contextlib.suppress(FileError, OSError, ValueError, KeyError, TypeError):
            names = set(json.loads(atomic.read_note(note))["names"])
        with contextlib.suppress(OSError):
            if not os.path.lexists(directory) and old.is_dir():
                os.rename(old, directory)  # killed between the two renames: the old one is whole
            for leftover in (tmp, old):
                if leftover.is_dir():
                    _drain(leftover, directory, names)
            if not tmp.exists() and not old.exists():
                note.unlink(missing_ok=True)


def _recover_in_place(directory: Path) -> None:
    """Finish or undo (`staging.recover_staged`) the staging subdirectories that dead writers of
    `_replace_in_place` left in `directory`."""
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            match = _IN_PLACE.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                pid = int(match.group(1))
                if pid != os.getpid() and not atomic.alive(pid):
                    staging.recover_staged(directory, directory / entry.name)


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
            raise atomic.write_error(made, err) from None
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
