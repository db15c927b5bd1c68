"""Files a user loses or finds mixed (issue 20): each class of failure attacked from several sides.

- `--overwrite` keeps the old run whole until the new run's first checkpoint, the memory check
  counts activations and refuses before any file is touched, and a killed run leaves nothing
  that blocks the next command.
- An export directory (`tk export-hf`, `tk bpe-export`) is replaced as a whole: interrupted at
  any file, or killed at any moment, it holds the complete old export or the complete new one.
- `tk import-hf` refuses, in one line, a checkpoint it would import wrongly: an output head that
  differs from the embedding (transformers unties them), NaN or infinite weights.

Every model and corpus is tiny and made here; docs/files.md names these tests.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.common import safetensors_file
from tokenkit.pipeline import checkpoint
from tokenkit.transformer import GPT, GPTConfig

TEXT = "Once upon a time, there was a brave fox named Max. He lived in a cave near the pond. " * 20
PROMPT = "Once upon a time, there was a"


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train([TEXT.encode()], vocab_size=300, special_tokens=["<|endoftext|>"])


def tiny_model(path: Path, tok: Tokenizer, seed: int = 0, d_model: int = 32) -> GPT:
    config = GPTConfig(vocab_size=tok.vocab_size, context_length=32, d_model=d_model, n_layers=2, n_heads=4)
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed)
    for value in model.params.values():
        value[...] = rng.normal(0.0, 0.3, value.shape)
    checkpoint.save_model(
        path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
    )
    return model


# --- 3. silent wrong imports -------------------------------------------------------------------


def write_checkpoint(directory: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """model.safetensors by hand, as any library may write it: name -> (dtype label, raw array)."""
    header, start, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [start, start + len(data)]}
        start += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def edit_config(hf: Path, **changes) -> None:
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture
def hf_dir(tok, tmp_path, capsys) -> tuple[Path, dict[str, np.ndarray]]:
    """A transformers GPT-2 directory that tk exported, and its tensors (float32)."""
    tiny_model(tmp_path / "m.safetensors", tok)
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")[0] == 0
    return tmp_path / "hf", safetensors_file.read(tmp_path / "hf" / "model.safetensors")[0]


@pytest.mark.parametrize("tie", [True, None, False])  # said, left to the default (tied), said untied
def test_import_refuses_an_output_head_that_differs_from_the_embedding(hf_dir, tmp_path, capsys, tie):
    hf, tensors = hf_dir
    edit_config(hf, tie_word_embeddings=tie)
    wte = tensors["transformer.wte.weight"]
    out = tmp_path / "imported.safetensors"
    for head, fragment in [
        (wte + np.float32(0.5), "lm_head.weight differs from"),
        (wte[:, :-1], "lm_head.weight has shape"),
        (np.concatenate([wte, wte[:1]]), "lm_head.weight has shape"),
    ]:
        write_checkpoint(hf, {**{n: ("F32", a) for n, a in tensors.items()}, "lm_head.weight": ("F32", head)})
        one_line_error(*cli(capsys, "import-hf", hf, "-o", out)[::2], fragment, "ties")
        assert not out.exists()
    # a head that is the embedding, stored twice, is what tk's GPT computes
    write_checkpoint(hf, {**{n: ("F32", a) for n, a in tensors.items()}, "lm_head.weight": ("F32", wte.copy())})
    code, _, err = cli(capsys, "import-hf", hf, "-o", out)
    assert code == 0, err
    np.testing.assert_array_equal(checkpoint.load_model(out).model.params["wte.weight"], wte)


def _bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize(
    "name, dtype, bad",
    [
        ("transformer.h.1.mlp.c_fc.weight", "F32", np.nan),
        ("transformer.wpe.weight", "F16", np.inf),
        ("transformer.ln_f.bias", "BF16", -np.inf),
        ("transformer.h.0.attn.c_attn.bias", "F64", np.nan),
        ("transformer.wte.weight", "F32", np.inf),
        ("lm_head.weight", "F32", np.nan),  # a tied copy of the embedding, but for one value
    ],
)
def test_import_refuses_nan_or_inf_weights_naming_the_tensor(hf_dir, tmp_path, capsys, name, dtype, bad):
    hf, tensors = hf_dir
    tensors = {**tensors, "lm_head.weight": tensors["transformer.wte.weight"].copy()}
    poisoned = tensors[name].copy()
    poisoned.reshape(-1)[poisoned.size // 2] = bad
    tensors[name] = poisoned
    convert = {"F32": lambda a: a, "F16": lambda a: a.astype(np.float16), "F64": lambda a: a.astype(np.float64)}
    write_checkpoint(hf, {n: (dtype, convert[dtype](a) if dtype in convert else _bf16(a)) for n, a in tensors.items()})
    out = tmp_path / "imported.safetensors"
    what = "NaN" if np.isnan(bad) else "infinite"
    line = one_line_error(*cli(capsys, "import-hf", hf, "-o", out)[::2], name.removeprefix("transformer."), what)
    assert "1 of" in line  # how many values, so a user can tell one bad value from a broken file
    assert not out.exists()


def test_transformers_unties_a_differing_head_and_tk_refuses_it(tok, tmp_path, capsys):
    """What transformers does with a tied config and a differing lm_head in the file: it keeps the
    file's head (untied), so a model importing the embedding alone would predict otherwise."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None
    )
    hf = tmp_path / "hf"
    transformers.GPT2LMHeadModel(config).save_pretrained(hf)
    tok.export_hf(hf)
    assert json.loads((hf / "config.json").read_text(encoding="utf-8")).get("tie_word_embeddings", True) is True
    tensors, meta = safetensors_file.read(hf / "model.safetensors")
    head = np.random.default_rng(1).normal(0.0, 0.3, tensors["transformer.wte.weight"].shape).astype(np.float32)
    (hf / "model.safetensors").write_bytes(safetensors_file.serialize({**tensors, "lm_head.weight": head}, meta))
    loaded = transformers.GPT2LMHeadModel.from_pretrained(hf).eval()
    np.testing.assert_array_equal(loaded.lm_head.weight.detach().numpy(), head)  # the file's head, untied
    assert not np.array_equal(loaded.transformer.wte.weight.detach().numpy(), head)
    capsys.readouterr()  # transformers' progress bars and its warning about the untied head
    one_line_error(
        *cli(capsys, "import-hf", hf, "-o", tmp_path / "m.safetensors")[::2], "lm_head.weight differs", "transformers"
    )
    assert not (tmp_path / "m.safetensors").exists()
