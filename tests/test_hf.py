"""Models to and from transformers' GPT-2 directories: `tk export-hf`, `tk import-hf`,
`train-model --init-from`, `predict-next --json`.

Without transformers the written files are checked against GPT-2's documented layout
(config.json fields; `transformer.`-prefixed Conv1D tensors, float32, lm_head tied) and an
export -> import round trip inside tk must give identical weights and probabilities. With
transformers and torch installed (`pip install -e '.[interop]'`) the same models go through
`GPT2LMHeadModel` both ways and the next-token probabilities must agree within 1e-4.
Every model is a tiny random one made here; nothing is downloaded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import random_model as make_model  # the random model test_reliability_* build too

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.common import safetensors_file
from tokenkit.pipeline import checkpoint
from tokenkit.pipeline.run import predict_next
from tokenkit.transformer import GPT

TEXT = "Once upon a time, there was a brave fox named Max. He lived in a cave near the pond. " * 20
PROMPT = "Once upon a time, there was a"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train([TEXT.encode()], vocab_size=300, special_tokens=["<|endoftext|>"])


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, fragment: str) -> None:
    assert code == 1, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err, err


def probs(model: GPT, ids: list[int]) -> np.ndarray:
    logits = model.forward(np.asarray([ids]))[0, -1].astype(np.float64)
    p = np.exp(logits - logits.max())
    return p / p.sum()


# --- without transformers --------------------------------------------------------------------


def gpt2_layout(n_layer: int, C: int, V: int, T: int) -> dict[str, tuple[int, ...]]:
    """GPT2LMHeadModel's saved tensors, as transformers documents them (Conv1D: (in, out))."""
    names = {
        "transformer.wte.weight": (V, C),
        "transformer.wpe.weight": (T, C),
        "transformer.ln_f.weight": (C,),
        "transformer.ln_f.bias": (C,),
    }
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        names.update(
            {
                h + "ln_1.weight": (C,),
                h + "ln_1.bias": (C,),
                h + "ln_2.weight": (C,),
                h + "ln_2.bias": (C,),
                h + "attn.c_attn.weight": (C, 3 * C),
                h + "attn.c_attn.bias": (3 * C,),
                h + "attn.c_proj.weight": (C, C),
                h + "attn.c_proj.bias": (C,),
                h + "mlp.c_fc.weight": (C, 4 * C),
                h + "mlp.c_fc.bias": (4 * C,),
                h + "mlp.c_proj.weight": (4 * C, C),
                h + "mlp.c_proj.bias": (C,),
            }
        )
    return names


def test_export_writes_gpt2s_config_and_tensor_layout(tok, tmp_path, capsys):
    model = make_model(tmp_path / "m.safetensors", tok)
    code, out, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")
    assert code == 0, err
    assert "GPT2LMHeadModel, 36,096 parameters" in out
    hf = tmp_path / "hf"
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {p.name for p in hf.iterdir()}
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    eot = tok.special_tokens["<|endoftext|>"]
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["model_type"] == "gpt2"
    assert (
        config["vocab_size"],
        config["n_positions"],
        config["n_ctx"],
        config["n_embd"],
        config["n_layer"],
        config["n_head"],
    ) == (tok.vocab_size, 32, 32, 32, 2, 4)
    assert config["activation_function"] == "gelu_new" and config["layer_norm_epsilon"] == 1e-5
    assert config["tie_word_embeddings"] is True and config["scale_attn_weights"] is True
    assert config["bos_token_id"] == config["eos_token_id"] == eot
    assert json.loads((hf / "generation_config.json").read_text(encoding="utf-8"))["eos_token_id"] == eot
    entries, meta = safetensors_file.read_header(hf / "model.safetensors")
    assert meta == {"format": "pt"}
    assert {name: tuple(e["shape"]) for name, e in entries.items()} == gpt2_layout(2, 32, tok.vocab_size, 32)
    assert {e["dtype"] for e in entries.values()} == {"F32"}
    tensors, _ = safetensors_file.read(hf / "model.safetensors")
    for name, value in model.params.items():
        np.testing.assert_array_equal(tensors["transformer." + name], value)


def test_relu_and_bias_free_models_export_as_relu_with_zero_biases(tok, tmp_path, capsys):
    make_model(tmp_path / "m.safetensors", tok, activation="relu", bias=False)
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")[0] == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text(encoding="utf-8"))["activation_function"] == "relu"
    tensors, _ = safetensors_file.read(tmp_path / "hf" / "model.safetensors")
    assert set(tensors) == set(gpt2_layout(2, 32, tok.vocab_size, 32))
    assert all(not tensors[n].any() for n in tensors if n.endswith(".bias"))


