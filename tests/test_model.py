"""The whole GPT: gradients against finite differences in every config variant, overfitting,
the trace, generation with and without the KV cache, initialisation, save/load."""

import json
import math
import tracemalloc
import warnings

import numpy as np
import pytest
import safetensors.numpy

from tokenkit.transformer import GPT, AdamW, GPTConfig, ModelError
from tokenkit.transformer.block import GPT2Block, PreNormBlock
from tokenkit.transformer.config import llama_config, param_shapes
from tokenkit.transformer.io import read_metadata
from tokenkit.transformer.model import SINUSOIDAL_WTE_STD
from tokenkit.transformer.parallel import DataParallel

TINY = dict(vocab_size=7, context_length=6, d_model=8, n_layers=2, n_heads=2)
VARIANTS = {
    "gpt2": {},
    "sinusoidal": dict(positional="sinusoidal"),
    "relu": dict(activation="relu"),
    "post-norm": dict(norm="post"),
    "bidirectional": dict(causal=False),
    "no-bias": dict(bias=False),
    "seed001-encoder": dict(positional="sinusoidal", activation="relu", norm="post", causal=False, bias=False),
}
# Llama's family (issue 22) on TINY: 2 heads of 4, so n_kv_heads 1 is multi-query
LLAMA = dict(positional="rope", norm_type="rmsnorm", activation="swiglu", mlp_hidden=12, bias=False,
             tie_embeddings=False)  # fmt: skip
LLAMA_VARIANTS = {
    "llama": {**LLAMA, "n_kv_heads": 1, "rope_theta": 50.0, "norm_eps": 1e-3},
    "llama-mha-tied": {**LLAMA, "tie_embeddings": True},
    "qwen2": {**LLAMA, "n_kv_heads": 1, "qkv_bias": True},  # biases on q, k, v only
    "rope-layernorm-gelu-post": dict(positional="rope", norm="post", n_kv_heads=1),
    # Llama 3.1's RoPE scaling on TINY's heads of 4 (wavelengths 6.3 and 44): one blended, one divided
    "llama3-scaled": {
        **LLAMA,
        "n_kv_heads": 1,
        "rope_theta": 50.0,
        "rope_scaling": dict(
            type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=8
        ),
    },
    # every angle divided by 3 (with tied embeddings, as llama-mha-tied)
    "linear-scaled": {
        **LLAMA,
        "tie_embeddings": True,
        "rope_theta": 50.0,
        "rope_scaling": dict(type="linear", factor=3.0),
    },
}
VARIANTS.update(LLAMA_VARIANTS)


def float64_model(config: GPTConfig, seed: int = 0, scale: float = 0.4, workers: int = 1):
    """A model in float64 with weights far from init (so every path carries signal); with
    workers > 1, wrapped in DataParallel."""
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for name, p in model.params.items():
        base = 1.0 if (".ln_" in name or name.startswith("ln_f")) and name.endswith("weight") else 0.0
        model.params[name] = base + scale * rng.standard_normal(p.shape)
    return DataParallel(model, workers=workers) if workers > 1 else model


def rel_error(a, b):
    denom = np.linalg.norm(a) + np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / denom) if denom else 0.0


def numeric_gradients(model, ids, targets, eps: float = 1e-6) -> dict[str, np.ndarray]:
    """Central differences of model.loss(ids, targets) in every entry of every parameter (each
    changed in place and put back): the plain reference every backward pass is held to."""
    out = {}
    for name, p in model.params.items():
        numeric = np.zeros_like(p)
        flat, nflat = p.reshape(-1), numeric.reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + eps
            up = model.loss(ids, targets)
            flat[i] = old - eps
            down = model.loss(ids, targets)
            flat[i] = old
            nflat[i] = (up - down) / (2 * eps)
        out[name] = numeric
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_match_finite_differences(variant):
    config = GPTConfig(**TINY, **VARIANTS[variant])
    model = float64_model(config)
    rng = np.random.default_rng(3)
    ids, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    loss, grads = model.loss_and_grads(ids, targets)
    assert loss == pytest.approx(model.loss(ids, targets), rel=1e-14)
    assert list(grads) == list(model.params)
    for name, numeric in numeric_gradients(model, ids, targets).items():
        p = model.params[name]
        assert grads[name].shape == p.shape and grads[name].dtype == np.float64
        err = rel_error(grads[name], numeric)
        assert err < 1e-6, f"{variant} {name}: rel error {err:.2e}, max diff {np.abs(grads[name] - numeric).max():.2e}"


