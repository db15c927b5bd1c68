"""Every op of transformer/ops.py: forward against its plain twin in transformer/reference.py,
backward against central finite differences in float64 (relative error < 1e-6), on random shapes."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkit.transformer import ops, tiling
from tokenkit.transformer import reference as ref
from tokenkit.transformer.config import RopeScaling

FD_EPS = 1e-6
TOL = 1e-6
few = settings(max_examples=10, deadline=None, derandomize=True)  # the same cases on every run
dims = st.integers(1, 3), st.integers(1, 5)  # B, T


def numeric_grad(f, x: np.ndarray) -> np.ndarray:
    """Central differences of the scalar f() with respect to every element of x (restored after)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + FD_EPS
        up = f()
        flat[i] = old - FD_EPS
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * FD_EPS)
    return grad


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / (||a|| + ||b||): 0 when equal, ~1 when unrelated."""
    denom = np.linalg.norm(a) + np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / denom) if denom else 0.0


def check(name: str, analytic: np.ndarray, f, x: np.ndarray) -> None:
    numeric = numeric_grad(f, x)
    err = rel_error(analytic, numeric)
    assert err < TOL, f"{name}: relative error {err:.2e}, max abs diff {np.abs(analytic - numeric).max():.2e}"


def project(out: np.ndarray, r: np.ndarray) -> float:
    """The scalar loss sum(out * r): its gradient with respect to out is r."""
    return float(np.sum(out * r))


# ----------------------------------------------------------------------------- tests


@few
@given(*dims, st.integers(1, 6), st.integers(2, 5), st.integers(0, 2**31))
def test_embedding(B, T, C, V, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (B, T))  # repeats likely: their gradients must add up
    weight = rng.standard_normal((V, C))
    out, cache = ops.embedding_forward(ids, weight)
    np.testing.assert_array_equal(out, ref.embedding(ids, weight))
    r = rng.standard_normal(out.shape)
    dweight = ops.embedding_backward(r, cache)
    check("embedding dweight", dweight, lambda: project(ops.embedding_forward(ids, weight)[0], r), weight)
    base = rng.standard_normal((V, C))
    np.testing.assert_allclose(ops.embedding_backward(r, cache, dweight=base.copy()), base + dweight)


@few
@given(*dims, st.integers(1, 6), st.integers(0, 2**31))
def test_positional(B, T, C, seed):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((T + 2, C))
    pos, cache = ops.positional_forward(table, T)
    np.testing.assert_array_equal(pos, table[:T])
    r = rng.standard_normal((B, T, C))
    dtable = ops.positional_backward(r, cache)
    check(
        "positional dtable",
        dtable,
        lambda: project(np.broadcast_to(ops.positional_forward(table, T)[0], r.shape), r),
        table,
    )


def test_sinusoidal_table_matches_formula():
    T, C = 7, 6
    table = ops.sinusoidal_table(T, C, np.float64)
    np.testing.assert_allclose(table, ref.sinusoidal_table(T, C), atol=1e-12)
    for p in range(T):
        for i in range(C):
            angle = p / 10000 ** ((i - i % 2) / C)
            assert table[p, i] == pytest.approx(math.sin(angle) if i % 2 == 0 else math.cos(angle), abs=1e-12)
    assert ops.sinusoidal_table(T, 5, np.float32).shape == (T, 5)  # odd widths work too
    assert ops.sinusoidal_table(T, C).dtype == np.float32


@few
@given(*dims, st.integers(3, 8), st.booleans(), st.integers(0, 2**31))  # C = 2: the output is +-1 whatever x
def test_layernorm(B, T, C, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, C)) * 3 + 1
    w = rng.standard_normal(C)
    b = rng.standard_normal(C) if bias else None
    out, cache = ops.layernorm_forward(x, w, b)
    np.testing.assert_allclose(out, ref.layernorm(x, w, b), rtol=1e-10, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dx, dw, db = ops.layernorm_backward(r, cache)
    f = lambda: project(ops.layernorm_forward(x, w, b)[0], r)  # noqa: E731
    check("layernorm dx", dx, f, x)
    check("layernorm dweight", dw, f, w)
    if bias:
        check("layernorm dbias", db, f, b)
    else:
        assert db is None


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("row_block", [10, 40])
def test_layernorm_in_row_blocks(monkeypatch, bias, row_block):
    """Small blocks forced on 7 rows of 5, so that a last block is short: 10 elements give the
    forward blocks of 2 rows, 40 give the backward (a quarter of the forward's) blocks of 2 rows.
    Same values, same gradients."""
    monkeypatch.setattr(tiling, "ROW_BLOCK", row_block)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((7, 5)) * 2 - 1
    w = rng.standard_normal(5)
    b = rng.standard_normal(5) if bias else None
    out, cache = ops.layernorm_forward(x, w, b)
    np.testing.assert_allclose(out, ref.layernorm(x, w, b), rtol=1e-10, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dx, dw, db = ops.layernorm_backward(r, cache)
    f = lambda: project(ops.layernorm_forward(x, w, b)[0], r)  # noqa: E731
    check("layernorm dx (blocks)", dx, f, x)
    check("layernorm dweight (blocks)", dw, f, w)
    if bias:
        check("layernorm dbias (blocks)", db, f, b)


@few
@given(*dims, st.integers(1, 6), st.integers(1, 6), st.booleans(), st.integers(0, 2**31))
def test_linear(B, T, Cin, Cout, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, Cin))
    w = rng.standard_normal((Cin, Cout))
    b = rng.standard_normal(Cout) if bias else None
    out, cache = ops.linear_forward(x, w, b)
    np.testing.assert_allclose(out, np.einsum("btc,cd->btd", x, w) + (0 if b is None else b), rtol=1e-12)
    r = rng.standard_normal(out.shape)
    dx, dw, db = ops.linear_backward(r, cache)
    f = lambda: project(ops.linear_forward(x, w, b)[0], r)  # noqa: E731
    check("linear dx", dx, f, x)
    check("linear dweight", dw, f, w)
    if bias:
        check("linear dbias", db, f, b)


@few
@given(*dims, st.integers(1, 3), st.integers(1, 3), st.booleans(), st.integers(0, 2**31))
def test_attention(B, T, H, hd, causal, seed):
    rng = np.random.default_rng(seed)
    C = H * hd
    qkv = rng.standard_normal((B, T, 3 * C))
    trace = {}
    out, _ = ops.attention_forward(qkv, H, causal, trace)
    np.testing.assert_allclose(out, ref.attention(qkv, H, causal), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trace["weights"].sum(-1), 1.0)
    np.testing.assert_allclose(
        trace["scores"][np.isfinite(trace["scores"])],
        (trace["scores_raw"] / math.sqrt(hd))[np.isfinite(trace["scores"])],
    )
    if causal:
        assert np.all(trace["weights"][..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)
    r = rng.standard_normal(out.shape)
    _, cache = ops.attention_forward(qkv, H, causal)
    dqkv = ops.attention_backward(r, cache)
    check("attention dqkv", dqkv, lambda: project(ops.attention_forward(qkv, H, causal)[0], r), qkv)


@pytest.mark.parametrize("tile_scores", [1000, 1])  # 2 query tiles (2 * 37^2 scores), or 8 (forced)
def test_causal_attention_in_query_tiles(monkeypatch, tile_scores):
    """T = 37 is long enough for query tiles (cut unevenly): values, trace and gradient."""
    monkeypatch.setattr(tiling, "TILE_SCORES", tile_scores)
    rng = np.random.default_rng(13)
    B, T, H, hd = 1, 37, 2, 2
    assert len(tiling.query_tiles(T, True, B * H)) == (2 if tile_scores > 1 else 8)
    qkv = rng.standard_normal((B, T, 3 * H * hd))
    trace = {}
    out, _ = ops.attention_forward(qkv, H, True, trace)
    np.testing.assert_allclose(out, ref.attention(qkv, H, True), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trace["weights"].sum(-1), 1.0)
    assert np.all(np.isneginf(trace["scores"][..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]]))
    r = rng.standard_normal(out.shape)
    _, cache = ops.attention_forward(qkv, H, True)
    dqkv = ops.attention_backward(r, cache)
    check("attention dqkv (tiles)", dqkv, lambda: project(ops.attention_forward(qkv, H, True)[0], r), qkv)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_with_extreme_scores(causal):
    """Scores above the fast path's overflow bound, and a row whose scores all lie far below 0
    (its exponentials underflow unless the row max is subtracted)."""
    rng = np.random.default_rng(5)
    T, C = 5, 2
    big = rng.standard_normal((1, T, 3 * C)) * 40
    low = rng.standard_normal((1, T, 3 * C)) * 0.1
    low[0, :, C : 2 * C] = 1.0  # every key is (1, 1)
    low[0, -1, :C] = -300.0  # so the last query scores -424 against all of them
    for qkv in (big, low):
        out, _ = ops.attention_forward(qkv, 1, causal)
        np.testing.assert_allclose(out, ref.attention(qkv, 1, causal), rtol=1e-9, atol=1e-12)
        assert np.all(np.isfinite(out))


@few
@given(*dims, st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2**31))
def test_cached_attention_matches_full(B, T, H, hd, n_new, seed):
    """The KV-cache op on positions start.. gives the full causal attention's rows for them."""
    rng = np.random.default_rng(seed)
    C = H * hd
    qkv = rng.standard_normal((B, T + n_new, 3 * C))
    full, _ = ops.attention_forward(qkv, H, causal=True)
    k_cache = np.zeros((B, H, T + n_new + 2, hd))
    v_cache = np.zeros_like(k_cache)
    first, _ = ops.attention_forward_cached(qkv[:, :T], k_cache, v_cache, 0, H)
    rest, _ = ops.attention_forward_cached(qkv[:, T:], k_cache, v_cache, T, H)
    np.testing.assert_allclose(np.concatenate([first, rest], axis=1), full, rtol=1e-12, atol=1e-14)


def gqa_heads(draw_heads: int, kind: int) -> tuple[int, int]:
    """(H, Hkv) from a head count and a kind: 0 multi-query (Hkv 1), 1 two groups when H is
    even (else ordinary), 2 ordinary attention (Hkv = H)."""
    H = draw_heads
    return H, (1, 2 if H % 2 == 0 else H, H)[kind]


@few
@given(*dims, st.sampled_from([1, 2, 4]), st.integers(1, 3), st.integers(0, 2), st.booleans(), st.integers(0, 2**31))
def test_grouped_query_attention(B, T, H, hd, kind, causal, seed):
    """K/V heads shared by groups of query heads (Hkv in 1, 2, H): values against the plain
    twin, the trace per query head, and the gradient (a K/V head's sums its group's)."""
    H, Hkv = gqa_heads(H, kind)
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * hd))
    trace = {}
    out, _ = ops.attention_forward(qkv, H, causal, trace, n_kv_heads=Hkv)
    assert out.shape == (B, T, H * hd)
    np.testing.assert_allclose(out, ref.attention(qkv, H, causal, n_kv_heads=Hkv), rtol=1e-10, atol=1e-12)
    assert trace["q"].shape == trace["k"].shape == trace["mix"].shape == (B, H, T, hd)
    assert trace["weights"].shape == trace["scores"].shape == (B, H, T, T)
    np.testing.assert_allclose(trace["weights"].sum(-1), 1.0)
    np.testing.assert_allclose(trace["mix"], trace["weights"] @ trace["v"], rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(trace["k"][:, :: H // Hkv], trace["k"][:, H // Hkv - 1 :: H // Hkv])  # shared
    r = rng.standard_normal(out.shape)
    _, cache = ops.attention_forward(qkv, H, causal, n_kv_heads=Hkv)
    dqkv = ops.attention_backward(r, cache)
    f = lambda: project(ops.attention_forward(qkv, H, causal, n_kv_heads=Hkv)[0], r)  # noqa: E731
    check(f"gqa dqkv (H {H}, Hkv {Hkv})", dqkv, f, qkv)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
@pytest.mark.parametrize("tile_scores", [1000, 1])
def test_grouped_query_attention_in_query_tiles(monkeypatch, n_kv_heads, tile_scores):
    """Query tiles with groups of 2 and 4 query heads per K/V head: values and gradient."""
    monkeypatch.setattr(tiling, "TILE_SCORES", tile_scores)
    rng = np.random.default_rng(14)
    B, T, H, hd = 1, 37, 4, 2
    qkv = rng.standard_normal((B, T, (H + 2 * n_kv_heads) * hd))
    out, cache = ops.attention_forward(qkv, H, True, n_kv_heads=n_kv_heads)
    np.testing.assert_allclose(out, ref.attention(qkv, H, True, n_kv_heads), rtol=1e-10, atol=1e-12)
    r = rng.standard_normal(out.shape)
    f = lambda: project(ops.attention_forward(qkv, H, True, n_kv_heads=n_kv_heads)[0], r)  # noqa: E731
    check("gqa dqkv (tiles)", ops.attention_backward(r, cache), f, qkv)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_cached_grouped_query_attention_matches_full(n_kv_heads):
    """The KV cache holds n_kv_heads heads; positions added in three steps give the full rows."""
    rng = np.random.default_rng(15)
    B, T, H, hd = 2, 7, 4, 3
    qkv = rng.standard_normal((B, T, (H + 2 * n_kv_heads) * hd))
    full, _ = ops.attention_forward(qkv, H, causal=True, n_kv_heads=n_kv_heads)
    k_cache = np.zeros((B, n_kv_heads, T + 1, hd))
    v_cache = np.zeros_like(k_cache)
    parts = [ops.attention_forward_cached(qkv[:, a:b], k_cache, v_cache, a, H, n_kv_heads)[0]
             for a, b in ((0, 3), (3, 4), (4, 7))]  # fmt: skip
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=1e-12, atol=1e-14)


# RoPE scalings whose bands (kept, blended, divided) all hold some of the frequencies of small
# heads at theta 7.5 to 500000: wavelengths from 2 pi up
ROPE_SCALINGS = [None, RopeScaling("linear", 4.0), RopeScaling("llama3", 8.0, 1.0, 4.0, 32),
                 RopeScaling("llama3", 3.0, 0.5, 2.0, 16)]  # fmt: skip


@few
@given(*dims, st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 6]), st.integers(0, 2), st.integers(0, 5),
       st.sampled_from(ROPE_SCALINGS), st.integers(0, 2**31))  # fmt: skip
