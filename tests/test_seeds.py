"""The seed documents' worked examples, computed with the library's own ops and model from
hand-set weights. Expected values are the exact ones of ../shared/seeds/ERRATA.md (the
documents round early and carry typos); printed inputs are checked to the documents' 3 decimals."""

import math

import numpy as np

from tokenkit.transformer import GPT, GPTConfig, ops

DOC = 5e-4 + 1e-9  # "matches as printed": the documents' 3 decimals
EXACT6 = 5e-7 + 1e-12  # ERRATA's 6-decimal values


def test_seed003_attention_with_q_k_v_equal_to_x():
    X = np.array([[1.0, 0.5, 0.2, 0.1], [0.5, 1.0, 0.3, 0.2], [0.3, 0.2, 1.0, 0.5], [0.1, 0.1, 0.1, 1.0]])
    trace = {}
    out, _ = ops.attention_forward(np.concatenate([X, X, X], axis=1)[None], n_heads=1, causal=False, trace=trace)
    np.testing.assert_allclose(trace["scores_raw"][0, 0, 0], [1.30, 1.08, 0.65, 0.27], atol=1e-12)
    np.testing.assert_allclose(trace["scores"][0, 0, 0], [0.65, 0.54, 0.325, 0.135], atol=1e-12)  # / sqrt(4)
    np.testing.assert_allclose(trace["weights"][0, 0, 0], [0.311, 0.279, 0.225, 0.186], atol=DOC)
    np.testing.assert_allclose(out[0, 0], [0.536, 0.498, 0.389, 0.385], atol=DOC)


def test_seed004_attention_as_a_key_value_lookup():
    keys = np.array([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]], dtype=float)
    values = np.array([[1, 0, 1], [10, 0, 2], [100, 5, 0], [1000, 6, 0]], dtype=float)
    queries = np.array([[0, 10, 0], [0, 0, 10], [10, 10, 0], [0, 0, 0]], dtype=float)  # last row: unused filler
    expected = [[10, 0, 2], [550, 5.5, 0], [5.5, 0, 1.5]]
    for q_scale in (1.0, math.sqrt(3)):  # with the 1/sqrt(d_k) scale, and with it cancelled
        qkv = np.concatenate([queries * q_scale, keys, values], axis=1)[None]
        out, _ = ops.attention_forward(qkv, n_heads=1, causal=False)
        np.testing.assert_allclose(out[0, :3], expected, rtol=1e-9, atol=1e-9)


def test_seed000_one_layer_with_d_head_2_and_w_o():
    W_E = np.array([  # column convention: x_i = W_E t_i, so our (V, C) table is W_E^T
        [1, -1, 0, 1, -1, 0, 1, -1, 0, 1],
        [-1, 0, 1, -1, 0, 1, -1, 0, 1, -1],
        [0, 1, -1, 0, 1, -1, 0, 1, -1, 0],
        [1, 0, -1, 1, 0, -1, 1, 0, -1, 1],
        [-1, 1, 0, -1, 1, 0, -1, 1, 0, -1],
    ], dtype=float)  # fmt: skip
    W = np.array([[0.1, 0.2, 0.3, 0.4, 0.5], [0.2, 0.3, 0.4, 0.5, 0.6]])  # W_Q = W_K = W_V, (d_head, d_model)
    W_O = np.array([[0.1, 0.2], [0.2, 0.3], [0.3, 0.4], [0.4, 0.5], [0.5, 0.6]])  # (d_model, d_head)

    x, _ = ops.embedding_forward(np.array([[0, 1, 2]]), W_E.T)  # (1, 3, 5)
    np.testing.assert_array_equal(x[0], [[1, -1, 0, 1, -1], [-1, 0, 1, 0, 1], [0, 1, -1, -1, 0]])
    qkv, _ = ops.linear_forward(x, np.concatenate([W.T, W.T, W.T], axis=1), None)  # row convention: x W^T
    trace = {}
    r, _ = ops.attention_forward(qkv, n_heads=1, causal=True, trace=trace)
    np.testing.assert_allclose(trace["v"][0, 0], [[-0.2, -0.2], [0.7, 0.8], [-0.5, -0.6]], atol=1e-12)
    np.testing.assert_allclose(trace["q"][0, 0, 2], [-0.5, -0.6], atol=1e-12)
    np.testing.assert_allclose(trace["scores"][0, 0, 2], [0.155563, -0.586899, 0.431335], atol=EXACT6)
    np.testing.assert_allclose(trace["weights"][0, 0, 2], [0.357975, 0.170375, 0.471649], atol=EXACT6)
    np.testing.assert_allclose(r[0, 2], [-0.188157, -0.218285], atol=EXACT6)
    o, _ = ops.linear_forward(r, W_O.T, None)
    np.testing.assert_allclose(o[0, 2], [-0.062473, -0.103117, -0.143761, -0.184405, -0.225049], atol=EXACT6)
    np.testing.assert_allclose((x + o)[0, 2], [-0.062473, 0.896883, -1.143761, -1.184405, -0.225049], atol=EXACT6)


