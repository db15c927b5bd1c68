"""A run directory belongs to one process at a time, and a run never takes another run's files.

`RunDir(path)` is a context manager around the run: it creates the directory if needed, takes an
exclusive advisory lock (`fcntl.flock` on `.tk.lock` inside it, removed again when the run ends)
for the whole run, and only then removes the temp files of writers that died mid-write
(`common.atomic`'s names; nothing else). A second process gets one line naming the holder's PID;
the kernel drops the lock of a process that dies, so a stale lock file never blocks. Worker
processes close their inherited copy of the lock at fork. Taking the lock again in the same
process nests (the pipeline holds it while it calls `train_model`).

`refuse_conflicts(...)` names the files of another run that a fresh run would replace: callers
refuse to start unless the user asked to overwrite (`RunDir.replaced`). A first run that stopped
before its first checkpoint (`stopped_first_run`) is not another run: the same command started
again replaces it. When the run fails before it wrote anything, a directory this process created is removed
again, so a failed first run leaves nothing behind.

A fresh run that replaces another's files writes its own into `checkpoint.STAGED_DIR` inside the
directory (`NewRun`) and moves them in at its first checkpoint, as one step that survives a kill
(`common.staging.commit_staged`): until then the directory holds the old run whole. Taking the
lock finishes such a step that a killed process began, or drops the staged files of a run that
never reached its first checkpoint, before anything else reads the directory.

What it deliberately does not do: read or write the run's files (checkpoint.py does).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path

from tokenkit.common import FileError, atomic, readfile, staging
from tokenkit.pipeline import checkpoint, trainlog
from tokenkit.pipeline.errors import PipelineError

try:
    import fcntl
except ModuleNotFoundError:  # pragma: no cover - not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".tk.lock"
# Every file a run writes; a fresh run refuses a directory holding any of them (unless overwriting).
RUN_FILES = (
    checkpoint.MODEL_FILE,
    checkpoint.STATE_FILE,
    checkpoint.LOG_FILE,
    checkpoint.TOKENIZER_FILE,
    checkpoint.TOKENS_FILE,
    checkpoint.VAL_TOKENS_FILE,
    checkpoint.TOKENS_META_FILE,
    checkpoint.PIPELINE_FILE,
    checkpoint.CORPUS_STREAM_FILE,
    checkpoint.VAL_STREAM_FILE,
    checkpoint.EVAL_FILE,
)

# What every fresh run writes (one trained without a given tokenizer its tokenizer.json too): another run's are refused.
TRAINED_FILES = (checkpoint.MODEL_FILE, checkpoint.STATE_FILE, checkpoint.LOG_FILE, checkpoint.EVAL_FILE)

# A run that saved either can be resumed; the log and the token cache's record are written by tk alone.
CHECKPOINT_FILES = (checkpoint.MODEL_FILE, checkpoint.STATE_FILE)
# `tk pipeline --chat`'s RUN (pipeline/chat_pipeline.py): two runs in subdirectories and its own records
BASE_DIR, CHAT_DIR, CHAT_STAMP, ACCURACY_FILE = "base", "chat", "chat.json", "accuracy.json"
CHAT_ROAD_FILES = (BASE_DIR, CHAT_DIR, CHAT_STAMP, ACCURACY_FILE)
_RUN_MARKS = (checkpoint.LOG_FILE, checkpoint.TOKENS_META_FILE)


class RunDirBusy(PipelineError):
    """The run directory is locked by another process (`who`: "process PID", when it wrote its PID)."""

    def __init__(self, path: Path, who: str) -> None:
        super().__init__(
            f"run directory {path} is in use by {who} (another tk run); wait for it to finish or choose another -o"
        )
        self.who = who


_held: dict[str, list] = {}  # real path -> [lock fd, nesting depth]: this process's locks


def _close_inherited_locks() -> None:
    for fd, _ in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    # a forked worker must not keep a run locked after its parent is gone
    os.register_at_fork(after_in_child=_close_inherited_locks)


class RunDir:
    """The run directory `path`, locked by this process while the `with` block runs."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.created = False
        self._key: str | None = None

    def __enter__(self) -> RunDir:
        path = self.path
        if os.path.islink(path) and not path.exists():  # mkdir would say "File exists"
            raise PipelineError(
                f"run directory {readfile.describe_missing(path)}; remove the link or choose another -o"
            )
        if path.exists() and not path.is_dir():
            kind = readfile.kind_of(os.stat(path).st_mode)
            raise PipelineError(f"run directory {path} is {kind}; give a directory path with -o")
        if not path.exists():
            try:
                path.mkdir(parents=True)
                self.created = True
            except FileExistsError:
                pass
            except OSError as err:
                raise PipelineError(f"cannot create run directory {path} ({err.strerror}); choose another -o") from None
        self._key = os.path.realpath(path)
        held = _held.get(self._key)
        if held is not None:
            held[1] += 1
            return self
        fd = self._lock()
        _held[self._key] = [fd, 1]
        try:  # a killed run's new files: moved in if it had committed them, else dropped
            staging.recover_staged(path, path / checkpoint.STAGED_DIR)
        except OSError as err:
            self.__exit__(type(err), err, None)
            raise PipelineError(
                f"{path}: cannot finish or undo what a killed run left in {checkpoint.STAGED_DIR} ({err.strerror}); "
                "check the directory's permissions and free space"
            ) from None
        atomic.remove_stale_temps(path)
        return self

    def _lock(self) -> int:
        lock_path = self.path / LOCK_FILE
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            except OSError as err:
                self._undo_create()
                if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise PipelineError(
                        f"run directory {self.path} is not writable ({err.strerror}); choose another -o"
                    ) from None
                raise PipelineError(f"cannot lock run directory {self.path} ({err.strerror})") from None
            if fcntl is None:
                return fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = ""
                with contextlib.suppress(OSError):
                    holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                os.close(fd)
                who = f"process {holder}" if holder.isdigit() else "another process"
                raise RunDirBusy(self.path, who) from None
            # the holder before us unlinks the file when it is done: lock the file that is there now
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def __exit__(self, *exc) -> None:
        held = _held.get(self._key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _held[self._key]
        # while still locked: a process waiting on this file sees it replaced and locks the new one
        with contextlib.suppress(OSError):
            os.unlink(self.path / LOCK_FILE)
        if exc[0] is not None:
            self._undo_create()
        os.close(held[0])

    def _undo_create(self) -> None:
        """A directory this process created and left empty goes again."""
        if not self.created:
            return
        with contextlib.suppress(OSError):
            os.rmdir(self.path)  # only when empty

    def present(self, names=RUN_FILES) -> list[str]:
        """Which of `names` exist in the directory."""
        return [name for name in names if (self.path / name).exists()]

    def stopped_first_run(self) -> str | None:
        """Where the run in the directory stopped ("at step 3"; "" when its log does not say),
        when it stopped before its first checkpoint (diverged, or killed) and so left no model
        and no training state, only its log, token cache and tokenizer; else None.

        Such a directory holds nothing to resume: `tk train-model` started again takes it as
        its own, and `--resume` says to do that. (Ctrl-C saves a checkpoint at any step.)
        """
        if self.present(CHECKPOINT_FILES) or not self.present(_RUN_MARKS):
            return None
        try:
            records = trainlog.read_log(self.path / checkpoint.LOG_FILE)
        except (OSError, UnicodeDecodeError):
            records = []
        steps = [r["step"] for r in records if isinstance(r, dict) and type(r.get("step")) is int]
        return f"at step {max(steps)}" if steps and max(steps) > 0 else ""

    def replaced(self, own: list[str] | tuple[str, ...], overwrite: bool, say: Callable[[str], None]) -> bool:
        """Whether a fresh run here replaces the files it finds: `overwrite`, or a first run that
        stopped before its first checkpoint (said: the new run takes its place). Otherwise one
        line (`refuse_conflicts`) when the directory holds any of `own` (the files the run writes)."""
        stopped = self.stopped_first_run()  # nothing to resume there: this run takes its place (staged)
        if stopped is not None:
            say(
                f"{self.path} holds a run that stopped {stopped or 'early'}, before its first checkpoint: "
                "starting again"
            )
            return True
        if not overwrite:
            refuse_conflicts(self.path, self.present(own))
        return overwrite


class NewRun:
    """Where a fresh run writes its files: the run directory itself, or, when the run replaces
    another run's files (`staged`), `checkpoint.STAGED_DIR` inside it until `commit` moves them
    in at the first checkpoint and removes the old run's model and training state. Until then
    the directory holds the old run whole; a run that stops before its first checkpoint leaves
    it so (`discard`, or the next lock after a kill)."""

    def __init__(self, run_dir: Path, *, staged: bool) -> None:
        self.run_dir = run_dir
        self.dir = run_dir / checkpoint.STAGED_DIR if staged else run_dir
        if staged:
            staging.recover_staged(run_dir, self.dir)  # none: the lock's recovery ran
            try:
                self.dir.mkdir()
            except OSError as err:
                raise PipelineError(
                    f"cannot create {self.dir} ({err.strerror}); check the run directory's permissions"
                ) from None

    @property
    def staged(self) -> bool:
        """True until the new files are in the run directory."""
        return self.dir != self.run_dir

    def commit(self) -> None:
        """At a checkpoint: the staged files replace the old run's, in one step."""
        if not self.staged:
            return
        try:
            # the old run's model and state go even when the new run has none yet (no finite evaluation), and
            # the evaluations of its model (tk eval's) with them
            remove = (checkpoint.MODEL_FILE, checkpoint.STATE_FILE, checkpoint.EVAL_FILE)
            staging.commit_staged(self.run_dir, self.dir, remove=remove)
        except FileError as err:
            raise PipelineError(str(err)) from None
        self.dir = self.run_dir

    def discard(self) -> None:
        """The run stopped before its first checkpoint: its staged files go, the old run stays (a
        commit that failed midway is finished instead, as after a kill)."""
        if self.staged:
            with contextlib.suppress(OSError):  # else the next lock finishes it
                staging.recover_staged(self.run_dir, self.dir)


def refuse_conflicts(run_dir: Path, names: list[str], *, what: str = "another run") -> None:
    """One line when a fresh run would replace `names` (files of `what`)."""
    if names:
        listed = ", ".join(names)
        raise PipelineError(
            f"{run_dir} already holds files of {what} ({listed}); continue it with --resume, "
            "choose another -o, or pass --overwrite to replace them"
        )
