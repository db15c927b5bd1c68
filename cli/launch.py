"""How a command was launched: alone, or as one of the ranks `mpirun`/`srun` started.

`mpi_world()` is MPI's communicator when a launcher started several processes (None for a
plain run, which never imports mpi4py); `end_together(comm)` turns an error or an interrupt on
any rank into one line and the end of every rank with one exit code (`common.mpi.end_together`).

What it deliberately does not do: choose the device a model runs on (`cli.options`' --device).
"""

from __future__ import annotations

from contextlib import nullcontext

import click

from tokenkit.bpe.errors import TokenizerError
from tokenkit.common.errors import FileError
from tokenkit.common.launcher import launched_rank
from tokenkit.common.messages import one_line
from tokenkit.common.processes import noted_interrupt, stopped_line, take_held_interrupt
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.errors import ModelError


def mpi_world():
    """MPI's communicator when `mpirun`/`srun` started several processes, else None (mpi4py unimported)."""
    from tokenkit.common import mpi  # NumPy: when a command runs, not for its --help

    try:
        comm = mpi.world()
    except ImportError as err:  # said once, by the first process; the others exit quietly
        if launched_rank():
            raise click.exceptions.Exit(1) from None
        raise click.ClickException(str(err)) from None
    if comm is None and take_held_interrupt() is not None:  # no ranks to join after all: stop now
        raise KeyboardInterrupt
    return comm


def _ending(err: BaseException) -> tuple[int, str]:
    """The exit code and the line `err` ends an MPI rank with, as `cli.main` ends a plain run."""
    if isinstance(err, KeyboardInterrupt):  # Ctrl-C or SIGTERM, which the launcher forwards to every rank
        signum = noted_interrupt()
        return 128 + int(signum or 2), stopped_line()
    if isinstance(err, click.exceptions.Exit):
        return err.exit_code, ""
    if isinstance(err, (TokenizerError, FileError, PipelineError, ModelError)):
        return 1, f"error: {err}"
    if isinstance(err, click.ClickException):
        return 1, f"error: {err.format_message()}"
    return 1, "error: " + one_line(err, named=True)


def end_together(comm):
    """Under MPI, an error or interrupt on any rank ends every rank with its code and one line
    (`common.mpi.end_together`); else nothing."""
    if comm is None:
        return nullcontext()
    from tokenkit.common import mpi

    return mpi.end_together(comm, _ending)
