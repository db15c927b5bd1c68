"""Every file the pipeline writes, and the checks made when reading them back.

A run directory holds:

    tokenizer.safetensors    the tokenizer (when the pipeline trained it)
    pipeline.json            what `tk pipeline` trained that tokenizer on (its up-to-date check)
    tokens.npy, tokens.json  the corpus encoded once, and what it was encoded from (the cache key)
    model.safetensors        weights with the best validation loss + the tokenizer under `tokenizer.*`
                             + metadata: ONE file is enough to predict
    train_state.safetensors  the last step's full state (weights, AdamW moments, data generator)
                             for an exact `--resume`
    log.jsonl                one JSON object per training step and per evaluation

Writes are atomic: the bytes go to a temporary file in the same directory, are flushed and
fsync'ed, and `os.replace` swaps the file in (then the directory is fsync'ed so the rename
itself survives a power cut). A crash or Ctrl-C at any moment leaves either the old file or
the new one, never half of one. This module does not decide *when* to save; `pipeline.train` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from bpe import Tokenizer, TokenizerError
from pipeline.errors import PipelineError
from transformer import GPT, GPTConfig, ModelError

MODEL_FORMAT = "tokenkit.model"
STATE_FORMAT = "tokenkit.train_state"
FORMAT_VERSION = "1"
TOKENIZER_PREFIX = "tokenizer."
TOKENIZER_FORMAT = "tokenkit.bpe"  # the format tag bpe/io.py writes into tokenizer.safetensors

MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.safetensors"
TOKENIZER_FILE = "tokenizer.safetensors"
TOKENS_FILE = "tokens.npy"
TOKENS_META_FILE = "tokens.json"
LOG_FILE = "log.jsonl"
PIPELINE_FILE = "pipeline.json"


# --- atomic writes ---------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    # Without this the rename may be lost on power failure even though the file data is safe.
    with contextlib.suppress(OSError):  # some filesystems refuse to open directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block succeeds, it becomes `path` atomically.

    The caller writes the whole file to the yielded path. On success the temp file is
    fsync'ed and renamed over `path`; on any exception (KeyboardInterrupt included) it is
    removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; a checkpoint should be readable like any other
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a UTF-8 text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file, or None when it is missing or unreadable (callers treat that as 'no cache')."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def remove_stale_temps(run_dir: str | os.PathLike) -> None:
    """Delete temp files left by a process killed mid-write (only one writer uses a run dir)."""
    for tmp in Path(run_dir).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def _save_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    # np.ascontiguousarray would turn a 0-d array (AdamW's step count) into shape (1,)
    arrays = {k: np.require(v, requirements="C") for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(arrays, tmp, metadata=dict(metadata))


# --- the JSON-lines log ----------------------------------------------------------------------


class JsonlLog:
    """Appends one JSON object per line to `log.jsonl`, flushed after every record.

    The log is not a checkpoint: after a crash it may run ahead of the last checkpoint, so a
    resumed run first cuts it back with `truncate_log(path, step)` — the resumed log then reads
    exactly like the log of an uninterrupted run.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 — closed in close()

    def write(self, record: Mapping[str, Any]) -> None:
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def truncate_log(path: str | os.PathLike, step: int) -> None:
    """Keep only the log records of steps <= `step` (and drop a torn last line)."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if record.get("step", 0) <= step:
            kept.append(line)
    write_text(path, "".join(line + "\n" for line in kept))


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a `log.jsonl` (a torn last line is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


# --- reading safetensors headers safely -------------------------------------------------------


def read_header(path: str | os.PathLike, what: str = "file") -> dict[str, str]:
    """The string metadata of a safetensors file; one-line PipelineError when it is not one."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{what} not found: {path}")
    if path.is_dir():
        raise PipelineError(f"{what} {path} is a directory; give a .safetensors file")
    try:
        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PipelineError(f"{path} is not a readable safetensors file ({first}); it may be truncated or corrupt") from None


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    try:
        tensors = {}
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
        return tensors
    except (SafetensorError, OSError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PipelineError(f"{path} is corrupt ({first}); delete it or restore a good copy") from None


def _check_format(path: Path, meta: Mapping[str, str], expected: str, hint: str) -> None:
    fmt = meta.get("format")
    if fmt != expected:
        found = f"format {fmt!r}" if fmt else "no tokenkit format tag"
        raise PipelineError(f"{path} is not a {expected} file ({found}); {hint}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise PipelineError(
            f"{path} has {expected} version {meta.get('format_version')!r}; this tokenkit reads version {FORMAT_VERSION}"
        )


# --- model.safetensors -----------------------------------------------------------------------


def save_model(
    path: str | os.PathLike,
    params: Mapping[str, np.ndarray],
    tokenizer: Any,
    *,
    config: Mapping[str, Any],
    step: int,
    val_loss: float | None,
    best_val_loss: float | None,
    provenance: Mapping[str, Any],
) -> None:
    """Write model.safetensors: weights + embedded tokenizer + metadata, atomically.

    `params` keys are GPT-2 names; the tokenizer's own tensors and metadata go under
    `tokenizer.` so that `GPT.load` (which ignores non-parameter keys) and
    `Tokenizer.from_tensors` can both read the one file.
    """
    tok_tensors, tok_meta = tokenizer.to_tensors()
    tensors = dict(params)
    tensors.update({TOKENIZER_PREFIX + k: v for k, v in tok_tensors.items()})
    metadata = {
        "format": MODEL_FORMAT,
        "format_version": FORMAT_VERSION,
        "config": json.dumps(dict(config), sort_keys=True),
        "step": str(step),
        "val_loss": json.dumps(val_loss),
        "best_val_loss": json.dumps(best_val_loss),
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "provenance": json.dumps(dict(provenance), sort_keys=True),
    }
    metadata.update({TOKENIZER_PREFIX + k: v for k, v in tok_meta.items()})
    _save_safetensors(Path(path), tensors, metadata)


def resolve_model_path(path_or_run_dir: str | os.PathLike) -> Path:
    """A run directory means its model.safetensors; a file means itself."""
    path = Path(path_or_run_dir)
    if path.is_dir():
        candidate = path / MODEL_FILE
        if not candidate.exists():
            hint = " (training was interrupted before its first evaluation; resume it)" if (path / STATE_FILE).exists() else ""
            raise PipelineError(f"no {MODEL_FILE} in run directory {path}{hint}; train one with `tk train-model`")
        return candidate
    if not path.exists():
        raise PipelineError(f"model file not found: {path}; give a run directory or a model.safetensors")
    return path


def _split_tokenizer(tensors: dict[str, np.ndarray], meta: Mapping[str, str]):
    tok_tensors = {k[len(TOKENIZER_PREFIX):]: v for k, v in tensors.items() if k.startswith(TOKENIZER_PREFIX)}
    tok_meta = {k[len(TOKENIZER_PREFIX):]: v for k, v in meta.items() if k.startswith(TOKENIZER_PREFIX)}
    return tok_tensors, tok_meta


def _tokenizer_from(path: Path, tensors: dict[str, np.ndarray], meta: Mapping[str, str]):
    tok_tensors, tok_meta = _split_tokenizer(tensors, meta)
    if not tok_tensors:
        raise PipelineError(f"{path} has no embedded tokenizer; it was not written by tokenkit's pipeline")
    try:
        tok = Tokenizer.from_tensors(tok_tensors, tok_meta)
    except TokenizerError as err:
        raise PipelineError(f"{path}: embedded tokenizer is invalid ({err})") from None
    if meta.get("tokenizer_fingerprint") not in (None, tok.fingerprint()):
        raise PipelineError(f"{path} is corrupt: its embedded tokenizer does not match its recorded fingerprint")
    return tok


def _model_from(path: Path, config_json: str | None, tensors: dict[str, np.ndarray], prefix: str = ""):
    if config_json is None:
        raise PipelineError(f"{path} has no model config in its metadata; it is not a tokenkit model")
    try:
        config = GPTConfig.from_dict(json.loads(config_json))
        params = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix) and not k.startswith(TOKENIZER_PREFIX)}
        for name, arr in params.items():
            if arr.dtype != np.float32:  # from_params would convert silently; a tokenkit file is float32
                raise PipelineError(f"{path}: parameter {name!r} is {arr.dtype}, expected float32; the file is corrupt")
        return GPT.from_params(config, params)
    except (ValueError, ModelError) as err:
        raise PipelineError(f"{path}: {err}") from None


