"""Ablation (transformer/ablation.py, `--ablate` on predict-next, generate and explain) on the
random tiny models of test_lens.py: GPT-2's fused block, pre-norm with ReLU and sinusoids,
post-norm, Llama's (GQA: 4 query heads over 2 K/V heads) and Llama's with biases and one K/V head.

- Zeroing each head, alone, is zeroing its rows of W_o in a copy of the weights (c_proj's bias
  kept: it belongs to no head); zeroing each MLP is zeroing its c_proj, weight and bias.
- Several parts at once, zeroed or replaced by their means, equal a plain float64 forward written
  here over transformer/reference.py's ops that replaces the head's slice of the attention's
  output before c_proj, and the MLP's output; the means are taken here by hand from the unablated
  trace of a reference text longer than the context, window by window.
- The ablated KV-cached decode gives the ablated whole forward's logits, context shifts included.
- The unablated forward is bit for bit what it was, after an ablated one too; an ablated model
  refuses gradients; the trace, lens and attribution of an ablated pass read what it computed.
- Bad SPECs and flags are one line (exit 1, no traceback).
- With torch and transformers: an exported GPT-2 and Llama with a hook that zeroes the same heads
  before the output projection (and the same MLP's output) give the same probabilities within 1e-5.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from test_lens import CONFIGS, TEXT, V, random_model
from test_lens import saved as saved  # the module-scoped saved GPT-2-style model, shared

from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint
from tokenkit.transformer import GPT, attribution, lens, reference
from tokenkit.transformer.ablation import Part, ablated, mean_ablation, parse, shift, zero_ablation
from tokenkit.transformer.config import llama_config
from tokenkit.transformer.errors import ModelError

CAUSAL = [name for name, config in CONFIGS.items() if config.causal]


def every_part(config) -> list[Part]:
    return [Part(layer, head) for layer in range(config.n_layers) for head in [*range(config.n_heads), None]]


def copy_of(model: GPT) -> GPT:
    return GPT.from_params(model.config, {name: value.copy() for name, value in model.params.items()})


# ----------------------------------------------------------------------------- SPEC


def test_a_spec_names_heads_and_mlps_in_the_order_given():
    assert parse("1.3, 0.mlp,0.0") == (Part(1, 3), Part(0, None), Part(0, 0))
    assert zero_ablation(random_model(CONFIGS["gpt2"]), parse(" 1.1 ,0.mlp ")).spec == "1.1,0.mlp"


BAD_SPECS = {
    "": "is empty",
    " , ": "is empty",
    "1": "is not L.H",
    "1.": "is not L.H",
    ".1": "is not L.H",
    "a.b": "is not L.H",
    "1.2.3": "is not L.H",
    "-1.0": "is not L.H",
    "1.MLP": "is not L.H",
    "1.²": "is not L.H",
    "1.1,,0.mlp": "has an empty part",
    "1.1,": "has an empty part",
    "1.1,1.1": "named twice",
    "0.mlp,1.0,0.mlp": "named twice",
    "01.1,1.1": "named twice",
    "2.0": "layer 2 does not exist",
    "0.mlp,9.mlp": "layer 9 does not exist",
    "1.2": "head 2 does not exist",
}


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_a_bad_spec_is_one_line_saying_what_is_wrong(spec, capsys, saved):
    path, model, _ = saved  # 2 layers of 4 heads
    small = random_model(CONFIGS["gpt2"])  # 2 layers of 2 heads
    with pytest.raises(ModelError, match=BAD_SPECS[spec]) as err:
        zero_ablation(small, parse(spec))
    assert "\n" not in str(err.value)
    if spec == "1.2":  # the saved model has a head 2; one it lacks
        spec = "1.4"
    for command in (["predict-next"], ["generate", "-n", "2"], ["explain"]):
        code = main([*command, "-m", str(path), "Once upon a time", "--ablate", spec])
        out, err_text = capsys.readouterr()
        assert code == 1 and out == ""
        assert err_text.startswith("error: ") and err_text.count("\n") == 1 and "Traceback" not in err_text, err_text


BAD_FLAGS = [
    (["--ablate-mode", "mean"], "goes with --ablate"),
    (["--ablate-text", "x"], "goes with --ablate"),
    (["--ablate", "0.1", "--ablate-text", "x"], "zero ablation has none"),
    (["--ablate", "0.1", "--ablate-mode", "mean"], "needs its reference"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-text", "x", "--ablate-file", "f"], "needs its reference"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-text", ""], "is empty"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-file", "DIR"], "directory"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-file", "LATIN1"], "not UTF-8"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-file", "EMPTY"], "is empty"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-file", "MISSING"], "no such file"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-file", "BIG"], "at most 1 MiB"),
    (["--ablate", "0.1", "--ablate-mode", "mean", "--ablate-file", "/dev/zero"], "not a regular file"),
]


@pytest.mark.parametrize("flags, message", BAD_FLAGS)
def test_bad_ablation_flags_are_one_line(flags, message, capsys, saved, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_bytes(b"")
    where = {"DIR": tmp_path, "LATIN1": tmp_path / "latin1.txt", "EMPTY": tmp_path / "empty.txt"}
    (tmp_path / "big.txt").write_bytes(b"a" * ((1 << 20) + 1))
    where["MISSING"], where["BIG"] = tmp_path / "missing.txt", tmp_path / "big.txt"
    flags = [str(where.get(flag, flag)) for flag in flags]
    for command in (["predict-next"], ["generate", "-n", "2"], ["explain"]):
        code = main([*command, "-m", str(saved[0]), "Once upon a time", *flags])
        out, err = capsys.readouterr()
        assert code == 1 and out == "" and message in err and err.count("\n") == 1, err


def test_explain_refuses_an_ablation_it_cannot_show(capsys, saved, tmp_path):
    for extra in (["-m", str(saved[0]), "Once", "--html", str(tmp_path / "p.html")], ["--example", "chai"]):
        assert main(["explain", *extra, "--ablate", "0.1"]) == 1
        assert "--ablate knocks parts out of a model's pass" in capsys.readouterr().err
    assert not (tmp_path / "p.html").exists()


# ----------------------------------------------------------------------------- against references


@pytest.mark.parametrize("name", CONFIGS)
def test_zeroing_each_part_is_zeroing_its_output_weights_in_a_copy(name):
    """A head's rows of W_o (c_proj's bias kept: it belongs to no head; a GQA head's own rows, its
    K/V head untouched); an MLP's c_proj, weight and bias: exactly what zeroing the output does."""
    model = random_model(CONFIGS[name], seed=2)
    cfg, hd = model.config, model.config.head_dim
    ids = np.random.default_rng(2).integers(0, V, 12)
    plain = model.forward(ids).copy()
    for part in every_part(cfg):
        edited = copy_of(model)
        prefix = f"h.{part.layer}."
        if part.head is None:
            edited.params[prefix + "mlp.c_proj.weight"][...] = 0
            if cfg.bias:
                edited.params[prefix + "mlp.c_proj.bias"][...] = 0
        else:
            edited.params[prefix + "attn.c_proj.weight"][part.head * hd : (part.head + 1) * hd] = 0
        with ablated(model, zero_ablation(model, [part])):
            got = model.forward(ids).copy()
        want = edited.forward(ids)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=str(part))
        assert np.abs(got - plain).max() > 1e-3, part  # the part mattered: the test can see a no-op


