"""The `tk` entry point: the click group, and the one place user errors become one-line messages.

Every package raises its own error type for mistakes a user can fix (a missing file, a bad
flag value, a corrupt checkpoint). They are caught here, once, and printed as
`error: <what is wrong and what to do>` with exit code 1 — never a traceback.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

import click

from bpe import TokenizerError
from cli.explain_commands import COMMANDS as EXPLAIN_COMMANDS
from cli.model_commands import COMMANDS as MODEL_COMMANDS
from cli.tokenizer_commands import COMMANDS as TOKENIZER_COMMANDS
from pipeline import PipelineError
from transformer import ModelError

USER_ERRORS = (TokenizerError, ModelError, PipelineError)


def _version() -> str:
    try:
        return version("tokenkit")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", prog_name="tokenkit")
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
    """Run `tk`; returns the exit code (0 ok, 1 user error, 130 interrupted)."""
    try:
        result = cli.main(args=argv, prog_name="tk", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as bare:  # plain `tk`: the help is the answer
        click.echo(bare.format_message())
        return 0
    except click.UsageError as err:
        hint = f" (see `{err.ctx.command_path} --help`)" if err.ctx is not None else ""
        click.echo(f"error: {err.format_message()}{hint}", err=True)
        return 1
    except click.ClickException as err:
        click.echo(f"error: {err.format_message()}", err=True)
        return 1
    except USER_ERRORS as err:
        click.echo(f"error: {err}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
