"""The training loop: AdamW on random windows, warmup + cosine LR, clipping, periodic evaluation.

One step = one batch of (B, T) windows -> loss and gradients -> global-norm clip -> AdamW update
at the scheduled learning rate. Every `eval_interval` steps (and at the last step) the model is
evaluated on fixed validation windows, `train_state.safetensors` is rewritten (the full state,
for `--resume`), and `model.safetensors` is rewritten when the validation loss is the best so
far. So `model.safetensors` holds the best evaluated weights and `train_state.safetensors` the
last checkpointed step.

Exact resume: the only state a step reads is the weights, the AdamW moments and step count,
the batch generator and the step number (the schedule is a pure function of it). All of it is
checkpointed, and evaluation draws from its own generator, so a run stopped at step k and
resumed produces the same batches, losses and bit-identical weights as one that never stopped.

Ctrl-C sets a flag that the loop reads between steps: the state at that step boundary is saved
and training returns with `interrupted=True`. A second Ctrl-C aborts at once (atomic writes
still leave the last checkpoint whole). A NaN or infinite loss stops training with a
PipelineError before the bad update is applied; the files on disk keep the last good checkpoint.

The settings are pipeline/config.py's TrainConfig; under mpirun, pipeline/ranks.py has rank 0
lead and the other ranks `follow`; on a GPU the model's backend does the math (`device`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from tokenkit import __version__
from tokenkit.bpe import Tokenizer
from tokenkit.common.processes import note_interrupt
from tokenkit.pipeline import checkpoint, data, rundir, sources
from tokenkit.pipeline.config import DEFAULT_VOCAB_SIZE, TrainConfig, _coerce, _flag, model_settings
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.ranks import Ranks
from tokenkit.transformer import GPT, AdamW, GPTConfig, clip_grad_norm, cosine_schedule
from tokenkit.transformer.backends import get_backend
from tokenkit.transformer.memory import check_memory
from tokenkit.transformer.parallel import DataParallel, MPIDataParallel, shard_rows
from tokenkit.transformer.runtime import available_cores

# --- the run ---------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """How a training session ended."""

    run_dir: Path
    step: int
    steps: int
    best_val_loss: float | None
    best_step: int | None
    last_val_loss: float | None
    last_val_step: int | None
    unigram_baseline: float
    interrupted: bool
    seconds: float
    tokens_per_s: float
    steps_run: int  # in this session; 0 when a finished run was resumed


@contextlib.contextmanager
def _interrupt_flag():
    """Turn the first SIGINT, SIGTERM or SIGHUP into a flag the loop polls between steps; a
    second one aborts. SIGTERM or SIGHUP left ignored (nohup) stays ignored. The signal is noted
    (common.processes.note_interrupt) for the exit code, 128 + its number."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signals only reach the main thread; plain KeyboardInterrupt handling applies
        return

    def handler(signum, frame):
        note_interrupt(signum)
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, handler)}
    try:
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None and signal.getsignal(signum) not in (signal.SIG_IGN, None):  # None: not Python's
                previous[signum] = signal.signal(signum, handler)
        yield flag
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class _Run:
    """One training session over a run directory (fresh or resumed)."""

    def __init__(
        self,
        run_dir: Path,
        tokens: data.TokenData,
        tokenizer,
        config: TrainConfig,
        *,
        quiet: bool,
        state: checkpoint.TrainState | None = None,
        init: StartFrom | None = None,
        ranks: Ranks | None = None,
        device: str = "cpu",
        vocab_size: int | None = None,
    ) -> None:
        if config.workers == 0:  # recorded as the count used, so a resume elsewhere is the same run
            config = dataclasses.replace(config, workers=_default_shards(ranks))
        self.run_dir = run_dir
        self.tokens = tokens
        self.tokenizer = tokenizer
        self.config = config
        self.quiet = quiet
        self.ranks = ranks
        self.leader = ranks is None or ranks.leader
        self.train_ids, self.val_ids = tokens.split(config.val_fraction, config.context_length)
        # the model's vocabulary: the tokenizer's, or more for weights padded beyond it (an import's)
        self.model_config = GPTConfig.from_dict(config.model_config(vocab_size or tokenizer.vocab_size))
        if device == "cpu":
            local_workers = config.workers if ranks is None else ranks.local_workers(config.workers)
        else:  # the batch, or under MPI one shard per rank, on the GPU (the recorded count serves a CPU resume)
            local_workers = 1
        check_memory(  # one line, not a MemoryError
            self.model_config,
            training=True,
            workers=local_workers,
            batch_rows=_process_rows(config.batch_size, local_workers, config.workers)
            if device == "cpu"
            else _device_rows(config.batch_size, ranks),
            device=device,
        )
        model = GPT(self.model_config, seed=config.seed, device=device)
        if ranks is None:
            self.model = DataParallel(model, workers=local_workers)
        else:  # each rank computes its shards; the same numbers as `workers` shards in one process
            self.model = MPIDataParallel(model, ranks.comm, workers=local_workers)
        self.files = rundir.NewRun(run_dir, staged=False)  # where this session writes (train_model may stage)
        self.init = init
        # the transformers class the weights were imported from, kept through fine-tuning (export-hf writes it)
        self.hf_architecture = init.hf_architecture if init is not None else state.hf_architecture if state else None
        if init is not None:  # a fresh run from given weights (its config is the weights' own)
            self.model.model.set_params(init.params)
        self.opt = AdamW(
            self.model.params,
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            weight_decay=config.weight_decay,
        )
        if state is None:
            self.step = 0
            self.rng = np.random.default_rng(config.seed)
            self.best_val_loss: float | None = None
            self.best_step: int | None = None
        else:
            self.model.model.set_params(state.params)
            self.opt.load_state_dict(state.optimizer)
            self.step = state.step
            self.rng = data.rng_from_array(state.rng)
            self.best_val_loss = state.best_val_loss
            self.best_step = state.best_step
        self.rows = self.model.local_rows(config.batch_size)  # of each batch: all, or this rank's
        self.val_batches = data.eval_batches(
            self.val_ids, config.eval_batches, config.batch_size, config.context_length, config.seed, rows=self.rows
        )
        # a statistic for the summary and the files, which only rank 0 writes
        self.baseline = (
            data.unigram_baseline(self.train_ids, self.val_ids, tokenizer.vocab_size) if self.leader else math.nan
        )
        self.last_val_loss: float | None = None
        self.last_val_step: int | None = None

    # -- what gets written -----------------------------------------------------------------

    def data_record(self) -> dict[str, Any]:
        return {
            **self.tokens.key(),
            "corpus": self.tokens.spec.to_dict(),
            "n_tokens": int(len(self.tokens.ids)),
            "n_train": int(len(self.train_ids)),
            "n_val": int(len(self.val_ids)),
        }

    def provenance(self) -> dict[str, Any]:
        return {
            "tokenkit": __version__,
            "corpus": self.tokens.spec.to_dict(),
            "corpus_fingerprint": self.tokens.corpus_fingerprint,
            **({"val_fingerprint": self.tokens.val_fingerprint} if self.tokens.val_ids is not None else {}),
            "n_train_tokens": int(len(self.train_ids)),
            "train_config": self.config.to_dict(),
            "unigram_baseline": self.baseline,
            **({"init_from": str(self.init.path)} if self.init is not None else {}),
            **({checkpoint.HF_ARCHITECTURE: self.hf_architecture} if self.hf_architecture else {}),
        }

    def save_state(self) -> None:
        checkpoint.save_train_state(
            self.files.dir / checkpoint.STATE_FILE,
            checkpoint.TrainState(
                step=self.step,
                params=self.model.host_params(),
                optimizer=self.opt.state_dict(),
                rng=data.rng_to_array(self.rng),
                best_val_loss=self.best_val_loss,
                best_step=self.best_step,
                train_config=self.config.to_dict(),
                model_config=self.model_config.to_dict(),
                data=self.data_record(),
                tokenizer=self.tokenizer,
                hf_architecture=self.hf_architecture,
            ),
        )

    def save_model(self, val_loss: float, best_val_loss: float) -> None:
        checkpoint.save_model(
            self.files.dir / checkpoint.MODEL_FILE,
            self.model.host_params(),
            self.tokenizer,
            config=self.model_config.to_dict(),
            step=self.step,
            val_loss=val_loss,
            best_val_loss=best_val_loss,
            provenance=self.provenance(),
        )

    # -- the loop ----------------------------------------------------------------------------

    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches."""
        B = self.config.batch_size
        return float(np.mean([self.model.loss(x, y, batch_rows=B) for x, y in self.val_batches]))

    # -- MPI: the followers join rank 0's run ------------------------------------------------

    def _state_arrays(self) -> dict[str, np.ndarray]:
        """Everything a step depends on besides the data, as arrays (to send to the followers)."""
        best = np.array([math.nan if self.best_val_loss is None else self.best_val_loss], dtype=np.float64)
        return {
            **{f"param.{k}": v for k, v in self.model.params.items()},
            **{f"opt.{k}": v for k, v in self.opt.state_dict().items()},
            "rng": data.rng_to_array(self.rng),
            "counters": np.array([self.step, -1 if self.best_step is None else self.best_step], dtype=np.int64),
            "best": best,
        }

    def _join(self) -> None:
        """Rank 0 announces the run; then every rank takes rank 0's weights, moments, step and generator."""
        ranks = self.ranks
        if ranks.leader:
            val_ids = self.tokens.val_ids
            spec = {
                "run_dir": str(self.run_dir.resolve()),
                "config": self.config.to_dict(),
                "n_tokens": int(len(self.tokens.ids)),
                "n_val_tokens": None if val_ids is None else int(len(val_ids)),
                "corpus": self.tokens.spec.to_dict(),
                "key": self.tokens.key(),
                "vocab_size": self.model_config.vocab_size,
            }
            ranks.start(spec, self.tokenizer)
        arrays = self._state_arrays()
        ranks.share_state(arrays)
        if not ranks.leader:
            self.opt.load_state_dict({k[4:]: v for k, v in arrays.items() if k.startswith("opt.")})
            self.rng = data.rng_from_array(arrays["rng"])
            self.step, best_step = (int(x) for x in arrays["counters"])
            self.best_step = None if best_step < 0 else best_step
            self.best_val_loss = None if math.isnan(arrays["best"][0]) else float(arrays["best"][0])

    def _stop_now(self, stop: threading.Event) -> bool:
        return stop.is_set() if self.ranks is None else self.ranks.any(stop.is_set())

    def describe_split(self) -> str:
        """How each step's batch is shared (the summary's line under MPI)."""
        m, B = self.model, self.config.batch_size
        shards = shard_rows(B, m.shards)
        per_rank = [sum(s.stop - s.start for s in shards[r * m.workers : (r + 1) * m.workers]) for r in range(m.size)]
        rows = ", ".join(f"rank {r}: {n}" for r, n in enumerate(per_rank))
        where = "" if m.model.device == "cpu" else ", each on its rank's GPU (gradients summed on the host)"
        return (
            f"mpi: {m.size} ranks x {m.workers} worker{'s' * (m.workers != 1)} = {m.shards} shards of each "
            f"{B}-row batch (rows {rows}){where}; rank 0 writes"
        )

    def run(self) -> TrainResult:
        cfg = self.config
        if self.ranks is not None:
            self._join()
        log_path = self.files.dir / checkpoint.LOG_FILE
        log = checkpoint.JsonlLog(log_path) if self.leader else _NoLog()
        # wall-clock times live here, never in the weight files (identical runs, identical files)
        session = {
            "type": "session",
            "step": self.step,
            "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "workers": self.config.workers,
            "tokenkit": __version__,
            # what a reader of the log alone (tk serve, following a run) needs before the first checkpoint
            "train_config": self.config.to_dict(),
            "unigram_baseline": self.baseline if math.isfinite(self.baseline) else None,
        }
        if self.ranks is not None:
            session["ranks"] = self.ranks.size
        log.write(session)
        tokens_per_step = cfg.batch_size * cfg.context_length
        start = time.perf_counter()
        train_seconds = 0.0
        steps_done = 0
        interrupted = False
        smooth: float | None = None
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=self.quiet or not self.leader or not sys.stderr.isatty(),
            dynamic_ncols=True,
        )
        try:
            # Overflow shows as a non-finite loss or norm, which stops the run in one line below;
            # NumPy's warnings about it (in this process and the workers forked here) would add more.
            with _interrupt_flag() as stop, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                while self.step < cfg.steps:
                    if self._stop_now(stop):
                        interrupted = True
                        break
                    t0 = time.perf_counter()
                    lr = cosine_schedule(
                        self.step,
                        max_lr=cfg.lr,
                        min_lr=cfg.min_lr,
                        warmup_steps=cfg.warmup_steps,
                        total_steps=cfg.steps,
                    )
                    x, y = data.get_batch(self.train_ids, cfg.batch_size, cfg.context_length, self.rng, rows=self.rows)
                    loss, grads = self.model.loss_and_grads(x, y, batch_rows=cfg.batch_size)
                    norm = clip_grad_norm(grads, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
                    if not (math.isfinite(loss) and math.isfinite(norm)):
                        log.write({"type": "stop", "step": self.step + 1, "loss": str(loss), "grad_norm": str(norm)})
                        saved = self._saved_step() if self.leader else None
                        if saved is not None:
                            kept = f"the last good checkpoint (step {saved}) is kept in {self.run_dir}"
                        elif self.files.staged:
                            kept = f"no checkpoint had been saved yet, so {self.run_dir} keeps the run it held"
                        else:
                            kept = "no checkpoint had been saved yet"
                        raise PipelineError(
                            f"training diverged: loss {loss} (grad norm {norm}) at step {self.step + 1}; {kept}; "
                            "lower --lr, raise --warmup-steps or keep --grad-clip on"
                        )
                    self.opt.step(grads, lr=lr)
                    self.step += 1
                    dt = time.perf_counter() - t0
                    train_seconds += dt
                    steps_done += 1
                    log.write({"type": "step", "step": self.step, "loss": loss, "lr": lr, "grad_norm": norm, "dt": dt})
                    smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss
                    if self.step % cfg.eval_interval == 0 or self.step == cfg.steps:
                        self.checkpoint(log)
                    bar.update(1)
                    bar.set_postfix(
                        self._postfix(smooth, lr, steps_done * tokens_per_step / max(train_seconds, 1e-9)),
                        refresh=False,
                    )
                if interrupted:
                    self.save_on_interrupt(log)
        finally:
            bar.close()
            log.close()
        return self.result(start, train_seconds, steps_done, interrupted)

    def result(self, start: float, train_seconds: float, steps_done: int, interrupted: bool) -> TrainResult:
        tokens_per_step = self.config.batch_size * self.config.context_length
        return TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            steps=self.config.steps,
            best_val_loss=self.best_val_loss,
            best_step=self.best_step,
            last_val_loss=self.last_val_loss,
            last_val_step=self.last_val_step,
            unigram_baseline=self.baseline,
            interrupted=interrupted,
            seconds=time.perf_counter() - start,
            tokens_per_s=steps_done * tokens_per_step / train_seconds if train_seconds else 0.0,
            steps_run=steps_done,
        )

    def _postfix(self, smooth: float | None, lr: float, tps: float) -> dict[str, str]:
        post = {"loss": f"{smooth:.3f}" if smooth is not None else "-"}
        post["val"] = f"{self.last_val_loss:.3f}" if self.last_val_loss is not None else "-"
        post["tok/s"] = f"{tps:,.0f}"
        post["lr"] = f"{lr:.2e}"
        return post

    def _saved_step(self) -> int | None:
        path = self.files.dir / checkpoint.STATE_FILE
        if not path.exists():
            return None
        try:
            return int(checkpoint.read_header(path).get("step", ""))
        except (PipelineError, ValueError):
            return None

    def checkpoint(self, log: checkpoint.JsonlLog) -> None:
        """Evaluate, then save the full state, and the model when it is the best so far."""
        val = self.evaluate()
        self.last_val_loss, self.last_val_step = val, self.step
        improved = math.isfinite(val) and (self.best_val_loss is None or val < self.best_val_loss)
        if improved:
            self.best_val_loss, self.best_step = val, self.step
        log.write({"type": "eval", "step": self.step, "val_loss": val, "best_val_loss": self.best_val_loss})
        if not self.leader:
            return
        if improved:
            self.save_model(val, val)
        self.save_state()
        self.files.commit()  # a run replacing another's: its first checkpoint takes the directory

    def save_on_interrupt(self, log: checkpoint.JsonlLog) -> None:
        """Ctrl-C: save the state at this step boundary; give the run a model file if it has none.

        The interrupt-time evaluation is not counted as a "best" in the training state, so the
        resumed run tracks its best exactly as an uninterrupted one would.
        """
        if self.leader:
            self.save_state()
        no_model = self.leader and not (self.files.dir / checkpoint.MODEL_FILE).exists()
        if self.ranks is not None:
            no_model = self.ranks.leaders(no_model)  # the evaluation takes every rank
        if no_model and self.step > 0:
            val = self.evaluate()
            self.last_val_loss, self.last_val_step = val, self.step
            if self.leader:
                self.save_model(val, val)
        log.write({"type": "interrupt", "step": self.step})
        if self.leader:
            self.files.commit()  # saved at the step boundary: a checkpoint like any other


