"""The layers of a GPT as forward/backward pairs with explicit caches (llm.c's layout).

Each `*_forward` returns `(out, cache)` and its `*_backward(dout, cache)` sits right below it,
readable against it line by line. Ops compute in the dtype they are given (float32 to train,
float64 for finite-difference checks) and never loop in Python over batch, heads or time.

Speed comes from few passes over memory rather than from clever math: 2-D GEMMs on (B*T, C)
views, batched matmuls on (B, H, T, hd) views of the fused qkv tensor (no transposed copies),
row sums as GEMVs, `out=` and in-place ufuncs. The elementwise passes of LayerNorm, GELU and
the cross-entropy, and causal attention's query tiles, run over a few L2-sized blocks of rows
so that the passes after the first hit cache; those short loops cut the work for locality and
are not loops over batch, heads or time. `softmax_xent_forward` exponentiates the
logits in place and `softmax_xent_backward` turns those into dlogits in place, so the biggest
array of the model is allocated once and its cache is good for one backward.

Each fast op names its plain, obviously correct twin in `transformer/reference.py`, which the
tests compare it with.

Beside GPT-2's layers sit today's decoders' (Llama's family): rotary positions applied to q and
k (`rope_*`), RMSNorm, SiLU and SwiGLU's gated product, and grouped-query attention (the
attention ops take `n_kv_heads`: K/V heads shared by groups of query heads).

These are the CPU backend's ops (transformer/backends/cpu.py); the GPU's have the same names
and signatures (transformer/backends/device_ops.py over CUDA kernels).

What this module does not do: parameters, initialisation, sampling, I/O (see model.py, io.py).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

LN_EPS = 1e-5  # GPT-2's LayerNorm epsilon
_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


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
    (3-4x faster than adding whole rows; the same additions in the same order)."""
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
    """table (n_positions, C) -> pos_emb (T, C), the rows for positions 0..T-1 (learned or fixed)."""
    return table[:T], (table.shape, T)


