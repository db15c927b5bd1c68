"""Running under an MPI launcher (mpirun, mpiexec, srun): detection, arrays between ranks, one-line aborts.

What it does:
- `launched_size` / `launched_rank` read what the launcher put in the environment (MPICH and
  Intel MPI: PMI_SIZE, PMI_RANK; Open MPI: OMPI_COMM_WORLD_SIZE; Slurm's srun: PMIX_RANK or
  PMI_RANK with SLURM_STEP_NUM_TASKS), without importing anything.
- `world` imports mpi4py only when a launcher started more than one process, and returns
  COMM_WORLD (None for a plain run: a plain run never imports mpi4py).
- `send_arrays` / `recv_arrays` move 1-D numpy arrays with the buffer-based `Send`/`Recv`:
  first their lengths (one int64 array), then their raw bytes. Never pickle: a rank's data is
  numbers and bytes, and the lowercase pickle-based methods would unpickle whatever arrives.
- `reduce_to_root` combines one value per rank on rank 0 along a binary tree (log2 N rounds,
  pairs combining at the same time), the values travelling as arrays.
- `abort_on_error` turns an exception on any rank into one line and `Abort`, so that no rank
  waits forever for a message that will never come.

What it deliberately does not do: decide what each rank works on (bpe/distributed.py does), or
any tokenizer or model math.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "INSTALL_HINT",
    "abort_on_error",
    "launched_rank",
    "launched_size",
    "recv_arrays",
    "reduce_to_root",
    "send_arrays",
    "world",
]

INSTALL_HINT = "pip install 'tokenkit[mpi]'"

_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_OTHERS_FIRST_S = 1.0  # how long a rank other than 0 waits before it reports an error (see abort_on_error)
_FORWARD_S = 0.2  # time for the launcher to forward the error line before Abort tears its pipes down

T = TypeVar("T")


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def launched_size() -> int:
    """How many processes the launcher started (1 when none did)."""
    for var in _SIZE_VARS:
        if (n := _int_env(var)) is not None:
            return n
    if "PMIX_RANK" in os.environ or "PMI_RANK" in os.environ:  # srun --mpi=pmix|pmi2
        return _int_env("SLURM_STEP_NUM_TASKS") or 1
    return 1


def launched_rank() -> int:
    """This process's rank as the launcher numbered it (0 when there is no launcher)."""
    for var in _RANK_VARS:
        if (n := _int_env(var)) is not None:
            return n
    return 0


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
    comm.Send(np.array([len(a) for a in arrays], dtype=np.int64), dest=dest, tag=tag)
    for a in arrays:
        if len(a):
            comm.Send(a, dest=dest, tag=tag)


def recv_arrays(comm, source: int, dtypes: Sequence[Any], tag: int = 0) -> list[np.ndarray]:
    """Receive what `send_arrays` sent from `source`; the receiver names the dtypes, in order."""
    lengths = np.empty(len(dtypes), dtype=np.int64)
    comm.Recv(lengths, source=source, tag=tag)
    arrays = []
    for n, dtype in zip(lengths.tolist(), dtypes, strict=True):
        a = np.empty(n, dtype=dtype)
        if n:
            comm.Recv(a, source=source, tag=tag)
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


@contextmanager
def abort_on_error(comm, message: Callable[[BaseException], str]):
    """On any exception inside: print `error: <message(err)>` to stderr and abort the whole job.

    Rank 0 reports at once; the others wait a second first, so that a mistake every rank makes
    (a missing file, a bad flag) is reported once, by rank 0, whose abort ends them all.
    """
    try:
        yield
    except BaseException as err:
        rank, size = comm.Get_rank(), comm.Get_size()
        if rank:
            time.sleep(_OTHERS_FIRST_S)
        where = f" (rank {rank} of {size})" if rank else ""
        sys.stdout.flush()
        sys.stderr.write(f"error: {message(err)}{where}\n")
        sys.stderr.flush()
        time.sleep(_FORWARD_S)
        comm.Abort(1)
        os._exit(1)  # MPICH's Abort can return in the calling process; nothing more must run or print
