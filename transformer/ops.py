"""The layers of a GPT as forward/backward pairs with explicit caches (llm.c's layout).

Each `*_forward` returns `(out, cache)` and its `*_backward(dout, cache)` sits right below it,
readable against it line by line. Ops compute in the dtype they are given (float32 to train,
float64 for finite-difference checks) and never loop in Python over batch, heads or time.

Speed comes from few passes over memory rather than from clever math: 2-D GEMMs on (B*T, C)
views, row sums as GEMVs, `out=` and in-place ufuncs. The elementwise passes of LayerNorm,
RMSNorm and the cross-entropy run over a few L2-sized blocks of rows (`tiling.row_blocks`), so
that the passes after the first hit cache. `softmax_xent_forward` exponentiates the logits in
place and `softmax_xent_backward` turns those into dlogits in place, so the biggest array of the
model is allocated once and its cache is good for one backward.

Two ideas have modules of their own, whose ops this module hands on under the same names, so
that `ops` is the CPU's whole op set: attention.py (grouped K/V heads, causal query tiles, the KV
cache's step) and activations.py (GELU, ReLU, SiLU, SwiGLU). Here are the rest: embeddings,
positions (learned, fixed, and rotary for Llama's family), LayerNorm and RMSNorm, the linear
layers, the residual, the fused pieces of GPT-2's block, the loss and the AdamW step.

Each fast op names its plain, obviously correct twin in `transformer/reference.py`, forward and
backward, which the tests compare it with.

These are the CPU backend's ops (transformer/backends/cpu.py); the GPU's have the same names
and signatures (transformer/backends/device_ops.py over CUDA kernels).

What this module does not do: parameters, initialisation, sampling, I/O (see model.py, io.py).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from tokenkit.transformer.activations import (  # noqa: F401 -- handed on: ops is the CPU's whole op set
    gelu_backward,
    gelu_forward,
    relu_backward,
    relu_forward,
    silu_backward,
    silu_forward,
    swiglu_backward,
    swiglu_forward,
)
from tokenkit.transformer.attention import (  # noqa: F401 -- handed on, as the activations
    EXP_SAFE,
    attention_backward,
    attention_forward,
    attention_forward_cached,
    causal_mask,
    kv_heads,
)
from tokenkit.transformer.tiling import row_blocks

LN_EPS = 1e-5  # GPT-2's LayerNorm epsilon


# ----------------------------------------------------------------------------- embedding


def embedding_forward(ids: np.ndarray, weight: np.ndarray):
    """ids (B, T) int, weight (V, C) -> out (B, T, C): row ids[b, t] of weight.

    Plain twin: `transformer.reference.embedding`.
    """
    return weight.take(ids, axis=0), (ids, weight.shape)


def embedding_backward(dout: np.ndarray, cache, dweight: np.ndarray | None = None) -> np.ndarray:
    """dout (B, T, C) -> dweight (V, C); adds into `dweight` when given (the tied unembedding's
    gradient is already there). Repeated ids accumulate, hence `add.at` rather than `+=`; it
    runs on flat element indices (id * C + column), where NumPy's add.at has a fast 1-D path
    (3-4x faster than adding whole rows; the same additions in the same order).
    Plain twin: `transformer.reference.embedding_backward`."""
    ids, shape = cache
    if dweight is None:
        dweight = np.zeros(shape, dtype=dout.dtype)
    assert dweight.flags.c_contiguous, "dweight must be C-contiguous: it is updated through a flat view"
    C = shape[1]
    flat = (ids.reshape(-1, 1) * C + np.arange(C)).reshape(-1)
    np.add.at(dweight.reshape(-1), flat, dout.reshape(-1))
    return dweight


# ----------------------------------------------------------------------------- positions


@lru_cache(maxsize=16)
def _sinusoidal_table64(n_positions: int, d_model: int) -> np.ndarray:
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    angle = pos / 10000.0 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # (T, ceil(C/2))
    table = np.empty((n_positions, d_model))
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : d_model // 2])
    table.flags.writeable = False
    return table


def sinusoidal_table(n_positions: int, d_model: int, dtype=np.float32) -> np.ndarray:
    """(T, C) fixed encodings of "Attention is all you need" (seed 001):
    PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(p / 10000^(2i/C)).
    Plain twin: `transformer.reference.sinusoidal_table`.

    >>> sinusoidal_table(2, 4, np.float64)[1].round(3).tolist()
    [0.841, 0.54, 0.01, 1.0]
    """
    return _sinusoidal_table64(n_positions, d_model).astype(dtype)


def positional_forward(table: np.ndarray, T: int):
    """table (n_positions, C) -> pos_emb (T, C), the rows for positions 0..T-1 (learned or fixed).
    Plain twin: `transformer.reference.positional`."""
    return table[:T], (table.shape, T)


def positional_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (B, T, C) -> dtable (n_positions, C); rows past T get no gradient.
    Plain twin: `transformer.reference.positional_backward`."""
    shape, T = cache
    dtable = np.zeros(shape, dtype=dout.dtype)
    dout.sum(axis=0, out=dtable[:T])
    return dtable


