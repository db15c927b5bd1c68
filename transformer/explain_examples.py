"""The worked examples the project started from, replayed through the library's own ops.

Each `example_*` sets the example's weights by hand (its data: embeddings, W_Q, W_K, W_V, ...),
runs them through `transformer.ops` in float64, and returns an `Explanation` whose steps carry
what the example printed (`_seeded`), each row judged against the exact value (`Printed.verdict`:
agrees, rounded differently, differs). `EXAMPLES` names them for `tk explain --example NAME` and
the page. What it shows stands on its own: every exact value is in its step, and a note that
says where an example went wrong gives the exact numbers there, naming no file a user lacks.

What it deliberately does not do: read a model (transformer/explain.py does), or print.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tokenkit.transformer import ops
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.explanation import Explanation, Step, dim_labels, printed, token_labels


def _seeded(step: Step, texts: dict[int | None, str]) -> Step:
    """Attach what the worked example printed ({row: text}, or {None: text} for a vector) to a step."""
    for r, text in texts.items():
        step.seed[r] = printed(text, step.value if r is None else step.value[r])
    return step


def _attention(qkv: np.ndarray, causal: bool):
    """qkv (T, 3d) one head -> (out (T, d), trace of the library's attention op)."""
    trace: dict[str, np.ndarray] = {}
    out, _ = ops.attention_forward(qkv[None], n_heads=1, causal=causal, trace=trace)
    return out[0], {k: v[0, 0] for k, v in trace.items()}


def example_attention_lookup() -> Explanation:
    """Seed 004: attention as a fuzzy key/value lookup."""
    keys = np.array([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]], dtype=np.float64)
    values = np.array([[1, 0, 1], [10, 0, 2], [100, 5, 0], [1000, 6, 0]], dtype=np.float64)
    queries = np.array([[0, 10, 0], [0, 0, 10], [10, 10, 0]], dtype=np.float64)
    # the library's op is self-attention (as many queries as keys): a zero 4th query fills the
    # slot and is dropped below; it changes nothing for the other rows.
    qkv = np.concatenate([np.vstack([queries, np.zeros(3)]), keys, values], axis=1)
    out, t = _attention(qkv, causal=False)
    kl = [f"k{j + 1} {keys[j].astype(int).tolist()}" for j in range(4)]
    ql = [f"q{j + 1} {queries[j].astype(int).tolist()}" for j in range(3)]
    dims = dim_labels(3)
    steps = [
        Step("keys", "keys", keys, kl, dims, "the table's keys (one per row)"),
        Step("values", "values", values, kl, dims, "the value stored under each key"),
        Step("queries", "queries", queries, ql, dims, "the three queries of the worked example"),
        Step(
            "scores_raw",
            "raw scores q . k",
            t["scores_raw"][:3],
            ql,
            kl,
            "a query 'matches' a key when their dot product is large.",
        ),
        Step(
            "scores",
            "scaled scores q . k / sqrt(3)",
            t["scores"][:3],
            ql,
            kl,
            "the 1/sqrt(d_k) scale; the worked example's answers hold with or without it.",
        ),
        Step(
            "weights",
            "attention weights softmax(scores)",
            t["weights"][:3],
            ql,
            kl,
            "near one-hot: each query picks the key(s) it matches, equally.",
        ),
        _seeded(
            Step(
                "output",
                "output = weights @ values",
                out[:3],
                ql,
                dims,
                "the looked-up value; a blend where two keys match.",
            ),
            {0: "[10, 0, 2]", 1: "[550, 5.5, 0]", 2: "[5.5, 0, 1.5]"},
        ),
    ]
    return Explanation(
        "attention as a fuzzy key/value lookup",
        steps,
        ["'q1'", "'q2'", "'q3'"],
        attention=t["weights"][None, :3],
        notes=[
            "Q, K and V are given directly (no projections); one head, d_k = 3, no mask.",
            "The library's op attends a sequence to itself, so a 4th zero query pads the queries to the 4 keys; "
            "it is not shown.",
        ],
    )


