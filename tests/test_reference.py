"""The plain ops of transformer/reference.py, and every fast op against them.

Two steps, as llm.c checks its kernels:
1. each plain backward against central finite differences of its plain forward, on small shapes
   (the references are right);
2. each fast op of ops.py, attention.py and activations.py, forward and backward, against its plain
   twin in float64, to 1e-10 of the largest value, on random shapes and seeds: shapes that cross the
   row blocks and query tiles of tiling.py (their sizes shrunk so that small arrays cross them, and
   once at their real sizes), causal and not, grouped K/V heads, RoPE's scalings.
A failure prints the largest difference.
"""

import contextlib
import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops import ROPE_SCALINGS, check, gqa_heads, project

from tokenkit.transformer import activations, attention, ops, tiling
from tokenkit.transformer import reference as ref

TWIN_TOL = 1e-10  # of the largest value: float64 twins differ only by the order of their sums
few = settings(max_examples=12, deadline=None, derandomize=True)  # the same cases on every run
seeds = st.integers(0, 2**31)
row_blocks = st.sampled_from([None, 8, 40, 96])  # ROW_BLOCK elements; None: the real size
tile_budgets = st.sampled_from([None, 1, 300, 2000])  # TILE_SCORES; None: the real size


def assert_twin(name: str, fast, plain, tol: float = TWIN_TOL) -> None:
    """fast and plain agree to tol of plain's largest magnitude (None with None)."""
    if plain is None or fast is None:
        assert fast is None and plain is None, f"{name}: {type(fast).__name__} against {type(plain).__name__}"
        return
    fast, plain = np.asarray(fast), np.asarray(plain)
    assert fast.shape == plain.shape, f"{name}: shape {fast.shape}, plain twin's {plain.shape}"
    diff = float(np.abs(fast - plain).max(initial=0.0))
    scale = float(np.abs(plain).max(initial=0.0))
    assert diff <= tol * scale, f"{name}: max abs diff {diff:.2e} ({diff / scale:.1e} of the largest value {scale:.2e})"


def assert_twins(name: str, fast: tuple, plain: tuple) -> None:
    assert len(fast) == len(plain), name
    for i, (f, p) in enumerate(zip(fast, plain, strict=True)):
        assert_twin(f"{name}[{i}]", f, p)


@contextlib.contextmanager
def shrunk(row_block: int | None = None, tile_scores: int | None = None):
    """tiling's sizes shrunk for the duration (None keeps the real one), so small arrays cross pieces."""
    with pytest.MonkeyPatch.context() as mp:
        if row_block is not None:
            mp.setattr(tiling, "ROW_BLOCK", row_block)
        if tile_scores is not None:
            mp.setattr(tiling, "TILE_SCORES", tile_scores)
        yield


def forward_backward(forward, backward, args: tuple, dout: np.ndarray, **sizes):
    """A fast op's output and its backward's gradients, under tiling's sizes `shrunk(**sizes)`."""
    with shrunk(**sizes):
        out, cache = forward(*args)
        return out, backward(dout, cache)


# ----------------------------------------------------------------------------- 1. the references are right


