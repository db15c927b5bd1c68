"""The `tk` command group, and the one place user errors become one-line messages.

Every package raises its own error type for mistakes a user can fix (a missing file, a bad
flag value, a corrupt checkpoint). They are caught here, once, and printed as
`error: <what is wrong and what to do>` with exit code 1 — never a traceback.

The group is lazy: it names its commands from a table (`COMMANDS`: each command's module and
short help) and imports a command's module only to run it or show its help, so `tk --version`,
`tk --help` and tab completion load neither NumPy nor any command (tests/test_cli_start.py).

What it deliberately does not do: handle signals or interrupts (`cli.main` does, for the whole
process, this module's import included): a KeyboardInterrupt passes through `run`.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from tokenkit import __version__
from tokenkit.bpe.errors import TokenizerError
from tokenkit.common.errors import FileError
from tokenkit.common.launcher import launched_rank
from tokenkit.common.processes import take_held_interrupt
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.errors import ModelError

USER_ERRORS = (TokenizerError, ModelError, PipelineError, FileError)

# Each command: the module of cli/ that defines it (in its COMMANDS) and the first sentence of its
# help, which `tk --help` lists without importing the module (a test holds them equal).
COMMANDS: dict[str, tuple[str, str]] = {
    "bpe-export": ("tokenizer_commands", "Write a tokenizer in GPT-2's, Hugging Face's or tiktoken's format."),
    "bpe-import": (
        "tokenizer_commands",
        "Import a byte-level BPE tokenizer from GPT-2's, Hugging Face's or tiktoken's files.",
    ),
    "bpe-train": ("tokenizer_commands", "Learn a byte-level BPE tokenizer from text files."),
    "chat": (
        "chat_commands",
        "Talk with a model fine-tuned for chat: each line a message, the answer streaming as it comes.",
    ),
    "decode": ("tokenizer_commands", "Turn token ids back into text (bytes that are not valid UTF-8 print as U+FFFD)."),
    "encode": ("tokenizer_commands", "Turn text into token ids."),
    "eval": (
        "eval_commands",
        "Measure a model on held-out text (bits per byte) or a multiple-choice task, or tokenizers side by side.",
    ),
    "explain": (
        "explain_commands",
        "Print a forward pass the way a textbook works an example: tokens, embeddings, Q, K, V, scores, "
        "attention weights, weighted sum, projection, residual, LayerNorm, MLP, logits.",
    ),
    "export-hf": ("hf_commands", "Write a model as a Hugging Face transformers directory (GPT-2's or Llama's)."),
    "generate": ("model_commands", "Continue PROMPT, streaming the text as it is generated (KV-cached decoding)."),
    "import-hf": ("hf_commands", "Read a transformers checkpoint directory into one tokenkit model file."),
    "info": ("info_commands", "What a tokenizer, model or training-state file (or a run directory) holds."),
    "pipeline": (
        "train_commands",
        "Tokenizer -> encode -> train -> sample, each stage skipped when RUN_DIR already has it.",
    ),
    "predict-next": (
        "model_commands",
        "The most likely token after TEXT (argmax), then the top K with their probabilities.",
    ),
    "serve": (
        "serve",
        "Serve a page that shows your tokenizer and model at work: tokens, BPE merges one by one, attention "
        "with its arithmetic, next-token odds, training curves (live), the model's blocks.",
    ),
    "train-model": ("train_commands", "Train a GPT on CORPUS; checkpoints, log and token cache go in RUN_DIR."),
}


def _short_help(name: str, limit: int = 45) -> str:
    """The table's sentence for `name`, cut to `limit` as click cuts a command's own help."""
    return click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit)


class LazyGroup(click.Group):
    """A click group over `COMMANDS`: a command's module is imported when it is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"tokenkit.cli.{COMMANDS[name][0]}")
        return next(command for command in module.COMMANDS if command.name == name)

    def shell_complete(self, ctx: click.Context, incomplete: str):
        """Tab completion of a command's name, from the table (click's own would import each)."""
        from click.shell_completion import CompletionItem

        names = [name for name in self.list_commands(ctx) if name.startswith(incomplete)]
        items = [CompletionItem(name, help=_short_help(name)) for name in names]
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing, from the table's sentences instead of the imported commands."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, _short_help(name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# The commands that run on MPI ranks together (common.mpi.end_together); under a launcher, the
# others stop at once when a signal held since the start comes (see cli.main).
_ON_RANKS = frozenset({"bpe-train", "encode", "train-model", "pipeline", "eval"})


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
