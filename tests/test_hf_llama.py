"""Llama's family to and from transformers (issue 22): `tk import-hf` of LlamaForCausalLM,
MistralForCausalLM and Qwen2ForCausalLM directories, `tk export-hf` of a Llama-style tk model.

With transformers and torch (`pip install -e '.[interop]'`): random tiny models of each family
(tied and untied, fewer K/V heads than heads, Qwen2's q, k, v biases, Llama's attention and MLP
biases, float32 and bfloat16, one file and shards) saved by `save_pretrained` beside a
byte-level BPE tokenizer.json made by the tokenizers library (Llama 3's split, one with
`ignore_merges` where it matters; Qwen2's split and NFC), imported by `tk import-hf`: the
next-token probabilities are transformers' within 1e-4 (float32) and the tokenizer gives
AutoTokenizer's ids; exported back by `tk export-hf`, transformers loads LlamaForCausalLM and
predicts the same; so do llama3- and linear-scaled RoPE models, past the original context, and
fine-tuned by train-model. Without them: tk's own export read back gives identical weights and
probabilities (RoPE scalings included), a scaled model fine-tunes with its scaling and resumes
bit-exactly, and what tk does not compute is refused in one line, naming it (other RoPE
scalings, sliding window, head_dim, activation, SentencePiece tokenizers, a BOS template).
Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as safetensors_numpy
from conftest import signal_at_step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reliability_interop import cli, one_line_error  # the same one-line checks
from test_tokenizer_options import LLAMA3_PATTERN, ODD_MERGES, hf_bpe  # the same tokenizers

from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.bpe.hf_import import QWEN2_PATTERN
from tokenkit.cli.main import main
from tokenkit.common import safetensors_file
from tokenkit.pipeline import PipelineError, checkpoint, hf_llama, train_state, trainlog
from tokenkit.transformer import GPT, GPTConfig
from tokenkit.transformer.config import llama_config

ROOT = Path(__file__).parents[1]
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TEXTS = ["Once upon a time, there was a fox named Max.", "  it's 2024!\n\nDON'T  stop", "café cafe\u0301 naïve",
         "abc abcd xabc", f"{EOS}The end."]  # fmt: skip
SIZES = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)  # fmt: skip


def corpus() -> str:
    return (ROOT / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8")[:20_000] + " café naïve 2024 " * 40


# --- without transformers: tk's own Llama export, read back and edited --------------------------


@pytest.fixture(scope="module")
def tk_tok() -> Tokenizer:
    return Tokenizer.train([corpus().encode()], vocab_size=300, pattern=LLAMA3_PATTERN, special_tokens=[BOS, EOS],
                           quiet=True, workers=1)  # fmt: skip


def make_model(path: Path, tok: Tokenizer, seed: int = 0, **variant) -> GPT:
    """A random Llama-style tk model whose every weight matters (gains far from 1, biases from 0)."""
    shape = dict(vocab_size=tok.vocab_size, context_length=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                 mlp_hidden=48, rope_theta=5e5, norm_eps=1e-5)  # fmt: skip
    config = llama_config(**{**shape, **variant})
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed)
    for name, value in model.params.items():
        value[...] = rng.normal(1.0 if "ln" in name else 0.0, 0.3, value.shape)
    checkpoint.save_model(
        path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
    )
    return model


def probs(model: GPT, ids: np.ndarray) -> np.ndarray:
    logits = model.forward(ids).astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def exported(tmp_path: Path, capsys, tok: Tokenizer, **variant) -> tuple[GPT, Path]:
    model = make_model(tmp_path / "m.safetensors", tok, **variant)
    code, out, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")
    assert code == 0 and "LlamaForCausalLM" in out, err
    return model, tmp_path / "hf"


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")


VARIANTS = {
    "gqa-untied": dict(),
    "mqa-tied": dict(n_kv_heads=1, tie_embeddings=True),
    "qwen2-biases": dict(bias=False, qkv_bias=True, tie_embeddings=True),
    "all-biases": dict(bias=True),
    "biases-but-qkv": dict(bias=True, qkv_bias=False),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_then_import_gives_the_same_model(variant, tk_tok, tmp_path, capsys):
    """Every Llama-style shape comes back as it went: biases Llama's config makes the export
    hold as zeros (o_proj's beside Qwen2-style q, k, v biases; q, k, v's beside the others) are
    left out again."""
    model, hf = exported(tmp_path, capsys, tk_tok, **VARIANTS[variant])
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 5e5}
    assert (config["num_key_value_heads"], config["tie_word_embeddings"]) == (model.config.kv_heads,
                                                                             model.config.tie_embeddings)  # fmt: skip
    entries, _ = safetensors_file.read_header(hf / "model.safetensors")
    assert ("lm_head.weight" in entries) is not model.config.tie_embeddings
    assert entries["model.layers.0.self_attn.q_proj.weight"]["shape"] == [32, 32]  # torch's (out, in)
    assert entries["model.layers.0.self_attn.k_proj.weight"]["shape"] == [model.config.kv_heads * 8, 32]
    code, out, err = cli(capsys, "import-hf", hf, "-o", tmp_path / "back.safetensors")
    assert code == 0 and "of LlamaForCausalLM" in out, err
    back = checkpoint.load_model(tmp_path / "back.safetensors").model
    assert back.config == model.config
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], value, err_msg=name)
    assert set(back.params) == set(model.params)


def test_a_llama_file_is_its_configs_names_transposed(tk_tok, tmp_path, capsys):
    """The layout itself, not only the round trip: q, k, v are c_attn's columns, torch's (out, in)."""
    model, hf = exported(tmp_path, capsys, tk_tok, bias=False, qkv_bias=True)
    tensors, _ = safetensors_file.read(hf / "model.safetensors")
    p = model.params
    np.testing.assert_array_equal(
        tensors["model.layers.1.self_attn.q_proj.weight"], p["h.1.attn.c_attn.weight"][:, :32].T
    )
    np.testing.assert_array_equal(tensors["model.layers.1.self_attn.v_proj.bias"], p["h.1.attn.c_attn.bias"][48:])
    np.testing.assert_array_equal(tensors["model.layers.0.mlp.up_proj.weight"], p["h.0.mlp.c_fc.weight"][:, 48:].T)
    np.testing.assert_array_equal(tensors["model.layers.0.mlp.down_proj.weight"], p["h.0.mlp.c_proj.weight"].T)
    np.testing.assert_array_equal(tensors["model.norm.weight"], p["ln_f.weight"])
    assert not tensors["model.layers.0.self_attn.o_proj.bias"].any()  # Qwen2's biases as Llama's attention_bias
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    assert (config["attention_bias"], config["mlp_bias"], config["head_dim"]) == (True, False, 8)


def test_mistral_and_qwen2_configs_read_as_their_families(tk_tok, tmp_path, capsys):
    model, hf = exported(tmp_path, capsys, tk_tok, bias=False, qkv_bias=True)
    edit_config(hf, model_type="qwen2", attention_bias=None, use_sliding_window=False, sliding_window=4096)
    tensors, _ = safetensors_file.read(hf / "model.safetensors")
    qwen2 = {n: a for n, a in tensors.items() if "o_proj.bias" not in n}  # Qwen2 has no o_proj bias
    (hf / "model.safetensors").write_bytes(safetensors_file.serialize(qwen2, {"format": "pt"}))
    tk_tok.export_hf(hf, overwrite=True)  # its split is not Qwen2's: transformers would split otherwise
    one_line_error(cli(capsys, "import-hf", hf, "-o", tmp_path / "q.safetensors"), "Qwen2Tokenizer", "Qwen2's pattern")
    (hf / "tokenizer_config.json").unlink()
    qwen2_tok = Tokenizer(tk_tok.merges, special_tokens=["<|endoftext|>", "<|im_start|>"], pattern=QWEN2_PATTERN,
                          normalizer="nfc")  # fmt: skip
    qwen2_tok.export_hf(hf, overwrite=True)
    code, out, err = cli(capsys, "import-hf", hf, "-o", tmp_path / "q.safetensors")
    assert code == 0 and "of Qwen2ForCausalLM" in out, err
    back, tok, _ = checkpoint.load_model(tmp_path / "q.safetensors")
    assert back.config == model.config and tok.normalizer == "nfc"
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], value, err_msg=name)
    # Mistral: no biases at all; a sliding window at least the context long never bites
    (tmp_path / "m").mkdir()
    _, hf = exported(tmp_path / "m", capsys, tk_tok)
    edit_config(hf, model_type="mistral", attention_bias=None, mlp_bias=None, sliding_window=64)
    code, out, err = cli(capsys, "import-hf", hf, "-o", tmp_path / "mistral.safetensors")
    assert code == 0 and "of MistralForCausalLM" in out, err


@pytest.mark.parametrize(
    "kind, changes, fragments",
    [
        ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0}},
         ["RoPE scaling 'yarn'", "tk computes the default RoPE, linear and llama3"]),
        ("llama", {"rope_parameters": None, "rope_theta": 1e4, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
         ["RoPE scaling 'dynamic'"]),
        ("llama", {"rope_scaling": {"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}},
         ["RoPE scaling 'longrope'"]),
        ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
         ["RoPE scaling 'llama3' lacks low_freq_factor"]),
        ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 5e5, "factor": 8.0, "beta_fast": 32}},
         ["rope_parameters holds 'beta_fast', which linear does not take"]),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 0.5}},
         ["rope_scaling factor must be a number from 1"]),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
         ["partial_rotary_factor 0.5"]),
        ("mistral", {"sliding_window": 16}, ["sliding_window 16 is shorter than the context (64)"]),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "layer_types": ["full_attention",
                                                                                    "sliding_attention"]},
         ["sliding_window 16"]),
        ("llama", {"head_dim": 16}, ["head_dim 16 is not hidden_size / num_attention_heads (32 / 4)"]),
        ("llama", {"hidden_act": "gelu"}, ["hidden_act 'gelu' is not SiLU"]),
        ("llama", {"max_position_embeddings": 131072}, ["max_position_embeddings 131,072 is beyond"]),
        ("llama", {"num_key_value_heads": 3}, ["n_heads (4) must be divisible by n_kv_heads (3)"]),
        ("llama", {"attention_bias": True}, ["lacks 8 tensor(s)", "self_attn.", "_proj.bias"]),
        ("llama", {"tie_word_embeddings": False, "_drop": "lm_head.weight"}, ["there is no lm_head.weight"]),
    ],
)  # fmt: skip
def test_what_tk_does_not_compute_is_refused_naming_it(kind, changes, fragments, tk_tok, tmp_path, capsys):
    _, hf = exported(tmp_path, capsys, tk_tok, tie_embeddings=kind != "llama")
    changes = dict(changes)
    drop = changes.pop("_drop", None)
    if drop:
        tensors, _ = safetensors_file.read(hf / "model.safetensors")
        tensors.pop(drop, None)
        (hf / "model.safetensors").write_bytes(safetensors_file.serialize(tensors, {"format": "pt"}))
    if kind != "llama":
        edit_config(hf, model_type=kind, attention_bias=None, mlp_bias=None)
    if kind == "qwen2":  # its tokenizer as Qwen2Tokenizer reads it, so that only the model is refused
        Tokenizer(tk_tok.merges, special_tokens=["<|endoftext|>", BOS], pattern=QWEN2_PATTERN,
                  normalizer="nfc").export_hf(hf, overwrite=True)  # fmt: skip
    edit_config(hf, **changes)
    one_line_error(cli(capsys, "import-hf", hf, "-o", tmp_path / "x.safetensors"), *fragments)
    assert not (tmp_path / "x.safetensors").exists()


def test_a_padded_vocabulary_round_trips_and_a_short_one_is_one_line(tk_tok, tmp_path, capsys):
    """A model with more rows of embeddings than its tokenizer has tokens (Qwen2's checkpoints,
    others padded to a multiple of 64) exports and imports with every row; one with fewer is
    refused in one line, naming both sizes."""
    model, hf = exported(tmp_path, capsys, tk_tok, vocab_size=tk_tok.vocab_size + 20)
    assert json.loads((hf / "config.json").read_text(encoding="utf-8"))["vocab_size"] == tk_tok.vocab_size + 20
    code, out, err = cli(capsys, "import-hf", hf, "-o", tmp_path / "back.safetensors")
    assert code == 0, err
    back, tok, meta = checkpoint.load_model(tmp_path / "back.safetensors")
    assert back.config == model.config and tok.vocab_size == tk_tok.vocab_size
    assert meta["provenance"]["hf_architecture"] == "LlamaForCausalLM"
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], value, err_msg=name)
    edit_config(hf, vocab_size=tk_tok.vocab_size - 10)
    one_line_error(cli(capsys, "import-hf", hf, "-o", tmp_path / "x.safetensors"),
                   f"the tokenizer has {tk_tok.vocab_size} tokens but config.json's vocab_size is "
                   f"{tk_tok.vocab_size - 10}", "give the tokenizer saved with this model")  # fmt: skip
    assert not (tmp_path / "x.safetensors").exists()
    # a tokenizer given with -t has the model's own tokenizer's size, not the padded vocabulary's
    Tokenizer.train([corpus().encode()], vocab_size=tk_tok.vocab_size + 20, quiet=True).save(tmp_path / "t.safetensors")
    one_line_error(cli(capsys, "predict-next", "-m", tmp_path / "back.safetensors", "-t", tmp_path / "t.safetensors",
                       "Once"), f"the tokenizer has {tk_tok.vocab_size + 20} tokens but the one in")  # fmt: skip


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 70_000) | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=5,
)
CONFIG_KEYS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
               "intermediate_size", "max_position_embeddings", "rms_norm_eps", "rope_parameters", "rope_theta",
               "rope_scaling", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
               "tie_word_embeddings", "attention_bias", "mlp_bias", "vocab_size", "num_hidden_layers"]  # fmt: skip


@pytest.fixture(scope="module")
def exported_once(tk_tok, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("once")
    make_model(base / "m.safetensors", tk_tok)
    assert main([str(a) for a in ("export-hf", base / "m.safetensors", "-o", base / "hf")]) == 0
    return base / "hf"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["llama", "mistral", "qwen2"]), key=st.sampled_from(CONFIG_KEYS), value=JSON_VALUES)
def test_any_config_value_imports_or_fails_in_one_line(kind, key, value, exported_once, tmp_path_factory):
    """config.json with any value in any of the keys tk reads: a model, or one PipelineError line."""
    config = json.loads((exported_once / "config.json").read_text(encoding="utf-8"))
    config.update({"model_type": kind, key: value})
    try:
        imported = hf_llama.gpt_config("config.json", config)
    except PipelineError as err:
        assert "\n" not in str(err) and str(err).startswith("config.json: "), err
        return
    assert imported.config.positional == "rope"


LLAMA3 = dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=16)
HF_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 16}  # fmt: skip


@pytest.mark.parametrize("scaling", [LLAMA3, dict(type="linear", factor=4.0)])
def test_rope_scalings_are_written_as_transformers_writes_them_and_read_back(scaling, tk_tok, tmp_path, capsys):
    """config.json holds the scaling in transformers 5's rope_parameters (rope_theta inside) and
    in rope_scaling beside rope_theta (what transformers 4 reads, and 5 first); the import gives
    the same config and weights back."""
    model, hf = exported(tmp_path, capsys, tk_tok, rope_scaling=scaling)
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    theirs = HF_LLAMA3 if scaling is LLAMA3 else {"rope_type": "linear", "factor": 4.0}
    assert config["rope_parameters"] == {**theirs, "rope_theta": 5e5}
    assert config["rope_scaling"] == theirs and config["rope_theta"] == 5e5
    code, out, err = cli(capsys, "import-hf", hf, "-o", tmp_path / "back.safetensors")
    assert code == 0, err
    back = checkpoint.load_model(tmp_path / "back.safetensors").model
    assert back.config == model.config and back.config.rope_scaling.to_dict() == scaling
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], value, err_msg=name)
    # either spelling alone reads the same: transformers 5's, and the older one without rope_parameters
    for keep in ("rope_parameters", "rope_scaling"):
        edited = {k: v for k, v in config.items() if k not in {"rope_parameters", "rope_scaling"} - {keep}}
        assert hf_llama.gpt_config("config.json", edited).config == model.config, keep


def losses(run_dir: Path) -> list[tuple]:
    """A run's logged training and validation losses, step by step."""
    records = trainlog.read_log(run_dir / checkpoint.LOG_FILE)
    return [(r["type"], r["step"], r.get("loss"), r.get("val_loss")) for r in records if r["type"] in ("step", "eval")]