def test_plain_backwards_match_finite_differences_of_plain_forwards():
    rng = np.random.default_rng(30)
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    ids = rng.integers(0, 4, (2, 3))
    W, table, r = n(4, 5), n(6, 5), n(2, 3, 5)
    check("embedding", ref.embedding_backward(r, ids, 4), lambda: project(ref.embedding(ids, W), r), W)
    positions = lambda: np.broadcast_to(ref.positional(table, 3), r.shape)  # noqa: E731  every batch row
    check("positional", ref.positional_backward(r, 6), lambda: project(positions(), r), table)

    x, w, b = n(2, 3, 5) * 2 + 1, n(5), n(5)
    for bias in (b, None):
        dx, dw, db = ref.layernorm_backward(r, x, w, bias)
        f = lambda bias=bias: project(ref.layernorm(x, w, bias), r)  # noqa: E731
        check("layernorm dx", dx, f, x)
        check("layernorm dw", dw, f, w)
        if bias is not None:
            check("layernorm db", db, f, b)
        assert (db is None) == (bias is None)
    dx, dw = ref.rmsnorm_backward(r, x, w)
    f = lambda: project(ref.rmsnorm(x, w), r)  # noqa: E731
    check("rmsnorm dx", dx, f, x)
    check("rmsnorm dw", dw, f, w)

    Wl, bl, rl = n(5, 4), n(4), n(2, 3, 4)
    dx, dw, db = ref.linear_backward(rl, x, Wl, bl)
    f = lambda: project(ref.linear(x, Wl, bl), rl)  # noqa: E731
    check("linear dx", dx, f, x)
    check("linear dw", dw, f, Wl)
    check("linear db", db, f, bl)
    dx, dw, db = ref.linear_gelu_backward(rl, x, Wl, bl)
    f = lambda: project(ref.linear_gelu(x, Wl, bl), rl)  # noqa: E731
    check("linear_gelu dx", dx, f, x)
    check("linear_gelu dw", dw, f, Wl)
    check("linear_gelu db", db, f, bl)

    branch, bb, rskip = n(2, 3, 5), n(5), n(2, 3, 5)
    dskip, dbranch = ref.residual_backward(r)
    check("residual dskip", dskip, lambda: project(ref.residual(x, branch), r), x)
    check("residual dbranch", dbranch, lambda: project(ref.residual(x, branch), r), branch)
    dskip, dbranch, dbb = ref.bias_residual_backward(r, bb)
    f = lambda: project(ref.bias_residual(x, branch, bb), r)  # noqa: E731
    check("bias_residual dskip", dskip, f, x)
    check("bias_residual dbranch", dbranch, f, branch)
    check("bias_residual dbias", dbb, f, bb)
    dx, dw, db = ref.layernorm_add_backward(rskip, r, x, w, b)
    f = lambda: project(x, rskip) + project(ref.layernorm(x, w, b), r)  # noqa: E731
    check("layernorm_add dx", dx, f, x)
    check("layernorm_add dw", dw, f, w)
    check("layernorm_add db", db, f, b)

    def residual_layernorm_loss():
        new_x, out = ref.residual_layernorm(x, branch, bb, w, b)
        return project(new_x, rskip) + project(out, r)

    dx, dw, db, dbb = ref.residual_layernorm_backward(rskip, r, x, branch, bb, w, b)
    for name, grad, wrt in [("dx", dx, x), ("dbranch", dx, branch), ("dw", dw, w), ("db", db, b), ("dbb", dbb, bb)]:
        check(f"residual_layernorm {name}", grad, residual_layernorm_loss, wrt)

    z = n(2, 3, 6) * 2
    for name in ("gelu", "relu", "silu", "swiglu"):
        forward, backward = getattr(ref, name), getattr(ref, f"{name}_backward")
        rz = n(*forward(z).shape)
        check(f"{name} dx", backward(rz, z), lambda forward=forward, rz=rz: project(forward(z), rz), z)

    logits, targets = n(4, 7) * 3, rng.integers(0, 7, 4)
    check("softmax_xent", ref.softmax_xent_grad(logits, targets), lambda: ref.softmax_xent(logits, targets), logits)
    assert_twin("n_total", ref.softmax_xent_grad(logits, targets, 8), ref.softmax_xent_grad(logits, targets) / 2)
    # rows whose target is IGNORE: out of the mean and of its count, and no gradient
    masked = np.where([True, False, True, False], targets, ref.IGNORE)
    grad = ref.softmax_xent_grad(logits, masked)
    check("softmax_xent masked", grad, lambda: ref.softmax_xent(logits, masked), logits)
    assert not grad[[1, 3]].any()
    assert ref.softmax_xent(logits, masked) == pytest.approx(ref.softmax_xent(logits[[0, 2]], targets[[0, 2]]))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H, Hkv", [(1, 1), (2, 2), (4, 2), (2, 1)])
def test_plain_attention_backward_matches_finite_differences(causal, H, Hkv):
    rng = np.random.default_rng(31)
    qkv = rng.standard_normal((2, 4, (H + 2 * Hkv) * 2))
    r = rng.standard_normal((2, 4, H * 2))
    dqkv = ref.attention_backward(r, qkv, H, causal, Hkv)
    check(f"attention (H {H}, Hkv {Hkv})", dqkv, lambda: project(ref.attention(qkv, H, causal, Hkv), r), qkv)


