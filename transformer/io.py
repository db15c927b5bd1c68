"""Model weights to and from safetensors files: the only module of `transformer/` that touches files.

One model format, "tokenkit.model" version 1, for `GPT.save` and the pipeline alike: the
parameters under GPT-2's names (float32), metadata `format`, `format_version` and `config` (JSON),
plus whatever the caller adds (the pipeline embeds its tokenizer as `tokenizer.*` tensors and
metadata, and its step, losses and provenance). Files are written through `common.atomic`
(atomic, umask respected) by `common.safetensors_file` (sorted: identical models give identical
bytes; no timestamps).

Reading accepts GPT-2's published state dicts too: keys with or without a `transformer.` prefix,
and without a "config" the config is inferred from the shapes (GPT-2's head size of 64). Tensors
that are not model parameters (`tokenizer.*`, GPT-2's `attn.bias` mask buffers, `lm_head.weight`)
are never read. Every size is checked against the file before anything is allocated, and the
config's against the memory available (`transformer.memory.check_memory`) before a weight is
read; float32 weights are mapped from the file, not copied (`safetensors_file.Opened.read`).
Never pickle.

Every failure a user can cause is a one-line ModelError.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from tokenkit.common import FileError, atomic, jsonsafe, safetensors_file
from tokenkit.transformer.config import GPTConfig, param_shapes
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.memory import check_memory

FORMAT = "tokenkit.model"
FORMAT_VERSION = "1"
CONFIG_KEY = "config"
_PREFIX = "transformer."
_GPT2_HEAD_DIM = 64
MODEL_FILE = "a model file (model.safetensors)"  # what a path that is not a regular file should be


def save_model(
    path: str | os.PathLike,
    params: dict[str, np.ndarray],
    config: dict,
    *,
    metadata: dict[str, str] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> None:
    """Write params (as float32) and extra_tensors to `path` in the model format, atomically."""
    path = Path(path)
    extra = dict(extra_tensors or {})
    clash = sorted(set(extra) & set(params))
    if clash:
        raise ModelError(f"extra tensor {clash[0]!r} has a model parameter's name; prefix it (e.g. 'tokenizer.')")
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    reserved = sorted({"format", "format_version", CONFIG_KEY} & set(meta))
    if reserved:
        raise ModelError(f"metadata key {reserved[0]!r} is the model format's own; choose another name")
    meta.update(format=FORMAT, format_version=FORMAT_VERSION)
    meta[CONFIG_KEY] = json.dumps(config, sort_keys=True)
    tensors = {name: np.asarray(a, dtype=np.float32) for name, a in params.items()}
    tensors.update(extra)
    try:
        atomic.write_atomic(path, lambda f: safetensors_file.write(f, tensors, meta))
    except FileError as err:
        raise ModelError(str(err)) from None


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a safetensors file (the model config is JSON under "config")."""
    path = Path(path)
    if not os.path.lexists(path):
        raise ModelError(f"{path}: no such model file; check the path")
    try:
        return safetensors_file.read_header(path, what_file=MODEL_FILE)[1]
    except FileError as err:
        raise ModelError(str(err)) from None


def parse_config(path: str | os.PathLike, metadata: dict[str, str]) -> GPTConfig | None:
    """The GPTConfig in a file's metadata, or None when it has none."""
    if CONFIG_KEY not in metadata:
        return None
    try:
        return GPTConfig.from_dict(jsonsafe.loads(metadata[CONFIG_KEY], f"{path}: the 'config' metadata"))
    except FileError as err:
        raise ModelError(str(err)) from None


