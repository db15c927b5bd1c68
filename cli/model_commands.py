"""`tk train-model`, `tk predict-next`, `tk generate`, `tk info`, `tk pipeline`, `tk export-hf`, `tk import-hf`:
thin wrappers over `pipeline`.

Each command parses flags, calls the pipeline API and prints. Progress and notes go to stderr,
results (tables, generated text, summaries) to stdout. User mistakes arrive as PipelineError /
TokenizerError / ModelError and become one line in `cli.main`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import click

from tokenkit.cli.launch import check_device, device_option, end_together, mpi_world
from tokenkit.cli.params import Number, count, real
from tokenkit.cli.specials import policy_name, special_options
from tokenkit.cli.tokenizer_commands import corpus_options
from tokenkit.common import atomic, atomic_dir
from tokenkit.pipeline import PipelineError, checkpoint, hf, views
from tokenkit.pipeline.config import DEFAULT_VOCAB_SIZE, Range, TrainConfig, load_config_file
from tokenkit.pipeline.join import follow
from tokenkit.pipeline.ranks import Ranks
from tokenkit.pipeline.resume import resume_training
from tokenkit.pipeline.run import (
    MAX_NEW_TOKENS,
    generate,
    load_model_and_tokenizer,
    load_tokenizer,
    predict_next,
    run_pipeline,
    token_text,
)
from tokenkit.pipeline.sources import SPECIAL_FLAGS, SPECIALS, CorpusSpec
from tokenkit.pipeline.start import train_model
from tokenkit.pipeline.start_from import StartFrom
from tokenkit.pipeline.train import TrainResult
from tokenkit.transformer import GPTConfig
from tokenkit.transformer.backends import use_gpu
from tokenkit.transformer.config import MAX_VOCAB_SIZE

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
        else:
            typ = click.Choice(allowed)
        func = click.option(flag, f.name, type=typ, default=None, help=f"{text} [default: {f.default}]")(func)
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


def _run_corpus_options(func):
    """CORPUS's reading flags (--glob, --text-field, --binary, as bpe-train's), --eot and --val."""
    func = corpus_options(func)
    func = click.option(
        "--eot",
        metavar="TOKEN",
        help="Put this special token between documents (files, JSONL records) in the token files; "
        "a tokenizer trained here gets it, a given one (-t) must have it.",
    )(func)
    func = click.option(
        "--val",
        "val",
        multiple=True,
        type=click.Path(path_type=Path),
        metavar="FILE",
        help="Validate on this corpus (repeatable; files, directories, compressed, JSONL, - or a pipe "
        "as CORPUS) instead of the last --val-fraction of CORPUS.",
    )(func)
    return func


def _corpus_spec(corpus, val, eot, glob, text_field, binary, special_policy) -> CorpusSpec:
    return CorpusSpec(
        tuple(str(p) for p in corpus),
        glob=glob,
        text_field=text_field,
        binary=binary,
        eot=eot,
        val=tuple(str(p) for p in val),
        specials=policy_name(special_policy),
    )


def _check_val(val, given: dict[str, Any]) -> None:
    if val and "val_fraction" in given:
        raise click.UsageError("--val and --val-fraction exclude each other: --val validates on its own corpus")


def _check_workers_on(device: str, given: dict[str, Any], ranks: Ranks | None) -> None:
    if device == "cpu" or given.get("workers", 0) <= (1 if ranks is None else ranks.size):  # per rank: at most 1
        return
    where = "in this process on the GPU" if ranks is None else "one shard per rank, on each rank's GPU"
    raise click.UsageError(
        f"--workers splits batches over CPU processes; with --device {device} the batch runs {where}: drop --workers"
    )


def _say(quiet: bool):
    return (lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True))


def _warn(msg: str) -> None:
    click.echo(msg, err=True)


def _warn_line(msg: str) -> None:
    """A corpus's warning (an input that does not look like text), shown even with --quiet."""
    click.echo(f"warning: {msg}", err=True)