@pytest.mark.parametrize("scaling", ROPE_SCALINGS, ids=str)
def test_plain_rope_backward_matches_finite_differences(scaling):
    rng = np.random.default_rng(32)
    qkv = rng.standard_normal((2, 3, (2 + 2 * 1) * 4))
    r = rng.standard_normal(qkv.shape)
    f = lambda: project(ref.rope(qkv, 2, 1, 50.0, 5, scaling), r)  # noqa: E731
    check("rope", ref.rope_backward(r, 2, 1, 50.0, 5, scaling), f, qkv)


def test_softmax_is_one_vector_softmax_for_sampling_and_the_references():
    z = np.array([[1.0, 2.0, -np.inf], [1000.0, 1000.0, 0.0]])
    np.testing.assert_array_equal(ref.softmax(z)[:, 2], [0.0, 0.0])
    np.testing.assert_allclose(ref.softmax(z).sum(-1), 1.0, rtol=1e-15)
    np.testing.assert_array_equal(ref.softmax(z)[1], ref.softmax(z[1]))  # a row of a batch is the vector alone
    assert ref.softmax(np.float32([0.0, 1.0])).dtype == np.float64


@pytest.mark.parametrize("module", [ref, tiling, attention], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0, module.__name__


# ----------------------------------------------------------------------------- 2. every fast op against its twin


@few
@given(st.integers(1, 2), st.integers(1, 6), st.integers(1, 6), st.integers(2, 9), seeds)
def test_embedding_and_positions(B, T, C, V, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (B, T))  # repeats likely: their gradients must add up
    weight, table, dout = rng.standard_normal((V, C)), rng.standard_normal((T + 3, C)), rng.standard_normal((B, T, C))
    out, cache = ops.embedding_forward(ids, weight)
    assert_twin("embedding", out, ref.embedding(ids, weight))
    assert_twin("embedding_backward", ops.embedding_backward(dout, cache), ref.embedding_backward(dout, ids, V))
    start = rng.standard_normal((V, C))  # the tied unembedding's gradient, already there
    both = ops.embedding_backward(dout, cache, dweight=start.copy())
    assert_twin("embedding_backward into dweight", both, start + ref.embedding_backward(dout, ids, V))
    out, cache = ops.positional_forward(table, T)
    assert_twin("positional", out, ref.positional(table, T))
    assert_twin("positional_backward", ops.positional_backward(dout, cache), ref.positional_backward(dout, T + 3))


@few
@given(st.integers(1, 40), st.integers(3, 9), st.booleans(), row_blocks, seeds)  # C >= 3: see test_ops
def test_layernorm_and_its_fused_pieces(N, C, bias, block, seed):
    rng = np.random.default_rng(seed)
    x, dout, dskip = rng.standard_normal((N, C)) * 3 + 1, rng.standard_normal((N, C)), rng.standard_normal((N, C))
    w, b = rng.standard_normal(C), rng.standard_normal(C) if bias else None
    branch, branch_bias = rng.standard_normal((N, C)), rng.standard_normal(C) if bias else None
    with shrunk(row_block=block):
        out, cache = ops.layernorm_forward(x, w, b)
        grads = ops.layernorm_backward(dout, cache)
        added = ops.layernorm_add_backward(dskip.copy(), dout, cache)
        skip = x.copy()  # the fused op writes the new x over it
        fused_out, fused_cache = ops.residual_layernorm_forward(skip, branch.copy(), branch_bias, w, b)
        fused_grads = ops.residual_layernorm_backward(dskip.copy(), dout, fused_cache)
    assert_twin("layernorm", out, ref.layernorm(x, w, b))
    assert_twins("layernorm_backward", grads, ref.layernorm_backward(dout, x, w, b))
    assert_twins("layernorm_add_backward", added, ref.layernorm_add_backward(dskip, dout, x, w, b))
    new_x, plain_out = ref.residual_layernorm(x, branch, branch_bias, w, b)
    assert_twin("residual_layernorm new x", skip, new_x)
    assert_twin("residual_layernorm", fused_out, plain_out)
    plain = ref.residual_layernorm_backward(dskip, dout, x, branch, branch_bias, w, b)
    assert_twins("residual_layernorm_backward", fused_grads, plain)


@few
@given(st.integers(1, 40), st.integers(2, 9), row_blocks, seeds)  # C >= 2: see test_ops
def test_rmsnorm(N, C, block, seed):
    rng = np.random.default_rng(seed)
    x, dout, w = rng.standard_normal((N, C)) * 3 + 1, rng.standard_normal((N, C)), rng.standard_normal(C)
    eps = float(rng.choice([1e-5, 1e-6, 0.1]))
    out, grads = forward_backward(ops.rmsnorm_forward, ops.rmsnorm_backward, (x, w, eps), dout, row_block=block)
    assert_twin("rmsnorm", out, ref.rmsnorm(x, w, eps))
    assert_twins("rmsnorm_backward", grads, ref.rmsnorm_backward(dout, x, w, eps))


@few
@given(st.integers(1, 2), st.integers(1, 12), st.integers(1, 6), st.integers(1, 6), st.booleans(), row_blocks, seeds)
def test_linear_residual_and_linear_gelu(B, T, Cin, Cout, bias, block, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((B, T, Cin)), rng.standard_normal((Cin, Cout))
    b = rng.standard_normal(Cout) if bias else None
    dout, branch = rng.standard_normal((B, T, Cout)), rng.standard_normal((B, T, Cout))
    out, cache = ops.linear_forward(x, w, b)
    assert_twin("linear", out, ref.linear(x, w, b))
    assert_twins("linear_backward", ops.linear_backward(dout, cache), ref.linear_backward(dout, x, w, b))
    assert_twin("unembed", ops.unembed(x.reshape(-1, Cin), w.T), ref.linear(x.reshape(-1, Cin), w, None))
    out, grads = forward_backward(ops.linear_gelu_forward, ops.linear_gelu_backward, (x, w, b), dout, row_block=block)
    assert_twin("linear_gelu", out, ref.linear_gelu(x, w, b))
    assert_twins("linear_gelu_backward", grads, ref.linear_gelu_backward(dout, x, w, b))
    skip = out.copy()
    assert_twin("residual", ops.residual_forward(skip, branch)[0], ref.residual(out, branch))
    assert_twins("residual_backward", ops.residual_backward(dout, None), ref.residual_backward(dout))
    summed, cache = ops.bias_residual_forward(skip, branch.copy(), b)
    assert_twin("bias_residual", summed, ref.bias_residual(out, branch, b))
    assert_twins("bias_residual_backward", ops.bias_residual_backward(dout, cache), ref.bias_residual_backward(dout, b))


@few
@given(st.integers(1, 2), st.integers(1, 40), st.sampled_from([1, 2, 4]), st.integers(1, 4), st.integers(0, 2),
       st.booleans(), tile_budgets, seeds)  # fmt: skip
def test_attention(B, T, H, hd, kind, causal, budget, seed):
    """Grouped K/V heads (Hkv 1, 2 or H), causal or not, in 1 to 8 query tiles."""
    H, Hkv = gqa_heads(H, kind)
    rng = np.random.default_rng(seed)
    qkv, dout = rng.standard_normal((B, T, (H + 2 * Hkv) * hd)), rng.standard_normal((B, T, H * hd))
    args = (qkv, H, causal, None, Hkv)  # no trace
    out, dqkv = forward_backward(ops.attention_forward, ops.attention_backward, args, dout, tile_scores=budget)
    assert_twin(f"attention (H {H}, Hkv {Hkv})", out, ref.attention(qkv, H, causal, Hkv))
    assert_twin(f"attention_backward (H {H}, Hkv {Hkv})", dqkv, ref.attention_backward(dout, qkv, H, causal, Hkv))


@few
@given(st.integers(1, 2), st.integers(1, 6), st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 6]),
       st.integers(0, 2), st.integers(0, 9), st.sampled_from(ROPE_SCALINGS), seeds)  # fmt: skip