def plain_logits(model: GPT, ids: np.ndarray, replace: dict[Part, np.ndarray]) -> np.ndarray:
    """(T, V) logits in float64, one block at a time over reference ops: each head in `replace`
    has its slice of the attention's output (before c_proj) set to its value (hd,), each MLP its
    output (c_proj's bias included) set to its value (C,)."""
    cfg = model.config
    p = {name: np.asarray(value, dtype=np.float64) for name, value in model.params.items()}
    T, H, Hkv, hd = ids.size, cfg.n_heads, cfg.kv_heads, cfg.head_dim
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

    def attn(layer: int, a: np.ndarray) -> np.ndarray:
        h = f"h.{layer}."
        qkv = linear(h + "attn.c_attn", a)[None]
        if cfg.positional == "rope":
            qkv = reference.rope(qkv, H, Hkv, cfg.rope_theta, 0, cfg.rope_scaling)
        y = reference.attention(qkv, H, cfg.causal, Hkv)[0]  # (T, H hd)
        for head in range(H):
            if Part(layer, head) in replace:
                y[:, head * hd : (head + 1) * hd] = replace[Part(layer, head)]
        return linear(h + "attn.c_proj", y)

    def mlp(layer: int, m: np.ndarray) -> np.ndarray:
        h = f"h.{layer}."
        act = {"gelu": reference.gelu, "relu": reference.relu, "swiglu": reference.swiglu}[cfg.activation]
        out = linear(h + "mlp.c_proj", act(linear(h + "mlp.c_fc", m)))
        return np.broadcast_to(replace[Part(layer, None)], out.shape) if Part(layer, None) in replace else out

    for layer in range(cfg.n_layers):
        h = f"h.{layer}."
        if cfg.norm == "pre":
            x = x + attn(layer, norm(h + "ln_1", x))
            x = x + mlp(layer, norm(h + "ln_2", x))
        else:
            x = norm(h + "ln_1", x + attn(layer, x))
            x = norm(h + "ln_2", x + mlp(layer, x))
    unembed = p["wte.weight" if cfg.tie_embeddings else "lm_head.weight"]
    return norm("ln_f", x) @ unembed.T


