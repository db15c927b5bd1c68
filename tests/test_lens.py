"""The logit lens (transformer/lens.py) on random tiny models of every kind of block: GPT-2's
(the fused GPT2Block), pre-norm LayerNorm with ReLU and sinusoids, post-norm, Llama's (RoPE,
RMSNorm, SwiGLU, fewer K/V heads than heads, untied) and Llama's with biases, one K/V head and a
tied head. Every weight is far from its initial value, so a wrong norm, head or position shows.

- The last boundary is the model's own output distribution.
- Every boundary equals a plain float64 forward written here one block at a time over
  transformer/reference.py's ops (x0, then each block's output, through ln_f and the head).
- `logit_lens`'s summary (top tokens, the prediction's probability, the next token's rank),
  computed in row blocks, equals the one read plainly off the whole (N, T, V) distribution.
- `tk explain --json` carries it as `lens`, bounded, beside its earlier keys unchanged.
- With transformers and torch: an exported GPT-2 and Llama give the same lens from their
  `hidden_states` through their final norm and head, within 1e-5 (skipped without them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint
from tokenkit.transformer import GPT, GPTConfig, lens, reference
from tokenkit.transformer.config import llama_config
from tokenkit.transformer.errors import ModelError

V = 40
CONFIGS = {
    "gpt2": GPTConfig(vocab_size=V, context_length=16, d_model=16, n_layers=2, n_heads=2),
    "pre-norm-relu": GPTConfig(
        vocab_size=V, context_length=16, d_model=16, n_layers=3, n_heads=4, activation="relu", positional="sinusoidal"
    ),
    "post-norm": GPTConfig(
        vocab_size=V, context_length=16, d_model=16, n_layers=2, n_heads=4, norm="post", causal=False,
        positional="sinusoidal", activation="relu",
    ),
    "llama": llama_config(vocab_size=V, context_length=16, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2,
                          mlp_hidden=24, rope_theta=500.0),
    "llama-biases-tied": llama_config(vocab_size=V, context_length=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=1,
                                      mlp_hidden=24, bias=True, tie_embeddings=True),
}  # fmt: skip


def random_model(config: GPTConfig, seed: int = 0) -> GPT:
    """A model whose every weight matters: gains near 1, everything else N(0, 0.3)."""
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed)
    for name, value in model.params.items():
        value[...] = rng.normal(1.0 if "ln" in name and name.endswith("weight") else 0.0, 0.3, value.shape)
    return model


def softmax32(logits: np.ndarray) -> np.ndarray:
    return reference.softmax(logits.astype(np.float64))


# ----------------------------------------------------------------------------- a plain forward


def plain_streams(model: GPT, ids: np.ndarray) -> list[np.ndarray]:
    """The residual stream at every layer boundary (T, C), in float64, one block at a time."""
    cfg = model.config
    p = {name: np.asarray(value, dtype=np.float64) for name, value in model.params.items()}
    T, H, Hkv = ids.size, cfg.n_heads, cfg.kv_heads
    x = p["wte.weight"][ids]
    if cfg.positional == "learned":
        x = x + p["wpe.weight"][:T]
    elif cfg.positional == "sinusoidal":
        x = x + reference.sinusoidal_table(cfg.context_length, cfg.d_model)[:T]

    def norm(name: str, v: np.ndarray) -> np.ndarray:
        if cfg.norm_type == "rmsnorm":
            return reference.rmsnorm(v, p[name + ".weight"], cfg.norm_eps)
        return reference.layernorm(v, p[name + ".weight"], p.get(name + ".bias"), cfg.norm_eps)

    def linear(name: str, v: np.ndarray) -> np.ndarray:
        return reference.linear(v, p[name + ".weight"], p.get(name + ".bias"))

    def attn(h: str, a: np.ndarray) -> np.ndarray:
        qkv = linear(h + "attn.c_attn", a)[None]
        if cfg.positional == "rope":
            qkv = reference.rope(qkv, H, Hkv, cfg.rope_theta, 0, cfg.rope_scaling)
        return linear(h + "attn.c_proj", reference.attention(qkv, H, cfg.causal, Hkv)[0])

    def mlp(h: str, m: np.ndarray) -> np.ndarray:
        act = {"gelu": reference.gelu, "relu": reference.relu, "swiglu": reference.swiglu}[cfg.activation]
        return linear(h + "mlp.c_proj", act(linear(h + "mlp.c_fc", m)))

    streams = [x]
    for layer in range(cfg.n_layers):
        h = f"h.{layer}."
        if cfg.norm == "pre":
            x = x + attn(h, norm(h + "ln_1", x))
            x = x + mlp(h, norm(h + "ln_2", x))
        else:
            x = norm(h + "ln_1", x + attn(h, x))
            x = norm(h + "ln_2", x + mlp(h, x))
        streams.append(x)
    return streams


def plain_lens(model: GPT, ids: np.ndarray) -> np.ndarray:
    """(N, T, V) probabilities: each boundary's stream through ln_f and the head, in float64."""
    cfg = model.config
    p = {name: np.asarray(value, dtype=np.float64) for name, value in model.params.items()}
    unembed = p["wte.weight" if cfg.tie_embeddings else "lm_head.weight"]
    out = []
    for x in plain_streams(model, ids):
        if cfg.norm_type == "rmsnorm":
            xf = reference.rmsnorm(x, p["ln_f.weight"], cfg.norm_eps)
        else:
            xf = reference.layernorm(x, p["ln_f.weight"], p.get("ln_f.bias"), cfg.norm_eps)
        out.append(reference.softmax(xf @ unembed.T))
    return np.stack(out)