@pytest.mark.parametrize("scaling", [LLAMA3, dict(type="linear", factor=4.0)], ids=["llama3", "linear"])
def test_a_scaled_model_fine_tunes_scaled_resumes_bit_exactly_and_exports(scaling, tk_tok, tmp_path, monkeypatch,
                                                                          capsys):  # fmt: skip
    """train-model --init-from a RoPE-scaled model trains it with its scaling (on windows of 64, past
    the original context of 16): the run records the scaling among its settings (a flag that
    contradicts it is one line), Ctrl-C then --resume gives the bits of an uninterrupted run, and
    the fine-tuned model goes save -> load -> export-hf -> import-hf with its scaling and weights.
    The same weights unscaled train to other losses (the premise)."""

    original = make_model(tmp_path / "m.safetensors", tk_tok, rope_scaling=scaling).config
    unscaled = GPTConfig.from_dict({**original.to_dict(), "rope_scaling": None})
    params = checkpoint.load_model(tmp_path / "m.safetensors").model.params
    checkpoint.save_model(tmp_path / "u.safetensors", params, tk_tok, config=unscaled.to_dict(), step=0, val_loss=None,
                          best_val_loss=None, provenance={})  # fmt: skip
    (tmp_path / "corpus.txt").write_text(corpus()[:6000], encoding="utf-8")
    flags = ["--steps", "6", "--eval-interval", "2", "--eval-batches", "1", "--batch-size", "2", "--lr", "1e-3",
             "--workers", "1", "-q"]  # fmt: skip

    def train(init: str, out: str, *more: str):
        return cli(capsys, "train-model", tmp_path / "corpus.txt", "--init-from", tmp_path / init, "-o", tmp_path / out,
                   *flags, *more)  # fmt: skip

    code, _, err = train("m.safetensors", "whole", "--rope-scaling", scaling["type"])  # agreeing: fine
    assert code == 0, err
    tuned = checkpoint.load_model(tmp_path / "whole").model
    assert tuned.config == original and tuned.config.rope_scaling.to_dict() == scaling
    state = train_state.load_train_state(tmp_path / "whole" / checkpoint.STATE_FILE)
    recorded = state.train_config
    assert (recorded["rope_scaling"], recorded["rope_factor"]) == (scaling["type"], scaling["factor"])
    one_line_error(train("m.safetensors", "x", "--rope-factor", "2"), "--rope-factor 2.0 contradicts the model",
                   "(" + str(scaling["factor"]) + "); drop the flag")  # fmt: skip
    one_line_error(train("m.safetensors", "x", "--rope-scaling", "none"), "--rope-scaling none contradicts the model")
    assert not (tmp_path / "x").exists()

    restore = signal_at_step(monkeypatch, 3)
    code, _, err = train("m.safetensors", "split")
    assert code == 130 and "interrupted at step 3/6" in err, err
    restore()
    code, out, err = cli(capsys, "train-model", "--resume", tmp_path / "split", "-q")
    assert code == 0 and "step 6/6" in out, err
    for name in (checkpoint.STATE_FILE, checkpoint.MODEL_FILE):
        a, b = (safetensors_numpy.load_file(tmp_path / run / name) for run in ("whole", "split"))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), name
    assert losses(tmp_path / "whole") == losses(tmp_path / "split")
    assert train("u.safetensors", "unscaled")[0] == 0
    first = [next(r[2] for r in losses(tmp_path / run) if r[0] == "step") for run in ("unscaled", "whole")]
    assert first[0] != first[1]  # the scaling was trained with

    code, out, err = cli(capsys, "export-hf", tmp_path / "whole", "-o", tmp_path / "hf")
    assert code == 0 and "LlamaForCausalLM" in out, err
    config = json.loads((tmp_path / "hf" / "config.json").read_text(encoding="utf-8"))
    theirs = HF_LLAMA3 if scaling is LLAMA3 else {"rope_type": "linear", "factor": 4.0}
    assert config["rope_parameters"] == {**theirs, "rope_theta": 5e5} and config["rope_scaling"] == theirs
    assert cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "back.safetensors")[0] == 0
    back = checkpoint.load_model(tmp_path / "back.safetensors").model
    assert back.config == original
    for name, value in tuned.params.items():
        np.testing.assert_array_equal(back.params[name], value, err_msg=name)


