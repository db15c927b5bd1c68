"""NumPy twins of the CUDA kernels: what each kernel computes, operation for operation, so that
the GPU backend's math runs and is tested on any machine.

Each method of `TwinKernels` mirrors the kernel of the same name in cuda_source.py: the same
per-row and per-element formulas in the same order, the same accumulation dtype (the input's),
and the same summation order, lanes and chunks included: lane l of a warp adds elements l,
l + 32, ... one by one (`_lane_sums`), lanes merge by the xor butterfly (`_butterfly`), column
sums go over chunks of rows and then over chunks (`column_sums`). Where the kernel has a
branch, the twin has an np.where. Only exp, log, tanh and sqrt may differ in their last bits
from the GPU's.

`twin_backend()` is a Backend whose ops are transformer/backends/device_ops.py over these twins
and NumPy: the GPU backend with every kernel replaced by its twin. The tests train the model on
it against the CPU backend (tests/test_backends.py).

What this module deliberately does not do: speed (its loops over lanes and chunks are for
faithfulness), or run anything on a GPU.
"""

from __future__ import annotations

import numpy as np

from tokenkit.transformer.activations import GELU_A, GELU_C
from tokenkit.transformer.backends import attention_twins
from tokenkit.transformer.backends import cuda_source as src
from tokenkit.transformer.backends.device_ops import DeviceOps

WARP = src.WARP
_XOR = [np.arange(WARP) ^ o for o in (16, 8, 4, 2, 1)]  # the butterfly's partner lanes, step by step


