"""Process hygiene: worker processes that never outlive their parent, and which signal stopped us.

`die_with_parent(parent_pid)` is called first thing in every worker process (BPE counting,
file encoding, training shards). Without it a worker whose parent is killed (SIGKILL, or
SIGTERM before this project handled it) is re-parented to init and waits forever on a queue
whose other end it holds itself, keeping its memory (~75 MB each).

`note_interrupt` / `noted_interrupt` remember which signal asked this process to stop (SIGINT,
SIGTERM, SIGHUP), so that the command line can exit with 128 + its number after the cleanup
that the signal's KeyboardInterrupt, or the training loop's stop flag, ran.

What this module deliberately does not do: install signal handlers in the parent (cli/main.py
and pipeline/train.py do, each for its own scope), or kill or reap anyone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent", "note_interrupt", "noted_interrupt"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # libc's symbols, in this process already
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()  # looked up once, in the parent: a forked child finds it ready


def die_with_parent(parent_pid: int) -> None:
    """Make this (child) process die with SIGKILL as soon as `parent_pid`, its parent, dies.

    Call it first thing in a child, with the pid the parent had (`os.getpid()` there, before
    starting the child). On Linux it sets PR_SET_PDEATHSIG; if the parent already died before
    that (the race it cannot close by itself), the child exits at once with status 1.
    The kernel sends the signal when the *thread* that created the child exits, so start
    children from a thread that outlives them (the main thread, in `tk`).

    It also gives SIGTERM and SIGHUP back their default action (death): a forked child inherits
    the parent's handlers, which turn them into KeyboardInterrupt for the parent's cleanup, and a
    worker has no cleanup of its own (its parent terminates it with SIGTERM).

    Where prctl is unavailable (not Linux) it only resets those two handlers: no death signal.
    It does not ignore SIGINT (a terminal's Ctrl-C reaches the whole process group; each pool
    decides) and does not help children of children (the death signal is not inherited).
    """
    for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    if _prctl is None:
        return
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # e.g. a seccomp filter refused it: we run on as before, without the guarantee
    if os.getppid() != parent_pid:  # the parent died before the prctl: no signal will come
        os._exit(1)


_noted: int | None = None


def note_interrupt(signum: int | None) -> None:
    """Remember that signal `signum` asked this process to stop (None forgets it)."""
    global _noted
    _noted = signum


def noted_interrupt() -> int | None:
    """The signal last given to `note_interrupt`, or None."""
    return _noted