# seed 001: "The chai is hot", d_model 4, one head with d_k = d_v = 2 (row convention: Q = X W^Q)
E = np.array([[1.0, 0.0, 0.5, 0.2], [0.2, 1.0, 0.8, 0.1], [0.5, 0.3, 1.0, 0.0], [0.1, 0.5, 0.3, 1.0]])
PE = [
    [0.000, 1.000, 0.000, 1.000],
    [0.841, 0.540, 0.010, 1.000],
    [0.909, -0.416, 0.020, 1.000],
    [0.141, -0.990, 0.030, 1.000],
]
X = [
    [1.000, 1.000, 0.500, 1.200],
    [1.041, 1.540, 0.810, 1.100],
    [1.409, -0.116, 1.020, 1.000],
    [0.241, -0.490, 0.330, 2.000],
]
WQ = np.array([[1, 0], [0, 1], [0, 0], [0, 0]], dtype=float)
WK = np.array([[0, 1], [1, 0], [0, 0], [0, 0]], dtype=float)
WV = np.array([[1, 1], [0, 0], [1, 0], [0, 1]], dtype=float)
Q = [[1.000, 1.000], [1.041, 1.540], [1.409, -0.116], [0.241, -0.490]]
K = [[1.000, 1.000], [1.540, 1.041], [-0.116, 1.409], [-0.490, 0.241]]
V = [[1.500, 2.200], [1.851, 2.141], [2.429, 2.409], [0.571, 2.241]]
A = [
    [0.301, 0.454, 0.183, 0.061],
    [0.295, 0.459, 0.203, 0.043],
    [0.306, 0.523, 0.097, 0.074],
    [0.263, 0.284, 0.188, 0.265],
]
Z_CHAI = [1.809, 2.217]


def test_seed001_positions_projections_and_attention_with_ops():
    pos = ops.sinusoidal_table(4, 4, np.float64)
    np.testing.assert_allclose(pos, PE, atol=DOC)
    np.testing.assert_allclose(E + pos, X, atol=DOC)
    # from here on the document (and ERRATA) work from the printed, rounded X
    qkv, _ = ops.linear_forward(np.array(X)[None], np.concatenate([WQ, WK, WV], axis=1), None)
    trace = {}
    z, _ = ops.attention_forward(qkv, n_heads=1, causal=False, trace=trace)
    np.testing.assert_allclose(trace["q"][0, 0], Q, atol=DOC)
    np.testing.assert_allclose(trace["k"][0, 0], K, atol=DOC)
    np.testing.assert_allclose(trace["v"][0, 0], V, atol=2 * DOC)  # sums of two printed values
    np.testing.assert_allclose(trace["weights"][0, 0], A, atol=DOC)
    np.testing.assert_allclose(z[0, 1], Z_CHAI, atol=DOC)


def layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b


