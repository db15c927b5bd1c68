"""AdamW, gradient clipping and the learning-rate schedule against slow, plainly written references."""

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkit.transformer import ModelError
from tokenkit.transformer.optim import AdamW, clip_grad_norm, cosine_schedule

SHAPES = {"wte.weight": (5, 3), "h.0.attn.c_attn.weight": (3, 4), "h.0.attn.c_attn.bias": (4,), "ln_f.weight": (3,)}


def random_tensors(rng, dtype, shapes=SHAPES):
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}


def reference_adamw(params, grads_per_step, lrs, betas, eps, weight_decay):
    """AdamW as the paper / torch.optim.AdamW write it, one Python float at a time (float64)."""
    beta1, beta2 = betas
    out = {}
    for name, p0 in params.items():
        decayed = p0.ndim >= 2
        flat = [float(x) for x in p0.reshape(-1)]
        m = [0.0] * len(flat)
        v = [0.0] * len(flat)
        for t, (grads, lr) in enumerate(zip(grads_per_step, lrs, strict=True), start=1):
            g = grads[name].reshape(-1)
            for i in range(len(flat)):
                gi = float(g[i])
                if decayed:
                    flat[i] = flat[i] - lr * weight_decay * flat[i]
                m[i] = beta1 * m[i] + (1 - beta1) * gi
                v[i] = beta2 * v[i] + (1 - beta2) * gi * gi
                m_hat = m[i] / (1 - beta1**t)
                v_hat = v[i] / (1 - beta2**t)
                flat[i] = flat[i] - lr * m_hat / (math.sqrt(v_hat) + eps)
        out[name] = np.array(flat).reshape(p0.shape)
    return out


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_steps=st.integers(1, 6),
    dtype=st.sampled_from([np.float32, np.float64]),
    beta1=st.sampled_from([0.0, 0.9]),
    beta2=st.sampled_from([0.95, 0.999]),
    weight_decay=st.sampled_from([0.0, 0.1, 0.5]),
    eps=st.sampled_from([1e-8, 1e-3]),
)
def test_adamw_matches_plain_reference(seed, n_steps, dtype, beta1, beta2, weight_decay, eps):
    rng = np.random.default_rng(seed)
    params = random_tensors(rng, dtype)
    start = {k: v.copy() for k, v in params.items()}
    grads_per_step = [random_tensors(rng, dtype) for _ in range(n_steps)]
    lrs = [float(x) for x in rng.uniform(1e-3, 1e-1, n_steps)]
    opt = AdamW(params, lr=lrs[0], betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    for grads, lr in zip(grads_per_step, lrs, strict=True):
        opt.step(grads, lr=lr)
    expected = reference_adamw(start, grads_per_step, lrs, (beta1, beta2), eps, weight_decay)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-6, atol=2e-6)
    for name in params:
        assert params[name].dtype == dtype
        np.testing.assert_allclose(params[name], expected[name], **tol, err_msg=name)


def test_weight_decay_only_on_2d():
    rng = np.random.default_rng(0)
    params = random_tensors(rng, np.float32)
    start = {k: v.copy() for k, v in params.items()}
    zero = {k: np.zeros_like(v) for k, v in params.items()}  # zero gradient: Adam moves nothing
    opt = AdamW(params, lr=0.1, weight_decay=0.5)
    opt.step(zero)
    for name, p in params.items():
        if p.ndim == 2:
            np.testing.assert_array_equal(p, start[name] * np.float32(1 - 0.1 * 0.5), err_msg=name)
        else:
            np.testing.assert_array_equal(p, start[name], err_msg=name)


def test_thread_count_and_repeats_give_identical_bits():
    # large enough that _split cuts the elements into several ranges
    shapes = {"a.weight": (300, 400), "a.bias": (1000,), "b.weight": (70, 50)}
    rng = np.random.default_rng(1)
    start = random_tensors(rng, np.float32, shapes)
    grads = [random_tensors(rng, np.float32, shapes) for _ in range(3)]
    results = []
    for threads in (1, 3, 3):
        params = {k: v.copy() for k, v in start.items()}
        opt = AdamW(params, lr=1e-2, threads=threads)
        for g in grads:
            opt.step(g)
        results.append(params)
    for name in shapes:
        assert results[0][name].tobytes() == results[1][name].tobytes() == results[2][name].tobytes()


def test_state_dict_round_trip_continues_bit_identically(tmp_path):
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(2)
    params = random_tensors(rng, np.float32)
    grads = [random_tensors(rng, np.float32) for _ in range(6)]
    opt = AdamW(params, lr=3e-2)
    for g in grads[:3]:
        opt.step(g)
    save_file(opt.state_dict(), str(tmp_path / "opt.safetensors"))
    resumed_params = {k: v.copy() for k, v in params.items()}
    resumed = AdamW(resumed_params, lr=3e-2)
    resumed.load_state_dict(load_file(str(tmp_path / "opt.safetensors")))
    assert resumed.step_count == 3
    for g in grads[3:]:
        opt.step(g)
        resumed.step(g)
    for name in params:
        assert params[name].tobytes() == resumed_params[name].tobytes(), name