def test_llama3_scaling_reads_as_transformers_5_reads_it():
    """rope_scaling wins over rope_parameters, with rope_theta beside it; a missing
    original_max_position_embeddings is max_position_embeddings (transformers 5)."""
    base = {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 64}  # fmt: skip
    both = {**base, "rope_theta": 1234.0, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
            "rope_scaling": {"type": "linear", "factor": 2.0}}  # fmt: skip
    config = hf_llama.gpt_config("config.json", both).config
    assert (config.rope_theta, config.rope_scaling.to_dict()) == (1234.0, {"type": "linear", "factor": 2.0})
    short = {k: v for k, v in HF_LLAMA3.items() if k != "original_max_position_embeddings"}
    config = hf_llama.gpt_config("config.json", {**base, "rope_parameters": short}).config
    assert config.rope_scaling.original_context_length == 64 and config.rope_theta == 10000.0


@pytest.mark.parametrize(
    "variant, named",
    [
        ({"norm_type": "layernorm"}, "rotary positions and LayerNorm as Llama: Llama normalises with RMSNorm"),
        ({"activation": "gelu", "mlp_hidden": 128}, "rotary positions and a GELU MLP as Llama"),
        ({"norm": "post"}, "post-norm (a norm after each residual add) as Llama"),
        ({"causal": False}, "bidirectional attention as Llama"),
        ({"positional": "learned"}, "RMSNorm as GPT-2"),
    ],
)
def test_variants_llama_cannot_express_are_refused_by_name(variant, named, tk_tok, tmp_path, capsys):
    make_model(tmp_path / "m.safetensors", tk_tok, **variant)
    one_line_error(cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf"), named)
    assert not (tmp_path / "hf").exists()


# --- with transformers: their models, their tokenizers --------------------------------------------


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def hf_tokenizer(kind: str, odd: bool = False):
    """A byte-level BPE tokenizer made by the tokenizers library: trained on a small text with
    Llama 3's split and ignore_merges (or, `odd`, hand-made merges where ignore_merges matters),
    or Qwen2's split and NFC normalizer; its special tokens after the merges."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    pattern = QWEN2_PATTERN if kind == "qwen2" else LLAMA3_PATTERN
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if kind == "qwen2" else [BOS, EOS]
    if odd:
        hf = hf_bpe(Tokenizer(ODD_MERGES, special_tokens=specials), ignore_merges=True, nfc=False)
        return hf, len(ODD_MERGES) + 256 + len(specials)
    hf = tokenizers.Tokenizer(models.BPE(ignore_merges=kind != "qwen2"))
    split = pre_tokenizers.Split(tokenizers.Regex(pattern), "isolated")
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    if kind == "qwen2":
        hf.normalizer = normalizers.NFC()
    hf.decoder = decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=360, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False)  # fmt: skip
    hf.train_from_iterator([corpus()], trainer)
    hf.add_special_tokens(specials)
    return hf, hf.get_vocab_size()


def hf_checkpoint(transformers, directory: Path, kind: str, *, seed: int = 0, shards: bool = False,
                  bf16: bool = False, odd: bool = False, pad: int = 0, **config):  # fmt: skip
    """A random model of `kind` saved by save_pretrained beside a tokenizer.json; its weights
    far from their init (gains around 1, biases around 0) so that every one matters; `pad` rows
    of embeddings beyond the tokenizer's tokens (as Qwen2's checkpoints have)."""
    import torch

    tok, vocab = hf_tokenizer(kind, odd)
    classes = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
    cfg = getattr(transformers, classes[kind] + "Config")(vocab_size=vocab + pad, rms_norm_eps=1e-5,
                                                          **{**SIZES, **config})  # fmt: skip
    torch.manual_seed(seed)
    model = getattr(transformers, classes[kind] + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in name else 0.0))
    if bf16:
        model = model.to(torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="40KB" if shards else "5GB")
    tok.save(str(directory / "tokenizer.json"))
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def hf_probs(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch.softmax(model(torch.from_numpy(ids)).logits.double(), -1).numpy()


def check_same(transformers, hf_model, directory: Path, tk_path: Path) -> tuple[GPT, Tokenizer]:
    """tk's model file predicts as `hf_model` (1e-4 float32), its tokenizer gives AutoTokenizer's ids."""
    model, tok, _ = checkpoint.load_model(tk_path)
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, size=(2, 40))
    diff = np.abs(probs(model, ids) - hf_probs(hf_model, ids)).max()
    assert diff < 1e-4, f"max probability difference {diff:.2e}"
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    for text in TEXTS:
        ours = tok.encode(text, allowed_special="all")
        assert ours == theirs(text).input_ids, text
        diff = np.abs(probs(model, np.array([ours]))[0, -1] - hf_probs(hf_model, np.array([ours]))[0, -1]).max()
        assert diff < 1e-4, (text, diff)
    return model, tok


CHECKPOINTS = {
    "llama-gqa-untied": ("llama", dict(num_key_value_heads=2, rope_parameters={"rope_type": "default",
                                                                               "rope_theta": 5e5})),
    "llama-mqa-tied-sharded-bf16": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True, shards=True,
                                                   bf16=True)),
    "llama-ignore-merges-odd": ("llama", dict(num_key_value_heads=2, odd=True)),
    "llama-attention-bias": ("llama", dict(attention_bias=True, tie_word_embeddings=True)),
    "llama-mlp-bias": ("llama", dict(mlp_bias=True)),
    "mistral-gqa-untied-sharded": ("mistral", dict(num_key_value_heads=2, shards=True)),
    "qwen2-tied": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2-untied-sharded": ("qwen2", dict(num_key_value_heads=4, shards=True)),
}  # fmt: skip


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_transformers_checkpoints_import_and_export_with_their_probabilities(name, transformers, tmp_path, capsys):
    kind, config = CHECKPOINTS[name]
    hf_model = hf_checkpoint(transformers, tmp_path / "hf", kind, **config)
    if config.get("shards"):
        assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    code, out, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert code == 0, err
    assert f"of {type(hf_model).__name__}" in out and ("BF16" in out) == bool(config.get("bf16")), out
    model, tok = check_same(transformers, hf_model, tmp_path / "hf", tmp_path / "m.safetensors")
    assert model.config.kv_heads == config.get("num_key_value_heads", 4)
    assert model.config.tie_embeddings is bool(config.get("tie_word_embeddings"))
    assert tok.ignore_merges is (kind != "qwen2") and tok.normalizer == ("nfc" if kind == "qwen2" else None)
    if config.get("odd"):  # the premise: without ignore_merges the tokenizer would give other ids
        assert Tokenizer(tok.merges).encode("abc") != tok.encode("abc") == [258]
    # and back: transformers loads tk's export as LlamaForCausalLM (a Qwen2 import as Qwen2ForCausalLM)
    # and predicts as the original
    exported_as = "Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM"
    code, out, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "out")
    assert code == 0 and exported_as in out, err
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(again).__name__ == exported_as
    check_same(transformers, again, tmp_path / "out", tmp_path / "m.safetensors")


def dominated_by_padding(path: Path, out: Path, prompt: str) -> tuple[GPT, Tokenizer]:
    """The model at `path` with its padded rows of lm_head made 3 times the row of the token it
    predicts after `prompt`: without a mask, the padding is now its most likely next token."""
    model, tok, meta = checkpoint.load_model(path)
    head = model.params["lm_head.weight"]  # (V, C)
    logits = model.forward(np.array([tok.encode(prompt)]))[0, -1]
    head[tok.vocab_size :] = 3 * head[int(np.argmax(logits[: tok.vocab_size]))]
    checkpoint.save_model(out, model.params, tok, config=model.config.to_dict(), step=0, val_loss=None,
                          best_val_loss=None, provenance=meta["provenance"])  # fmt: skip
    loaded = checkpoint.load_model(out)
    return loaded.model, loaded.tokenizer


def test_a_padded_qwen2_predicts_as_transformers_and_exports_as_qwen2(transformers, tmp_path, capsys):
    """A Qwen2ForCausalLM whose vocab_size is padded beyond its tokenizer: imported with every
    row (transformers' probabilities over all of them); a padded id is shown as `<pad id N>`
    by predict-next, explain and the serve page's views, and never generated; fine-tuned and
    exported, transformers reads it back as Qwen2ForCausalLM with the same probabilities."""
    from tokenkit.pipeline import views

    hf_model = hf_checkpoint(transformers, tmp_path / "hf", "qwen2", num_key_value_heads=2, pad=40)
    code, out, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert code == 0 and "of Qwen2ForCausalLM" in out, err
    model, tok = check_same(transformers, hf_model, tmp_path / "hf", tmp_path / "m.safetensors")
    n = tok.vocab_size
    assert model.config.vocab_size == n + 40 == hf_model.config.vocab_size
    prompt = "Once upon a time"
    model, tok = dominated_by_padding(tmp_path / "m.safetensors", tmp_path / "p.safetensors", prompt)
    ids = np.array(tok.encode(prompt))
    assert next(model.generate(ids, 1, temperature=0)) >= n  # the premise: unmasked, greedy picks padding
    code, out, err = cli(capsys, "predict-next", "-m", tmp_path / "p.safetensors", prompt, "--top-k", "3")
    assert code == 0 and f"next token: <pad id {n}> (id {n}," in out, err
    top = views.next_view(model, tok, prompt, top_k=3)["top"]
    assert [t["token"] for t in top] == [f"<pad id {n + i}>" for i in range(3)]  # all alike: the lowest ids first
    for temperature in ("0", "1"):
        code, out, err = cli(capsys, "generate", "-m", tmp_path / "p.safetensors", prompt, "--max-new-tokens", "12",
                             "--temperature", temperature, "--seed", "1")  # fmt: skip
        assert code == 0 and "<pad" not in out, err
    gen = views.generate_view(model, tok, prompt, n=12, temperature=0)
    assert all(step["id"] < n for step in gen["steps"])
    assert gen["steps"][0]["top"][0]["token"] == f"<pad id {n}>" and gen["steps"][0]["top"][0]["p"] == 0
    doc = views.explain_doc(model, tok, prompt, top_k=2, model_name="p")
    assert [c["token"] for c in doc["top"]] == [f"<pad id {n}>", f"<pad id {n + 1}>"]
    # fine-tuned (and resumed), it is still Qwen2's, padding and all
    (tmp_path / "corpus.txt").write_text(corpus()[:4000], encoding="utf-8")
    train = ["train-model", tmp_path / "corpus.txt", "--init-from", tmp_path / "p.safetensors", "--steps", "1",
             "--eval-interval", "1", "--eval-batches", "1", "--batch-size", "2", "--workers", "1", "-q"]  # fmt: skip
    code, _, err = cli(capsys, *train, "-o", tmp_path / "run")
    assert code == 0, err
    assert cli(capsys, "train-model", "--resume", tmp_path / "run", "-q")[0] == 0
    tuned = checkpoint.load_model(tmp_path / "run")
    assert tuned.model.config.vocab_size == n + 40 and tuned.metadata["provenance"]["hf_architecture"] == (
        "Qwen2ForCausalLM"
    )
    # exported: Qwen2ForCausalLM with the padded vocab_size, its tokenizer read by Qwen2Tokenizer with tk's ids
    for source in (tmp_path / "p.safetensors", tmp_path / "run"):
        code, out, err = cli(capsys, "export-hf", source, "-o", tmp_path / "out", "--overwrite")
        assert code == 0 and "Qwen2ForCausalLM" in out, err
        config = json.loads((tmp_path / "out" / "config.json").read_text(encoding="utf-8"))
        assert (config["model_type"], config["vocab_size"]) == ("qwen2", n + 40)
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        assert type(again).__name__ == "Qwen2ForCausalLM"
        assert type(transformers.AutoTokenizer.from_pretrained(tmp_path / "out")).__name__.startswith("Qwen2Tokenizer")
        check_same(transformers, again, tmp_path / "out", checkpoint.resolve_model_path(source))
    code, out, err = cli(capsys, "import-hf", tmp_path / "out", "-o", tmp_path / "back.safetensors")
    assert code == 0 and "of Qwen2ForCausalLM" in out, err
    back = checkpoint.load_model(tmp_path / "back.safetensors").model
    assert back.config == tuned.model.config
    for name, value in tuned.model.params.items():
        np.testing.assert_array_equal(back.params[name], value, err_msg=name)
    # a tokenizer Qwen2Tokenizer would read otherwise is refused for a Qwen2 export, in one line
    Tokenizer(tok.merges, special_tokens=list(tok.special_tokens)).save(tmp_path / "gpt2-split.safetensors")
    refused = cli(capsys, "export-hf", tmp_path / "p.safetensors", "-o", tmp_path / "x", "-t",
                  tmp_path / "gpt2-split.safetensors")  # fmt: skip
    one_line_error(refused, "Qwen2Tokenizer, which splits with Qwen2's pattern")


# Llama 3.1's scaling with its bands on heads of 8 at theta 100 (wavelengths 6.3, 19.9, 63, 199):
# under 16 / 2 kept, 19.9 blended, over 16 / 0.5 divided; and linear's
SCALED = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
               "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "factor": 4.0},
}  # fmt: skip


@pytest.mark.parametrize("kind", SCALED)
def test_rope_scaled_checkpoints_predict_as_transformers(kind, transformers, tmp_path, capsys):
    """A llama3- or linear-scaled LlamaForCausalLM: tk's import predicts as transformers over the
    whole context of 64, past original_max_position_embeddings (16) too, where the unscaled RoPE
    would not; exported back, and fine-tuned with train-model --init-from and exported, transformers
    reads the same scaling and predicts as tk."""
    hf_model = hf_checkpoint(transformers, tmp_path / "hf", "llama", num_key_value_heads=2, rope_theta=100.0,
                             rope_scaling=dict(SCALED[kind]))  # fmt: skip
    assert hf_model.model.rotary_emb.attention_scaling == 1.0  # neither scales the attention
    assert cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")[0] == 0
    model, _ = check_same(transformers, hf_model, tmp_path / "hf", tmp_path / "m.safetensors")
    assert model.config.rope_scaling.type == kind and model.config.rope_theta == 100.0
    ids = np.random.default_rng(5).integers(0, model.config.vocab_size, size=(2, 64))
    diff = np.abs(probs(model, ids) - hf_probs(hf_model, ids))[:, 16:].max()
    assert diff < 1e-4, f"max probability difference past position 16: {diff:.2e}"
    unscaled = GPT.from_params(GPTConfig.from_dict({**model.config.to_dict(), "rope_scaling": None}), model.params)
    assert np.abs(probs(unscaled, ids) - hf_probs(hf_model, ids))[:, 16:].max() > 1e-2  # the premise
    code, out, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "out")
    assert code == 0, err
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert again.config.rope_parameters == hf_model.config.rope_parameters
    check_same(transformers, again, tmp_path / "out", tmp_path / "m.safetensors")
    # fine-tuned (scaled, as imported) and exported, transformers reads the scaling and predicts as tk
    (tmp_path / "corpus.txt").write_text(corpus()[:4000], encoding="utf-8")
    code, _, err = cli(capsys, "train-model", tmp_path / "corpus.txt", "--init-from", tmp_path / "m.safetensors",
                       "--steps", "2", "--eval-interval", "2", "--eval-batches", "1", "--batch-size", "2",
                       "--workers", "1", "-q", "-o", tmp_path / "run")  # fmt: skip
    assert code == 0, err
    tuned = checkpoint.load_model(tmp_path / "run").model
    assert tuned.config == model.config and not np.array_equal(tuned.params["wte.weight"], model.params["wte.weight"])
    code, out, err = cli(capsys, "export-hf", tmp_path / "run", "-o", tmp_path / "tuned")
    assert code == 0, err
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tuned").eval()
    assert again.config.rope_parameters == hf_model.config.rope_parameters
    check_same(transformers, again, tmp_path / "tuned", checkpoint.resolve_model_path(tmp_path / "run"))


def test_a_context_beyond_tks_is_imported_with_a_shorter_window(transformers, tmp_path, capsys):
    """Llama 3.1's max_position_embeddings (131,072) is beyond tk's 65,536: refused naming --context,
    and with --context N the model is imported with a window of N; rotary positions are relative
    (and the llama3 scaling keeps its own original context), so it predicts as transformers there."""
    hf_model = hf_checkpoint(transformers, tmp_path / "hf", "llama", num_key_value_heads=2, rope_theta=100.0,
                             max_position_embeddings=131_072, rope_scaling=dict(SCALED["llama3"]))  # fmt: skip
    one_line_error(cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors"),
                   "max_position_embeddings 131,072 is beyond tk's longest context", "--context N")  # fmt: skip
    assert not (tmp_path / "m.safetensors").exists()
    one_line_error(cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors", "--context", "200000"),
                   "must be from 1 to max_position_embeddings, 131,072")  # fmt: skip
    code, out, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors", "--context", "64")
    assert code == 0 and "context 64," in out, err
    model, _ = check_same(transformers, hf_model, tmp_path / "hf", tmp_path / "m.safetensors")
    assert model.config.context_length == 64 and model.config.rope_scaling.original_context_length == 16
    ids = np.random.default_rng(6).integers(0, model.config.vocab_size, size=(2, 64))
    assert np.abs(probs(model, ids) - hf_probs(hf_model, ids)).max() < 1e-4
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_positions=16, n_embd=16, n_layer=1,
                                                                n_head=2))  # fmt: skip
    gpt2.save_pretrained(tmp_path / "gpt2")
    Tokenizer([(i, i) for i in range(44)]).export_hf(tmp_path / "gpt2")  # 300 tokens, as the model
    capsys.readouterr()
    one_line_error(cli(capsys, "import-hf", tmp_path / "gpt2", "-o", tmp_path / "g.safetensors", "--context", "8"),
                   "--context shortens the window of a rotary-position model")  # fmt: skip


def test_a_smollm_directory_imports_with_its_tokenizer_json_read_as_written(transformers, tmp_path, capsys):
    """SmolLM2's directory: a tokenizer.json trained with its specials first and a Digits step, and
    a tokenizer_config.json naming GPT2Tokenizer, which transformers 5 builds with GPT-2's split
    alone. import-hf refuses it naming --tokenizer-json; with it, tk's ids are the `tokenizers`
    library's on the file, and the model predicts as transformers' on the same ids."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from tokenkit.bpe.hf_import import DIGITS_GPT2

    hf_model = hf_checkpoint(transformers, tmp_path / "hf", "llama", num_key_value_heads=2)
    smol = tokenizers.Tokenizer(models.BPE())
    smol.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    smol.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=hf_model.config.vocab_size - 20, special_tokens=["<|endoftext|>", BOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    smol.train_from_iterator([corpus() + "  12 345\n  6789 " * 50], trainer)
    smol.save(str(tmp_path / "hf" / "tokenizer.json"))
    (tmp_path / "hf" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False}), encoding="utf-8"
    )
    text = "In 2024,  12 apples\n  345 pears and 6789  0"
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert theirs(text).input_ids != smol.encode(text).ids  # the premise: transformers 5 reads it otherwise
    one_line_error(cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors"),
                   "as GPT2Tokenizer", "tk import-hf --tokenizer-json")  # fmt: skip
    code, out, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors", "--tokenizer-json")
    assert code == 0, err
    model, tok, _ = checkpoint.load_model(tmp_path / "m.safetensors")
    assert tok.listed and tok.pattern == DIGITS_GPT2 and tok.special_tokens == {"<|endoftext|>": 0, BOS: 1}
    for sample in [text, *TEXTS]:
        assert tok.encode(sample) == smol.encode(sample).ids, sample
    ids = np.array([tok.encode(text)])
    assert np.abs(probs(model, ids) - hf_probs(hf_model, ids)).max() < 1e-4


