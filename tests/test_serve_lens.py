"""`tk serve`'s /api/lens and /api/attribution at the HTTP level (no browser): their numbers are
`tk explain --json`'s `lens` and `attribution` (transformer/lens.py, transformer/attribution.py),
the lens's probabilities are a plain softmax of each boundary's logits, the shares sum to the
logit, and bad input is a one-line 4xx before any work. The page that draws them is
tests/test_page_lens.py.

A small run is trained once for the module (tests/test_serve.py's `train_files`: 2 layers, 2
heads, context 32); a Llama-family model (rotary positions, RMSNorm, no biases) with a vocabulary
padded beyond its tokenizer is made in memory.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_lens import random_model
from test_serve import Running, cli_json, train_files

from tokenkit.bpe import Tokenizer
from tokenkit.cli import serve
from tokenkit.pipeline import forward_views, lens_views, views
from tokenkit.pipeline.lens_views import LENS_TOP_K_MAX
from tokenkit.pipeline.run import load_model_and_tokenizer
from tokenkit.transformer import GPTConfig, attribution, lens, reference
from tokenkit.transformer.config import llama_config

TEXTS = ["Once upon a time", "The cat sat. Ça va? 日本😀", "a  b\n\n\tc"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return train_files(tmp_path_factory.mktemp("serve_lens"))


@pytest.fixture(scope="module")
def srv(files):
    with Running(serve.make_server(files["run"], port=0)) as running:
        yield running


@pytest.fixture(scope="module")
def loaded(files):
    return load_model_and_tokenizer(files["run"])


# ----------------------------------------------------------------------------- the numbers


@pytest.mark.parametrize("text", TEXTS)
def test_the_lens_is_tk_explain_json_s_and_names_every_id(srv, files, loaded, capsys, text):
    doc = srv.ok("/api/lens", text=text)
    printed = cli_json(capsys, "explain", "-m", str(files["run"]), text, "--json")
    assert doc["lens"] == printed["lens"]  # the command's own numbers, float for float
    assert [t["id"] for t in doc["tokens"]] == [t["id"] for t in printed["tokens"]]
    model, tok = loaded
    assert doc["n_layers"] == model.config.n_layers and len(doc["lens"]) == model.config.n_layers + 1
    assert doc["top_k"] == 5 and all(len(row) == 5 for layer in doc["lens"] for row in layer["top"])
    # the prediction is the whole model's: its logits' argmax, the last boundary's first choice
    logits = model.forward(np.array([[t["id"] for t in doc["tokens"]]]))[0]
    assert doc["predicted"] == np.argmax(logits, axis=-1).tolist()
    assert doc["predicted"] == [row[0][0] for row in doc["lens"][-1]["top"]]
    named = {i for layer in doc["lens"] for row in layer["top"] for i, _ in row} | set(doc["predicted"])
    assert doc["labels"] == {str(i): tok.token_pieces([i])[0] for i in sorted(named)}


def test_the_lens_probabilities_are_a_plain_softmax_of_each_boundarys_logits(srv, loaded):
    text = "Once upon a time, there was a little cat."
    doc = srv.ok("/api/lens", text=text, top_k=LENS_TOP_K_MAX)
    model, _ = loaded
    ids = np.array([t["id"] for t in doc["tokens"]])
    probs = reference.softmax(lens.lens_logits(model, ids).astype(np.float64))  # (N, T, V), plainly
    for n, layer in enumerate(doc["lens"]):
        for t, row in enumerate(layer["top"]):
            assert len(row) == LENS_TOP_K_MAX
            best = np.argsort(-probs[n, t], kind="stable")[:LENS_TOP_K_MAX]
            np.testing.assert_allclose([p for _, p in row], probs[n, t, best], atol=1e-6)
            assert layer["predicted_probability"][t] == pytest.approx(probs[n, t, doc["predicted"][t]], abs=1e-6)
            if t + 1 < ids.size:  # the next token's rank: how many tokens the boundary gives more
                assert layer["next_rank"][t] == int((probs[n, t] > probs[n, t, ids[t + 1]]).sum())
            else:
                assert layer["next_rank"][t] is None


@pytest.mark.parametrize("position", [None, 0, 3])
def test_the_attribution_is_tk_explain_json_s_and_sums_to_the_logit(srv, files, loaded, capsys, position):
    text = "Once upon a time, there was"
    asked = {} if position is None else {"position": position}
    doc = srv.ok("/api/attribution", text=text, **asked)
    flags = [] if position is None else ["--attribute-position", str(position)]
    printed = cli_json(capsys, "explain", "-m", str(files["run"]), text, "--json", *flags)["attribution"]
    assert {k: doc[k] for k in printed} == printed
    T = len(doc["tokens"])
    assert doc["position"] == (T - 1 if position is None else position)
    model, tok = loaded
    logits = model.forward(np.array([[t["id"] for t in doc["tokens"]]]))[0]
    assert doc["token"] == doc["prediction"] == int(np.argmax(logits[doc["position"]]))
    assert doc["token_text"] == tok.token_pieces([doc["token"]])[0]
    assert (doc["n_layers"], doc["n_heads"]) == (model.config.n_layers, model.config.n_heads)
    shares = [*doc["embeddings"].values(), *np.ravel(doc["heads"]), *doc["mlps"], *doc["biases"]["attn"]]
    shares += [*doc["biases"]["mlp"], doc["biases"]["norm"]]
    assert sum(shares) == pytest.approx(doc["logit"], abs=1e-4)
    assert doc["logit"] == pytest.approx(float(logits[doc["position"], doc["token"]]), abs=1e-6)


def test_the_attribution_of_a_token_asked_is_its_logit(srv, loaded):
    doc = srv.ok("/api/attribution", text="Once upon a time", position=2, token=7)
    model, _ = loaded
    logits = model.forward(np.array([[t["id"] for t in doc["tokens"]]]))[0]
    assert doc["token"] == 7 and doc["position"] == 2 and doc["prediction"] == int(np.argmax(logits[2]))
    assert doc["logit"] == pytest.approx(float(logits[2, 7]), abs=1e-6)
    assert doc["sum"] == pytest.approx(doc["logit"], abs=1e-4)


def test_a_llama_model_with_a_padded_vocabulary():
    tok = Tokenizer.train([b"Once upon a time, there was a fox. " * 40], vocab_size=280)
    cfg = llama_config(vocab_size=300, context_length=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=8)
    model = random_model(cfg)
    text = "Once upon a time"
    doc = json.loads(json.dumps(views.lens_view(model, tok, text)))
    ids = tok.encode(text)
    assert doc["lens"] == lens.logit_lens(model, ids, top_k=5).to_json()
    for key, label in doc["labels"].items():  # an id past the tokenizer's is a pad label, never a text
        assert label == (tok.token_pieces([int(key)])[0] if int(key) < tok.vocab_size else f"<pad id {key}>")
    found = views.attribution_view(model, tok, text, position=1)
    assert found["embeddings"]["position"] == 0.0  # rotary positions: no position embedding
    assert found["biases"] == {"attn": [0.0, 0.0], "mlp": [0.0, 0.0], "norm": 0.0}
    assert found["heads"] == attribution.attribute(model, ids, 1).heads.tolist()
    assert found["sum"] == pytest.approx(found["logit"], abs=1e-4)


def test_a_texts_lens_and_each_positions_attribution_cost_one_forward_pass(loaded, monkeypatch):
    model, tok = loaded
    passes = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: passes.append(1) or forward(*a, **k))
    text = "Once upon a time, there was"
    lens_doc = views.lens_view(model, tok, text)
    ids = [t["id"] for t in lens_doc["tokens"]]
    shown = [views.attribution_view(model, tok, text, position=t) for t in range(len(ids))]
    assert len(passes) == 1  # the lens's pass, kept
    monkeypatch.setattr(model, "forward", forward)
    for t, doc in enumerate(shown):  # the same numbers as a pass of their own
        fresh = attribution.attribute(model, np.array(ids), t).to_json()
        assert {k: doc[k] for k in fresh} == fresh
    assert lens_doc["lens"] == lens.logit_lens(model, np.array(ids), 5).to_json()
    monkeypatch.setattr(model, "forward", lambda *a, **k: passes.append(1) or forward(*a, **k))
    views.attribution_view(model, tok, "The cat sat", position=0)  # another text: a pass of its own
    assert len(passes) == 2
    monkeypatch.setattr(lens_views, "KEEP_BYTES", 0)  # a trace too large to keep: every answer its own pass
    views.lens_view(model, tok, text)
    views.attribution_view(model, tok, text)
    assert len(passes) == 4


def test_a_damaged_models_nan_is_null_never_a_500(files):
    model, tok = load_model_and_tokenizer(files["run"])  # a copy of its own: damaged here only
    model.params["h.1.mlp.c_fc.weight"][...] = 3e38  # overflows float32: inf, then NaN downstream
    text = "Once upon a time"
    written = [json.dumps(doc, allow_nan=False) for doc in (views.lens_view(model, tok, text),
                                                           views.attribution_view(model, tok, text))]  # fmt: skip
    assert all('"logit": null' in w or "null]" in w for w in written)  # the NaN reached both, as null


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"position": 9}, "position 9 is not a position of this text: it has 4 token(s), 0..3"),
        ({"position": -1}, "position must not be negative"),
        ({"position": "1.5"}, "position must be a whole number"),
        ({"token": 400}, "token 400 is not in the model's vocabulary: ids are 0..399"),
        ({"token": 10**19}, "is not in the model's vocabulary"),
        ({"token": "x"}, "token must be a whole number"),
        ({"layer": 0}, "unknown parameter 'layer'"),
    ],
)
def test_a_position_or_token_that_does_not_exist_is_a_one_line_400(srv, params, message):
    assert message in srv.refused("/api/attribution", text="Once upon a time", **params)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"top_k": 0}, "top_k must be at least 1"),
        ({"top_k": LENS_TOP_K_MAX + 1}, f"top_k must be at most {LENS_TOP_K_MAX}"),
        ({"position": 1}, "unknown parameter 'position'"),
    ],
)
def test_a_bad_lens_query_is_a_one_line_400(srv, params, message):
    assert message in srv.refused("/api/lens", text="Once upon a time", **params)


@pytest.mark.parametrize("path", ["/api/lens", "/api/attribution"])
def test_a_text_the_views_cannot_take_is_one_line(srv, path):
    assert (
        srv.ok(path, text="Once upon a time, there was a cat. " * 8)["cut"] > 0
    )  # its last 32 tokens: test_long_texts
    assert "gives no tokens" in srv.refused(path, text="")
    assert "give the text" in srv.refused(path)
    assert "specials=allow" in srv.refused(path, text="a <|endoftext|>")
    assert srv.ok(path, text="a <|endoftext|>", specials="allow")["tokens"][-1]["special"]


def test_without_a_model_they_are_404(files):
    bare = Running(serve.make_server(tokenizer=files["tok"], port=0))
    try:
        for path in ("/api/lens", "/api/attribution"):
            assert "no model was given" in bare.refused(path, 404, text="x")
    finally:
        bare.stop()


# ----------------------------------------------------------------------------- bounds


def test_info_lists_the_view_and_the_lens_bound(srv, loaded):
    info = srv.ok("/api/info")
    assert "lens" in info["views"] and info["limits"]["lens_tokens"] == 32  # the context: a small model


@pytest.mark.parametrize("layers", [1, 12, 48, 200])
def test_the_lens_answer_stays_within_the_attention_views_bound(layers):
    cfg = GPTConfig(vocab_size=300, context_length=8192, d_model=16, n_layers=layers, n_heads=2)
    T = lens_views.lens_tokens(cfg)
    numbers = (layers + 1) * T * (2 * LENS_TOP_K_MAX + 2)  # pairs, the prediction's probability, the rank
    assert 1 <= T <= cfg.context_length and numbers <= forward_views.ATTENTION_NUMBERS
    if T < cfg.context_length:  # cut short: one token more would pass the bound
        assert (layers + 1) * (T + 1) * (2 * LENS_TOP_K_MAX + 2) > forward_views.ATTENTION_NUMBERS