@pytest.mark.parametrize("variant", ["gpt2", "seed001-encoder", "llama"])
def test_batch_shards_in_worker_processes_give_the_same_results(variant):
    config = GPTConfig(**TINY, **VARIANTS[variant])
    one, three = float64_model(config, workers=1), float64_model(config, workers=3)
    rng = np.random.default_rng(4)
    ids, targets = rng.integers(0, 7, (5, 6)), rng.integers(0, 7, (5, 6))  # uneven shards: 2, 1, 2
    loss1, grads1 = one.loss_and_grads(ids, targets)
    loss3, grads3 = three.loss_and_grads(ids, targets)
    assert loss3 == pytest.approx(loss1, rel=1e-13) and three.loss(ids, targets) == pytest.approx(loss1, rel=1e-13)
    for name, g in grads1.items():
        np.testing.assert_allclose(grads3[name], g, rtol=1e-11, atol=1e-14, err_msg=name)
    np.testing.assert_allclose(three.forward(ids), one.forward(ids), rtol=1e-13)
    again = float64_model(config, workers=3).loss_and_grads(ids, targets)  # same seed, same shards
    assert again[0] == loss3 and all(np.array_equal(again[1][name], g) for name, g in grads3.items())
    with pytest.raises(ModelError):
        DataParallel(GPT(config), workers=0)


def test_loss_matches_plain_cross_entropy_of_forward():
    model = float64_model(GPTConfig(**TINY))
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 7, (3, 6)), rng.integers(0, 7, (3, 6))
    logits = model.forward(ids)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ref = -np.mean(np.take_along_axis(logp, targets[..., None], -1))
    assert model.loss(ids, targets) == pytest.approx(ref, rel=1e-12)
    # tied unembedding: logits are the final LayerNorm output against the token embedding
    trace = {}
    model.forward(ids, trace=trace)
    np.testing.assert_allclose(trace["logits"], trace["ln_f"] @ model.params["wte.weight"].T)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_overfits_a_fixed_batch(arch):
    sizes = dict(vocab_size=16, context_length=8, d_model=32, n_layers=2, n_heads=4)
    config = GPTConfig(**sizes) if arch == "gpt2" else llama_config(**sizes, n_kv_heads=2)
    model = GPT(config, seed=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, (4, 8))
    targets = rng.integers(0, 16, (4, 8))
    opt = AdamW(model.params, lr=3e-3, weight_decay=0.0)
    first = None
    for _ in range(300):
        loss, grads = model.loss_and_grads(ids, targets)
        first = loss if first is None else first
        opt.step(grads)
    assert first > 2.5 and model.loss(ids, targets) < 0.05


