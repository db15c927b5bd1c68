"""Starting a training run: the corpus opened and checked, a tokenizer trained when none is
given, the memory checked, the run directory locked, and its first files written before the
loop trains (`train_model`; `tk pipeline` reaches it through pipeline/run.py).

Everything is validated before anything in the run directory is replaced or removed, and a run
replacing another run's files writes beside them until its first checkpoint (`rundir.NewRun`).

What it deliberately does not do: train (pipeline/train.py's loop), continue a run
(pipeline/resume.py), or start one from a model's weights by itself (pipeline/start_from.py
loads them; `train_model` takes them as `init`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tokenkit.bpe import Tokenizer
from tokenkit.pipeline import checkpoint, data, rundir, sources
from tokenkit.pipeline.config import DEFAULT_VOCAB_SIZE, TrainConfig
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.join import describe_split, train_joined
from tokenkit.pipeline.ranks import Ranks
from tokenkit.pipeline.start_from import StartFrom
from tokenkit.pipeline.train import TrainingRun, TrainResult
from tokenkit.pipeline.train_memory import check_training_memory

if TYPE_CHECKING:
    from tokenkit.pipeline.chat_data import ChatData


def fit_tokenizer(corpus, vocab_size: int = DEFAULT_VOCAB_SIZE, *, quiet: bool = False) -> Tokenizer:
    """A BPE tokenizer trained on `corpus` (a path, CorpusSpec or RunCorpus; its training inputs
    only) with the defaults (GPT-2 split pattern), in memory; its eot token is a special token."""
    rc = sources.open_corpus(corpus)
    specials = [rc.spec.eot] if rc.spec.eot is not None else []
    return Tokenizer.train(rc.train, vocab_size=vocab_size, special_tokens=specials, quiet=quiet)


def train_model(
    corpus,
    run_dir: str | Path,
    tokenizer: Tokenizer | None = None,
    config: TrainConfig | None = None,
    *,
    overwrite: bool = False,
    tokens: data.TokenData | None = None,
    on_start: Callable[[Path], None] | None = None,
    init: StartFrom | None = None,
    ranks: Ranks | None = None,
    device: str = "cpu",
    quiet: bool = False,
    say: Callable[[str], None] = lambda msg: None,
) -> TrainResult:
    """Train a fresh model on `corpus` in `run_dir` (encoding the corpus first, or reusing the cache).

    `corpus`: a path, a list of paths, a `sources.CorpusSpec` (directories, compressed files,
    JSONL, an eot token, a validation corpus) or one already opened (`sources.RunCorpus`). Stdin
    ("-") and pipes are copied into the run directory once it is locked
    (`sources.store_streams`; kept as corpus.stream, val.stream when the run starts) and read
    from there. Without `tokenizer`, one is trained on the corpus (vocab DEFAULT_VOCAB_SIZE, the
    eot token as a special token) and saved in the run directory. Everything is validated first
    (corpus, settings, tokenizer, the encoded corpus's size, the model's memory) and nothing in
    `run_dir` is replaced or removed before the run starts. A directory holding another run's
    files is refused unless `overwrite`; use `resume_training` to continue one. `run_dir` is
    locked for the whole run (`pipeline.rundir`). `tokens` skips encoding when the caller has
    just prepared them (their pending file, if any, is committed here); `on_start` is called
    once everything is validated, before the first file is written (the pipeline commits its
    tokenizer there, into the directory it is given). A run replacing another run's files
    (`overwrite`) writes its own beside them and moves them in at its first checkpoint
    (`rundir.NewRun`): until then, and if it fails or is killed before, the directory holds the
    old run whole. `init` starts from its weights and tokenizer instead of random ones
    (`config` must have its shape: `StartFrom.settings`). `ranks`: this is rank 0 of an MPI job
    whose other ranks run `follow` (pipeline/join.py); `config.workers` then counts every rank's
    shards. `device`: "cpu" or "cuda" (the whole batch in this process on the GPU, or under MPI
    one shard per rank on its GPU; the files are the same kind either way).
    """
    config = config or TrainConfig()
    corpus = sources.open_corpus(corpus, warn=lambda msg: say(f"warning: {msg}"))
    refuse_streams_under_mpi(corpus.spec, ranks)
    if init is not None:
        if tokenizer is not None and tokenizer.fingerprint() != init.tokenizer.fingerprint():
            raise PipelineError(f"the given tokenizer is not the one in {init.path}; drop -t to use the model's own")
        tokenizer = init.tokenizer
        init.check_shape(config)
    if tokenizer is not None:
        sources.check_eot(tokenizer, corpus.spec)
    vocab_size = init.model_config.vocab_size if init is not None else None  # padded beyond the tokenizer's, maybe
    check_training_memory(
        config, vocab_size or (tokenizer.vocab_size if tokenizer is not None else DEFAULT_VOCAB_SIZE), ranks, device
    )
    with rundir.RunDir(run_dir) as rd:
        run_dir = rd.path
        own = list(rundir.TRAINED_FILES)
        if tokenizer is None:
            own.append(checkpoint.TOKENIZER_FILE)
        overwrite = rd.replaced(own, overwrite, say)
        corpus = sources.store_streams(corpus, run_dir, say)  # validated and locked: now a stream may be read
        try:
            corpus.val_fingerprint()  # a malformed --val stops the run here, before any training
            if tokenizer is None:
                eot = f" and the special token {corpus.spec.eot!r}" if corpus.spec.eot is not None else ""
                say(
                    f"no tokenizer given (-t): training one on {corpus.spec.describe()} "
                    f"with the defaults (vocab {DEFAULT_VOCAB_SIZE}){eot}"
                )
                tokenizer = fit_tokenizer(corpus, quiet=quiet)
            if tokens is None:
                tokens = data.prepare_tokens(corpus, tokenizer, run_dir, quiet=quiet, commit=False)
        finally:
            corpus.discard()  # copies of streams are still the corpus's only when this failed (the tokens took them)
        try:
            if not overwrite and tokens.pending:  # the cache holds another corpus's ids
                rundir.refuse_conflicts(run_dir, rd.present(list(tokens.pending)))
            with new_run(rd, tokens, tokenizer, config, init=init, ranks=ranks, device=device, quiet=quiet) as run:
                if on_start is not None:
                    on_start(run.files.dir)
                if checkpoint.TOKENIZER_FILE in own:
                    tokenizer.save(run.files.dir / checkpoint.TOKENIZER_FILE)
                    say(f"tokenizer: saved {run_dir / checkpoint.TOKENIZER_FILE} (vocab {tokenizer.vocab_size})")
                data.commit_tokens(tokens, run_dir, into=run.files.dir)
                say(encode_note(tokens, run_dir))
                return train_fresh(run, _describe, say)
        finally:
            tokens.discard()  # pending only when the run did not start


@contextlib.contextmanager
def new_run(
    rd: rundir.RunDir,
    tokens: data.TokenData | ChatData,
    tokenizer: Tokenizer,
    config: TrainConfig,
    *,
    init: StartFrom | None,
    ranks: Ranks | None,
    device: str,
    quiet: bool,
) -> Iterator[TrainingRun]:
    """A fresh run in `rd`'s directory (`TrainingRun` checks it first), its files written there
    (`run.files`), or beside another run's until its first checkpoint (`rundir.NewRun`): staged
    files of a run that ends before its first checkpoint go again, and the old run stays."""
    vocab_size = init.model_config.vocab_size if init is not None else None  # padded beyond the tokenizer's, maybe
    run = TrainingRun(
        rd.path,
        tokens,
        tokenizer,
        config,
        quiet=quiet,
        init=init,
        ranks=ranks,
        device=device,
        vocab_size=vocab_size,
    )  # checks
    run.files = new = rundir.NewRun(rd.path, staged=bool(rd.present()))
    try:
        yield run
    finally:
        new.discard()  # staged only when the run ended before its first checkpoint


def train_fresh(
    run: TrainingRun, describe: Callable[[TrainingRun, Callable[[str], None]], None], say: Callable[[str], None]
) -> TrainResult:
    """Train `new_run`'s run from its first step: its log begun empty, its summary said (`describe`)."""
    checkpoint.write_text(run.files.dir / checkpoint.LOG_FILE, "")
    describe(run, say)
    return train_joined(run)


