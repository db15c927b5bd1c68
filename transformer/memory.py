"""How much memory a model needs, and whether this machine has it: a one-line ModelError instead
of a MemoryError (or a machine swapping to a halt) for a model that cannot fit.

What it counts: the float32 parameters, the sinusoid table of sinusoidal positions (no tensor
backs it; rotary positions' cos and sin tables are counted alike), and the per-layer K/V caches
of generation (n_kv_heads heads each); training adds the gradients, AdamW's two
moments and its scratch, and, given the batch (`batch_rows`), the activations of a step: every
layer's cached intermediates, the attention weights (none where a GPU fuses attention), the
logits and the backward's transients (`activation_bytes`). tests/test_reliability_files.py
checks the training estimate against the peak that tracemalloc measures; bench/gpu.py prints the
GPU's estimate beside the peak of CuPy's pool.

What it deliberately does not do: allocate, or decide the config (transformer/config.py bounds it).
"""

from __future__ import annotations

import os
import sys

from tokenkit.transformer.config import GPTConfig
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.tiling import query_tiles

_F32 = 4  # bytes per parameter and per activation
_TRANSIENT = 16  # floats per token and unit of width alive besides: residual stream, embeddings, gradients
_SCRATCH = 2 << 20  # the ops' row-block buffers and other small arrays of a step


def activation_bytes(config: GPTConfig, rows: int, fused_attention: bool = False, dropout: bool = False) -> int:
    """Bytes one process holds at the peak of a training step over `rows` rows of context_length
    tokens (N = rows x T, width C, L layers, H heads, vocabulary V), besides the parameters:

    - each layer's caches for the backward: N x (6 C + W + 2 F) (`cached_per_token`: the two
      norms' outputs and normalised inputs, the scaled q, the fused q|k|v of width W, the
      attention output, the MLP's activation and its derivative of width F): 17 x N x C for
      GPT-2; and the attention weights, rows x H x T x T (causal attention keeps the
      query tiles' share, `tiling.query_tiles`);
    - 16 x N x C of residual stream, embeddings and the backward's transients, plus the gradient
      of one tile's scores;
    - the logits, N x V (one buffer: the softmax and its gradient overwrite it).

    `fused_attention` (a GPU's fused kernels, transformer/backends/attention_source.py): no
    weights and no scaled q are kept, only each row's log-sum-exp (H floats per token).
    `dropout` (training's, transformer/dropout.py): each layer keeps its masks too, one beside
    the attention weights and two of N x C for the residual branches.

    >>> activation_bytes(GPTConfig(), rows=8) / 1e9  # GPT-2 small, 8 rows of 1024 tokens
    9.953640448
    >>> activation_bytes(GPTConfig(), rows=8, fused_attention=True) / 1e9  # on a GPU
    6.888128512
    """
    T, C, L, H = config.context_length, config.d_model, config.n_layers, config.n_heads
    N = rows * T
    if fused_attention:
        floats = N * ((cached_per_token(config) - C + H) * L + _TRANSIENT * C)
        return _F32 * (floats + N * config.vocab_size) + _SCRATCH
    tiles = [(hi - lo) * keys for lo, hi, keys in query_tiles(T, config.causal, rows * H)]
    weights = rows * H * sum(tiles)
    floats = N * (cached_per_token(config) * L + _TRANSIENT * C) + weights * L + rows * H * max(tiles)
    if dropout:
        floats += (weights + 2 * N * C) * L
    return _F32 * (floats + N * config.vocab_size) + _SCRATCH


def cached_per_token(config: GPTConfig) -> int:
    """Floats per token that one layer keeps for its backward: 4 C for its two norms (output and
    normalised input each), W + C for the fused q|k|v (W = (H + 2 Hkv) hd, the K/V views keep it
    whole; the rotated copy replaces it under rotary positions) and the scaled q, C for the
    attention output (one array: the output projection's input and the attention's cache), and
    2 F for the MLP's activation and its derivative (F the hidden width; SwiGLU's gate and up
    products die in the forward).

    >>> cached_per_token(GPTConfig(d_model=10, n_heads=2))  # GPT-2: 17 C
    170
    """
    C = config.d_model
    W = (config.n_heads + 2 * config.kv_heads) * config.head_dim
    return 4 * C + W + C + C + 2 * config.hidden