@dataclass
class LoadedModel:
    """What `load_model` returns; unpacks as `(model, tokenizer, metadata)`."""

    model: Any
    tokenizer: Any
    metadata: dict[str, Any]

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.metadata))


def decode_metadata(meta: Mapping[str, str]) -> dict[str, Any]:
    """Model metadata with its JSON fields parsed (tokenizer.* keys left out)."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key.startswith(TOKENIZER_PREFIX):
            continue
        if key in ("config", "provenance", "val_loss", "best_val_loss", "train_config", "data"):
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = value
        elif key == "step":
            out[key] = int(value) if value.isdigit() else value
        else:
            out[key] = value
    return out


def load_model(path_or_run_dir: str | os.PathLike) -> LoadedModel:
    """Load a model.safetensors (or a run dir's) -> (GPT, Tokenizer, metadata), all validated.

    A missing, foreign (e.g. a tokenizer file), truncated or corrupt file is a one-line
    PipelineError saying which and what to do.
    """
    path = resolve_model_path(path_or_run_dir)
    meta = read_header(path, "model file")
    if meta.get("format") == TOKENIZER_FORMAT:
        raise PipelineError(f"{path} is a tokenizer file, not a model; give a run directory or its model.safetensors")
    _check_format(path, meta, MODEL_FORMAT, "give a run directory or a model.safetensors written by `tk train-model`")
    tensors = _load_tensors(path)
    tokenizer = _tokenizer_from(path, tensors, meta)
    model = _model_from(path, meta.get("config"), tensors)
    if model.config.vocab_size != tokenizer.vocab_size:
        raise PipelineError(
            f"{path} is inconsistent: model vocab {model.config.vocab_size} != tokenizer vocab {tokenizer.vocab_size}"
        )
    return LoadedModel(model, tokenizer, decode_metadata(meta))


# --- train_state.safetensors -----------------------------------------------------------------


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
    data: dict[str, Any]  # corpus path + sha256, tokenizer fingerprint, split sizes
    tokenizer: Any


def save_train_state(path: str | os.PathLike, state: TrainState) -> None:
    """Write train_state.safetensors atomically (it includes the weights: one file, always consistent)."""
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
    }
    metadata.update({TOKENIZER_PREFIX + k: v for k, v in tok_meta.items()})
    _save_safetensors(Path(path), tensors, metadata)


def load_train_state(path: str | os.PathLike) -> TrainState:
    """Read and validate a train_state.safetensors (one-line PipelineError when it is not usable)."""
    path = Path(path)
    meta = read_header(path, "training state")
    _check_format(path, meta, STATE_FORMAT, "resume needs the train_state.safetensors of a tokenkit run")
    tensors = _load_tensors(path)
    tokenizer = _tokenizer_from(path, tensors, meta)
    model = _model_from(path, meta.get("config"), tensors, prefix="params.")
    if "rng.train" not in tensors:
        raise PipelineError(f"{path} is incomplete: no data generator state")
    try:
        return TrainState(
            step=int(meta["step"]),
            params=model.params,
            optimizer={k[len("optimizer."):]: v for k, v in tensors.items() if k.startswith("optimizer.")},
            rng=tensors["rng.train"],
            best_val_loss=json.loads(meta["best_val_loss"]),
            best_step=json.loads(meta["best_step"]),
            train_config=json.loads(meta["train_config"]),
            model_config=json.loads(meta["config"]),
            data=json.loads(meta["data"]),
            tokenizer=tokenizer,
        )
    except (KeyError, ValueError) as err:
        raise PipelineError(f"{path} has bad metadata ({err}); it is corrupt") from None
