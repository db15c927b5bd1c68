"""Model weights to and from safetensors files: the only module of `transformer/` that touches files.

A file holds the parameters under GPT-2's names, the config as JSON in the metadata key
"config", and whatever else the caller adds (the pipeline embeds its tokenizer as `tokenizer.*`
tensors). Reading accepts GPT-2's published state dicts too: keys with or without a
`transformer.` prefix, and without a "config" the config is inferred from the shapes (GPT-2's
head size of 64). Tensors that are not model parameters (`tokenizer.*`, GPT-2's `attn.bias`
mask buffers, `lm_head.weight`) are ignored. Writes are atomic; never pickle.

Every failure a user can cause is a one-line ModelError.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from transformer.config import GPTConfig, param_shapes
from transformer.errors import ModelError

CONFIG_KEY = "config"
_PREFIX = "transformer."
_GPT2_HEAD_DIM = 64


def _atomic_write(path: Path, data: bytes) -> None:
    """Write data to path through a temp file in the same directory, fsync'd, then os.replace;
    then fsync the directory, so that the rename itself survives a power cut."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide a model from everyone else
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # some filesystems refuse to open directories
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_model(
    path,
    params: dict[str, np.ndarray],
    config: dict,
    *,
    metadata: dict[str, str] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> None:
    """Write params (float32) and extra_tensors to `path` with the config JSON in the metadata."""
    path = Path(path)
    extra = dict(extra_tensors or {})
    clash = sorted(set(extra) & set(params))
    if clash:
        raise ModelError(f"extra tensor {clash[0]!r} has a model parameter's name; prefix it (e.g. 'tokenizer.')")
    meta = {"format": "np", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    meta[CONFIG_KEY] = json.dumps(config, sort_keys=True)
    tensors = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in params.items()}
    tensors.update({name: np.ascontiguousarray(a) for name, a in extra.items()})
    if not path.parent.is_dir():
        raise ModelError(f"{path}: directory {path.parent} does not exist; create it first")
    _atomic_write(path, safetensors.numpy.save(tensors, metadata=meta))


def _open(path: Path):
    if not path.is_file():
        raise ModelError(f"{path}: no such model file; check the path")
    try:
        return safe_open(str(path), framework="np")
    except (SafetensorError, OSError, ValueError) as err:
        raise ModelError(f"{path}: not a readable safetensors file ({err}); was it fully written?") from None


def read_metadata(path) -> dict[str, str]:
    """The string metadata of a safetensors file (the model config is JSON under "config")."""
    path = Path(path)
    with _open(path) as f:
        return dict(f.metadata() or {})


def _infer_gpt2_config(path: Path, shapes: dict[str, tuple[int, ...]]) -> GPTConfig:
    """Config of a GPT-2 state dict that carries none, from its tensor shapes."""
    if "wte.weight" not in shapes or "h.0.attn.c_attn.weight" not in shapes:
        raise ModelError(f"{path}: neither a tokenkit model (no 'config' metadata) nor a GPT-2 state dict")
    V, C = shapes["wte.weight"]
    n_layers = 1 + max(int(name.split(".")[1]) for name in shapes if name.startswith("h."))
    return GPTConfig(
        vocab_size=V,
        context_length=shapes["wpe.weight"][0] if "wpe.weight" in shapes else 1024,
        d_model=C,
        n_layers=n_layers,
        n_heads=max(1, C // _GPT2_HEAD_DIM),
        positional="learned" if "wpe.weight" in shapes else "sinusoidal",
        bias="h.0.attn.c_attn.bias" in shapes,
    )


def load_model(path) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """-> (config, params as float32 arrays keyed by GPT-2 names, unprefixed)."""
    path = Path(path)
    try:
        with _open(path) as f:
            meta = f.metadata() or {}
            names = {}  # our name -> key in the file
            for key in f.keys():
                name = key[len(_PREFIX) :] if key.startswith(_PREFIX) else key
                names.setdefault(name, key)
            shapes = {name: tuple(f.get_slice(key).get_shape()) for name, key in names.items()}
            if CONFIG_KEY in meta:
                try:
                    config = GPTConfig.from_dict(json.loads(meta[CONFIG_KEY]))
                except json.JSONDecodeError as err:
                    raise ModelError(f"{path}: the 'config' metadata is not valid JSON ({err})") from None
            else:
                config = _infer_gpt2_config(path, shapes)
            expected = param_shapes(config)
            missing = [name for name in expected if name not in names]
            if missing:
                raise ModelError(f"{path}: lacks {len(missing)} parameter(s) of its config, e.g. {missing[0]}")
            params = {}
            for name, shape in expected.items():
                if shapes[name] != shape:
                    raise ModelError(f"{path}: {name} has shape {shapes[name]}, the config needs {shape}")
                tensor = f.get_tensor(names[name])
                if not np.issubdtype(tensor.dtype, np.floating):
                    raise ModelError(f"{path}: {name} has dtype {tensor.dtype}, expected a float type")
                params[name] = np.ascontiguousarray(tensor, dtype=np.float32)
    except (SafetensorError, OSError) as err:
        raise ModelError(f"{path}: could not read tensors ({err}); the file may be truncated") from None
    return config, params