def _summary(result: TrainResult) -> None:
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
    click.echo(
        f"step {result.step}/{result.steps}: {last} (best {best}; unigram baseline {result.unigram_baseline:.4f}); "
        f"{result.seconds:.1f} s, {result.tokens_per_s:,.0f} tokens/s"
    )
    if (result.run_dir / checkpoint.MODEL_FILE).exists():
        click.echo(f"model: {result.run_dir / checkpoint.MODEL_FILE}")


def _on_ranks(command):
    """Run `command(ranks, ...)` alone, or under mpirun/srun as rank 0 with the other ranks
    following its training (they print nothing and exit with its code)."""

    def run(*args, **kwargs) -> int:
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


# --- train-model -----------------------------------------------------------------------------


@click.command("train-model")
@click.argument("corpus", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "-t",
    "--tokenizer",
    "tokenizer_path",
    type=click.Path(path_type=Path),
    help="tokenizer.safetensors (default: train one on the corpus into RUN_DIR)",
)
@click.option("-o", "--out", "run_dir", type=click.Path(file_okay=False, path_type=Path), help="run directory")
@click.option(
    "--resume",
    "resume",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[RUN_DIR]",
    help="continue the run in RUN_DIR (or -o) exactly where it stopped",
)
@click.option(
    "--init-from",
    "init_from",
    type=click.Path(path_type=Path),
    metavar="MODEL",
    help="start a new run from MODEL's weights and tokenizer (a run directory or model file, "
    "e.g. one `tk import-hf` wrote); the model's shape comes from it",
)
@_training_options
@_run_corpus_options
@click.option("--overwrite", is_flag=True, help="replace the files of another run in RUN_DIR (otherwise refused)")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar or notes, only the summary")
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
    overwrite,
    quiet,
    val,
    eot,
    glob,
    text_field,
    binary,
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

    \b
    Example:
      tk train-model corpora/tiny_tales.txt -t tok.safetensors -o runs/tales --steps 500
      tk train-model --resume runs/tales
      tk train-model corpora/tiny_tales.txt --init-from runs/demo -o runs/tuned --steps 100
      tk train-model data/ --glob '*.jsonl.gz' --text-field text --eot '<|endoftext|>' --val val.jsonl -o runs/docs
      python make_corpus.py | tk train-model - -t tok.safetensors -o runs/made --steps 500
    """
    say = _say(quiet)
    check_device(device)
    given = _given(kwargs, fresh=resume is None, ranks=ranks)
    _check_val(val, given)
    _check_workers_on(device, given, ranks)
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
            "val": val,
            "glob": glob,
            "text_field": text_field,
            "binary": binary or None,
            "eot": eot,
            "specials": policy_name(special_policy) if special_policy != SPECIALS["refuse"] else None,
        }
        changes = {name: value for name, value in flags.items() if value}  # what was given: in place of the recorded
        result = resume_training(
            target,
            tokenizer=tok,
            overrides=given,
            corpus_overrides=changes,
            ranks=ranks,
            device=device,
            quiet=quiet,
            say=say,
        )
    else:
        if not corpus:
            raise click.UsageError("missing CORPUS (or --resume RUN_DIR to continue a run)")
        if run_dir is None:
            raise click.UsageError("missing -o RUN_DIR: where the checkpoints and logs go")
        init = StartFrom.load(init_from) if init_from is not None else None
        config = TrainConfig.from_dict(init.settings(given) if init is not None else given)
        inputs = _corpus_spec(corpus, val, eot, glob, text_field, binary, special_policy).open(warn=_warn_line)
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


# --- predict-next ----------------------------------------------------------------------------


def model_options(command):
    """-m MODEL (a run directory or model file) and -t TOKENIZER, as the commands that run a
    trained model take them."""
    command = click.option(
        "-t",
        "--tokenizer",
        "tokenizer_path",
        type=click.Path(path_type=Path),
        help="tokenizer.safetensors, for a model file without one embedded (GPT.save's)",
    )(command)
    return click.option(
        "-m",
        "--model",
        "model_path",
        required=True,
        type=click.Path(path_type=Path),
        help="run directory or model.safetensors",
    )(command)


@click.command("predict-next")
@model_options
@click.argument("text")
@click.option("--top-k", default=10, show_default=True, type=count(1), help="rows in the table of likely tokens")
@click.option(
    "--json", "as_json", is_flag=True, help='print {"top": [{"id", "token", "p"}, ...], "prompt_ids": [...]} instead'
)
@special_options
@device_option
def predict_next_command(model_path, tokenizer_path, text, top_k, as_json, special_policy, device) -> int:
    """The most likely token after TEXT (argmax), then the top K with their probabilities.

    \b
    Example:
      tk predict-next -m runs/tales "Once upon a time, there was a"
      tk predict-next -m runs/tales "Once upon a time" --top-k 3 --json
      tk predict-next -m runs/tales "The end.<|endoftext|>" --allow-special
    """
    check_device(device)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    if as_json:  # tk serve's /api/next; a token that is part of a character shows its bytes escaped, e.g. "\\xc3"
        doc = views.next_view(model, tok, text, top_k=top_k, policy=special_policy, say=_warn)
        click.echo(json.dumps(doc, ensure_ascii=False))
        return 0
    pred = predict_next(model, tok, text, top_k=top_k, say=_warn, **special_policy)
    best_id, best_p = pred.top[0]
    click.echo(f"next token: {token_text(tok, best_id)} (id {best_id}, p = {best_p:.4f})")
    click.echo("")
    click.echo(f"{'rank':>4}  {'id':>6}  {'probability':>11}  text")
    for rank, (token_id, p) in enumerate(pred.top, 1):
        click.echo(f"{rank:>4}  {token_id:>6}  {p:>11.4f}  {token_text(tok, token_id)}")
    return 0


# --- generate --------------------------------------------------------------------------------


@click.command("generate")
@model_options
@click.argument("prompt")
@click.option(
    "-n", "--max-new-tokens", default=100, show_default=True, type=count(0, MAX_NEW_TOKENS), help="tokens to generate"
)
@click.option("--temperature", default=1.0, show_default=True, type=real(0), help="0 = greedy (argmax)")
@click.option("--top-k", default=None, type=count(1), help="sample among the K most likely tokens")
@click.option(
    "--top-p", default=None, type=real(0, 1, low_open=True), help="sample among the smallest set with probability >= P"
)
@click.option("--seed", default=None, type=count(0), help="seed for reproducible sampling")
@special_options
@device_option
def generate_command(
    model_path, tokenizer_path, prompt, max_new_tokens, temperature, top_k, top_p, seed, special_policy, device
) -> int:
    """Continue PROMPT, streaming the text as it is generated (KV-cached decoding).

    \b
    Example:
      tk generate -m runs/tales "Once upon a time" -n 60 --temperature 0.8 --seed 1
      tk generate -m runs/tales "The end.<|endoftext|>" --allow-special -n 60
    """
    check_device(device)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    pieces = generate(
        model,
        tok,
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        say=_warn,
        **special_policy,
    )
    _stream(prompt, pieces)
    return 0


def _stream(prompt: str, pieces) -> None:
    """Echo the prompt, then each piece as it comes (click.echo flushes)."""
    first = next(pieces, "")  # a bad prompt or flag fails, and notes are said, before any text is printed
    click.echo(prompt + first, nl=False)
    for piece in pieces:
        click.echo(piece, nl=False)
    click.echo("")


# --- info ------------------------------------------------------------------------------------


@click.command("info")
@click.argument("file", type=click.Path(path_type=Path))
def info_command(file) -> int:
    """What a tokenizer, model or training-state file (or a run directory) holds.

    \b
    Example:
      tk info runs/tales/model.safetensors
    """
    path = checkpoint.resolve_model_path(file) if Path(file).is_dir() else Path(file)
    meta = checkpoint.read_header(path)
    fmt = meta.get("format")
    if fmt == checkpoint.TOKENIZER_FORMAT:
        _info_tokenizer(path, meta)
    elif fmt == checkpoint.MODEL_FORMAT:
        _info_model(path)
    elif fmt == checkpoint.STATE_FORMAT:
        _info_state(path)
    else:
        found = f"format {fmt!r}" if fmt else "no tokenkit format tag"
        raise PipelineError(f"{path} is not a tokenkit tokenizer, model or training-state file ({found})")
    return 0


def _row(key: str, value: Any) -> None:
    click.echo(f"{key + ':':<22}{value}")


def _info_tokenizer(path: Path, meta: dict[str, str]) -> None:
    tok = load_tokenizer(path)
    _row("file", path)
    _row("format", f"{meta.get('format')} v{meta.get('format_version')} (tokenizer)")
    n_special = len(tok.special_tokens)
    parts = (
        f"{tok.vocab_size - n_special} tokens listed, {len(tok.merges)} merges, {n_special} special"
        if tok.listed
        else f"256 bytes + {len(tok.merges)} merges + {n_special} special"
    )
    _row("vocab size", f"{tok.vocab_size} ({parts})")
    _row("pattern", tok.pattern)
    _row("special tokens", json.dumps(tok.special_tokens, ensure_ascii=False) if tok.special_tokens else "none")
    if tok.bos is not None:
        _row("bos", f"{tok.bos} (before every text a model reads)")
    _row("fingerprint", tok.fingerprint())
    for key in sorted(meta):
        if key == "training":
            _training_rows(tok.training)
        elif key not in ("format", "format_version", "pattern", "pattern_regex", "special_tokens"):
            _row(key, meta[key])


def _training_rows(training: dict[str, Any]) -> None:
    """How the tokenizer was made, its merge counts summed up (1,024 numbers are not a row)."""
    counts = training.pop("merge_counts", None)
    _row("training", json.dumps(training, ensure_ascii=False, sort_keys=True))
    if isinstance(counts, list) and counts:
        _row("merge counts", f"recorded for the first {len(counts):,} merges ({counts[0]:,} down to {counts[-1]:,})")


def _info_model(path: Path) -> None:
    model, tok, meta = checkpoint.load_model(path, tokenizer_required=False)
    n_params = sum(int(p.size) for p in model.params.values())
    _row("file", path)
    what = "model + embedded tokenizer" if tok is not None else "model; no tokenizer embedded"
    _row("format", f"{meta.get('format')} v{meta.get('format_version')} ({what})")
    _row("architecture", model.config.architecture)
    _row("config", json.dumps(model.config.to_dict()))
    if model.config.rope_scaling is not None:
        _row("rope scaling", model.config.rope_scaling.describe())
    _row("parameters", f"{n_params:,}")
    if tok is not None:
        padding = model.config.vocab_size - tok.vocab_size
        padded = f", and {padding:,} padding ids" if padding > 0 else ""
        _row(
            "vocab size",
            f"{model.config.vocab_size} (tokenizer {meta.get('tokenizer_fingerprint', '')[:16]}...{padded})",
        )
        if tok.bos is not None:
            _row("bos", f"{tok.bos} (before every text the model reads)")
    prov = meta.get("provenance") or {}
    if "step" in meta and not (isinstance(prov, dict) and "imported_from" in prov):
        _row("training step", meta.get("step"))
    val = meta.get("val_loss")
    if val is not None:
        _row("validation loss", f"{val:.4f}" if isinstance(val, float) else val)
    if isinstance(prov, dict):
        base = prov.get("unigram_baseline")
        if isinstance(base, float):
            _row("unigram baseline", f"{base:.4f}")
        if "corpus" in prov:
            _corpus_rows(prov)
        labels = {
            "corpus_sha256": "corpus sha256",
            "corpus_fingerprint": "corpus fingerprint",
            "val_fingerprint": "val fingerprint",
            "n_train_tokens": "train tokens",
            "tokenkit": "written by tokenkit",
            "imported_from": "imported from",
            "init_from": "initialised from",
        }
        for key, label in labels.items():
            if key in prov:
                _row(label, f"{prov[key]:,}" if isinstance(prov[key], int) else prov[key])
        if "train_config" in prov:
            _row("training config", json.dumps(prov["train_config"]))


def _corpus_rows(record: dict[str, Any], sizes: str = "") -> None:
    """The corpus a run recorded: its inputs and the flags that read them, and its --val."""
    try:
        spec = CorpusSpec.from_record(record)
    except PipelineError:
        _row("corpus", record.get("corpus"))
        return
    flags = [
        f"--glob {spec.glob!r}" if spec.glob is not None else "",
        f"--text-field {spec.text_field}" if spec.text_field else "",
        "--binary" if spec.binary else "",
        f"--eot {spec.eot!r}" if spec.eot is not None else "",
        SPECIAL_FLAGS[spec.specials] if spec.specials != "refuse" else "",
    ]
    flags = [f for f in flags if f]
    _row("corpus", spec.describe() + (f" ({', '.join(flags)})" if flags else "") + sizes)
    if spec.val:
        _row("val corpus", spec.describe(val=True))


def _info_state(path: Path) -> None:
    state = checkpoint.load_train_state(path)
    _row("file", path)
    _row("format", f"{checkpoint.STATE_FORMAT} v{checkpoint.FORMAT_VERSION} (state for --resume)")
    _row("training step", f"{state.step} of {state.train_config.get('steps')}")
    best = f"{state.best_val_loss:.4f} at step {state.best_step}" if state.best_val_loss is not None else "none yet"
    _row("best val loss", best)
    _row("config", json.dumps(state.model_config))
    scaling = GPTConfig.from_dict(state.model_config).rope_scaling
    if scaling is not None:
        _row("rope scaling", scaling.describe())
    _row("parameters", f"{sum(int(p.size) for p in state.params.values()):,}")
    _corpus_rows(state.data, f" ({state.data.get('n_train')} train / {state.data.get('n_val')} val tokens)")
    _row("training config", json.dumps(state.train_config))


# --- pipeline --------------------------------------------------------------------------------


@click.command("pipeline")
@click.argument("corpus", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o", "--out", "run_dir", required=True, type=click.Path(file_okay=False, path_type=Path), help="run directory"
)
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
@click.option(
    "-n",
    "--max-new-tokens",
    default=None,
    type=count(0, MAX_NEW_TOKENS),
    help="tokens in the final sample  [default: what fills the model's context]",
)
@click.option(
    "--overwrite", is_flag=True, help="redo stages whose outputs are stale, and replace files not made by the pipeline"
)
@click.option("-q", "--quiet", is_flag=True, help="no progress bars or notes")
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
    val,
    eot,
    glob,
    text_field,
    binary,
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

    \b
    Example:
      tk pipeline corpora/tiny_tales.txt -o runs/demo
    """
    say = _say(quiet)
    check_device(device)
    given = _given(kwargs, ranks=ranks)
    _check_val(val, given)
    _check_workers_on(device, given, ranks)
    config = TrainConfig.from_dict(given)
    inputs = _corpus_spec(corpus, val, eot, glob, text_field, binary, special_policy).open(warn=_warn_line)
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
    pred = predict_next(model, tok, text, top_k=5, say=_warn, **special_policy)
    click.echo(f"\npredict-next {text!r}:")
    for token_id, p in pred.top:
        click.echo(f"  {p:7.4f}  {token_text(tok, token_id)}")
    if max_new_tokens is None:  # past the context the window shifts and the model forgets the start
        context = model.config.context_length
        max_new_tokens = max(context - len(pred.prompt_ids), context // 2)
    click.echo(f"\ngenerate (greedy, {max_new_tokens} tokens):")
    _stream(
        text,
        generate(model, tok, text, max_new_tokens=max_new_tokens, temperature=0.0, say=_warn, **special_policy),
    )
    return 0


# --- export-hf / import-hf -------------------------------------------------------------------


@click.command("export-hf")
@click.argument("model_path", metavar="RUN_OR_MODEL", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    "directory",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="directory to write (created if needed)",
)
@click.option(
    "-t",
    "--tokenizer",
    "tokenizer_path",
    type=click.Path(path_type=Path),
    help="tokenizer.safetensors, for a model file without one embedded (GPT.save's)",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="replace the model and tokenizer files of a directory that is not an earlier export",
)
def export_hf_command(model_path, directory, tokenizer_path, overwrite) -> int:
    """Write a model as a Hugging Face transformers directory (GPT-2's or Llama's).

    DIR gets config.json, model.safetensors, generation_config.json and the tokenizer's files;
    transformers' AutoModelForCausalLM.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR)
    load them: GPT2LMHeadModel, or LlamaForCausalLM for a model with rotary positions, RMSNorm
    and SwiGLU (--arch llama). Post-norm, sinusoidal and bidirectional models have neither form.

    \b
    Example:
      tk export-hf runs/demo -o demo-hf
    """
    atomic_dir.check_output_dir(directory)
    result = hf.export_hf(model_path, directory, tokenizer_path=tokenizer_path, overwrite=overwrite)
    shape = _shape(result.config)
    click.echo(f"wrote {result.directory}: {result.architecture}, {result.n_params:,} parameters ({shape})")
    click.echo(f"files: {', '.join(sorted(p.name for p in result.files))}")
    if result.removed:
        click.echo(f"removed the earlier export's {', '.join(p.name for p in result.removed)}")
    return 0


@click.command("import-hf")
@click.argument("directory", metavar="DIR", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="model file to write (e.g. gpt2.safetensors)",
)
@click.option("--overwrite", is_flag=True, help="replace OUT if it exists")
@click.option(
    "--context",
    "context",
    type=click.IntRange(1),
    default=None,
    help="a window of this many tokens instead of max_position_embeddings (rotary models: Llama 3.1's 131,072 "
    "is beyond tk's 65,536)",
)
@click.option(
    "--tokenizer-json",
    "tokenizer_json",
    is_flag=True,
    help="read DIR/tokenizer.json as written, whatever class tokenizer_config.json names (SmolLM's names "
    "GPT2Tokenizer, which transformers 5 builds without the file's Digits split)",
)
def import_hf_command(directory, out, overwrite, context, tokenizer_json) -> int:
    """Read a transformers checkpoint directory into one tokenkit model file.

    DIR holds config.json (GPT-2's, or Llama's, Mistral's or Qwen2's), model.safetensors (or
    model.safetensors.index.json and its shards) and the tokenizer (a byte-level BPE
    tokenizer.json, or vocab.json + merges.txt). The -o file works with predict-next,
    generate, explain and info, and train-model --init-from fine-tunes it. pytorch_model.bin
    is a pickle and is refused: convert it to safetensors first.

    \b
    Example:
      tk import-hf gpt2-hf -o gpt2.safetensors
    """
    atomic.check_output(out)  # a device, FIFO or socket at -o is refused, with or without --overwrite
    result = hf.import_hf(directory, out, overwrite=overwrite, context_length=context, tokenizer_json=tokenizer_json)
    shards = f" in {result.shards} shards" if result.shards > 1 else ""
    source = "" if result.architecture == "GPT2LMHeadModel" else f" of {result.architecture}"
    click.echo(
        f"wrote {result.path}: {result.n_params:,} parameters{source} ({_shape(result.config)}; "
        f"{'/'.join(result.dtypes)}{shards} -> float32) + tokenizer"
    )
    return 0


def _shape(cfg) -> str:
    """A model's sizes in a few words (K/V heads and an untied head where a Llama-style model has them)."""
    return cfg.describe() + ("" if cfg.tie_embeddings else ", untied head")


COMMANDS = (
    train_model_command,
    predict_next_command,
    generate_command,
    info_command,
    pipeline_command,
    export_hf_command,
    import_hf_command,
)
