"""`tk train-model` and `tk pipeline`: training a GPT on a corpus, alone or on MPI ranks.

Each parses flags (every TrainConfig field is one, with a --config file beneath them), checks
the ones that exclude each other, calls `pipeline.train` or `pipeline.run.run_pipeline` and
prints a summary; `tk pipeline` then samples from the model it made. Progress and notes go to
stderr, the summary to stdout. Under mpirun rank 0 leads and the other ranks follow its
training, printing nothing.

What it deliberately does not do: the training itself, its checkpoints or resume checks
(`pipeline.train`), or run a model on a user's text (`cli.model_commands`).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tokenkit.cli.chat_pipeline_commands import chat_options
from tokenkit.cli.chat_pipeline_commands import run as run_chat_pipeline
from tokenkit.cli.chat_pipeline_commands import take as take_chat_options
from tokenkit.cli.launch import end_together, mpi_world
from tokenkit.cli.model_commands import stream_text
from tokenkit.cli.notes import note, notes, once, warn
from tokenkit.cli.options import (
    check_device,
    corpus_options,
    device_option,
    eot_option,
    max_new_tokens_option,
    out_option,
    overwrite_option,
    path_option,
    quiet_option,
    tokenizer_option,
)
from tokenkit.cli.params import Number, count
from tokenkit.cli.specials import policy_name, special_options
from tokenkit.pipeline.config import DEFAULT_VOCAB_SIZE, Range, TrainConfig, load_config_file
from tokenkit.pipeline.names import SPECIALS
from tokenkit.transformer.config import MAX_VOCAB_SIZE

if TYPE_CHECKING:
    from tokenkit.pipeline.ranks import Ranks
    from tokenkit.pipeline.sources import CorpusSpec
    from tokenkit.pipeline.train import TrainResult

# The pipeline's modules (NumPy, the model, the codec) are imported by each function that uses
# them, so that `tk train-model --help` does not wait for them (tests/test_cli_main.py).

_DEFAULTS = TrainConfig()
# every TrainConfig field is a flag: its name, help and range come from the field (pipeline/config.py)
_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


def _training_options(func):
    """Every TrainConfig field as a flag (default: unset, shown with the built-in default)."""
    for f in reversed(dataclasses.fields(TrainConfig)):
        allowed, text = f.metadata["allowed"], f.metadata["help"]
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            text += f" [default: {'on' if f.default else 'off'}]"
            func = click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=text)(func)
            continue
        if isinstance(allowed, Range):
            typ = Number(int if f.type == "int" else float, allowed)
        elif allowed is None:  # free text, checked by TrainConfig (--freeze's globs)
            typ = str
        else:
            typ = click.Choice(allowed)
        shown = f.default if f.default != "" else "none"
        func = click.option(flag, f.name, type=typ, default=None, help=f"{text} [default: {shown}]")(func)
    func = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="JSON or TOML file of these settings (flags given on the command line win)",
    )(func)
    return func


def _given(kwargs: dict[str, Any], fresh: bool = True, ranks: Ranks | None = None) -> dict[str, Any]:
    """The training settings given explicitly: a --config file's, then the flags'. For a fresh run
    a short --steps brings a warmup that fits in it; a resumed run keeps its own. Under MPI,
    --workers counts each rank's workers, and the run records every rank's shards together."""
    values: dict[str, Any] = {}
    if kwargs.get("config_file") is not None:
        values.update(load_config_file(kwargs["config_file"]))
    values.update({name: kwargs[name] for name in _FIELDS if kwargs.get(name) is not None})
    if ranks is not None and isinstance(values.get("workers"), int) and values["workers"] > 0:
        values["workers"] *= ranks.size
    steps = values.get("steps")
    if fresh and isinstance(steps, int) and "warmup_steps" not in values and steps < _DEFAULTS.warmup_steps:
        values["warmup_steps"] = steps // 10  # a short run asked for: the default warmup would not fit in it
    return values


@dataclasses.dataclass(frozen=True)
class _Reading:
    """How CORPUS and --val are read: `_run_corpus_options`' flags, passed on as one value."""

    val: tuple[Path, ...]
    eot: str | None
    glob: str | None
    text_field: str | None
    binary: bool

    def spec(self, corpus, special_policy) -> CorpusSpec:
        """CORPUS read with these flags, text that looks like a special token as `special_policy` says."""
        from tokenkit.pipeline.sources import CorpusSpec

        return CorpusSpec(
            tuple(str(p) for p in corpus),
            glob=self.glob,
            text_field=self.text_field,
            binary=self.binary,
            eot=self.eot,
            val=tuple(str(p) for p in self.val),
            specials=policy_name(special_policy),
        )


