"""The plain versions of the fast ops, forward and backward: obviously correct, slow, for reading
and for the tests.

`transformer/ops.py` (with attention.py and activations.py) computes the same things in
cache-sized row blocks, query tiles, fused in-place passes and GEMV row sums; each fast op's
docstring names its twin here. These functions loop where the math loops (over rows, positions,
heads, keys), write the formulas as a textbook does and allocate freely; they are meant for
float64 inputs, as the tests give them.
Each backward sits right below its forward, as in llm.c, and takes what its forward took (no
caches): it recomputes whatever it needs. The tests compare every fast op with these on random
shapes, as llm.c keeps `matmul_forward_naive` beside its fast matmul and tiktoken keeps
`_educational.py`.

`softmax` is the one vector softmax of tk: sampling uses it as it is, and the attention's fast
row softmax is its tiled twin.

What this module deliberately does not do: speed, in-place updates, caches (a backward
recomputes), the KV cache of generation, or anything the model does not need.
"""

from __future__ import annotations

import math

import numpy as np

from tokenkit.transformer.loss import IGNORE

LN_EPS = 1e-5  # GPT-2's LayerNorm epsilon
GELU_C = math.sqrt(2 / math.pi)
GELU_A = 0.044715


def softmax(z: np.ndarray) -> np.ndarray:
    """(..., n) -> (..., n) probabilities over the last axis, in float64: exp(z - max) / sum.
    Subtracting the max keeps exp from overflowing; -inf gets probability 0.

    >>> softmax(np.array([0.0, np.log(3.0)])).round(3).tolist()
    [0.25, 0.75]
    """
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ----------------------------------------------------------------------------- embedding, positions