def estimate_bytes(
    config: GPTConfig,
    *,
    training: bool = False,
    workers: int | None = 1,
    batch_rows: int = 0,
    fused_attention: bool = False,
    run: bool = True,
    trainable: int | None = None,
    dropout: bool = False,
) -> int:
    """Bytes a model of `config` needs (`run` False: its float32 weights alone, as a conversion
    holds them, `tk import-hf`'s: no table or caches).

    Inference: parameters + sinusoid table (sinusoidal positions; rotary ones' cos and sin) +
    K/V caches for generation (2 x n_layers x context_length x n_kv_heads x head size: d_model
    per position and layer with ordinary attention). Training: parameters, AdamW's two moments and its
    scratch, and one gradient buffer per process computing batch shards (`workers`; 1: ~5x the
    parameters; None or 0: one per available core, as GPT and TrainConfig read them) + the
    sinusoid table + the activations of a step over `batch_rows` rows (0: not counted), which
    the processes share between them (`activation_bytes` of each one's rows; `fused_attention`
    and `dropout` as there). `trainable`: the parameters AdamW updates (None: all); the frozen
    ones (`--freeze`) keep no moments.

    >>> estimate_bytes(GPTConfig()) / 1e9  # GPT-2 small: 498 MB of weights + 75 MB of K/V caches
    0.573256704
    >>> estimate_bytes(GPTConfig(), training=True) / 1e9
    2.48879616
    >>> estimate_bytes(GPTConfig(), training=True, batch_rows=8) / 1e9  # and a batch of 8 x 1024 tokens
    12.442436608
    """
    params = _F32 * config.n_params()
    if not run:
        return params
    table = _F32 * config.context_length * config.d_model if config.positional == "sinusoidal" else 0
    if config.positional == "rope":  # cos and sin, (T, hd / 2) each, T rounded up to a power of two
        table = _F32 * (1 << (config.context_length - 1).bit_length()) * config.head_dim
    if training:
        n = _workers(workers)
        activations = 0
        if batch_rows > 0:
            per_process = -(-batch_rows // n)  # shard_rows' largest share
            activations = min(n, batch_rows) * activation_bytes(config, per_process, fused_attention, dropout)
        moments = 2 * (params if trainable is None else _F32 * trainable)
        return (2 + n) * params + moments + table + activations
    kv_caches = 2 * _F32 * config.n_layers * config.context_length * config.kv_heads * config.head_dim
    return params + table + kv_caches


def _workers(workers: int | None) -> int:
    if workers:
        return max(1, int(workers))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_bytes() -> int | None:
    """Bytes this process can still allocate, or None when the system does not say.

    Linux: MemAvailable of /proc/meminfo (free memory plus what the kernel can reclaim);
    elsewhere the free physical pages (os.sysconf). A process address-space limit
    (RLIMIT_AS, e.g. `ulimit -v`) lowers it to what is left under the limit.
    """
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):  # not on this system (macOS, Windows)
            avail = None
    limit = _address_space_left()
    if limit is not None:
        avail = limit if avail is None else min(avail, limit)
    return avail


def _device_free_bytes() -> int | None:
    """The GPU's free memory (cudaMemGetInfo) and what CuPy's pool holds unused, or None."""
    try:
        import cupy

        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free) + int(cupy.get_default_memory_pool().free_bytes())
    except Exception:  # noqa: BLE001 — no CuPy or no GPU: get_backend says so in one line first
        return None


def _fused_attention(config: GPTConfig, device: str) -> bool:
    """Whether a float32 model of `config` trains through fused attention on `device`'s backend;
    False (the larger estimate) where that backend cannot be had."""
    from tokenkit.transformer.backends import get_backend
    from tokenkit.transformer.backends.device_ops import fused_attention_applies

    try:
        kernels = getattr(get_backend(device).ops, "kernels", None)
    except ModelError:
        return False
    return kernels is not None and fused_attention_applies(kernels, "float32", config.head_dim)


def _address_space_left() -> int | None:
    if sys.platform == "win32":
        return None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm", encoding="ascii") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(0, soft - used)
    except (ImportError, OSError, ValueError, IndexError, AttributeError):
        return None


def check_memory(
    config: GPTConfig,
    *,
    training: bool = False,
    workers: int | None = 1,
    loaded: bool = False,
    batch_rows: int = 0,
    device: str = "cpu",
    run: bool = True,
    trainable: int | None = None,
    dropout: bool = False,
) -> int:
    """Raise a one-line ModelError when a model of `config` would not fit in the memory available
    now; returns the estimate in bytes. `loaded`: its parameters are already in memory (read from
    a file), so only what comes on top of them is checked. `batch_rows`: training steps over
    that many rows of context_length tokens (their activations count). `run` False: the weights
    are only held, to be converted (`tk import-hf`), never run. `trainable`, `dropout`: as
    `estimate_bytes`.

    Call it before allocating: GPT does for inference (construction and from_params); training
    calls it with training=True and its batch before anything else; a model file's reader
    (transformer/io.py's `check_fits`, `tk import-hf`) with its header's config before it reads
    a weight. `device` "cuda": the GPU's memory, one process (the weights a model file brought
    to the host still go to the GPU).
    """
    gpu = device != "cpu"
    workers = 1 if gpu else workers
    fused = gpu and _fused_attention(config, device)
    need = estimate_bytes(
        config,
        training=training,
        workers=workers,
        batch_rows=batch_rows,
        fused_attention=fused,
        run=run,
        trainable=trainable,
        dropout=dropout,
    )
    if loaded and not gpu:
        need -= _F32 * config.n_params()
    avail = _device_free_bytes() if gpu else available_bytes()
    if avail is not None and need > avail:
        if loaded:
            what = f"beyond its loaded weights: caches for a context of {config.context_length:,}"
        elif training:
            state = estimate_bytes(config, training=True, workers=workers, trainable=trainable)
            what = f"{config.n_params():,} parameters with their gradients and AdamW's state: {state / 1e9:,.1f} GB"
            if batch_rows > 0:
                what += (
                    f"; the activations of a batch of {batch_rows:,} x {config.context_length:,} tokens: "
                    f"{(need - state) / 1e9:,.1f} GB"
                )
        elif not run:
            what = f"{config.n_params():,} float32 parameters"
        else:
            what = f"{config.n_params():,} parameters and the caches of a context of {config.context_length:,}"
        smaller = "a smaller batch, context_length or model" if training else "a smaller model"
        memory = "GPU memory" if gpu else "memory"
        raise ModelError(
            f"the model needs about {need / 1e9:,.1f} GB of {memory} ({what}), more than the {avail / 1e9:,.1f} GB "
            f"available; use {smaller} (d_model, n_layers, vocabulary) or free {memory}"
        )
    return need


__all__ = ["activation_bytes", "available_bytes", "cached_per_token", "check_memory", "estimate_bytes"]