def _infer_gpt2_config(path: Path, shapes: dict[str, tuple[int, ...]]) -> GPTConfig:
    """Config of a GPT-2 state dict that carries none, from its tensor shapes."""
    if "wte.weight" not in shapes or "h.0.attn.c_attn.weight" not in shapes or len(shapes["wte.weight"]) != 2:
        raise ModelError(f"{path}: neither a tokenkit model (no 'config' metadata) nor a GPT-2 state dict")
    V, C = shapes["wte.weight"]
    layers = [name.split(".")[1] for name in shapes if name.startswith("h.")]
    if not all(layer.isdigit() for layer in layers):
        raise ModelError(f"{path}: unexpected GPT-2 tensor names; the file is not a GPT-2 state dict")
    wpe = shapes.get("wpe.weight")
    return GPTConfig(
        vocab_size=V,
        context_length=wpe[0] if wpe else 1024,
        d_model=C,
        n_layers=1 + max(int(layer) for layer in layers),
        n_heads=max(1, C // _GPT2_HEAD_DIM),
        positional="learned" if wpe else "sinusoidal",
        bias="h.0.attn.c_attn.bias" in shapes,
    )


def param_keys(
    path: str | os.PathLike, shapes: dict[str, tuple[int, ...]], metadata: dict[str, str]
) -> tuple[GPTConfig, dict[str, str]]:
    """(config, {parameter name: its key in the file}) from a file's tensor shapes (key -> shape)
    and metadata, before any weight is read: every parameter the config needs must be present
    with its exact shape (the config alone never decides an allocation)."""
    path = Path(path)
    names: dict[str, str] = {}  # our name -> key in the file
    for key in shapes:
        names.setdefault(key[len(_PREFIX) :] if key.startswith(_PREFIX) else key, key)
    ours = {name: tuple(shapes[key]) for name, key in names.items()}
    config = parse_config(path, metadata) or _infer_gpt2_config(path, ours)
    expected = param_shapes(config)
    missing = [name for name in expected if name not in names]
    if missing:
        raise ModelError(f"{path}: lacks {len(missing)} parameter(s) of its config, e.g. {missing[0]}")
    for name, shape in expected.items():
        if ours[name] != shape:
            raise ModelError(f"{path}: {name} has shape {ours[name]}, the config needs {shape}")
    return config, {name: names[name] for name in expected}


def float_params(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The parameters (name -> array, as read) as contiguous float32 (no copy of float32 ones,
    mapped ones included), refused when one is not a float type or holds NaN or infinity."""
    params = {}
    for name, tensor in tensors.items():
        if not np.issubdtype(tensor.dtype, np.floating):
            raise ModelError(f"{path}: {name} has dtype {tensor.dtype}, expected a float type")
        params[name] = np.ascontiguousarray(tensor, dtype=np.float32)
        if not all_finite(params[name]):  # no model is saved so: predicting with it gives NaN
            raise ModelError(f"{path}: {name} holds NaN or infinite values; the file is damaged")
    return params


def all_finite(a: np.ndarray, block: int = 1 << 22) -> bool:
    """Whether every value is finite, looked at `block` values at a time: a mapped weight of
    gigabytes is checked without a mask of its size."""
    flat = a.reshape(-1)
    return all(np.isfinite(flat[i : i + block]).all() for i in range(0, flat.size, block))


def check_fits(path: str | os.PathLike, config: GPTConfig, device: str = "cpu") -> None:
    """One ModelError line naming `path` when a model of `config` cannot be held and run in the
    memory available now (`check_memory`): called on the header, before a weight is read."""
    try:
        check_memory(config, device=device)
    except ModelError as err:
        raise ModelError(f"{path}: {err}") from None


def load_model(path: str | os.PathLike, device: str = "cpu") -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """-> (config, params as float32 arrays keyed by GPT-2 names, unprefixed): only the
    parameters are read, once the header's config is known to fit `device`'s memory; float32
    ones are mapped from the file (`safetensors_file.Opened.read`)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise ModelError(f"{path}: no such model file; check the path")
    try:
        with safetensors_file.opened(path, what_file=MODEL_FILE) as st:
            shapes = {key: tuple(entry["shape"]) for key, entry in st.entries.items()}
            config, keys = param_keys(path, shapes, st.metadata)
            check_fits(path, config, device)
            tensors = st.read(keys.values(), mapped=True)
    except FileError as err:
        raise ModelError(str(err)) from None
    return config, float_params(path, {name: tensors[key] for name, key in keys.items()})
