"""The `tk` entry point: the click group, and the one place user errors become one-line messages.

Every package raises its own error type for mistakes a user can fix (a missing file, a bad
flag value, a corrupt checkpoint). They are caught here, once, and printed as
`error: <what is wrong and what to do>` with exit code 1 — never a traceback.
"""

from __future__ import annotations

import signal
import sys
import threading

import click

from tokenkit import __version__
from tokenkit.bpe import TokenizerError
from tokenkit.cli.explain_commands import COMMANDS as EXPLAIN_COMMANDS
from tokenkit.cli.model_commands import COMMANDS as MODEL_COMMANDS
from tokenkit.cli.tokenizer_commands import COMMANDS as TOKENIZER_COMMANDS
from tokenkit.common import FileError
from tokenkit.common.mpi import launched_rank
from tokenkit.common.processes import note_interrupt, noted_interrupt
from tokenkit.pipeline import PipelineError
from tokenkit.transformer import ModelError

USER_ERRORS = (TokenizerError, ModelError, PipelineError, FileError)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="tokenkit")
def cli() -> None:
    """tokenkit: train a byte-level BPE tokenizer and a NumPy transformer, and use them.

    \b
    Example:
      tk pipeline corpora/tiny_tales.txt -o runs/demo
      tk bpe-train corpora/tiny_tales.txt --vocab-size 512 -o tok.safetensors
      tk encode -t tok.safetensors "Once upon a time"
    """


for command in MODEL_COMMANDS + TOKENIZER_COMMANDS + EXPLAIN_COMMANDS:
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Run `tk`; returns the exit code (0 ok, 1 user error, 128 + the signal's number when stopped
    by one: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).

    SIGTERM and SIGHUP stop `tk` the way Ctrl-C does (a KeyboardInterrupt, so temp files are
    removed and worker pools shut down; training saves its state at the step boundary); either
    one left ignored (nohup) stays ignored. The handlers are this call's only (main thread).
    """
    note_interrupt(None)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
                previous[signum] = signal.signal(signum, _stop)
    try:
        code = _run(argv)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    signum = noted_interrupt()
    return 128 + int(signum) if code == 130 and signum is not None else code


def _stop(signum: int, frame) -> None:
    note_interrupt(signum)
    raise KeyboardInterrupt


def _stopped() -> str:
    signum = noted_interrupt()
    return "interrupted" if signum in (None, signal.SIGINT) else f"terminated ({signal.Signals(signum).name})"


def _run(argv: list[str] | None) -> int:
    try:
        result = cli.main(args=argv, prog_name="tk", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo(_stopped(), err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as bare:  # plain `tk`: the help is the answer
        click.echo(bare.format_message())
        return 0
    except click.UsageError as err:
        hint = f" (see `{err.ctx.command_path} --help`)" if err.ctx is not None else ""
        if launched_rank() == 0:  # under mpirun every rank parses the same flags: one of them says so
            click.echo(f"error: {err.format_message()}{hint}", err=True)
        return 1
    except click.ClickException as err:
        if launched_rank() == 0:
            click.echo(f"error: {err.format_message()}", err=True)
        return 1
    except USER_ERRORS as err:
        click.echo(f"error: {err}", err=True)
        return 1
    except MemoryError:  # last resort: the packages refuse what they can foresee before allocating
        click.echo("error: out of memory; use a smaller model, batch or file, or a machine with more memory", err=True)
        return 1
    except OSError as err:  # last resort: a disk or permission failure the packages did not name
        where = f"{err.filename}: " if err.filename else ""
        click.echo(
            f"error: {where}{err.strerror or err}; check the path, its permissions and the free disk space", err=True
        )
        return 1
    except KeyboardInterrupt:
        click.echo(_stopped(), err=True)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
