"""NumPy twins of the fused attention kernels (attention_source.py): the same function with the
same operands rounded to TF32, computed in float64 over whole (T, T) matrices.

The kernels walk tiles with an online softmax and accumulate in float32; a twin takes the whole
row at once. What they share is every rounding that changes a result by more than float32's:
Q scaled by scale * log2(e) and then rounded, K, V and dO rounded, P and dS rounded before they
are multiplied again, and the row sum taken over the unrounded P. So a kernel and its twin agree
to float32 accumulation error (~1e-6 relative), and both differ from exact attention by TF32's
(~1e-3), which tests/test_cuda_emulator.py and tests/test_gpu.py check separately.

What this module deliberately does not do: tiles, or anything fast.
"""

from __future__ import annotations

import numpy as np

LOG2E = np.float32(1.4426950408889634)


def tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 mantissa bits; nearest, ties away from zero, as PTX's
    cvt.rna.tf32.f32), still as float32. NaN and infinities pass through."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)  # sign-magnitude: half up is away from zero
    return np.where(finite, rounded, bits).view(np.float32)


def _split(qkv: np.ndarray, n_heads: int, n_kv_heads: int):
    """(B, T, (H + 2 Hkv) D) -> q (B, H, T, D), k, v (B, H, T, D) with K/V heads repeated per group."""
    B, T, W = qkv.shape
    D = W // (n_heads + 2 * n_kv_heads)
    x = qkv.reshape(B, T, n_heads + 2 * n_kv_heads, D).transpose(0, 2, 1, 3)
    group = n_heads // n_kv_heads
    k = np.repeat(x[:, n_heads : n_heads + n_kv_heads], group, axis=1)
    v = np.repeat(x[:, n_heads + n_kv_heads :], group, axis=1)
    return x[:, :n_heads], k, v


def _seen(T: int, causal: bool) -> np.ndarray:
    """(T, T) bool: query i sees key j."""
    return np.tril(np.ones((T, T), dtype=bool)) if causal else np.ones((T, T), dtype=bool)


def _scores(q, k, scale: float) -> np.ndarray:
    """(B, H, T, T) float64 scores in log2 units, from the operands the kernels multiply."""
    q2 = tf32(q * np.float32(np.float32(scale) * LOG2E)).astype(np.float64)
    return q2 @ tf32(k).astype(np.float64).swapaxes(-1, -2)


def flash_forward(qkv: np.ndarray, n_heads: int, n_kv_heads: int, causal: bool, scale: float):
    """qkv (B, T, (H + 2 Hkv) D) float32 -> out (B, T, H D), lse (B, H, T): kernel `flash_forward`."""
    B, T, _ = qkv.shape
    q, k, v = _split(qkv, n_heads, n_kv_heads)
    s = np.where(_seen(T, causal), _scores(q, k, scale), -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp2(s - m).astype(np.float32)  # the kernel's exp2f(s - m) in float32
    rowsum = p.astype(np.float64).sum(axis=-1, keepdims=True)
    out = (tf32(p).astype(np.float64) @ tf32(v).astype(np.float64)) / rowsum  # (B, H, T, D)
    lse = (m[..., 0] + np.log2(rowsum[..., 0])) * np.log(2.0)
    out = out.transpose(0, 2, 1, 3).reshape(B, T, -1)
    return out.astype(np.float32), lse.astype(np.float32)


def flash_backward(dout, qkv, out, lse, n_heads: int, n_kv_heads: int, causal: bool, scale: float) -> np.ndarray:
    """dout (B, T, H D), qkv, out, lse as the forward's -> dqkv (B, T, (H + 2 Hkv) D): kernels
    `flash_backward_dq` and `flash_backward_dkv` (delta = rowsum(dout * out) in float32)."""
    B, T, W = qkv.shape
    H, Hkv = n_heads, n_kv_heads
    D = W // (H + 2 * Hkv)
    q, k, v = _split(qkv, H, Hkv)
    do = dout.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    delta = (dout * out).reshape(B, T, H, D).sum(axis=-1, dtype=np.float32).transpose(0, 2, 1)[..., None]
    seen = _seen(T, causal)
    s = _scores(q, k, scale)
    p = np.where(seen, np.exp2(s - lse[..., None].astype(np.float64) * np.float64(LOG2E)), 0.0)
    do_t = tf32(do).astype(np.float64)
    dp = do_t @ tf32(v).astype(np.float64).swapaxes(-1, -2)
    ds = tf32((p * (dp - delta)).astype(np.float32)).astype(np.float64)
    dq = (ds @ tf32(k).astype(np.float64)) * scale
    q2 = tf32(q * np.float32(np.float32(scale) * LOG2E)).astype(np.float64)
    dk = (ds.swapaxes(-1, -2) @ q2) / np.float64(LOG2E)
    dv = tf32(p.astype(np.float32)).astype(np.float64).swapaxes(-1, -2) @ do_t
    group = H // Hkv
    dk = dk.reshape(B, Hkv, group, T, D).sum(axis=2)
    dv = dv.reshape(B, Hkv, group, T, D).sum(axis=2)
    dqkv = np.concatenate([dq, dk, dv], axis=1)  # (B, H + 2 Hkv, T, D)
    return dqkv.transpose(0, 2, 1, 3).reshape(B, T, W).astype(np.float32)


def decode_attention(qkv, k_cache, v_cache, start: int, n_heads: int, n_kv_heads: int, scale: float) -> np.ndarray:
    """qkv (B, 1, (H + 2 Hkv) D) of position `start`, caches (B, Hkv, Tmax, D) -> out (B, 1, H D), and
    the new key and value written into the caches: kernel `decode_attention` (float32 arithmetic;
    the kernel's per-thread sums differ in their last bits). `start` may be an int32 array (1,):
    kernel `decode_attention_at`, the position read from memory."""
    start = int(start) if isinstance(start, (int, np.integer)) else int(start[0])
    B, _, W = qkv.shape
    D = W // (n_heads + 2 * n_kv_heads)
    x = qkv.reshape(B, n_heads + 2 * n_kv_heads, D)
    k_cache[:, :, start] = x[:, n_heads : n_heads + n_kv_heads]
    v_cache[:, :, start] = x[:, n_heads + n_kv_heads :]
    group = n_heads // n_kv_heads
    keys = np.repeat(k_cache[:, :, : start + 1], group, axis=1)  # (B, H, start + 1, D)
    values = np.repeat(v_cache[:, :, : start + 1], group, axis=1)
    q = x[:, :n_heads] * np.float32(scale)  # (B, H, D)
    s = np.einsum("bhd,bhjd->bhj", q, keys)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    out = np.einsum("bhj,bhjd->bhd", p, values) / p.sum(axis=-1, keepdims=True)
    return out.reshape(B, 1, n_heads * D).astype(np.float32)
