"""Checks of the fused attention kernels shared by the emulator's tests (tests/test_cuda_emulator.py)
and the GPU's (tests/test_gpu_attention.py): a kernels object (the launch code over CuPy on a GPU,
or over NumPy with the emulated CUDA source) against the NumPy twins and exact attention."""

import math

import numpy as np
from kernel_checks import relative_error

from tokenkit.transformer import ops
from tokenkit.transformer.backends import attention_twins as twins

SHAPES = [  # (B, T, H, Hkv, D): T off and on the tiles (64 rows, 32 and 64 keys), grouped K/V, every head dim
    (1, 1, 2, 1, 16),
    (2, 33, 2, 2, 16),
    (1, 64, 2, 1, 32),
    (2, 100, 4, 2, 64),
    (1, 130, 3, 3, 32),
]
# float32 tiles against a float64 twin with the same TF32 roundings: P is rounded relative to each
# tile's running maximum in the kernels and to the row's in the twins, so a value near a rounding
# boundary can land on either side (2^-11 on that term); measured up to 1.7e-4
TWIN_TOL = 5e-4
EXACT_TOL = 3e-3  # TF32 against exact float64 attention


def check_against_twins(kernels, to_device, to_host, shape, causal: bool, seed: int = 0) -> None:
    """Forward (out, lse) and backward (dqkv) of `kernels` on random inputs of `shape` against the
    twins (TWIN_TOL) and exact attention (EXACT_TOL), every output element written (the outputs
    are allocated through kernels.xp, which callers may poison with NaN)."""
    B, T, H, Hkv, D = shape
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32) * 1.5
    dout = rng.standard_normal((B, T, H * D)).astype(np.float32)
    scale = 1 / math.sqrt(D)
    out, lse = kernels.flash_attention_forward(to_device(qkv), H, Hkv, causal, scale)
    out, lse = to_host(out), to_host(lse)
    want_out, want_lse = twins.flash_forward(qkv, H, Hkv, causal, scale)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert np.isfinite(out).all() and np.isfinite(lse).all(), "an output was left unwritten"
    assert relative_error(out, want_out) <= TWIN_TOL, f"out: {relative_error(out, want_out):.2e}"
    assert np.abs(lse - want_lse).max() <= TWIN_TOL * max(1.0, np.abs(want_lse).max()), "lse"
    dqkv = to_host(
        kernels.flash_attention_backward(to_device(dout), to_device(qkv), to_device(out), to_device(lse), H, Hkv,
                                         causal, scale)
    )  # fmt: skip
    want_dqkv = twins.flash_backward(dout, qkv, out, lse, H, Hkv, causal, scale)
    assert np.isfinite(dqkv).all(), "a gradient was left unwritten"
    # each part's error relative to the whole gradient's largest magnitude: with one key, dS = P (dP -
    # delta) cancels to rounding noise, so dq and dk are noise on both sides, as small as it is
    W = (H + 2 * Hkv) * D
    parts = {"dq": slice(0, H * D), "dk": slice(H * D, (H + Hkv) * D), "dv": slice((H + Hkv) * D, W)}
    scale = max(float(np.abs(want_dqkv).max(initial=0.0)), 1e-30)
    for name, cols in parts.items():
        err = float(np.abs(dqkv[..., cols].astype(np.float64) - want_dqkv[..., cols]).max(initial=0.0)) / scale
        assert err <= TWIN_TOL, f"{name}: {err:.2e}"
    exact, cache = ops.attention_forward(qkv.astype(np.float64), H, causal, None, Hkv)
    assert relative_error(out, exact) <= EXACT_TOL
    assert relative_error(dqkv, ops.attention_backward(dout.astype(np.float64), cache)) <= EXACT_TOL


def check_decode_against_twin(
    kernels, to_device, to_host, heads, start: int, B: int, Tmax: int, position_on_device: bool = False
) -> None:
    """`decode_attention` of `kernels` against its twin: the output to 1e-5 (float32 sums in
    another order), the caches (the new key and value at `start`, nothing else) bit for bit.
    `position_on_device`: `start` given as an int32 array (1,), read by `decode_attention_at`."""
    H, Hkv, D = heads
    rng = np.random.default_rng(start + D)
    qkv = rng.standard_normal((B, 1, (H + 2 * Hkv) * D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Tmax, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, Tmax, D)).astype(np.float32)
    k_dev, v_dev = to_device(k.copy()), to_device(v.copy())
    position = to_device(np.array([start], dtype=np.int32)) if position_on_device else start
    out = to_host(kernels.decode_attention(to_device(qkv), k_dev, v_dev, position, H, Hkv, 1 / math.sqrt(D)))
    want = twins.decode_attention(qkv, k, v, start, H, Hkv, 1 / math.sqrt(D))
    assert np.isfinite(out).all(), "an output was left unwritten"
    assert relative_error(out, want) <= 1e-5, f"out: {relative_error(out, want):.2e}"
    assert np.array_equal(to_host(k_dev), k) and np.array_equal(to_host(v_dev), v), "the caches"


class PoisonedXp:
    """An array module whose new arrays are full of NaN: outputs a kernel leaves unwritten show."""

    def __init__(self, xp):
        self._xp = xp

    def __getattr__(self, name):
        return getattr(self._xp, name)

    def empty(self, shape, dtype=float, **kw):
        return self._xp.full(shape, np.nan, dtype=dtype, **kw)

    def empty_like(self, a, dtype=None, **kw):
        return self._xp.full_like(a, np.nan, dtype=dtype, **kw)


def generated_tokens(model, prompts: np.ndarray, n_new: int, graphs: bool = True):
    """What `model` generates past its context: (tokens sampled from prompts[0] at temperature
    0.9, greedy tokens (n_new, B) of every prompt), with CUDA graphs on or off."""
    import pytest

    from tokenkit.transformer.backends import set_cuda_graphs

    set_cuda_graphs(graphs)
    try:
        with pytest.warns(UserWarning, match="context"):
            sampled = list(model.generate(prompts[0], n_new, temperature=0.9, seed=2))
        with pytest.warns(UserWarning, match="context"):
            greedy = np.stack(list(model.generate_batch(prompts, n_new)))
    finally:
        set_cuda_graphs(True)
    return sampled, greedy
