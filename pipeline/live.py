"""What `tk serve` follows on disk while it runs: a model file that training replaces, and the
training log it appends to.

`LiveModel` loads a model file again when it changed (another inode, size or modification time:
tk writes every file atomically, so a changed file is a whole new one); when the new one does not
load, the previous model stays. `TrainingLog` reads `log.jsonl` once, then only the lines
appended since (`trainlog.read_log_from`), keeping each record's few numbers in flat arrays
(a long run's log is hundreds of thousands of lines).

What it deliberately does not do: decide what a view shows (pipeline/views.py), watch in the
background (a caller asks before each use), or hold a lock (the server does; one reader at a
time).
"""

from __future__ import annotations

import math
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkit.pipeline import checkpoint, trainlog
from tokenkit.pipeline.checkpoint import load_tokenizer
from tokenkit.pipeline.errors import PipelineError

__all__ = ["LiveModel", "Loaded", "TrainingLog", "file_signature"]


def file_signature(path: Path) -> tuple[int, int, int, int] | None:
    """(device, inode, size, modification time in ns) of `path`, None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class Loaded:
    """A model as loaded: the GPT, its tokenizer, the file's metadata (`checkpoint.decode_metadata`)."""

    model: Any
    tokenizer: Any
    metadata: dict[str, Any]


class LiveModel:
    """A model file (`path`), loaded again by `get` whenever it changed on disk.

    `tokenizer_path`: the tokenizer for a model file without one (GPT.save's), as `-t` gives it.
    A file that is not there yet (a run before its first checkpoint) or that fails to load keeps
    the previous model, if any; `error` says why the last load failed (None after a good one).
    """

    def __init__(self, path: Path, tokenizer_path: Path | None = None, device: str = "cpu") -> None:
        self.path = Path(path)
        self._tokenizer = None if tokenizer_path is None else load_tokenizer(tokenizer_path)
        self._device = device
        self._signature: tuple[int, int, int, int] | None = None
        self._loaded: Loaded | None = None
        self.error: str | None = None
        self.loads = 0  # how many times a file was loaded (tests see a reload)

    def get(self) -> Loaded | None:
        """The model as the file now holds it (loading it if it changed), or the last good one."""
        signature = file_signature(self.path)
        if signature is None or signature == self._signature:
            return self._loaded
        self._signature = signature  # a file that failed is not tried again until it changes
        try:
            self._loaded = self._load()
            self.error = None
        except PipelineError as err:
            self.error = str(err)
        return self._loaded

    def _load(self) -> Loaded:
        loaded = checkpoint.load_model(self.path, tokenizer_required=self._tokenizer is None, device=self._device)
        tok = checkpoint.paired_tokenizer(loaded, self._tokenizer, self.path)
        self.loads += 1
        return Loaded(loaded.model, tok, loaded.metadata)


def _number(value: Any) -> float:
    """A log field as a float; NaN when it is missing or not a number (a damaged record is data)."""
    if type(value) not in (int, float):
        return math.nan
    try:
        return float(value)
    except OverflowError:  # an integer past float's range
        return math.nan


class _Records:
    """What a stretch of log records adds, kept as `TrainingLog` keeps it; `status`, `config` and
    `unigram_baseline` are None where no record of the stretch set them."""

    def __init__(self) -> None:
        self.steps = array("q")
        self.loss, self.lr, self.dt, self.grad_norm = array("d"), array("d"), array("d"), array("d")
        self.evals: list[tuple[int, float]] = []
        self.eval_bpb = array("d")  # each evaluation's val_bits_per_byte; NaN where its record has none
        self.config: dict[str, Any] | None = None
        self.unigram_baseline: float | None = None
        self.status: str | None = None

    def take(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        step = record.get("step", 0)  # a whole number in int64's range (`trainlog.read_log_from`)
        if kind == "step":
            self.steps.append(step)
            self.loss.append(_number(record.get("loss")))
            self.lr.append(_number(record.get("lr")))
            self.dt.append(_number(record.get("dt")))
            self.grad_norm.append(_number(record.get("grad_norm")))
        elif kind == "eval":
            self.evals.append((step, _number(record.get("val_loss"))))
            self.eval_bpb.append(_number(record.get("val_bits_per_byte")))  # logged since issue 31
        elif kind == "session":
            self.status = "training"
            if isinstance(record.get("train_config"), dict):
                self.config = record["train_config"]
            baseline = _number(record.get("unigram_baseline"))
            if math.isfinite(baseline):
                self.unigram_baseline = baseline
        elif kind == "interrupt":
            self.status = "interrupted"
        elif kind == "stop":
            self.status = "diverged"


class TrainingLog:
    """`log.jsonl` of a run, read incrementally: `read()` takes in what was appended since.

    Kept per record type: step records as flat arrays (step, loss, lr, dt, grad_norm), evaluations
    as (step, val_loss) with their bits per byte beside them (`eval_bpb`: NaN for a record
    without one, as tk wrote them before issue 31), the last session's `train_config` and `unigram_baseline` (written by
    tk since issue 21), and the run's status: "waiting" (no record yet), "training" (a session
    began), "interrupted" or "diverged" (its last record says so). A read that fails leaves what
    was kept as it was.

    Not thread-safe: one reader at a time (`tk serve` reads it under a lock of its own, apart
    from the lock of the model's views, so that a long first read stalls no other view).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._file_id: tuple[int, int] | None = None
        self._signature: tuple[int, int, int, int] | None = None
        self._reset()

    def _reset(self) -> None:
        kept = _Records()
        self.steps, self.loss, self.lr, self.dt = kept.steps, kept.loss, kept.lr, kept.dt
        self.grad_norm, self.evals, self.eval_bpb = kept.grad_norm, kept.evals, kept.eval_bpb
        self.config: dict[str, Any] | None = None
        self.unigram_baseline: float | None = None
        self.status = "waiting"
        self.damaged = 0

    def read(self) -> TrainingLog:
        """Take in the lines appended since the last call (all of them when the file was replaced
        or cut back); a log that is not there (yet) is an empty one."""
        signature = file_signature(self.path)
        if signature is None:
            self._offset, self._file_id, self._signature = 0, None, None
            self._reset()
            return self
        if signature == self._signature:
            return self
        new = _Records()
        tail = trainlog.read_log_from(self.path, self._offset, self._file_id, take=new.take)
        if tail.restarted:
            self._reset()
        self._offset, self._file_id, self._signature = tail.offset, tail.file_id, signature
        self.damaged += tail.damaged
        for name in ("steps", "loss", "lr", "dt", "grad_norm", "eval_bpb"):
            getattr(self, name).extend(getattr(new, name))
        self.evals.extend(new.evals)
        if new.config is not None:
            self.config = new.config
        if new.unigram_baseline is not None:
            self.unigram_baseline = new.unigram_baseline
        if new.status is not None:
            self.status = new.status
        return self