def test_rope(B, T, H, hd, kind, start, scaling, seed):
    H, Hkv = gqa_heads(H, kind)
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * hd))
    theta = float(rng.choice([10000.0, 500000.0, 7.5]))
    out, cache = ops.rope_forward(qkv, H, Hkv, theta, start, scaling=scaling)
    np.testing.assert_allclose(out, ref.rope(qkv, H, Hkv, theta, start, scaling), rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(out[..., (H + Hkv) * hd :], qkv[..., (H + Hkv) * hd :])  # v untouched
    r = rng.standard_normal(out.shape)
    f = lambda: project(ops.rope_forward(qkv, H, Hkv, theta, start, scaling=scaling)[0], r)  # noqa: E731
    check("rope dqkv", ops.rope_backward(r, cache), f, qkv)


@pytest.mark.parametrize("scaling", ROPE_SCALINGS[1:], ids=str)
def test_rope_backward_turns_back_by_the_scaled_angles(scaling):
    """The backward rotates by the forward's own (scaled) angles, the transpose of its rotation:
    backward(forward(x)) is x again, at positions past the original context too (32 and 16 here),
    while the unscaled angles would not undo it."""
    rng = np.random.default_rng(17)
    H, Hkv, hd, T, start = 4, 2, 16, 40, 7
    qkv = rng.standard_normal((2, T, (H + 2 * Hkv) * hd))
    out, cache = ops.rope_forward(qkv, H, Hkv, 100.0, start, scaling=scaling)
    np.testing.assert_allclose(ops.rope_backward(out, cache), qkv, rtol=1e-12, atol=1e-12)
    cos, sin, _ = cache
    want = np.arange(start, start + T)[:, None] * ops.rope_inv_freq(hd, 100.0, scaling)
    np.testing.assert_allclose(cos, np.cos(want), rtol=0, atol=1e-15)
    np.testing.assert_allclose(sin, np.sin(want), rtol=0, atol=1e-15)
    plain = ops.rope_forward(qkv, H, Hkv, 100.0, start)[1]
    assert np.abs(ops.rope_backward(out, plain) - qkv).max() > 0.1  # the premise: the scaling changes the angles


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from([2, 4, 8, 16, 64, 128]), st.floats(2.0, 1e6), st.sampled_from(["linear", "llama3"]),
       st.floats(1.0, 64.0), st.floats(0.1, 4.0), st.floats(1.01, 8.0), st.integers(1, 8192))  # fmt: skip