def test_load_state_dict_rejects_mismatches():
    rng = np.random.default_rng(3)
    opt = AdamW(random_tensors(rng, np.float32), lr=1e-3)
    good = opt.state_dict()
    bad_cases = [
        {k: v for k, v in good.items() if k != "m.wte.weight"},
        {**good, "m.extra": np.zeros(2, np.float32)},
        {**good, "v.ln_f.weight": np.zeros(4, np.float32)},
        {**good, "betas": np.array([0.9, 0.999])},
        {**good, "step": np.array(-1)},
    ]
    for bad in bad_cases:
        with pytest.raises(ModelError):
            opt.load_state_dict(bad)
    opt.load_state_dict(good)


def test_step_rejects_mismatched_grads_and_bad_hyperparameters():
    rng = np.random.default_rng(4)
    params = random_tensors(rng, np.float32)
    opt = AdamW(params, lr=1e-3)
    grads = random_tensors(rng, np.float32)
    with pytest.raises(ModelError):
        opt.step({k: v for k, v in grads.items() if k != "ln_f.weight"})
    with pytest.raises(ModelError):
        opt.step({**grads, "ln_f.weight": np.zeros(4, np.float32)})
    with pytest.raises(ModelError):
        opt.step({k: v.astype(np.float64) for k, v in grads.items()})
    for kwargs in (dict(betas=(1.0, 0.9)), dict(eps=0.0), dict(weight_decay=-1.0), dict(lr=-1.0)):
        with pytest.raises(ModelError):
            AdamW(params, **{"lr": 1e-3, **kwargs})


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_norm=st.floats(0.1, 20.0))
def test_clip_grad_norm(seed, max_norm):
    rng = np.random.default_rng(seed)
    grads = random_tensors(rng, np.float32)
    before = {k: v.copy() for k, v in grads.items()}
    expected_norm = math.sqrt(sum(float(x) ** 2 for g in before.values() for x in g.reshape(-1)))
    norm = clip_grad_norm(grads, max_norm)
    assert norm == pytest.approx(expected_norm, rel=1e-6)
    if expected_norm > max_norm:
        coef = max_norm / (expected_norm + 1e-6)
        for name in grads:
            np.testing.assert_allclose(grads[name], before[name] * coef, rtol=1e-5, atol=1e-7)
        after = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        assert after == pytest.approx(max_norm, rel=1e-5)
    else:
        for name in grads:
            np.testing.assert_array_equal(grads[name], before[name])


def test_clip_grad_norm_leaves_non_finite_alone_and_rejects_bad_max_norm():
    grads = {"a": np.array([np.inf, 1.0], np.float32), "b": np.ones(2, np.float32)}
    assert math.isinf(clip_grad_norm(grads, 1.0))
    np.testing.assert_array_equal(grads["b"], np.ones(2, np.float32))
    with pytest.raises(ModelError):
        clip_grad_norm(grads, 0.0)


def test_cosine_schedule_key_points():
    kw = dict(max_lr=6e-4, min_lr=6e-5, warmup_steps=10, total_steps=110)
    assert cosine_schedule(0, **kw) == pytest.approx(6e-4 / 10)
    assert cosine_schedule(4, **kw) == pytest.approx(6e-4 * 5 / 10)
    assert cosine_schedule(9, **kw) == pytest.approx(6e-4)
    assert cosine_schedule(10, **kw) == pytest.approx(6e-4)
    assert cosine_schedule(60, **kw) == pytest.approx((6e-4 + 6e-5) / 2)
    assert cosine_schedule(35, **kw) == pytest.approx(6e-5 + (6e-4 - 6e-5) * (1 + math.cos(math.pi / 4)) / 2)
    assert cosine_schedule(110, **kw) == pytest.approx(6e-5)
    assert cosine_schedule(10_000, **kw) == 6e-5
    lrs = [cosine_schedule(s, **kw) for s in range(130)]
    assert all(a <= b for a, b in pairwise(lrs[:11]))  # warmup rises
    assert all(a >= b for a, b in pairwise(lrs[10:]))  # then never rises again
    assert cosine_schedule(0, max_lr=1.0, min_lr=0.0, warmup_steps=0, total_steps=4) == 1.0
    for bad in (dict(kw, warmup_steps=200), dict(kw, min_lr=1.0), dict(kw, warmup_steps=-1)):
        with pytest.raises(ModelError):
            cosine_schedule(0, **bad)
    with pytest.raises(ModelError):
        cosine_schedule(-1, **kw)
