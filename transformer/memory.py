"""How much memory a model needs, and whether this machine has it: a one-line ModelError instead
of a MemoryError (or a machine swapping to a halt) for a model that cannot fit.

What it counts is what scales with the config, not with the batch: the float32 parameters, the
sinusoid table of sinusoidal positions (no tensor backs it), and the per-layer K/V caches of
generation; training adds gradients and AdamW's two moments. Activations depend on the batch
and sequence length, which the caller chooses later, so they are not counted.

What it deliberately does not do: allocate, or decide the config (transformer/config.py bounds it).
"""

from __future__ import annotations

import os
import sys

from tokenkit.transformer.config import GPTConfig
from tokenkit.transformer.errors import ModelError

_F32 = 4  # bytes per parameter and per activation


def estimate_bytes(config: GPTConfig, *, training: bool = False, workers: int | None = 1) -> int:
    """Bytes a model of `config` needs besides per-batch activations.

    Inference: parameters + sinusoid table (sinusoidal positions) + K/V caches for generation
    (2 x n_layers x context_length x d_model). Training: parameters, AdamW's two moments, and one
    gradient buffer per process computing batch shards (`workers`; 1: ~4x the parameters; None or
    0: one per available core, as GPT and TrainConfig read them) + the sinusoid table.

    >>> estimate_bytes(GPTConfig()) / 1e9  # GPT-2 small: 498 MB of weights + 75 MB of K/V caches
    0.573256704
    >>> estimate_bytes(GPTConfig(), training=True) / 1e9
    1.991036928
    """
    params = _F32 * config.n_params()
    table = _F32 * config.context_length * config.d_model if config.positional == "sinusoidal" else 0
    if training:
        return (3 + _workers(workers)) * params + table
    kv_caches = 2 * _F32 * config.n_layers * config.context_length * config.d_model
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


def check_memory(config: GPTConfig, *, training: bool = False, workers: int | None = 1, loaded: bool = False) -> int:
    """Raise a one-line ModelError when a model of `config` would not fit in the memory available
    now; returns the estimate in bytes. `loaded`: its parameters are already in memory (read from
    a file), so only what comes on top of them is checked.

    Call it before allocating: GPT does for inference (construction and from_params); training
    calls it with training=True where it starts.
    """
    need = estimate_bytes(config, training=training, workers=workers)
    if loaded:
        need -= _F32 * config.n_params()
    avail = available_bytes()
    if avail is not None and need > avail:
        if loaded:
            what = f"beyond its loaded weights: caches for a context of {config.context_length:,}"
        elif training:
            what = f"{config.n_params():,} parameters with their gradients and AdamW's two moments"
        else:
            what = f"{config.n_params():,} parameters and the caches of a context of {config.context_length:,}"
        raise ModelError(
            f"the model needs about {need / 1e9:,.1f} GB of memory ({what}), more than the {avail / 1e9:,.1f} GB "
            "available; use a smaller model (d_model, n_layers, context_length, vocabulary) or free memory"
        )
    return need


__all__ = ["available_bytes", "check_memory", "estimate_bytes"]