@pytest.mark.parametrize(
    "variant, named",
    [
        ({"norm": "post"}, "post-norm"),
        ({"positional": "sinusoidal"}, "sinusoidal positions"),
        ({"causal": False}, "bidirectional attention"),
        ({"positional": "rope"}, "rotary positions"),
        ({"norm_type": "rmsnorm"}, "RMSNorm"),
        ({"activation": "swiglu"}, "a SwiGLU MLP"),
        ({"n_kv_heads": 1}, "grouped-query attention"),
        ({"tie_embeddings": False}, "untied embeddings"),
        ({"bias": False, "qkv_bias": True}, "biases on q, k, v alone"),
        ({"mlp_hidden": 40}, "an MLP 40 wide"),
        ({"norm_eps": 1e-6}, "norm_eps 1e-06"),
    ],
)
def test_variants_gpt2_cannot_express_are_refused_by_name(tok, tmp_path, capsys, variant, named):
    make_model(tmp_path / "m.safetensors", tok, **variant)
    code, _, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")
    one_line_error(code, err, named)
    assert not (tmp_path / "hf").exists()


def test_export_into_a_foreign_directory_needs_overwrite_and_keeps_other_files(tok, tmp_path, capsys):
    make_model(tmp_path / "m.safetensors", tok)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    code, _, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", out)
    one_line_error(code, err, "--overwrite")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", out, "--overwrite")[0] == 0
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", out)[0] == 0  # an earlier export: no flag needed
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"
    run = tmp_path / "run"  # a run directory: its model.safetensors is never replaced by an export
    run.mkdir()
    (tmp_path / "m.safetensors").rename(run / "model.safetensors")
    code, _, err = cli(capsys, "export-hf", run, "-o", run, "--overwrite")
    one_line_error(code, err, "holds a tokenkit model")


def test_export_import_round_trip_is_identical(tok, tmp_path, capsys):
    model = make_model(tmp_path / "m.safetensors", tok)
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")[0] == 0
    code, out, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "back.safetensors")
    assert code == 0, err
    assert "F32 -> float32" in out
    back, back_tok, meta = checkpoint.load_model(tmp_path / "back.safetensors")
    assert back.config == model.config
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], value)
    assert (
        back_tok.vocab == tok.vocab and back_tok.merges == tok.merges and back_tok.special_tokens == tok.special_tokens
    )
    assert back_tok.encode(TEXT) == tok.encode(TEXT)
    ids = tok.encode(PROMPT)
    np.testing.assert_array_equal(probs(back, ids), probs(model, ids))
    assert meta["provenance"]["imported_from"] == str(tmp_path / "hf")
    code, out, _ = cli(capsys, "info", tmp_path / "back.safetensors")
    assert code == 0 and "imported from" in out


def test_predict_next_json(tok, tmp_path, capsys):
    model = make_model(tmp_path / "m.safetensors", tok)
    code, out, _ = cli(capsys, "predict-next", "-m", tmp_path / "m.safetensors", PROMPT, "--top-k", "300", "--json")
    assert code == 0
    top = json.loads(out)["top"]
    assert len(top) == tok.vocab_size and set(top[0]) == {"id", "token", "p"}
    p = probs(model, tok.encode(PROMPT))
    assert all(abs(e["p"] - p[e["id"]]) < 1e-12 for e in top)
    by_id = {e["id"]: e["token"] for e in top}
    assert by_id[0xC3] == "\\xc3" and by_id[ord("a")] == "a"  # half a character: its byte, escaped


