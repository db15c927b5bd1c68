"""Whether an MPI launcher (mpirun, mpiexec, srun) started this process, read from the environment.

`launched_size` / `launched_rank` read what the launcher put there (MPICH and Intel MPI:
PMI_SIZE, PMI_RANK; Open MPI: OMPI_COMM_WORLD_SIZE; Slurm's srun: PMIX_RANK or PMI_RANK with
SLURM_STEP_NUM_TASKS).

What it deliberately does not do: import anything beyond `os` (`tk` asks before NumPy or mpi4py
load: cli/main.py), or talk to other ranks (common/mpi.py).
"""

from __future__ import annotations

import os

__all__ = ["launched_rank", "launched_size"]

_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


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