def test_scaled_rope_frequencies_match_their_plain_loop(hd, theta, kind, factor, low, ratio, original):
    """The vectorised scaled inverse frequencies against the plain per-frequency loop, in float64,
    for random heads, bases and scalings (high_freq_factor = low * ratio, above low)."""
    scaling = RopeScaling(kind, factor) if kind == "linear" else RopeScaling(kind, factor, low, low * ratio, original)
    fast = ops.rope_inv_freq(hd, theta, scaling)
    assert fast.dtype == np.float64 and fast.shape == (hd // 2,)
    np.testing.assert_allclose(fast, ref.rope_inv_freq(hd, theta, scaling), rtol=1e-13, atol=0)
    plain = ops.rope_inv_freq(hd, theta)
    assert np.all(fast <= plain * (1 + 1e-15)) and np.all(fast >= plain / factor * (1 - 1e-15))  # stretched, never more


def test_llama3_scaling_keeps_divides_and_blends_by_wavelength():
    """Llama 3.1's bands on a head of 8 at theta 100 (wavelengths 2 pi 100^(i/4): 6.3, 19.9, 62.8,
    199): under 16 / 2 = 8 kept, over 16 / 0.5 = 32 divided by 8, 19.9 blended."""
    inv = ops.rope_inv_freq(8, 100.0)
    scaled = ops.rope_inv_freq(8, 100.0, RopeScaling("llama3", 8.0, 0.5, 2.0, 16))
    s = (16 / (2 * math.pi / inv[1]) - 0.5) / (2.0 - 0.5)
    np.testing.assert_allclose(scaled, [inv[0], (1 - s) * inv[1] / 8 + s * inv[1], inv[2] / 8, inv[3] / 8], rtol=1e-15)
    np.testing.assert_allclose(ops.rope_inv_freq(8, 100.0, RopeScaling("linear", 4.0)), inv / 4, rtol=1e-15)


def test_rope_scores_depend_on_the_offset_only():
    """The point of rotary positions: q_t . k_s is a function of t - s; shifting every position
    by 5 leaves the scores as they were (and position 0 is not rotated at all)."""
    rng = np.random.default_rng(16)
    H, hd = 2, 8
    head = rng.standard_normal((1, 1, 3 * hd))  # one q, k, v
    qkv = np.repeat(head, 4, axis=1).reshape(1, 4, 3 * hd)
    qkv = np.concatenate(
        [
            qkv[..., :hd],
            qkv[..., :hd],
            qkv[..., hd : 2 * hd],
            qkv[..., hd : 2 * hd],
            qkv[..., 2 * hd :],
            qkv[..., 2 * hd :],
        ],
        axis=-1,
    )  # fmt: skip  H = Hkv = 2
    a, _ = ops.rope_forward(qkv, H, None, 10000.0)
    b, _ = ops.rope_forward(qkv, H, None, 10000.0, start=5)
    np.testing.assert_array_equal(a[0, 0], qkv[0, 0])
    scores = lambda x: x[0, :, :hd] @ x[0, :, 2 * hd : 3 * hd].T  # noqa: E731  q of head 0 against k of head 0
    np.testing.assert_allclose(scores(a), scores(b), rtol=1e-12, atol=1e-12)
    assert not np.allclose(a, b)


def test_rope_tables_are_cached_per_shape_theta_and_dtype():
    ops._rope_table.cache_clear()
    for n in (5, 6, 7, 8):  # generation: one position more each step, one table
        cos, sin = ops.rope_table(n, 4, 10000.0, np.float32)
        assert cos.shape == sin.shape == (n, 2) and cos.dtype == np.float32
    assert ops._rope_table.cache_info().misses == 1
    ops.rope_table(8, 4, 10000.0, np.float64)
    ops.rope_table(8, 4, 500000.0, np.float32)
    ops.rope_table(8, 6, 10000.0, np.float32)
    ops.rope_table(8, 4, 10000.0, np.float32, scaling=RopeScaling("linear", 2.0))
    assert ops._rope_table.cache_info().misses == 5
    ops.rope_table(7, 4, 10000.0, np.float32, scaling=RopeScaling("linear", 2.0))
    assert ops._rope_table.cache_info().misses == 5
    with pytest.raises(ValueError):
        ops.rope_table(8, 4, 10000.0)[0][0, 0] = 1.0  # read-only: shared between calls


@few
@given(*dims, st.integers(2, 8), st.integers(0, 2**31))  # C = 1: the output is +-weight whatever x
def test_rmsnorm(B, T, C, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, C)) * 3 + 1
    w = rng.standard_normal(C)
    eps = float(rng.choice([1e-5, 1e-6, 0.1]))
    out, cache = ops.rmsnorm_forward(x, w, eps)
    np.testing.assert_allclose(out, ref.rmsnorm(x, w, eps), rtol=1e-10, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dx, dw = ops.rmsnorm_backward(r, cache)
    f = lambda: project(ops.rmsnorm_forward(x, w, eps)[0], r)  # noqa: E731
    check("rmsnorm dx", dx, f, x)
    check("rmsnorm dweight", dw, f, w)


@pytest.mark.parametrize("row_block", [10, 40])
def test_rmsnorm_in_row_blocks(monkeypatch, row_block):
    monkeypatch.setattr(tiling, "ROW_BLOCK", row_block)
    rng = np.random.default_rng(17)
    x = rng.standard_normal((7, 5)) * 2 - 1
    w = rng.standard_normal(5)
    out, cache = ops.rmsnorm_forward(x, w)
    np.testing.assert_allclose(out, ref.rmsnorm(x, w), rtol=1e-10, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dx, dw = ops.rmsnorm_backward(r, cache)
    f = lambda: project(ops.rmsnorm_forward(x, w)[0], r)  # noqa: E731
    check("rmsnorm dx (blocks)", dx, f, x)
    check("rmsnorm dweight (blocks)", dw, f, w)


def test_silu_and_swiglu():
    rng = np.random.default_rng(18)
    x = rng.standard_normal((2, 3, 8)) * 3
    x[0, 0, :3] = [-200.0, 0.0, 200.0]  # far tails: no overflow, no warning
    out, cache = ops.silu_forward(x)
    np.testing.assert_allclose(out, ref.silu(x), rtol=1e-12, atol=1e-15)
    r = rng.standard_normal(x.shape)
    check("silu dx", ops.silu_backward(r, cache), lambda: project(ops.silu_forward(x)[0], r), x)
    assert ops.silu_forward(x, grad=False)[1] is None
    h = rng.standard_normal((2, 3, 10)) * 2  # gate | up, F = 5
    out, cache = ops.swiglu_forward(h)
    assert out.shape == (2, 3, 5)
    np.testing.assert_allclose(out, ref.swiglu(h), rtol=1e-12, atol=1e-15)
    r = rng.standard_normal(out.shape)
    check("swiglu dh", ops.swiglu_backward(r, cache), lambda: project(ops.swiglu_forward(h)[0], r), h)
    eval_out, eval_cache = ops.swiglu_forward(h, grad=False)
    np.testing.assert_array_equal(eval_out, out)
    assert eval_cache is None


@pytest.mark.parametrize("inplace", [False, True])
def test_residual(inplace):
    rng = np.random.default_rng(8)
    x, branch = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    expected = x + branch
    out, cache = ops.residual_forward(x.copy() if inplace else x, branch, inplace=inplace)
    np.testing.assert_array_equal(out, expected)
    r = rng.standard_normal(out.shape)
    dx, dbranch = ops.residual_backward(r, cache)
    check("residual dx", dx, lambda: project(ops.residual_forward(x, branch)[0], r), x)
    check("residual dbranch", dbranch, lambda: project(ops.residual_forward(x, branch)[0], r), branch)


@pytest.mark.parametrize("name", ["gelu", "relu"])
def test_activations(name):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 8)) * 2
    forward, backward = getattr(ops, f"{name}_forward"), getattr(ops, f"{name}_backward")
    out, cache = forward(x)
    np.testing.assert_allclose(out, ref.gelu(x) if name == "gelu" else ref.relu(x), rtol=1e-12, atol=1e-15)
    r = rng.standard_normal(x.shape)
    check(f"{name} dx", backward(r, cache), lambda: project(forward(x)[0], r), x)
    np.testing.assert_array_equal(forward(x, grad=False)[0], out)  # eval: same output, no derivative needed


