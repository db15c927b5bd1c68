"""The training loop: AdamW on random windows, warmup + cosine LR, clipping, periodic evaluation.

One step = one batch of (B, T) windows -> loss and gradients -> global-norm clip -> AdamW update
at the scheduled learning rate. The fine-tuning flags shape a step: --grad-accum N makes it N
micro-batches of B windows (one batch of N x B, computed B at a time), --dropout draws masks that
depend on the seed, the step and the row alone, and --freeze leaves some parameters out of the
update (AdamW holds no moments for them, and the clip's norm is the trained ones').
Fine-tuning on conversations (`tk train-model --chat`) draws packed rows instead
(pipeline/chat_data.py): the loss counts the assistant's targets alone, each step's log record
says what share of the batch's targets counted (`counted`), and an evaluation is the mean over
every counted target of the held-out rows.

Every `eval_interval` steps (and at the last step) the model is evaluated on fixed validation
windows, `train_state.safetensors` is rewritten (the full state, for `--resume`), and
`model.safetensors` is rewritten when the validation loss is the best so far. So
`model.safetensors` holds the best evaluated weights and `train_state.safetensors` the last
checkpointed step. Each evaluation is logged in nats per token and in bits per byte
(pipeline/val_bytes.py). A run started from given weights (`--init-from`) is evaluated before
its first step too, so its curve starts at the base model: that evaluation is logged at step 0
and is neither a checkpoint nor a best (the run's best is among the weights it trained).

Exact resume: the only state a step reads is the weights, the AdamW moments and step count,
the batch generator and the step number (the schedule is a pure function of it). All of it is
checkpointed, and evaluation draws from its own generator, so a run stopped at step k and
resumed produces the same batches, losses and bit-identical weights as one that never stopped.

Ctrl-C sets a flag that the loop reads between steps: the state at that step boundary is saved
and training returns with `interrupted=True`. A second Ctrl-C aborts at once (atomic writes
still leave the last checkpoint whole). A NaN or infinite loss stops training with a
PipelineError before the bad update is applied; the files on disk keep the last good checkpoint.

What it deliberately does not do: start a run (pipeline/start.py: the corpus, the tokenizer,
the run directory's files), check a resumed one (pipeline/resume.py), or bring the MPI ranks
together (pipeline/join.py). The settings are pipeline/config.py's TrainConfig; on a GPU the
model's backend does the math (`device`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit import __version__
from tokenkit.bpe.tokenizer_eval import token_lengths
from tokenkit.common import progress
from tokenkit.common.processes import note_interrupt
from tokenkit.pipeline import chat_data, checkpoint, data, rundir, train_state, trainlog, val_bytes
from tokenkit.pipeline.config import TrainConfig
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.ranks import Ranks
from tokenkit.pipeline.start_from import StartFrom
from tokenkit.pipeline.train_memory import check_fine_tuning_flags, check_step_memory
from tokenkit.transformer import GPT, AdamW, GPTConfig, clip_grad_norm, cosine_schedule
from tokenkit.transformer.dropout import Dropout
from tokenkit.transformer.parallel import DataParallel, MPIDataParallel
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
    last_val_bpb: float | None  # the last evaluation in bits per byte (None: none, or no bytes)
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


class TrainingRun:
    """One training session over a run directory (fresh or resumed): built by pipeline/start.py,
    pipeline/resume.py or, on an MPI follower, pipeline/join.py; `run` trains it."""

    def __init__(
        self,
        run_dir: Path,
        tokens: data.TokenData,
        tokenizer,
        config: TrainConfig,
        *,
        quiet: bool,
        state: train_state.TrainState | None = None,
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
        # one line, not a MemoryError (nor a flag this executor does not build)
        check_fine_tuning_flags(config, device)
        check_step_memory(self.model_config, config, local_workers, config.workers, ranks, device)
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
        # --freeze: the parameters kept as they are; AdamW holds no moments for them
        self.frozen = config.frozen(self.model.params)
        self.trained = [name for name in self.model.params if name not in self.frozen]
        self.opt = AdamW(
            {name: self.model.params[name] for name in self.trained},
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
        # of each step's --grad-accum micro-batches together (under MPI, this rank's rows of each)
        self.step_rows = self.model.local_rows(config.step_rows, config.grad_accum)
        # conversations (`tk train-model --chat`): only the assistant's targets count (pipeline/chat_data.py)
        self.chat = tokens if isinstance(tokens, chat_data.ChatData) else None
        if self.chat is not None:
            self.val_batches = self.chat.eval_rows(config.eval_batches, config.batch_size, self.model.local_rows)
            self.n_val_targets = self.val_batches.counted
            self.baseline = (
                self.chat.unigram_baseline(self.val_batches, tokenizer.vocab_size) if self.leader else math.nan
            )
            self.val_bytes = self.chat.val_bytes(self.val_batches, token_lengths(tokenizer)) if self.leader else 0
        else:
            self.val_batches = data.eval_batches(
                self.val_ids, config.eval_batches, config.batch_size, config.context_length, config.seed, rows=self.rows
            )
            self.n_val_targets = config.eval_batches * config.batch_size * config.context_length
            # statistics for the summary and the files, which only rank 0 writes
            self.baseline = (
                data.unigram_baseline(self.train_ids, self.val_ids, tokenizer.vocab_size) if self.leader else math.nan
            )
            # the validation batches' target bytes, counted on their whole rows (every rank's), once: they are fixed
            whole = data.eval_batches(
                self.val_ids, config.eval_batches, config.batch_size, config.context_length, config.seed
            )
            self.val_bytes = val_bytes.target_bytes(whole, token_lengths(tokenizer)) if self.leader else 0
        self.last_val_loss: float | None = None
        self.last_val_step: int | None = None
        self.last_val_bpb: float | None = None
        # the base model's evaluation at step 0 (a follower takes rank 0's word for it: `take_state`)
        self.eval_at_start = init is not None and state is None

    # -- what gets written -----------------------------------------------------------------

    def data_record(self) -> dict[str, Any]:
        if self.chat is not None:
            return self.chat.record()
        return {
            **self.tokens.key(),
            "corpus": self.tokens.spec.to_dict(),
            "n_tokens": int(len(self.tokens.ids)),
            "n_train": int(len(self.train_ids)),
            "n_val": int(len(self.val_ids)),
        }

    def provenance(self) -> dict[str, Any]:
        if self.chat is not None:
            record = self.chat.record()
            names = (chat_data.CHAT_KEY, "chat_fingerprint", "val_fingerprint", "n_counted")
            corpus = {k: record[k] for k in names if record[k] is not None}
        else:
            corpus = {
                "corpus": self.tokens.spec.to_dict(),
                "corpus_fingerprint": self.tokens.corpus_fingerprint,
                **({"val_fingerprint": self.tokens.val_fingerprint} if self.tokens.val_ids is not None else {}),
                "n_train_tokens": int(len(self.train_ids)),
            }
        return {
            "tokenkit": __version__,
            **corpus,
            "train_config": self.config.to_dict(),
            "unigram_baseline": self.baseline,
            **({"init_from": str(self.init.path)} if self.init is not None else {}),
            **({checkpoint.HF_ARCHITECTURE: self.hf_architecture} if self.hf_architecture else {}),
        }

    def save_state(self) -> None:
        train_state.save_train_state(
            self.files.dir / checkpoint.STATE_FILE,
            train_state.TrainState(
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
        """Mean loss over the fixed validation batches (on every rank: each computes its rows); of
        conversations, the mean over every counted target of the held-out rows."""
        B = self.config.batch_size
        if self.chat is not None:
            val = chat_data.evaluate(self.model, self.val_batches)
        else:
            val = float(np.mean([self.model.loss(x, y, batch_rows=B) for x, y in self.val_batches]))
        self.last_val_loss, self.last_val_step, self.last_val_bpb = val, self.step, self.bits_per_byte(val)
        return val

    def bits_per_byte(self, val: float) -> float | None:
        """`val` (a mean validation loss) in bits per byte of the validation targets (pipeline/val_bytes.py);
        None on a follower, which counts no bytes, and for targets without bytes."""
        return val_bytes.bits_per_byte(val, self.n_val_targets, self.val_bytes)

    def eval_record(self, val: float) -> dict[str, Any]:
        """The log's record of an evaluation at this step."""
        return {
            "type": "eval",
            "step": self.step,
            "val_loss": val,
            "val_bits_per_byte": self.bits_per_byte(val),
            "best_val_loss": self.best_val_loss,
        }

    # -- MPI: what every rank must share (pipeline/join.py sends it) -------------------------

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything a step depends on besides the data, as arrays (to send to the followers)."""
        best = np.array([math.nan if self.best_val_loss is None else self.best_val_loss], dtype=np.float64)
        return {
            **{f"param.{k}": v for k, v in self.model.params.items()},
            **{f"opt.{k}": v for k, v in self.opt.state_dict().items()},
            "rng": data.rng_to_array(self.rng),
            "counters": np.array(
                [self.step, -1 if self.best_step is None else self.best_step, int(self.eval_at_start)], dtype=np.int64
            ),
            "best": best,
        }

    def take_state(self, arrays: dict[str, np.ndarray]) -> None:
        """A follower: rank 0's moments, step and generator (`state_arrays`, its weights already
        copied into this model's own arrays)."""
        self.opt.load_state_dict({k[4:]: v for k, v in arrays.items() if k.startswith("opt.")})
        self.rng = data.rng_from_array(arrays["rng"])
        self.step, best_step, eval_at_start = (int(x) for x in arrays["counters"])
        self.best_step = None if best_step < 0 else best_step
        self.eval_at_start = bool(eval_at_start)
        self.best_val_loss = None if math.isnan(arrays["best"][0]) else float(arrays["best"][0])

    def _stop_now(self, stop: threading.Event) -> bool:
        return stop.is_set() if self.ranks is None else self.ranks.any(stop.is_set())

    def run(self) -> TrainResult:
        """Train from this step to the last (on MPI ranks, once pipeline/join.py has joined them)."""
        cfg = self.config
        log_path = self.files.dir / checkpoint.LOG_FILE
        log = trainlog.JsonlLog(log_path) if self.leader else _NoLog()
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
        tokens_per_step = cfg.step_rows * cfg.context_length
        start = time.perf_counter()
        train_seconds = 0.0
        steps_done = 0
        interrupted = False
        smooth: float | None = None
        bar = progress.bar(
            total=cfg.steps,
            initial=self.step,
            desc="train",
            unit="step",
            quiet=self.quiet or not self.leader,
            dynamic_ncols=True,
        )
        try:
            # Overflow shows as a non-finite loss or norm, which stops the run in one line below;
            # NumPy's warnings about it (in this process and the workers forked here) would add more.
            with _interrupt_flag() as stop, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                if self.eval_at_start and self.step == 0:  # the base model: where a fine-tuning curve starts
                    log.write(self.eval_record(self.evaluate()))
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
                    loss, grads, counted = self.step_gradients()
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
                    record = {"type": "step", "step": self.step, "loss": loss, "lr": lr, "grad_norm": norm, "dt": dt}
                    if counted is not None:  # the share of the batch's targets the loss counts
                        record["counted"] = counted / tokens_per_step
                    log.write(record)
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

    def step_gradients(self) -> tuple[float, dict[str, np.ndarray], int | None]:
        """This step's (loss, gradients of the trained parameters, counted targets or None for
        all): its --grad-accum x --batch-size rows drawn at once, as one batch of that many rows
        draws them, and computed a micro-batch at a time, with this step's dropout masks
        (transformer/dropout.py: a function of the seed, the step and each row)."""
        cfg = self.config
        if self.chat is None:
            x, y = data.get_batch(self.train_ids, cfg.step_rows, cfg.context_length, self.rng, self.step_rows)
            counted = None  # every target
        else:
            x, y, counted = chat_data.get_batch(self.train_ids, cfg.step_rows, self.rng, self.step_rows)
        dropout = Dropout(cfg.dropout, cfg.seed, self.step) if cfg.dropout > 0 else None
        extra = {"dropout": dropout} if dropout is not None else {}
        if cfg.grad_accum > 1:
            extra["micro_batches"] = cfg.grad_accum
        loss, grads = self.model.loss_and_grads(x, y, batch_rows=cfg.step_rows, counted=counted, **extra)
        return loss, {name: grads[name] for name in self.trained}, counted

    def result(self, start: float, train_seconds: float, steps_done: int, interrupted: bool) -> TrainResult:
        tokens_per_step = self.config.step_rows * self.config.context_length
        return TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            steps=self.config.steps,
            best_val_loss=self.best_val_loss,
            best_step=self.best_step,
            last_val_loss=self.last_val_loss,
            last_val_step=self.last_val_step,
            last_val_bpb=self.last_val_bpb,
            unigram_baseline=self.baseline,
            interrupted=interrupted,
            seconds=time.perf_counter() - start,
            tokens_per_s=steps_done * tokens_per_step / train_seconds if train_seconds else 0.0,
            steps_run=steps_done,
        )

    def _postfix(self, smooth: float | None, lr: float, tps: float) -> dict[str, str]:
        post = {"loss": f"{smooth:.3f}" if smooth is not None else "-"}
        post["val"] = f"{self.last_val_loss:.3f}" if self.last_val_loss is not None else "-"
        post["bpb"] = f"{self.last_val_bpb:.3f}" if self.last_val_bpb is not None else "-"
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

    def checkpoint(self, log: trainlog.JsonlLog) -> None:
        """Evaluate, then save the full state, and the model when it is the best so far."""
        val = self.evaluate()
        improved = math.isfinite(val) and (self.best_val_loss is None or val < self.best_val_loss)
        if improved:
            self.best_val_loss, self.best_step = val, self.step
        log.write(self.eval_record(val))
        if not self.leader:
            return
        if improved:
            self.save_model(val, val)
        self.save_state()
        self.files.commit()  # a run replacing another's: its first checkpoint takes the directory

    def save_on_interrupt(self, log: trainlog.JsonlLog) -> None:
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