def example_sitting() -> Explanation:
    """Seed 003: self-attention with Q = K = V = X, scaled by sqrt(4) = 2."""
    words = ["The", "cat", "sat", "<end>"]
    X = np.array([[1.0, 0.5, 0.2, 0.1], [0.5, 1.0, 0.3, 0.2], [0.3, 0.2, 1.0, 0.5], [0.1, 0.1, 0.1, 1.0]])
    out, t = _attention(np.concatenate([X, X, X], axis=1), causal=False)
    toks, dims = token_labels([repr(w) for w in words]), dim_labels(4)
    steps = [
        Step(
            "x",
            "input embeddings X (= Q = K = V)",
            X,
            toks,
            dims,
            "no projections: every token is its own query, key and value.",
        ),
        _seeded(
            Step("scores_raw", "raw scores X X^T", t["scores_raw"], toks, toks, "dot products."),
            {0: "[1.30, 1.08, 0.65, 0.27]"},
        ),
        _seeded(
            Step("scores", "scaled scores / sqrt(4)", t["scores"], toks, toks, "divided by sqrt(d_k) = 2."),
            {0: "[0.65, 0.54, 0.325, 0.135]"},
        ),
        _seeded(
            Step("weights", "attention weights softmax(scores)", t["weights"], toks, toks, "each row sums to 1."),
            {0: "[0.311, 0.278, 0.225, 0.186]"},
        ),
        _seeded(
            Step("output", "output = weights @ V", out, toks, dims, "each token's context-aware vector."),
            {0: "[0.537, 0.498, 0.389, 0.386]"},
        ),
    ]
    return Explanation(
        '"The cat sat": self-attention with Q = K = V = X',
        steps,
        [repr(w) for w in words],
        attention=t["weights"][None],
        notes=['One head, d_k = 4, bidirectional (no mask). The example works only row 1 ("The"); all rows are shown.'],
    )