def refuse_streams_under_mpi(spec: sources.CorpusSpec, ranks: Ranks | None) -> None:
    """One line when an MPI run is given stdin or a pipe: the launcher decides which rank, if
    any, gets them, so a run under mpirun reads only files."""
    streams = spec.stream_inputs() if ranks is not None else []
    if streams:
        shown = "stdin (-)" if "-" in streams else f"the pipe {streams[0]}"
        raise PipelineError(
            f"under mpirun, {shown} cannot be a run's corpus (the launcher decides which rank, if any, reads it); "
            "save the stream to a file first, or run tk without mpirun, which keeps a copy in the run directory"
        )


def encode_note(tokens: data.TokenData, run_dir: Path) -> str:
    """The 'encode:' line: whether the token files were reused, and what they hold."""
    where = f"{len(tokens.ids):,} tokens in {run_dir / checkpoint.TOKENS_FILE}"
    if tokens.val_ids is not None:
        where += f", {len(tokens.val_ids):,} in {run_dir / checkpoint.VAL_TOKENS_FILE}"
    return f"encode: {'up to date' if tokens.reused else 'encoded'} ({where})"


def _describe(run: TrainingRun, say: Callable[[str], None]) -> None:
    """The run's summary lines: the model, the data, and under MPI how each batch is shared."""
    n_params = sum(int(p.size) for p in run.model.params.values())
    cfg = run.model.config
    family = "" if cfg.architecture == "gpt2" else f"{cfg.architecture}, "
    scaled = f", RoPE scaled ({cfg.rope_scaling.type}, factor {cfg.rope_scaling.factor:g})" if cfg.rope_scaling else ""
    say(f"model: {n_params:,} parameters ({family}{cfg.describe()}{scaled})")
    val = f" (--val {run.tokens.spec.describe(val=True)})" if run.tokens.val_ids is not None else ""
    say(
        f"data: {len(run.train_ids):,} train / {len(run.val_ids):,} validation tokens{val}; "
        f"unigram baseline {run.baseline:.3f} nats/token"
    )
    if run.ranks is not None:
        say(describe_split(run))