def _run_corpus_options(func):
    """CORPUS's reading flags (--glob, --text-field, --binary, as bpe-train's), --eot and --val;
    the command receives them as one `reading` (`_Reading`)."""

    @functools.wraps(func)
    def command(*args, val, eot, glob, text_field, binary, **kwargs):
        return func(*args, reading=_Reading(val, eot, glob, text_field, binary), **kwargs)

    command = corpus_options(command)
    command = eot_option(
        "Put this special token between documents (files, JSONL records) in the token files; "
        "a tokenizer trained here gets it, a given one (-t) must have it."
    )(command)
    command = path_option(
        "--val",
        multiple=True,
        metavar="FILE",
        help="Validate on this corpus (repeatable; files, directories, compressed, JSONL, - or a pipe "
        "as CORPUS) instead of the last --val-fraction of CORPUS.",
    )(command)
    return command


def _check_val(val, given: dict[str, Any]) -> None:
    if val and "val_fraction" in given:
        raise click.UsageError("--val and --val-fraction exclude each other: --val validates on its own corpus")


def _check_chat(corpus, tokenizer_path, init_from, resume, reading: _Reading, special_policy) -> None:
    """--chat's refusals: what reads a corpus, and a fresh run without its base model."""
    if corpus:
        raise click.UsageError("--chat DATA.jsonl is the run's data: drop CORPUS (or drop --chat to train on CORPUS)")
    if resume is None and init_from is None:
        raise click.UsageError("--chat fine-tunes a model: give the base with --init-from MODEL (a run or model file)")
    if tokenizer_path is not None:
        raise click.UsageError("--chat uses the base model's tokenizer, with the chat tokens added: drop -t")
    given = {
        "--eot": reading.eot is not None,
        "--glob": reading.glob is not None,
        "--text-field": bool(reading.text_field),
        "--binary": reading.binary,
    }
    given["--allow-special/--specials-as-text"] = special_policy != SPECIALS["refuse"]
    for flag, present in given.items():
        if present:
            raise click.UsageError(f"{flag} reads a corpus; --chat reads conversations (JSONL): drop {flag}")
    if len(reading.val) > 1:
        raise click.UsageError("with --chat, --val takes one JSONL file of held-out conversations")


def _check_workers_on(device: str, given: dict[str, Any], ranks: Ranks | None) -> None:
    if device == "cpu" or given.get("workers", 0) <= (1 if ranks is None else ranks.size):  # per rank: at most 1
        return
    where = "in this process on the GPU" if ranks is None else "one shard per rank, on each rank's GPU"
    raise click.UsageError(
        f"--workers splits batches over CPU processes; with --device {device} the batch runs {where}: drop --workers"
    )


def _summary(result: TrainResult) -> None:
    from tokenkit.pipeline import checkpoint

    best = f"{result.best_val_loss:.4f} at step {result.best_step}" if result.best_val_loss is not None else "none yet"
    if result.steps_run == 0:
        click.echo(f"step {result.step}/{result.steps}: nothing left to train (best val loss {best})")
        return
    last = (
        f"val loss {result.last_val_loss:.4f}"
        + (f" at step {result.last_val_step}" if result.last_val_step != result.step else "")
        if result.last_val_loss is not None
        else "no evaluation this session"
    )
    best = f"best {best}"
    if result.best_val_loss is None and result.last_val_loss is not None:  # Ctrl-C before the first evaluation
        best = "measured at the interrupt, before any evaluation was due"
    bpb = f"{result.last_val_bpb:.4f} bits/byte; " if result.last_val_bpb is not None else ""
    click.echo(
        f"step {result.step}/{result.steps}: {last} ({bpb}{best}; unigram baseline {result.unigram_baseline:.4f}); "
        f"{result.seconds:.1f} s, {result.tokens_per_s:,.0f} tokens/s"
    )
    if (result.run_dir / checkpoint.MODEL_FILE).exists():
        click.echo(f"model: {result.run_dir / checkpoint.MODEL_FILE}")