def test_seed001_post_norm_relu_encoder_layer_in_the_model():
    """The whole layer X' = LN(X + Z W_O), X'' = LN(X' + FFN(X')) through GPT.forward.

    The seed's single 2-dim head is head 0 of two (head 1 has zero weights, so it adds nothing);
    W_O puts Z into the first two dimensions of the residual stream, as the document's toy does.
    """
    config = GPTConfig(vocab_size=4, context_length=4, d_model=4, n_layers=1, n_heads=2,
                       positional="sinusoidal", activation="relu", norm="post", causal=False)  # fmt: skip
    model = GPT(config).params
    rng = np.random.default_rng(1)
    zero = np.zeros((4, 2))
    p = {
        # token embeddings chosen so that x0 = E + PE is exactly the document's rounded X
        "wte.weight": np.array(X) - ops.sinusoidal_table(4, 4, np.float64),
        "h.0.attn.c_attn.weight": np.concatenate([WQ, zero, WK, zero, WV, zero], axis=1),
        "h.0.attn.c_attn.bias": np.zeros(12),
        "h.0.attn.c_proj.weight": np.diag([1.0, 1.0, 0.0, 0.0]),
        "h.0.attn.c_proj.bias": np.zeros(4),
        "h.0.ln_1.weight": np.ones(4),
        "h.0.ln_1.bias": np.zeros(4),
        "h.0.mlp.c_fc.weight": rng.standard_normal((4, 16)).round(1),  # W1: 4 -> 16
        "h.0.mlp.c_fc.bias": rng.standard_normal(16).round(1),
        "h.0.mlp.c_proj.weight": rng.standard_normal((16, 4)).round(1),  # W2: 16 -> 4
        "h.0.mlp.c_proj.bias": rng.standard_normal(4).round(1),
        "h.0.ln_2.weight": np.array([1.0, 0.5, 2.0, 1.5]),
        "h.0.ln_2.bias": np.array([0.1, 0.0, -0.1, 0.2]),
        "ln_f.weight": np.ones(4),
        "ln_f.bias": np.zeros(4),
    }
    assert set(p) == set(model)
    gpt = GPT.from_params(config, p)
    gpt.params = {name: a.astype(np.float64) for name, a in p.items()}  # compute in float64

    trace = {}
    gpt.forward(np.array([[0, 1, 2, 3]]), trace=trace)  # The chai is hot
    np.testing.assert_allclose(trace["tok_emb"][0], E, atol=DOC)
    np.testing.assert_allclose(trace["x0"][0], X, atol=1e-12)
    np.testing.assert_allclose(trace["h.0.attn.weights"][0, 0], A, atol=DOC)
    np.testing.assert_allclose(trace["h.0.attn.weights"][0, 1], 0.25)  # the silent head: q = 0
    np.testing.assert_allclose(trace["h.0.attn.mix"][0, 0, 1], Z_CHAI, atol=DOC)

    # the rest of the layer, written out from the formulas with the exact Z
    x = trace["x0"][0]
    z = trace["h.0.attn.mix"][0, 0]
    x1 = layernorm(x + np.pad(z, ((0, 0), (0, 2))), 1.0, 0.0)
    ffn = np.maximum(0, x1 @ p["h.0.mlp.c_fc.weight"] + p["h.0.mlp.c_fc.bias"]) @ p["h.0.mlp.c_proj.weight"]
    x2 = layernorm(x1 + ffn + p["h.0.mlp.c_proj.bias"], p["h.0.ln_2.weight"], p["h.0.ln_2.bias"])
    np.testing.assert_allclose(trace["h.0.resid_1"][0, 1, :2], np.array(X[1][:2]) + Z_CHAI, atol=2 * DOC)
    np.testing.assert_allclose(trace["h.0.ln_1"][0], x1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(trace["h.0.ln_2"][0], x2, rtol=1e-12, atol=1e-12)
    assert np.any(trace["h.0.mlp.act"] == 0) and np.all(trace["h.0.mlp.act"] >= 0)  # ReLU did cut