def _lane_sums(a: np.ndarray, lanes: int = WARP) -> np.ndarray:
    """a (N, n) -> (N, lanes): lane l's sum of a[:, l], a[:, l + lanes], ..., added in that order
    from 0 (a warp's strided loop). Padding adds zeros, which leave every sum as it is."""
    N, n = a.shape
    k = -(-n // lanes)
    padded = np.zeros((N, k * lanes), dtype=a.dtype)
    padded[:, :n] = a
    acc = np.zeros((N, lanes), dtype=a.dtype)
    for j in range(k):
        acc += padded[:, j * lanes : (j + 1) * lanes]
    return acc


def _butterfly(lanes: np.ndarray, merge=np.add) -> np.ndarray:
    """(..., 32) lane values -> (...,) their total by the xor butterfly (`warp_sum`): at each
    step lane l merges lane l ^ o into its own value; every lane ends with the same total."""
    for partner in _XOR:
        lanes = merge(lanes, lanes[..., partner])
    return lanes[..., 0]


def _larger(a, b):
    """The kernels' `larger(a, b)`: b if it is larger, else a."""
    return np.where(b > a, b, a)


def _combine(m, s, m2, s2):
    """The kernels' `combine`: merge the running (max, sum of exp(z - max)) pair (m2, s2) into (m, s)."""
    big = _larger(m, m2)
    empty = big == -np.inf
    with np.errstate(invalid="ignore"):
        merged = s * np.exp(m - big) + s2 * np.exp(m2 - big)
    return np.where(empty, m, big), np.where(empty, s, merged)


def _butterfly_combine(m, s):
    """`warp_combine`: (..., 32) pairs -> (...,) pair by the xor butterfly."""
    for partner in _XOR:
        m, s = _combine(m, s, m[..., partner], s[..., partner])
    return m[..., 0], s[..., 0]


class TwinKernels:
    """The CUDA kernels' NumPy twins, with the kernel interface of device_ops.py.

    `fused_attention`: whether DeviceOps takes the fused attention path on these twins. Off by
    default, since the twins' GEMMs are full float32 while fused attention multiplies in TF32:
    on, a float32 model's attention differs from the CPU model's by TF32's ~1e-3.
    """

    def __init__(self, fused_attention: bool = False):
        self.fused_attention = fused_attention

    def layernorm_forward(self, x, w, b, eps):
        """x (N, C) -> out, xhat (N, C), rstd (N,): kernel `layernorm_forward`, a warp per row."""
        return self._layernorm_rows(x, w, b, eps)

    def residual_layernorm_forward(self, x, h, hb, w, b, eps):
        """x (N, C) += h + hb (or h), in place, then out, xhat, rstd of the new x: kernel
        `residual_layernorm_forward`."""
        x += h if hb is None else h + hb
        return self._layernorm_rows(x, w, b, eps)

    @staticmethod
    def _layernorm_rows(x, w, b, eps):
        """The kernels' `layernorm_row` over every row of x."""
        C = x.shape[1]
        eps = x.dtype.type(eps)
        mean = _butterfly(_lane_sums(x)) / x.dtype.type(C)
        d = x - mean[:, None]
        r = x.dtype.type(1) / np.sqrt(_butterfly(_lane_sums(d * d)) / x.dtype.type(C) + eps)
        xhat = d * r[:, None]
        out = xhat * w
        if b is not None:
            out = out + b
        return out, xhat, r

    def layernorm_backward(self, dout, xhat, rstd, w, dx=None):
        """dout (N, C) -> dx (N, C): kernel `layernorm_backward`; added into `dx` when given."""
        C = dout.dtype.type(dout.shape[1])
        g = dout * w
        mean_g = _butterfly(_lane_sums(g)) / C
        mean_gx = _butterfly(_lane_sums(g * xhat)) / C
        v = (g - mean_g[:, None] - xhat * mean_gx[:, None]) * rstd[:, None]
        if dx is None:
            return v
        dx += v
        return dx

    def column_sums(self, a, b):
        """a, b (N, C) -> (C,): kernel `column_sums` over chunks of rows, then over the chunks'
        sums, chunk by chunk again, until one row is left."""
        return self._total(self._chunk_sums(a * b if b is not None else a))

    def column_sums_pair(self, a, b):
        """a, b (N, C) -> column sums of a * b (C,), of a (C,): kernel `column_sums_pair`, each
        summed as `column_sums` sums it."""
        N, C = a.shape
        partial = np.stack([self._chunk_sums(a * b), self._chunk_sums(a)], axis=1)  # (n_chunks, 2, C)
        both = self._total(partial.reshape(-1, 2 * C)).reshape(2, C)
        return both[0], both[1]

    def product_column_sums(self, a, b):
        """a, b (N, C) -> a * b (N, C), its column sums (C,): kernel `product_column_sums`."""
        prod = a * b
        return prod, self._total(self._chunk_sums(prod))

    def _total(self, partial):
        """(n_chunks, C) chunks' sums -> (C,), chunk by chunk again until one row is left."""
        while partial.shape[0] > 1:
            partial = self._chunk_sums(partial)
        return partial[0]

    @staticmethod
    def _chunk_sums(a):
        """(N, C) -> (n_chunks, C): each chunk's rows added in order from 0."""
        N, C = a.shape
        rows = src.column_chunk_rows(N)
        n_chunks = max(1, -(-N // rows))
        padded = np.zeros((n_chunks * rows, C), dtype=a.dtype)
        padded[:N] = a
        chunks = padded.reshape(n_chunks, rows, C)
        acc = np.zeros((n_chunks, C), dtype=a.dtype)
        for r in range(rows):
            acc += chunks[:, r]
        return acc

    def skinny_matmul(self, x, w, b):
        """x (R, K) @ w (K, N) (+ b) -> (R, N), R <= SKINNY_ROWS: kernels `skinny_matmul` (chunk c of
        SKINNY_CHUNK rows of w: warp g's sum of its k = g, g + SKINNY_WARPS, ... in order, then the
        warps' sums in order) and `skinny_matmul_sum` (the chunks in order, then the bias)."""
        R, K = x.shape
        chunk, warps = src.SKINNY_CHUNK, src.SKINNY_WARPS
        out = None
        for k0 in range(0, K, chunk):
            partial = [np.zeros((R, w.shape[1]), dtype=x.dtype) for _ in range(warps)]
            for k in range(k0, min(K, k0 + chunk)):
                partial[(k - k0) % warps] += x[:, k : k + 1] * w[k]
            total = partial[0]
            for p in partial[1:]:
                total = total + p
            out = total if out is None else out + total
        return out + b if b is not None else out

    def skinny_matmul_nt(self, x, w):
        """x (R, C) @ w (V, C)^T -> (R, V), R <= SKINNY_ROWS: kernel `skinny_matmul_nt`, a warp per
        row of w (lane sums, then the butterfly)."""
        R, C = x.shape
        products = x[:, None, :] * w[None, :, :]  # (R, V, C)
        sums = _butterfly(_lane_sums(products.reshape(-1, C)))
        return sums.reshape(R, w.shape[0])

    def bias_residual(self, x, h, b):
        """x (N, C) += h + b (or h), in place: kernel `bias_residual`."""
        x += h if b is None else h + b

    def gelu(self, x, b, grad):
        """x (N, C), b (C,) or None -> out, gelu'(v) or None of v = x + b (or x): kernel `gelu_forward`."""
        t = x.dtype.type
        if b is not None:
            x = x + b
        x2 = x * x
        h = np.tanh((x2 * t(GELU_A * GELU_C) + t(GELU_C)) * x) * t(0.5) + t(0.5)
        deriv = None
        if grad:
            s = (x2 * t(6.0 * GELU_A * GELU_C) + t(2.0 * GELU_C)) * x
            deriv = (t(1) - h) * h * s + h
        return x * h, deriv

    def xent_forward(self, logits, targets):
        """logits (N, V) -> row max, row sum of exp(z - max) (N,), losses (N,) float64: kernel
        `xent_forward`, a block of ROW_THREADS threads per row, each with an online max and sum."""
        N, V = logits.shape
        threads = src.ROW_THREADS
        m = np.full((N, threads), -np.inf, dtype=logits.dtype)
        s = np.zeros((N, threads), dtype=logits.dtype)
        one = logits.dtype.type(1)
        with np.errstate(invalid="ignore", over="ignore"):
            for lo in range(0, V, threads):
                z = logits[:, lo : lo + threads]
                n = z.shape[1]
                mm, ss = m[:, :n], s[:, :n]
                bigger = z > mm
                grown = ss * np.exp(mm - z) + one  # the thread's new max is z
                added = ss + np.exp(z - mm)
                s[:, :n] = np.where(bigger, grown, added)
                m[:, :n] = np.where(bigger, z, mm)
        warps = threads // WARP
        wm, ws = _butterfly_combine(m.reshape(N, warps, WARP), s.reshape(N, warps, WARP))  # (N, warps)
        lane_m = np.full((N, WARP), -np.inf, dtype=logits.dtype)
        lane_s = np.zeros((N, WARP), dtype=logits.dtype)
        lane_m[:, :warps], lane_s[:, :warps] = wm, ws
        row_max, row_sum = _butterfly_combine(lane_m, lane_s)
        picked = logits[np.arange(N), targets] - row_max
        losses = np.log(row_sum.astype(np.float64)) - picked.astype(np.float64)
        return row_max, row_sum, losses

    def xent_backward(self, logits, targets, row_max, row_sum, n_total):
        """logits (N, V) := dlogits in place: kernel `xent_backward`."""
        t = logits.dtype.type
        k = t(1) / (row_sum * t(n_total))
        np.subtract(logits, row_max[:, None], out=logits)
        np.exp(logits, out=logits)
        logits *= k[:, None]
        logits[np.arange(logits.shape[0]), targets] -= t(1.0 / n_total)

    def attention_softmax(self, scores, q_offset, causal):
        """scores (..., Tq, keys) := softmax weights in place: kernel `attention_softmax`, a warp per row."""
        *lead, Tq, keys = scores.shape
        rows = scores.reshape(-1, keys)
        seen = q_offset + np.arange(rows.shape[0]) % Tq + 1
        visible = np.minimum(seen, keys) if causal else np.full(rows.shape[0], keys)
        inside = np.arange(keys)[None, :] < visible[:, None]
        k = -(-keys // WARP)
        lane_max = np.full((rows.shape[0], WARP), -np.inf, dtype=rows.dtype)
        for j in range(k):
            block = np.where(inside[:, j * WARP : (j + 1) * WARP], rows[:, j * WARP : (j + 1) * WARP], -np.inf)
            lane_max[:, : block.shape[1]] = _larger(lane_max[:, : block.shape[1]], block)
        m = _butterfly(lane_max, _larger)
        with np.errstate(invalid="ignore"):
            e = np.where(inside, np.exp(rows - m[:, None]), 0)
        inv = rows.dtype.type(1) / _butterfly(_lane_sums(e))
        rows[...] = np.where(inside, e * inv[:, None], 0)

    def softmax_backward(self, ds, w, row_dot):
        """ds := (ds - row_dot) * w in place: kernel `softmax_backward`."""
        ds -= row_dot[..., None]
        ds *= w

    def embedding_backward(self, dout, ids, dweight):
        """dweight[ids[i]] += dout[i] in place, each id's rows in their order: kernel
        `embedding_backward` over the segments of the stably sorted ids."""
        order, seg_start, seg_id = embedding_segments(np, ids)
        lengths = np.diff(seg_start)
        acc = dweight[seg_id].copy()  # (segments, C)
        for j in range(int(lengths.max(initial=0))):
            live = lengths > j
            acc[live] += dout[order[seg_start[:-1][live] + j]]
        dweight[seg_id] = acc

    def adamw(self, p, g, m, v, beta1, beta2, scale, eps, decay):
        """p, m, v updated in place: kernel `adamw`, element by element as ops.adamw_update."""
        t = p.dtype.type
        pv = p * t(decay) if decay != 1.0 else p.copy()
        mv = m * t(beta1) + g
        vv = v * t(beta2) + g * g
        m[...] = mv
        v[...] = vv
        p[...] = pv - mv / (np.sqrt(vv) + t(eps)) * t(scale)

    def adamw_multi(self, ps, gs, ms, vs, decayed, beta1, beta2, scale, eps, decay):
        """Every tensor of the lists updated in place: kernel `adamw_multi`, tensor k as kernel
        `adamw` with `decay` where decayed[k], else 1."""
        for p, g, m, v, d in zip(ps, gs, ms, vs, decayed, strict=True):
            self.adamw(p, g, m, v, beta1, beta2, scale, eps, decay if d else 1.0)

    def flash_attention_forward(self, qkv, n_heads, n_kv_heads, causal, scale):
        """qkv (B, T, (H + 2 Hkv) D) -> out (B, T, H D), lse (B, H, T): kernel `flash_forward`."""
        return attention_twins.flash_forward(qkv, n_heads, n_kv_heads, causal, scale)

    def flash_attention_backward(self, dout, qkv, out, lse, n_heads, n_kv_heads, causal, scale):
        """-> dqkv (B, T, (H + 2 Hkv) D): kernels `flash_backward_dq` and `flash_backward_dkv`."""
        return attention_twins.flash_backward(dout, qkv, out, lse, n_heads, n_kv_heads, causal, scale)

    def decode_attention(self, qkv, k_cache, v_cache, start, n_heads, n_kv_heads, scale):
        """-> out (B, 1, H D), the caches written at `start`: kernel `decode_attention`."""
        return attention_twins.decode_attention(qkv, k_cache, v_cache, start, n_heads, n_kv_heads, scale)


def embedding_segments(xp, ids):
    """ids (N,) -> order (N,), seg_start (S + 1,), seg_id (S,): a stable sort of the ids, cut into
    one segment per distinct id (segment k: positions order[seg_start[k]:seg_start[k + 1]], all
    of id seg_id[k]). The host side of kernel `embedding_backward`, shared with its launcher."""
    ids = ids.astype(xp.int64, copy=False)
    order = xp.argsort(ids, kind="stable") if xp is np else xp.argsort(ids)  # CuPy's sort is always stable
    ordered = ids[order]
    starts = xp.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    seg_start = xp.concatenate(
        [xp.zeros(1, dtype=xp.int64), starts.astype(xp.int64), xp.full(1, ids.size, dtype=xp.int64)]
    )
    return order.astype(xp.int64, copy=False), seg_start, ordered[seg_start[:-1]]


def twin_backend():
    """A Backend named "cuda-twin": device_ops.DeviceOps over NumPy and TwinKernels (host arrays)."""
    from tokenkit.transformer.backends import Backend

    return Backend("cuda-twin", np, DeviceOps(np, TwinKernels()), np.asarray, np.asarray, lambda: None)