def test_rope(B, T, H, hd, kind, start, scaling, seed):
    H, Hkv = gqa_heads(H, kind)
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * hd))
    dout = rng.standard_normal(qkv.shape)
    theta = float(rng.choice([10000.0, 500000.0, 7.5]))
    out, cache = ops.rope_forward(qkv, H, Hkv, theta, start, scaling=scaling)
    assert_twin("rope", out, ref.rope(qkv, H, Hkv, theta, start, scaling))
    assert_twin("rope_backward", ops.rope_backward(dout, cache), ref.rope_backward(dout, H, Hkv, theta, start, scaling))


@few
@given(st.integers(1, 30), st.integers(1, 5), st.sampled_from(["gelu", "relu", "silu", "swiglu"]), row_blocks, seeds)
def test_activations(N, half, name, block, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, 2 * half)) * 3
    x[0, 0] = 0.0  # ReLU's kink: both twins send no gradient through it
    dout = rng.standard_normal((N, half if name == "swiglu" else 2 * half))  # SwiGLU halves the width
    forward, backward = getattr(activations, f"{name}_forward"), getattr(activations, f"{name}_backward")
    out, dx = forward_backward(forward, backward, (x,), dout, row_block=block)
    assert_twin(name, out, getattr(ref, name)(x))
    assert_twin(f"{name}_backward", dx, getattr(ref, f"{name}_backward")(dout, x))


