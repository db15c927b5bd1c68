"""Generation's loop around a GPT: the window over the growing text, its context shifts, the KV
caches, and the one-token step replayed as a captured graph where the backend has graphs.

    steps = steps_cached(model, rows)          # or steps_uncached(model): the whole window each time
    for token in run(tokens, n_new, model.config.context_length, pick, stop_token, steps): ...

`GPT.generate` and `GPT.generate_batch` check their arguments and choose how a token is picked
(sampled on the host, or the argmax on the device); this module does the rest. A step is a
coroutine: it receives (tokens, window start) and returns the next-token logits (B, V), from
the model's `next_logits` (no cache) or `forward_cached` (only the positions not yet cached).
`model` is a transformer.model.GPT throughout (which imports this module, not the other way).

What this module deliberately does not do: the model's math (transformer/model.py), sampling
(transformer/sampling.py), or capture graphs itself (the backend's `capture`,
transformer/backends/cuda_graph.py on a GPU).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


def run(tokens: list, max_new_tokens: int, context_length: int, pick: Callable, stop_token, steps) -> Iterator:
    """Drive `steps` and `pick` over the windows of `tokens`: a list of ints (one row), or of (B,)
    columns (B rows), to which each picked token (or column) is appended. A window holds at most
    context_length tokens; when it is full it shifts to the last context_length // 2 (see
    `GPT.generate`), with one warning the first time the text outgrows the context."""
    T_max = context_length
    start = max(0, len(tokens) - T_max)  # index in `tokens` of the window's first token
    warned = False
    next(steps)  # start the step coroutine
    for _ in range(max_new_tokens):
        if len(tokens) - start > T_max:  # the window is full: shift it
            start = len(tokens) - max(1, T_max // 2)
        if start and not warned:
            warnings.warn(
                f"context of {len(tokens)} tokens is longer than context_length {T_max};"
                f" keeping the last {T_max}, then the last {max(1, T_max // 2)} whenever the window fills",
                stacklevel=3,
            )
            warned = True
        logits = steps.send((tokens, start))
        token = pick(logits)
        yield token
        if stop_token is not None and token == stop_token:
            return
        tokens.append(token)


def window(tokens: list, lo: int) -> np.ndarray:
    """tokens[lo:] as (B, n) intp ids: a list of ints is one row, a list of (B,) columns B rows.

    >>> window([5, 6, 7], 1).tolist(), window([np.array([1, 2]), np.array([3, 4])], 0).tolist()
    ([[6, 7]], [[1, 3], [2, 4]])
    """
    new = np.asarray(tokens[lo:], dtype=np.intp)  # (n,) or (n, B)
    return np.ascontiguousarray(new.reshape(new.shape[0], -1).T)


def steps_uncached(model):
    """Coroutine: receives (tokens, window start) as `run` holds them, returns the next-token
    logits (B, V) by rerunning the whole window tokens[start:]."""
    logits = None
    while True:
        tokens, start = yield logits
        logits = model.next_logits(window(tokens, start))


def steps_cached(model, rows: int):
    """Coroutine like `steps_uncached` for `rows` rows, with per-layer K/V caches (rows, Hkv,
    T_max, hd), one slot per K/V head (n_kv_heads): only the positions not yet cached are
    computed. When the window shifts, every position changes, so the caches are refilled from
    the new window. One-position steps replay as a graph where `captured_step` can."""
    cfg = model.config
    dtype = model.params["wte.weight"].dtype
    shape = (rows, cfg.kv_heads, cfg.context_length, cfg.head_dim)
    k_cache = [model.xp.empty(shape, dtype=dtype) for _ in range(cfg.n_layers)]
    v_cache = [model.xp.empty(shape, dtype=dtype) for _ in range(cfg.n_layers)]
    cached = 0  # positions held in the caches
    window_start = 0  # index in the token list of cached position 0
    step = None  # the one-position step, captured at its first use
    logits = None
    try:
        while True:
            tokens, start = yield logits
            if start != window_start:
                window_start, cached = start, 0
            new = window(tokens, window_start + cached)  # (B, n)
            if new.shape[1] == 1 and step is None:
                step = captured_step(model, rows, k_cache, v_cache) or False
            if new.shape[1] == 1 and step:
                logits = step(new, cached)
            else:
                logits = model.forward_cached(model.backend.to_device(new), cached, k_cache, v_cache)
            cached += new.shape[1]
    finally:
        if step:
            step.close()


def captured_step(model, rows: int, k_cache: list, v_cache: list) -> CapturedDecode | None:
    """The one-position step of `model.forward_cached` recorded once as a graph, or None where
    the backend has none (the CPU), graphs are off, or an op would need the position on the host
    (rotary positions, an attention without the fused decode kernel)."""
    from tokenkit.transformer.backends import cuda_graphs_enabled

    on_device = getattr(model.ops, "decode_position_on_device", None)
    dtype = model.params["wte.weight"].dtype
    if model.backend.capture is None or not cuda_graphs_enabled() or model.config.positional == "rope":
        return None
    if on_device is None or not on_device(dtype, model.config.head_dim):
        return None
    return CapturedDecode(model, rows, k_cache, v_cache)


class CapturedDecode:
    """A generation step of one position per row, captured by the backend (a CUDA graph) over
    inputs that live on the device: the ids (B, 1) and the position (1,), rewritten before each
    replay. The caches are the coroutine's, so prefills (eager) and replays share them.

    step(new (B, 1) host ids, position int) -> logits (B, V), the same device array at every
    step; `close()` gives the graph's memory back."""

    def __init__(self, model, rows: int, k_cache: list, v_cache: list):
        self._model = model
        self._caches = k_cache, v_cache
        self._ids = model.xp.zeros((rows, 1), dtype=np.int64)
        self._position = model.xp.zeros(1, dtype=np.int32)
        self._replay: Any = None  # captured at the first call, when the inputs hold a real step

    def _forward(self):
        return self._model.forward_cached(self._ids, self._position, *self._caches)

    def __call__(self, new: np.ndarray, position: int):
        self._ids[...] = self._model.backend.to_device(new.astype(np.int64))
        self._position[...] = position
        if self._replay is None:
            self._replay = self._model.backend.capture(self._forward)
        return self._replay()

    def close(self) -> None:
        if self._replay is not None:
            self._replay.close()
            self._replay = None
