"""The GPU's ops: transformer/ops.py's names and signatures, written for a device where each
elementwise or row-wise pass is a fused kernel and every matmul is a vendor GEMM.

`DeviceOps(xp, kernels)` holds the op functions as methods. On a GPU, xp is CuPy and `kernels`
are the CUDA kernels of transformer/backends/cuda.py (cuBLAS does the matmuls); on the CPU,
xp is NumPy and `kernels` are their NumPy twins (transformer/backends/cuda_twins.py), which
compute what each kernel computes, in the same order. So this file, the glue between kernels
and GEMMs, runs and is tested on any machine: the twins' ops against transformer/reference.py
and ops.py, and a whole model training on them against the CPU model (tests/test_backends.py).

How it differs from the CPU ops, and why:
- No cache tiling: a GPU streams whole arrays; one launch per pass is what counts there.
- Attention is one tile: scores (B, H, T, T) from one batched GEMM, then one kernel that
  masks (causal), normalises and writes the weights in place.
- Column sums (LayerNorm's dweight and dbias, linear's dbias, the positions' gradient) come
  from a chunked kernel that adds rows in a fixed order: deterministic, unlike atomics.
- The embedding gradient sorts the ids (stably) and adds each id's rows in their original
  order: the additions of NumPy's add.at, so it is bit-identical to the CPU op.
- The cross-entropy keeps each row's max and sum of exponentials instead of writing the
  exponentials: one read of the logits forward, one read and write backward.

Kernel interface (what `kernels` provides; arrays C-contiguous, on the device):
    layernorm_forward(x (N, C), w, b or None, eps) -> out (N, C), xhat (N, C), rstd (N,)
    layernorm_backward(dout (N, C), xhat, rstd, w) -> dx (N, C)
    column_sums(a (N, C), b (N, C) or None) -> (C,): sum over rows of a * b (or of a)
    gelu(x, grad) -> out, gelu'(x) or None (same shape as x)
    xent_forward(logits (N, V), targets (N,)) -> row max (N,), row sum of exp(z - max) (N,), losses (N,) float64
    xent_backward(logits, targets, row_max, row_sum, n_total): logits := dlogits, in place
    attention_softmax(scores (R, Tq, keys), q_offset, causal): scores := weights, in place
    softmax_backward(dw (R, Tq, keys), w, row_dot (R, Tq)): dw := w * (dw - row_dot), in place
    embedding_backward(dout (N, C), ids (N,), dweight (V, C)): dweight[ids[i]] += dout[i], in place
    adamw(p, g, m, v, beta1, beta2, scale, eps, decay): in place, as ops.adamw_update

What this module deliberately does not do: define kernels (cuda.py, cuda_twins.py), import
CuPy, or know which device it runs on.
"""

from __future__ import annotations

import math

import numpy as np

from tokenkit.transformer import ops as cpu_ops

LN_EPS = cpu_ops.LN_EPS