def means_by_hand(model: GPT, parts: list[Part], reference_ids: np.ndarray) -> dict[Part, np.ndarray]:
    """Each part's output averaged over every position of reference_ids, run in windows of the
    context: a head's attn.mix (hd,), an MLP's mlp.out (C,)."""
    T = model.config.context_length
    sums: dict[Part, np.ndarray] = {part: 0.0 for part in parts}
    for lo in range(0, reference_ids.size, T):
        recorded: dict = {}
        model.forward(reference_ids[lo : lo + T], trace=recorded)
        for part in parts:
            h = f"h.{part.layer}."
            if part.head is None:
                sums[part] = sums[part] + recorded[h + "mlp.out"][0].astype(np.float64).sum(axis=0)
            else:
                sums[part] = sums[part] + recorded[h + "attn.mix"][0, part.head].astype(np.float64).sum(axis=0)
    return {part: total / reference_ids.size for part, total in sums.items()}


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("name", CONFIGS)
def test_several_parts_equal_a_plain_forward_that_replaces_their_outputs(name, mode):
    model = random_model(CONFIGS[name], seed=3)
    cfg = model.config
    rng = np.random.default_rng(3)
    ids = rng.integers(0, V, 11)
    reference_ids = rng.integers(0, V, 2 * cfg.context_length + 5)  # three windows, the last short
    last = cfg.n_layers - 1
    parts = [Part(0, 1), Part(last, 0), Part(last, cfg.n_heads - 1), Part(0, None), Part(last, None)]
    if mode == "zero":
        ablation = zero_ablation(model, parts)
        values = {part: np.zeros(cfg.d_model if part.head is None else cfg.head_dim) for part in parts}
    else:
        ablation = mean_ablation(model, parts, reference_ids)
        values = means_by_hand(model, parts, reference_ids)
        assert ablation.reference_tokens == reference_ids.size
        for part in parts:
            np.testing.assert_allclose(ablation.replacement(part), values[part], rtol=1e-6, atol=1e-7)
    with ablated(model, ablation):
        got = model.forward(ids)[0].astype(np.float64)
    want = plain_logits(model, ids, values)
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max())
    assert np.abs(want - plain_logits(model, ids, {})).max() > 0.1  # the parts mattered


