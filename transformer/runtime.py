"""How tk runs on this machine's CPU: settings of the process, not of the model's math.

- `one_blas_thread()`: BLAS single-threaded inside a block. tk's own parallelism is over batch
  shards in processes (transformer/parallel.py); BLAS threads on top oversubscribe the cores.
- `keep_freed_memory()`: glibc's malloc keeps freed activation-sized arrays for the next step.
- `tuned()`: both, around the batched calls of the executors (transformer/parallel.py). One
  sequence's generation is left to BLAS's own threads: its GEMVs gain from them.

What it deliberately does not do: any math (model.py, ops.py), or decide how work is split
(parallel.py). Everything here is a no-op where its library cannot be found (another BLAS, no
glibc, not Linux).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@lru_cache(maxsize=1)
def _openblas_threads_api():
    """(set, get) of the OpenBLAS thread count NumPy uses, or None where it cannot be found
    (another BLAS, another OS): then the BLAS keeps its own setting."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1].lower()})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    return setter, getter
    return None


@contextmanager
def one_blas_thread():
    """Run a block with single-threaded BLAS. tk parallelises by itself, over batch shards in
    worker processes (one sync per step, not one per matmul); BLAS threads on top would
    oversubscribe the cores, and their spin-waits collapse on a busy machine (BENCHMARKS.md)."""
    api = _openblas_threads_api()
    if api is None:
        yield
        return
    setter, getter = api
    before = getter()
    setter(1)
    try:
        yield
    finally:
        setter(before)


@lru_cache(maxsize=1)
def keep_freed_memory() -> None:
    """Ask glibc's malloc to keep freed memory for reuse rather than hand it back to the OS.

    A training step allocates and frees the same activation-sized arrays every time; with
    glibc's defaults many of them are returned to the OS (munmap, heap trim) and page-faulted in
    again the next step (page faults cost a quarter of a small step: BENCHMARKS.md). Arrays up
    to 32 MB (the most glibc allows) then come from its heaps, which are not trimmed below 1 GB.
    A no-op where there is no glibc.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no libc to open, or not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    mallopt(m_trim_threshold, 1024 * 1024 * 1024)


@contextmanager
def tuned() -> Iterator[None]:
    """Single-threaded BLAS and a malloc that keeps freed memory, for the block's model calls."""
    keep_freed_memory()
    with one_blas_thread():
        yield
