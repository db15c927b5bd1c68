"""Running under an MPI launcher (mpirun, mpiexec, srun): detection, arrays between ranks, one-line aborts.

What it does:
- `launched_size` / `launched_rank` read what the launcher put in the environment
  (`common.launcher`, which imports nothing, re-exported here).
- `world` imports mpi4py only when a launcher started more than one process, and returns
  COMM_WORLD (None for a plain run: a plain run never imports mpi4py).
- `send_arrays` / `recv_arrays` move 1-D numpy arrays with the buffer-based `Send`/`Recv`:
  first their lengths (one int64 array), then their raw bytes. Never pickle: a rank's data is
  numbers and bytes, and the lowercase pickle-based methods would unpickle whatever arrives.
- `reduce_to_root` combines one value per rank on rank 0 along a binary tree (log2 N rounds,
  pairs combining at the same time), the values travelling as arrays.
- `end_together` runs a command on every rank and ends them all with one exit code and at most
  one line, whichever rank fails: no rank waits forever for a message that will never come, and
  no launcher's abort banner follows (see there). Inside it, `wait` waits for a nonblocking
  request or the news that another rank failed.

What it deliberately does not do: decide what each rank works on (bpe/distributed.py does), or
any tokenizer or model math.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from tokenkit.common.launcher import launched_rank, launched_size
from tokenkit.common.processes import STOP_SIGNALS, hold_interrupts, take_held_interrupt

__all__ = [
    "INSTALL_HINT",
    "OtherRankFailed",
    "end_together",
    "launched_rank",
    "launched_size",
    "recv_arrays",
    "reduce_to_root",
    "send_arrays",
    "wait",
    "world",
]

INSTALL_HINT = "pip install 'tokenkit[mpi]'"

_ALARM_TAG = 1
_POLL_S = 0.01  # between tests of a request while ending: no core spent spinning
_REACH_S = 60.0  # how long ending ranks wait for one still busy before MPI_Abort (the last resort)
_yield_core = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))

T = TypeVar("T")


def world():
    """MPI's COMM_WORLD when an MPI launcher started more than one process, else None.

    Raises ImportError with a one-line message (how to install) when a launcher started several
    processes but mpi4py is missing.
    """
    size = launched_size()
    if size <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError(
            f"started by an MPI launcher ({size} processes) but mpi4py is not installed; {INSTALL_HINT}"
        ) from None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def send_arrays(comm, dest: int, arrays: Sequence[np.ndarray], tag: int = 0) -> None:
    """Send 1-D arrays to `dest` as raw buffers: their lengths first, then each one."""
    arrays = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    wait(comm.Isend(np.array([len(a) for a in arrays], dtype=np.int64), dest=dest, tag=tag))
    for a in arrays:
        if len(a):
            wait(comm.Isend(a, dest=dest, tag=tag))


def recv_arrays(comm, source: int, dtypes: Sequence[Any], tag: int = 0) -> list[np.ndarray]:
    """Receive what `send_arrays` sent from `source`; the receiver names the dtypes, in order."""
    lengths = np.empty(len(dtypes), dtype=np.int64)
    wait(comm.Irecv(lengths, source=source, tag=tag))
    arrays = []
    for n, dtype in zip(lengths.tolist(), dtypes, strict=True):
        a = np.empty(n, dtype=dtype)
        if n:
            wait(comm.Irecv(a, source=source, tag=tag))
        arrays.append(a)
    return arrays


def reduce_to_root(
    comm,
    value: T,
    combine: Callable[[T, T], T],
    to_arrays: Callable[[T], Sequence[np.ndarray]],
    from_arrays: Callable[[list[np.ndarray]], T],
    dtypes: Sequence[Any],
) -> T | None:
    """combine() of every rank's value on rank 0 (None on the others), along a binary tree.

    Round k: each rank r with r % 2^(k+1) == 2^k sends its (combined) value to r - 2^k and is done;
    `combine(lower rank's, higher rank's)` runs on the receiver. With 3 ranks: 1 -> 0, then 2 -> 0.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    step = 1
    while step < size:
        if rank % (2 * step):
            send_arrays(comm, rank - step, to_arrays(value))
            return None
        if rank + step < size:
            value = combine(value, from_arrays(recv_arrays(comm, rank + step, dtypes)))
        step *= 2
    return value


