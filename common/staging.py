"""Files staged in a subdirectory and moved into their directory together, as one step that a kill
cannot leave half done.

A directory that cannot be swapped whole (a locked run directory, others' files in it) gets a
set of files through a staging subdirectory that one writer, holding the directory's lock,
fills: `commit_staged` writes a note of the moves before making them (`finish_staged`), and
`recover_staged` finishes a noted commit or drops staged files that were never committed
(`discard_staged`).

It also serves `atomic_dir` for a directory that cannot be swapped (a mount point), in a
staging subdirectory of that call's own.

What it deliberately does not do: write one file (`atomic`), replace a directory's set of files
by swapping the directory (`atomic_dir`), or take the directory's lock (that is
`pipeline.rundir`'s, or `atomic_dir`'s: callers hold it).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenkit.common import atomic
from tokenkit.common.errors import FileError

_COMMIT_NOTE = ".commit"


def commit_staged(directory: str | os.PathLike, staged: str | os.PathLike, *, remove: Iterable[str] = ()) -> None:
    """Move the files of `staged` (a subdirectory of `directory` that one writer, holding the
    directory's lock, filled) into `directory` and delete the names in `remove` there, as one
    step that a kill cannot leave half done: a note of the moves is written first, and
    `recover_staged` finishes them after a crash. Until the note exists the staged files are not
    part of `directory`, and a crash leaves it as it was; once it does, the moves are the
    caller's to finish after an interruption (`recover_staged`). A reader of `directory` during
    the moves may find some files old and some new."""
    directory, staged = Path(directory), Path(staged)
    with os.scandir(staged) as it:
        names = sorted(
            e.name for e in it if e.is_file() and e.name != _COMMIT_NOTE and not atomic.TEMP_NAME.match(e.name)
        )
    for name in names:  # a device, FIFO or socket where a file goes is refused before anything moves
        atomic.check_output(directory / name)
    note = {"move": names, "remove": sorted(set(remove) - set(names))}
    atomic.write_atomic(staged / _COMMIT_NOTE, json.dumps(note).encode("utf-8"))
    try:
        finish_staged(directory, staged, note)
    except OSError as err:
        raise atomic.write_error(directory, err) from None


def recover_staged(directory: str | os.PathLike, staged: str | os.PathLike) -> str | None:
    """What a writer that died left in `staged`: its commit is finished when its note was written
    ("committed"), else its files are removed ("discarded"); None when there is nothing. Call it
    holding the directory's lock."""
    directory, staged = Path(directory), Path(staged)
    if not staged.is_dir():
        return None
    try:
        note = json.loads(atomic.read_note(staged / _COMMIT_NOTE))
        moves, removes = list(note["move"]), list(note["remove"])
    except (FileError, OSError, ValueError, KeyError, TypeError):  # no note (a rename writes it whole): never committed
        discard_staged(staged)
        return "discarded"
    finish_staged(directory, staged, {"move": moves, "remove": removes})
    return "committed"


def finish_staged(directory: Path, staged: Path, note: dict) -> None:
    """Make the moves and removals of a written note (`commit_staged`'s, or one a kill left), then
    remove the staging directory, the note last."""
    for name in note["remove"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / Path(name).name)
    for name in note["move"]:
        name = Path(name).name
        if os.path.lexists(staged / name):  # else moved before a crash
            os.replace(staged / name, directory / name)
    atomic.fsync_dir(directory)
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
