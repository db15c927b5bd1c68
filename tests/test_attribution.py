"""Direct logit attribution (transformer/attribution.py) on the random tiny models of test_lens.py,
every kind of block.

- The shares sum to the model's own logit within 1e-4, at every position, for the predicted token
  and for others.
- Each share is its part's vector (a head's mix @ its rows of W_o, an MLP's act @ c_proj, the
  embeddings, an output bias) read through every norm after it with the norm's scale frozen,
  computed here forwards and plainly, where attribution.py carries one direction backwards.
- Where the frozen-scale share is exactly a real ablation's effect, it is: the last block's MLP
  knocked out (c_proj zeroed), and each last-block head knocked out (its rows of W_o zeroed) in
  a model whose last MLP reads nothing of it (zeroed too): the knocked-out model's final stream,
  read with the original's frozen scales, gives the logit less that share. (With the real norm
  the change is not the share, not even to first order: the norm's scale moves with the stream.)
- `tk explain --json` carries `attribution`, `--attribute-position` and `--attribute-token` choose
  another logit, and bad input is one line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_lens import CONFIGS, V, random_model
from test_lens import saved as saved  # the module-scoped saved GPT-2-style model, shared

from tokenkit.cli.main import main
from tokenkit.transformer import attribution, trace
from tokenkit.transformer.errors import ModelError

PRE_NORM = [name for name, config in CONFIGS.items() if config.norm == "pre"]


def full_trace(model, ids) -> tuple[dict, np.ndarray]:
    recorded: dict = {}
    logits = model.forward(np.asarray(ids)[None], trace=recorded)[0]
    return recorded, logits


@pytest.mark.parametrize("name", CONFIGS)
def test_the_shares_sum_to_the_logit(name):
    model = random_model(CONFIGS[name], seed=4)
    ids = np.random.default_rng(4).integers(0, V, 10)
    logits = model.forward(ids)[0]
    for t in range(ids.size):
        for token in (None, 0, int(ids[t]), V - 1):
            found = attribution.attribute(model, ids, position=t, token=token)
            want = int(np.argmax(logits[t])) if token is None else token
            assert (found.position, found.token) == (t, want)
            assert found.logit == float(logits[t, want])
            assert abs(found.total() - found.logit) < 1e-4, (t, token, found.total(), found.logit)
    assert abs(found.heads).min() > 0 and abs(found.mlps).min() > 0  # every part has a say in these models


def frozen_norm(config, params, name: str, x: np.ndarray):
    """The norm `name` of the row x (C,) with its scale frozen at x: v -> its linear part applied to v."""
    g = params[name + ".weight"].astype(np.float64)
    if config.norm_type == "rmsnorm":
        s = 1 / np.sqrt((x * x).mean() + config.norm_eps)
        return lambda v: v * s * g
    s = 1 / np.sqrt(x.var() + config.norm_eps)
    return lambda v: (v - v.mean()) * s * g


def plain_shares(model, ids, t: int, token: int) -> dict[str, float]:
    """Every part's vector, put forwards through the frozen norms after it and dotted with the
    token's row of the head: the shares without the norms' biases."""
    cfg, p = model.config, model.params
    recorded, _ = full_trace(model, ids)
    # position t of each (B, T, .) entry (pos_emb: (T, C))
    row = {key: np.asarray(value, dtype=np.float64)[..., t, :].reshape(-1) for key, value in recorded.items()
           if trace.split_key(key)[1] in ("tok_emb", "pos_emb", "resid_1", "resid_2", "mlp.act")}  # fmt: skip
    unembed = p["wte.weight" if cfg.tie_embeddings else "lm_head.weight"][token].astype(np.float64)
    ln_f = frozen_norm(cfg, p, "ln_f", np.asarray(recorded[trace.stream_keys(cfg)[-1]][0, t], dtype=np.float64))
    # after[l] ("attn" or "mlp"): the frozen norms a vector added there goes through, in order
    after: dict[tuple[int, str], list] = {}
    later: list = [ln_f]
    for layer in reversed(range(cfg.n_layers)):
        h = f"h.{layer}."
        if cfg.norm == "post":
            later = [frozen_norm(cfg, p, h + "ln_2", row[h + "resid_2"]), *later]
        after[layer, "mlp"] = later
        if cfg.norm == "post":
            later = [frozen_norm(cfg, p, h + "ln_1", row[h + "resid_1"]), *later]
        after[layer, "attn"] = later
    embed_after = later

    def read(v: np.ndarray, norms: list) -> float:
        for norm in norms:
            v = norm(v)
        return float(v @ unembed)

    shares = {"token_embedding": read(row["tok_emb"], embed_after)}
    if cfg.positional != "rope":
        shares["position_embedding"] = read(row["pos_emb"], embed_after)
    hd = cfg.head_dim
    for layer in range(cfg.n_layers):
        h = f"h.{layer}."
        w_o = p[h + "attn.c_proj.weight"].astype(np.float64)
        mix = np.asarray(recorded[h + "attn.mix"][0, :, t], dtype=np.float64)  # (H, hd)
        for head in range(cfg.n_heads):
            shares[f"{layer}.{head}"] = read(mix[head] @ w_o[head * hd : (head + 1) * hd], after[layer, "attn"])
        shares[f"{layer}.mlp"] = read(row[h + "mlp.act"] @ p[h + "mlp.c_proj.weight"], after[layer, "mlp"])
        if cfg.bias:
            shares[f"{layer}.attn_bias"] = read(p[h + "attn.c_proj.bias"].astype(np.float64), after[layer, "attn"])
            shares[f"{layer}.mlp_bias"] = read(p[h + "mlp.c_proj.bias"].astype(np.float64), after[layer, "mlp"])
    return shares


@pytest.mark.parametrize("name", CONFIGS)
def test_each_share_is_its_parts_vector_read_through_the_frozen_norms_after_it(name):
    model = random_model(CONFIGS[name], seed=6)
    ids = np.random.default_rng(6).integers(0, V, 8)
    for t, token in ((7, None), (3, 11)):
        found = attribution.attribute(model, ids, position=t, token=token)
        want = plain_shares(model, ids, t, found.token)
        got = {"token_embedding": found.token_embedding}
        if model.config.positional != "rope":
            got["position_embedding"] = found.position_embedding
        for layer in range(model.config.n_layers):
            got |= {f"{layer}.{head}": found.heads[layer, head] for head in range(model.config.n_heads)}
            got[f"{layer}.mlp"] = found.mlps[layer]
            if model.config.bias:
                got[f"{layer}.attn_bias"] = found.attn_biases[layer]
                got[f"{layer}.mlp_bias"] = found.mlp_biases[layer]
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert abs(got[key] - value) < 1e-5, (key, got[key], value)
        if not model.config.bias:
            assert not found.attn_biases.any() and not found.mlp_biases.any()
        if model.config.positional == "rope":
            assert found.position_embedding == 0.0


def frozen_logit(model, recorded: dict, t: int, token: int, stream: np.ndarray) -> float:
    """The logit of the final stream `stream` (C,) read with the frozen scales of the pass `recorded`
    (a post-norm model's stream here is the last block's resid_2, before its ln_2)."""
    cfg, p = model.config, model.params
    x = np.asarray(stream, dtype=np.float64)
    norms = ["ln_f"]
    inputs = [recorded[trace.stream_keys(cfg)[-1]][0, t]]
    if cfg.norm == "post":
        norms.insert(0, f"h.{cfg.n_layers - 1}.ln_2")
        inputs.insert(0, recorded[f"h.{cfg.n_layers - 1}.resid_2"][0, t])
    for name, x_in in zip(norms, inputs, strict=True):
        x = frozen_norm(cfg, p, name, np.asarray(x_in, dtype=np.float64))(x) + p.get(name + ".bias", 0.0)
    unembed = p["wte.weight" if cfg.tie_embeddings else "lm_head.weight"]
    return float(x @ unembed[token].astype(np.float64))


def last_stream(model, recorded: dict, t: int) -> np.ndarray:
    cfg = model.config
    key = f"h.{cfg.n_layers - 1}.resid_2" if cfg.norm == "post" else trace.stream_keys(cfg)[-1]
    return recorded[key][0, t]


@pytest.mark.parametrize("name", CONFIGS)
def test_knocking_out_the_last_mlp_takes_exactly_its_shares_off_with_the_scales_frozen(name):
    model = random_model(CONFIGS[name], seed=7)
    ids = np.random.default_rng(7).integers(0, V, 9)
    L = model.config.n_layers
    recorded, logits = full_trace(model, ids)
    knocked = random_model(CONFIGS[name], seed=7)
    for suffix in ("weight", "bias"):
        if f"h.{L - 1}.mlp.c_proj.{suffix}" in knocked.params:
            knocked.params[f"h.{L - 1}.mlp.c_proj.{suffix}"][...] = 0.0
    after, _ = full_trace(knocked, ids)
    for t in range(ids.size):
        found = attribution.attribute(model, ids, position=t)
        assert abs(frozen_logit(model, recorded, t, found.token, last_stream(model, recorded, t)) - found.logit) < 1e-4
        without = frozen_logit(model, recorded, t, found.token, last_stream(knocked, after, t))
        assert abs(without - (found.logit - found.mlps[-1] - found.mlp_biases[-1])) < 1e-4


@pytest.mark.parametrize("name", PRE_NORM)
def test_knocking_out_a_last_block_head_takes_exactly_its_share_off_with_the_scale_frozen(name):
    """With the last MLP zeroed, nothing after a last-block head reads it but ln_f: knocking the head
    out (its rows of W_o zeroed, for GQA the query head named) changes the frozen-scale logit by
    exactly its share. (An earlier head's effect runs through later layers too; no such statement.)"""
    cfg = CONFIGS[name]
    L, hd = cfg.n_layers, cfg.head_dim
    ids = np.random.default_rng(8).integers(0, V, 9)

    def model_without(head: int | None):
        m = random_model(cfg, seed=8)
        m.params[f"h.{L - 1}.mlp.c_proj.weight"][...] = 0.0
        if cfg.bias:
            m.params[f"h.{L - 1}.mlp.c_proj.bias"][...] = 0.0
        if head is not None:
            m.params[f"h.{L - 1}.attn.c_proj.weight"][head * hd : (head + 1) * hd] = 0.0
        return m

    model = model_without(None)
    recorded, _ = full_trace(model, ids)
    for head in range(cfg.n_heads):
        knocked = model_without(head)
        after, _ = full_trace(knocked, ids)
        for t in (0, 4, ids.size - 1):
            found = attribution.attribute(model, ids, position=t)
            without = frozen_logit(model, recorded, t, found.token, last_stream(knocked, after, t))
            assert abs(without - (found.logit - found.heads[-1, head])) < 1e-4, (head, t)
            assert abs(found.heads[-1, head]) > 1e-3  # the statement is not vacuous


def test_to_json_holds_every_share_and_says_the_sum():
    model = random_model(CONFIGS["llama-biases-tied"])
    found = attribution.attribute(model, [3, 1, 4, 1, 5], position=2, token=7)
    doc = json.loads(json.dumps(found.to_json()))
    L, H = model.config.n_layers, model.config.n_heads
    assert set(doc) == {"position", "token", "logit", "sum", "scale", "embeddings", "heads", "mlps", "biases"}
    assert (doc["position"], doc["token"]) == (2, 7)
    assert np.array(doc["heads"]).shape == (L, H) and len(doc["mlps"]) == L
    assert len(doc["biases"]["attn"]) == len(doc["biases"]["mlp"]) == L
    parts = [*np.ravel(doc["heads"]), *doc["mlps"], *doc["biases"]["attn"], *doc["biases"]["mlp"]]
    parts += [doc["biases"]["norm"], doc["embeddings"]["token"], doc["embeddings"]["position"]]
    assert abs(sum(parts) - doc["logit"]) < 1e-4 and abs(doc["sum"] - doc["logit"]) < 1e-4


@pytest.mark.parametrize(
    "position, token, message",
    [(5, None, "position 5 is not a position"), (-6, None, "position -6"), (True, None, "position True"),
     (0, V, f"token {V} is not in the model's vocabulary"), (0, -1, "token -1"), (0, 1.0, "token 1.0")],
)  # fmt: skip
def test_a_position_or_token_that_does_not_exist_is_one_line(position, token, message):
    with pytest.raises(ModelError, match=message):
        attribution.attribute(random_model(CONFIGS["gpt2"]), [3, 1, 4, 1, 5], position=position, token=token)


# ----------------------------------------------------------------------------- tk explain --json


def explain(capsys, *argv) -> tuple[int, str, str]:
    code = main(["explain", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_json_attributes_the_last_prediction_or_the_logit_asked(capsys, saved):
    path, model, tok = saved
    text = "Once upon a time, there was a"
    ids = tok.encode(text)
    code, out, err = explain(capsys, "-m", path, text, "--json")
    assert code == 0, err
    assert json.loads(out)["attribution"] == attribution.attribute(model, ids).to_json()
    assert json.loads(out)["attribution"]["position"] == len(ids) - 1
    code, out, err = explain(capsys, "-m", path, text, "--json", "--attribute-position", 2, "--attribute-token", 17)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["attribution"] == attribution.attribute(model, ids, position=2, token=17).to_json()
    assert abs(doc["attribution"]["sum"] - doc["attribution"]["logit"]) < 1e-4


@pytest.mark.parametrize(
    "flags, message",
    [(["--json", "--attribute-position", "99"], "position 99 is not a position of this text"),
     (["--json", "--attribute-token", "100000"], "token 100000 is not in the model's vocabulary"),
     (["--json", "--attribute-position", "-1"], "-1"),
     (["--attribute-token", "3"], "choose the --json attribution of a model")],
)  # fmt: skip
def test_a_bad_attribution_flag_is_one_line(capsys, saved, flags, message):
    code, out, err = explain(capsys, "-m", saved[0], "Once upon a time", *flags)
    assert code == 1 and not out
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_the_worked_examples_take_no_attribution_flag(capsys):
    code, out, err = explain(capsys, "--example", "chai", "--json", "--attribute-position", "0")
    assert code == 1 and err.count("\n") == 1 and "of a model" in err
