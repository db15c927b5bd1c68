"""The GPU's ops: transformer/ops.py's names and signatures, written for a device where each
elementwise or row-wise pass is a fused kernel and every matmul is a vendor GEMM.

`DeviceOps(xp, kernels)` holds the op functions as methods. On a GPU, xp is CuPy and `kernels`
are the CUDA kernels as transformer/backends/cuda_launch.py launches them (cuBLAS does the
matmuls); on the CPU, xp is NumPy and `kernels` are their NumPy twins
(transformer/backends/cuda_twins.py), which compute what each kernel computes, in the same order.
So this file, the glue between kernels and GEMMs, runs and is tested on any machine: the twins'
ops against transformer/reference.py and ops.py, and a whole model training on them against the
CPU model (tests/test_backends.py).

How it differs from the CPU ops, and why:
- No cache tiling: a GPU streams whole arrays; one launch per pass is what counts there.
- Attention, where the kernels fuse it (float32 with TF32 on, head dims 16, 32, 64: the GPU's
  `flash_attention_*`, attention_source.py), never writes the (B, H, T, T) weights: one kernel
  forward, two backward, reading q, k, v in place from the fused projection. Otherwise it is one
  tile: scores (B, H, T, T) from one batched GEMM, then one kernel that masks (causal),
  normalises and writes the weights in place (float64, TF32 off, explain's trace, generation).
- Column sums (LayerNorm's dweight and dbias, linear's dbias, the positions' gradient) come
  from a chunked kernel that adds rows in a fixed order: deterministic, unlike atomics.
- GPT-2's block (block.py's `GPT2Block`) calls ops that fuse its elementwise passes, so that
  fewer bytes cross memory: c_fc's bias goes into the GELU kernel (`linear_gelu_*`, whose
  backward writes dpre and sums its columns in one pass), each c_proj's bias into its residual's
  kernel (`bias_residual_*`, `residual_layernorm_*`, the latter with ln_2's LayerNorm), and a
  LayerNorm's input gradient is added into the skip's by its row kernel (`layernorm_add_backward`).
  LayerNorm's dweight and dbias come from one column pass. The CPU's ops of those names are
  today's ops in a row (ops.py), so the CPU computes the same bits either way.
- The embedding gradient sorts the ids (stably) and adds each id's rows in their original
  order: the additions of NumPy's add.at, so it is bit-identical to the CPU op.
- The cross-entropy keeps each row's max and sum of exponentials instead of writing the
  exponentials: one read of the logits forward, one read and write backward.
- Products of at most SKINNY_ROWS rows (a generation step's linear layers and logits) run on
  kernels of their own instead of cuBLAS: CuPy refuses cuBLAS calls inside the CUDA graph that
  a generation step is captured as (cuda_graph.py), and at a few rows a product only streams
  the weights once.
- Llama's pieces (RMSNorm, rotary positions, SiLU and SwiGLU) are plain array code over xp,
  no kernels of their own yet (RMSNorm's dweight uses the column sums): correct on any device,
  not tuned. Grouped-query attention is fused like any attention where that applies (the kernels
  read each K/V head for its group); on the GEMM path it repeats each K/V head for its group
  (HF's repeat_kv) and sums the group's gradients back.

Kernel interface (what `kernels` provides; arrays C-contiguous, on the device):
    layernorm_forward(x (N, C), w, b or None, eps) -> out (N, C), xhat (N, C), rstd (N,)
    residual_layernorm_forward(x (N, C), h (N, C), hb or None, w, b or None, eps) -> out, xhat, rstd:
        x += h + hb in place, then layernorm_forward of the new x
    layernorm_backward(dout (N, C), xhat, rstd, w, dx=None) -> dx (N, C); added into dx when given
    column_sums(a (N, C), b (N, C) or None) -> (C,): sum over rows of a * b (or of a)
    column_sums_pair(a (N, C), b (N, C)) -> sums of a * b (C,), of a (C,), in one read of a
    product_column_sums(a (N, C), b (N, C)) -> a * b (N, C), its column sums (C,)
    bias_residual(x (N, C), h (N, C), b (C,) or None): x += h + b, in place
    gelu(x (N, C), b (C,) or None, grad) -> out, gelu'(x + b) or None (N, C): GELU of x + b
    xent_forward(logits (N, V), targets (N,)) -> row max (N,), row sum of exp(z - max) (N,), losses (N,) float64
    xent_backward(logits, targets, row_max, row_sum, n_total): logits := dlogits, in place
    attention_softmax(scores (R, Tq, keys), q_offset, causal): scores := weights, in place
    softmax_backward(dw (R, Tq, keys), w, row_dot (R, Tq)): dw := w * (dw - row_dot), in place
    embedding_backward(dout (N, C), ids (N,), dweight (V, C)): dweight[ids[i]] += dout[i], in place
    adamw(p, g, m, v, beta1, beta2, scale, eps, decay): in place, as ops.adamw_update
    adamw_multi(ps, gs, ms, vs, decayed, beta1, beta2, scale, eps, decay): adamw over lists of
        arrays at once, array k with `decay` where decayed[k] (else 1)
    fused_attention: whether the two below exist (they may not, e.g. on a GPU older than sm_80)
    flash_attention_forward(qkv (B, T, (H + 2 Hkv) D), H, Hkv, causal, scale) -> out (B, T, H D), lse (B, H, T)
    flash_attention_backward(dout (B, T, H D), qkv, out, lse, H, Hkv, causal, scale) -> dqkv (B, T, (H + 2 Hkv) D)
    decode_attention(qkv (B, 1, W), k_cache (B, Hkv, Tmax, D), v_cache, start, H, Hkv, scale) -> out (B, 1, H D),
        the new key and value written into the caches at `start` (an int, or an int32 device array (1,))
    skinny_matmul(x (R, K), w (K, N), b (N,) or None) -> x w (+ b) (R, N), for R <= SKINNY_ROWS
    skinny_matmul_nt(x (R, C), w (V, C)) -> x w^T (R, V), for R <= SKINNY_ROWS

What this module deliberately does not do: define or launch kernels (cuda_source.py,
cuda_launch.py, cuda_twins.py), import CuPy, or know which device it runs on.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from tokenkit.transformer import ops as cpu_ops
from tokenkit.transformer.backends import attention_source
from tokenkit.transformer.backends.cuda_source import SKINNY_ROWS
from tokenkit.transformer.errors import ModelError

LN_EPS = cpu_ops.LN_EPS


class FusedAttention(NamedTuple):
    """What fused attention keeps for its backward: its inputs, output and rows' log-sum-exp."""

    qkv: Any  # (B, T, (H + 2 Hkv) D)
    out: Any  # (B, T, H D)
    lse: Any  # (B, H, T) float32
    n_heads: int
    n_kv_heads: int
    causal: bool
    scale: float