# ----------------------------------------------------------------------------- the lens's numbers


@pytest.mark.parametrize("name", CONFIGS)
def test_the_last_boundary_is_the_models_own_distribution(name):
    model = random_model(CONFIGS[name], seed=1)
    ids = np.random.default_rng(1).integers(0, V, 11)
    final = softmax32(model.forward(ids)[0])  # (T, V)
    every = softmax32(lens.lens_logits(model, ids))  # (N, T, V)
    assert every.shape == (model.config.n_layers + 1, ids.size, V)
    np.testing.assert_allclose(every[-1], final, atol=1e-6)
    summary = lens.logit_lens(model, ids, top_k=5)
    np.testing.assert_allclose(summary.predicted_probs[-1], final.max(axis=1), atol=1e-6)
    np.testing.assert_array_equal(summary.top_ids[-1, :, 0], summary.predicted)  # the last boundary's best is it


@pytest.mark.parametrize("name", CONFIGS)
def test_every_boundary_equals_a_plain_forward_one_block_at_a_time(name):
    model = random_model(CONFIGS[name], seed=2)
    ids = np.random.default_rng(2).integers(0, V, 9)
    want = plain_lens(model, ids)
    got = softmax32(lens.lens_logits(model, ids))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)
    # and the boundaries differ: a lens that read one stream for all would not pass the line above
    assert np.abs(want[0] - want[-1]).max() > 0.05


def plain_summary(probs: np.ndarray, ids: np.ndarray, predicted: np.ndarray, k: int):
    """What `logit_lens` keeps, read off the whole (N, T, V) distribution one cell at a time."""
    N, T, _ = probs.shape
    top = np.zeros((N, T, k), dtype=np.int64)
    ranks = np.zeros((N, T - 1), dtype=np.int64)
    for n in range(N):
        for t in range(T):
            top[n, t] = np.argsort(-probs[n, t], kind="stable")[:k]
            if t < T - 1:
                ranks[n, t] = sum(1 for q in probs[n, t] if q > probs[n, t, ids[t + 1]])
    return top, ranks, probs[:, np.arange(T), predicted]


@pytest.mark.parametrize("name", ["gpt2", "post-norm", "llama"])
@pytest.mark.parametrize("cells", [V, 3 * V, 1 << 22])  # one row per block, blocks not dividing N x T, one block
@pytest.mark.parametrize("k", [1, 5, V, V + 7])  # top-k beyond the vocabulary keeps all of it
def test_the_summary_in_row_blocks_equals_the_whole_distribution_read_plainly(name, cells, k, monkeypatch):
    monkeypatch.setattr(lens, "CELLS", cells)
    model = random_model(CONFIGS[name], seed=3)
    ids = np.random.default_rng(3).integers(0, V, 7)
    probs = softmax32(lens.lens_logits(model, ids))
    predicted = np.argmax(model.forward(ids)[0], axis=-1)
    got = lens.logit_lens(model, ids, top_k=k)
    top, ranks, pred_probs = plain_summary(probs, ids, predicted, min(k, V))
    np.testing.assert_array_equal(got.predicted, predicted)
    np.testing.assert_array_equal(got.top_ids, top)
    np.testing.assert_allclose(got.top_probs, np.take_along_axis(probs, top, axis=2), atol=1e-6)
    np.testing.assert_allclose(got.predicted_probs, pred_probs, atol=1e-6)
    np.testing.assert_array_equal(got.next_ids, ids[1:])
    np.testing.assert_array_equal(got.next_ranks, ranks)
    assert got.top_probs.dtype == np.float32


def test_a_tie_ranks_the_next_token_first_and_lists_the_lower_id_first():
    """A model whose head gives every token the same logit: every rank is 0, the top lists ids in order."""
    model = random_model(CONFIGS["gpt2"])
    model.params["wte.weight"][...] = 0.0
    model.params["wte.weight"][:, 0] = 1.0  # every token's row alike: every logit equal
    got = lens.logit_lens(model, [3, 1, 4, 1, 5], top_k=3)
    assert (got.next_ranks == 0).all()
    assert (got.top_ids == [0, 1, 2]).all() and (got.predicted == 0).all()
    np.testing.assert_allclose(got.top_probs, 1 / V, rtol=1e-6)


@pytest.mark.parametrize("bad", [0, -1, lens.TOP_K_MAX + 1, True, 2.0, "5"])
def test_a_bad_top_k_is_one_line(bad):
    with pytest.raises(ModelError, match="top-k must be an integer"):
        lens.logit_lens(random_model(CONFIGS["gpt2"]), [1, 2], top_k=bad)