TRACE_BLOCK_KEYS = [
    "ln_1", "attn.q", "attn.k", "attn.v", "attn.scores_raw", "attn.scores", "attn.weights", "attn.mix",
    "attn.out", "resid_1", "ln_2", "mlp.pre", "mlp.act", "mlp.out", "resid_2",
]  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", ["gpt2", "sinusoidal", "bidirectional", "no-bias", "rope"])
def test_gpt2_block_computes_the_plain_pre_norm_block_s_bits(variant, dtype, monkeypatch):
    """Pre-norm LayerNorm + GELU blocks run as `GPT2Block`, over the ops a GPU fuses; on the CPU
    those are today's ops in a row, so loss, gradients, trace and tokens are `PreNormBlock`'s bits."""
    config = GPTConfig(**{**TINY, **VARIANTS.get(variant, dict(positional="rope"))})
    model = float64_model(config, seed=2)
    model.params = {k: v.astype(dtype) for k, v in model.params.items()}
    assert type(model._block()) is GPT2Block
    rng = np.random.default_rng(3)
    ids, targets = rng.integers(0, 7, (2, 6)), rng.integers(0, 7, (2, 6))

    def results():
        trace = {}
        model.forward(ids, trace=trace)
        return model.loss_and_grads(ids, targets), trace, list(model.generate([1, 2], 5, temperature=0))

    (loss, grads), trace, tokens = results()
    monkeypatch.setattr(GPT, "_block", lambda self: PreNormBlock(self.ops, self.config))
    (plain_loss, plain_grads), plain_trace, plain_tokens = results()
    assert loss == plain_loss and tokens == plain_tokens
    assert all(np.array_equal(grads[k], plain_grads[k]) for k in plain_grads) and grads.keys() == plain_grads.keys()
    assert trace.keys() == plain_trace.keys()
    assert all(np.array_equal(trace[k], plain_trace[k]) for k in plain_trace), "trace"


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_trace_records_the_forward(norm):
    config = GPTConfig(**{**TINY, "norm": norm})
    model = GPT(config, seed=1)
    ids = np.array([[1, 2, 3, 4], [4, 3, 2, 1]])
    trace = {}
    logits = model.forward(ids, trace=trace)
    np.testing.assert_array_equal(logits, model.forward(ids))
    np.testing.assert_array_equal(trace["logits"], logits)
    keys = {"tok_emb", "pos_emb", "x0", "ln_f", "logits"} | {f"h.{i}.{k}" for i in range(2) for k in TRACE_BLOCK_KEYS}
    assert set(trace) == keys
    B, T, C, H = 2, 4, 8, 2
    shapes = {"tok_emb": (B, T, C), "pos_emb": (T, C), "x0": (B, T, C), "h.0.attn.q": (B, H, T, C // H),
              "h.1.attn.weights": (B, H, T, T), "h.1.attn.mix": (B, H, T, C // H), "h.0.mlp.pre": (B, T, 4 * C),
              "h.1.resid_2": (B, T, C), "logits": (B, T, 7)}  # fmt: skip
    assert {k: trace[k].shape for k in shapes} == shapes
    np.testing.assert_allclose(trace["x0"], trace["tok_emb"] + trace["pos_emb"], rtol=1e-6)
    np.testing.assert_allclose(trace["h.0.attn.weights"].sum(-1), 1.0, rtol=1e-5)
    # residuals are snapshots, not views of a buffer updated later
    if norm == "pre":
        np.testing.assert_allclose(trace["h.0.resid_1"], trace["x0"] + trace["h.0.attn.out"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(
            trace["h.0.resid_2"], trace["h.0.resid_1"] + trace["h.0.mlp.out"], rtol=1e-5, atol=1e-7
        )
    else:
        ln = trace["h.0.ln_1"]
        np.testing.assert_allclose(ln.mean(-1), 0, atol=1e-5)
        np.testing.assert_allclose(trace["h.0.resid_2"], ln + trace["h.0.mlp.out"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_llama_trace_records_the_forward(n_kv_heads):
    """Rotary positions add nothing to x0 (no pos_emb); q and k are recorded rotated, per query
    head, k and v as each query head sees them; the MLP's pre-activation is SwiGLU's [gate | up]."""
    config = llama_config(vocab_size=7, context_length=6, d_model=16, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads)
    model = GPT(config, seed=1)
    ids = np.array([[1, 2, 3, 4], [4, 3, 2, 1]])
    trace = {}
    logits = model.forward(ids, trace=trace)
    np.testing.assert_array_equal(trace["logits"], logits)
    rotary = ["attn.q_pre", "attn.k_pre"]  # q and k before the rotation, for explain
    keys = {"tok_emb", "x0", "ln_f", "logits"} | {f"h.{i}.{k}" for i in range(2) for k in TRACE_BLOCK_KEYS + rotary}
    assert set(trace) == keys
    B, T, C, H, F = 2, 4, 16, 4, config.hidden
    assert trace["h.0.attn.q_pre"].shape == trace["h.0.attn.k_pre"].shape == (B, H, T, 4)
    np.testing.assert_array_equal(trace["h.0.attn.q_pre"][:, :, 0], trace["h.0.attn.q"][:, :, 0])  # position 0: angle 0
    np.testing.assert_array_equal(trace["h.0.attn.k_pre"][:, :, 0], trace["h.0.attn.k"][:, :, 0])
    shapes = {"x0": (B, T, C), "h.0.attn.q": (B, H, T, 4), "h.0.attn.k": (B, H, T, 4), "h.1.attn.weights": (B, H, T, T),
              "h.0.mlp.pre": (B, T, 2 * F), "h.0.mlp.act": (B, T, F), "logits": (B, T, 7)}  # fmt: skip
    assert {k: trace[k].shape for k in shapes} == shapes
    np.testing.assert_array_equal(trace["x0"], trace["tok_emb"])
    np.testing.assert_allclose(trace["h.0.resid_1"], trace["x0"] + trace["h.0.attn.out"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(trace["logits"], trace["ln_f"] @ model.params["lm_head.weight"].T, rtol=1e-5, atol=1e-6)
    group = 4 // n_kv_heads
    np.testing.assert_array_equal(trace["h.1.attn.v"][:, ::group], trace["h.1.attn.v"][:, group - 1 :: group])


def test_trace_off_keeps_nothing_extra():
    config = GPTConfig(vocab_size=64, context_length=32, d_model=64, n_layers=6, n_heads=4)
    model = GPT(config)
    ids = np.random.default_rng(0).integers(0, 64, (4, 32))
    model.forward(ids)  # warm up lazily built tables
    tracemalloc.start()
    try:
        logits = model.forward(ids)
        kept_off, peak_off = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        trace = {}
        model.forward(ids, trace=trace)
        _, peak_on = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    traced_bytes = sum(a.nbytes for a in trace.values())
    assert kept_off < logits.nbytes + 4096  # only the returned logits survive the call
    # without a trace the peak is about one block's intermediates, whatever the depth
    assert peak_off < traced_bytes / 3 < peak_on


def test_init_is_gpt2_and_seeded():
    config = GPTConfig(vocab_size=512, context_length=64, d_model=64, n_layers=4, n_heads=4)
    a, b, c = GPT(config, seed=5), GPT(config, seed=5), GPT(config, seed=6)
    for name, p in a.params.items():
        assert p.dtype == np.float32 and p.flags.c_contiguous
        np.testing.assert_array_equal(p, b.params[name])
    assert not np.array_equal(a.params["wte.weight"], c.params["wte.weight"])
    assert a.params["wte.weight"].std() == pytest.approx(0.02, rel=0.05)
    assert a.params["h.0.attn.c_attn.weight"].std() == pytest.approx(0.02, rel=0.05)
    resid = 0.02 / math.sqrt(2 * 4)
    assert a.params["h.1.attn.c_proj.weight"].std() == pytest.approx(resid, rel=0.05)
    assert a.params["h.3.mlp.c_proj.weight"].std() == pytest.approx(resid, rel=0.05)
    assert np.all(a.params["h.2.ln_1.weight"] == 1) and np.all(a.params["h.2.mlp.c_fc.bias"] == 0)
    assert a.params["h.0.attn.c_attn.weight"].shape == (64, 192)
    assert a.params["h.0.mlp.c_proj.weight"].shape == (256, 64)
    nobias = GPT(GPTConfig(**{**TINY, "bias": False, "positional": "sinusoidal"}))
    assert not any(k.endswith(".bias") for k in nobias.params) and "wpe.weight" not in nobias.params
    sinusoidal = GPT(GPTConfig(**{**config.to_dict(), "positional": "sinusoidal"}), seed=5)
    assert sinusoidal.params["wte.weight"].std() == pytest.approx(SINUSOIDAL_WTE_STD, rel=0.05)


def test_llama_params_names_shapes_and_init():
    """GPT-2's names in Llama's places: c_attn holds q, k, v side by side ((H + 2 Hkv) hd wide),
    c_fc holds SwiGLU's gate and up (2F wide), lm_head.weight only when untied, no biases but
    c_attn's with qkv_bias; RMSNorm gains 1, residual projections scaled as GPT-2's."""
    config = llama_config(vocab_size=512, context_length=64, d_model=64, n_layers=4, n_heads=8, n_kv_heads=2)
    m = GPT(config, seed=3)
    assert list(m.params) == list(param_shapes(config))
    assert m.params["h.0.attn.c_attn.weight"].shape == (64, (8 + 2 * 2) * 8)
    assert m.params["h.0.mlp.c_fc.weight"].shape == (64, 2 * 192) and m.params["h.0.mlp.c_proj.weight"].shape == (
        192,
        64,
    )
    assert m.params["lm_head.weight"].shape == (512, 64) and "wpe.weight" not in m.params
    assert not any(k.endswith(".bias") for k in m.params)
    assert np.all(m.params["h.1.ln_2.weight"] == 1) and np.all(m.params["ln_f.weight"] == 1)
    assert m.params["lm_head.weight"].std() == pytest.approx(0.02, rel=0.05)
    assert m.params["h.3.mlp.c_proj.weight"].std() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert not np.array_equal(m.params["lm_head.weight"], m.params["wte.weight"])
    qwen = GPTConfig(**{**config.to_dict(), "qkv_bias": True, "tie_embeddings": True})
    biases = [k for k in param_shapes(qwen) if k.endswith(".bias")]
    assert biases == [f"h.{i}.attn.c_attn.bias" for i in range(4)] and "lm_head.weight" not in param_shapes(qwen)
    assert param_shapes(qwen)["h.0.attn.c_attn.bias"] == (96,)
    assert config.n_params() == sum(p.size for p in m.params.values())
    layernorm_bias = GPTConfig(**{**config.to_dict(), "norm_type": "layernorm", "bias": True})
    assert "h.0.ln_1.bias" in param_shapes(layernorm_bias) and "h.0.attn.c_attn.bias" in param_shapes(layernorm_bias)


def _arithmetic_loss(positional: str, steps: int = 200) -> float:
    """Training loss after `steps` on sequences that count by a random stride mod V: predicting
    the next token needs the current token's identity."""
    V, T = 64, 32
    model = GPT(
        GPTConfig(vocab_size=V, context_length=T, d_model=32, n_layers=1, n_heads=2, positional=positional), seed=0
    )
    opt = AdamW(model.params, lr=3e-3)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        seq = (rng.integers(0, V, (16, 1)) + rng.integers(1, 4, (16, 1)) * np.arange(T + 1)) % V
        loss, grads = model.loss_and_grads(seq[:, :-1], seq[:, 1:])
        opt.step(grads)
    return loss


def test_sinusoidal_positions_do_not_swamp_the_tokens(monkeypatch):
    """With fixed sinusoids of amplitude 1, token embeddings at GPT-2's std 0.02 are drowned out
    and the model learns slowly; at SINUSOIDAL_WTE_STD it keeps up with learned positions."""
    learned, sinusoidal = _arithmetic_loss("learned"), _arithmetic_loss("sinusoidal")
    monkeypatch.setattr("tokenkit.transformer.model.SINUSOIDAL_WTE_STD", 0.02)
    swamped = _arithmetic_loss("sinusoidal")
    assert sinusoidal < 0.8 * swamped and sinusoidal < 1.5 * learned, (learned, sinusoidal, swamped)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize(
    "sampling", [dict(temperature=0), dict(temperature=0.9, seed=3), dict(temperature=1.3, top_k=4, top_p=0.8, seed=4)]
)
def test_kv_cache_generates_the_same_tokens(norm, sampling):
    config = GPTConfig(vocab_size=20, context_length=12, d_model=16, n_layers=2, n_heads=2, norm=norm)
    model = float64_model(config, scale=0.5)
    prompt = [3, 1, 4, 1, 5]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cached = list(model.generate(prompt, 15, **sampling))  # runs past context_length: the window slides
        plain = list(model.generate(prompt, 15, use_cache=False, **sampling))
    assert cached == plain and len(cached) == 15
    assert sum("context_length" in str(w.message) for w in caught) == 2
    if sampling["temperature"] == 0:  # greedy: every token is the argmax of the full forward over its window
        tokens, start, T = prompt + cached, 0, config.context_length
        for n in range(len(prompt), len(tokens)):
            if n - start > T:  # the documented context shift: keep the last T // 2 tokens
                start = n - T // 2
            assert tokens[n] == int(np.argmax(model.forward(tokens[start:n])[0, -1])), n
        assert start == len(prompt) + 8 - T // 2  # one shift happened: 13 tokens do not fit in 12


@pytest.mark.parametrize("n_kv_heads, scaling", [(1, None), (2, None), (4, None), (2, "llama3")])
def test_kv_cache_generates_the_same_tokens_with_llama_configs(n_kv_heads, scaling):
    """The KV cache holds n_kv_heads heads and rotary positions are applied at each new
    position's offset (their angles scaled alike): with and without it, the same tokens,
    through a context shift."""
    config = llama_config(vocab_size=20, context_length=12, d_model=16, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                          rope_scaling=scaling and VARIANTS["llama3-scaled"]["rope_scaling"])  # fmt: skip
    model = float64_model(config, scale=0.5)
    prompt = [3, 1, 4, 1, 5]
    runs = {}
    for name, sampling in (("greedy", dict(temperature=0)), ("sampled", dict(temperature=0.9, seed=3))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs[name] = list(model.generate(prompt, 15, **sampling))
            assert list(model.generate(prompt, 15, use_cache=False, **sampling)) == runs[name]
        assert len(runs[name]) == 15
    tokens = prompt + runs["greedy"]  # each token is the argmax of the full forward over its window
    for n in range(len(prompt), 12):
        assert tokens[n] == int(np.argmax(model.forward(tokens[:n])[0, -1])), n


def test_generation_seeds_stops_and_crops():
    model = float64_model(GPTConfig(vocab_size=20, context_length=8, d_model=16, n_layers=1, n_heads=2), scale=0.5)
    run = lambda seed, **kw: list(model.generate([1, 2, 3], 30, temperature=1.0, seed=seed, **kw))  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(7) == run(7) and run(7) != run(8)
        stop = run(7)[4]
        out = run(7, stop_token=stop)
        assert out[-1] == stop and stop not in out[:-1]
    with pytest.warns(UserWarning, match="context_length 8"):
        assert len(list(model.generate(list(range(12)), 2, temperature=0))) == 2
    assert list(model.generate([1, 2], 0)) == []
    with pytest.raises(ModelError):
        model.generate([1, 2], 3, temperature=-1)
    with pytest.raises(ModelError):
        model.generate([1, 99], 3)


@pytest.mark.parametrize("variant", ["gpt2", "post-norm", "bidirectional", "llama", "qwen2"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_batch_gives_each_prompt_its_greedy_tokens(variant, use_cache):
    """Batched greedy decoding: row b's tokens are generate(prompt b, temperature=0)'s, through a
    context shift (5 + 15 tokens in a context of 12), with and without the KV cache."""
    config = GPTConfig(vocab_size=20, context_length=12, d_model=16, n_layers=2, n_heads=4, **VARIANTS[variant])
    model = float64_model(config, scale=0.5)
    prompts = np.random.default_rng(2).integers(0, 20, (4, 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = list(model.generate_batch(prompts, 15, use_cache=use_cache))
        rows = [list(model.generate(p, 15, temperature=0)) for p in prompts]
    assert len(steps) == 15 and all(s.shape == (4,) for s in steps)
    got = np.stack(steps, axis=1)  # (B, 15)
    assert got.tolist() == rows, (got.tolist(), rows)
    assert sum("context_length" in str(w.message) for w in caught) == 1 + len(prompts)  # one per run


def test_generate_batch_checks_its_arguments_and_masks_padded_ids():
    model = float64_model(GPTConfig(vocab_size=20, context_length=8, d_model=16, n_layers=1, n_heads=2), scale=0.5)
    prompts = np.array([[1, 2, 3], [4, 5, 6]])
    free = np.stack(list(model.generate_batch(prompts, 6)), axis=1)
    masked = np.stack(list(model.generate_batch(prompts, 6, n_tokens=int(free.min()) + 1)), axis=1)
    assert masked.max() <= free.min()
    for p, row in zip(prompts, masked, strict=True):
        assert list(model.generate(p, 6, temperature=0, n_tokens=int(free.min()) + 1)) == row.tolist()
    assert list(model.generate_batch(prompts, 0)) == []
    one = np.stack(list(model.generate_batch(prompts[:1], 6)), axis=1)  # a batch of one: the first row
    assert one.tolist() == free[:1].tolist()
    for bad in (dict(ids=[1, 2, 3]), dict(ids=np.zeros((2, 0), int)), dict(ids=[[1, 99]]),
                dict(max_new_tokens=-1), dict(max_new_tokens=1.5), dict(n_tokens=21)):  # fmt: skip
        args = dict(ids=prompts, max_new_tokens=3) | bad
        with pytest.raises(ModelError):
            model.generate_batch(args.pop("ids"), **args)


def test_bad_inputs_are_model_errors():
    model = GPT(GPTConfig(**TINY))
    for bad in (np.array([[0, 7]]), np.zeros((1, 7), int), np.array([[0.5, 1]]), np.zeros((1, 0), int)):
        with pytest.raises(ModelError):
            model.forward(bad)
    with pytest.raises(ModelError):
        model.loss_and_grads(np.zeros((1, 3), int), np.zeros((1, 4), int))
    for bad in (dict(d_model=10, n_heads=3), dict(norm="middle"), dict(n_layers=0), dict(causal="yes"),
                dict(n_kv_heads=3, n_heads=2), dict(n_kv_heads=0), dict(n_kv_heads=True), dict(norm_type="batchnorm"),
                dict(norm_eps=0.0), dict(norm_eps=float("nan")), dict(norm_eps="1e-5"), dict(rope_theta=-1.0),
                dict(rope_theta=float("inf")), dict(mlp_hidden=0), dict(mlp_hidden=2.5), dict(tie_embeddings=None),
                dict(qkv_bias="yes"), dict(activation="geglu"),
                dict(positional="rope", d_model=6, n_heads=2), dict(rope_scaling={"type": "linear", "factor": 2.0}),
                *(dict(positional="rope", rope_scaling=bad) for bad in (
                    {"type": "yarn", "factor": 2.0}, {"type": "linear"}, {"type": "linear", "factor": 0.5},
                    {"type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, {"type": ["llama3"]}, "llama3",
                    {"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                     "original_context_length": 8192},
                    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_context_length": 8192.0},
                    {"type": "linear", "factor": float("nan")}))):  # fmt: skip
        with pytest.raises(ModelError) as err:
            GPTConfig(**{**TINY, **bad})
        assert "\n" not in str(err.value) and str(err.value).startswith("config: ")
    with pytest.raises(ModelError):
        GPTConfig.from_dict({**TINY, "dropout": 0.1})
    config = GPTConfig(**TINY, positional="sinusoidal")
    assert GPTConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_save_load_round_trip(tmp_path):
    config = GPTConfig(**{**TINY, "activation": "relu", "norm": "post"})
    model = GPT(config, seed=9)
    path = tmp_path / "model.safetensors"
    extra = {"tokenizer.merges": np.arange(6, dtype=np.int32).reshape(3, 2)}
    model.save(path, metadata={"step": "12"}, extra_tensors=extra)
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temp files left
    assert path.stat().st_mode & 0o777 == 0o644  # readable like any file, not the temp file's 0600
    loaded = GPT.load(path)
    assert loaded.config == config and list(loaded.params) == list(model.params)
    for name, p in model.params.items():
        np.testing.assert_array_equal(loaded.params[name], p)
    meta = read_metadata(path)
    assert meta["step"] == "12" and json.loads(meta["config"]) == config.to_dict()
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(loaded.forward(ids), model.forward(ids))


@pytest.mark.parametrize("scaling", [None, dict(type="linear", factor=4.0)])
def test_llama_config_and_model_round_trip_through_a_file(tmp_path, scaling):
    config = llama_config(vocab_size=11, context_length=8, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2,
                          rope_theta=500000.0, norm_eps=1e-6, qkv_bias=True, rope_scaling=scaling)  # fmt: skip
    model = float64_model(config)
    model.params = {k: v.astype(np.float32) for k, v in model.params.items()}
    model.save(tmp_path / "llama.safetensors")
    loaded = GPT.load(tmp_path / "llama.safetensors")
    assert loaded.config == config and list(loaded.params) == list(model.params)
    ids = np.array([[1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(loaded.forward(ids), model.forward(ids))
    meta = json.loads(read_metadata(tmp_path / "llama.safetensors")["config"])
    assert meta["positional"] == "rope" and meta["n_kv_heads"] == 2 and meta["tie_embeddings"] is False
    assert meta["rope_theta"] == 500000.0 and meta["norm_type"] == "rmsnorm" and meta["qkv_bias"] is True
    assert meta.get("rope_scaling") == scaling  # recorded when there is one; absent (None) otherwise


def test_gpt2_style_configs_are_written_as_before():
    """The fields of Llama's family stay out of a GPT-2-style config's JSON (older versions of
    tk refuse unknown fields), and a config without them reads as GPT-2's choices."""
    old_keys = ["vocab_size", "context_length", "d_model", "n_layers", "n_heads", "positional", "activation", "norm",
                "causal", "bias"]  # fmt: skip
    for kw in VARIANTS.values():
        if not set(kw) & set(LLAMA) - {"bias"} and "n_kv_heads" not in kw:
            assert list(GPTConfig(**TINY, **kw).to_dict()) == old_keys
    old = dict(zip(old_keys, [7, 6, 8, 2, 2, "learned", "gelu", "pre", True, True], strict=True))
    config = GPTConfig.from_dict(old)
    assert (config.norm_type, config.norm_eps, config.kv_heads, config.hidden, config.tie_embeddings) == (
        "layernorm", 1e-5, 2, 32, True)  # fmt: skip
    for kw in LLAMA_VARIANTS.values():
        config = GPTConfig(**TINY, **kw)
        assert GPTConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    # one spelling per model: values that say the default are the default
    assert GPTConfig(**TINY, n_kv_heads=2, mlp_hidden=32, qkv_bias=True) == GPTConfig(**TINY)
    assert GPTConfig(**TINY, n_kv_heads=2).n_kv_heads is None and GPTConfig(**TINY, n_kv_heads=1).n_kv_heads == 1
    assert llama_config(**TINY, mlp_hidden=64, qkv_bias=False) == llama_config(**TINY)
    assert list(GPTConfig(**TINY, n_kv_heads=2, mlp_hidden=32, qkv_bias=True).to_dict()) == old_keys


# sha256 of GPT(config, seed=3).save(path) as the code before Llama's family (main at e8da87a)
# wrote these files: files written now are the same bytes, so the files it wrote load as they did
MAIN_WRITTEN = {
    "gpt2": ({}, "5885a0ba33d781c364a98d2c771aaa187378267044d9f26950e7f8c0cbf38699"),
    "seed001": (dict(positional="sinusoidal", activation="relu", norm="post", bias=False, causal=False),
                "88bb6f79055b5d1f4f5056a3ec940db1d179f2b25935529f0b4a4121aa2f8f97"),
}  # fmt: skip


@pytest.mark.parametrize("name", MAIN_WRITTEN)
def test_model_files_are_the_bytes_the_code_before_llama_wrote(tmp_path, name):
    import hashlib

    variant, digest = MAIN_WRITTEN[name]
    config = GPTConfig(vocab_size=50, context_length=8, d_model=16, n_layers=1, n_heads=2, **variant)
    path = tmp_path / "m.safetensors"
    GPT(config, seed=3).save(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    loaded = GPT.load(path)
    assert loaded.config == config and loaded.config.n_kv_heads is None and loaded.config.norm_type == "layernorm"
    assert loaded.config.architecture == ("gpt2" if name == "gpt2" else "custom")


def test_loads_gpt2_style_state_dicts(tmp_path):
    """Keys prefixed with `transformer.`, no config (inferred, head size 64), GPT-2's mask buffers
    and foreign tensors ignored."""
    config = GPTConfig(vocab_size=11, context_length=5, d_model=64, n_layers=2, n_heads=1)
    model = GPT(config, seed=2)
    tensors = {f"transformer.{k}": v for k, v in model.params.items()}
    tensors["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 5, 5), np.float32))
    tensors["lm_head.weight"] = model.params["wte.weight"]
    tensors["tokenizer.vocab"] = np.zeros(3, np.uint8)
    path = tmp_path / "gpt2.safetensors"
    path.write_bytes(safetensors.numpy.save(tensors, metadata={"format": "pt"}))
    loaded = GPT.load(path)
    assert loaded.config == config
    for name, p in model.params.items():
        np.testing.assert_array_equal(loaded.params[name], p)


def test_bad_files_are_one_line_model_errors(tmp_path):
    config = GPTConfig(**TINY)
    good = tmp_path / "good.safetensors"
    GPT(config).save(good)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-100])
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"definitely not safetensors")
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(safetensors.numpy.save({"conv.weight": np.zeros((3, 3), np.float32)}))
    wrong_shape = tmp_path / "wrong_shape.safetensors"
    tensors = dict(GPT(config).params, **{"wte.weight": np.zeros((9, 8), np.float32)})
    wrong_shape.write_bytes(safetensors.numpy.save(tensors, metadata={"config": json.dumps(config.to_dict())}))
    missing = tmp_path / "missing.safetensors"
    missing.write_bytes(safetensors.numpy.save({"wte.weight": np.zeros((7, 8), np.float32)},
                                               metadata={"config": json.dumps(config.to_dict())}))  # fmt: skip
    bad_json = tmp_path / "bad_json.safetensors"
    bad_json.write_bytes(safetensors.numpy.save(GPT(config).params, metadata={"config": "{nope"}))
    for path in (tmp_path / "absent.safetensors", truncated, garbage, foreign, wrong_shape, missing, bad_json):
        with pytest.raises(ModelError) as err:
            GPT.load(path)
        assert "\n" not in str(err.value) and path.name in str(err.value), str(err.value)
    with pytest.raises(ModelError):
        GPT(config).save(tmp_path / "no_such_dir" / "m.safetensors")


def test_docstring_examples():
    import doctest

    import tokenkit.transformer.config
    import tokenkit.transformer.model
    import tokenkit.transformer.ops
    import tokenkit.transformer.optim
    import tokenkit.transformer.sampling

    for module in (
        tokenkit.transformer.config,
        tokenkit.transformer.model,
        tokenkit.transformer.ops,
        tokenkit.transformer.optim,
        tokenkit.transformer.sampling,
    ):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