def fused_decode_applies(kernels, dtype, head_dim: int) -> bool:
    """Whether a generation step's attention (contiguous caches) runs as one kernel: the kernels
    provide it, float32 (in float32 arithmetic: no TF32 involved), a head dim it is built for."""
    return (
        getattr(kernels, "fused_attention", False)
        and np.dtype(dtype) == np.float32
        and head_dim in attention_source.HEAD_DIMS
    )


def fused_attention_applies(kernels, dtype, head_dim: int) -> bool:
    """Whether attention over (dtype, head_dim) runs fused on `kernels`: as `fused_decode_applies`,
    and TF32 on (the kernels multiply on TF32 tensor cores, like the GEMMs they replace)."""
    from tokenkit.transformer.backends import tf32_enabled

    return fused_decode_applies(kernels, dtype, head_dim) and tf32_enabled()


def _rows_in_place(a, C: int):
    """a (..., C) as (N, C) rows for a kernel to write in place: a view, so a must be C-contiguous."""
    assert a.flags.c_contiguous, "an array updated in place by a kernel must be C-contiguous"
    return a.reshape(-1, C)


class DeviceOps:
    """transformer/ops.py's op functions over array module `xp` and fused `kernels` (see the
    module docstring). Each method's contract (shapes, cache) is the CPU op's of the same name;
    the caches differ inside, and belong to the ops that made them."""

    LN_EPS = LN_EPS

    def __init__(self, xp, kernels):
        self.xp = xp
        self.kernels = kernels
        self._tables: dict[tuple, tuple] = {}  # rotary cos and sin tables on the device

    # ------------------------------------------------------------------------- embedding

    def embedding_forward(self, ids, weight):
        """ids (B, T) int, weight (V, C) -> out (B, T, C): row ids[b, t] of weight."""
        return weight.take(ids, axis=0), (ids, weight.shape)

    def embedding_backward(self, dout, cache, dweight=None):
        """dout (B, T, C) -> dweight (V, C); adds into `dweight` when given. Each id's rows add
        in their order in the batch (the kernel's sorted segments)."""
        ids, shape = cache
        if dweight is None:
            dweight = self.xp.zeros(shape, dtype=dout.dtype)
        C = shape[1]
        self.kernels.embedding_backward(self.xp.ascontiguousarray(dout.reshape(-1, C)), ids.reshape(-1), dweight)
        return dweight

    # ------------------------------------------------------------------------- positions

    def sinusoidal_table(self, n_positions: int, d_model: int, dtype=np.float32):
        """(T, C) fixed encodings, the CPU's table copied to the device (made once per model)."""
        return self.xp.asarray(cpu_ops.sinusoidal_table(n_positions, d_model, dtype))

    def positional_forward(self, table, T: int):
        """table (n_positions, C) -> pos_emb (T, C), the rows for positions 0..T-1."""
        return table[:T], (table.shape, T)

    def positional_backward(self, dout, cache):
        """dout (B, T, C) -> dtable (n_positions, C): the batch's sum; rows past T get none."""
        shape, T = cache
        dtable = self.xp.zeros(shape, dtype=dout.dtype)
        B = dout.shape[0]
        dtable[:T] = self.kernels.column_sums(self.xp.ascontiguousarray(dout.reshape(B, -1)), None).reshape(T, -1)
        return dtable

    # ------------------------------------------------------------------------- layernorm

    def layernorm_forward(self, x, weight, bias, eps: float = LN_EPS):
        """x (..., C) -> out (..., C), one kernel; the cache keeps xhat and 1/std as the CPU's does."""
        C = x.shape[-1]
        out, xhat, rstd = self.kernels.layernorm_forward(self.xp.ascontiguousarray(x.reshape(-1, C)), weight, bias, eps)
        return out.reshape(x.shape), (xhat, rstd, weight, bias is not None)

    def layernorm_backward(self, dout, cache):
        """dout (..., C) -> dx (..., C), dweight (C,), dbias (C,) or None: one row kernel for dx,
        one column kernel for both parameters."""
        xhat, rstd, weight, has_bias = cache
        d2 = self.xp.ascontiguousarray(dout.reshape(xhat.shape))
        dx = self.kernels.layernorm_backward(d2, xhat, rstd, weight)
        return (dx.reshape(dout.shape), *self._layernorm_param_grads(d2, xhat, has_bias))

    def layernorm_add_backward(self, dskip, dout, cache):
        """layernorm_backward of an x that also feeds a skip: dskip (..., C) += the LayerNorm's input
        gradient, written over dskip by the row kernel itself (no dx array, no second pass).
        -> dskip, dweight, dbias or None."""
        xhat, rstd, weight, has_bias = cache
        d2 = self.xp.ascontiguousarray(dout.reshape(xhat.shape))
        self.kernels.layernorm_backward(d2, xhat, rstd, weight, _rows_in_place(dskip, xhat.shape[-1]))
        return (dskip, *self._layernorm_param_grads(d2, xhat, has_bias))

    def _layernorm_param_grads(self, d2, xhat, has_bias: bool):
        """dweight = column sums of dout * xhat, dbias = of dout (None without a bias): one read of
        dout and xhat for both."""
        if has_bias:
            return self.kernels.column_sums_pair(d2, xhat)
        return self.kernels.column_sums(d2, xhat), None

    def residual_layernorm_forward(self, x, branch, branch_bias, weight, bias, eps: float = LN_EPS):
        """x (B, T, C) += branch + branch_bias, written over x, then x's LayerNorm: one kernel
        (a warp per row) reads x and branch and writes x, out and the cache's xhat once. -> out, cache."""
        C = x.shape[-1]
        h = self.xp.ascontiguousarray(branch.reshape(-1, C))
        out, xhat, rstd = self.kernels.residual_layernorm_forward(
            _rows_in_place(x, C), h, branch_bias, weight, bias, eps
        )
        return out.reshape(x.shape), ((xhat, rstd, weight, bias is not None), branch_bias is not None)

    def residual_layernorm_backward(self, dskip, dout, cache):
        """-> (dx, dweight, dbias, d branch_bias) as the CPU op: layernorm_add_backward, then the
        branch bias's column sums of dx."""
        ln_cache, has_branch_bias = cache
        dx, dweight, dbias = self.layernorm_add_backward(dskip, dout, ln_cache)
        C = dx.shape[-1]
        return dx, dweight, dbias, self.kernels.column_sums(dx.reshape(-1, C), None) if has_branch_bias else None

    # ------------------------------------------------------------------------- linear

    def linear_forward(self, x, weight, bias):
        """x (..., Cin), weight (Cin, Cout), bias (Cout,) -> (..., Cout): one GEMM, or for a few
        rows (a generation step) one kernel with the bias, which a CUDA graph can hold."""
        out = self._product(x.reshape(-1, x.shape[-1]), weight, bias)
        return out.reshape(*x.shape[:-1], weight.shape[1]), (x, weight, bias is not None)

    def _product(self, x2, weight, bias=None):
        """x2 (N, Cin) @ weight (Cin, Cout) (+ bias): a GEMM, or the skinny kernel for N <= SKINNY_ROWS."""
        if x2.shape[0] <= SKINNY_ROWS:
            return self.kernels.skinny_matmul(self.xp.ascontiguousarray(x2), weight, bias)
        out = x2 @ weight
        if bias is not None:
            out += bias
        return out

    def unembed(self, x, weight):
        """x (R, C), weight (V, C) -> logits (R, V) = x weight^T: for a few rows one kernel (a
        warp per row of weight), else one GEMM."""
        if x.shape[0] <= SKINNY_ROWS:
            return self.kernels.skinny_matmul_nt(self.xp.ascontiguousarray(x), weight)
        return x @ weight.T

    def linear_backward(self, dout, cache):
        """dout (..., Cout) -> dx (..., Cin), dweight (Cin, Cout), dbias (Cout,) or None."""
        x, weight, has_bias = cache
        d2 = self.xp.ascontiguousarray(dout.reshape(-1, dout.shape[-1]))
        x2 = x.reshape(-1, x.shape[-1])
        dx = (d2 @ weight.T).reshape(x.shape)
        dweight = x2.T @ d2
        dbias = self.kernels.column_sums(d2, None) if has_bias else None
        return dx, dweight, dbias

    # ------------------------------------------------------------------------- residual

    def residual_forward(self, x, branch, *, inplace: bool = False):
        """x (B, T, C) + branch (B, T, C); with inplace written over x (no cache holds x)."""
        if inplace:
            x += branch
            return x, None
        return x + branch, None

    def residual_backward(self, dout, cache):
        """dout (B, T, C) -> (d skip, d branch): the same array twice, as on the CPU."""
        return dout, dout

    def bias_residual_forward(self, x, branch, bias):
        """x (B, T, C) += branch + bias (or branch), written over x: one kernel, one read of each and
        one write (the bias's own pass over branch is gone). -> x, cache."""
        C = x.shape[-1]
        self.kernels.bias_residual(_rows_in_place(x, C), self.xp.ascontiguousarray(branch.reshape(-1, C)), bias)
        return x, bias is not None

    def bias_residual_backward(self, dout, cache):
        """dout (B, T, C) -> (d skip, d branch, d bias (C,) or None): dout twice, its column sums."""
        d2 = self.xp.ascontiguousarray(dout.reshape(-1, dout.shape[-1]))
        return dout, dout, self.kernels.column_sums(d2, None) if cache else None

    # ------------------------------------------------------------------------- attention

    def _heads(self, qkv, n_heads: int, n_kv_heads: int | None = None):
        """qkv (B, T, (H + 2 Hkv) hd) -> q (B, H, T, hd), k, v (B, Hkv, T, hd) views."""
        B, T, W = qkv.shape
        Hkv = cpu_ops.kv_heads(n_heads, n_kv_heads)
        x = qkv.reshape(B, T, n_heads + 2 * Hkv, W // (n_heads + 2 * Hkv)).transpose(0, 2, 1, 3)
        return x[:, :n_heads], x[:, n_heads : n_heads + Hkv], x[:, n_heads + Hkv :]

    def _repeat(self, kv, group: int):
        """(B, Hkv, T, hd) -> (B, Hkv * group, T, hd) contiguous: each K/V head for every query
        head of its group (HF's repeat_kv)."""
        return self.xp.ascontiguousarray(kv if group == 1 else self.xp.repeat(kv, group, axis=1))

    def _merge_heads(self, y):
        """(B, H, T, hd) -> (B, T, H * hd), contiguous."""
        B, H, T, hd = y.shape
        return self.xp.ascontiguousarray(y.transpose(0, 2, 1, 3)).reshape(B, T, H * hd)

    def attention_forward(self, qkv, n_heads: int, causal: bool, trace: dict | None = None, n_kv_heads=None, drop=None):
        """qkv (B, T, (H + 2 Hkv) hd) -> out (B, T, H hd) = softmax(q k^T / sqrt(hd) + mask) v.

        Fused where `fused_attention_applies` (one kernel; the cache keeps the rows' log-sum-exp,
        no weights). Otherwise two batched GEMMs around one softmax kernel that masks in place;
        k and v are made contiguous once (repeated for their groups of query heads), since a
        batched GEMM needs one stride per batch. `trace` records what the CPU op records.
        `drop` (the CPU op's dropout mask) is refused: training refuses --dropout on a GPU first.
        """
        if drop is not None:
            raise ModelError("dropout runs on the CPU only: the GPU's fused attention takes no mask")
        xp = self.xp
        Hkv = cpu_ops.kv_heads(n_heads, n_kv_heads)
        hd = qkv.shape[-1] // (n_heads + 2 * Hkv)
        scale = 1.0 / math.sqrt(hd)
        if trace is None and fused_attention_applies(self.kernels, qkv.dtype, hd):
            qkv = xp.ascontiguousarray(qkv)
            out, lse = self.kernels.flash_attention_forward(qkv, n_heads, Hkv, causal, scale)
            return out, FusedAttention(qkv, out, lse, n_heads, Hkv, causal, scale)
        q, k, v = self._heads(qkv, n_heads, n_kv_heads)
        group = n_heads // k.shape[1]
        qs = q * scale  # (B, H, T, hd), contiguous
        k, v = self._repeat(k, group), self._repeat(v, group)
        w = qs @ k.swapaxes(-1, -2)  # (B, H, T, T) scores, then weights in place
        if trace is not None:
            trace["scores"] = self._masked(w.copy(), causal)  # before the kernel overwrites w
        self.kernels.attention_softmax(w, 0, causal)
        out = self._merge_heads(w @ v)  # (B, T, H hd)
        if trace is not None:
            trace["weights"] = w.copy()
            trace["q"], trace["k"], trace["v"] = xp.ascontiguousarray(q), k.copy(), v.copy()
            trace["scores_raw"] = q @ k.swapaxes(-1, -2)
            trace["mix"] = w @ v
        return out, (qs, k, v, w, out, scale, group)

    def _masked(self, scores, causal: bool):
        """(..., T, T) scores with -inf above the diagonal when causal (the trace's form)."""
        if not causal:
            return scores
        T = scores.shape[-1]
        above = self.xp.triu(self.xp.ones((T, T), dtype=bool), k=1)
        return self.xp.where(above, scores.dtype.type(-np.inf), scores)

    def attention_backward(self, dout, cache):
        """dout (B, T, H hd) -> dqkv (B, T, (H + 2 Hkv) hd). ds = w * (dw - dmix . mix) per row,
        as the CPU's (a (T, hd) row dot instead of a (T, T) one); masked weights are 0, so
        masked scores get no gradient. A K/V head's gradient sums its group's. Fused attention's
        cache goes to its backward kernels."""
        if isinstance(cache, FusedAttention):
            return self.kernels.flash_attention_backward(self.xp.ascontiguousarray(dout), *cache)
        xp = self.xp
        qs, k, v, w, out, scale, group = cache
        B, H, T, hd = qs.shape
        Hkv = H // group
        dmix = xp.ascontiguousarray(dout.reshape(B, T, H, hd).transpose(0, 2, 1, 3))  # (B, H, T, hd)
        row_dot = xp.ascontiguousarray((dout * out).reshape(B, T, H, hd).sum(axis=-1).transpose(0, 2, 1))  # (B, H, T)
        ds = dmix @ v.swapaxes(-1, -2)  # (B, H, T, T) d weights, then d scaled scores in place
        self.kernels.softmax_backward(ds, w, row_dot)
        dq = ds @ k
        dq *= scale
        # dk = ds^T qs and dv = w^T dmix, each as the transpose of (T, hd)^T @ (T, T): cuBLAS reads the
        # (T, T) matrix as it lies instead of transposed, 0.33 ms instead of 0.99 per GPT-2 layer on
        # an H200 (bench/gpu_profile.py); the (B, H, T, hd) results are views, summed or copied below
        dk = (qs.swapaxes(-1, -2) @ ds).swapaxes(-1, -2)
        dv = (dmix.swapaxes(-1, -2) @ w).swapaxes(-1, -2)
        if group > 1:  # a K/V head's gradient sums its group's query heads
            dk = dk.reshape(B, Hkv, group, T, hd).sum(axis=2)
            dv = dv.reshape(B, Hkv, group, T, hd).sum(axis=2)
        dqkv = xp.empty((B, T, H + 2 * Hkv, hd), dtype=dout.dtype)
        dqkv[:, :, :H] = dq.transpose(0, 2, 1, 3)
        dqkv[:, :, H : H + Hkv] = dk.transpose(0, 2, 1, 3)
        dqkv[:, :, H + Hkv :] = dv.transpose(0, 2, 1, 3)
        return dqkv.reshape(B, T, (H + 2 * Hkv) * hd)

    def decode_position_on_device(self, dtype, head_dim: int) -> bool:
        """Whether `attention_forward_cached` of one position takes its `start` as an int32 device
        array (1,), read by the kernel: what a CUDA graph of the decode step needs (one kernel)."""
        return fused_decode_applies(self.kernels, dtype, head_dim)

    def attention_forward_cached(self, qkv, k_cache, v_cache, start, n_heads: int, n_kv_heads=None):
        """Incremental causal attention for generation: qkv (B, n, (H + 2 Hkv) hd) of positions
        start..start+n-1; their k, v go into k_cache, v_cache (B, Hkv, T_max, hd). -> out (B, n, H hd).
        One new position (a generation step) is one kernel where `fused_decode_applies`; there
        `start` may be an int32 device array (1,) (`decode_position_on_device`)."""
        Hkv = cpu_ops.kv_heads(n_heads, n_kv_heads)
        hd = qkv.shape[-1] // (n_heads + 2 * Hkv)
        contiguous = k_cache.flags.c_contiguous and v_cache.flags.c_contiguous
        if not isinstance(start, (int, np.integer)) and not (
            qkv.shape[1] == 1 and contiguous and self.decode_position_on_device(qkv.dtype, hd)
        ):
            raise ValueError("a position on the device needs one new position through the fused decode kernel")
        if qkv.shape[1] == 1 and contiguous and fused_decode_applies(self.kernels, qkv.dtype, hd):
            out = self.kernels.decode_attention(
                self.xp.ascontiguousarray(qkv), k_cache, v_cache, start, n_heads, Hkv, 1.0 / math.sqrt(hd)
            )
            return out, None
        q, k, v = self._heads(qkv, n_heads, n_kv_heads)
        group = n_heads // k.shape[1]
        end = start + k.shape[2]
        k_cache[:, :, start:end] = k
        v_cache[:, :, start:end] = v
        keys = self._repeat(k_cache[:, :, :end], group)
        w = (q * (1.0 / math.sqrt(hd))) @ keys.swapaxes(-1, -2)  # (B, H, n, end)
        self.kernels.attention_softmax(w, start, True)
        return self._merge_heads(w @ self._repeat(v_cache[:, :, :end], group)), None

    # ------------------------------------------------------------------------- rotary positions

    def rope_forward(self, qkv, n_heads: int, n_kv_heads, theta: float, start: int = 0, *, scaling=None):
        """qkv (B, T, (H + 2 Hkv) hd) -> the same with q and k rotated (HF's rotate_half layout),
        v unchanged; the CPU's cos and sin tables (`scaling` as there), copied to the device once per shape."""
        B, T, W = qkv.shape
        Hkv = cpu_ops.kv_heads(n_heads, n_kv_heads)
        hd = W // (n_heads + 2 * Hkv)
        cos, sin = self._rope_table(start + T, hd, theta, qkv.dtype, scaling)
        cos, sin = cos[start : start + T], sin[start : start + T]
        rotated = n_heads + Hkv
        x = qkv.reshape(B, T, n_heads + 2 * Hkv, hd)
        out = self.xp.empty_like(x)
        self._rotate_halves(x[:, :, :rotated], out[:, :, :rotated], cos, sin)
        out[:, :, rotated:] = x[:, :, rotated:]
        return out.reshape(qkv.shape), (cos, sin, rotated)

    def rope_backward(self, dout, cache):
        """dout -> dqkv: q's and k's gradients rotated back, v's passed through."""
        cos, sin, rotated = cache
        B, T, W = dout.shape
        hd = 2 * cos.shape[-1]
        d = dout.reshape(B, T, W // hd, hd)
        dx = self.xp.empty_like(d)
        self._rotate_halves(d[:, :, :rotated], dx[:, :, :rotated], cos, -sin)
        dx[:, :, rotated:] = d[:, :, rotated:]
        return dx.reshape(dout.shape)

    def _rope_table(self, n: int, hd: int, theta: float, dtype, scaling):
        """cos, sin (n, hd / 2) on the device, made once per (n, hd, theta, dtype, scaling)."""
        key = ("rope", n, hd, float(theta), np.dtype(dtype).name, scaling)
        if key not in self._tables:
            if len(self._tables) >= 16:
                self._tables.clear()
            table = cpu_ops.rope_table(n, hd, theta, dtype, scaling=scaling)
            self._tables[key] = tuple(self.xp.asarray(t) for t in table)
        return self._tables[key]

    def _rotate_halves(self, x, out, cos, sin):
        """out = x rotated pair (i, i + hd/2) by pair (ops._rotate_halves)."""
        half = x.shape[-1] // 2
        c, s = cos[:, None, :], sin[:, None, :]
        out[..., :half] = x[..., :half] * c - x[..., half:] * s
        out[..., half:] = x[..., half:] * c + x[..., :half] * s

    # ------------------------------------------------------------------------- rmsnorm

    def rmsnorm_forward(self, x, weight, eps: float = LN_EPS):
        """x (..., C) -> x / sqrt(mean(x^2) + eps) * weight; the cache keeps xhat and 1/rms."""
        C = x.shape[-1]
        x2 = x.reshape(-1, C)
        rstd = 1.0 / self.xp.sqrt((x2 * x2).mean(axis=-1, keepdims=True) + eps)  # (N, 1)
        xhat = self.xp.ascontiguousarray(x2 * rstd)
        return (xhat * weight).reshape(x.shape), (xhat, rstd, weight)

    def rmsnorm_backward(self, dout, cache):
        """dout (..., C) -> dx (..., C) = rstd (g - xhat mean(g xhat)) with g = dout * weight,
        dweight (C,) by the column sums kernel."""
        xhat, rstd, weight = cache
        C = xhat.shape[-1]
        d2 = self.xp.ascontiguousarray(dout.reshape(xhat.shape))
        mean_gx = (d2 * xhat) @ weight / C  # (N,)
        dx = (d2 * weight - xhat * mean_gx[:, None]) * rstd
        return dx.reshape(dout.shape), self.kernels.column_sums(d2, xhat)

    # ------------------------------------------------------------------------- activations

    def gelu_forward(self, x, grad: bool = True):
        """x (...) -> GPT-2's tanh GELU, one kernel; with `grad` the cache is gelu'(x) (as on the CPU)."""
        rows = self.xp.ascontiguousarray(x.reshape(-1, x.shape[-1]))
        out, deriv = self.kernels.gelu(rows, None, grad)
        return out.reshape(x.shape), None if deriv is None else deriv.reshape(x.shape)

    def gelu_backward(self, dout, cache):
        """dout (...) -> dout * gelu'(x)."""
        return dout * cache

    def linear_gelu_forward(self, x, weight, bias, grad: bool = True, trace=None):
        """x (..., Cin) -> gelu(x @ weight + bias) (..., Cout): the GEMM without its bias, then one
        kernel adds the bias and writes the GELU and its derivative (no pass of its own for the bias,
        no pre-activation array read back). `trace` gets the pre-activation under "pre", made for
        it. -> out, cache."""
        h = self._product(x.reshape(-1, x.shape[-1]), weight)  # (N, Cout) without the bias
        shape = (*x.shape[:-1], weight.shape[1])
        if trace is not None:
            trace["pre"] = (h if bias is None else h + bias).reshape(shape)
        out, deriv = self.kernels.gelu(h, bias, grad)
        return out.reshape(shape), (x, weight, bias is not None, deriv)

    def linear_gelu_backward(self, dout, cache):
        """dout (..., Cout) -> dx (..., Cin), dweight, dbias or None: one kernel writes
        dpre = dout * gelu' and, with a bias, its column sums (dbias) as it goes; then the GEMMs."""
        x, weight, has_bias, deriv = cache
        d2 = self.xp.ascontiguousarray(dout.reshape(deriv.shape))
        dpre, dbias = self.kernels.product_column_sums(d2, deriv) if has_bias else (d2 * deriv, None)
        dx, dweight, _ = self.linear_backward(dpre, (x, weight, False))
        return dx, dweight, dbias

    def relu_forward(self, x, grad: bool = True):
        """x (...) -> max(x, 0); the cache is the output."""
        out = self.xp.maximum(x, 0)
        return out, out

    def relu_backward(self, dout, cache):
        """dout (...) -> dout where the input was positive, else 0."""
        return self.xp.where(cache > 0, dout, 0).astype(dout.dtype, copy=False)

    def silu_forward(self, x, grad: bool = True):
        """x (...) -> x * sigmoid(x), sigmoid as 0.5 (1 + tanh(x / 2)); with `grad` the cache is
        silu'(x) = sigmoid + silu (1 - sigmoid) (as on the CPU)."""
        s = 0.5 * (1.0 + self.xp.tanh(0.5 * x))
        out = x * s
        return out, (s + out * (1.0 - s)) if grad else None

    def silu_backward(self, dout, cache):
        """dout (...) -> dout * silu'(x)."""
        return dout * cache

    def swiglu_forward(self, h, grad: bool = True):
        """h (..., 2F) = [gate | up] -> silu(gate) * up; the cache (silu(gate), up * silu'(gate))."""
        F = h.shape[-1] // 2
        gate, up = h[..., :F], h[..., F:]
        act, deriv = self.silu_forward(gate, grad)
        return act * up, (act, deriv * up) if grad else None

    def swiglu_backward(self, dout, cache):
        """dout (..., F) -> dh (..., 2F) = [dout * up * silu'(gate) | dout * silu(gate)]."""
        act, up_deriv = cache
        return self.xp.concatenate([dout * up_deriv, dout * act], axis=-1)

    # ------------------------------------------------------------------------- loss

    def softmax_xent_forward(self, logits, targets):
        """logits (N, V), targets (N,) int -> (mean cross-entropy as a float, cache). One kernel
        reads the logits once (an online max and sum per row); the per-row losses are float64."""
        targets = targets.astype(self.xp.int64, copy=False)
        row_max, row_sum, losses = self.kernels.xent_forward(logits, targets)
        return float(losses.mean()), (logits, targets, row_max, row_sum)

    def softmax_xent_backward(self, cache, n_total: int | None = None):
        """-> dlogits (N, V) = (softmax - onehot) / n_total, written over the logits."""
        logits, targets, row_max, row_sum = cache
        self.kernels.xent_backward(logits, targets, row_max, row_sum, n_total or logits.shape[0])
        return logits

    # ------------------------------------------------------------------------- optimizer

    def adamw_update(
        self, p, g, m, v, beta1: float, beta2: float, scale: float, eps: float, decay: float, scratch=None
    ) -> None:
        """ops.adamw_update as one kernel over the flat arrays (`scratch` is not needed)."""
        self.kernels.adamw(p, g, m, v, beta1, beta2, scale, eps, decay)

    def adamw_update_many(
        self, ps, gs, ms, vs, decayed, beta1: float, beta2: float, scale: float, eps: float, decay: float
    ) -> None:
        """adamw_update over lists of arrays in one kernel launch: array k with `decay` where
        decayed[k], else 1 (a GPU's optimizer step is then one launch, not one per parameter)."""
        self.kernels.adamw_multi(ps, gs, ms, vs, decayed, beta1, beta2, scale, eps, decay)
