"""The GPU backend: device_ops.DeviceOps over CuPy, with the fused CUDA kernels of cuda_source.py
compiled here by NVRTC, launched by cuda_launch.py, and cuBLAS doing every GEMM (CuPy's matmul).

Run on an NVIDIA H200 (CuPy 14.2, CUDA 13), where tests/test_gpu.py passes: each kernel against
its NumPy twin (cuda_twins.py), whole training steps against the CPU model; bench/gpu.py times
it. Without a GPU, the same launches run the same source on the CPU emulator of the tests
(tests/cuda_emulator.py, docs/gpu.md), and the ops train the model on the twins.

Imported only by `transformer.backends.get_backend("cuda")`, after CuPy and a GPU were found:
a CPU run never imports CuPy. The kernels compile on first use (NVRTC, cached by CuPy on disk).

The fused attention kernels (attention_source.py) compile in a module of their own, on GPUs
with TF32 tensor cores (sm_80 and newer).

Generation's steps replay as CUDA graphs (cuda_graph.py's `capture`, the Backend's).

What this module deliberately does not do: math of its own (the kernels and device_ops.py),
mixed precision, or anything across GPUs.
"""

from __future__ import annotations

import cupy
import numpy as np

from tokenkit.transformer.backends import attention_source as attn
from tokenkit.transformer.backends import cuda_source as src
from tokenkit.transformer.backends.cuda_graph import capture  # noqa: F401 (the Backend's capture)
from tokenkit.transformer.backends.cuda_launch import CudaKernels
from tokenkit.transformer.backends.device_ops import DeviceOps


def set_tf32(enabled: bool) -> None:
    """Let CuPy's float32 GEMMs use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) or not.
    This is the switch behind CuPy's CUPY_TF32 environment variable, set for this process."""
    from cupy._core import _routines_linalg as linalg

    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32 if enabled else linalg.COMPUTE_TYPE_DEFAULT)


def to_device(array) -> cupy.ndarray:
    """A host array (or a CuPy one, returned as it is) on the current GPU, C-contiguous."""
    return cupy.ascontiguousarray(cupy.asarray(array))


def _attention_module():
    """attention_source.py's kernels for every head dim, or None on a GPU without TF32 tensor cores."""
    if int(cupy.cuda.Device().compute_capability) < attn.MIN_COMPUTE_CAPABILITY:  # "90" on an H100
        return None
    names = [f"{name}<{d}>" for name in attn.KERNELS for d in attn.HEAD_DIMS]
    return cupy.RawModule(code=attn.SOURCE, options=attn.OPTIONS, name_expressions=names)


ops = DeviceOps(
    cupy,
    CudaKernels(
        cupy,
        cupy.RawModule(code=src.SOURCE, options=src.OPTIONS, name_expressions=src.EXPRESSIONS),
        _attention_module(),
    ),
)
