"""Process hygiene: worker processes that never outlive their parent, and which signal stopped us.

`die_with_parent(parent_pid)` is called first thing in every worker process (BPE counting,
file encoding, training shards). Without it a worker whose parent is killed (SIGKILL, or
SIGTERM before this project handled it) is re-parented to init and waits forever on a queue
whose other end it holds itself, keeping its memory (~75 MB each). It also makes the worker
deaf to Ctrl-C: a terminal sends SIGINT to the whole process group, and a worker's
KeyboardInterrupt would print its own traceback; the parent stops its workers instead.

`signals_held()` surrounds the starting of workers in the parent: SIGINT, SIGTERM and SIGHUP
wait (blocked, not lost) until it ends, so that a child forked meanwhile cannot receive one
before `die_with_parent` ran, and the parent receives its own right after.

`note_interrupt` / `noted_interrupt` remember which signal asked this process to stop (SIGINT,
SIGTERM, SIGHUP), so that the command line can exit with 128 + its number after the cleanup
that the signal's KeyboardInterrupt, or the training loop's stop flag, ran; `stopped_line` says it
in words. `hold_interrupts` asks the command line's handler to only note a signal for a while: an
MPI rank must not stop before it has joined the others (`common.mpi.end_together` takes the held
one then).

`MAX_WORKERS` bounds how many workers one command may start, and `bad_worker_count` says what is
wrong with a requested number, before any work (`default_workers`: the cores this process has).

What this module deliberately does not do: install signal handlers in the parent (cli/main.py
and pipeline/train.py do, each for its own scope), or kill or reap anyone.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "STOP_SIGNALS",
    "die_with_parent",
    "hold_interrupts",
    "holding_interrupts",
    "note_interrupt",
    "noted_interrupt",
    "signals_held",
    "stopped_line",
    "take_held_interrupt",
]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


_UNSET = object()
_prctl_found = _UNSET  # libc's prctl, looked up once (in the parent, by signals_held: a forked child finds it)


def _prctl():
    """libc's prctl, or None where there is none; ctypes is imported on first use, not when `tk`
    starts (cli/main.py imports this module before its signal handlers are in place)."""
    global _prctl_found
    if _prctl_found is _UNSET:
        _prctl_found = None
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                _prctl_found = ctypes.CDLL(None, use_errno=True).prctl  # libc's symbols, in this process already
            except (OSError, AttributeError):
                pass
    return _prctl_found


def die_with_parent(parent_pid: int, *, ignore_stop: bool = False) -> None:
    """Make this (child) process die with SIGKILL as soon as `parent_pid`, its parent, dies.

    Call it first thing in a child, with the pid the parent had (`os.getpid()` there, before
    starting the child). On Linux it sets PR_SET_PDEATHSIG; if the parent already died before
    that (the race it cannot close by itself), the child exits at once with status 1.
    The kernel sends the signal when the *thread* that created the child exits, so start
    children from a thread that outlives them (the main thread, in `tk`).

    It also ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the parent
    stops its workers, which have nothing of their own to clean up) and gives SIGTERM and SIGHUP
    back their default action, death without a word: a forked child inherits the parent's
    handlers, which turn them into KeyboardInterrupt for the parent's cleanup. With
    `ignore_stop` it ignores those two as well, for a pool whose parent goes on using it after
    it got one (training ends its step first) and ends its workers with SIGKILL. Then it
    unblocks the three, which `signals_held` in the parent kept blocked across the fork.

    Where prctl is unavailable (not Linux) it only sets those handlers: no death signal. It
    does not help children of children (the death signal is not inherited).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in STOP_SIGNALS[1:]:
        signal.signal(signum, signal.SIG_IGN if ignore_stop else signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    prctl = _prctl()
    if prctl is None:
        return
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # e.g. a seccomp filter refused it: we run on as before, without the guarantee
    if os.getppid() != parent_pid:  # the parent died before the prctl: no signal will come
        os._exit(1)


@contextmanager
def signals_held() -> Iterator[None]:
    """Block SIGINT, SIGTERM and SIGHUP in this thread while it starts worker processes.

    A child forked (or spawned: the mask survives exec) inside starts with them blocked, and
    `die_with_parent` ignores or resets them before it unblocks them: no signal can reach a
    worker before it is quiet. One that arrives meanwhile waits, and this process gets it when
    the block ends (or at once through another thread of its own, which never forks).
    """
    _prctl()
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no masks, and spawn starts workers afresh
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_noted: int | None = None


def note_interrupt(signum: int | None) -> None:
    """Remember that signal `signum` asked this process to stop (None forgets it)."""
    global _noted
    _noted = signum


def noted_interrupt() -> int | None:
    """The signal last given to `note_interrupt`, or None."""
    return _noted


_holding = False


def hold_interrupts(hold: bool) -> None:
    """Whether `tk`'s stop handler (cli/main.py) only notes a signal (True) or raises
    KeyboardInterrupt at once (False, the default)."""
    global _holding
    _holding = hold


def holding_interrupts() -> bool:
    """Whether signals are held (see hold_interrupts)."""
    return _holding


def take_held_interrupt() -> int | None:
    """End the hold; the signal that came meanwhile (None if none did, or nothing was held)."""
    global _holding
    held, _holding = _holding, False
    return _noted if held else None


def stopped_line() -> str:
    """What `tk` says when the noted signal stopped it: `interrupted` (Ctrl-C, or none noted) or
    `terminated (SIGTERM)`."""
    signum = _noted
    return "interrupted" if signum in (None, signal.SIGINT) else f"terminated ({signal.Signals(signum).name})"


MAX_WORKERS = 1024  # processes one command may start (each holds its own text pieces or gradients)


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def bad_worker_count(workers) -> str | None:
    """What is wrong with `workers` as a number of processes (an int in [1, MAX_WORKERS]), or None:
    the caller raises its own error with it."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        return f"workers must be an integer from 1 to {MAX_WORKERS}, got {workers!r}"
    return None