def test_gelu_in_row_blocks(monkeypatch):
    """Blocks of 3 rows forced on 10 rows of 4 (the last block short): same values, same gradient."""
    monkeypatch.setattr(tiling, "ROW_BLOCK", 12)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 5, 4)) * 2
    out, cache = ops.gelu_forward(x)
    np.testing.assert_allclose(out, ref.gelu(x), rtol=1e-12, atol=1e-15)
    r = rng.standard_normal(x.shape)
    check("gelu dx (blocks)", ops.gelu_backward(r, cache), lambda: project(ops.gelu_forward(x)[0], r), x)


@few
@given(st.integers(1, 6), st.integers(2, 7), st.integers(0, 2**31))
def test_softmax_xent(N, V, seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((N, V)) * 3 + 50  # a large offset must not overflow
    targets = rng.integers(0, V, N)
    loss, cache = ops.softmax_xent_forward(logits.copy(), targets)
    assert loss == pytest.approx(ref.softmax_xent(logits, targets), rel=1e-12)
    dlogits = ops.softmax_xent_backward(cache).copy()
    np.testing.assert_allclose(dlogits, ref.softmax_xent_grad(logits, targets), atol=1e-15)  # seed 002: y_hat - y
    check("xent dlogits", dlogits, lambda: ops.softmax_xent_forward(logits.copy(), targets)[0], logits)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softmax_xent_blocks_with_extreme_rows(monkeypatch, dtype):
    """Row blocks of 2 rows (forced), some safe to exponentiate as they are, some with logits
    that would overflow exp, some so negative that their exps underflow unless shifted."""
    monkeypatch.setattr(tiling, "ROW_BLOCK", 10)
    rng = np.random.default_rng(11)
    N, V = 9, 5
    logits = rng.standard_normal((N, V)) * 2
    logits[2] += 80.0  # overflow territory
    logits[5] -= 300.0  # underflow territory
    logits[6] -= 300.0
    logits[6, 0] = 0.0  # its max is fine but its target is far below
    targets = rng.integers(0, V, N)
    targets[6] = 3
    logits = logits.astype(dtype).astype(np.float64)  # the reference sees the same rounded logits
    loss, cache = ops.softmax_xent_forward(logits.astype(dtype), targets)
    assert loss == pytest.approx(ref.softmax_xent(logits, targets), rel=1e-12 if dtype == np.float64 else 1e-5)
    dlogits = ops.softmax_xent_backward(cache)
    assert dlogits.dtype == dtype and np.all(np.isfinite(dlogits))
    np.testing.assert_allclose(
        dlogits, ref.softmax_xent_grad(logits, targets), atol=1e-15 if dtype == np.float64 else 2e-8
    )


def test_float32_stays_float32():
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x, qkv = f32(2, 3, 8), f32(2, 3, 24)
    out, cache = ops.layernorm_forward(x, f32(8), f32(8))
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in ops.layernorm_backward(x, cache))
    out, cache = ops.attention_forward(qkv, 2, True)
    assert out.dtype == np.float32 and ops.attention_backward(x, cache).dtype == np.float32
    for name in ("gelu", "relu"):
        out, cache = getattr(ops, f"{name}_forward")(x)
        assert out.dtype == np.float32 and getattr(ops, f"{name}_backward")(x, cache).dtype == np.float32
    out, cache = ops.linear_forward(x, f32(8, 5), f32(5))
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in ops.linear_backward(out, cache))
    assert ops.sinusoidal_table(4, 8).dtype == np.float32
    out, cache = ops.rmsnorm_forward(x, f32(8))
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in ops.rmsnorm_backward(x, cache))
    qkv = f32(2, 3, 16)  # H 2, Hkv 1, hd 4
    for scaling in ROPE_SCALINGS:
        out, cache = ops.rope_forward(qkv, 2, 1, 10000.0, scaling=scaling)
        assert out.dtype == np.float32 and ops.rope_backward(out, cache).dtype == np.float32
    out, cache = ops.attention_forward(qkv, 2, True, n_kv_heads=1)
    assert out.dtype == np.float32 and ops.attention_backward(out, cache).dtype == np.float32
    for name in ("silu", "swiglu"):
        out, cache = getattr(ops, f"{name}_forward")(x)
        assert out.dtype == np.float32 and getattr(ops, f"{name}_backward")(out, cache).dtype == np.float32