def embedding(ids: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(B, T) ids, (V, C) table -> (B, T, C): row ids[b, t] of the table."""
    B, T = ids.shape
    return np.stack([np.stack([weight[ids[b, t]] for t in range(T)]) for b in range(B)])


def embedding_backward(dout: np.ndarray, ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """dout (B, T, C), ids (B, T) -> dweight (V, C): each position adds its gradient to its id's
    row, so an id seen twice gets both."""
    B, T, C = dout.shape
    dweight = np.zeros((vocab_size, C))
    for b in range(B):
        for t in range(T):
            dweight[ids[b, t]] += dout[b, t]
    return dweight


def sinusoidal_table(n_positions: int, d_model: int) -> np.ndarray:
    """(n_positions, d_model): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(the same)."""
    table = np.zeros((n_positions, d_model))
    for p in range(n_positions):
        for j in range(d_model):
            angle = p / 10000 ** (2 * (j // 2) / d_model)
            table[p, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return table


def positional(table: np.ndarray, T: int) -> np.ndarray:
    """(n_positions, C) -> (T, C): the rows of positions 0..T-1, added to every batch row."""
    return table[:T]


def positional_backward(dout: np.ndarray, n_positions: int) -> np.ndarray:
    """dout (B, T, C) -> dtable (n_positions, C): row t gets the sum over the batch of position
    t's gradient; rows past T were not used and get 0."""
    B, T, C = dout.shape
    dtable = np.zeros((n_positions, C))
    for t in range(T):
        for b in range(B):
            dtable[t] += dout[b, t]
    return dtable


# ----------------------------------------------------------------------------- rotary positions


def rope_inv_freq(head_dim: int, theta: float, scaling=None) -> list[float]:
    """The rotary inverse frequencies theta^(-2i / head_dim), one pair of dimensions at a time,
    stretched as transformers' `_compute_linear_scaling_rope_parameters` and
    `_compute_llama3_parameters` write it: linear divides each by the factor; llama3 looks at
    each one's wavelength 2 pi / inv_freq and keeps it (short), divides it (long) or blends."""
    out = []
    for i in range(head_dim // 2):
        inv_freq = 1.0 / theta ** (2 * i / head_dim)
        if scaling is not None and scaling.type == "linear":
            inv_freq = inv_freq / scaling.factor
        elif scaling is not None and scaling.type == "llama3":
            old = scaling.original_context_length
            wavelen = 2 * math.pi / inv_freq
            if wavelen < old / scaling.high_freq_factor:
                pass  # high frequencies: as trained
            elif wavelen > old / scaling.low_freq_factor:
                inv_freq = inv_freq / scaling.factor  # low frequencies: stretched
            else:
                s = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
                inv_freq = (1 - s) * inv_freq / scaling.factor + s * inv_freq
        out.append(inv_freq)
    return out


def rope(
    qkv: np.ndarray, n_heads: int, n_kv_heads: int | None, theta: float, start: int = 0, scaling=None
) -> np.ndarray:
    """(B, T, (H + 2 Hkv) hd) -> the same with each q and k head of position start + t rotated,
    pair by pair, HF Llama's `rotate_half` way: dimension i with dimension i + hd/2, by the angle
    (start + t) * inv_freq_i (`rope_inv_freq`: theta^(-2i / hd), stretched by `scaling`). v is
    copied as it is."""
    return _rotate_pairs(qkv, n_heads, n_kv_heads, theta, start, scaling, sign=1)


def rope_backward(
    dout: np.ndarray, n_heads: int, n_kv_heads: int | None, theta: float, start: int = 0, scaling=None
) -> np.ndarray:
    """dout (B, T, (H + 2 Hkv) hd) -> dqkv (the same shape). Each pair (x_i, x_{i+hd/2}) was
    multiplied by the rotation [[c, -s], [s, c]]; its gradient is multiplied by the transpose
    [[c, s], [-s, c]], the rotation by -angle. v's gradient passes through."""
    return _rotate_pairs(dout, n_heads, n_kv_heads, theta, start, scaling, sign=-1)


def _rotate_pairs(x, n_heads, n_kv_heads, theta, start, scaling, sign: int) -> np.ndarray:
    """rope's loop: every q and k head's pairs rotated by sign * angle (sign -1 turns back)."""
    B, T, W = x.shape
    n_kv = n_heads if n_kv_heads is None else n_kv_heads
    hd = W // (n_heads + 2 * n_kv)
    half = hd // 2
    inv_freq = rope_inv_freq(hd, theta, scaling)
    out = np.array(x, dtype=np.float64)
    for b in range(B):
        for t in range(T):
            for head in range(n_heads + n_kv):  # the q heads, then the k heads
                pairs = x[b, t, head * hd : (head + 1) * hd]
                for i in range(half):
                    angle = sign * (start + t) * inv_freq[i]
                    c, s = math.cos(angle), math.sin(angle)
                    out[b, t, head * hd + i] = pairs[i] * c - pairs[i + half] * s
                    out[b, t, head * hd + i + half] = pairs[i + half] * c + pairs[i] * s
    return out


# ----------------------------------------------------------------------------- norms


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float = LN_EPS) -> np.ndarray:
    """(..., C) -> (..., C): each row centred, divided by sqrt(its variance + eps), scaled, shifted."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + (0 if bias is None else bias)


def layernorm_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps=LN_EPS):
    """dout (..., C), the forward's x (..., C) -> dx (..., C), dweight (C,), dbias (C,) or None.

    One row at a time, as llm.c's layernorm_backward: with xhat = (x - mean) / std and
    g = dout * weight, dx = (g - mean(g) - xhat * mean(g * xhat)) / std: the direct path, the
    path through the mean, the path through the variance.
    """
    C = x.shape[-1]
    rows, drows = x.reshape(-1, C), dout.reshape(-1, C)
    dx = np.zeros(rows.shape)
    dweight, dbias = np.zeros(C), np.zeros(C)
    for i in range(rows.shape[0]):
        mean = rows[i].mean()
        rstd = 1.0 / math.sqrt(((rows[i] - mean) ** 2).mean() + eps)
        xhat = (rows[i] - mean) * rstd
        dweight += drows[i] * xhat
        dbias += drows[i]
        g = drows[i] * weight
        dx[i] = rstd * (g - g.mean() - xhat * (g * xhat).mean())
    return dx.reshape(x.shape), dweight, None if bias is None else dbias


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float = LN_EPS) -> np.ndarray:
    """(..., C) -> (..., C): each row divided by its root mean square (sqrt(mean(x^2) + eps)), scaled."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * weight


def rmsnorm_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float = LN_EPS):
    """dout (..., C), the forward's x (..., C) -> dx (..., C), dweight (C,).

    One row at a time: with xhat = x / rms and g = dout * weight, dx = (g - xhat * mean(g * xhat)) / rms,
    LayerNorm's formula without the path through the mean (nothing was centred).
    """
    C = x.shape[-1]
    rows, drows = x.reshape(-1, C), dout.reshape(-1, C)
    dx = np.zeros(rows.shape)
    dweight = np.zeros(C)
    for i in range(rows.shape[0]):
        rstd = 1.0 / math.sqrt((rows[i] ** 2).mean() + eps)
        xhat = rows[i] * rstd
        dweight += drows[i] * xhat
        g = drows[i] * weight
        dx[i] = rstd * (g - xhat * (g * xhat).mean())
    return dx.reshape(x.shape), dweight


