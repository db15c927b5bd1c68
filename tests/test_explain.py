"""`tk explain`: the seeds' toy examples against ERRATA's exact values (in the JSON and in the
printed tables), and a real model's trace against the model's own forward pass and a naive
attention written out here. Expected example values are copied from ../shared/seeds/ERRATA.md."""

import json
import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.pipeline.checkpoint import save_model
from tokenkit.transformer import GPT, GPTConfig, ModelError
from tokenkit.transformer.config import llama_config
from tokenkit.transformer.explain import explain_model
from tokenkit.transformer.explain_examples import EXAMPLES, explain_example
from tokenkit.transformer.explanation import parse_printed

TEXT = "Once upon a time, a shy fox found a red ball."


def run(capsys, *argv):
    code = main(["explain", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def steps_of(doc):
    return {s["key"]: s for s in doc["steps"]}


def value(step):
    """A JSON step's value as an array, null (masked) back to -inf."""
    return np.array([[-np.inf if x is None else x for x in row] for row in step["value"]], dtype=float)


def row_numbers(text, title, label, n):
    """The first n numbers printed on row `label` of the table headed `-- title`."""
    section = text.split(f"-- {title}", 1)[1].split("\n\n", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith(label + " "))
    return line[len(label) :].split()[:n]


def fmt(xs, precision):
    return [f"{x:.{precision}f}" for x in xs]


# ----------------------------------------------------------------------------- seed examples

# name -> (precision, [(step key, step title, row, ERRATA values)])
ERRATA = {
    "one-layer": (6, [
        ("v", "v_i = W_V x_i", 0, [-0.2, -0.2]),
        ("v", "v_i = W_V x_i", 1, [0.7, 0.8]),
        ("v", "v_i = W_V x_i", 2, [-0.5, -0.6]),
        ("q", "q_i = W_Q x_i", 2, [-0.5, -0.6]),
        ("scores", "scaled scores a = q . k / sqrt(2), causal", 2, [0.155563, -0.586899, 0.431335]),
        ("weights", "attention weights w = softmax(a)", 2, [0.357975, 0.170375, 0.471649]),
        ("r", "r = sum_j w_j v_j", 2, [-0.188157, -0.218285]),
        ("o", "o = W_O r", 2, [-0.062473, -0.103117, -0.143761, -0.184405, -0.225049]),
        ("x1", "x(1) = x(0) + o  (residual)", 2, [-0.062473, 0.896883, -1.143761, -1.184405, -0.225049]),
    ]),
    "chai": (3, [
        ("weights", "attention weights A = softmax(scaled scores)", 0, [0.301, 0.454, 0.183, 0.061]),
        ("weights", "attention weights A = softmax(scaled scores)", 1, [0.295, 0.459, 0.203, 0.043]),
        ("weights", "attention weights A = softmax(scaled scores)", 2, [0.306, 0.523, 0.097, 0.074]),
        ("weights", "attention weights A = softmax(scaled scores)", 3, [0.263, 0.284, 0.188, 0.265]),
        ("z", "Z = A V", 1, [1.809, 2.217]),
    ]),
    "sitting": (3, [
        ("weights", "attention weights softmax(scores)", 0, [0.311, 0.279, 0.225, 0.186]),
        ("output", "output = weights @ V", 0, [0.536, 0.498, 0.389, 0.385]),
    ]),
    "attention-lookup": (3, [
        ("output", "output = weights @ values", 0, [10, 0, 2]),
        ("output", "output = weights @ values", 1, [550, 5.5, 0]),
        ("output", "output = weights @ values", 2, [5.5, 0, 1.5]),
    ]),
}  # fmt: skip


def test_every_example_is_checked_against_errata():
    assert set(ERRATA) == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(ERRATA))
def test_example_numbers_equal_errata_in_json_and_in_text(capsys, name):
    precision, checks = ERRATA[name]
    code, out, err = run(capsys, "--example", name, "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    steps = steps_of(doc)
    code, text, _ = run(capsys, "--example", name, "--precision", str(precision))
    assert code == 0
    for key, title, row, expected in checks:
        got = value(steps[key])[row]
        tol = 0.5 * 10.0**-precision + 1e-12  # ERRATA prints the exact value rounded
        assert np.max(np.abs(got - expected)) <= tol, (name, key, row, got, expected)
        label = steps[key]["rows"][row]
        assert row_numbers(text, title, label, len(expected)) == fmt(expected, precision), (name, key, row)


@pytest.mark.parametrize("name", sorted(ERRATA))
def test_example_attention_rows_sum_to_one(capsys, name):
    doc = json.loads(run(capsys, "--example", name, "--json")[1])
    w = value(steps_of(doc)["weights"])
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(w >= 0)


def test_wrong_printed_values_are_annotated_with_the_seeds_text(capsys):
    _, text, _ = run(capsys, "--example", "chai", "--precision", "3")
    assert "example printed [0.291, 0.454, 0.199, 0.056] (differs; exact at left)" in text  # row "chai"
    assert "example printed [1.792, 2.216] (differs; exact at left)" in text  # Z, row "chai"
    _, text, _ = run(capsys, "--example", "one-layer", "--precision", "6")
    assert "example printed [0.34, 0.31, 0.35] (differs; exact at left)" in text
    doc = json.loads(run(capsys, "--example", "one-layer", "--json")[1])
    v = steps_of(doc)["v"]["example_printed"]
    assert [p["text"] for p in v] == ["[-0.1, -0.1]", "[0.1, 0.4]", "[-0.1, -0.2]"]
    assert not any(p["agrees"] for p in v)


def test_seed_values_that_are_right_are_marked_as_agreeing():
    """The seeds' correct prints (ERRATA: 001's PE, X, Q, K, V; 004's answers) agree."""
    chai = explain_example("chai")
    for key in ("pos_emb", "x", "q", "k", "v"):
        assert chai.step(key).seed and all(p.agrees for p in chai.step(key).seed.values()), key
    assert all(p.agrees for p in explain_example("attention-lookup").step("output").seed.values())


@given(st.lists(st.tuples(st.integers(-9999, 9999), st.integers(0, 4)), min_size=1, max_size=6))
def test_parse_printed_reads_numbers_and_their_decimals(numbers):
    texts = [f"{n / 10**d:.{d}f}".replace("-", "−") for n, d in numbers]
    parsed = parse_printed("[" + ", ".join(texts) + "]")
    assert parsed == [(float(t.replace("−", "-")), d) for t, (_, d) in zip(texts, numbers, strict=True)]


def test_chai_states_what_the_example_leaves_undefined(capsys):
    _, text, _ = run(capsys, "--example", "chai")
    assert "W_O (assumed: the worked example leaves it undefined)" in text
    assert "W_1 (illustrative: the worked example gives no FFN weights)" in text
    assert "gamma" in text and "undefined" in text


def test_unknown_example_is_one_line_listing_the_names(capsys):
    code, out, err = run(capsys, "--example", "nope")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert all(name in err for name in EXAMPLES)
    main(["explain", "--help"])
    help_text = capsys.readouterr().out
    assert all(name in help_text for name in EXAMPLES)


# ----------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small random model with its tokenizer, saved the way the pipeline saves it."""
    tok = Tokenizer.train([TEXT.encode() * 20], vocab_size=280, min_frequency=2, workers=1, quiet=True)
    config = GPTConfig(vocab_size=tok.vocab_size, context_length=64, d_model=24, n_layers=2, n_heads=3)
    model = GPT(config, seed=3)
    path = tmp_path_factory.mktemp("explain") / "model.safetensors"
    save_model(
        path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
    )
    return path, model, tok


def naive_attention_weights(q, k, causal):
    """softmax(q k^T / sqrt(d) + mask) row by row, written out."""
    T, d = q.shape
    w = np.zeros((T, T))
    for i in range(T):
        keys = range(i + 1) if causal else range(T)
        s = [sum(q[i, c] * k[j, c] for c in range(d)) / math.sqrt(d) for j in keys]
        e = [math.exp(x - max(s)) for x in s]
        for j, x in zip(keys, e, strict=True):
            w[i, j] = x / sum(e)
    return w


def test_model_trace_equals_the_models_forward_pass(capsys, saved):
    path, model, tok = saved
    ids = tok.encode(TEXT)
    code, out, err = run(capsys, "-m", str(path), TEXT, "--layer", "1", "--head", "2", "--top-k", "7", "--json")
    assert code == 0, err
    doc = json.loads(out)
    steps = steps_of(doc)
    assert [t["id"] for t in doc["tokens"]] == ids
    assert b"".join(bytes.fromhex(t["bytes"]) for t in doc["tokens"]) == TEXT.encode()

    trace = {}
    logits = model.forward(np.array(ids)).astype(np.float64)[0]
    model.forward(np.array(ids), trace=trace)
    # the logits: exactly the model's own (float32 values survive JSON exactly)
    np.testing.assert_array_equal(steps["logits"]["value"], logits[-1])
    probs = np.exp(logits[-1] - logits[-1].max())
    probs /= probs.sum()
    best = np.argsort(-probs, kind="stable")[:7]
    assert [c["id"] for c in doc["top"]] == best.tolist()
    # bpe/show.py's one spelling: text, a byte that is part of a character as \xNN
    assert [c["token"] for c in doc["top"]] == [tok.decode_bytes([i]).decode("utf-8", "backslashreplace") for i in best]
    np.testing.assert_allclose([c["probability"] for c in doc["top"]], probs[best], rtol=1e-12)

    # attention: the chosen head's, every head's, and a naive recomputation from Q and K
    np.testing.assert_array_equal(value(steps["h.1.attn.weights"]), trace["h.1.attn.weights"][0, 2])
    np.testing.assert_array_equal(np.array(doc["attention_all_heads"]), trace["h.1.attn.weights"][0])
    q, k = value(steps["h.1.attn.q"]), value(steps["h.1.attn.k"])
    w = value(steps["h.1.attn.weights"])
    np.testing.assert_allclose(w, naive_attention_weights(q, k, causal=True), atol=1e-6)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-6)
    scores = steps["h.1.attn.scores"]["value"]
    assert all(scores[i][j] is None for i in range(len(ids)) for j in range(i + 1, len(ids)))  # masked: null

    # the steps before and after: embeddings, residuals, MLP
    np.testing.assert_array_equal(value(steps["tok_emb"]), model.params["wte.weight"][ids])
    np.testing.assert_allclose(value(steps["x0"]), value(steps["tok_emb"]) + value(steps["pos_emb"]), atol=1e-7)
    np.testing.assert_array_equal(value(steps["layer_input"]), trace["h.0.resid_2"][0])
    np.testing.assert_allclose(
        value(steps["h.1.resid_1"]), value(steps["layer_input"]) + value(steps["h.1.attn.out"]), atol=1e-6
    )
    np.testing.assert_allclose(
        value(steps["h.1.resid_2"]), value(steps["h.1.resid_1"]) + value(steps["h.1.mlp.out"]), atol=1e-6
    )


@settings(max_examples=12, deadline=None)
@given(layer=st.integers(0, 1), head=st.integers(0, 2), text=st.text("abc fox.", min_size=1, max_size=20))
def test_any_layer_and_head_matches_naive_attention(saved, layer, head, text):
    _, model, tok = saved
    ids = tok.encode(text)
    expl = explain_model(model, ids, [repr(str(i)) for i in ids], layer=layer, head=head)
    trace = {}
    model.forward(np.array(ids), trace=trace)
    w = expl.step(f"h.{layer}.attn.weights").value
    np.testing.assert_array_equal(w, trace[f"h.{layer}.attn.weights"][0, head])
    q, k = expl.step(f"h.{layer}.attn.q").value, expl.step(f"h.{layer}.attn.k").value
    np.testing.assert_allclose(w, naive_attention_weights(q, k, causal=True), atol=1e-6)


def test_model_text_shows_tokens_tables_and_candidates(capsys, saved):
    path, _, tok = saved
    ids = tok.encode(TEXT)
    code, text, _ = run(capsys, "-m", str(path), TEXT, "--precision", "2")
    assert code == 0
    assert f"-- tokens  [{len(ids)}]" in text
    for title in ("token embeddings", "positional encodings", "Q, head 0", "K, head 0", "V, head 0", "raw scores",
                  "scaled scores", "attention weights", "weighted sum", "output projection", "residual",
                  "LayerNorm", "MLP hidden", "MLP output", "top 5 next-token candidates"):  # fmt: skip
        assert f"-- {title}" in text, title
    assert "--full for all" in text  # 24 columns: a corner
    assert " 1.00\n" in text  # a "row sum" cell at precision 2
    code, full, _ = run(capsys, "-m", str(path), TEXT, "--full")
    assert "--full for all" not in full
    assert len(full) > len(text)


@pytest.mark.parametrize(
    "flag,value_,message",
    [
        ("--layer", "2", "layer 2 does not exist"),
        ("--head", "3", "head 3 does not exist"),
        ("--layer", "-1", "layer -1 does not exist"),
    ],
)
def test_bad_layer_or_head_is_one_line_exit_1(capsys, saved, flag, value_, message):
    code, out, err = run(capsys, "-m", str(saved[0]), TEXT, flag, value_)
    assert code == 1 and out == ""
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_the_heads_shares_of_the_projection_add_up_to_its_output(saved):
    _, model, tok = saved
    ids = tok.encode(TEXT)
    shown = [repr(str(i)) for i in ids]
    shares = [explain_model(model, ids, shown, layer=1, head=h).step("h.1.attn.head_out").value for h in range(3)]
    out = explain_model(model, ids, shown, layer=1).step("h.1.attn.out").value
    np.testing.assert_allclose(sum(shares) + model.params["h.1.attn.c_proj.bias"], out, atol=1e-6)


def test_post_norm_bidirectional_sinusoidal_model_is_explained_in_its_own_order():
    config = GPTConfig(vocab_size=40, context_length=8, d_model=8, n_layers=2, n_heads=2,
                       positional="sinusoidal", activation="relu", norm="post", causal=False)  # fmt: skip
    model = GPT(config, seed=5)
    ids = [3, 1, 4, 1, 5]
    expl = explain_model(model, ids, [repr(str(i)) for i in ids], layer=1, head=1, top_k=3)
    trace = {}
    logits = model.forward(np.array(ids), trace=trace)
    keys = [s.key for s in expl.steps]
    assert keys.index("h.1.attn.out") < keys.index("h.1.resid_1") < keys.index("h.1.ln_1") < keys.index("h.1.mlp.pre")
    assert keys.index("h.1.resid_2") < keys.index("h.1.ln_2")
    np.testing.assert_array_equal(expl.step("layer_input").value, trace["h.0.ln_2"][0])  # post-norm: the last LN
    w = expl.step("h.1.attn.weights").value
    assert np.all(w > 0)  # bidirectional: nothing masked
    q, k = expl.step("h.1.attn.q").value, expl.step("h.1.attn.k").value
    np.testing.assert_allclose(w, naive_attention_weights(q, k, causal=False), atol=1e-6)
    np.testing.assert_array_equal(expl.step("pos_emb").value, trace["pos_emb"])
    np.testing.assert_array_equal(expl.step("logits").value, logits[0, -1])
    assert "MLP hidden after RELU" in [s.title for s in expl.steps]


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_llama_style_model_is_explained(n_kv_heads):
    """Rotary positions (no pos_emb step; q and k rotated), RMSNorm, SwiGLU's [gate | up] width,
    grouped-query heads (k and v as the chosen query head sees them), an untied lm_head."""
    config = llama_config(vocab_size=40, context_length=8, d_model=16, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads)
    model = GPT(config, seed=5)
    ids = [3, 1, 4, 1, 5]
    shown = [repr(str(i)) for i in ids]
    expl = explain_model(model, ids, shown, layer=1, head=3, top_k=3)
    trace = {}
    logits = model.forward(np.array(ids), trace=trace)
    keys = [s.key for s in expl.steps]
    assert "pos_emb" not in keys and keys[:2] == ["tok_emb", "x0"]
    w = expl.step("h.1.attn.weights").value
    q, k = expl.step("h.1.attn.q").value, expl.step("h.1.attn.k").value
    np.testing.assert_allclose(w, naive_attention_weights(q, k, causal=True), atol=1e-6)
    np.testing.assert_array_equal(k, trace["h.1.attn.k"][0, 3])
    assert expl.step("h.1.attn.k").note.startswith(f"K/V head {3 // (4 // n_kv_heads)}") == (n_kv_heads != 4)
    assert expl.step("h.1.mlp.pre").value.shape == (5, 2 * config.hidden)
    assert expl.step("h.1.mlp.act").value.shape == (5, config.hidden)
    titles = [s.title for s in expl.steps]
    assert "RMSNorm ln_1 (the attention's input)" in titles and "final RMSNorm ln_f (all layers done)" in titles
    np.testing.assert_array_equal(expl.step("logits").value, logits[0, -1])
    assert "lm_head" in expl.step("logits").note
    shares = [explain_model(model, ids, shown, layer=1, head=h).step("h.1.attn.head_out").value for h in range(4)]
    np.testing.assert_allclose(sum(shares), expl.step("h.1.attn.out").value, atol=1e-6)


def test_llama_steps_are_numpy_recomputed_from_the_params():
    """RoPE (q, k before and after, the angles), RMSNorm's rms and x / rms, SwiGLU's silu(gate) * up
    and the GQA note, each against plain float64 NumPy from the params and the step before."""
    config = llama_config(vocab_size=40, context_length=8, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2)
    model = GPT(config, seed=7)
    ids = [3, 1, 4, 1, 5, 9]
    expl = explain_model(model, ids, [repr(str(i)) for i in ids], layer=1, head=3)
    v = lambda key: expl.step(key).value  # noqa: E731
    p = {name: np.asarray(a, dtype=np.float64) for name, a in model.params.items()}
    T, hd, C = len(ids), config.head_dim, config.d_model
    x = v("layer_input")  # resid_2 of layer 0
    rms = np.sqrt((x**2).mean(-1, keepdims=True) + config.norm_eps)
    np.testing.assert_allclose(v("h.1.ln_1.rms"), rms, rtol=1e-12)
    np.testing.assert_allclose(v("h.1.ln_1.scaled"), x / rms, rtol=1e-12)
    np.testing.assert_array_equal(v("h.1.ln_1.gain"), p["h.1.ln_1.weight"])
    a = x / rms * p["h.1.ln_1.weight"]
    np.testing.assert_allclose(v("h.1.ln_1"), a, atol=1e-5)
    # head 3 is in group 1 (heads 2, 3) of 2 K/V heads: q columns 3 hd.., k columns C + 1 hd..
    w = p["h.1.attn.c_attn.weight"]
    q_pre, k_pre = a @ w[:, 3 * hd : 4 * hd], a @ w[:, C + hd : C + 2 * hd]
    np.testing.assert_allclose(v("h.1.attn.q_pre"), q_pre, atol=1e-5)
    np.testing.assert_allclose(v("h.1.attn.k_pre"), k_pre, atol=1e-5)
    angle = np.arange(T)[:, None] * config.rope_theta ** (-np.arange(hd // 2) * 2 / hd)
    np.testing.assert_allclose(v("rope_angle"), angle, rtol=1e-12)
    cos, sin = np.cos(angle), np.sin(angle)

    def rotate(z):
        z1, z2 = z[:, : hd // 2], z[:, hd // 2 :]
        return np.concatenate([z1 * cos - z2 * sin, z2 * cos + z1 * sin], axis=1)

    np.testing.assert_allclose(v("h.1.attn.q"), rotate(q_pre), atol=1e-5)
    np.testing.assert_allclose(v("h.1.attn.k"), rotate(k_pre), atol=1e-5)
    assert "head 3 reads K/V head 1, shared with heads 2 and 3." in expl.step("h.1.attn.q_pre").note
    assert expl.step("h.1.attn.k").title == "K rotated (RoPE), K/V head 1 (read by query head 3)"
    assert expl.step("h.1.attn.v").title.startswith("V, K/V head 1")
    m = v("h.1.ln_2")
    gate, up = m @ p["h.1.mlp.c_fc.weight"][:, : config.hidden], m @ p["h.1.mlp.c_fc.weight"][:, config.hidden :]
    np.testing.assert_allclose(v("h.1.mlp.gate"), gate, atol=1e-5)
    np.testing.assert_allclose(v("h.1.mlp.up"), up, atol=1e-5)
    silu = gate / (1 + np.exp(-gate))
    np.testing.assert_allclose(v("h.1.mlp.silu_gate"), silu, atol=1e-5)
    np.testing.assert_allclose(v("h.1.mlp.act"), silu * up, atol=1e-5)
    np.testing.assert_allclose(v("h.1.ln_2.rms"), np.sqrt((v("h.1.resid_1") ** 2).mean(-1, keepdims=True) + 1e-5))
    # --query keeps every key's rotated and unrotated k and the angles whole, the query's rows only elsewhere
    doc = expl.to_dict(query=2)
    steps = {s["key"]: s["value"] for s in doc["steps"]}
    assert all(row is not None for row in steps["h.1.attn.k_pre"] + steps["rope_angle"])
    assert [row is None for row in steps["h.1.attn.q_pre"]] == [t != 2 for t in range(T)]


def test_scaled_rope_steps_show_the_scaled_angles_and_say_so():
    """With Llama 3.1's RoPE scaling the angles are the positions times the scaled frequencies
    (the plain loop's), q is rotated by them, and the step and the model view name the scaling."""
    from tokenkit.pipeline import views
    from tokenkit.transformer import reference

    scaling = dict(type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=4)
    config = llama_config(vocab_size=40, context_length=8, d_model=16, n_layers=1, n_heads=2, rope_theta=100.0,
                          rope_scaling=scaling)  # fmt: skip
    model = GPT(config, seed=7)
    ids = [3, 1, 4, 1, 5, 9]
    expl = explain_model(model, ids, [repr(str(i)) for i in ids], layer=0, head=1)
    angle = np.arange(len(ids))[:, None] * np.array(reference.rope_inv_freq(8, 100.0, config.rope_scaling))
    assert not np.allclose(angle[1], 100.0 ** (-np.arange(4) * 2 / 8))  # the premise: scaled angles differ
    np.testing.assert_allclose(expl.step("rope_angle").value, angle, rtol=1e-12)
    q_pre, cos, sin = expl.step("h.0.attn.q_pre").value, np.cos(angle), np.sin(angle)
    rotated = np.concatenate([q_pre[:, :4] * cos - q_pre[:, 4:] * sin, q_pre[:, 4:] * cos + q_pre[:, :4] * sin], 1)
    np.testing.assert_allclose(expl.step("h.0.attn.q").value, rotated, atol=1e-5)
    step = expl.step("rope_angle")
    assert step.title == "rotation angles position * inv_freq (theta 100, llama3 scaling)"
    assert "then llama3 scaling: frequencies of wavelengths over 4 positions divided by 4, under 1 kept" in step.note
    rope = next(b for b in views.model_view(config, model.params)["blocks"] if b["name"] == "rope")
    assert "(theta 100; llama3 scaling: frequencies of wavelengths over 4 positions" in rope["what"]


def test_text_longer_than_the_context_is_cut_with_one_line(capsys, saved):
    path, model, _ = saved  # every command and view alike: tests/test_long_texts.py
    code, out, err = run(capsys, "-m", str(path), "fox " * (model.config.context_length + 1))
    assert code == 0 and out and err.count("\n") == 1
    assert "longer than the model's context of 64; using its last 64" in err


def test_explain_model_rejects_bad_arguments(saved):
    _, model, _ = saved
    with pytest.raises(ModelError, match="top-k"):
        explain_model(model, [1, 2], ["a", "b"], top_k=0)
    with pytest.raises(ModelError, match="one label per id"):
        explain_model(model, [1, 2], ["a"])


# ----------------------------------------------------------------------------- plots


def count_panels(png_path):
    """Heatmap panels side by side: runs of saturated (viridis) pixels along the row that has most."""
    image = pytest.importorskip("matplotlib.image").imread(png_path)[..., :3]
    colourful = (image.max(axis=-1) - image.min(axis=-1)) > 0.15  # text, axes, background are grey
    best = 0
    for row in colourful:
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(int), [0]])))
        runs = edges[1::2] - edges[::2]
        best = max(best, int(np.sum(runs >= 20)))
    return best


@pytest.mark.parametrize("use_example", [False, True])
def test_plot_is_a_png_with_one_panel_per_head(capsys, saved, tmp_path, use_example):
    pytest.importorskip("matplotlib")
    png = tmp_path / "attention.png"
    argv = ["--example", "chai"] if use_example else ["-m", str(saved[0]), TEXT, "--layer", "1"]
    code, out, err = run(capsys, *argv, "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert count_panels(png) == (1 if use_example else saved[1].config.n_heads)
    assert [p.name for p in tmp_path.iterdir()] == ["attention.png"]  # no temp file left


def test_plot_without_matplotlib_says_how_to_install_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    png = tmp_path / "attention.png"
    code, out, err = run(capsys, "--example", "sitting", "--plot", str(png))
    assert code == 1 and out == ""
    assert err == "error: --plot needs matplotlib: pip install 'tokenkit[plot]'\n"
    assert not png.exists()