def _on_ranks(command):
    """Run `command(ranks, ...)` alone, or under mpirun/srun as rank 0 with the other ranks
    following its training (they print nothing and exit with its code)."""

    def run(*args, **kwargs) -> int:
        from tokenkit.pipeline.join import follow
        from tokenkit.pipeline.ranks import Ranks
        from tokenkit.transformer.backends import use_gpu

        comm = mpi_world()
        if comm is None:
            return command(None, *args, **kwargs)
        with end_together(comm):
            ranks = Ranks(comm)
            device = kwargs.get("device", "cpu")
            if device != "cpu":  # this rank's own GPU, before anything runs on one
                use_gpu(ranks.local_rank)
            if not ranks.leader:
                result = follow(ranks, device=device)
                return 130 if result is not None and result.interrupted else 0
            code = command(ranks, *args, **kwargs)
            ranks.finish()
            return code

    return functools.update_wrapper(run, command)


def _interrupted(result: TrainResult) -> int:
    click.echo(
        f"interrupted at step {result.step}/{result.steps}; state saved in {result.run_dir}; "
        f"continue with: tk train-model --resume {result.run_dir}",
        err=True,
    )
    return 130


@click.command("train-model")
@click.argument("corpus", nargs=-1, type=click.Path(path_type=Path))
@tokenizer_option("tokenizer.safetensors (default: train one on the corpus into RUN_DIR)")
@out_option("run_dir", "run directory", required=False)
@click.option(
    "--resume",
    "resume",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[RUN_DIR]",
    help="continue the run in RUN_DIR (or -o) exactly where it stopped",
)
@path_option(
    "--init-from",
    metavar="MODEL",
    help="start a new run from MODEL's weights and tokenizer (a run directory or model file, "
    "e.g. one `tk import-hf` wrote); the model's shape comes from it",
)
@path_option(
    "--chat",
    metavar="DATA.jsonl",
    help='fine-tune --init-from MODEL on these conversations (JSONL of {"messages": [...]}), in place of '
    "CORPUS: only the assistant's tokens count in the loss; --val FILE holds conversations out",
)
@_training_options
@_run_corpus_options
@overwrite_option("replace the files of another run in RUN_DIR (otherwise refused)")
@quiet_option("no progress bar or notes, only the summary")
@device_option
@_on_ranks
@special_options
def train_model_command(
    ranks,
    corpus,
    tokenizer_path,
    run_dir,
    resume,
    init_from,
    chat,
    overwrite,
    quiet,
    reading,
    device,
    special_policy,
    **kwargs,
) -> int:
    """Train a GPT on CORPUS; checkpoints, log and token cache go in RUN_DIR.

    CORPUS: files and directories (every file below, sorted by path), gzip, bzip2, xz and zstd
    files, JSON Lines with --text-field; several are read in order. - (stdin) and pipes
    (<(zcat a.gz)) are read once and kept as they came in RUN_DIR/corpus.stream (--val's in
    val.stream), which the run reads from then on, --resume too (not under mpirun). Text in
    CORPUS or --val that looks like a special token of the tokenizer is an error unless
    --allow-special (read as the special token) or --specials-as-text (its bytes); the token
    cache is per policy, and --resume keeps the run's.

    RUN_DIR/model.safetensors holds the best evaluated weights with the tokenizer inside (one
    file is enough to predict); RUN_DIR/train_state.safetensors the last state for --resume.
    Ctrl-C (or SIGTERM) saves and exits; --resume then continues bit-exactly. A RUN_DIR holding
    another run's files is refused unless --overwrite. Under mpirun each rank computes --workers
    shards of each batch: the same bits as --workers (ranks x workers) in one process. With
    --device cuda the model trains on the GPU (under mpirun one shard per rank, each rank on its
    own GPU); its files are the same kind (resume on either).

    --chat DATA.jsonl --init-from MODEL fine-tunes MODEL on conversations instead of CORPUS: its
    tokenizer gains the chat template's tokens, each conversation goes whole into a row of the
    context (one longer is refused), and the loss counts the assistant's tokens alone (log.jsonl's
    `counted` is their share of each batch); --val FILE holds conversations out.

    \b
    Example:
      tk train-model corpora/tiny_tales.txt -t tok.safetensors -o runs/tales --steps 500
      tk train-model --resume runs/tales
      tk train-model corpora/tiny_tales.txt --init-from runs/demo -o runs/tuned --steps 100
      tk train-model --chat chats.jsonl --init-from runs/demo -o runs/chat --steps 300
      tk train-model data/ --glob '*.jsonl.gz' --text-field text --eot '<|endoftext|>' --val val.jsonl -o runs/docs
      python make_corpus.py | tk train-model - -t tok.safetensors -o runs/made --steps 500
    """
    from tokenkit.pipeline.checkpoint import load_tokenizer
    from tokenkit.pipeline.resume import resume_training
    from tokenkit.pipeline.start import train_model
    from tokenkit.pipeline.start_from import StartFrom

    say = notes(quiet)
    check_device(device)
    given = _given(kwargs, fresh=resume is None, ranks=ranks)
    _check_val(reading.val, given)
    _check_workers_on(device, given, ranks)
    if chat is not None:
        _check_chat(corpus if resume is None else (), tokenizer_path, init_from, resume, reading, special_policy)
    if resume is not None:
        target = Path(resume) if resume else run_dir
        if target is None:
            raise click.UsageError("--resume needs the run directory: --resume RUN_DIR or -o RUN_DIR")
        if resume and run_dir is not None and Path(resume) != run_dir:
            raise click.UsageError(f"--resume {resume} and -o {run_dir} name different run directories; give one")
        if target.is_file():
            raise click.UsageError(f"--resume takes a run directory, and {target} is a file")
        if overwrite:
            raise click.UsageError("--overwrite starts a new run; it cannot be combined with --resume")
        if init_from is not None:
            raise click.UsageError("--init-from starts a new run; a resumed run continues from its own weights")
        tok = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
        flags = {
            "inputs": corpus,
            "val": reading.val,
            "glob": reading.glob,
            "text_field": reading.text_field,
            "binary": reading.binary or None,
            "eot": reading.eot,
            "specials": policy_name(special_policy) if special_policy != SPECIALS["refuse"] else None,
        }
        changes = {name: value for name, value in flags.items() if value}  # what was given: in place of the recorded
        result = resume_training(
            target,
            tokenizer=tok,
            overrides=given,
            corpus_overrides=changes,
            chat=chat,
            ranks=ranks,
            device=device,
            quiet=quiet,
            say=say,
        )
    elif chat is not None:
        from tokenkit.pipeline.chat_data import ChatSpec
        from tokenkit.pipeline.chat_start import train_chat

        if run_dir is None:
            raise click.UsageError("missing -o RUN_DIR: where the checkpoints and logs go")
        init = StartFrom.load(init_from)
        config = TrainConfig.from_dict(init.settings(given))
        spec = ChatSpec(str(chat), str(reading.val[0]) if reading.val else None)
        result = train_chat(
            spec, run_dir, init, config, overwrite=overwrite, ranks=ranks, device=device, quiet=quiet, say=say
        )
    else:
        if not corpus:
            raise click.UsageError("missing CORPUS (or --resume RUN_DIR to continue a run)")
        if run_dir is None:
            raise click.UsageError("missing -o RUN_DIR: where the checkpoints and logs go")
        init = StartFrom.load(init_from) if init_from is not None else None
        config = TrainConfig.from_dict(init.settings(given) if init is not None else given)
        inputs = reading.spec(corpus, special_policy).open(warn=warn)
        tok = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
        result = train_model(
            inputs,
            run_dir,
            tok,
            config,
            init=init,
            overwrite=overwrite,
            ranks=ranks,
            device=device,
            quiet=quiet,
            say=say,
        )
    _summary(result)
    return _interrupted(result) if result.interrupted else 0