def example_chai() -> Explanation:
    """Seed 001: one post-norm encoder layer on "The chai is hot" (row convention Q = X W^Q)."""
    words = ["The", "chai", "is", "hot"]
    toks = token_labels([repr(w) for w in words])
    E = np.array([[1.0, 0.0, 0.5, 0.2], [0.2, 1.0, 0.8, 0.1], [0.5, 0.3, 1.0, 0.0], [0.1, 0.5, 0.3, 1.0]])
    W_Q = np.array([[1, 0], [0, 1], [0, 0], [0, 0]], dtype=np.float64)
    W_K = np.array([[0, 1], [1, 0], [0, 0], [0, 0]], dtype=np.float64)
    W_V = np.array([[1, 1], [0, 0], [1, 0], [0, 1]], dtype=np.float64)
    pe = ops.sinusoidal_table(4, 4, np.float64)
    x_exact = E + pe
    X = np.round(x_exact, 3)  # the worked example carries on from X rounded to 3 decimals; so do we, to stay comparable
    qkv, _ = ops.linear_forward(X, np.concatenate([W_Q, W_K, W_V], axis=1), None)
    z, t = _attention(qkv, causal=False)
    d4, d2 = dim_labels(4), dim_labels(2)

    # Step 5 needs W_O (d_v = 2 -> d_model = 4), which the worked example leaves as "?": we put Z into the
    # first two dimensions, as its "[1.792, 2.216, ?, ?]" suggests, and LayerNorm with gain 1, bias 0.
    W_O = np.eye(2, 4)
    zo, _ = ops.linear_forward(z, W_O, None)
    r1 = X + zo
    x1, _ = ops.layernorm_forward(r1, np.ones(4), np.zeros(4))
    # Step 6 gives only FFN(x) = max(0, x W1 + b1) W2 + b2: illustrative W1 = [I | -I] (d_ff = 8)
    # splits x into its positive and negative parts, and W2 = [I; 0] keeps the positive part.
    W1, b1 = np.hstack([np.eye(4), -np.eye(4)]), np.zeros(8)
    W2, b2 = np.vstack([np.eye(4), np.zeros((4, 4))]), np.zeros(4)
    pre, _ = ops.linear_forward(x1, W1, b1)
    act, _ = ops.relu_forward(pre)
    ffn, _ = ops.linear_forward(act, W2, b2)
    r2 = x1 + ffn
    x2, _ = ops.layernorm_forward(r2, np.ones(4), np.zeros(4))

    PE_PRINTED = [
        "[0.000, 1.000, 0.000, 1.000]",
        "[0.841, 0.540, 0.010, 1.000]",
        "[0.909, −0.416, 0.020, 1.000]",
        "[0.141, −0.990, 0.030, 1.000]",
    ]
    X_PRINTED = [
        "[1.000, 1.000, 0.500, 1.200]",
        "[1.041, 1.540, 0.810, 1.100]",
        "[1.409, −0.116, 1.020, 1.000]",
        "[0.241, −0.490, 0.330, 2.000]",
    ]
    h8 = dim_labels(8, "h")
    steps = [
        Step("tok_emb", "word embeddings e", E, toks, d4, "given by the worked example."),
        _seeded(
            Step(
                "pos_emb",
                "sinusoidal positional encodings PE (d_model = 4)",
                pe,
                toks,
                d4,
                "PE[p, 2i] = sin(p / 10000^(2i/4)), PE[p, 2i+1] = cos(p / 10000^(2i/4)).",
            ),
            dict(enumerate(PE_PRINTED)),
        ),  # fmt: skip
        Step("x_exact", "X = e + PE (exact)", x_exact, toks, d4, ""),
        _seeded(
            Step(
                "x",
                "X rounded to 3 decimals, as the worked example carries it on",
                X,
                toks,
                d4,
                "the worked example's later numbers (and the exact ones here) are computed from this rounded X.",
            ),
            dict(enumerate(X_PRINTED)),
        ),  # fmt: skip
        Step("W_Q", "W^Q", W_Q, d4, d2, "given by the worked example"),
        Step("W_K", "W^K", W_K, d4, d2, ""),
        Step("W_V", "W^V", W_V, d4, d2, ""),
        _seeded(
            Step("q", "Q = X W^Q", t["q"], toks, d2, ""),
            {0: "[1.000, 1.000]", 1: "[1.041, 1.540]", 2: "[1.409, −0.116]", 3: "[0.241, −0.490]"},
        ),  # fmt: skip
        _seeded(
            Step("k", "K = X W^K", t["k"], toks, d2, ""),
            {0: "[1.000, 1.000]", 1: "[1.540, 1.041]", 2: "[−0.116, 1.409]", 3: "[−0.490, 0.241]"},
        ),  # fmt: skip
        _seeded(
            Step("v", "V = X W^V", t["v"], toks, d2, ""),
            {0: "[1.500, 2.200]", 1: "[1.851, 2.141]", 2: "[2.429, 2.409]", 3: "[0.571, 2.241]"},
        ),  # fmt: skip
        _seeded(
            Step("scores_raw", "raw scores Q K^T", t["scores_raw"], toks, toks, "row = query, column = key."),
            {
                0: "[2.000, 2.581, 1.293, −0.249]",
                1: "[2.581, 3.210, 2.046, 0.258]",
                2: "[1.293, 2.049, −0.332, −0.717]",
                3: "[−0.249, 0.260, −0.719, −0.236]",
            },
        ),  # fmt: skip
        _seeded(
            Step(
                "scores",
                "scaled scores Q K^T / sqrt(2)",
                t["scores"],
                toks,
                toks,
                "d_k = 2; no mask (an encoder sees both directions).",
            ),
            {
                0: "[1.414, 1.826, 0.914, −0.176]",
                1: "[1.826, 2.270, 1.447, 0.182]",
                2: "[0.914, 1.449, −0.235, −0.507]",
                3: "[−0.176, 0.184, −0.509, −0.167]",
            },
        ),  # fmt: skip
        _seeded(
            Step(
                "weights",
                "attention weights A = softmax(scaled scores)",
                t["weights"],
                toks,
                toks,
                "each row sums to 1.",
            ),
            {
                0: "[0.330, 0.506, 0.199, 0.065]",
                1: "[0.291, 0.454, 0.199, 0.056]",
                2: "[0.296, 0.503, 0.095, 0.106]",
                3: "[0.218, 0.314, 0.153, 0.215]",
            },
        ),  # fmt: skip
        _seeded(
            Step("z", "Z = A V", z, toks, d2, 'the worked example works out row "chai" only.'), {1: "[1.792, 2.216]"}
        ),
        Step(
            "W_O",
            "W_O (assumed: the worked example leaves it undefined)",
            W_O,
            d2,
            d4,
            'puts Z into dimensions 0-1 of the residual stream (the worked example\'s "[1.792, 2.216, ?, ?]").',
        ),  # fmt: skip
        Step("resid_1", "residual X + Z W_O", r1, toks, d4, ""),
        Step(
            "ln_1",
            "X' = LayerNorm(X + Z W_O)",
            x1,
            toks,
            d4,
            "mean 0, variance 1 per row (eps 1e-5); "
            "gain 1 and bias 0 assumed (the worked example names learned gamma, beta without values).",
        ),  # fmt: skip
        Step(
            "W_1",
            "W_1 (illustrative: the worked example gives no FFN weights)",
            W1,
            d4,
            h8,
            "[I | -I], d_ff = 8, b_1 = 0.",
        ),
        Step("mlp.pre", "x' W_1 + b_1", pre, toks, h8, ""),
        Step("mlp.act", "max(0, x' W_1 + b_1)  (ReLU)", act, toks, h8, "ReLU zeroes the negative entries."),
        Step("W_2", "W_2 (illustrative)", W2, h8, d4, "[I; 0], b_2 = 0: keeps the positive part of x'."),
        Step("mlp.out", "FFN(x') = max(0, x' W_1 + b_1) W_2 + b_2", ffn, toks, d4, ""),
        Step("resid_2", "residual X' + FFN(X')", r2, toks, d4, ""),
        Step("ln_2", "layer output LayerNorm(X' + FFN(X'))", x2, toks, d4, "gain 1, bias 0 assumed."),
    ]
    return Explanation(
        'one encoder layer on "The chai is hot"',
        steps,
        [repr(w) for w in words],
        attention=t["weights"][None],
        notes=[
            "d_model = 4, one head with d_k = d_v = 2, bidirectional, post-norm, ReLU feed-forward; "
            "row convention Q = X W^Q.",
            "Given by the example: e, PE's formula, W^Q, W^K, W^V. It leaves W_O (\"?\"), LayerNorm's gamma and beta, "
            "and the FFN's W_1, b_1, W_2, b_2 undefined.",
            "From W_O on, the weights are our stated assumptions (W_O, gamma = 1, beta = 0) "
            "or illustrative (W_1, W_2), marked in each step's title.",
        ],
    )


