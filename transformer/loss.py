"""The loss head: logits of the positions that count, their mean cross-entropy, and its backward.

A target of IGNORE (-100, PyTorch's `ignore_index` and transformers' label for it) does not
count: the loss is the mean cross-entropy over the other positions, and an ignored position gets
no gradient from it. Supervised fine-tuning ignores every target but the assistant's tokens
(pipeline/chat_data.py); pretraining ignores none, and then this is the plain mean over every
position, computed by the same code with the same numbers as before masks existed (nothing is
selected: the same arrays go through the same ops).

Only the counted rows are unembedded: their final hidden states are gathered, (n, C), and only
they become logits (n, V), the biggest array of a step, so a fine-tuning step that counts half
its positions computes half the logits. The gradient reaches the others' hidden states as 0.

Shards: a shard's loss is its own mean times n_counted / n_total, where n_total counts the
whole batch's counted positions, and its dlogits are divided by n_total, so shards are summed
(transformer/parallel.py). A shard with no counted position adds 0.

What it deliberately does not do: the op's arithmetic (ops.softmax_xent_forward/backward, or a
GPU backend's kernels), choose which targets count (the caller's targets say), or check them
(`GPT.check_pair`).

>>> import numpy as np
>>> counted_positions(np.array([[3, IGNORE], [IGNORE, 0]]))
2
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenkit.transformer.errors import ModelError

__all__ = [
    "IGNORE",
    "HeadCache",
    "batch_counted",
    "counted_positions",
    "head_backward",
    "head_forward",
    "masked_targets",
]

IGNORE = -100  # a target that does not count


def counted_positions(targets: np.ndarray) -> int:
    """How many of `targets` (host ints, any shape) count: those that are not IGNORE."""
    return int(targets.size - np.count_nonzero(np.asarray(targets) == IGNORE))


def batch_counted(targets: np.ndarray) -> int:
    """The counted positions of a whole batch's targets; ModelError when none counts (no mean)."""
    n = counted_positions(targets)
    if n == 0:
        raise ModelError("every target is IGNORE: no position counts, so the batch has no loss")
    return n


def masked_targets(targets: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`targets` with IGNORE where `mask` (same shape, bool) is False: int64."""
    return np.where(np.asarray(mask, dtype=bool), np.asarray(targets, dtype=np.int64), IGNORE)


@dataclass
class HeadCache:
    """What `head_backward` needs: `x` (n, C) the counted rows of the final hidden states,
    `keep` their flat indices on the device (None: every row), `xent` the op's cache (None when
    n is 0), `shape` the hidden states' (B, T, C)."""

    x: object
    keep: object
    xent: object
    shape: tuple[int, ...]


def head_forward(model, xf, targets: np.ndarray):
    """xf (B, T, C) final hidden states on the model's device, targets (B, T) host ints with
    IGNORE where a position does not count -> (mean loss over the counted positions, their
    number n, HeadCache). The logits (n, V) go into the model's reused buffer, in place."""
    wte = model._unembedding()
    x2 = xf.reshape(-1, xf.shape[-1])
    flat = targets.reshape(-1)
    keep = None
    if np.any(flat == IGNORE):
        index = np.flatnonzero(flat != IGNORE)
        flat = flat[index]
        keep = model.backend.to_device(index)
        x2 = x2[keep]  # (n, C)
    n = flat.shape[0]
    cache = HeadCache(x2, keep, None, tuple(xf.shape))
    if n == 0:
        return 0.0, 0, cache
    logits = model._buffer("logits", (xf.shape[0] * xf.shape[1], wte.shape[0]), wte.dtype)[:n]
    model.xp.matmul(x2, wte.T, out=logits)  # (n, V)
    loss, cache.xent = model.ops.softmax_xent_forward(logits, model.backend.to_device(flat))
    return loss, n, cache


def head_backward(model, cache: HeadCache, unembed, n_total: int):
    """-> (d unembedding (V, C), d xf (B, T, C)) of the shard's loss share, the mean over the
    whole batch's `n_total` counted positions; `unembed` (V, C) is the head's weight."""
    if cache.xent is None:
        dlogits = model.xp.zeros((0, unembed.shape[0]), dtype=unembed.dtype)
    else:
        dlogits = model.ops.softmax_xent_backward(cache.xent, n_total)  # (n, V) = (y_hat - y) / n_total
    d_unembed = dlogits.T @ cache.x  # (V, C)
    d_rows = dlogits @ unembed  # (n, C)
    if cache.keep is None:
        return d_unembed, d_rows.reshape(cache.shape)
    dx = model.xp.zeros((cache.shape[0] * cache.shape[1], cache.shape[2]), dtype=d_rows.dtype)
    dx[cache.keep] = d_rows  # an ignored position's hidden state gets no gradient from the loss
    return d_unembed, dx.reshape(cache.shape)