@click.command("pipeline")
@click.argument("corpus", nargs=-1, type=click.Path(path_type=Path))
@out_option("run_dir", "run directory")
@click.option(
    "--vocab-size",
    default=DEFAULT_VOCAB_SIZE,
    show_default=True,
    type=count(256, MAX_VOCAB_SIZE),
    help="tokenizer vocabulary size",
)
@_training_options
@_run_corpus_options
@click.option("--prompt", default=None, help="prompt for the final sample (default: words from the validation text)")
@max_new_tokens_option("tokens in the final sample  [default: what fills the model's context; --chat: 32 an answer]")
@chat_options
@overwrite_option("redo stages whose outputs are stale, and replace files not made by the pipeline")
@quiet_option("no progress bars or notes")
@device_option
@_on_ranks
@special_options
def pipeline_command(
    ranks,
    corpus,
    run_dir,
    vocab_size,
    prompt,
    max_new_tokens,
    overwrite,
    quiet,
    reading,
    device,
    special_policy,
    **kwargs,
) -> int:
    """Tokenizer -> encode -> train -> sample, each stage skipped when RUN_DIR already has it.

    CORPUS is read as train-model reads it (files, directories, compressed files, JSONL; - and
    pipes kept in RUN_DIR/corpus.stream); --eot and --val too. --allow-special and
    --specials-as-text apply to the corpus, --val and --prompt, as train-model's and generate's.

    Rerunning continues an interrupted training run and reuses finished stages. A stage whose
    inputs changed (a new corpus, another vocabulary size or training settings) would replace
    its output: that needs --overwrite.

    --chat goes on to a model you can talk to: RUN_DIR/base is the pipeline's run on CORPUS
    (default corpora/tiny_tales.txt; the training flags are its), RUN_DIR/chat that model
    fine-tuned on --dialogues (default corpora/tiny_dialogues.jsonl), RUN_DIR/accuracy.json the
    held-out answer accuracy (--held-out) of both; it ends with a conversation about a held-out
    story. Rerunning continues it as above.

    \b
    Example:
      tk pipeline corpora/tiny_tales.txt -o runs/demo
      tk pipeline --chat -o runs/road
    """
    from tokenkit.pipeline import checkpoint
    from tokenkit.pipeline.run import generate, predict_next, run_pipeline, token_text

    road = take_chat_options(kwargs, corpus)
    say = notes(quiet)
    check_device(device)
    given = _given(kwargs, ranks=ranks)
    _check_val(reading.val, given)
    _check_workers_on(device, given, ranks)
    if road is not None:
        return run_chat_pipeline(ranks, corpus, run_dir, road, given, vocab_size=vocab_size, prompt=prompt,
                                 max_new_tokens=max_new_tokens, overwrite=overwrite, quiet=quiet, device=device,
                                 spec=lambda c: reading.spec(c, special_policy).open(warn=warn))  # fmt: skip
    config = TrainConfig.from_dict(given)
    inputs = reading.spec(corpus, special_policy).open(warn=warn)
    result = run_pipeline(
        inputs,
        run_dir,
        vocab_size=vocab_size,
        config=config,
        overwrite=overwrite,
        ranks=ranks,
        device=device,
        quiet=quiet,
        say=say,
    )
    if result.train is not None:
        _summary(result.train)
        if result.train.interrupted:
            return _interrupted(result.train)
    model, tok, meta = checkpoint.load_model(run_dir, device=device)
    text = prompt if prompt is not None else result.prompt
    if prompt is None:  # decoded from the validation ids: a special token in it (--eot) was one there
        special_policy = {"allowed_special": "all", "disallowed_special": "all"}
    say = once(note)  # predict and generate read the same prompt: a long one is warned of once
    pred = predict_next(model, tok, text, top_k=5, say=say, **special_policy)
    click.echo(f"\npredict-next {text!r}:")
    for token_id, p in pred.top:
        click.echo(f"  {p:7.4f}  {token_text(tok, token_id)}")
    if max_new_tokens is None:  # past the context the window shifts and the model forgets the start
        context = model.config.context_length
        max_new_tokens = max(context - len(pred.prompt_ids), context // 2)
    click.echo(f"\ngenerate (greedy, {max_new_tokens} tokens):")
    stream_text(
        text,
        generate(model, tok, text, max_new_tokens=max_new_tokens, temperature=0.0, say=say, **special_policy),
    )
    return 0


COMMANDS = (train_model_command, pipeline_command)
