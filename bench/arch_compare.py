"""The Quick start's run as GPT-2 and as a Llama-family decoder of the same parameter count.

    flock /tmp/tokenkit-bench.lock python bench/arch_compare.py [--steps 2000]

Both are `tk pipeline corpora/tiny_tales.txt`'s defaults (a 1,024-token BPE vocabulary, width
128, 2 layers, 4 heads, context 64, batch 16, 2000 steps, lr 4e-3 cosine to 4e-4, seed 0),
trained by the pipeline into temporary run directories; one seed each. The GPT-2 preset is
`--arch gpt2`; the Llama one `--arch llama` (RoPE, RMSNorm, SwiGLU, no biases, an untied
lm_head) with 2 K/V heads and an MLP width chosen so that the parameter totals match: the
untied lm_head (V x C) and three SwiGLU matrices leave it 228 wide where GPT-2's is 512.
Prints each run's parameters, best validation loss, wall time, and the unigram baseline (the
loss of predicting every token by its training frequency).

It does not tune either architecture: both use GPT-2's learning-rate schedule as the Quick
start sets it, so the comparison is of the pieces under one recipe, not of tuned models.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.pipeline.config import TrainConfig  # noqa: E402
from tokenkit.pipeline.run import run_pipeline  # noqa: E402
from tokenkit.transformer import GPTConfig  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "corpora" / "tiny_tales.txt"
VOCAB = 1024
ARCHS = {  # name: the settings beside the Quick start's defaults
    "gpt2": {"arch": "gpt2"},
    "llama": {"arch": "llama", "n_kv_heads": 2, "mlp_hidden": 228},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="optimizer steps of each run (the Quick start: 2000)")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    args = ap.parse_args(argv)
    rows = []
    baseline = None
    for name, settings in ARCHS.items():
        config = TrainConfig.from_dict({**settings, "steps": args.steps})
        n_params = GPTConfig(**config.model_config(VOCAB)).n_params()
        with tempfile.TemporaryDirectory(prefix=f"arch-{name}-") as tmp:
            t0 = time.perf_counter()
            result = run_pipeline(args.corpus, Path(tmp) / "run", vocab_size=VOCAB, config=config, quiet=True)
            wall = time.perf_counter() - t0
        train = result.train
        baseline = train.unigram_baseline
        rows.append((name, n_params, train.best_val_loss, train.best_step, train.last_val_loss, wall))
        print(f"  {name} done: val {train.best_val_loss:.4f} in {wall:.0f} s", flush=True)
    gpt2_params = rows[0][1]
    print(f"\n{args.corpus.name}, vocab {VOCAB}, {args.steps} steps, seed 0 (one run each)")
    print(f"{'arch':<7}{'params':>10}{'vs gpt2':>9}{'best val':>10}{'at step':>9}{'last val':>10}{'wall s':>8}")
    for name, n, best, step, last, wall in rows:
        print(f"{name:<7}{n:>10,}{n / gpt2_params - 1:>+8.2%} {best:>9.4f}{step:>9}{last:>10.4f}{wall:>8.0f}")
    print(f"unigram baseline: {baseline:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
