"""The activations as forward/backward ops: GPT-2's tanh GELU, ReLU, SiLU and SwiGLU's gated product.

Elementwise, so each forward computes its derivative while x is in cache, when the caller will
want a gradient (`grad`): the backward is then one multiply, and the cache one array instead of
the input and its intermediates. GELU, whose forward makes the most passes, runs them over
L2-sized row blocks (`tiling.row_blocks`).

Each fast op names its plain twin in `transformer/reference.py`, forward and backward.

What this module deliberately does not do: the projections around an activation (ops.py has the
fused linear_gelu of GPT-2's MLP), or the GPU's activations (transformer/backends/).
"""

from __future__ import annotations

import math

import numpy as np

from tokenkit.transformer.tiling import row_blocks

GELU_C = math.sqrt(2.0 / math.pi)  # GPT-2's tanh GELU: 0.5 x (1 + tanh(GELU_C (x + GELU_A x^3)))
GELU_A = 0.044715


def gelu_forward(x: np.ndarray, grad: bool = True):
    """x (...) -> 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's tanh GELU.

    Written as x * h with h = 0.5 (1 + tanh(u)), u = c (x + a x^3). With `grad` the cache is
    the derivative, computed here while x and h are in cache: d/dx [x h] = h + x h', and with
    t = tanh(u) = 2h - 1, h' = 0.5 (1 - t^2) u' = 2 h (1 - h) c (1 + 3a x^2). The backward is
    then one multiply, and the cache is one array instead of x and h. Without `grad` (eval) the
    cache is None. The passes run over L2-sized row blocks (`tiling.row_blocks`), so only the first
    reads x from memory and only the last ones write a finished block.
    Plain twin: `transformer.reference.gelu`.
    """
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    out2 = np.empty_like(x2)
    deriv2 = np.empty_like(x2) if grad else None
    rows = row_blocks(x2.shape[0], n)
    scratch = np.empty((min(rows.step, x2.shape[0]), n), dtype=x.dtype)
    for lo in rows:
        xb = x2[lo : lo + rows.step]
        h = scratch[: xb.shape[0]]
        np.square(xb, out=h)
        h *= GELU_A * GELU_C
        h += GELU_C
        h *= xb  # u
        np.tanh(h, out=h)
        h *= 0.5
        h += 0.5
        o = out2[lo : lo + rows.step]
        if grad:  # o serves as scratch before it receives the output
            np.square(xb, out=o)
            o *= 6.0 * GELU_A * GELU_C
            o += 2.0 * GELU_C
            o *= xb  # 2 x u'
            d = deriv2[lo : lo + rows.step]
            np.subtract(1.0, h, out=d)
            d *= h
            d *= o  # x h'
            d += h
        np.multiply(xb, h, out=o)
    return out2.reshape(x.shape), deriv2.reshape(x.shape) if grad else None


def gelu_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (...) -> dx (...) = dout * gelu'(x), the derivative the forward cached.
    Plain twin: `transformer.reference.gelu_backward`."""
    return dout * cache


def relu_forward(x: np.ndarray, grad: bool = True):
    """x (...) -> max(x, 0); the cache is the output (its sign says where gradient flows), kept
    whether or not `grad` asks for it since it costs nothing extra.

    Plain twin: `transformer.reference.relu`.
    """
    out = np.maximum(x, 0)
    return out, out


def relu_backward(dout: np.ndarray, cache) -> np.ndarray:
    """dout (...) -> dx (...) = dout where the input was positive, else 0.
    Plain twin: `transformer.reference.relu_backward`."""
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
    """dout (...) -> dx (...) = dout * silu'(x), the derivative the forward cached.
    Plain twin: `transformer.reference.silu_backward`."""
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
    """dout (..., F) -> dh (..., 2F) = [dout * up * silu'(gate) | dout * silu(gate)].
    Plain twin: `transformer.reference.swiglu_backward`."""
    act, up_deriv = cache
    F = act.shape[-1]
    dh = np.empty((*dout.shape[:-1], 2 * F), dtype=dout.dtype)
    np.multiply(dout, up_deriv, out=dh[..., :F])
    np.multiply(dout, act, out=dh[..., F:])
    return dh
