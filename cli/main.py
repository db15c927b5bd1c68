"""The `tk` entry point: how the process ends, whatever stops it.

`main(argv)` runs one command (the group and its one-line errors are `cli.commands`) and returns
its exit code: 0 ok, 1 a user error, 128 + the signal's number when one stopped it (130 Ctrl-C,
143 SIGTERM, 129 SIGHUP), said in one line: `interrupted` or `terminated (SIGTERM)`.
`entry()` is the process's own start (`tk`, `python -m tokenkit`, `python -m tokenkit.cli.main`).

Why this module imports almost nothing: a Ctrl-C must be one line from the first moment tk's
code runs. Its handlers are installed before `cli.commands` brings in click, NumPy and every
command (a few hundred milliseconds), so a signal while they load is a KeyboardInterrupt caught
here like any other. Before this module runs there is only the interpreter's own start (Python's
`site`, tens of milliseconds), whose interrupt is Python's to report.

What it deliberately does not do: parse flags or name errors (`cli.commands`), or stop worker
processes (each pool stops its own; they ignore SIGINT: `common.processes.die_with_parent`).
"""

from __future__ import annotations

import _thread
import functools
import os
import signal
import sys
import threading

from tokenkit.common.launcher import launched_rank, launched_size
from tokenkit.common.processes import (
    STOP_SIGNALS,
    hold_interrupts,
    holding_interrupts,
    note_interrupt,
    noted_interrupt,
    stopped_line,
)

_AGAIN_S = 0.01  # how long after a swallowed interrupt it is delivered again (a finalizer's return)
_decided: int | None = None  # main()'s exit code, once decided: `entry`'s late signal ends with it


def main(argv: list[str] | None = None) -> int:
    """Run `tk ARGV` (default: this process's arguments); returns the exit code (0 ok, 1 user
    error, 128 + the signal's number when stopped by one: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).

    SIGINT, SIGTERM and SIGHUP stop `tk` as a KeyboardInterrupt (temp files are removed and
    worker pools shut down on the way; training saves its state at the step boundary), from
    the loading of the commands on; one left ignored (nohup, a background job) stays ignored.
    Once the interrupt reached this function, further signals are ignored while its line is
    said. Under an MPI launcher a signal is only noted until the rank has joined the others
    (common.mpi.end_together raises it then) or runs a command without them (cli.commands): a
    rank that ended alone would leave the others waiting for it forever. The handlers are this
    call's only (main thread): the previous ones come back.
    """
    global _decided
    _decided = None
    note_interrupt(None)
    hold_interrupts(launched_size() > 1)  # a rank stops only once it has joined the others: see cli.commands
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = _handle_stop_signals(_stop) if on_main_thread else {}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_unraisable, previous_hook)
    try:
        try:
            from tokenkit.cli.commands import run  # click, NumPy, every command: under the handlers above

            code = run(argv)
        except KeyboardInterrupt:
            if on_main_thread:
                _handle_stop_signals(_ignore)  # a second signal must not break the line being said
            if launched_rank() == 0:  # under mpirun every rank was stopped: one of them says so
                _say(stopped_line())
            code = 130
        signum = noted_interrupt()
        _decided = 128 + int(signum) if code == 130 and signum is not None else code
    finally:
        hold_interrupts(False)
        sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return _decided


def entry() -> None:
    """`tk` as a process: `main()`, then exit with its code (never returns).

    A signal just before `main` installs its handlers ends the process at once with 128 + its
    number and one line (rank 0's alone under a launcher); one just after `main` decided its exit
    code ends the process with that code, in silence. Once `main` returned, the output is flushed and the interpreter's
    teardown (atexit hooks, finalizers: nothing left to lose) runs with the stop signals
    ignored: Python gives SIGINT back its default action late in it, and a Ctrl-C then would end
    the process by the signal, without a word and with no exit code.
    """
    meant: list[int] = []

    def exit_now(signum: int, frame) -> None:
        decided = meant[0] if meant else _decided  # once main() decided, a signal is too late to count
        if decided is None:
            note_interrupt(signum)
            if launched_rank() == 0:  # under mpirun every rank got it: one of them says so
                _say(stopped_line())
        _flush()
        os._exit(128 + signum if decided is None else decided)

    _handle_stop_signals(exit_now)
    try:
        meant.append(main())
    except KeyboardInterrupt:  # a second signal at the very moment main() said the first one's line
        meant.append(128 + (noted_interrupt() or signal.SIGINT))
    _flush()
    _handle_stop_signals(signal.SIG_IGN)  # process-wide, and Python's teardown leaves an ignored one alone
    # A KeyboardInterrupt raised inside an eval() or exec() of a string (namedtuple and dataclass
    # definitions, while modules load) marks CPython to kill itself by SIGINT after its teardown,
    # whatever code it exits with, even when tk caught the interrupt; a successful one clears the mark.
    eval("None")
    sys.exit(meant[0])


def _handle_stop_signals(handler) -> dict[int, object]:
    """Install `handler` for SIGINT, SIGTERM and SIGHUP, except where one is ignored (nohup,
    `&` without job control) or not Python's; returns the handlers it replaced."""
    previous = {}
    for signum in STOP_SIGNALS:
        current = signal.getsignal(signum)
        if current not in (signal.SIG_IGN, None):
            previous[signum] = signal.signal(signum, handler)
    return previous


def _stop(signum: int, frame) -> None:
    note_interrupt(signum)
    if holding_interrupts():  # an MPI rank not yet joined: raised when it joins (common.mpi.end_together)
        return
    if _inside(frame, _unraisable.__code__):  # raised in the hook, it would be swallowed again
        _deliver_again(signum)
        return
    raise KeyboardInterrupt


def _inside(frame, code) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _deliver_again(signum: int) -> None:
    """Signal `signum` to the main thread again in a moment, from another thread: the main
    thread has left the finalizer and the hook by then (if not, this repeats). A real signal
    (pthread_kill), where the system has one: it also wakes a main thread that went on to block
    in a read (`tk chat` waiting for a line), which `_thread.interrupt_main` only flags."""
    main = threading.main_thread().ident
    kill = hasattr(signal, "pthread_kill")
    again = (signal.pthread_kill, (main, signum)) if kill else (_thread.interrupt_main, (signum,))
    try:
        threading.Timer(_AGAIN_S, *again).start()
    except RuntimeError:  # no new threads at the interpreter's shutdown: the process is ending anyway
        pass


def _ignore(signum: int, frame) -> None:
    pass


def _unraisable(previous_hook, unraisable) -> None:
    """A KeyboardInterrupt that `_stop` raised inside a finalizer (a `__del__` the collector ran,
    a generator closed as it is freed, a weakref callback) cannot propagate: Python would print
    it as "Exception ignored" and run on. The signal is delivered again instead, a moment later
    (and again whenever it finds the main thread in a finalizer or this hook)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _deliver_again(noted_interrupt() or signal.SIGINT)
    else:
        previous_hook(unraisable)


def _say(line: str) -> None:
    """`line` on stderr, after a newline that closes a terminal's `^C` echo."""
    try:
        lead = "\n" if noted_interrupt() in (None, signal.SIGINT) and sys.stderr.isatty() else ""
        sys.stderr.write(f"{lead}{line}\n")
        sys.stderr.flush()
    except (OSError, ValueError, RuntimeError):  # stderr closed, or reentered by a signal mid-write
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):
            pass


if __name__ == "__main__":
    entry()