# ----------------------------------------------------------------------------- generation


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("name", CAUSAL)
def test_the_ablated_kv_cached_decode_equals_the_ablated_whole_forward(name, mode):
    """Token by token past a context shift (context 16: 6 prompt tokens + 20 new), the cached
    step's logits are the whole window's, ablated both."""
    model = random_model(CONFIGS[name], seed=7)
    rng = np.random.default_rng(7)
    parts = parse("0.1,1.0,1.mlp")
    ablation = zero_ablation(model, parts) if mode == "zero" else mean_ablation(model, parts, rng.integers(0, V, 30))
    prompt = rng.integers(0, V, 6)
    runs = {}
    for use_cache in (True, False):
        seen: list[np.ndarray] = []
        with ablated(model, ablation), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the context shift's warning
            observe = lambda logits, _, seen=seen: seen.append(logits)  # noqa: E731
            tokens = list(model.generate(prompt, 20, temperature=0, use_cache=use_cache, observe=observe))
        runs[use_cache] = tokens, np.stack(seen)
    assert runs[True][0] == runs[False][0]
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=1e-5, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = list(model.generate(prompt, 20, temperature=0))
    assert plain != runs[True][0]  # the ablation changed what was generated
    # the first step's cached logits are the ablated whole forward's last row, computed apart
    with ablated(model, ablation):
        np.testing.assert_allclose(runs[True][1][0], model.forward(prompt)[0, -1], rtol=1e-5, atol=1e-5)


def test_generate_with_ablate_prints_what_the_ablated_model_generates(capsys, saved):
    path, model, tok = saved
    prompt = "Once upon a time"
    assert main(["generate", "-m", str(path), prompt, "-n", "12", "--temperature", "0", "--ablate", "1.1,0.mlp"]) == 0
    out = capsys.readouterr().out
    ids = tok.encode(prompt)
    with ablated(model, zero_ablation(model, parse("1.1,0.mlp"))):
        want = tok.decode(list(model.generate(ids, 12, temperature=0)))
    assert out == prompt + want + "\n"
    assert want != tok.decode(list(model.generate(ids, 12, temperature=0)))


# ----------------------------------------------------------------------------- the plain forward untouched


@pytest.mark.parametrize("name", CONFIGS)
def test_the_unablated_forward_is_bit_for_bit_the_same_before_and_after(name):
    model = random_model(CONFIGS[name], seed=5)
    ids = np.random.default_rng(5).integers(0, V, (2, 9))
    before, before_trace = model.forward(ids).copy(), {}
    model.forward(ids, trace=before_trace)
    loss, grads = model.loss_and_grads(ids, np.roll(ids, 1, axis=1))
    ablation = mean_ablation(model, every_part(model.config)[::3], ids[0])
    with ablated(model, ablation):
        knocked_trace: dict = {}
        model.forward(ids, trace=knocked_trace)
        with pytest.raises(ModelError, match="forward only"):
            model.loss_and_grads(ids, ids)
    assert model.ablation is None
    after_trace: dict = {}
    assert np.array_equal(model.forward(ids), before)
    model.forward(ids, trace=after_trace)
    assert all(np.array_equal(after_trace[key], before_trace[key]) for key in before_trace)
    loss_after, grads_after = model.loss_and_grads(ids, np.roll(ids, 1, axis=1))
    assert loss_after == loss and all(np.array_equal(grads[k], grads_after[k]) for k in grads)
    # the ablated pass changed nothing before its first knocked-out part: block 0's attention
    first = ablation.parts[0]
    assert first == Part(0, 0)
    assert np.array_equal(knocked_trace["h.0.attn.weights"], before_trace["h.0.attn.weights"])
    assert not np.array_equal(knocked_trace["h.0.attn.out"], before_trace["h.0.attn.out"])


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("name", CONFIGS)
def test_the_trace_lens_and_attribution_of_an_ablated_pass_read_what_it_computed(name, mode):
    model = random_model(CONFIGS[name], seed=8)
    cfg = model.config
    rng = np.random.default_rng(8)
    ids = rng.integers(0, V, 9)
    parts = parse(f"0.0,{cfg.n_layers - 1}.1,0.mlp,{cfg.n_layers - 1}.mlp")
    ablation = zero_ablation(model, parts) if mode == "zero" else mean_ablation(model, parts, rng.integers(0, V, 20))
    with ablated(model, ablation):
        recorded: dict = {}
        logits = model.forward(ids, trace=recorded)[0]
        for part in parts:
            entry = recorded[f"h.{part.layer}." + ("mlp.out" if part.head is None else "attn.mix")]
            got = entry[0] if part.head is None else entry[0, part.head]
            np.testing.assert_allclose(got, np.broadcast_to(ablation.replacement(part), got.shape), rtol=1e-6)
        last = lens.lens_logits(model, ids)[-1]
        np.testing.assert_allclose(last, logits, rtol=1e-5, atol=1e-5)  # the last boundary: the ablated output
        for t in (3, 8):
            found = attribution.attribute(model, ids, position=t)
            assert found.logit == float(logits[t, found.token])
            assert abs(found.total() - found.logit) < 1e-4, (t, found.total(), found.logit)
            if mode == "zero":
                assert found.heads[0, 0] == 0 and found.mlps[0] == 0 and found.mlp_biases[0] == 0


