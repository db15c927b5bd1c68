"""Peak memory of `tk import-hf` on a GPT-2-124M-shaped checkpoint (random weights, made here).

    python bench/hf_import_memory.py [--dtype F32|BF16] [--keep DIR]

Writes a transformers-style directory (config.json, model.safetensors with GPT2LMHeadModel's
`transformer.*` names, and GPT-2's vocab.json + merges.txt from ../shared/data/gpt2), then runs
`tk import-hf` in a child process and prints the child's peak resident memory (getrusage
ru_maxrss). Nothing is downloaded.
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
from tokenkit.transformer import GPTConfig  # noqa: E402
from tokenkit.transformer.config import param_shapes  # noqa: E402

GPT2 = REPO.parent / "shared" / "data" / "gpt2"


def make_checkpoint(directory: Path, dtype: str) -> None:
    config = GPTConfig()  # GPT-2 small: 124,439,808 parameters
    rng = np.random.default_rng(0)
    tensors = {}
    for name, shape in param_shapes(config).items():
        a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        tensors["transformer." + name] = (a.view(np.uint32) >> 16).astype(np.uint16) if dtype == "BF16" else a
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
    hf = {
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
    (directory / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2 / name, directory / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["F32", "BF16"], default="F32")
    parser.add_argument("--keep", type=Path, help="make the checkpoint here and keep it")
    args = parser.parse_args()
    if not (GPT2 / "vocab.json").exists():
        sys.exit(f"needs GPT-2's vocab.json + merges.txt in {GPT2}")
    scratch = Path(tempfile.mkdtemp(prefix="tk-hf-mem-"))
    directory = args.keep or scratch / "gpt2-hf"
    try:
        make_checkpoint(directory, args.dtype)
        size = (directory / "model.safetensors").stat().st_size
        t0 = time.perf_counter()
        subprocess.run(["tk", "import-hf", str(directory), "-o", str(scratch / "gpt2.safetensors")], check=True)
        seconds = time.perf_counter() - t0
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
        print(
            f"checkpoint {args.dtype}, {size / 2**20:,.0f} MiB; "
            f"import {seconds:.1f} s, peak RSS {peak_kib / 2**10:,.0f} MiB"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