def _write_checkpoint(directory: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file by hand (any dtype label, BF16 included): name -> (dtype, raw array)."""
    header, start, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [start, start + len(data)]}
        start += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    directory.mkdir(exist_ok=True)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _hf_dir(tmp_path: Path, tok: Tokenizer, capsys) -> tuple[GPT, Path]:
    model = make_model(tmp_path / "m.safetensors", tok)
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")[0] == 0
    return model, tmp_path / "hf"


def test_import_reads_f16_bf16_and_sharded_checkpoints(tok, tmp_path, capsys):
    model, hf = _hf_dir(tmp_path, tok, capsys)
    tensors, _ = safetensors_file.read(hf / "model.safetensors")
    # bf16: the top half of each float32; f16: numpy's half
    bf16 = {n: ("BF16", (a.view(np.uint32) >> 16).astype(np.uint16)) for n, a in tensors.items()}
    _write_checkpoint(hf, bf16)
    assert cli(capsys, "import-hf", hf, "-o", tmp_path / "bf16.safetensors")[0] == 0
    back = checkpoint.load_model(tmp_path / "bf16.safetensors").model
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], (value.view(np.uint32) & 0xFFFF0000).view(np.float32))
    _write_checkpoint(hf, {n: ("F16", a.astype(np.float16)) for n, a in tensors.items()})
    assert cli(capsys, "import-hf", hf, "-o", tmp_path / "f16.safetensors")[0] == 0
    back = checkpoint.load_model(tmp_path / "f16.safetensors").model
    np.testing.assert_array_equal(
        back.params["wte.weight"], model.params["wte.weight"].astype(np.float16).astype(np.float32)
    )
    # GPT2Model's unprefixed names with the old causal-mask buffers and a tied lm_head beside them
    mask = np.tril(np.ones((1, 1, 32, 32), np.float32))
    _write_checkpoint(
        hf,
        {
            **{n[len("transformer.") :]: ("F32", a) for n, a in tensors.items()},
            **{f"h.{i}.attn.bias": ("F32", mask) for i in range(2)},
            "lm_head.weight": ("F32", tensors["transformer.wte.weight"]),
        },
    )
    assert cli(capsys, "import-hf", hf, "-o", tmp_path / "plain.safetensors")[0] == 0
    back = checkpoint.load_model(tmp_path / "plain.safetensors").model
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], value)
    # sharded: two files and an index, as save_pretrained writes them
    names = sorted(tensors)
    weight_map = {}
    for k, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :]), 1):
        shard = f"model-0000{k}-of-00002.safetensors"
        (hf / shard).write_bytes(safetensors_file.serialize({n: tensors[n] for n in part}, {"format": "pt"}))
        weight_map.update({n: shard for n in part})
    (hf / "model.safetensors").unlink()
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}), encoding="utf-8"
    )
    code, out, err = cli(capsys, "import-hf", hf, "-o", tmp_path / "sharded.safetensors")
    assert code == 0 and "in 2 shards" in out, err
    back = checkpoint.load_model(tmp_path / "sharded.safetensors").model
    for name, value in model.params.items():
        np.testing.assert_array_equal(back.params[name], value)


def _edit_config(hf: Path, **changes) -> None:
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")


def test_import_refuses_what_tk_cannot_read_in_one_line(tok, tmp_path, capsys):
    _, hf = _hf_dir(tmp_path, tok, capsys)
    out = tmp_path / "x.safetensors"
    for changes, fragment in [
        ({"model_type": "bert"}, "model_type 'bert'; tk imports the model types 'gpt2', 'llama', 'mistral', 'qwen2'"),
        ({"activation_function": "gelu"}, "exact erf GELU"),
        ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
        ({"n_inner": 64}, "n_inner"),
        ({"vocab_size": tok.vocab_size - 4}, "the tokenizer has 300 tokens but config.json's vocab_size is 296"),
        ({"vocab_size": tok.vocab_size + 4}, "wte.weight has shape (300, 32); config.json implies (304, 32)"),
        ({"n_embd": 64, "n_inner": None}, "has shape"),
    ]:
        original = (hf / "config.json").read_text(encoding="utf-8")
        _edit_config(hf, **changes)
        one_line_error(*cli(capsys, "import-hf", hf, "-o", out)[::2], fragment)
        (hf / "config.json").write_text(original, encoding="utf-8")
    assert not out.exists()
    assert cli(capsys, "import-hf", hf, "-o", out)[0] == 0
    one_line_error(*cli(capsys, "import-hf", hf, "-o", out)[::2], "--overwrite")
    # an untied lm_head is refused, a tied copy is accepted
    tensors, _ = safetensors_file.read(hf / "model.safetensors")
    _edit_config(hf, tie_word_embeddings=False)
    _write_checkpoint(
        hf,
        {
            **{n: ("F32", a) for n, a in tensors.items()},
            "lm_head.weight": ("F32", tensors["transformer.wte.weight"] + 1),
        },
    )
    one_line_error(*cli(capsys, "import-hf", hf, "-o", tmp_path / "y.safetensors")[::2], "lm_head.weight differs")
    _write_checkpoint(
        hf,
        {**{n: ("F32", a) for n, a in tensors.items()}, "lm_head.weight": ("F32", tensors["transformer.wte.weight"])},
    )
    assert cli(capsys, "import-hf", hf, "-o", tmp_path / "y.safetensors")[0] == 0
    # a pickle is refused; a shard outside the directory is refused
    (hf / "model.safetensors").rename(hf / "pytorch_model.bin")
    one_line_error(*cli(capsys, "import-hf", hf, "-o", tmp_path / "z.safetensors")[::2], "pickle")
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../m.safetensors"}}), encoding="utf-8"
    )
    one_line_error(*cli(capsys, "import-hf", hf, "-o", tmp_path / "z.safetensors")[::2], "shards must be")
    (hf / "config.json").unlink()
    one_line_error(*cli(capsys, "import-hf", hf, "-o", tmp_path / "z.safetensors")[::2], "no config.json")
    assert not (tmp_path / "z.safetensors").exists()


def test_train_model_init_from_starts_from_the_weights_and_tokenizer(tok, tmp_path, capsys):
    model = make_model(tmp_path / "m.safetensors", tok)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 5, encoding="utf-8")
    args = [
        "train-model",
        corpus,
        "--init-from",
        tmp_path / "m.safetensors",
        "--steps",
        "1",
        "--lr",
        "1e-12",
        "--min-lr",
        "0",
        "--eval-interval",
        "1",
        "--eval-batches",
        "1",
        "--batch-size",
        "2",
        "--workers",
        "1",
        "-q",
    ]
    code, _, err = cli(capsys, *args, "-o", tmp_path / "run")
    assert code == 0, err
    run_model, run_tok, meta = checkpoint.load_model(tmp_path / "run")
    assert run_model.config == model.config and run_tok.fingerprint() == tok.fingerprint()
    assert meta["provenance"]["init_from"] == str(tmp_path / "m.safetensors")
    for name, value in model.params.items():  # one step at lr 1e-12 leaves the weights where they started
        np.testing.assert_allclose(run_model.params[name], value, atol=1e-6)
    assert not (tmp_path / "run" / "tokenizer.safetensors").exists()
    one_line_error(
        *cli(capsys, *args, "-o", tmp_path / "r2", "--d-model", "64")[::2], "--d-model 64 contradicts the model"
    )
    assert (
        cli(capsys, *args, "-o", tmp_path / "r3", "--d-model", "32", "--n-layers", "2")[0] == 0
    )  # agreeing flags are fine
    other = Tokenizer.train([TEXT.encode()], vocab_size=280)
    other.save(tmp_path / "other.safetensors")
    one_line_error(*cli(capsys, *args, "-o", tmp_path / "r4", "-t", tmp_path / "other.safetensors")[::2], "drop -t")
    code, _, err = cli(capsys, "train-model", "--resume", tmp_path / "run", "--init-from", tmp_path / "m.safetensors")
    one_line_error(code, err, "--init-from starts a new run")
    make_model(tmp_path / "encoder.safetensors", tok, causal=False)
    code, _, err = cli(
        capsys, "train-model", corpus, "--init-from", tmp_path / "encoder.safetensors", "-o", tmp_path / "r5"
    )
    one_line_error(code, err, "bidirectional")


# --- through transformers --------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("variant", [{}, {"activation": "relu", "bias": False}])
def test_transformers_loads_the_export_with_tks_probabilities(transformers, tok, tmp_path, capsys, variant):
    import torch

    model = make_model(tmp_path / "m.safetensors", tok, seed=3, **variant)
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")[0] == 0
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(hf_model).__name__ == "GPT2LMHeadModel"
    ids = tok.encode(PROMPT)
    assert list(hf_tok(PROMPT)["input_ids"]) == ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0, -1].double()
    theirs = torch.softmax(logits, -1).numpy()
    assert np.abs(theirs - probs(model, ids)).max() < 1e-4
    code, out, _ = cli(capsys, "predict-next", "-m", tmp_path / "m.safetensors", PROMPT, "--top-k", "5", "--json")
    assert all(abs(e["p"] - theirs[e["id"]]) < 1e-4 for e in json.loads(out)["top"])


@pytest.mark.parametrize("how", ["single", "sharded", "bfloat16"])
def test_import_of_what_transformers_saves_gives_its_probabilities(transformers, tok, tmp_path, capsys, how):
    import torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None
    )
    hf_model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in hf_model.parameters():
            p.normal_(0.0, 0.3)
    if how == "bfloat16":
        hf_model = hf_model.to(torch.bfloat16)
    hf_model.save_pretrained(tmp_path / "hf", **({"max_shard_size": "20KB"} if how == "sharded" else {}))
    hf_model = hf_model.float()
    if how == "single":
        tok.export_hf(tmp_path / "hf")  # tokenizer.json
    else:
        tok.export_gpt2(tmp_path / "hf")  # vocab.json + merges.txt
    code, _, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert code == 0, err
    ids = tok.encode(PROMPT)
    with torch.no_grad():
        theirs = torch.softmax(hf_model(torch.tensor([ids])).logits[0, -1].double(), -1).numpy()
    model = checkpoint.load_model(tmp_path / "m.safetensors").model
    assert np.abs(theirs - probs(model, ids)).max() < 1e-4
    pred = predict_next(model, tok, PROMPT, top_k=3)
    assert [i for i, _ in pred.top] == list(np.argsort(-theirs, kind="stable")[:3])