@few
@given(st.integers(1, 30), st.integers(2, 12), st.sampled_from([0.0, 50.0, 80.0, -300.0]), st.booleans(), row_blocks,
       seeds)  # fmt: skip
def test_softmax_xent(N, V, offset, shard, block, seed):
    """Offsets that are safe to exponentiate as they are, that would overflow, or underflow."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((N, V)) * 3 + offset
    targets = rng.integers(0, V, N)
    n_total = 3 * N if shard else None
    with shrunk(row_block=block):
        loss, cache = ops.softmax_xent_forward(logits.copy(), targets)
        dlogits = ops.softmax_xent_backward(cache, n_total)
    assert loss == pytest.approx(ref.softmax_xent(logits, targets), rel=TWIN_TOL)
    assert_twin("softmax_xent_backward", dlogits, ref.softmax_xent_grad(logits, targets, n_total))


# ----------------------------------------------------------------------------- at the real sizes


def test_row_blocks_at_their_real_size():
    """2700 rows of 100: the forwards cut them in 2 row blocks, the backwards in 5."""
    rng = np.random.default_rng(33)
    N, C = 2700, 100
    assert len(tiling.row_blocks(N, C)) == 2 and len(tiling.row_blocks(N, C, share=4)) == 5
    x, dout, w, b = rng.standard_normal((N, C)) * 2 + 1, rng.standard_normal((N, C)), rng.standard_normal(C), None
    out, cache = ops.layernorm_forward(x, w, b)
    assert_twin("layernorm", out, ref.layernorm(x, w, b))
    assert_twins("layernorm_backward", ops.layernorm_backward(dout, cache), ref.layernorm_backward(dout, x, w, b))
    out, cache = ops.rmsnorm_forward(x, w)
    assert_twin("rmsnorm", out, ref.rmsnorm(x, w))
    assert_twins("rmsnorm_backward", ops.rmsnorm_backward(dout, cache), ref.rmsnorm_backward(dout, x, w))
    out, cache = ops.gelu_forward(x)
    assert_twin("gelu", out, ref.gelu(x))
    assert_twin("gelu_backward", ops.gelu_backward(dout, cache), ref.gelu_backward(dout, x))
    logits, targets = rng.standard_normal((N // 9, 1000)) * 3, rng.integers(0, 1000, N // 9)
    logits[7] += 80.0  # one block shifted by its max, the other not
    assert len(tiling.row_blocks(*logits.shape)) == 2
    loss, cache = ops.softmax_xent_forward(logits.copy(), targets)
    assert loss == pytest.approx(ref.softmax_xent(logits, targets), rel=TWIN_TOL)
    assert_twin("softmax_xent_backward", ops.softmax_xent_backward(cache), ref.softmax_xent_grad(logits, targets))


def test_query_tiles_at_their_real_size():
    """260 queries of 4 heads over 2 K/V heads: 2 query tiles, cut at the real TILE_SCORES."""
    rng = np.random.default_rng(34)
    B, T, H, Hkv, hd = 1, 260, 4, 2, 4
    assert len(tiling.query_tiles(T, True, B * H)) == 2
    qkv, dout = rng.standard_normal((B, T, (H + 2 * Hkv) * hd)), rng.standard_normal((B, T, H * hd))
    out, cache = ops.attention_forward(qkv, H, True, n_kv_heads=Hkv)
    assert_twin("attention", out, ref.attention(qkv, H, True, Hkv))
    dqkv = ops.attention_backward(dout, cache)
    assert_twin("attention_backward", dqkv, ref.attention_backward(dout, qkv, H, True, Hkv))
    assert math.isfinite(float(np.abs(dqkv).sum()))