def positional_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (B, T, C) -> dtable (n_positions, C); rows past T get no gradient."""
    shape, T = cache
    dtable = np.zeros(shape, dtype=dout.dtype)
    dout.sum(axis=0, out=dtable[:T])
    return dtable


# ----------------------------------------------------------------------------- rotary positions


def kv_heads(n_heads: int, n_kv_heads: int | None) -> int:
    """The number of K/V heads: n_kv_heads, or n_heads when None (ordinary attention)."""
    return n_heads if n_kv_heads is None else n_kv_heads


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
    -angle), so the q and k heads' gradients are rotated back and v's passes through."""
    cos, sin, rotated = cache
    B, T, W = dout.shape
    hd = 2 * cos.shape[-1]
    d = dout.reshape(B, T, W // hd, hd)
    dx = np.empty_like(d)
    _rotate_halves(d[:, :, :rotated], dx[:, :, :rotated], cos, -sin)
    dx[:, :, rotated:] = d[:, :, rotated:]
    return dx.reshape(dout.shape)


# ----------------------------------------------------------------------------- layernorm


_ROW_BLOCK = 1 << 18  # elements per row block of the LayerNorm and GELU passes: 1 MB of float32,
# so a block's passes mostly hit L2; smaller blocks only cost more NumPy calls


def _row_blocks(n_rows: int, row_len: int, block_elems: int) -> range:
    """Starts of the row blocks, each of about block_elems elements (at least one row).
    A bounded loop for cache locality, not a loop over time: each block holds many rows of
    the (B*T, n) array, and every call inside is one NumPy pass over the whole block."""
    return range(0, n_rows, max(1, block_elems // max(row_len, 1)))


def layernorm_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float = LN_EPS):
    """x (..., C) -> out (..., C) = (x - mean) / sqrt(var + eps) * weight + bias, per row.

    The cache keeps the normalised xhat (not x) and 1/std: all the backward needs. Row means
    are GEMVs against a (C,) vector of 1/C: one BLAS read instead of a NumPy reduction. The
    passes run over L2-sized row blocks (`_row_blocks`), as GELU's do.
    Plain twin: `transformer.reference.layernorm`.
    """
    C = x.shape[-1]
    x2 = x.reshape(-1, C)
    N = x2.shape[0]
    inv_c = np.full(C, 1.0 / C, dtype=x.dtype)
    xhat = np.empty_like(x2)
    out = np.empty_like(x2)
    rstd = np.empty(N, dtype=x.dtype)
    rows = _row_blocks(N, C, _ROW_BLOCK)
    for lo in rows:
        xb, xh, r = x2[lo : lo + rows.step], xhat[lo : lo + rows.step], rstd[lo : lo + rows.step]
        np.subtract(xb, (xb @ inv_c)[:, None], out=xh)  # centred
        np.vecdot(xh, xh, out=r)  # per-row sums of squares: one read, no squared temporary
        r *= 1.0 / C  # variance
        r += eps
        np.sqrt(r, out=r)
        np.divide(1.0, r, out=r)
        xh *= r[:, None]
        ob = out[lo : lo + rows.step]
        np.multiply(xh, weight, out=ob)
        if bias is not None:
            ob += bias
    return out.reshape(x.shape), (xhat, rstd[:, None], weight, bias is not None)


def layernorm_backward(dout: np.ndarray, cache):
    """dout (..., C) -> dx (..., C), dweight (C,), dbias (C,) or None.

    With g = dout * weight: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), means per row.
    Both means are GEMVs against weight / C, since mean(g) = dout @ weight / C and
    mean(g * xhat) = (dout * xhat) @ weight / C; dout * xhat also gives dweight. Column sums
    (dweight, dbias) are GEMVs against ones, added up over the row blocks.
    """
    xhat, rstd, weight, has_bias = cache
    C = xhat.shape[-1]
    d2 = dout.reshape(-1, C)
    N = d2.shape[0]
    dx = np.empty_like(d2)
    dweight = np.zeros(C, dtype=d2.dtype)
    dbias = np.zeros(C, dtype=d2.dtype) if has_bias else None
    w_over_c = weight / C
    # a quarter of the forward's block: the backward's four (rows, C) streams (dout, xhat, dx,
    # scratch) then fit L2 together
    rows = _row_blocks(N, C, _ROW_BLOCK // 4)
    scratch = np.empty((min(rows.step, N), C), dtype=d2.dtype)
    ones = np.ones(scratch.shape[0], dtype=d2.dtype)
    for lo in rows:
        d, xh, g = d2[lo : lo + rows.step], xhat[lo : lo + rows.step], dx[lo : lo + rows.step]
        t, o = scratch[: d.shape[0]], ones[: d.shape[0]]
        np.multiply(d, xh, out=t)  # dout * xhat
        dweight += o @ t
        if has_bias:
            dbias += o @ d
        mean_g = d @ w_over_c
        mean_gx = t @ w_over_c
        np.multiply(d, weight, out=g)
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
    C = x.shape[-1]
    x2 = x.reshape(-1, C)
    N = x2.shape[0]
    xhat = np.empty_like(x2)
    out = np.empty_like(x2)
    rstd = np.empty(N, dtype=x.dtype)
    rows = _row_blocks(N, C, _ROW_BLOCK)
    for lo in rows:
        xb, xh, r = x2[lo : lo + rows.step], xhat[lo : lo + rows.step], rstd[lo : lo + rows.step]
        np.vecdot(xb, xb, out=r)  # per-row sums of squares
        r *= 1.0 / C
        r += eps
        np.sqrt(r, out=r)
        np.divide(1.0, r, out=r)
        np.multiply(xb, r[:, None], out=xh)
        np.multiply(xh, weight, out=out[lo : lo + rows.step])
    return out.reshape(x.shape), (xhat, rstd[:, None], weight)


def rmsnorm_backward(dout: np.ndarray, cache):
    """dout (..., C) -> dx (..., C), dweight (C,).

    With g = dout * weight: dx = rstd * (g - xhat * mean(g * xhat)), LayerNorm's formula less
    its mean(g) term (nothing was centred); mean(g * xhat) = (dout * xhat) @ weight / C is a
    GEMV, and dout * xhat also gives dweight's column sums.
    """
    xhat, rstd, weight = cache
    C = xhat.shape[-1]
    d2 = dout.reshape(-1, C)
    N = d2.shape[0]
    dx = np.empty_like(d2)
    dweight = np.zeros(C, dtype=d2.dtype)
    w_over_c = weight / C
    rows = _row_blocks(N, C, _ROW_BLOCK // 4)  # four (rows, C) streams, as in layernorm_backward
    scratch = np.empty((min(rows.step, N), C), dtype=d2.dtype)
    ones = np.ones(scratch.shape[0], dtype=d2.dtype)
    for lo in rows:
        d, xh, g = d2[lo : lo + rows.step], xhat[lo : lo + rows.step], dx[lo : lo + rows.step]
        t, o = scratch[: d.shape[0]], ones[: d.shape[0]]
        np.multiply(d, xh, out=t)  # dout * xhat
        dweight += o @ t
        mean_gx = t @ w_over_c
        np.multiply(d, weight, out=g)
        np.multiply(xh, mean_gx[:, None], out=t)
        g -= t
        g *= rstd[lo : lo + rows.step]
    return dx.reshape(dout.shape), dweight


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
    """dout (..., Cout) -> dx (..., Cin), dweight (Cin, Cout), dbias (Cout,) or None."""
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
    over x, which is allowed when no cache holds x (pre-norm's residual stream)."""
    if inplace:
        x += branch
        return x, None
    return x + branch, None


def residual_backward(dout: np.ndarray, cache) -> tuple[np.ndarray, np.ndarray]:
    """dout (B, T, C) -> (d skip, d branch): a sum hands its gradient to both terms unchanged
    (the same array twice; the caller adds the branch's input gradient to it once the branch's
    backward has read it)."""
    return dout, dout


# ----------------------------------------------------------------------------- fused pieces of GPT-2's block
# Each is today's ops one after the other, in the same order, so the CPU's numbers are the same bits
# whichever the model calls; on a GPU (backends/device_ops.py) each is fewer passes over memory.


def bias_residual_forward(x: np.ndarray, branch: np.ndarray, bias: np.ndarray | None):
    """x (B, T, C) += branch (B, T, C) + bias (C,) or None, written over x: a projection whose
    GEMM left its bias out (linear_forward with bias None) joining the residual stream. `branch`
    is consumed (the bias is added into it). -> x, cache."""
    if bias is not None:
        branch += bias
    x, _ = residual_forward(x, branch, inplace=True)
    return x, bias is not None


def bias_residual_backward(dout: np.ndarray, cache):
    """dout (B, T, C) -> (d skip, d branch, d bias (C,) or None): the residual's gradient twice,
    as residual_backward, and the bias's, the column sums of dout (as linear_backward's)."""
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
    -> out (B, T, C), cache."""
    x, has_branch_bias = bias_residual_forward(x, branch, branch_bias)
    out, ln_cache = layernorm_forward(x, weight, bias, eps)
    return out, (ln_cache, has_branch_bias)


def residual_layernorm_backward(dskip: np.ndarray, dout: np.ndarray, cache):
    """dskip (B, T, C): the gradient reaching the new x through the skip; dout: the LayerNorm
    output's. -> (dx, dweight, dbias, d branch_bias): dx = dskip + the LayerNorm's input gradient
    (written over dskip; it is also the branch's gradient), the LayerNorm's parameters' and the
    branch bias's gradients (None where absent)."""
    ln_cache, has_branch_bias = cache
    dx, dweight, dbias = layernorm_add_backward(dskip, dout, ln_cache)
    return dx, dweight, dbias, _column_sums(dx.reshape(-1, dx.shape[-1])) if has_branch_bias else None


def layernorm_add_backward(dskip: np.ndarray, dout: np.ndarray, cache):
    """layernorm_backward of an x that also feeds a skip: dskip (B, T, C) += the LayerNorm's input
    gradient (written over dskip). -> dskip, dweight, dbias or None."""
    dx, dweight, dbias = layernorm_backward(dout, cache)
    dskip += dx
    return dskip, dweight, dbias


# ----------------------------------------------------------------------------- attention


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


_EXP_SAFE = 60.0  # exp(60) ~ 1e26: sums of such terms stay far below float32's max (3.4e38)
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
    """
    if s.max() < _EXP_SAFE:  # False for NaN too
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


_TILE_SCORES = 1 << 18  # score elements of one query tile, all (batch, head) pairs together, on
# average: 1 MB of float32, so a tile's scores and weights stay in L2 between the passes over them


def _query_tiles(T: int, causal: bool, pairs: int = 1) -> list[tuple[int, int, int]]:
    """(first query, end query, keys seen) of each tile of query rows; `pairs` is B * H.

    Causal attention cuts the queries into 2 to 8 tiles, as many as keep the average tile's
    scores within _TILE_SCORES; tile [lo, hi) sees only the keys [0, hi), so the scores above
    the diagonal blocks ((n - 1) / 2n of the (T, T) scores with n tiles) are never computed, as
    FlashAttention skips masked tiles, and only each tile's diagonal block needs the mask. This
    is not a loop over time: each tile is one batched matmul over every batch row, head and its
    many query rows, and the tile count is bounded whatever T. Bidirectional attention, a short
    causal one, and one whose whole (B, H, T, T) scores fit a tile's budget are one tile seeing
    every key: there the extra calls of a second tile cost more than the masked quarter they
    skip.
    """
    if not causal or T < 16 or pairs * T * T <= _TILE_SCORES:
        return [(0, T, T)]
    n = max(2, min(8, -(-pairs * T * T // 2 // _TILE_SCORES)))
    cuts = np.linspace(0, T, n + 1).round().astype(int)
    return [(int(lo), int(hi), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]


def attention_forward(
    qkv: np.ndarray, n_heads: int, causal: bool, trace: dict | None = None, n_kv_heads: int | None = None
):
    """qkv (B, T, (H + 2 Hkv) hd) fused projections -> out (B, T, H hd) =
    softmax(q k^T / sqrt(hd) + mask) v, each query head attending with its group's K/V head
    (`_split_heads`; n_kv_heads None: one K/V head per query head, the fused width 3C).

    A K/V head's g query heads are one batch of rows: q is scaled once into a (B, Hkv, T, g, hd)
    buffer (T*hd work instead of T*T), whose (T, g) rows are then one axis of T * g queries, so
    each product is one batched matmul per K/V head and k, v are never repeated. With g = 1
    the weighted sums are written straight into the (B, T, C) layout the output projection
    reads. Causal attention runs in query tiles (`_query_tiles`), only each tile's diagonal
    block masked. With `trace` (a dict) it records q, k, v, scores_raw, scores, weights and
    mix, each (B, H, ...) per query head (k and v as each query head sees them), the (T, T)
    ones whole (masked scores -inf, their weights 0).
    Plain twin: `transformer.reference.attention`.
    """
    B, T, _ = qkv.shape
    q, k, v = _split_heads(qkv, n_heads, n_kv_heads)
    _, Hkv, _, g, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    qs = np.empty((B, Hkv, T, g, hd), dtype=qkv.dtype)
    np.multiply(q, scale, out=qs)
    out = np.empty((B, T, n_heads * hd), dtype=qkv.dtype)
    mix = out.reshape(B, T, Hkv, g, hd).transpose(0, 2, 1, 3, 4)  # (B, Hkv, T, g, hd) view of out
    tiles = _query_tiles(T, causal, B * n_heads)
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
        if g == 1:
            np.matmul(w, v[:, :, :keys], out=mix[:, :, lo:hi, 0])
        else:
            mix[:, :, lo:hi] = (w @ v[:, :, :keys]).reshape(B, Hkv, hi - lo, g, hd)
        weights.append(w)
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
        ds = dm @ v[:, :, :keys].swapaxes(-1, -2)  # (B, Hkv, rows, keys) d weights
        ds -= row_dot[:, :, lo:hi].reshape(B, Hkv, rows, 1)
        ds *= w  # now the gradient of the scaled scores
        if g == 1:
            np.matmul(ds, k[:, :, :keys], out=dq[:, :, lo:hi, 0])
        else:
            dq[:, :, lo:hi] = (ds @ k[:, :, :keys]).reshape(B, Hkv, hi - lo, g, hd)
        q_rows = qs[:, :, lo:hi].reshape(B, Hkv, rows, hd)
        if keys == T:
            np.matmul(w.swapaxes(-1, -2), dm, out=dv)
            np.matmul(ds.swapaxes(-1, -2), q_rows, out=dk)
        else:
            dv[:, :, :keys] += w.swapaxes(-1, -2) @ dm
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


# ----------------------------------------------------------------------------- activations


def gelu_forward(x: np.ndarray, grad: bool = True):
    """x (...) -> 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's tanh GELU.

    Written as x * h with h = 0.5 (1 + tanh(u)), u = c (x + a x^3). With `grad` the cache is
    the derivative, computed here while x and h are in cache: d/dx [x h] = h + x h', and with
    t = tanh(u) = 2h - 1, h' = 0.5 (1 - t^2) u' = 2 h (1 - h) c (1 + 3a x^2). The backward is
    then one multiply, and the cache is one array instead of x and h. Without `grad` (eval) the
    cache is None. The passes run over L2-sized row blocks (`_row_blocks`), so only the first
    reads x from memory and only the last ones write a finished block.
    Plain twin: `transformer.reference.gelu`.
    """
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    out2 = np.empty_like(x2)
    deriv2 = np.empty_like(x2) if grad else None
    rows = _row_blocks(x2.shape[0], n, _ROW_BLOCK)
    scratch = np.empty((min(rows.step, x2.shape[0]), n), dtype=x.dtype)
    for lo in rows:
        xb = x2[lo : lo + rows.step]
        h = scratch[: xb.shape[0]]
        np.square(xb, out=h)
        h *= _GELU_A * _GELU_C
        h += _GELU_C
        h *= xb  # u
        np.tanh(h, out=h)
        h *= 0.5
        h += 0.5
        o = out2[lo : lo + rows.step]
        if grad:  # o serves as scratch before it receives the output
            np.square(xb, out=o)
            o *= 6.0 * _GELU_A * _GELU_C
            o += 2.0 * _GELU_C
            o *= xb  # 2 x u'
            d = deriv2[lo : lo + rows.step]
            np.subtract(1.0, h, out=d)
            d *= h
            d *= o  # x h'
            d += h
        np.multiply(xb, h, out=o)
    return out2.reshape(x.shape), deriv2.reshape(x.shape) if grad else None


def gelu_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (...) -> dx (...) = dout * gelu'(x), the derivative the forward cached."""
    return dout * cache


def linear_gelu_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, grad: bool = True, trace=None):
    """x (..., Cin) -> gelu(x @ weight + bias) (..., Cout): linear_forward, then gelu_forward (an
    MLP's first projection and its GELU). `trace` (a dict), when given, gets the pre-activation
    (bias included) under "pre". -> out, cache."""
    pre, linear_cache = linear_forward(x, weight, bias)
    if trace is not None:
        trace["pre"] = pre
    out, gelu_cache = gelu_forward(pre, grad)
    return out, (linear_cache, gelu_cache)


def linear_gelu_backward(dout: np.ndarray, cache):
    """dout (..., Cout) -> dx (..., Cin), dweight, dbias or None: gelu_backward, then linear_backward."""
    linear_cache, gelu_cache = cache
    return linear_backward(gelu_backward(dout, gelu_cache), linear_cache)


def relu_forward(x: np.ndarray, grad: bool = True):
    """x (...) -> max(x, 0); the cache is the output (its sign says where gradient flows), kept
    whether or not `grad` asks for it since it costs nothing extra.

    Plain twin: `transformer.reference.relu`.
    """
    out = np.maximum(x, 0)
    return out, out


def relu_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (...) -> dx (...) = dout where the input was positive, else 0."""
    return np.where(cache > 0, dout, 0).astype(dout.dtype, copy=False)


def silu_forward(x: np.ndarray, grad: bool = True):
    """x (...) -> x * sigmoid(x) (SiLU, also called swish). The sigmoid is 0.5 (1 + tanh(x / 2)),
    which never overflows (1 / (1 + exp(-x)) does for x below -88 in float32). With `grad` the
    cache is the derivative, sigmoid + silu * (1 - sigmoid), computed while both are at hand;
    without it (eval) None.
    Plain twin: `transformer.reference.silu`.
    """
    s = np.multiply(x, 0.5)
    np.tanh(s, out=s)
    s *= 0.5
    s += 0.5  # sigmoid(x)
    out = x * s
    if not grad:
        return out, None
    deriv = np.subtract(1.0, s)
    deriv *= out
    deriv += s
    return out, deriv


def silu_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (...) -> dx (...) = dout * silu'(x), the derivative the forward cached."""
    return dout * cache


def swiglu_forward(h: np.ndarray, grad: bool = True):
    """h (..., 2F) = [gate | up], the fused projections x W_gate and x W_up -> (..., F) =
    silu(gate) * up: the gated product of a SwiGLU MLP (Shazeer 2020, as Llama's MLP computes
    it before its down projection).

    With `grad` the cache is (silu(gate), up * silu'(gate)): the two factors the backward
    multiplies dout by (up is folded into the derivative, one array fewer than keeping it).
    Plain twin: `transformer.reference.swiglu`.
    """
    F = h.shape[-1] // 2
    gate, up = h[..., :F], h[..., F:]
    act, deriv = silu_forward(gate, grad)
    out = act * up
    if not grad:
        return out, None
    deriv *= up
    return out, (act, deriv)


def swiglu_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (..., F) -> dh (..., 2F) = [dout * up * silu'(gate) | dout * silu(gate)]."""
    act, up_deriv = cache
    F = act.shape[-1]
    dh = np.empty((*dout.shape[:-1], 2 * F), dtype=dout.dtype)
    np.multiply(dout, up_deriv, out=dh[..., :F])
    np.multiply(dout, act, out=dh[..., F:])
    return dh


# ----------------------------------------------------------------------------- loss


_BLOCK_ELEMS = 1 << 18  # 1 MB of float32: a block of rows stays in L2 across several passes
_LOW_TARGET = -40.0  # a row whose target logit is above this has a max above it: its sum of exps is >= e^-40


def softmax_xent_forward(logits: np.ndarray, targets: np.ndarray):
    """logits (N, V), targets (N,) int -> mean cross-entropy -log softmax(logits)[target].

    Overwrites `logits` with their exponentials exp(z - shift), and keeps the row sums: with
    them that is all the backward needs, so the biggest array of the model is allocated once.
    The loss is log(sum) - (z_target - shift), summed in float64. The division by the row sums is
    left to the backward, where it joins the 1/N of the mean in one pass (an eval-only loss never
    pays for it).

    The rows are handled in L2-sized blocks (a few dozen rows of a large vocabulary) that go
    through the gather, the exponential and the row sums while they are in cache: three passes
    over the (N, V) array from memory become one. This loop is over a bounded number of row
    blocks for cache locality, not over time: each block is a batched call over many rows.
    Like the attention softmax, a block skips the row max (shift 0) when exp cannot overflow
    (max < 60) and no row can underflow (every target logit, hence every row max, above -40);
    otherwise its rows are shifted by their max.
    Plain twins: `transformer.reference.softmax_xent` and `softmax_xent_grad`.
    """
    N, V = logits.shape
    rows = max(1, _BLOCK_ELEMS // max(V, 1))
    total = np.empty(N, dtype=logits.dtype)
    picked = np.empty(N, dtype=np.float64)  # z_target - shift
    ones = np.ones(V, dtype=logits.dtype)
    for lo in range(0, N, rows):
        z = logits[lo : lo + rows]
        zt = z[np.arange(z.shape[0]), targets[lo : lo + rows]]
        if not (z.max() < _EXP_SAFE and zt.min() > _LOW_TARGET):  # NaN takes this branch too
            m = z.max(axis=-1, keepdims=True)
            z -= m
            zt -= m[:, 0]
        picked[lo : lo + rows] = zt
        np.exp(z, out=z)
        np.matmul(z, ones, out=total[lo : lo + rows])  # row sums as a GEMV
    loss = float(np.mean(np.log(total.astype(np.float64)) - picked))
    return loss, (logits, total, targets)


def softmax_xent_backward(cache, n_total: int | None = None) -> np.ndarray:
    """-> dlogits (N, V) = (y_hat - y) / N (seed 002's dL/dz for the mean loss), written over
    the cached exponentials: y_hat / N = exp / (row sum * N). When these N rows are a shard of
    a bigger batch whose mean is the loss, n_total is that batch's row count."""
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
