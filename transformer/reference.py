"""The plain versions of the fast ops: obviously correct, slow, for reading and for the tests.

`transformer/ops.py` computes the same things in cache-sized row blocks, query tiles, fused
in-place passes and GEMV row sums; each op's docstring names its twin here. These functions
loop where the math loops (over rows, positions, heads), use float64-friendly formulas as a
textbook writes them, and allocate freely. The tests compare every op against them on random
shapes, as llm.c keeps `matmul_forward_naive` beside its fast matmul and tiktoken keeps
`_educational.py`.

What this module deliberately does not do: backward passes (the ops' backwards are checked
against finite differences of these forwards), speed, or anything the model does not need.
"""

from __future__ import annotations

import math

import numpy as np

LN_EPS = 1e-5  # GPT-2's LayerNorm epsilon


def embedding(ids: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(B, T) ids, (V, C) table -> (B, T, C): row ids[b, t] of the table."""
    B, T = ids.shape
    return np.stack([np.stack([weight[ids[b, t]] for t in range(T)]) for b in range(B)])


def sinusoidal_table(n_positions: int, d_model: int) -> np.ndarray:
    """(n_positions, d_model): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(the same)."""
    table = np.zeros((n_positions, d_model))
    for p in range(n_positions):
        for j in range(d_model):
            angle = p / 10000 ** (2 * (j // 2) / d_model)
            table[p, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return table


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float = LN_EPS) -> np.ndarray:
    """(..., C) -> (..., C): each row centred, divided by sqrt(its variance + eps), scaled, shifted."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + (0 if bias is None else bias)


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float = LN_EPS) -> np.ndarray:
    """(..., C) -> (..., C): each row divided by its root mean square (sqrt(mean(x^2) + eps)), scaled."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * weight


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """(..., Cin) @ (Cin, Cout) (+ bias) -> (..., Cout)."""
    return x @ weight + (0 if bias is None else bias)


def attention(qkv: np.ndarray, n_heads: int, causal: bool, n_kv_heads: int | None = None) -> np.ndarray:
    """(B, T, (H + 2 Hkv) hd) fused q|k|v -> (B, T, H hd): one (batch, head, query) at a time,
    softmax written out. Query head h reads K/V head h // (H / Hkv); Hkv defaults to H."""
    B, T, W = qkv.shape
    n_kv = n_heads if n_kv_heads is None else n_kv_heads
    hd = W // (n_heads + 2 * n_kv)
    group = n_heads // n_kv
    out = np.zeros((B, T, n_heads * hd), dtype=np.result_type(qkv.dtype, np.float64))
    for b in range(B):
        for h in range(n_heads):
            kv = h // group
            q = qkv[b, :, h * hd : (h + 1) * hd]
            k = qkv[b, :, (n_heads + kv) * hd : (n_heads + kv + 1) * hd]
            v = qkv[b, :, (n_heads + n_kv + kv) * hd : (n_heads + n_kv + kv + 1) * hd]
            for t in range(T):
                seen = t + 1 if causal else T
                s = np.array([q[t] @ k[j] / math.sqrt(hd) for j in range(seen)])
                w = np.exp(s - s.max())
                w /= w.sum()
                out[b, t, h * hd : (h + 1) * hd] = sum(w[j] * v[j] for j in range(seen))
    return out


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
    B, T, W = qkv.shape
    n_kv = n_heads if n_kv_heads is None else n_kv_heads
    hd = W // (n_heads + 2 * n_kv)
    half = hd // 2
    inv_freq = rope_inv_freq(hd, theta, scaling)
    out = np.array(qkv, dtype=np.result_type(qkv.dtype, np.float64))
    for b in range(B):
        for t in range(T):
            for head in range(n_heads + n_kv):  # the q heads, then the k heads
                x = qkv[b, t, head * hd : (head + 1) * hd]
                for i in range(half):
                    angle = (start + t) * inv_freq[i]
                    c, s = math.cos(angle), math.sin(angle)
                    out[b, t, head * hd + i] = x[i] * c - x[i + half] * s
                    out[b, t, head * hd + i + half] = x[i + half] * c + x[i] * s
    return out


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU (tanh approximation), element by element."""
    f = lambda z: 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))  # noqa: E731
    return np.vectorize(f)(x)


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0), element by element."""
    return np.where(x > 0, x, 0.0)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), element by element."""
    f = lambda z: z / (1 + math.exp(-z)) if z >= 0 else z * math.exp(z) / (1 + math.exp(z))  # noqa: E731
    return np.vectorize(f, otypes=[np.float64])(x)


def swiglu(h: np.ndarray) -> np.ndarray:
    """(..., 2F) = [gate | up] -> (..., F): silu(gate) * up."""
    F = h.shape[-1] // 2
    return silu(h[..., :F]) * h[..., F:]


def softmax_xent(logits: np.ndarray, targets: np.ndarray) -> float:
    """(N, V) logits, (N,) targets -> the mean of -log softmax(row)[target], one row at a time."""
    losses = []
    for z, t in zip(logits, targets, strict=True):
        m = z.max()
        losses.append(-(z[t] - m - math.log(np.exp(z - m).sum())))
    return float(np.mean(losses))


def softmax_xent_grad(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """d softmax_xent / d logits = (softmax(row) - onehot(target)) / N (seed 002: y_hat - y)."""
    y_hat = np.exp(logits - logits.max(-1, keepdims=True))
    y_hat /= y_hat.sum(-1, keepdims=True)
    return (y_hat - np.eye(logits.shape[1])[targets]) / len(targets)
