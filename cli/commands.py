"""The `tk` command group, and the one place user errors become one-line messages.

Every package raises its own error type for mistakes a user can fix (a missing file, a bad
flag value, a corrupt checkpoint). They are caught here, once, and printed as
`error: <what is wrong and what to do>` with exit code 1 — never a traceback.

What it deliberately does not do: handle signals or interrupts (`cli.main` does, for the whole
process, this module's import included): a KeyboardInterrupt passes through `run`.
"""

from __future__ import annotations

import os
import sys

import click

from tokenkit import __version__
from tokenkit.bpe import TokenizerError
from tokenkit.cli import (
    explain_commands,
    hf_commands,
    info_commands,
    model_commands,
    serve,
    tokenizer_commands,
    train_commands,
)
from tokenkit.common import FileError
from tokenkit.common.launcher import launched_rank
from tokenkit.common.processes import take_held_interrupt
from tokenkit.pipeline import PipelineError
from tokenkit.transformer import ModelError

USER_ERRORS = (TokenizerError, ModelError, PipelineError, FileError)


# The commands that run on MPI ranks together (common.mpi.end_together); under a launcher, the
# others stop at once when a signal held since the start comes (see cli.main).
_ON_RANKS = frozenset({"bpe-train", "encode", "train-model", "pipeline"})


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="tokenkit")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """tokenkit: train a byte-level BPE tokenizer and a NumPy transformer, and use them.

    \b
    Example:
      tk pipeline corpora/tiny_tales.txt -o runs/demo
      tk bpe-train corpora/tiny_tales.txt --vocab-size 512 -o tok.safetensors
      tk encode -t tok.safetensors "Once upon a time"
      tk serve runs/demo
    """
    if ctx.invoked_subcommand not in _ON_RANKS and take_held_interrupt() is not None:
        raise KeyboardInterrupt


# each module of commands lists its own in COMMANDS
for module in (train_commands, model_commands, info_commands, hf_commands, tokenizer_commands, explain_commands, serve):
    for command in module.COMMANDS:
        cli.add_command(command)


def run(argv: list[str] | None) -> int:
    """Parse `argv` (default: this process's arguments) and run the command; returns the exit
    code, 0 or 1 (a user error, said in one line). A KeyboardInterrupt is raised on."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        # The context and invoke directly, not cli.main(): that one writes a blank line to stderr
        # on a KeyboardInterrupt before passing it on, a second line besides `interrupted`.
        complete = getattr(cli, "_main_shell_completion", None)  # click's _TK_COMPLETE support, as main() has it
        if complete is not None:
            complete({}, "tk")
        with cli.make_context("tk", args) as ctx:
            result = cli.invoke(ctx)
    except click.exceptions.Exit as done:  # --help, --version
        return done.exit_code
    except click.exceptions.Abort:  # a prompt's Ctrl-C or end of input: stopped, as by a signal
        raise KeyboardInterrupt from None
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
    except BrokenPipeError as err:
        if err.filename is not None:
            raise OSError(err.errno, err.strerror, err.filename) from None  # a file's broken pipe, said below
        # the reader of our output stopped (`tk info ... | head`): nothing to say; stdout goes to
        # /dev/null so that the interpreter's final flush does not fail a second time
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as err:  # last resort: a disk or permission failure the packages did not name
        where = f"{err.filename}: " if err.filename else ""
        click.echo(
            f"error: {where}{err.strerror or err}; check the path, its permissions and the free disk space", err=True
        )
        return 1
    return result if isinstance(result, int) else 0
