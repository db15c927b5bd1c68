"""A run's training log, log.jsonl: one JSON object per step, evaluation and session, appended
and flushed as training goes (`JsonlLog`), cut back to a checkpoint's step when a run resumes
(`truncate_log`), and read whole (`read_log`) or followed as it grows (`read_log_from`).

The log is diagnostics, not a checkpoint: damaged lines are dropped and said, never a reason to
stop a run, and identical runs differ only here (wall-clock times live in the log alone).

What it deliberately does not do: decide what a record holds (pipeline/train.py writes them),
or write the run's other files (pipeline/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkit.common import FileError, atomic, jsonsafe, readfile
from tokenkit.pipeline.checkpoint import write_bytes
from tokenkit.pipeline.errors import PipelineError


class JsonlLog:
    """Appends one JSON object per line to `log.jsonl`, flushed after every record.

    The log is not a checkpoint: after a crash it may run ahead of the last checkpoint, so a
    resumed run first cuts it back with `truncate_log(path, step)` — the resumed log then reads
    exactly like the log of an uninterrupted run.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 — closed in close()
        except OSError as err:
            raise PipelineError(str(atomic.write_error(self.path, err))) from None

    def write(self, record: Mapping[str, Any]) -> None:
        try:
            self._f.write(json.dumps(record, sort_keys=True) + "\n")
            self._f.flush()
        except OSError as err:  # a full disk: the log names itself, as every other file does
            raise PipelineError(str(atomic.write_error(self.path, err))) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):  # only a record whose write already failed (and said so) is lost
            self._f.close()


MAX_LOG_LINE = 1 << 20  # a record is ~150 bytes; a longer line is damage
MAX_STEP = 2**63 - 1  # steps are int64 wherever they are kept; a larger one is damage
LOG_ADVICE = "move it away: tk keeps a run's training log (log.jsonl) there"


def truncate_log(path: str | os.PathLike, step: int) -> str | None:
    """Keep only the log records of steps <= `step`. A damaged line (not UTF-8, not a JSON object,
    a step that is not a whole number below 2**63, over MAX_LOG_LINE bytes) is dropped too, and said in the
    one-line note returned (None when there was none); a torn last line (a kill mid-write) is
    dropped silently. The log is diagnostics: the checkpoint, not the log, decides where a run
    resumes, so damage there never stops a resume. A log that is not a regular file is refused."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    damaged: list[tuple[int, str]] = []
    lines = _log_lines(path)
    first = next(lines, None)  # opens the log: one that is not a regular file is refused before any write

    def keep(out) -> None:
        for lineno, line, record, why in itertools.chain([first] if first else [], lines):
            if record is None:
                if why:
                    damaged.append((lineno, why))
            elif record.get("step", 0) <= step:
                out.write(line if line.endswith(b"\n") else line + b"\n")

    write_bytes(path, keep)
    if not damaged:
        return None
    lineno, why = damaged[0]
    more = f" and {len(damaged) - 1} more" if len(damaged) > 1 else ""
    return f"warning: {path}: dropped damaged line {lineno} ({why}){more}; the run resumes from its checkpoint"


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a `log.jsonl`; damaged lines and a torn last line are skipped."""
    return [record for _, _, record, _ in _log_lines(Path(path)) if record is not None]


def _log_lines(path: Path) -> Iterator[tuple[int, bytes, dict[str, Any] | None, str]]:
    """(line number, the line, its record or None, why it is none: "" for a torn last line) of a log."""
    try:
        with readfile.open_regular(path, readfile.LOG_LIMIT, "a training log", LOG_ADVICE) as (f, _):
            for lineno, (line, record, why) in enumerate(_records(f), 1):
                yield lineno, line, record, why
    except FileError as err:
        raise PipelineError(str(err)) from None


def _records(f) -> Iterator[tuple[bytes, dict[str, Any] | None, str]]:
    """(the line, its record or None, why it is none: "" for a torn last line) of each line of an
    open log, from where it stands; a line longer than MAX_LOG_LINE is skipped whole (b"")."""
    while True:
        line = f.readline(MAX_LOG_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LOG_LINE:
            while line and not line.endswith(b"\n"):  # the rest of the long line
                line = f.readline(MAX_LOG_LINE)
            yield b"", None, f"longer than {MAX_LOG_LINE:,} bytes"
            continue
        record, why = _log_record(line)
        torn = not line.endswith(b"\n") and record is None
        yield line, record, "" if torn else why


@dataclass
class LogTail:
    """What `read_log_from` read: the records of whole lines, the offset after the last of them,
    the file read ((st_dev, st_ino)), how many damaged lines were dropped, and whether it read
    from the start (a new file, or one shorter than the offset)."""

    records: list[dict[str, Any]]
    offset: int
    file_id: tuple[int, int]
    damaged: int
    restarted: bool


def read_log_from(
    path: str | os.PathLike,
    offset: int = 0,
    file_id: tuple[int, int] | None = None,
    take: Callable[[dict[str, Any]], None] | None = None,
) -> LogTail:
    """The records of a `log.jsonl` from byte `offset` on, when the file is still `file_id` and
    not shorter than `offset`; from its start otherwise (a resume cuts the log back by writing a
    new file, a new run replaces it). A last line without its newline is being written: it is
    left for the next read. Damaged lines are dropped and counted, as `read_log` drops them, so
    whoever follows a training log reads only what was appended since the last call. With
    `take`, each record goes to it as it is read and `records` stays empty (a million-line log
    as dicts would hold a gigabyte)."""
    try:
        with readfile.open_regular(path, readfile.LOG_LIMIT, "a training log", LOG_ADVICE) as (f, size):
            st = os.fstat(f.fileno())
            found = (st.st_dev, st.st_ino)
            restarted = found != file_id or size < offset or offset <= 0
            start = 0 if restarted else offset
            f.seek(start)
            records: list[dict[str, Any]] = []
            take = take or records.append
            damaged = 0
            end = start
            for line, record, why in _records(f):
                if line and not line.endswith(b"\n"):
                    break  # being written: read it whole next time
                end = f.tell()
                if record is not None:
                    take(record)
                elif why:
                    damaged += 1
            return LogTail(records, end, found, damaged, restarted)
    except FileError as err:
        raise PipelineError(str(err)) from None


def _log_record(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """A log line's record, or None and what is wrong with it (the JSON nesting is checked only
    on lines with enough brackets to nest too deep: `jsonsafe.loads`).

    >>> _log_record(b'{"step": 3, "loss": NaN}\\n')
    ({'step': 3, 'loss': nan}, '')
    >>> _log_record(b'{"step": "3"}\\n')
    (None, 'its step is not a whole number')
    """
    try:
        record = jsonsafe.loads(line, "the line")
    except FileError as err:
        return None, "not UTF-8 text" if "UTF-8" in str(err) else "not JSON"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    step = record.get("step", 0)
    if type(step) is not int or step < 0:
        return None, "its step is not a whole number"
    if step > MAX_STEP:
        return None, "its step is out of range"
    return record, ""