def example_one_layer() -> Explanation:
    """Seed 000: one attention layer, column convention (x is a column, v = W_V x), d_head = 2."""
    W_E = np.array([
        [1, -1, 0, 1, -1, 0, 1, -1, 0, 1],
        [-1, 0, 1, -1, 0, 1, -1, 0, 1, -1],
        [0, 1, -1, 0, 1, -1, 0, 1, -1, 0],
        [1, 0, -1, 1, 0, -1, 1, 0, -1, 1],
        [-1, 1, 0, -1, 1, 0, -1, 1, 0, -1],
    ], dtype=np.float64)  # fmt: skip
    W = np.array([[0.1, 0.2, 0.3, 0.4, 0.5], [0.2, 0.3, 0.4, 0.5, 0.6]])  # W_Q = W_K = W_V (d_head, d_model)
    W_O = np.array([[0.1, 0.2], [0.2, 0.3], [0.3, 0.4], [0.4, 0.5], [0.5, 0.6]])  # (d_model, d_head)
    words = ["t1", "t2", "t3"]
    toks = token_labels([repr(w) for w in words])
    # column convention x = W_E t is row convention x = t W_E^T: the library's (V, C) table is W_E^T
    x, _ = ops.embedding_forward(np.arange(3), W_E.T)  # (3, 5)
    qkv, _ = ops.linear_forward(x, np.concatenate([W.T, W.T, W.T], axis=1), None)
    r, t = _attention(qkv, causal=True)
    o, _ = ops.linear_forward(r, W_O.T, None)
    x1 = x + o
    d5, d2 = dim_labels(5), dim_labels(2)
    steps = [
        Step(
            "W_E",
            "embedding matrix W_E (d_model x d_vocab)",
            W_E,
            d5,
            dim_labels(10, "v"),
            "column convention: x_i = W_E t_i.",
        ),
        _seeded(
            Step("x", "x(0) = W_E t (tokens 0, 1, 2 one-hot)", x, toks, d5, ""),
            {0: "[1, -1, 0, 1, -1]", 1: "[-1, 0, 1, 0, 1]", 2: "[0, 1, -1, -1, 0]"},
        ),  # fmt: skip
        Step("W_V", "W_V = W_K = W_Q (d_head x d_model)", W, d2, d5, ""),
        _seeded(
            Step(
                "v",
                "v_i = W_V x_i",
                t["v"],
                toks,
                d2,
                "the worked example writes v as [0.1, 0.2] . x (W_V's first column) and its results are not W_V x; "
                "the exact products are these.",
            ),
            {0: "[-0.1, -0.1]", 1: "[0.1, 0.4]", 2: "[-0.1, -0.2]"},
        ),  # fmt: skip
        _seeded(
            Step("k", "k_i = W_K x_i", t["k"], toks, d2, "equal to v (same matrix)."),
            {0: "[-0.1, -0.1]", 1: "[0.1, 0.4]", 2: "[-0.1, -0.2]"},
        ),  # fmt: skip
        _seeded(Step("q", "q_i = W_Q x_i", t["q"], toks, d2, "the worked example uses q_3 only."), {2: "[-0.1, -0.2]"}),
        Step("scores_raw", "raw scores q_i . k_j", t["scores_raw"], toks, toks, ""),
        _seeded(
            Step(
                "scores",
                "scaled scores a = q . k / sqrt(2), causal",
                t["scores"],
                toks,
                toks,
                "causal: -inf where the key comes after the query. Row t3 is the worked example's a_1..a_3.",
            ),
            {2: "[0.021, -0.064, 0.035]"},
        ),  # fmt: skip
        _seeded(
            Step("weights", "attention weights w = softmax(a)", t["weights"], toks, toks, "each row sums to 1."),
            {2: "[0.34, 0.31, 0.35]"},
        ),  # fmt: skip
        _seeded(Step("r", "r = sum_j w_j v_j", r, toks, d2, ""), {2: "[-0.038, 0.02]"}),
        Step("W_O", "W_O (d_model x d_head)", W_O, d5, d2, ""),
        _seeded(Step("o", "o = W_O r", o, toks, d5, ""), {2: "[-0.0038, -0.0056, -0.0074, -0.0092, -0.011]"}),
        _seeded(
            Step("x1", "x(1) = x(0) + o  (residual)", x1, toks, d5, ""),
            {2: "[-0.0038, 0.9944, -1.0074, -1.0092, -0.011]"},
        ),  # fmt: skip
    ]
    return Explanation(
        "a one-layer toy (column convention, d_head = 2)",
        steps,
        [repr(w) for w in words],
        attention=t["weights"][None],
        notes=[
            "n = 3, d_vocab = 10, d_model = 5, d_head = 2; causal; the worked example follows token 3 (row t3).",
            "Column convention v = W_V x is computed as the library's row convention x W_V^T: same numbers.",
            "The example's arithmetic goes wrong from v on (its v = [0.1, 0.2] . x is not W_V x) and carries "
            "through; each step shows the exact value, the example's print beside it. For token 3, exactly: "
            "v_3 = [-0.5, -0.6], a = [0.1556, -0.5869, 0.4313], w = [0.3580, 0.1704, 0.4716], "
            "r = [-0.1882, -0.2183], x(1) = [-0.0625, 0.8969, -1.1438, -1.1844, -0.2250].",
        ],
    )


EXAMPLES: dict[str, tuple[str, Callable[[], Explanation]]] = {
    "attention-lookup": ("attention as a fuzzy key/value lookup", example_attention_lookup),
    "sitting": ('"The cat sat": Q = K = V = X, scaled by sqrt(4)', example_sitting),
    "chai": ('one encoder layer on "The chai is hot"', example_chai),
    "one-layer": ("a one-layer toy with d_head = 2 and W_O", example_one_layer),
}


def explain_example(name: str) -> Explanation:
    """A worked example by name (see EXAMPLES)."""
    if name not in EXAMPLES:
        raise ModelError(f"unknown example {name!r}; choose one of: {', '.join(EXAMPLES)}")
    return EXAMPLES[name][1]()