def test_a_stored_head_that_differs_from_the_embeddings_is_imported_untied(transformers, tmp_path, capsys):
    """transformers predicts with a stored lm_head.weight that differs from the embeddings, even
    under tie_word_embeddings (it unties them); tk imports such a model untied, as it predicts."""
    import torch
    from safetensors.torch import load_file, save_file

    hf_checkpoint(transformers, tmp_path / "hf", "llama", tie_word_embeddings=True)
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert torch.equal(hf_model.lm_head.weight, tensors["lm_head.weight"])  # the premise
    assert cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")[0] == 0
    model, _ = check_same(transformers, hf_model, tmp_path / "hf", tmp_path / "m.safetensors")
    assert model.config.tie_embeddings is False
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # the same head: tied
    save_file(tensors, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    assert cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "t.safetensors")[0] == 0
    assert checkpoint.load_model(tmp_path / "t.safetensors").model.config.tie_embeddings is True


def test_tokenizers_tk_does_not_read_are_refused_naming_them(transformers, tmp_path, capsys):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    hf_checkpoint(transformers, tmp_path / "hf", "llama")
    vocab = HFTokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json")).get_vocab()
    # Llama 2's and Mistral v0.1's kind: BPE over '▁'-marked UTF-8 pieces with byte fallback
    sp = HFTokenizer(models.BPE(vocab, [], byte_fallback=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.decoder = decoders.Metaspace()
    sp.save(str(tmp_path / "hf" / "tokenizer.json"))
    refused = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "x.safetensors")
    one_line_error(refused, "a SentencePiece-style tokenizer (BPE with byte_fallback, as Llama 2's and Mistral v0.1's)")
    # a post-processor that adds a token after the text: refused (tk adds a model's BOS, nothing else)
    tok = with_template(hf_tokenizer("llama")[0], EOS, f"$A {EOS}", f"$A {EOS} $B:1 {EOS}:1")
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    one_line_error(cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "x.safetensors"),
                   f"adds {EOS!r} to every text", '"post_processor": null')  # fmt: skip
    assert not (tmp_path / "x.safetensors").exists()


