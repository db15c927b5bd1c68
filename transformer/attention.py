"""Attention as forward/backward ops: softmax(q k^T / sqrt(hd) + mask) v over the fused qkv tensor,
with grouped K/V heads, causal query tiles, and the incremental step of generation over a KV cache.

The fused projections (B, T, (H + 2 Hkv) hd) are read through views, never copied per head
(`_split_heads`); a K/V head's group of query heads is one axis of its batched matmuls, so k and v
are never repeated. The row softmax skips its max pass when no score can overflow
(`_softmax_rows`), and the backward's softmax row sum is a (T, hd) product, as FlashAttention
computes it. Causal attention runs in query tiles (`tiling.query_tiles`), only each tile's
diagonal block masked. The plain twins, one (batch, head, query) at a time, are
`transformer.reference.attention` and `attention_backward`.

What this module deliberately does not do: the projections around attention or RoPE (ops.py), or
the GPU's fused attention (transformer/backends/).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from tokenkit.transformer.tiling import query_tiles


def kv_heads(n_heads: int, n_kv_heads: int | None) -> int:
    """The number of K/V heads: n_kv_heads, or n_heads when None (ordinary attention)."""
    return n_heads if n_kv_heads is None else n_kv_heads


@lru_cache(maxsize=16)
def causal_mask(T: int, dtype_name: str, group: int = 1) -> np.ndarray:
    """(T * group, T) additive mask: 0 on and below the diagonal, -inf above (a query sees no
    later key). With group > 1 each query position's row is repeated `group` times in a row:
    the rows of a K/V head's group of query heads, laid out position by position.

    >>> causal_mask(2, "float64", group=2).tolist()
    [[0.0, -inf], [0.0, -inf], [0.0, 0.0], [0.0, 0.0]]
    """
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.dtype(dtype_name)), k=1)
    if group > 1:
        mask = np.repeat(mask, group, axis=0)
    mask.flags.writeable = False
    return mask


EXP_SAFE = 60.0  # exp(60) ~ 1e26: sums of such terms stay far below float32's max (3.4e38); the
# cross-entropy (ops.softmax_xent_forward) skips its row max under the same bound
_SUM_UNDERFLOW = 1e-20  # a row summing below this had every score under about -46


def _row_sums(x: np.ndarray) -> np.ndarray:
    """(..., n) -> (...,) sums over the last axis as one GEMV against ones: several times
    faster than `x.sum(-1)` on short rows."""
    n = x.shape[-1]
    return (x.reshape(-1, n) @ np.ones(n, dtype=x.dtype)).reshape(x.shape[:-1])


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """(..., n) scores -> (..., n) softmax over the last axis, as a new array (s is kept).

    Subtracting each row's max guards exp against overflow, but a row-wise max is the slowest
    pass of all. When no score exceeds 60, exp cannot overflow, so rows are exponentiated as
    they are; rows whose sum then underflowed (every score below about -46, where small
    weights would lose precision) are redone with their max subtracted.
    Plain twin: `transformer.reference.softmax`.
    """
    if s.max() < EXP_SAFE:  # False for NaN too
        w = np.exp(s)
    else:
        w = s - s.max(axis=-1, keepdims=True)
        np.exp(w, out=w)
    total = _row_sums(w)
    low = total < _SUM_UNDERFLOW
    if low.any():
        rows = s[low]
        redo = np.exp(rows - rows.max(axis=-1, keepdims=True))
        w[low] = redo
        total[low] = redo.sum(axis=-1)
    w *= (1.0 / total)[..., None]
    return w


def _split_heads(qkv: np.ndarray, n_heads: int, n_kv_heads: int | None = None):
    """qkv (B, T, (H + 2 Hkv) hd) -> q (B, Hkv, T, g, hd), k (B, Hkv, T, hd), v (B, Hkv, T, hd):
    views into the same buffer (no copies), with g = H / Hkv query heads per K/V head.

    The fused layout is q's H heads, then k's Hkv heads, then v's. Query head h = kv * g + j
    reads K/V head kv = h // g (HF's `repeat_kv` order); with Hkv = H (g = 1) this is ordinary
    multi-head attention, with Hkv = 1 multi-query attention.
    """
    B, T, W = qkv.shape
    Hkv = kv_heads(n_heads, n_kv_heads)
    g = n_heads // Hkv
    hd = W // (n_heads + 2 * Hkv)
    x = qkv.reshape(B, T, n_heads + 2 * Hkv, hd)
    q = x[:, :, :n_heads].reshape(B, T, Hkv, g, hd).transpose(0, 2, 1, 3, 4)
    k = x[:, :, n_heads : n_heads + Hkv].transpose(0, 2, 1, 3)
    v = x[:, :, n_heads + Hkv :].transpose(0, 2, 1, 3)
    return q, k, v


def _heads_first(a: np.ndarray) -> np.ndarray:
    """(B, Hkv, T, g, ...) -> (B, H, T, ...) with H = Hkv * g, head h = kv * g + j (a copy):
    the per-head layout of the trace."""
    B, Hkv, T, g = a.shape[:4]
    return a.swapaxes(2, 3).reshape(B, Hkv * g, T, *a.shape[4:])


def _tile_mask(drop: np.ndarray | None, lo: int, hi: int, keys: int, Hkv: int):
    """Query tile lo:hi's part of a dropout mask (B, H, T, T), laid out as the tile's weights
    (B, Hkv, (hi - lo) g, keys): head h = kv g + j's query t on row (t - lo) g + j."""
    if drop is None:
        return None
    B, H, T, _ = drop.shape
    m = drop.reshape(B, Hkv, H // Hkv, T, T)[:, :, :, lo:hi, :keys].transpose(0, 1, 3, 2, 4)
    return m.reshape(B, Hkv, (hi - lo) * (H // Hkv), keys)


def attention_forward(
    qkv: np.ndarray,
    n_heads: int,
    causal: bool,
    trace: dict | None = None,
    n_kv_heads: int | None = None,
    drop: np.ndarray | None = None,
):
    """qkv (B, T, (H + 2 Hkv) hd) fused projections -> out (B, T, H hd) =
    softmax(q k^T / sqrt(hd) + mask) v, each query head attending with its group's K/V head
    (`_split_heads`; n_kv_heads None: one K/V head per query head, the fused width 3C).

    A K/V head's g query heads are one batch of rows: q is scaled once into a (B, Hkv, T, g, hd)
    buffer (T*hd work instead of T*T), whose (T, g) rows are then one axis of T * g queries, so
    each product is one batched matmul per K/V head and k, v are never repeated. With g = 1
    the weighted sums are written straight into the (B, T, C) layout the output projection
    reads. Causal attention runs in query tiles (`tiling.query_tiles`), only each tile's diagonal
    block masked. With `trace` (a dict) it records q, k, v, scores_raw, scores, weights and
    mix, each (B, H, ...) per query head (k and v as each query head sees them), the (T, T)
    ones whole (masked scores -inf, their weights 0).
    `drop` (B, H, T, T), training's dropout mask (0 or 1 / (1 - p), transformer/dropout.py),
    multiplies the weights before they weigh v; the trace's weights are the undropped ones.
    Plain twin: `transformer.reference.attention` (with `reference.dropout` on its weights).
    """
    B, T, _ = qkv.shape
    q, k, v = _split_heads(qkv, n_heads, n_kv_heads)
    _, Hkv, _, g, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    qs = np.empty((B, Hkv, T, g, hd), dtype=qkv.dtype)
    np.multiply(q, scale, out=qs)
    out = np.empty((B, T, n_heads * hd), dtype=qkv.dtype)
    mix = out.reshape(B, T, Hkv, g, hd).transpose(0, 2, 1, 3, 4)  # (B, Hkv, T, g, hd) view of out
    tiles = query_tiles(T, causal, B * n_heads)
    weights = []
    if trace is not None:
        scores5 = np.full((B, Hkv, T, g, T), -np.inf, dtype=qkv.dtype)
        weights5 = np.zeros((B, Hkv, T, g, T), dtype=qkv.dtype)
    for lo, hi, keys in tiles:
        rows = (hi - lo) * g
        scores = qs[:, :, lo:hi].reshape(B, Hkv, rows, hd) @ k[:, :, :keys].swapaxes(-1, -2)  # (B, Hkv, rows, keys)
        if causal:
            scores[..., lo:hi] += causal_mask(hi - lo, scores.dtype.name, g)  # the diagonal block
        w = _softmax_rows(scores)
        mask = _tile_mask(drop, lo, hi, keys, Hkv)
        used = w if mask is None else w * mask
        if g == 1:
            np.matmul(used, v[:, :, :keys], out=mix[:, :, lo:hi, 0])
        else:
            mix[:, :, lo:hi] = (used @ v[:, :, :keys]).reshape(B, Hkv, hi - lo, g, hd)
        weights.append(w if mask is None else (w, mask))
        if trace is not None:
            scores5[:, :, lo:hi, :, :keys] = scores.reshape(B, Hkv, hi - lo, g, keys)
            weights5[:, :, lo:hi, :, :keys] = w.reshape(B, Hkv, hi - lo, g, keys)
    if trace is not None:
        trace["scores"], trace["weights"] = _heads_first(scores5), _heads_first(weights5)
        trace["q"] = _heads_first(q)
        trace["k"], trace["v"] = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        trace["scores_raw"] = trace["q"] @ trace["k"].swapaxes(-1, -2)
        trace["mix"] = _heads_first(mix)
    return out, (qs, k, v, tiles, weights, out, scale)


def attention_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (B, T, H hd) -> dqkv (B, T, (H + 2 Hkv) hd).

    Softmax backward per row: ds = w * (dw - sum_j dw_j w_j). That row sum equals
    dmix . mix (sum_j (dmix . v_j) w_j = dmix . sum_j w_j v_j), a (T, hd) product instead of
    a (T, T) one, as FlashAttention computes it. Masked entries have w = 0, so they get no
    gradient without looking at the mask. A K/V head's gradient is the sum over its group's
    query heads: the group's rows are one axis of the products, so dk = ds^T q and dv = w^T dmix
    add them up inside the GEMMs. Tiles run last to first: the last one sees every key, so it
    writes dk and dv; each earlier tile adds to the keys it saw.
    Plain twin: `transformer.reference.attention_backward`.
    """
    qs, k, v, tiles, weights, out, scale = cache
    B, Hkv, T, g, hd = qs.shape
    H = Hkv * g
    dmix = dout.reshape(B, T, Hkv, g, hd).transpose(0, 2, 1, 3, 4)  # (B, Hkv, T, g, hd) view
    row_dot = np.ascontiguousarray(_row_sums((dout * out).reshape(B, T, Hkv, g, hd)).transpose(0, 2, 1, 3))
    dqkv = np.empty((B, T, (H + 2 * Hkv) * hd), dtype=dout.dtype)
    dq, dk, dv = _split_heads(dqkv, H, Hkv)
    for (lo, hi, keys), w in reversed(list(zip(tiles, weights, strict=True))):
        rows = (hi - lo) * g
        dm = dmix[:, :, lo:hi, 0] if g == 1 else np.ascontiguousarray(dmix[:, :, lo:hi]).reshape(B, Hkv, rows, hd)
        w, mask = w if isinstance(w, tuple) else (w, None)
        ds = dm @ v[:, :, :keys].swapaxes(-1, -2)  # (B, Hkv, rows, keys) d weights
        if mask is not None:
            ds *= mask  # now d(the softmax's weights)
        ds -= row_dot[:, :, lo:hi].reshape(B, Hkv, rows, 1)
        ds *= w  # now the gradient of the scaled scores
        if g == 1:
            np.matmul(ds, k[:, :, :keys], out=dq[:, :, lo:hi, 0])
        else:
            dq[:, :, lo:hi] = (ds @ k[:, :, :keys]).reshape(B, Hkv, hi - lo, g, hd)
        q_rows = qs[:, :, lo:hi].reshape(B, Hkv, rows, hd)
        used = w if mask is None else w * mask  # the weights that weighed v
        if keys == T:
            np.matmul(used.swapaxes(-1, -2), dm, out=dv)
            np.matmul(ds.swapaxes(-1, -2), q_rows, out=dk)
        else:
            dv[:, :, :keys] += used.swapaxes(-1, -2) @ dm
            dk[:, :, :keys] += ds.swapaxes(-1, -2) @ q_rows
    dq *= scale
    return dqkv


def attention_forward_cached(
    qkv: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, start: int, n_heads: int, n_kv_heads: int | None = None
):
    """Incremental causal attention for generation (inference only, no backward).

    qkv (B, n, (H + 2 Hkv) hd) holds the projections of n new positions start..start+n-1; their
    k and v are written into k_cache, v_cache (B, Hkv, T_max, hd) and each new query attends to
    every cached position up to its own. Returns out (B, n, H hd). Only the new positions are
    computed; the cache holds the K/V heads only, g query heads reading each.
    Plain twin: the rows start..start+n-1 of causal `transformer.reference.attention`.
    """
    B, n, _ = qkv.shape
    q, k, v = _split_heads(qkv, n_heads, n_kv_heads)
    _, Hkv, _, g, hd = q.shape
    end = start + n
    k_cache[:, :, start:end] = k
    v_cache[:, :, start:end] = v
    qs = np.empty((B, Hkv, n, g, hd), dtype=qkv.dtype)
    np.multiply(q, 1.0 / math.sqrt(hd), out=qs)
    scores = qs.reshape(B, Hkv, n * g, hd) @ k_cache[:, :, :end].swapaxes(-1, -2)  # (B, Hkv, n g, end)
    if n > 1:
        scores += causal_mask(end, scores.dtype.name, g)[start * g : end * g]  # rows of the new queries
    w = _softmax_rows(scores)
    mix = (w @ v_cache[:, :, :end]).reshape(B, Hkv, n, g, hd)
    return np.ascontiguousarray(mix.transpose(0, 2, 1, 3, 4)).reshape(B, n, n_heads * hd), None