@pytest.mark.parametrize("ids", [[], [[1, 2], [3, 4]], [[[1]]], [0.5, 1.0]])
def test_anything_but_one_sequence_of_ids_is_one_line(ids):
    with pytest.raises(ModelError, match="one non-empty sequence of ids"):
        lens.logit_lens(random_model(CONFIGS["gpt2"]), np.asarray(ids))


def test_to_json_holds_every_boundary_and_position_with_the_next_rank_null_at_the_last():
    model = random_model(CONFIGS["llama"])
    ids = np.array([5, 9, 2, 7])
    found = lens.logit_lens(model, ids, top_k=3)
    doc = json.loads(json.dumps(found.to_json()))
    assert [layer["layer"] for layer in doc] == [0, 1, 2, 3]
    assert [layer["after"] for layer in doc] == ["embeddings", "block 0", "block 1", "block 2"]
    for n, layer in enumerate(doc):
        assert [[pair[0] for pair in row] for row in layer["top"]] == found.top_ids[n].tolist()
        assert [[pair[1] for pair in row] for row in layer["top"]] == found.top_probs[n].tolist()
        assert layer["predicted_probability"] == found.predicted_probs[n].tolist()
        assert layer["next_rank"] == [*found.next_ranks[n].tolist(), None]


# ----------------------------------------------------------------------------- tk explain --json

TEXT = "Once upon a time, there was a brave fox named Max. He lived in a cave near the pond. " * 20
EARLIER_KEYS = ["kind", "model", "text", "title", "notes", "tokens", "layer", "head", "steps", "attention_all_heads",
                "top"]  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from conftest import random_model as saved_model  # GPT-2-style, saved with its tokenizer

    tok = Tokenizer.train([TEXT.encode()], vocab_size=300, special_tokens=["<|endoftext|>"])
    path = tmp_path_factory.mktemp("lens") / "m.safetensors"
    return path, saved_model(path, tok), tok


def explain_json(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main(["explain", *map(str, argv), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_explain_json_carries_the_lens_bounded_beside_its_earlier_keys(capsys, saved):
    path, model, tok = saved
    text = "Once upon a time, there was a brave fox"
    code, doc, err = explain_json(capsys, "-m", path, text, "--top-k", "7")
    assert code == 0, err
    assert list(doc)[: len(EARLIER_KEYS)] == EARLIER_KEYS and set(doc) == {*EARLIER_KEYS, "lens", "attribution"}
    assert len(doc["top"]) == 7  # explain's own candidates, not the lens's
    ids = tok.encode(text)
    assert doc["lens"] == lens.logit_lens(model, ids, top_k=5).to_json()
    assert len(doc["lens"]) == model.config.n_layers + 1
    for layer in doc["lens"]:
        assert len(layer["top"]) == len(layer["predicted_probability"]) == len(layer["next_rank"]) == len(ids)
        assert all(len(row) == 5 for row in layer["top"])  # bounded: 5 pairs per position, whatever --top-k says
    # --query is one query's arithmetic (what the page asks at each click): no lens to compute
    code, one, err = explain_json(capsys, "-m", path, text, "--query", "2")
    assert code == 0, err
    assert set(one) == {*EARLIER_KEYS, "query"}


# ----------------------------------------------------------------------------- transformers


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def exported_lens(transformers, hf: Path, ids: list[int]) -> np.ndarray:
    """(N, T, V) probabilities from transformers' hidden_states: each through the final norm and
    the head, but the last, which transformers gives already normed."""
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    final_norm = model.transformer.ln_f if hasattr(model, "transformer") else model.model.norm
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        states = out.hidden_states
        logits = [model.lm_head(final_norm(s)) for s in states[:-1]] + [model.lm_head(states[-1])]
        np.testing.assert_allclose(logits[-1].numpy(), out.logits.numpy(), atol=1e-5)  # the last is the output
        return np.stack([torch.softmax(z[0].double(), -1).numpy() for z in logits])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_lens_equals_transformers_hidden_states_through_its_norm_and_head(transformers, saved, tmp_path, family):
    _, gpt2_model, tok = saved
    if family == "gpt2":
        path, model = saved[0], gpt2_model
    else:
        config = llama_config(vocab_size=tok.vocab_size, context_length=32, d_model=32, n_layers=2, n_heads=4,
                              n_kv_heads=2, mlp_hidden=48, rope_theta=5e5)  # fmt: skip
        model = random_model(config, seed=5)
        path = tmp_path / "llama.safetensors"
        checkpoint.save_model(
            path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
        )
    assert main(["export-hf", str(path), "-o", str(tmp_path / "hf")]) == 0
    ids = tok.encode("Once upon a time, there was a brave fox named Max.")
    theirs = exported_lens(transformers, tmp_path / "hf", ids)
    ours = softmax32(lens.lens_logits(model, ids))
    assert theirs.shape == ours.shape
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    summary = lens.logit_lens(model, ids, top_k=3)
    np.testing.assert_allclose(summary.top_probs, np.take_along_axis(theirs, summary.top_ids, axis=2), atol=1e-5)