# ----------------------------------------------------------------------------- the shift, the commands


def test_the_shift_is_the_kl_divergence_and_the_tokens_that_moved_most():
    model = random_model(CONFIGS["llama"], seed=9)
    ids = np.random.default_rng(9).integers(0, V, 7)
    ablation = zero_ablation(model, parse("2.1,2.3,1.mlp"))
    moved = shift(model, ids, ablation)
    p = reference.softmax(model.forward(ids)[0, -1].astype(np.float64))
    with ablated(model, ablation):
        q = reference.softmax(model.forward(ids)[0, -1].astype(np.float64))
    np.testing.assert_allclose(moved.before, p, rtol=1e-9)
    np.testing.assert_allclose(moved.after, q, rtol=1e-9)
    assert moved.kl == pytest.approx(sum(p[i] * np.log(p[i] / q[i]) for i in range(V)), rel=1e-9)
    order = sorted(range(V), key=lambda i: (-abs(q[i] - p[i]), i))
    assert moved.moved(5) == order[:5]
    assert shift(model, ids, zero_ablation(model, parse("2.1"))).kl < moved.kl * 10  # a finite, ordinary number


def predict_json(capsys, path, *flags) -> dict:
    code = main(["predict-next", "-m", str(path), "Once upon a time, there was a brave", "--json", *map(str, flags)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_predict_next_json_gives_the_ablated_distribution_the_kl_and_what_moved(capsys, saved, tmp_path):
    path, model, tok = saved
    plain = predict_json(capsys, path, "--top-k", "4")
    assert set(plain) == {"top", "prompt_ids"}  # without --ablate, the document it always was
    ids = plain["prompt_ids"]
    reference_text = TEXT[:300]
    (tmp_path / "ref.txt").write_text(reference_text)
    for flags, ablation in [
        (["--ablate", "1.2,0.mlp"], zero_ablation(model, parse("1.2,0.mlp"))),
        (["--ablate", "1.0", "--ablate-mode", "mean", "--ablate-text", reference_text],
         mean_ablation(model, parse("1.0"), tok.encode(reference_text))),
        (["--ablate", "1.0", "--ablate-mode", "mean", "--ablate-file", tmp_path / "ref.txt"],
         mean_ablation(model, parse("1.0"), tok.encode(reference_text))),
    ]:  # fmt: skip
        doc = predict_json(capsys, path, "--top-k", "4", *flags)
        assert doc["prompt_ids"] == ids
        assert doc["ablation"] == ablation.to_json()
        moved = shift(model, ids, ablation)
        assert [e["id"] for e in doc["top"]] == np.argsort(-moved.after, kind="stable")[:4].tolist()
        assert all(abs(e["p"] - moved.after[e["id"]]) < 1e-6 for e in doc["top"])
        assert [e["id"] for e in doc["before"]] == [e["id"] for e in plain["top"]]
        assert all(abs(e["p"] - moved.before[e["id"]]) < 1e-6 for e in doc["before"])
        assert doc["kl"] == pytest.approx(moved.kl, abs=1e-6) and doc["kl"] > 0
        assert [e["id"] for e in doc["moved"]] == moved.moved(4)
        assert all(e["token"] == tok.token_pieces([e["id"]])[0] for e in doc["moved"] + doc["before"])
        assert [list(e) for e in doc["before"]] == [["id", "token", "p"]] * 4
        assert [list(e) for e in doc["moved"]] == [["id", "token", "before", "after"]] * 4
    code = main(["predict-next", "-m", str(path), "Once upon a time", "--ablate", "1.2"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("ablated: 1.2 zeroed; KL divergence from the unablated distribution: ")
    assert out.splitlines()[3].split() == ["rank", "id", "probability", "unablated", "text"]


def test_explain_with_ablate_explains_the_ablated_pass(capsys, saved):
    path, model, tok = saved
    text = "Once upon a time, there was a brave fox"
    code = main(["explain", "-m", str(path), text, "--json", "--ablate", "0.3,1.mlp"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    ablation = zero_ablation(model, parse("0.3,1.mlp"))
    assert doc["ablation"] == ablation.to_json()
    ids = tok.encode(text)
    with ablated(model, ablation):
        assert doc["lens"] == lens.logit_lens(model, ids, top_k=5).to_json()
        probs = reference.softmax(model.forward(ids)[0, -1].astype(np.float64))
    assert doc["top"][0]["id"] == int(np.argmax(probs))
    assert abs(doc["attribution"]["sum"] - doc["attribution"]["logit"]) < 1e-4
    assert doc["attribution"]["mlps"][1] == 0.0
    assert main(["explain", "-m", str(path), text, "--ablate", "0.3"]) == 0
    assert capsys.readouterr().out.startswith("ablated: 0.3 zeroed\n")


# ----------------------------------------------------------------------------- PyTorch


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_exported_model_with_the_same_heads_zeroed_before_the_output_projection_agrees(
    transformers, saved, tmp_path, family
):
    import torch

    _, gpt2_model, tok = saved
    if family == "gpt2":
        path, model = saved[0], gpt2_model
    else:  # 4 query heads over 2 K/V heads: heads 1 and 2 share none
        config = llama_config(vocab_size=tok.vocab_size, context_length=32, d_model=32, n_layers=2, n_heads=4,
                              n_kv_heads=2, mlp_hidden=48, rope_theta=5e5)  # fmt: skip
        model = random_model(config, seed=5)
        path = tmp_path / "llama.safetensors"
        checkpoint.save_model(
            path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
        )
    assert main(["export-hf", str(path), "-o", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    blocks = hf.transformer.h if family == "gpt2" else hf.model.layers
    hd = model.config.head_dim
    ids = tok.encode("Once upon a time, there was a brave fox named Max.")
    for spec in ("0.1", "1.1,1.2", "0.0,0.3,1.mlp"):
        parts = parse(spec)
        hooks = []
        for part in parts:
            block = blocks[part.layer]
            if part.head is None:  # the MLP's output, its bias included
                hooks.append(block.mlp.register_forward_hook(lambda module, args, out: torch.zeros_like(out)))
                continue
            projection = block.attn.c_proj if family == "gpt2" else block.self_attn.o_proj

            def zero_head(module, args, head=part.head):
                (y,) = args
                y = y.clone()
                y[..., head * hd : (head + 1) * hd] = 0
                return (y,)

            hooks.append(projection.register_forward_pre_hook(zero_head))
        with torch.no_grad():
            theirs = torch.softmax(hf(torch.tensor([ids])).logits[0].double(), -1).numpy()
        for hook in hooks:
            hook.remove()
        with ablated(model, zero_ablation(model, parts)):
            ours = reference.softmax(model.forward(ids)[0].astype(np.float64))
        np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=spec)