class OtherRankFailed(BaseException):
    """Raised by `wait` on a rank when another rank failed: what it waits for will never come.
    A BaseException, as KeyboardInterrupt is, so that it unwinds everything (temp files removed,
    pools stopped) and no `except Exception` takes it for an error of its own."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _Alarm:
    """A rank's ear for failures elsewhere: a receive posted, for the whole command, on a private
    copy of the communicator, which a failing rank's `raise_to_all` completes on every other rank."""

    def __init__(self, comm):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm.Dup()  # its own traffic never meets the command's
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._code = np.zeros(1, dtype=np.int64)
        self.request = self.comm.Irecv(self._code, source=MPI.ANY_SOURCE, tag=_ALARM_TAG)
        self.heard: int | None = None
        self._sent: list = []

    def check(self) -> None:
        """OtherRankFailed if another rank has failed."""
        if self.heard is None and self.request.Test():
            self.heard = int(self._code[0])
        if self.heard is not None:
            raise OtherRankFailed(self.heard)

    def raise_to_all(self, code: int) -> None:
        """Tell every other rank that this one failed (a few bytes each: sent at once, not waited for)."""
        note = np.array([code], dtype=np.int64)
        self._sent = [self.comm.Isend(note, dest=r, tag=_ALARM_TAG) for r in range(self.size) if r != self.rank]

    def gather(self, code: int) -> list[int]:
        """Every rank's `code`, on every rank (MPI_Abort if one does not come within _REACH_S)."""
        codes = np.zeros(self.size, dtype=np.int64)
        self._finish(self.comm.Iallgather(np.array([code], dtype=np.int64), codes), code)
        return codes.tolist()

    def barrier(self, code: int) -> None:
        self._finish(self.comm.Ibarrier(), code)

    def _finish(self, request, code: int) -> None:
        deadline = time.monotonic() + _REACH_S
        while not request.Test():
            if time.monotonic() > deadline:  # a rank that never reaches this: only the launcher can end it
                self.comm.Abort(code or 1)
                os._exit(code or 1)
            time.sleep(_POLL_S)

    def close(self) -> None:
        self.request.Cancel()
        self.request.Wait()
        self.comm.Free()


_alarm: _Alarm | None = None


def wait(request, poll_s: float | None = None) -> None:
    """Wait until the nonblocking MPI `request` completes, or raise OtherRankFailed as soon as
    another rank has failed (inside `end_together`; elsewhere a plain Wait).

    It tests the request and the alarm in turn, yielding the core between tests (a 2-core
    machine runs the other rank's step meanwhile; MPI_Waitany on the two was 40% slower per
    training step), or sleeping `poll_s` between them, for a rank that may wait long on one that
    computes.
    """
    alarm = _alarm
    if alarm is None:
        request.Wait()
        return
    while not request.Test():
        alarm.check()
        if poll_s is None:
            _yield_core()
        else:
            time.sleep(poll_s)


@contextmanager
def end_together(comm, describe: Callable[[BaseException], tuple[int, str]]) -> Iterator[None]:
    """Run the block on every rank of `comm`; when it fails on any, end every rank with one code.

    A rank whose block raises (an error, Ctrl-C or SIGTERM, which mpirun forwards to every rank)
    gets `describe(err)`: (exit code, line). It tells the others at once, and those waiting for
    it (`wait`) get OtherRankFailed, so that every rank unwinds its own work: temp files
    removed, pools stopped. Then the ranks agree: the lowest rank that failed on its own says
    its line (`(rank r of N)` added after an error on a rank other than 0; not after a signal,
    which every rank got) and every rank exits with its code, after the line is out. No rank
    calls MPI_Abort, whose banner would follow the line and whose code is always 1; each ends
    itself with `os._exit` (MPI_Finalize would complain of the traffic it abandoned), which the
    launcher takes as the job's end with that code. While ranks agree, further stop signals are
    ignored. Only a rank that does not come to agree within _REACH_S is aborted.

    When no rank fails, the block's result stands (its own exception too, if `describe` gives
    it code 0), and a stop signal after the ranks agreed is only noted (`hold_interrupts`): the
    command is over on every rank, and `cli.main` ends it with its code.
    """
    global _alarm
    alarm = _alarm = _Alarm(comm)
    failure: BaseException | None = None
    try:
        if take_held_interrupt() is not None:  # it came before this rank could join: it counts now
            raise KeyboardInterrupt
        yield
    except BaseException as err:
        failure = err
    _alarm = None
    hushed = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS if signal.getsignal(s) is not None}
    code, line = 0, ""
    if isinstance(failure, OtherRankFailed):
        code = failure.code
    elif failure is not None:
        code, line = describe(failure)
        if code:
            alarm.raise_to_all(code)
    own = alarm.gather(0 if isinstance(failure, OtherRankFailed) else code)  # who failed on its own
    first = next((r for r, c in enumerate(own) if c), None)
    if first is None:  # every rank finished, or failed in a way that ends only itself
        # The ranks agreed the command is over: a signal from here on is too late to stop it. It is
        # only noted (a rank that raised it alone would end 130 in silence while rank 0 ends 0).
        hold_interrupts(True)
        for signum, handler in hushed.items():
            signal.signal(signum, handler)
        alarm.close()
        if failure is not None:
            raise failure
        return
    if alarm.rank == first and line:
        where = f" (rank {first} of {alarm.size})" if first and own[first] < 128 else ""
        sys.stdout.flush()
        sys.stderr.write(f"{line}{where}\n")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    alarm.barrier(own[first])  # the line is out before any rank ends: the launcher then stops the rest
    os._exit(own[first])
