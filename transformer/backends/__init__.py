"""Where the model's arrays live: one backend per device, each an array module and its ops.

    backend = get_backend("cpu")     # NumPy and transformer/ops.py (the default)
    backend = get_backend("cuda")    # CuPy and transformer/backends/cuda.py (pip install 'tokenkit[gpu]')
    backend.xp, backend.ops          # numpy or cupy; the ops module (same names, same signatures)
    backend.to_device(a), as_host(a)

The model's math (transformer/model.py) is written once against `backend.ops` and `backend.xp`;
what differs per device lives in the op modules: on CPU today's cache-tiled NumPy ops, on a GPU
fused CUDA kernels and cuBLAS GEMMs. Files never see a device: whatever saves or loads goes
through host NumPy arrays (`as_host`), so a model trained on one device runs on the other.

CuPy is imported only when "cuda" is asked for: a CPU run never imports it.

TF32: on a GPU, float32 GEMMs use TF32 tensor cores (as PyTorch's benchmarks allow with
`torch.backends.cuda.matmul.allow_tf32 = True`): about 3 decimal digits per product instead of
7, several times the speed. It is on by default; `set_tf32(False)` or the environment variable
TK_TF32=0 (read when the cuda backend is first made) turns it off. It never affects the CPU,
nor float64 models.

`use_gpu(local_rank)` makes the cuda backend on one of several GPUs, for one MPI rank per GPU.

CUDA graphs: on a GPU, generation captures its one-token step once and replays it (a single launch
instead of one per op, the position read from device memory); `set_cuda_graphs(False)` or
TK_CUDA_GRAPHS=0 runs every op as its own launch instead. Both give the same tokens.

What this module deliberately does not do: any math (the op modules), choose a device for the
user (the default is always "cpu"), or move data between processes or GPUs (transformer/parallel.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from tokenkit.transformer.errors import ModelError

DEVICES = ("cpu", "cuda")
INSTALL_HINT = "install it with: pip install 'tokenkit[gpu]' (CUDA 12; for CUDA 13: pip install 'cupy-cuda13x>=14')"


@dataclass(frozen=True, eq=False)
class Backend:
    """A device's array module `xp`, its op module `ops` (transformer/ops.py's names and
    signatures), and the transfers to and from it (`to_device(host array) -> device array`,
    `to_host(device array) -> numpy array`, `synchronize()` waits for queued work).

    `capture(fn)`, where the device has graphs (CUDA), records the work of `fn()` once and
    returns a `replay()` that reruns all of it in one launch and returns fn's output array, the
    same array each time (transformer/backends/cuda_graph.py); None elsewhere."""

    name: str
    xp: ModuleType
    ops: Any
    to_device: Callable[[Any], Any]
    to_host: Callable[[Any], np.ndarray]
    synchronize: Callable[[], None]
    capture: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


_BACKENDS: dict[str, Backend] = {}
_TF32 = {"on": os.environ.get("TK_TF32", "1") != "0"}
_GRAPHS = {"on": os.environ.get("TK_CUDA_GRAPHS", "1") != "0"}


def get_backend(device: str | Backend = "cpu") -> Backend:
    """The backend of `device` ("cpu" or "cuda"), made once per process. A Backend is returned
    as it is. ModelError (one line) for another name, or for "cuda" without CuPy or without a GPU."""
    if isinstance(device, Backend):
        return device
    if device not in DEVICES:
        raise ModelError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device not in _BACKENDS:
        _BACKENDS[device] = _make_cpu() if device == "cpu" else _make_cuda()
    return _BACKENDS[device]


def _make_cpu() -> Backend:
    from tokenkit.transformer.backends import cpu

    return Backend("cpu", np, cpu, np.asarray, np.asarray, lambda: None)


def _make_cuda() -> Backend:
    cupy = _cupy()
    _gpu_count(cupy)  # at least one, or one line
    from tokenkit.transformer.backends import cuda

    cuda.set_tf32(_TF32["on"])
    synchronize = lambda: cupy.cuda.get_current_stream().synchronize()  # noqa: E731
    return Backend("cuda", cupy, cuda.ops, cuda.to_device, cupy.asnumpy, synchronize, cuda.capture)


def _cupy():
    """CuPy, or ModelError (one line: how to install it)."""
    try:
        import cupy
    except ImportError as err:
        raise ModelError(f"device 'cuda' needs CuPy, which is not installed ({err.msg}); {INSTALL_HINT}") from None
    return cupy


def _gpu_count(cupy) -> int:
    """How many GPUs CUDA sees (at least one), or ModelError (one line: what is missing)."""
    try:
        n_gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # CUDARuntimeError: no driver, or a driver older than CuPy's CUDA
        raise ModelError(f"device 'cuda' found CuPy but no usable GPU ({_cuda_reason(err)})") from None
    if n_gpus < 1:
        raise ModelError("device 'cuda' found CuPy but no GPU (the CUDA driver reports 0 devices)")
    return n_gpus


def use_gpu(local_rank: int) -> Backend:
    """The cuda backend on GPU `local_rank % (GPUs this process sees)`, made this process's GPU:
    one MPI rank per GPU, the ranks of a node taking the GPUs in turn (several on one GPU when
    there are more ranks than GPUs). Call it before anything runs on a GPU: the backend's kernels
    load onto the GPU that is current when it is made. ModelError (one line) without CuPy or a
    GPU, or when the backend was already made on another GPU. A stand-in backend put in place
    of "cuda" (the tests' NumPy twins) is returned as it is."""
    made = _BACKENDS.get("cuda")
    if made is not None and made.name != "cuda":
        return made
    cupy = _cupy()
    n_gpus = _gpu_count(cupy)
    index = local_rank % n_gpus
    if made is None:
        cupy.cuda.Device(index).use()
        return get_backend("cuda")
    current = cupy.cuda.runtime.getDevice()
    if current != index:
        raise ModelError(
            f"this process already runs on GPU {current}, and local rank {local_rank} of {n_gpus} GPUs takes "
            f"GPU {index}; choose the GPU (use_gpu) before anything runs on one"
        )
    return made


def _cuda_reason(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "InsufficientDriver" in text or "NoDevice" in text:
        return f"{text}; is an NVIDIA driver installed, and new enough for this CuPy's CUDA?"
    return text


def set_tf32(enabled: bool) -> None:
    """Let float32 GEMMs on the GPU use TF32 tensor cores (default: on; see the module docstring).
    Applies to the cuda backend now if it is made, else when it is."""
    _TF32["on"] = bool(enabled)
    if "cuda" in _BACKENDS:
        from tokenkit.transformer.backends import cuda

        cuda.set_tf32(_TF32["on"])


def tf32_enabled() -> bool:
    """Whether float32 GEMMs on the GPU may use TF32."""
    return _TF32["on"]


def set_cuda_graphs(enabled: bool) -> None:
    """Let generation replay each one-token step as a CUDA graph where it can (default: on; the
    environment variable TK_CUDA_GRAPHS=0 turns it off): the same tokens, far fewer launches."""
    _GRAPHS["on"] = bool(enabled)


def cuda_graphs_enabled() -> bool:
    """Whether generation may capture its steps as CUDA graphs (on a backend that has `capture`)."""
    return _GRAPHS["on"]


def backend_of(array) -> Backend:
    """The backend whose arrays `array` is (a numpy array: cpu; a cupy array: cuda)."""
    if isinstance(array, np.ndarray):
        return get_backend("cpu")
    if type(array).__module__.split(".")[0] == "cupy":
        return get_backend("cuda")
    raise ModelError(f"expected a NumPy or CuPy array, got {type(array).__name__}")


def as_host(array) -> np.ndarray:
    """`array` as a host NumPy array: the array itself when it is one already (no copy), else a
    copy from its device (a CuPy array's `.get()`); lists and scalars through np.asarray."""
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    if get is not None and type(array).__module__.split(".")[0] == "cupy":
        return get()
    return np.asarray(array)