def with_template(tok, token: str, single: str, pair: str):
    """`tok` (a tokenizers.Tokenizer) with a post-processor as Llama 3's: ByteLevel, then a
    template of `single` and `pair` that names the special token `token`."""
    from tokenizers import processors

    template = processors.TemplateProcessing(single=single, pair=pair, special_tokens=[(token, tok.token_to_id(token))])
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    return tok


def test_llama3s_bos_template_puts_bos_before_every_prompt(transformers, tmp_path, capsys):
    """Llama 3's template adds <|begin_of_text|> before every text: tk's tokenizer records it as
    its BOS; `encode` stays the text's ids (add_special_tokens=False), and what the model reads
    (predict-next, explain, generate) starts with it, as transformers' tokenizer(text) does."""
    from tokenkit.pipeline import views

    hf_model = hf_checkpoint(transformers, tmp_path / "hf", "llama", num_key_value_heads=2)
    tok = with_template(hf_tokenizer("llama")[0], BOS, f"{BOS} $A", f"{BOS} $A {BOS}:1 $B:1")  # Llama 3's
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    code, out, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert code == 0, err
    model, ours, _ = checkpoint.load_model(tmp_path / "m.safetensors")
    assert ours.bos == BOS
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS:
        want = theirs(text).input_ids
        assert want[0] == ours.special_tokens[BOS]  # the premise: transformers adds it
        assert ours.encode_for_model(text, allowed_special="all") == want
        assert ours.encode(text, allowed_special="all") == theirs(text, add_special_tokens=False).input_ids
        nxt = views.next_view(model, ours, text, top_k=3, policy={"allowed_special": "all"})
        assert nxt["prompt_ids"] == want
        p_hf = hf_probs(hf_model, np.array([want]))[0, -1]
        assert max(abs(t["p"] - p_hf[t["id"]]) for t in nxt["top"]) < 1e-4
    code, out, err = cli(capsys, "predict-next", "-m", tmp_path / "m.safetensors", TEXTS[0], "--json")
    assert code == 0 and json.loads(out)["prompt_ids"][0] == ours.special_tokens[BOS], err
    # generation stops at Llama 3's end of text, <|end_of_text|>, made the most likely token here
    from tokenkit.pipeline.run import generate_ids

    head = model.params["lm_head.weight"] if "lm_head.weight" in model.params else model.params["wte.weight"]
    prompt = np.array([ours.encode_for_model(TEXTS[0])])
    head[ours.special_tokens[EOS]] = 3 * head[int(np.argmax(probs(model, prompt)[0, -1]))]
    _, new = generate_ids(model, ours, TEXTS[0], max_new_tokens=5, temperature=0)
    assert list(new) == [ours.special_tokens[EOS]]
    # fine-tuned, its training data reads as the model reads: BOS before the document
    (tmp_path / "corpus.txt").write_text(corpus()[:4000], encoding="utf-8")
    code, _, err = cli(capsys, "train-model", tmp_path / "corpus.txt", "--init-from", tmp_path / "m.safetensors",
                       "--steps", "1", "--eval-interval", "1", "--eval-batches", "1", "--batch-size", "2",
                       "--workers", "1", "-q", "-o", tmp_path / "run")  # fmt: skip
    assert code == 0, err
    tokens = np.load(tmp_path / "run" / checkpoint.TOKENS_FILE, mmap_mode="r")
    text_ids = ours.encode(corpus()[:4000])
    assert tokens[0] == ours.special_tokens[BOS] and tokens[1:].tolist() == text_ids[: len(tokens) - 1]
    # written back with its template: transformers adds it to tk's export too
    code, _, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "out")
    assert code == 0, err
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert all(again(text).input_ids == theirs(text).input_ids for text in TEXTS)
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text(encoding="utf-8"))
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (
        ours.special_tokens[BOS],
        ours.special_tokens[EOS],
    )
    ours.save(tmp_path / "tok.safetensors")
    assert Tokenizer.load(tmp_path / "tok.safetensors").bos == BOS
    for fmt in ("gpt2", "tiktoken"):  # neither can say it (nor ignore_merges)
        one_line_error(cli(capsys, "bpe-export", tmp_path / "tok.safetensors", "-o", tmp_path / fmt, "--format", fmt),
                       "--format hf")  # fmt: skip
    plain = Tokenizer(ours.merges, vocab=ours.vocab, special_tokens=ours.special_tokens, bos=BOS)
    with pytest.raises(TokenizerError, match=r"expects <\|begin_of_text\|> before every text; export it with"):
        plain.export_files("tiktoken")
