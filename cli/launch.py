"""How a command was launched: alone, or as one of the ranks `mpirun`/`srun` started.

`mpi_world()` is MPI's communicator when a launcher started several processes (None for a
plain run, which never imports mpi4py); `abort_on_error(comm)` turns an error on any rank into
one line and the end of the whole job (`common.mpi.abort_on_error`). `device_option` is the
`--device cpu|cuda` flag of the model commands, `check_device` its one-line check.
"""

from __future__ import annotations

from contextlib import nullcontext

import click

from tokenkit.bpe import TokenizerError
from tokenkit.common import FileError, mpi
from tokenkit.pipeline import PipelineError
from tokenkit.transformer import ModelError
from tokenkit.transformer.backends import get_backend


def mpi_world():
    """MPI's communicator when `mpirun`/`srun` started several processes, else None (mpi4py unimported)."""
    try:
        return mpi.world()
    except ImportError as err:  # said once, by the first process; the others exit quietly
        if mpi.launched_rank():
            raise click.exceptions.Exit(1) from None
        raise click.ClickException(str(err)) from None


def one_line(err: BaseException) -> str:
    """What `error:` says about `err` on an MPI rank."""
    if isinstance(err, (TokenizerError, FileError, PipelineError, ModelError)):
        return str(err)
    if isinstance(err, click.ClickException):
        return err.format_message()
    if isinstance(err, KeyboardInterrupt):
        return "interrupted"
    return " ".join(f"{type(err).__name__}: {err}".split())


def abort_on_error(comm):
    """Under MPI, an error on any rank ends every rank (one line, then MPI_Abort); else nothing."""
    return nullcontext() if comm is None else mpi.abort_on_error(comm, one_line)


def device_option(func):
    """`--device cpu|cuda`: where a command's model math runs."""
    return click.option(
        "--device",
        type=click.Choice(["cpu", "cuda"]),
        default="cpu",
        show_default=True,
        help="where the model's math runs: cpu (NumPy) or cuda (CuPy on an NVIDIA GPU; pip install 'tokenkit[gpu]')",
    )(func)


def check_device(device: str) -> None:
    """One line (ModelError) when `device` cannot run here: CuPy or the GPU missing."""
    get_backend(device)
