"""train_state.safetensors: a run's whole state at its last step, for an exact `--resume`.

`save_train_state` writes it (the weights, AdamW's moments and step, the data generator's state,
the tokenizer under `tokenizer.*`, and the run's settings as metadata) through the one atomic
writer; `load_train_state` reads and checks it (every value no run writes is one line), once its
header says it fits the memory available; `describe_train_state` reads the header alone (`tk
info`). The file's neighbours and the checks they share are pipeline/checkpoint.py's.

What it deliberately does not do: decide when to save (pipeline/train.py) or how a resumed run
continues (pipeline/resume.py).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit.common import safetensors_file
from tokenkit.pipeline.checkpoint import (
    FORMAT_VERSION,
    HF_ARCHITECTURE,
    STATE_FORMAT,
    TOKENIZER_PREFIX,
    _check_format,
    _float_params,
    _opened,
    _param_keys,
    _read,
    _save_safetensors,
    _tokenizer_from,
    loads,
)
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.memory import available_bytes

__all__ = ["TrainState", "TrainStateFile", "describe_train_state", "load_train_state", "save_train_state"]


@dataclass
class TrainState:
    """Everything needed to continue a run bit-exactly from `step`."""

    step: int
    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    rng: np.ndarray  # the batch generator's state as uint64 words (pipeline.data.rng_to_array)
    best_val_loss: float | None
    best_step: int | None
    train_config: dict[str, Any]
    model_config: dict[str, Any]
    data: dict[str, Any]  # corpus spec + fingerprints, tokenizer fingerprint, eot, split sizes
    tokenizer: Any
    hf_architecture: str | None = None  # the transformers class the weights were imported from, if any


def save_train_state(path: str | os.PathLike, state: TrainState) -> None:
    """Write train_state.safetensors atomically (it includes the weights: one file, always consistent)."""
    _save_safetensors(Path(path), *train_state_tensors(state))


def train_state_tensors(state: TrainState) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and metadata of `state`'s train_state.safetensors."""
    tensors: dict[str, np.ndarray] = {}
    tensors.update({"params." + k: v for k, v in state.params.items()})
    tensors.update({"optimizer." + k: np.asarray(v) for k, v in state.optimizer.items()})
    tensors["rng.train"] = np.asarray(state.rng, dtype=np.uint64)
    tok_tensors, tok_meta = state.tokenizer.to_tensors()
    tensors.update({TOKENIZER_PREFIX + k: v for k, v in tok_tensors.items()})
    metadata = {
        "format": STATE_FORMAT,
        "format_version": FORMAT_VERSION,
        "step": str(state.step),
        "best_val_loss": json.dumps(state.best_val_loss),
        "best_step": json.dumps(state.best_step),
        "train_config": json.dumps(state.train_config, sort_keys=True),
        "config": json.dumps(state.model_config, sort_keys=True),
        "data": json.dumps(state.data, sort_keys=True),
        "tokenizer_fingerprint": state.tokenizer.fingerprint(),
        **({HF_ARCHITECTURE: state.hf_architecture} if state.hf_architecture else {}),
    }
    metadata.update({TOKENIZER_PREFIX + k: v for k, v in tok_meta.items()})
    return tensors, metadata


@dataclass
class TrainStateFile:
    """What a train_state.safetensors says of itself, from its header alone (`describe_train_state`)."""

    step: int
    best_val_loss: float | None
    best_step: int | None
    train_config: dict[str, Any]
    model_config: dict[str, Any]
    data: dict[str, Any]
    n_params: int  # the weights' values, counted from their shapes
    nbytes: int  # every tensor of the file: what `load_train_state` reads


def describe_train_state(path: str | os.PathLike) -> TrainStateFile:
    """A train_state.safetensors's step, settings and sizes, checked as `load_train_state` checks
    its metadata, reading the header only (`tk info`): no tensor is read."""
    path = Path(path)
    with _opened(path, "training state") as st:
        return _state_header(path, st)