class DeviceOps:
    """transformer/ops.py's op functions over array module `xp` and fused `kernels` (see the
    module docstring). Each method's contract (shapes, cache) is the CPU op's of the same name;
    the caches differ inside, and belong to the ops that made them."""

    LN_EPS = LN_EPS

    def __init__(self, xp, kernels):
        self.xp = xp
        self.kernels = kernels

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
        column sums for the parameters."""
        xhat, rstd, weight, has_bias = cache
        d2 = self.xp.ascontiguousarray(dout.reshape(xhat.shape))
        dx = self.kernels.layernorm_backward(d2, xhat, rstd, weight)
        dweight = self.kernels.column_sums(d2, xhat)
        dbias = self.kernels.column_sums(d2, None) if has_bias else None
        return dx.reshape(dout.shape), dweight, dbias

    # ------------------------------------------------------------------------- linear

    def linear_forward(self, x, weight, bias):
        """x (..., Cin), weight (Cin, Cout), bias (Cout,) -> (..., Cout): one GEMM."""
        out = x.reshape(-1, x.shape[-1]) @ weight
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], weight.shape[1]), (x, weight, bias is not None)

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

    # ------------------------------------------------------------------------- attention

    def _heads(self, qkv, n_heads: int):
        """qkv (B, T, 3C) -> q, k, v views (B, H, T, hd)."""
        B, T, C3 = qkv.shape
        parts = qkv.reshape(B, T, 3, n_heads, C3 // (3 * n_heads)).transpose(2, 0, 3, 1, 4)
        return parts[0], parts[1], parts[2]

    def _merge_heads(self, y):
        """(B, H, T, hd) -> (B, T, H * hd), contiguous."""
        B, H, T, hd = y.shape
        return self.xp.ascontiguousarray(y.transpose(0, 2, 1, 3)).reshape(B, T, H * hd)

    def attention_forward(self, qkv, n_heads: int, causal: bool, trace: dict | None = None):
        """qkv (B, T, 3C) -> out (B, T, C) = softmax(q k^T / sqrt(hd) + mask) v.

        Two batched GEMMs around one softmax kernel that masks in place; k and v are made
        contiguous once, since a batched GEMM needs one stride per batch. `trace` records what
        the CPU op records.
        """
        xp = self.xp
        hd = qkv.shape[2] // (3 * n_heads)
        scale = 1.0 / math.sqrt(hd)
        q, k, v = self._heads(qkv, n_heads)
        qs = q * scale  # (B, H, T, hd), contiguous
        k, v = xp.ascontiguousarray(k), xp.ascontiguousarray(v)
        w = qs @ k.swapaxes(-1, -2)  # (B, H, T, T) scores, then weights in place
        if trace is not None:
            trace["scores"] = self._masked(w.copy(), causal)  # before the kernel overwrites w
        self.kernels.attention_softmax(w, 0, causal)
        out = self._merge_heads(w @ v)  # (B, T, C)
        if trace is not None:
            trace["weights"] = w.copy()
            trace["q"], trace["k"], trace["v"] = q.copy(), k.copy(), v.copy()
            trace["scores_raw"] = q @ k.swapaxes(-1, -2)
            trace["mix"] = w @ v
        return out, (qs, k, v, w, out, scale)

    def _masked(self, scores, causal: bool):
        """(..., T, T) scores with -inf above the diagonal when causal (the trace's form)."""
        if not causal:
            return scores
        T = scores.shape[-1]
        above = self.xp.triu(self.xp.ones((T, T), dtype=bool), k=1)
        return self.xp.where(above, scores.dtype.type(-np.inf), scores)

    def attention_backward(self, dout, cache):
        """dout (B, T, C) -> dqkv (B, T, 3C). ds = w * (dw - dmix . mix) per row, as the CPU's
        (a (T, hd) row dot instead of a (T, T) one); masked weights are 0, so masked scores get
        no gradient."""
        xp = self.xp
        qs, k, v, w, out, scale = cache
        B, H, T, hd = qs.shape
        dmix = xp.ascontiguousarray(dout.reshape(B, T, H, hd).transpose(0, 2, 1, 3))  # (B, H, T, hd)
        row_dot = xp.ascontiguousarray((dout * out).reshape(B, T, H, hd).sum(axis=-1).transpose(0, 2, 1))  # (B, H, T)
        ds = dmix @ v.swapaxes(-1, -2)  # (B, H, T, T) d weights, then d scaled scores in place
        self.kernels.softmax_backward(ds, w, row_dot)
        dq = ds @ k
        dq *= scale
        dqkv = xp.empty((B, T, 3, H, hd), dtype=dout.dtype)
        dqkv[:, :, 0] = dq.transpose(0, 2, 1, 3)
        dqkv[:, :, 1] = (ds.swapaxes(-1, -2) @ qs).transpose(0, 2, 1, 3)
        dqkv[:, :, 2] = (w.swapaxes(-1, -2) @ dmix).transpose(0, 2, 1, 3)
        return dqkv.reshape(B, T, 3 * H * hd)

    def attention_forward_cached(self, qkv, k_cache, v_cache, start: int, n_heads: int):
        """Incremental causal attention for generation: qkv (B, n, 3C) of positions
        start..start+n-1; their k, v go into k_cache, v_cache (B, H, T_max, hd). -> out (B, n, C)."""
        hd = qkv.shape[2] // (3 * n_heads)
        q, k, v = self._heads(qkv, n_heads)
        end = start + k.shape[2]
        k_cache[:, :, start:end] = k
        v_cache[:, :, start:end] = v
        w = (q * (1.0 / math.sqrt(hd))) @ k_cache[:, :, :end].swapaxes(-1, -2)  # (B, H, n, end)
        self.kernels.attention_softmax(w, start, True)
        return self._merge_heads(w @ v_cache[:, :, :end]), None

    # ------------------------------------------------------------------------- activations

    def gelu_forward(self, x, grad: bool = True):
        """x (...) -> GPT-2's tanh GELU, one kernel; with `grad` the cache is gelu'(x) (as on the CPU)."""
        return self.kernels.gelu(self.xp.ascontiguousarray(x), grad)

    def gelu_backward(self, dout, cache):
        """dout (...) -> dout * gelu'(x)."""
        return dout * cache

    def relu_forward(self, x, grad: bool = True):
        """x (...) -> max(x, 0); the cache is the output."""
        out = self.xp.maximum(x, 0)
        return out, out

    def relu_backward(self, dout, cache):
        """dout (...) -> dout where the input was positive, else 0."""
        return self.xp.where(cache > 0, dout, 0).astype(dout.dtype, copy=False)

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