# ----------------------------------------------------------------------------- linear, residual


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """(..., Cin) @ (Cin, Cout) (+ bias) -> (..., Cout)."""
    return x @ weight + (0 if bias is None else bias)


def linear_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None):
    """dout (..., Cout), the forward's x (..., Cin) -> dx (..., Cin), dweight (Cin, Cout), dbias (Cout,) or None.

    One row at a time: out = x W + b, so dx = dout W^T, and every row adds its outer product
    x^T dout to dweight and its dout to dbias.
    """
    rows, drows = x.reshape(-1, x.shape[-1]), dout.reshape(-1, dout.shape[-1])
    dx = np.zeros(rows.shape)
    dweight, dbias = np.zeros(weight.shape), np.zeros(weight.shape[1])
    for i in range(rows.shape[0]):
        dx[i] = weight @ drows[i]
        dweight += np.outer(rows[i], drows[i])
        dbias += drows[i]
    return dx.reshape(x.shape), dweight, None if bias is None else dbias


def residual(x: np.ndarray, branch: np.ndarray) -> np.ndarray:
    """(B, T, C) skip path + (B, T, C) branch."""
    return x + branch


def residual_backward(dout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """dout (B, T, C) -> (d skip, d branch): a sum hands its gradient to both terms unchanged."""
    return dout.copy(), dout.copy()


def dropout(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """x times a dropout mask of the same shape, whose elements are 0 (dropped) or 1 / (1 - p)
    (kept, scaled so that the expectation is x): transformer/dropout.py draws it."""
    return x * mask


def dropout_backward(dout: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """d(x * mask) / dx = mask, element by element: the same mask multiplies the gradient."""
    return dout * mask


# ----------------------------------------------------------------------------- fused pieces of GPT-2's block
# The fast ops fuse these for fewer passes over memory; plainly, each is the unfused ops one after the other.


def bias_residual(x: np.ndarray, branch: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """(B, T, C) skip + (B, T, C) branch + (C,) bias or None: a projection's bias and the residual."""
    return residual(x, branch + (0 if bias is None else bias))


def bias_residual_backward(dout: np.ndarray, bias: np.ndarray | None):
    """dout (B, T, C) -> (d skip, d branch, d bias (C,) or None): residual_backward, and the
    bias's gradient, the sum of dout over every (b, t) row (as linear_backward's dbias)."""
    dskip, dbranch = residual_backward(dout)
    return dskip, dbranch, None if bias is None else dout.reshape(-1, dout.shape[-1]).sum(axis=0)


def layernorm_add_backward(dskip: np.ndarray, dout: np.ndarray, x: np.ndarray, weight, bias, eps: float = LN_EPS):
    """The gradient of an x (B, T, C) that feeds both a skip (dskip) and a LayerNorm (dout):
    -> dskip + layernorm_backward's dx, dweight, dbias or None."""
    dx, dweight, dbias = layernorm_backward(dout, x, weight, bias, eps)
    return dskip + dx, dweight, dbias


def residual_layernorm(x, branch, branch_bias, weight, bias, eps: float = LN_EPS) -> tuple[np.ndarray, np.ndarray]:
    """x, branch (B, T, C), branch_bias (C,) or None -> (new x = bias_residual(x, branch,
    branch_bias), layernorm(new x)): a pre-norm block's residual, then the next LayerNorm."""
    new_x = bias_residual(x, branch, branch_bias)
    return new_x, layernorm(new_x, weight, bias, eps)


def residual_layernorm_backward(dskip, dout, x, branch, branch_bias, weight, bias, eps: float = LN_EPS):
    """dskip (B, T, C), the gradient of the new x through the skip; dout, the LayerNorm output's;
    the forward's inputs -> (dx, dweight, dbias, d branch_bias): dx, the new x's whole gradient,
    is also x's and the branch's (a sum); the branch bias gets its column sums."""
    new_x, _ = residual_layernorm(x, branch, branch_bias, weight, bias, eps)
    dx, dweight, dbias = layernorm_add_backward(dskip, dout, new_x, weight, bias, eps)
    _, _, dbranch_bias = bias_residual_backward(dx, branch_bias)
    return dx, dweight, dbias, dbranch_bias


# ----------------------------------------------------------------------------- attention


def _heads(qkv_row: np.ndarray, n_heads: int, n_kv: int, h: int):
    """(..., (H + 2 Hkv) hd) -> the q of query head h and the k, v of its K/V head h // (H / Hkv):
    views, so that writing into them writes into the fused row."""
    hd = qkv_row.shape[-1] // (n_heads + 2 * n_kv)
    kv = h // (n_heads // n_kv)
    q = qkv_row[..., h * hd : (h + 1) * hd]
    k = qkv_row[..., (n_heads + kv) * hd : (n_heads + kv + 1) * hd]
    v = qkv_row[..., (n_heads + n_kv + kv) * hd : (n_heads + n_kv + kv + 1) * hd]
    return q, k, v


def attention(
    qkv: np.ndarray, n_heads: int, causal: bool, n_kv_heads: int | None = None, drop: np.ndarray | None = None
) -> np.ndarray:
    """(B, T, (H + 2 Hkv) hd) fused q|k|v -> (B, T, H hd): one (batch, head, query) at a time,
    the weights the softmax of the scaled scores q_t . k_j / sqrt(hd) over the keys it sees.
    Query head h reads K/V head h // (H / Hkv); Hkv defaults to H. `drop` (B, H, T, T): a
    dropout mask on the weights (`dropout`) before they weigh v."""
    B, T, W = qkv.shape
    n_kv = n_heads if n_kv_heads is None else n_kv_heads
    hd = W // (n_heads + 2 * n_kv)
    out = np.zeros((B, T, n_heads * hd))
    for b in range(B):
        for h in range(n_heads):
            q, k, v = _heads(qkv[b], n_heads, n_kv, h)
            for t in range(T):
                seen = t + 1 if causal else T
                w = softmax(np.array([q[t] @ k[j] / math.sqrt(hd) for j in range(seen)]))
                if drop is not None:
                    w = dropout(w, drop[b, h, t, :seen])
                out[b, t, h * hd : (h + 1) * hd] = sum(w[j] * v[j] for j in range(seen))
    return out


def attention_backward(
    dout: np.ndarray,
    qkv: np.ndarray,
    n_heads: int,
    causal: bool,
    n_kv_heads: int | None = None,
    drop: np.ndarray | None = None,
) -> np.ndarray:
    """dout (B, T, H hd), the forward's qkv -> dqkv (B, T, (H + 2 Hkv) hd).

    One (batch, head, query) at a time, as the forward: with the weights w over the keys j the
    query t sees and s_j = q_t . k_j / sqrt(hd),
        out_t = sum_j w_j v_j               so  dv_j += w_j dout_t,  dw_j = dout_t . v_j
        w = softmax(s)                      so  ds_j = w_j (dw_j - sum_i w_i dw_i)
        s_j = q_t . k_j / sqrt(hd)          so  dq_t += ds_j k_j / sqrt(hd),  dk_j += ds_j q_t / sqrt(hd)
    A K/V head shared by a group of query heads adds up the group's gradients. With a dropout
    mask m on the weights, v is weighed by w m (dv_j += w_j m_j dout_t) and dw_j = m_j dout_t . v_j
    (`dropout_backward`).
    """
    B, T, W = qkv.shape
    n_kv = n_heads if n_kv_heads is None else n_kv_heads
    hd = W // (n_heads + 2 * n_kv)
    dqkv = np.zeros((B, T, W))
    for b in range(B):
        for h in range(n_heads):
            q, k, v = _heads(qkv[b], n_heads, n_kv, h)
            dq, dk, dv = _heads(dqkv[b], n_heads, n_kv, h)
            for t in range(T):
                seen = t + 1 if causal else T
                do = dout[b, t, h * hd : (h + 1) * hd]
                w = softmax(np.array([q[t] @ k[j] / math.sqrt(hd) for j in range(seen)]))
                m = np.ones(seen) if drop is None else drop[b, h, t, :seen]
                dw = dropout_backward(np.array([do @ v[j] for j in range(seen)]), m)
                ds = w * (dw - w @ dw)
                for j in range(seen):
                    dv[j] += dropout(w, m)[j] * do
                    dq[t] += ds[j] * k[j] / math.sqrt(hd)
                    dk[j] += ds[j] * q[t] / math.sqrt(hd)
    return dqkv


# ----------------------------------------------------------------------------- activations


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU (tanh approximation), element by element: 0.5 x (1 + tanh(c (x + a x^3)))."""
    f = lambda z: 0.5 * z * (1 + math.tanh(GELU_C * (z + GELU_A * z**3)))  # noqa: E731
    return np.vectorize(f)(x)


def gelu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dout (...), the forward's x (...) -> dx = dout * gelu'(x), element by element. With
    u = c (x + a x^3) and t = tanh(u), gelu = 0.5 x (1 + t), so by the product and chain rules
    gelu' = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)."""

    def derivative(z: float) -> float:
        t = math.tanh(GELU_C * (z + GELU_A * z**3))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * GELU_C * (1 + 3 * GELU_A * z * z)

    return dout * np.vectorize(derivative, otypes=[np.float64])(x)


def linear_gelu(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """(..., Cin) -> gelu(linear(x)) (..., Cout): an MLP's first projection and its GELU."""
    return gelu(linear(x, weight, bias))


def linear_gelu_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None):
    """dout (..., Cout), the forward's x -> dx, dweight, dbias or None: gelu_backward at the
    pre-activation, then linear_backward."""
    return linear_backward(gelu_backward(dout, linear(x, weight, bias)), x, weight, bias)


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0), element by element."""
    return np.where(x > 0, x, 0.0)


def relu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dout (...), the forward's x -> dx: dout where x > 0 (slope 1), else 0 (slope 0)."""
    return np.where(x > 0, dout, 0.0)


def _sigmoid(z: float) -> float:
    """1 / (1 + e^-z), written so that neither branch overflows."""
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) = x / (1 + e^-x), element by element (written so that neither branch overflows)."""
    f = lambda z: z / (1 + math.exp(-z)) if z >= 0 else z * math.exp(z) / (1 + math.exp(z))  # noqa: E731
    return np.vectorize(f, otypes=[np.float64])(x)


def silu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dout (...), the forward's x -> dx = dout * silu'(x), element by element: with
    s = sigmoid(x) and s' = s (1 - s), silu' = s + x s (1 - s)."""
    derivative = lambda z: _sigmoid(z) + z * _sigmoid(z) * (1 - _sigmoid(z))  # noqa: E731
    return dout * np.vectorize(derivative, otypes=[np.float64])(x)


def swiglu(h: np.ndarray) -> np.ndarray:
    """(..., 2F) = [gate | up] -> (..., F): silu(gate) * up."""
    F = h.shape[-1] // 2
    return silu(h[..., :F]) * h[..., F:]


def swiglu_backward(dout: np.ndarray, h: np.ndarray) -> np.ndarray:
    """dout (..., F), the forward's h (..., 2F) -> dh (..., 2F) = [d gate | d up]: the product
    rule, d gate = silu_backward(dout * up, gate) and d up = dout * silu(gate)."""
    F = h.shape[-1] // 2
    gate, up = h[..., :F], h[..., F:]
    return np.concatenate([silu_backward(dout * up, gate), dout * silu(gate)], axis=-1)


# ----------------------------------------------------------------------------- loss


def softmax_xent(logits: np.ndarray, targets: np.ndarray) -> float:
    """(N, V) logits, (N,) targets -> the mean of -log softmax(row)[target], one row at a time,
    over the rows that count: a row whose target is IGNORE (-100) is skipped (its loss is not
    in the mean, nor in the count it divides by)."""
    losses = []
    for z, t in zip(logits, targets, strict=True):
        if t == IGNORE:
            continue
        m = z.max()
        losses.append(-(z[t] - m - math.log(np.exp(z - m).sum())))
    return float(np.mean(losses))


def softmax_xent_grad(logits: np.ndarray, targets: np.ndarray, n_total: int | None = None) -> np.ndarray:
    """d softmax_xent / d logits = (softmax(row) - onehot(target)) / N over the N rows that count
    (seed 002: y_hat - y), 0 on a row whose target is IGNORE; when these rows are a shard of a
    bigger batch whose mean is the loss, / n_total (that batch's counted rows) instead."""
    counts = np.array([t != IGNORE for t in targets])
    onehot = np.zeros_like(logits)
    for i, t in enumerate(targets):
        if t != IGNORE:
            onehot[i, t] = 1.0
    return (softmax(logits) - onehot) * counts[:, None] / (n_total or int(counts.sum()))
