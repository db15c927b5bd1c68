"""nanoGPT's CPU "baby GPT" on tiny Shakespeare, byte-level, trained by tokenkit's pipeline.

The configuration is nanoGPT's README CPU run (`train_shakespeare_char.py` with --device=cpu
--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
--lr_decay_iters=2000 --dropout=0.0 --eval_iters=20): 4 layers, 4 heads, width 128, context 64,
batch 12, 2000 steps, lr 1e-3 cosine to 1e-4 after 100 warmup steps, AdamW betas (0.9, 0.99),
weight decay 0.1, clip 1.0, no biases, no dropout; last 10% of the text for validation.
Our vocabulary is the 256 bytes (a tokenizer with zero merges); nanoGPT's is the text's 65
characters, the same symbols since the file is ASCII.

nanoGPT's reference on a 2-core machine like ours: val loss 1.886 after 2000 steps, ~111 s
wall including its evaluations (every 250 steps, 20 batches), ~470 MB peak RSS.

Run:  flock /tmp/tokenkit-bench.lock python bench/shakespeare.py [--device cuda]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# `python bench/shakespeare.py` puts bench/ first on sys.path, where bench/bpe.py would shadow the
# bpe package; the repository root goes first instead.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tinyshakespeare.txt"
NANOGPT = {"val_loss": 1.886, "wall_s": 111.0, "peak_mb": 470.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps (nanoGPT: 2000)")
    parser.add_argument("--data", type=Path, default=DATA, help="tinyshakespeare.txt")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (CuPy and a GPU)")
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"skip: {args.data} is absent (the reference data lives in ../shared/data)")
        return 0

    from tokenkit.bpe import Tokenizer
    from tokenkit.pipeline import checkpoint, data
    from tokenkit.pipeline.config import TrainConfig
    from tokenkit.pipeline.start import train_model

    tokenizer = Tokenizer([], pattern="none")  # byte-level: ids 0-255 are the bytes, no merges
    config = TrainConfig(
        n_layers=4,
        n_heads=4,
        d_model=128,
        context_length=64,
        bias=False,
        batch_size=12,
        steps=args.steps,
        lr=1e-3,
        min_lr=1e-4,
        warmup_steps=100,
        weight_decay=0.1,
        beta1=0.9,
        beta2=0.99,
        grad_clip=1.0,
        eval_interval=250,
        eval_batches=20,
        val_fraction=0.1,
        seed=1337,
    )
    with tempfile.TemporaryDirectory(prefix="tk-shakespeare-") as run_dir:
        start = time.perf_counter()
        result = train_model(args.data, run_dir, tokenizer, config, quiet=True, device=args.device)
        wall = time.perf_counter() - start
        gc.collect()  # the trained model's worker process is reaped with its pool
        # An upper bound of the peak: this process's and its worker's (the largest reaped child's)
        # peak RSS added up, so the pages they share are counted twice. Linux reports KiB.
        own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        worker_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        # A steadier estimate than 20 batches, outside the timed run: 200 fixed validation batches.
        model, _, _ = checkpoint.load_model(run_dir)
        tokens = data.prepare_tokens(args.data, tokenizer, run_dir, quiet=True)
        _, val = tokens.split(config.val_fraction, config.context_length)
        batches = data.eval_batches(val, 200, config.batch_size, config.context_length, seed=7)
        val_200 = float(np.mean([model.loss(x, y) for x, y in batches]))

    print(f"tiny Shakespeare, byte-level baby GPT ({config.steps} steps, batch 12 x 64, 4x128, no bias, {args.device})")
    print(
        f"  final val loss (20 batches, as nanoGPT's eval_iters=20): {result.last_val_loss:.4f}"
        f"   nanoGPT: {NANOGPT['val_loss']}"
    )
    print(f"  val loss of the same model on 200 batches:              {val_200:.4f}")
    print(f"  unigram baseline:                                        {result.unigram_baseline:.4f}")
    n_evals = -(-config.steps // config.eval_interval)  # every 250 steps, the last step included
    print(
        f"  wall time (incl. encoding, {n_evals} evals, checkpoints):     {wall:.1f} s"
        f"   nanoGPT: ~{NANOGPT['wall_s']:.0f} s   ratio {wall / NANOGPT['wall_s']:.2f}"
    )
    print(f"  training throughput:                                     {result.tokens_per_s:,.0f} tokens/s")
    print(
        f"  peak RSS, this process + its worker (shared counted 2x): {own_mb + worker_mb:.0f} MB"
        f" ({own_mb:.0f} + {worker_mb:.0f})   nanoGPT: ~{NANOGPT['peak_mb']:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