class _NoLog:
    """A follower's log: rank 0 alone writes log.jsonl."""

    def write(self, record) -> None:
        pass

    def close(self) -> None:
        pass


def _default_shards(ranks: Ranks | None) -> int:
    """Batch shards per step for `--workers 0`: one per core, on every rank."""
    return available_cores() if ranks is None else ranks.size * ranks.default_workers()


def check_training_memory(
    config: TrainConfig, vocab_size: int, ranks: Ranks | None = None, device: str = "cpu"
) -> None:
    """One line, before any work, when the run's model cannot train in this machine's memory: its
    parameters, optimizer state and the activations of a batch (`vocab_size`: the tokenizer's, or
    an upper bound of the one still to be trained; under MPI, this rank's share of the workers and
    rows), or on `device` (a missing CuPy or GPU)."""
    get_backend(device)
    model_config = GPTConfig.from_dict(config.model_config(vocab_size))
    if device != "cpu":  # the whole batch, or this rank's shard, in one process on the device
        check_memory(
            model_config, training=True, workers=1, batch_rows=_device_rows(config.batch_size, ranks), device=device
        )
        return
    total = config.workers or available_cores()  # no MPI call: the other ranks are not listening yet
    workers = total if ranks is None else max(1, total // ranks.size)
    check_memory(
        model_config, training=True, workers=workers, batch_rows=_process_rows(config.batch_size, workers, total)
    )


def _device_rows(batch_size: int, ranks: Ranks | None) -> int:
    """Rows of each batch a process on a GPU computes: all of them, or under MPI its one shard's."""
    return _process_rows(batch_size, 1, 1 if ranks is None else ranks.size)


def _process_rows(batch_size: int, local_workers: int, total_workers: int) -> int:
    """Rows of each batch this process and its workers compute: all of them, or under MPI this
    rank's share (its workers' shards of `total_workers`; rounded up, as `shard_rows` may)."""
    return min(batch_size, -(-batch_size * local_workers // max(total_workers, local_workers)))


def fit_tokenizer(corpus, vocab_size: int = DEFAULT_VOCAB_SIZE, *, quiet: bool = False) -> Tokenizer:
    """A BPE tokenizer trained on `corpus` (a path, CorpusSpec or RunCorpus; its training inputs
    only) with the defaults (GPT-2 split pattern), in memory; its eot token is a special token."""
    rc = sources.open_corpus(corpus)
    specials = [rc.spec.eot] if rc.spec.eot is not None else []
    return Tokenizer.train(rc.train, vocab_size=vocab_size, special_tokens=specials, quiet=quiet)


@dataclass
class StartFrom:
    """The weights and tokenizer a fresh run starts from (`tk train-model --init-from MODEL`)."""

    path: Path
    params: dict[str, np.ndarray]
    tokenizer: Tokenizer
    model_config: GPTConfig
    hf_architecture: str | None = None  # the transformers class it was imported from, if any

    @classmethod
    def load(cls, path: str | Path) -> StartFrom:
        """From any tk model file or run directory (one `tk import-hf` wrote, too)."""
        model, tokenizer, meta = checkpoint.load_model(path)
        if not model.config.causal:
            raise PipelineError(f"{path} is a bidirectional model; train-model trains causal language models")
        return cls(Path(path), model.params, tokenizer, model.config, checkpoint.hf_architecture(meta))

    def settings(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` (the user's settings) with the model's shape, its RoPE scaling included; a given
        shape that differs is an error (an --arch too, when the model is not of that family)."""
        shape = model_settings(self.model_config)
        for key, value in given.items():
            key = key.replace("-", "_")
            if (key in shape and value != shape[key]) or (key == "arch" and "arch" not in shape):
                raise PipelineError(
                    f"{_flag(key)} {value} contradicts the model {self.path} "
                    f"({shape.get(key, self.model_config.architecture)}); "
                    "drop the flag: --init-from takes the model's shape"
                )
        return {**given, **shape}


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
    whose other ranks run `follow` (pipeline.ranks); `config.workers` then counts every rank's
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
        if GPTConfig.from_dict(config.model_config(init.model_config.vocab_size)) != init.model_config:
            raise PipelineError(
                f"the run's model settings differ from the shape of {init.path}; take them from it (StartFrom.settings)"
            )
    if tokenizer is not None:
        sources.check_eot(tokenizer, corpus.spec)
    vocab_size = init.model_config.vocab_size if init is not None else None  # padded beyond the tokenizer's, maybe
    check_training_memory(
        config, vocab_size or (tokenizer.vocab_size if tokenizer is not None else DEFAULT_VOCAB_SIZE), ranks, device
    )
    with rundir.RunDir(run_dir) as rd:
        run_dir = rd.path
        own = [checkpoint.MODEL_FILE, checkpoint.STATE_FILE, checkpoint.LOG_FILE]
        if tokenizer is None:
            own.append(checkpoint.TOKENIZER_FILE)
        stopped = rd.stopped_first_run()  # nothing to resume there: this run takes its place (staged)
        if stopped is not None:
            overwrite = True
            say(f"{run_dir} holds a run that stopped {stopped or 'early'}, before its first checkpoint: starting again")
        if not overwrite:
            rundir.refuse_conflicts(run_dir, rd.present(own))
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
            run = _Run(
                run_dir,
                tokens,
                tokenizer,
                config,
                quiet=quiet,
                init=init,
                ranks=ranks,
                device=device,
                vocab_size=vocab_size,
            )  # checks
            # the run starts: its files go into the directory, or beside another run's until its first checkpoint
            run.files = new = rundir.NewRun(run_dir, staged=bool(rd.present()))
        except BaseException:
            tokens.discard()
            raise
        try:
            if on_start is not None:
                on_start(new.dir)
            if checkpoint.TOKENIZER_FILE in own:
                tokenizer.save(new.dir / checkpoint.TOKENIZER_FILE)
                say(f"tokenizer: saved {run_dir / checkpoint.TOKENIZER_FILE} (vocab {tokenizer.vocab_size})")
            data.commit_tokens(tokens, run_dir, into=new.dir)
            say(encode_note(tokens, run_dir))
            checkpoint.write_text(new.dir / checkpoint.LOG_FILE, "")
            _describe(run, say)
            return run.run()
        finally:
            tokens.discard()  # pending only when the run did not start
            new.discard()  # staged only when the run ended before its first checkpoint: the old run stays


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


def _describe(run: _Run, say: Callable[[str], None]) -> None:
    n_params = sum(int(p.size) for p in run.model.params.values())
    cfg = run.model.config
    family = "" if cfg.architecture == "gpt2" else f"{cfg.architecture}, "
    heads = f"{cfg.n_heads} heads" + (f" ({cfg.kv_heads} K/V)" if cfg.kv_heads != cfg.n_heads else "")
    scaled = f", RoPE scaled ({cfg.rope_scaling.type}, factor {cfg.rope_scaling.factor:g})" if cfg.rope_scaling else ""
    say(
        f"model: {n_params:,} parameters ({family}{cfg.n_layers} layers, {heads}, width {cfg.d_model}, "
        f"context {cfg.context_length}, vocab {cfg.vocab_size}{scaled})"
    )
    val = f" (--val {run.tokens.spec.describe(val=True)})" if run.tokens.val_ids is not None else ""
    say(
        f"data: {len(run.train_ids):,} train / {len(run.val_ids):,} validation tokens{val}; "
        f"unigram baseline {run.baseline:.3f} nats/token"
    )
    if run.ranks is not None:
        say(run.describe_split())


def resume_training(
    run_dir: str | Path,
    *,
    corpus=None,
    tokenizer=None,
    overrides: Mapping[str, Any] | None = None,
    corpus_overrides: Mapping[str, Any] | None = None,
    ranks: Ranks | None = None,
    device: str = "cpu",
    quiet: bool = False,
    say: Callable[[str], None] = lambda msg: None,
) -> TrainResult:
    """Continue the run in `run_dir` exactly where its train_state.safetensors left off.

    `overrides` are settings the user gave explicitly: any that differs from the checkpoint's is a
    one-line error (a resumed run must be the same run). The corpus is the recorded one
    (`sources.CorpusSpec`; a v1 run's one file; a stream's copy kept in `run_dir`), with `corpus`
    (paths: other inputs; a CorpusSpec or RunCorpus: all of it) or `corpus_overrides` (CorpusSpec
    fields the user gave, e.g. a moved --val) in its place; it must have the recorded fingerprints,
    eot token and special-token policy (`CorpusSpec.specials`), and a given `tokenizer` the run's
    fingerprint. A stream given in its place is copied into `run_dir` as a fresh run's is, and
    checked the same way. The run uses the worker count recorded in the checkpoint, so it continues
    bit for bit on any core count, and on any number of MPI `ranks` that divides it (with or
    without MPI before). On another `device` it continues numerically close, not bit-identical.
    """
    get_backend(device)  # a missing GPU is one line before anything is read
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PipelineError(f"run directory not found: {run_dir}")
    with rundir.RunDir(run_dir) as rd:
        state_path = run_dir / checkpoint.STATE_FILE
        stopped = rd.stopped_first_run()
        if stopped is not None:
            command = "tk pipeline" if rd.present([checkpoint.PIPELINE_FILE]) else "train-model"
            raise PipelineError(
                f"{run_dir} has no checkpoint yet (its first run stopped {stopped + ', ' if stopped else ''}before its "
                f"first checkpoint); run the same {command} command again without --resume"
            )
        if not state_path.exists():
            raise PipelineError(
                f"nothing to resume in {run_dir}: no {checkpoint.STATE_FILE}; start a run with `tk train-model`"
            )
        state = checkpoint.load_train_state(state_path)
        try:
            config = TrainConfig.from_dict(state.train_config)
        except PipelineError as err:  # no run records these: the file is damaged
            raise PipelineError(f"{state_path}: its recorded settings are not a run's ({err}); it is corrupt") from None
        for key, value in (overrides or {}).items():
            key = key.replace("-", "_")
            old = getattr(config, key)
            if key == "workers" and value == 0:
                continue  # "one per core" means the count the run recorded
            if _coerce(key, type(old).__name__, value) != old:
                raise PipelineError(
                    f"{_flag(key)} {value} contradicts the checkpoint in {run_dir} ({old}); drop the flag to resume, "
                    "or start a new run with another -o"
                )
        if tokenizer is not None and tokenizer.fingerprint() != state.tokenizer.fingerprint():
            raise PipelineError(
                f"the given tokenizer is not the one {run_dir} was trained with; drop -t to use the run's own"
            )
        rc = _resumed_corpus(run_dir, state, corpus, corpus_overrides, ranks, say)
        try:
            tokens = data.prepare_tokens(rc, state.tokenizer, run_dir, quiet=quiet, commit=False)
        finally:
            rc.discard()  # copies of streams are still the corpus's only when this failed
        try:
            run = _Run(
                run_dir,
                tokens,
                state.tokenizer,
                config,
                quiet=quiet,
                state=state,
                ranks=ranks,
                device=device,
                vocab_size=state.model_config.get("vocab_size"),
            )
            data.commit_tokens(tokens, run_dir)
        except BaseException:
            tokens.discard()
            raise
        if state.step >= config.steps:
            say(f"{run_dir} already finished its {config.steps} steps; nothing to resume")
            return run.result(time.perf_counter(), 0.0, 0, interrupted=False)
        say(f"resuming {run_dir} at step {state.step} of {config.steps}")
        if ranks is not None:
            say(run.describe_split())
        # records past the checkpoint we continue from go, and so does damage (said in one line)
        note = checkpoint.truncate_log(run_dir / checkpoint.LOG_FILE, state.step)
        if note is not None:
            say(note)
        return run.run()


def _resumed_corpus(run_dir: Path, state: checkpoint.TrainState, corpus, overrides, ranks, say) -> sources.RunCorpus:
    """The corpus a resumed run reads: the recorded one, or what the caller gave in its place,
    checked against the recorded fingerprints (one line when it is not the same corpus). A
    stream given in its place is copied into the run directory first (pending until the run
    commits its tokens)."""
    recorded = sources.CorpusSpec.from_record(state.data, str(run_dir / checkpoint.STATE_FILE)).kept_in(run_dir)
    key = data.record_key(state.data)
    if isinstance(corpus, sources.RunCorpus):
        rc = corpus
    else:
        spec = corpus if isinstance(corpus, sources.CorpusSpec) else recorded
        changes = dict(overrides or {})
        if corpus is not None and not isinstance(corpus, sources.CorpusSpec):
            changes["inputs"] = sources.CorpusSpec.of(corpus).inputs
        changes = {k: tuple(os.fspath(p) for p in v) if k in ("inputs", "val") else v for k, v in changes.items()}
        spec = dataclasses.replace(spec, **changes)
        if spec.eot != key["eot"]:
            shown = {None: "none"}
            raise PipelineError(
                f"--eot {shown.get(spec.eot, repr(spec.eot))} contradicts the checkpoint in {run_dir} "
                f"({shown.get(key['eot'], repr(key['eot']))}); drop the flag to resume"
            )
        if spec.val and key["val_fingerprint"] is None:
            raise PipelineError(
                f"{run_dir} was validated on a held-out part of its corpus, not on --val; drop --val to resume"
            )
        _check_kept_streams(spec, run_dir)
        rc = spec.open(warn=lambda msg: say(f"warning: {msg}"))
    # the run's tokens keep the policy they were encoded with (or serve any: data.same_ids)
    if not data.same_ids({"specials": key["specials"]}, {"specials": rc.spec.specials}):
        flags = sources.SPECIAL_FLAGS
        raise PipelineError(
            f"{flags[rc.spec.specials]} contradicts the checkpoint in {run_dir} (its corpus was encoded with "
            f"{flags.get(key['specials'], repr(key['specials']))}); drop the flag to resume"
        )
    refuse_streams_under_mpi(rc.spec, ranks)
    rc = sources.store_streams(rc, run_dir, say)
    try:
        if rc.fingerprint() != key["corpus_fingerprint"]:
            raise PipelineError(
                f"corpus {rc.spec.describe()} is not the one {run_dir} was trained on (its contents changed); "
                "resume needs the same corpus"
            )
        if rc.val_fingerprint() != key["val_fingerprint"]:
            raise PipelineError(
                f"validation corpus {rc.spec.describe(val=True) or '(none)'} is not the one {run_dir} was validated on "
                f"({recorded.describe(val=True) or 'a held-out part of its corpus'}); resume needs the same --val"
            )
    except BaseException:
        rc.discard()
        raise
    return rc


def _check_kept_streams(spec: sources.CorpusSpec, run_dir: Path) -> None:
    """One line when the copy of a stream that a run kept as its corpus is gone: give it again."""
    for path, origin in spec.to_dict().get("streams", {}).items():
        if not os.path.lexists(path):
            flag = "--val " if path in spec.val else ""
            raise PipelineError(
                f"{path} is missing: {run_dir} kept its {'validation ' if flag else ''}corpus ({origin}) there; "
                "give the same corpus again in its place: "
                f"tk train-model --resume {run_dir} {flag}FILE (or {flag}- to pipe it in)"
            )


def follow(ranks: Ranks, *, device: str = "cpu", quiet: bool = True) -> TrainResult | None:
    """A rank other than 0: wait for rank 0's run to start, then train it alongside (writing
    nothing), on `device` (its own GPU for "cuda": `backends.use_gpu`). None when rank 0 ended
    without training."""
    started = ranks.wait_for_start()
    if started is None:
        return None
    spec, tokenizer = started
    run_dir = Path(spec["run_dir"])
    tokens = data.open_tokens(
        run_dir, tokenizer, spec["corpus"], spec["key"], spec["n_tokens"], spec.get("n_val_tokens")
    )
    config = TrainConfig.from_dict(spec["config"])
    return _Run(
        run_dir, tokens, tokenizer, config, quiet=quiet, ranks=ranks, device=device, vocab_size=spec.get("vocab_size")
    ).run()
