"""Peak memory of `tk import-hf` on a GPT-2-124M-shaped or SmolLM2-135M-shaped checkpoint
(random weights, made here).

    python bench/hf_import_memory.py [--shape gpt2|smollm2] [--dtype F32|BF16] [--keep DIR]

Writes a transformers-style directory (config.json; model.safetensors with GPT2LMHeadModel's
`transformer.*` names, or LlamaForCausalLM's `model.layers.*` ones in torch's (out, in) layout
for SmolLM2's shape: 30 layers, width 576, 9 heads with 3 K/V heads, SwiGLU 1536 wide, tied
embeddings; GPT-2's vocab.json + merges.txt from ../shared/data/gpt2, so the vocabulary is
GPT-2's 50,257 rather than SmolLM2's 49,152), then runs `tk import-hf` in a child process and
prints the child's peak resident memory (getrusage ru_maxrss). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokenkit.common import atomic, safetensors_file  # noqa: E402
from tokenkit.pipeline import hf_llama  # noqa: E402
from tokenkit.transformer import GPTConfig  # noqa: E402
from tokenkit.transformer.config import llama_config, param_shapes  # noqa: E402

GPT2 = REPO.parent / "shared" / "data" / "gpt2"


# SmolLM2-135M's shape (its config.json), with GPT-2's vocabulary
SMOLLM2 = llama_config(vocab_size=50257, context_length=8192, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                       mlp_hidden=1536, rope_theta=100000.0, tie_embeddings=True)  # fmt: skip


def hf_shapes(shape: str) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensor names and shapes, as transformers saves them."""
    if shape == "gpt2":  # GPT-2 small: 124,439,808 parameters
        return {"transformer." + name: s for name, s in param_shapes(GPTConfig()).items()}
    tk_shapes = param_shapes(SMOLLM2)
    names = hf_llama.hf_names(SMOLLM2, qkv_bias=False, o_bias=False, mlp_bias=False, tied=True)
    return {link.hf: link.hf_shape(tk_shapes[link.tk]) for link in hf_llama.links(SMOLLM2) if link.hf in names}


def hf_config(shape: str) -> dict:
    if shape == "smollm2":
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": SMOLLM2.vocab_size,
            "hidden_size": SMOLLM2.d_model,
            "intermediate_size": SMOLLM2.hidden,
            "num_hidden_layers": SMOLLM2.n_layers,
            "num_attention_heads": SMOLLM2.n_heads,
            "num_key_value_heads": SMOLLM2.kv_heads,
            "max_position_embeddings": SMOLLM2.context_length,
            "rms_norm_eps": 1e-5,
            "rope_theta": SMOLLM2.rope_theta,
            "tie_word_embeddings": True,
            "hidden_act": "silu",
        }
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
    }


def make_checkpoint(directory: Path, dtype: str, shape: str = "gpt2") -> None:
    rng = np.random.default_rng(0)
    tensors = {}
    for name, size in hf_shapes(shape).items():
        a = rng.standard_normal(size, dtype=np.float32) * np.float32(0.02)
        tensors[name] = (a.view(np.uint32) >> 16).astype(np.uint16) if dtype == "BF16" else a
    directory.mkdir(parents=True, exist_ok=True)
    if dtype == "BF16":  # our writer has no bf16 label: write U16, then relabel (same length)
        text = safetensors_file.header_bytes(tensors, {"format": "pt"})[8:].rstrip(b" ").replace(b'"U16"', b'"BF16"')
        text += b" " * (-len(text) % 8)
        with open(directory / "model.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for name in sorted(tensors):
                f.write(memoryview(np.ascontiguousarray(tensors[name]).reshape(-1)).cast("B"))
    else:
        atomic.write_atomic(
            directory / "model.safetensors", lambda f: safetensors_file.write(f, tensors, {"format": "pt"})
        )
    (directory / "config.json").write_text(json.dumps(hf_config(shape)), encoding="utf-8")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2 / name, directory / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["gpt2", "smollm2"], default="gpt2")
    parser.add_argument("--dtype", choices=["F32", "BF16"], default="F32")
    parser.add_argument("--keep", type=Path, help="make the checkpoint here and keep it")
    args = parser.parse_args()
    if not (GPT2 / "vocab.json").exists():
        sys.exit(f"needs GPT-2's vocab.json + merges.txt in {GPT2}")
    scratch = Path(tempfile.mkdtemp(prefix="tk-hf-mem-"))
    directory = args.keep or scratch / f"{args.shape}-hf"
    try:
        make_checkpoint(directory, args.dtype, args.shape)
        size = (directory / "model.safetensors").stat().st_size
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tokenkit", "import-hf", str(directory), "-o", str(scratch / "model.safetensors")],
            check=True,
        )
        seconds = time.perf_counter() - t0
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
        print(
            f"{args.shape} checkpoint {args.dtype}, {size / 2**20:,.0f} MiB; "
            f"import {seconds:.1f} s, peak RSS {peak_kib / 2**10:,.0f} MiB"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