# ----------------------------------------------------------------------------- rotary positions


def rope_inv_freq(head_dim: int, theta: float, scaling=None) -> np.ndarray:
    """(head_dim / 2,) float64 inverse frequencies of the rotary angles: theta^(-2i / head_dim),
    stretched by `scaling` (a config.RopeScaling; None: not at all), as transformers'
    `ROPE_INIT_FUNCTIONS` compute them: "linear" divides every one by the factor; "llama3"
    divides those whose wavelength 2 pi / inv_freq exceeds original_context_length /
    low_freq_factor, keeps those below original_context_length / high_freq_factor, and blends
    the ones between, s * inv_freq + (1 - s) * inv_freq / factor with s rising from 0 to 1 across them.
    Plain twin: `transformer.reference.rope_inv_freq`.

    >>> from tokenkit.transformer.config import RopeScaling
    >>> rope_inv_freq(4, 100.0).tolist(), rope_inv_freq(4, 100.0, RopeScaling("linear", 2.0)).tolist()
    ([1.0, 0.1], [0.5, 0.05])
    """
    inv_freq = theta ** -(np.arange(head_dim // 2, dtype=np.float64) * 2.0 / head_dim)
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    old, low, high = scaling.original_context_length, scaling.low_freq_factor, scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (old / wavelen - low) / (high - low)  # 0 at the long end of the blended band, 1 at its short end
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    long = np.where(wavelen > old / low, inv_freq / scaling.factor, blended)
    return np.where(wavelen < old / high, inv_freq, long)


@lru_cache(maxsize=16)
def _rope_table(n_positions: int, head_dim: int, theta: float, dtype_name: str, scaling) -> tuple[np.ndarray, ...]:
    angle = np.arange(n_positions, dtype=np.float64)[:, None] * rope_inv_freq(head_dim, theta, scaling)  # (T, hd/2)
    cos, sin = np.cos(angle).astype(dtype_name), np.sin(angle).astype(dtype_name)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def rope_table(
    n_positions: int, head_dim: int, theta: float, dtype=np.float32, *, scaling=None
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (n_positions, head_dim / 2) of the rotary angles p * inv_freq_i (`rope_inv_freq`:
    theta^(-2i / head_dim), stretched by `scaling` when given), computed in float64 and cached
    per (length, head_dim, theta, dtype, scaling); the length is rounded up to a power of two,
    so that generation, one position longer each step, reuses one table.
    Plain twin: `transformer.reference.rope` computes its angles inline.

    >>> cos, sin = rope_table(2, 4, 10000.0, np.float64)
    >>> cos.shape, sin[1].round(3).tolist()
    ((2, 2), [0.841, 0.01])
    """
    size = 1 << max(0, n_positions - 1).bit_length()
    cos, sin = _rope_table(size, head_dim, float(theta), np.dtype(dtype).name, scaling)
    return cos[:n_positions], sin[:n_positions]


def _rotate_halves(x: np.ndarray, out: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """out = x rotated by the angles of cos and sin (T, hd/2), x and out (B, T, heads, hd), in
    HF's `rotate_half` layout: dimension i pairs with i + hd/2 (not with its neighbour), so
    out1 = x1 cos - x2 sin and out2 = x2 cos + x1 sin for the halves x1, x2 of each head. A
    negative sin rotates back."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    o1, o2 = out[..., :half], out[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, hd/2): every head of a position alike
    np.multiply(x1, c, out=o1)
    o1 -= x2 * s
    np.multiply(x2, c, out=o2)
    o2 += x1 * s


def rope_forward(qkv: np.ndarray, n_heads: int, n_kv_heads: int | None, theta: float, start: int = 0, *, scaling=None):
    """qkv (B, T, (H + 2 Hkv) hd) fused projections of positions start..start+T-1 -> the same
    with every q and k head rotated by its position (RoPE, Su et al. 2021; HF Llama's
    convention), v unchanged: a new array. After it, q_t . k_s depends on t - s only.
    `scaling` (a config.RopeScaling, or None) stretches the frequencies (`rope_inv_freq`).

    The rotation pairs dimension i of a head with i + hd/2 (`_rotate_halves`), as HF's
    `rotate_half` does, so a Llama checkpoint's q and k projections work unpermuted. The cache
    is the cos and sin of the positions: the backward rotates back.
    Plain twin: `transformer.reference.rope`.
    """
    B, T, W = qkv.shape
    Hkv = kv_heads(n_heads, n_kv_heads)
    hd = W // (n_heads + 2 * Hkv)
    cos, sin = rope_table(start + T, hd, theta, qkv.dtype, scaling=scaling)
    cos, sin = cos[start:], sin[start:]
    x = qkv.reshape(B, T, n_heads + 2 * Hkv, hd)
    out = np.empty_like(x)
    rotated = n_heads + Hkv  # the q and k heads
    _rotate_halves(x[:, :, :rotated], out[:, :, :rotated], cos, sin)
    out[:, :, rotated:] = x[:, :, rotated:]
    return out.reshape(qkv.shape), (cos, sin, rotated)


def rope_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (B, T, (H + 2 Hkv) hd) -> dqkv: a rotation's transpose is the rotation back (by
    -angle), so the q and k heads' gradients are rotated back and v's passes through.
    Plain twin: `transformer.reference.rope_backward`."""
    cos, sin, rotated = cache
    B, T, W = dout.shape
    hd = 2 * cos.shape[-1]
    d = dout.reshape(B, T, W // hd, hd)
    dx = np.empty_like(d)
    _rotate_halves(d[:, :, :rotated], dx[:, :, :rotated], cos, -sin)
    dx[:, :, rotated:] = d[:, :, rotated:]
    return dx.reshape(dout.shape)


# ----------------------------------------------------------------------------- layernorm


def layernorm_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float = LN_EPS):
    """x (..., C) -> out (..., C) = (x - mean) / sqrt(var + eps) * weight + bias, per row.

    The cache keeps the normalised xhat (not x) and 1/std: all the backward needs. Row means
    are GEMVs against a (C,) vector of 1/C: one BLAS read instead of a NumPy reduction. The
    passes run over L2-sized row blocks (`tiling.row_blocks`), as GELU's do.
    Plain twin: `transformer.reference.layernorm`.
    """
    xhat, rstd, out = _norm_forward(x, weight, bias, eps, centred=True)
    return out, (xhat, rstd, weight, bias is not None)


def _norm_forward(x, weight, bias, eps: float, centred: bool):
    """-> xhat (N, C), rstd (N, 1), out (..., C): LayerNorm (centred) or RMSNorm (not), over
    L2-sized row blocks."""
    C = x.shape[-1]
    x2 = x.reshape(-1, C)
    N = x2.shape[0]
    inv_c = np.full(C, 1.0 / C, dtype=x.dtype)
    xhat = np.empty_like(x2)
    out = np.empty_like(x2)
    rstd = np.empty(N, dtype=x.dtype)
    rows = row_blocks(N, C)
    for lo in rows:
        xb, xh, r = x2[lo : lo + rows.step], xhat[lo : lo + rows.step], rstd[lo : lo + rows.step]
        if centred:
            np.subtract(xb, (xb @ inv_c)[:, None], out=xh)
        src = xh if centred else xb
        np.vecdot(src, src, out=r)  # per-row sums of squares: one read, no squared temporary
        r *= 1.0 / C  # the variance, or the mean square
        r += eps
        np.sqrt(r, out=r)
        np.divide(1.0, r, out=r)
        np.multiply(src, r[:, None], out=xh)
        ob = out[lo : lo + rows.step]
        np.multiply(xh, weight, out=ob)
        if bias is not None:
            ob += bias
    return xhat, rstd[:, None], out.reshape(x.shape)


def layernorm_backward(dout: np.ndarray, cache):
    """dout (..., C) -> dx (..., C), dweight (C,), dbias (C,) or None.

    With g = dout * weight: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), means per row.
    Both means are GEMVs against weight / C, since mean(g) = dout @ weight / C and
    mean(g * xhat) = (dout * xhat) @ weight / C; dout * xhat also gives dweight. Column sums
    (dweight, dbias) are GEMVs against ones, added up over the row blocks.
    Plain twin: `transformer.reference.layernorm_backward`.
    """
    xhat, rstd, weight, has_bias = cache
    return _norm_backward(dout, xhat, rstd, weight, has_bias, centred=True)


def _norm_backward(dout, xhat, rstd, weight, has_bias: bool, centred: bool):
    """LayerNorm's backward (centred) or RMSNorm's (not: no mean(g) term), over L2-sized row blocks."""
    C = xhat.shape[-1]
    d2 = dout.reshape(-1, C)
    N = d2.shape[0]
    dx = np.empty_like(d2)
    dweight = np.zeros(C, dtype=d2.dtype)
    dbias = np.zeros(C, dtype=d2.dtype) if has_bias else None
    w_over_c = weight / C
    # a quarter of the forward's block: the backward's four (rows, C) streams (dout, xhat, dx,
    # scratch) then fit L2 together
    rows = row_blocks(N, C, share=4)
    scratch = np.empty((min(rows.step, N), C), dtype=d2.dtype)
    ones = np.ones(scratch.shape[0], dtype=d2.dtype)
    for lo in rows:
        d, xh, g = d2[lo : lo + rows.step], xhat[lo : lo + rows.step], dx[lo : lo + rows.step]
        t, o = scratch[: d.shape[0]], ones[: d.shape[0]]
        np.multiply(d, xh, out=t)  # dout * xhat
        dweight += o @ t
        if has_bias:
            dbias += o @ d
        mean_g = d @ w_over_c if centred else None
        mean_gx = t @ w_over_c
        np.multiply(d, weight, out=g)
        if centred:
            g -= mean_g[:, None]
        np.multiply(xh, mean_gx[:, None], out=t)
        g -= t
        g *= rstd[lo : lo + rows.step]
    return dx.reshape(dout.shape), dweight, dbias


def rmsnorm_forward(x: np.ndarray, weight: np.ndarray, eps: float = LN_EPS):
    """x (..., C) -> out (..., C) = x / sqrt(mean(x^2) + eps) * weight, per row (RMSNorm, Zhang &
    Sennrich 2019: LayerNorm without the centring and without a bias, as Llama uses it).

    The cache keeps xhat = x / rms and 1/rms, as LayerNorm's does; the passes run over the
    same L2-sized row blocks.
    Plain twin: `transformer.reference.rmsnorm`.
    """
    xhat, rstd, out = _norm_forward(x, weight, None, eps, centred=False)
    return out, (xhat, rstd, weight)


def rmsnorm_backward(dout: np.ndarray, cache):
    """dout (..., C) -> dx (..., C), dweight (C,).

    With g = dout * weight: dx = rstd * (g - xhat * mean(g * xhat)), LayerNorm's formula less
    its mean(g) term (nothing was centred); mean(g * xhat) = (dout * xhat) @ weight / C is a
    GEMV, and dout * xhat also gives dweight's column sums.
    Plain twin: `transformer.reference.rmsnorm_backward`.
    """
    xhat, rstd, weight = cache
    dx, dweight, _ = _norm_backward(dout, xhat, rstd, weight, has_bias=False, centred=False)
    return dx, dweight


# ----------------------------------------------------------------------------- linear


def linear_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None):
    """x (..., Cin), weight (Cin, Cout) (GPT-2's Conv1D layout), bias (Cout,) -> (..., Cout).

    One 2-D GEMM on the (B*T, Cin) view of x.
    Plain twin: `transformer.reference.linear`.
    """
    out = x.reshape(-1, x.shape[-1]) @ weight
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[1]), (x, weight, bias is not None)


def unembed(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x (R, C) final-normed rows, weight (V, C) (the tied wte or lm_head) -> logits (R, V) = x weight^T,
    for the last positions of generation. One row is a GEMV (weight @ x), as batch-1 decoding has
    always computed it. Inference only (training's logits go through its loss buffer)."""
    if x.shape[0] == 1:
        return (weight @ x[0])[None]
    return x @ weight.T


def linear_backward(dout: np.ndarray, cache):
    """dout (..., Cout) -> dx (..., Cin), dweight (Cin, Cout), dbias (Cout,) or None.
    Plain twin: `transformer.reference.linear_backward`."""
    x, weight, has_bias = cache
    d2 = dout.reshape(-1, dout.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    dx = (d2 @ weight.T).reshape(x.shape)
    dweight = x2.T @ d2
    return dx, dweight, _column_sums(d2) if has_bias else None


def _column_sums(d2: np.ndarray) -> np.ndarray:
    """(N, C) -> (C,): a bias's gradient, the column sums as a GEMV against ones (2-3x d2.sum(0))."""
    return np.ones(d2.shape[0], dtype=d2.dtype) @ d2


# ----------------------------------------------------------------------------- residual


def residual_forward(x: np.ndarray, branch: np.ndarray, *, inplace: bool = False):
    """x (B, T, C) skip path, branch (B, T, C) -> x + branch. With inplace the sum is written
    over x, which is allowed when no cache holds x (pre-norm's residual stream).
    Plain twin: `transformer.reference.residual`."""
    if inplace:
        x += branch
        return x, None
    return x + branch, None


def residual_backward(dout: np.ndarray, cache) -> tuple[np.ndarray, np.ndarray]:
    """dout (B, T, C) -> (d skip, d branch): a sum hands its gradient to both terms unchanged
    (the same array twice; the caller adds the branch's input gradient to it once the branch's
    backward has read it).
    Plain twin: `transformer.reference.residual_backward`."""
    return dout, dout


# ----------------------------------------------------------------------------- fused pieces of GPT-2's block
# Each is today's ops one after the other, in the same order, so the CPU's numbers are the same bits
# whichever the model calls; on a GPU (backends/device_ops.py) each is fewer passes over memory.


def bias_residual_forward(x: np.ndarray, branch: np.ndarray, bias: np.ndarray | None):
    """x (B, T, C) += branch (B, T, C) + bias (C,) or None, written over x: a projection whose
    GEMM left its bias out (linear_forward with bias None) joining the residual stream. `branch`
    is consumed (the bias is added into it). -> x, cache.
    Plain twin: `transformer.reference.bias_residual`."""
    if bias is not None:
        branch += bias
    x, _ = residual_forward(x, branch, inplace=True)
    return x, bias is not None


def bias_residual_backward(dout: np.ndarray, cache):
    """dout (B, T, C) -> (d skip, d branch, d bias (C,) or None): the residual's gradient twice,
    as residual_backward, and the bias's, the column sums of dout (as linear_backward's).
    Plain twin: `transformer.reference.bias_residual_backward`."""
    has_bias = cache
    return dout, dout, _column_sums(dout.reshape(-1, dout.shape[-1])) if has_bias else None


def residual_layernorm_forward(
    x: np.ndarray,
    branch: np.ndarray,
    branch_bias: np.ndarray | None,
    weight: np.ndarray,
    bias: np.ndarray | None,
    eps: float = LN_EPS,
):
    """x += branch + branch_bias (bias_residual_forward, written over x), then
    layernorm_forward of the new x: a pre-norm block's residual and the next LayerNorm.
    -> out (B, T, C), cache.
    Plain twin: `transformer.reference.residual_layernorm`."""
    x, has_branch_bias = bias_residual_forward(x, branch, branch_bias)
    out, ln_cache = layernorm_forward(x, weight, bias, eps)
    return out, (ln_cache, has_branch_bias)


def residual_layernorm_backward(dskip: np.ndarray, dout: np.ndarray, cache):
    """dskip (B, T, C): the gradient reaching the new x through the skip; dout: the LayerNorm
    output's. -> (dx, dweight, dbias, d branch_bias): dx = dskip + the LayerNorm's input gradient
    (written over dskip; it is also the branch's gradient), the LayerNorm's parameters' and the
    branch bias's gradients (None where absent).
    Plain twin: `transformer.reference.residual_layernorm_backward`."""
    ln_cache, has_branch_bias = cache
    dx, dweight, dbias = layernorm_add_backward(dskip, dout, ln_cache)
    return dx, dweight, dbias, _column_sums(dx.reshape(-1, dx.shape[-1])) if has_branch_bias else None


def layernorm_add_backward(dskip: np.ndarray, dout: np.ndarray, cache):
    """layernorm_backward of an x that also feeds a skip: dskip (B, T, C) += the LayerNorm's input
    gradient (written over dskip). -> dskip, dweight, dbias or None.
    Plain twin: `transformer.reference.layernorm_add_backward`."""
    dx, dweight, dbias = layernorm_backward(dout, cache)
    dskip += dx
    return dskip, dweight, dbias


def linear_gelu_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, grad: bool = True, trace=None):
    """x (..., Cin) -> gelu(x @ weight + bias) (..., Cout): linear_forward, then gelu_forward (an
    MLP's first projection and its GELU). `trace` (a dict), when given, gets the pre-activation
    (bias included) under "pre". -> out, cache.
    Plain twin: `transformer.reference.linear_gelu`."""
    pre, linear_cache = linear_forward(x, weight, bias)
    if trace is not None:
        trace["pre"] = pre
    out, gelu_cache = gelu_forward(pre, grad)
    return out, (linear_cache, gelu_cache)


def linear_gelu_backward(dout: np.ndarray, cache):
    """dout (..., Cout) -> dx (..., Cin), dweight, dbias or None: gelu_backward, then linear_backward.
    Plain twin: `transformer.reference.linear_gelu_backward`."""
    linear_cache, gelu_cache = cache
    return linear_backward(gelu_backward(dout, gelu_cache), linear_cache)


# ----------------------------------------------------------------------------- loss


_LOW_TARGET = -40.0  # a row whose target logit is above this has a max above it: its sum of exps is >= e^-40


def softmax_xent_forward(logits: np.ndarray, targets: np.ndarray):
    """logits (N, V), targets (N,) int -> mean cross-entropy -log softmax(logits)[target].

    Overwrites `logits` with their exponentials exp(z - shift), and keeps the row sums: with
    them that is all the backward needs, so the biggest array of the model is allocated once.
    The loss is log(sum) - (z_target - shift), summed in float64. The division by the row sums is
    left to the backward, where it joins the 1/N of the mean in one pass (an eval-only loss never
    pays for it).

    The rows are handled in L2-sized blocks (`tiling.row_blocks`: a few dozen rows of a large
    vocabulary) that go through the gather, the exponential and the row sums while they are in
    cache: three passes over the (N, V) array from memory become one.
    Like the attention softmax, a block skips the row max (shift 0) when exp cannot overflow
    (max < 60) and no row can underflow (every target logit, hence every row max, above -40);
    otherwise its rows are shifted by their max.
    Plain twins: `transformer.reference.softmax_xent` and `softmax_xent_grad`.
    """
    N, V = logits.shape
    rows = row_blocks(N, V)
    total = np.empty(N, dtype=logits.dtype)
    picked = np.empty(N, dtype=np.float64)  # z_target - shift
    ones = np.ones(V, dtype=logits.dtype)
    for lo in rows:
        z = logits[lo : lo + rows.step]
        zt = z[np.arange(z.shape[0]), targets[lo : lo + rows.step]]
        if not (z.max() < EXP_SAFE and zt.min() > _LOW_TARGET):  # NaN takes this branch too
            m = z.max(axis=-1, keepdims=True)
            z -= m
            zt -= m[:, 0]
        picked[lo : lo + rows.step] = zt
        np.exp(z, out=z)
        np.matmul(z, ones, out=total[lo : lo + rows.step])  # row sums as a GEMV
    loss = float(np.mean(np.log(total.astype(np.float64)) - picked))
    return loss, (logits, total, targets)


def softmax_xent_backward(cache, n_total: int | None = None) -> np.ndarray:
    """-> dlogits (N, V) = (y_hat - y) / N (seed 002's dL/dz for the mean loss), written over
    the cached exponentials: y_hat / N = exp / (row sum * N). When these N rows are a shard of
    a bigger batch whose mean is the loss, n_total is that batch's row count.
    Plain twin: `transformer.reference.softmax_xent_grad`."""
    exps, total, targets = cache
    n = n_total or exps.shape[0]
    exps *= (1.0 / (total * n))[:, None]
    exps[np.arange(exps.shape[0]), targets] -= 1.0 / n
    return exps


# ----------------------------------------------------------------------------- optimizer


def adamw_update(
    p: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    beta1: float,
    beta2: float,
    scale: float,
    eps: float,
    decay: float,
    scratch: np.ndarray | None = None,
) -> None:
    """One AdamW step in place on flat arrays p, g, m, v (n,), with the constants that
    `transformer.optim.AdamW.step` folds (M, V are its running sums):

        p *= decay (skipped when decay is 1);  M = beta1 M + g;  V = beta2 V + g^2;
        p -= scale * M / (sqrt(V) + eps)

    Ten in-place passes and no temporary but `scratch` (n,), so that threads updating disjoint
    ranges (AdamW's plan) each need one preallocated buffer; every element's arithmetic is the
    same whatever the ranges.
    """
    tmp = np.empty_like(p) if scratch is None else scratch
    if decay != 1.0:
        p *= decay  # decoupled decay, before the Adam step (as PyTorch)
    m *= beta1
    m += g  # M = beta1 M + g
    np.multiply(g, g, out=tmp)
    v *= beta2
    v += tmp  # V = beta2 V + g^2
    np.sqrt(v, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= scale
    p -= tmp  # p -= s M / (sqrt(V) + e)
