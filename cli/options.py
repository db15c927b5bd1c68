"""The flags several `tk` commands share, each declared once as a click decorator.

A decorator here fixes a flag's spelling, the name its value arrives under and how it is checked;
where the same flag means something a little different in each command (what `--overwrite`
replaces, what `-o` writes), the command gives the help, and a default where they differ. The
model commands spell the output `-o/--out`, the tokenizer commands `-o/--output`: both are kept,
as scripts use them.

Shared elsewhere: the special-token policy flags (`cli.specials`), the training settings' flags
(from TrainConfig's fields, `cli.train_commands`), the numeric types (`cli.params`).

What it deliberately does not do: read or check files, or know what a command does with a value.
"""

from __future__ import annotations

from pathlib import Path

import click

from tokenkit.cli.params import count, real
from tokenkit.common.processes import MAX_WORKERS
from tokenkit.pipeline.names import MAX_NEW_TOKENS

# -t's help in the commands that run a trained model, and in those that only need its tokenizer
TOKENIZER_FOR_MODEL = "tokenizer.safetensors, for a model file without one embedded (GPT.save's)"
TOKENIZER_OR_MODEL = "tokenizer.safetensors, or a model file or run directory (its tokenizer)"


# --- what a command reads and writes -----------------------------------------------------------


def tokenizer_option(help: str = TOKENIZER_FOR_MODEL, *, required: bool = False):
    """-t/--tokenizer TOKENIZER (as `tokenizer_path`)."""
    return click.option(
        "-t", "--tokenizer", "tokenizer_path", required=required, type=click.Path(path_type=Path), help=help
    )


def model_option(*, required: bool = True):
    """-m/--model MODEL (as `model_path`): a run directory or a model file."""
    return click.option(
        "-m",
        "--model",
        "model_path",
        required=required,
        type=click.Path(path_type=Path),
        help="run directory or model.safetensors",
    )


def out_option(dest: str, help: str, *, required: bool = True, directory: bool = True):
    """-o/--out (as `dest`): the directory (or, `directory=False`, the file) a model command writes."""
    kind = click.Path(file_okay=False, path_type=Path) if directory else click.Path(dir_okay=False, path_type=Path)
    return click.option("-o", "--out", dest, required=required, type=kind, help=help)


def output_option(help: str, *, required: bool = False, default: Path | None = None):
    """-o/--output PATH (as `output`): the file or directory a tokenizer command writes."""
    shown = {"default": default, "show_default": True} if default is not None else {}
    return click.option("-o", "--output", required=required, type=click.Path(path_type=Path), help=help, **shown)


def path_option(*names: str, metavar: str | None = None, multiple: bool = False, help: str):
    """A flag that takes a path, kept a `Path` (`names` as click.option's: the flag, and the
    parameter's name where the flag's own would not do)."""
    return click.option(*names, type=click.Path(path_type=Path), metavar=metavar, multiple=multiple, help=help)


def file_option(help: str):
    """-f/--file PATH (as `file`): the input read in place of the command's argument."""
    return click.option("-f", "--file", "file", type=click.Path(path_type=Path), help=help)


def overwrite_option(help: str):
    """--overwrite: replace what the command would otherwise refuse to (`help` says what)."""
    return click.option("--overwrite", is_flag=True, help=help)


def corpus_options(command):
    """--glob, --text-field and --binary: how the corpus inputs are read (see bpe.corpus)."""
    for option in reversed(
        [
            click.option(
                "--glob",
                metavar="PATTERN",
                help="In directories, read only the files whose name or path below the directory matches "
                "(e.g. '*.txt').  [default: every file not hidden]",
            ),
            click.option(
                "--text-field",
                metavar="NAME",
                help="Read the inputs as JSON Lines: each line is a document, its text at this field "
                "(dotted paths like meta.text reach inside).",
            ),
            click.option(
                "--binary",
                is_flag=True,
                help="Read files as their exact bytes: no decompression, "
                "no warning for files that do not look like text.",
            ),
        ]
    ):
        command = option(command)
    return command


def eot_option(help: str):
    """--eot TOKEN: the special token put between documents."""
    return click.option("--eot", metavar="TOKEN", help=help)