def _state_header(path: Path, st: safetensors_file.Opened) -> TrainStateFile:
    meta = st.metadata
    _check_format(path, meta, STATE_FORMAT, "resume needs the train_state.safetensors of a tokenkit run")
    _, keys = _param_keys(path, meta, st.entries, prefix="params.")
    try:
        described = TrainStateFile(
            step=int(meta["step"]),
            best_val_loss=loads(meta["best_val_loss"], f"{path}: best_val_loss"),
            best_step=loads(meta["best_step"], f"{path}: best_step"),
            train_config=loads(meta["train_config"], f"{path}: train_config"),
            model_config=loads(meta["config"], f"{path}: config"),
            data=loads(meta["data"], f"{path}: data"),
            n_params=sum(math.prod(st.entries[k]["shape"]) for k in keys.values()),
            nbytes=st.nbytes(st.entries),
        )
    except (KeyError, ValueError) as err:
        raise PipelineError(f"{path} has bad metadata ({err}); it is corrupt") from None
    if not all(isinstance(v, dict) for v in (described.train_config, described.model_config, described.data)):
        raise PipelineError(f"{path} has bad metadata (a setting table is not a JSON object); it is corrupt")
    if described.step < 0:
        raise PipelineError(f"{path} has bad metadata (step {described.step}); it is corrupt")
    return described


def load_train_state(path: str | os.PathLike) -> TrainState:
    """Read and validate a train_state.safetensors (one-line PipelineError when it is not usable,
    or when its tensors, weights and AdamW moments, would not fit the memory available: said from
    the header, before a tensor is read)."""
    path = Path(path)
    with _opened(path, "training state") as st:
        described = _state_header(path, st)
        available = available_bytes()
        if available is not None and described.nbytes > available:
            raise PipelineError(
                f"{path}: its weights and optimizer state hold {described.nbytes / 2**30:.1f} GiB, more than the "
                f"{available / 2**30:.1f} GiB available; resume it on a machine with more memory"
            )
        meta, entries, tensors = st.metadata, st.entries, _read(st, st.entries)
    tokenizer = _tokenizer_from(path, tensors, meta)
    _, keys = _param_keys(path, meta, entries, prefix="params.")
    params = _float_params(path, tensors, keys)
    if "rng.train" not in tensors:
        raise PipelineError(f"{path} is incomplete: no data generator state")
    state = TrainState(
        step=described.step,
        params=params,
        optimizer={k[len("optimizer.") :]: v for k, v in tensors.items() if k.startswith("optimizer.")},
        rng=tensors["rng.train"],
        best_val_loss=described.best_val_loss,
        best_step=described.best_step,
        train_config=described.train_config,
        model_config=described.model_config,
        data=described.data,
        tokenizer=tokenizer,
        hf_architecture=meta.get(HF_ARCHITECTURE),
    )
    _check_state_values(path, state)
    return state


def _check_state_values(path: Path, state: TrainState) -> None:
    """One line for values no run writes: NaN or infinite moments, negative second moments, a
    generator state that is not PCG64's six words, a best loss that is not a number."""
    rng = state.rng
    if rng.dtype != np.uint64 or rng.shape != (6,) or int(rng[4]) > 1:
        raise PipelineError(
            f"{path}: the data generator state ({rng.dtype}{list(rng.shape)}) is not PCG64's six uint64 words; "
            "it is corrupt"
        )
    named = [("optimizer." + k, v) for k, v in state.optimizer.items() if k not in ("step", "betas")]
    for name, arr in named:  # the weights' own values were checked with their shapes (_float_params)
        if arr.dtype != np.float32:
            raise PipelineError(f"{path}: {name} is {arr.dtype}, expected float32; the file is corrupt")
        if not np.isfinite(arr).all():
            raise PipelineError(f"{path}: {name} holds NaN or infinite values; the file is corrupt")
        if name.startswith("optimizer.v.") and (arr < 0).any():
            raise PipelineError(f"{path}: {name} holds negative second moments; the file is corrupt")
    best, best_step = state.best_val_loss, state.best_step
    if best is not None and (type(best) not in (int, float) or not math.isfinite(best)):
        raise PipelineError(f"{path}: best_val_loss {best!r} is not a finite number; the file is corrupt")
    if best_step is not None and (type(best_step) is not int or best_step < 0):
        raise PipelineError(f"{path}: best_step {best_step!r} is not a step number; the file is corrupt")
