"""Fine-tuning on conversations against pretraining at the same shape, side by side: tokens/s.

    flock /tmp/tokenkit-bench.lock python bench/sft_speed.py [--repeats 5] [--steps 20] [--workers 1]

Runs `tk train-model` twice per repeat, alternating: pretraining on corpora/tiny_tales.txt, and
fine-tuning (`--chat`) on corpora/tiny_dialogues.jsonl from a base of the same shape (`tk pipeline
--chat`'s: width 128, 2 layers, 4 heads, context 288, batches of 16 rows). Both count tokens the
same way, from each step's wall time in log.jsonl (`dt`: the step alone, without start-up,
encoding, packing or evaluation; the first step of each run, which starts the worker pool, is
left out): **all tokens of the batch**, rows x context per step, padding included (what the model
computes), and for the fine-tuning also the **counted tokens**, the assistant's targets the loss
counts (log.jsonl's `counted` share of the batch). Each run's figure is the median of its steps;
the script prints each side's median over the repeats and the ratio fine-tuning / pretraining of
all tokens (goal: at least 0.9). One process by default (`--workers 1`): a step then waits for no
other process, so a load that comes and goes on a shared machine stretches fewer of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TALES = REPO / "corpora" / "tiny_tales.txt"
DIALOGUES = REPO / "corpora" / "tiny_dialogues.jsonl"
SHAPE = ["--d-model", "128", "--n-layers", "2", "--n-heads", "4", "--context-length", "288"]
BATCH, CONTEXT = 16, 288


def tk(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "tokenkit.cli.main", *args], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: tk {' '.join(args)}\n{proc.stderr}")
    return proc


def step_figures(run: Path) -> tuple[float, float | None]:
    """(all tokens/s, counted tokens/s or None): the medians over the run's steps but its first."""
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"][1:]
    every = statistics.median(BATCH * CONTEXT / r["dt"] for r in steps)
    if "counted" not in steps[0]:
        return every, None
    return every, statistics.median(r["counted"] * BATCH * CONTEXT / r["dt"] for r in steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    common = ["--steps", str(args.steps), "--batch-size", str(BATCH), "--workers", str(args.workers)]
    common += ["--eval-batches", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = root / "tok.safetensors"
        tk("bpe-train", str(TALES), "--vocab-size", "1024", "-q", "-o", str(tok))
        base = root / "base"
        tk("train-model", str(TALES), "-t", str(tok), "-o", str(base), *SHAPE, "--steps", "1", "-q")
        pre, sft, counted = [], [], []
        for r in range(args.repeats):  # interleaved: a load that comes and goes weighs on both sides
            tk("train-model", str(TALES), "-t", str(tok), "-o", str(root / f"pre{r}"), *SHAPE, *common, "-q")
            pre.append(step_figures(root / f"pre{r}")[0])
            out = tk("train-model", "--chat", str(DIALOGUES), "--init-from", str(base), "-o", str(root / f"sft{r}"),
                     *common)  # fmt: skip
            every, mine = step_figures(root / f"sft{r}")
            sft.append(every)
            counted.append(mine)
            print(f"repeat {r + 1}: pretraining {pre[-1]:,.0f}, fine-tuning {every:,.0f} tokens/s", flush=True)
        packing = next((line for line in (out.stdout + out.stderr).splitlines() if " rows of " in line), "")
    p, s, c = (statistics.median(v) for v in (pre, sft, counted))
    print(f"shape: width 128, 2 layers, 4 heads, context {CONTEXT}, {BATCH} rows a step, --workers {args.workers}")
    print(f"medians of {args.repeats} repeats of {args.steps} steps (each run's median step, its first left out):")
    print(f"  {'pretraining, tiny_tales.txt:':<42}{p:>8,.0f} tokens/s (all tokens of the batch)")
    print(f"  {'fine-tuning, tiny_dialogues.jsonl --chat:':<42}{s:>8,.0f} tokens/s (all tokens, padding included)")
    print(f"  {'':<42}{c:>8,.0f} counted tokens/s (the assistant's targets)")
    print(f"  ratio fine-tuning / pretraining, all tokens: {s / p:.3f}")
    if packing:
        print(f"  {packing}")


if __name__ == "__main__":
    main()