# --- the tokenizer's settings --------------------------------------------------------------------


def pattern_option(help: str, *, default: str | None = None):
    """--pattern: the split pattern (gpt2, gpt4, none or a regex)."""
    return click.option("--pattern", default=default, show_default=default is not None, help=help)


def special_tokens_option(help: str):
    """--special TOKEN, repeatable (as `specials`): special tokens to add."""
    return click.option("--special", "specials", multiple=True, metavar="TOKEN", help=help)


# --- sampling ------------------------------------------------------------------------------------


def top_k_option(help: str, *, default: int | None = None):
    """--top-k K: how many of the most likely tokens (at least 1)."""
    return click.option("--top-k", default=default, show_default=default is not None, type=count(1), help=help)


def sampling_options(command):
    """--temperature, --top-k, --top-p and --seed: how `generate` and `chat` pick each token
    (as `temperature`, `top_k`, `top_p`, `seed`; transformer/sampling.py)."""
    for option in reversed(
        [
            click.option("--temperature", default=1.0, show_default=True, type=real(0), help="0 = greedy (argmax)"),
            top_k_option("sample among the K most likely tokens"),
            click.option(
                "--top-p",
                default=None,
                type=real(0, 1, low_open=True),
                help="sample among the smallest set with probability >= P",
            ),
            click.option("--seed", default=None, type=count(0), help="seed for reproducible sampling"),
        ]
    ):
        command = option(command)
    return command


def max_new_tokens_option(help: str, *, default: int | None = None):
    """-n/--max-new-tokens: how many tokens to generate (0 to MAX_NEW_TOKENS)."""
    return click.option(
        "-n",
        "--max-new-tokens",
        default=default,
        show_default=default is not None,
        type=count(0, MAX_NEW_TOKENS),
        help=help,
    )


# --- how it runs and what it prints ----------------------------------------------------------------


def device_option(func):
    """`--device cpu|cuda`: where a command's model math runs (`check_device` says in one line
    when it cannot run here)."""
    return click.option(
        "--device",
        type=click.Choice(["cpu", "cuda"]),
        default="cpu",
        show_default=True,
        help="where the model's math runs: cpu (NumPy) or cuda (CuPy on an NVIDIA GPU; pip install 'tokenkit[gpu]')",
    )(func)


def check_device(device: str) -> None:
    """One line (ModelError) when `device` cannot run here: CuPy or the GPU missing."""
    from tokenkit.transformer.backends import get_backend  # NumPy, CuPy: when a command runs, not for --help

    get_backend(device)


def workers_option(help: str):
    """--workers N: processes for the work, 1 to MAX_WORKERS (default: all cores)."""
    return click.option("--workers", type=count(1, MAX_WORKERS), default=None, help=help)


def quiet_option(help: str):
    """-q/--quiet: no progress bars or notes (`help` says what still shows)."""
    return click.option("-q", "--quiet", is_flag=True, help=help)


def json_option(help: str):
    """--json (as `as_json`): print a JSON document in place of the table or text."""
    return click.option("--json", "as_json", is_flag=True, help=help)


# --- ablation -------------------------------------------------------------------------------------


def ablation_options(command):
    """--ablate SPEC, --ablate-mode, --ablate-text and --ablate-file: heads and MLPs knocked out
    (as `ablate`, `ablate_mode`, `ablate_text`, `ablate_file`; transformer/ablation.py). SPEC and
    the reference text are checked against the model by `cli.model_commands.ablation_from_flags`."""
    for option in reversed(
        [
            click.option(
                "--ablate",
                metavar="SPEC",
                help="knock out heads and MLPs: L.H is block L's head H, L.mlp its MLP, comma-separated"
                " (e.g. 1.1,1.3,0.mlp; counted from 0)",
            ),
            click.option(
                "--ablate-mode",
                type=click.Choice(["zero", "mean"]),
                default="zero",
                show_default=True,
                help="replace each part's output with zeros, or with its mean over a reference text's positions",
            ),
            click.option("--ablate-text", metavar="TEXT", help="--ablate-mode mean: the reference text"),
            path_option("--ablate-file", help="--ablate-mode mean: the reference text, read from this UTF-8 file"),
        ]
    ):
        command = option(command)
    return command
