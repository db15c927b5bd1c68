"""Training on MPI ranks against the local worker pool, side by side: what MPI costs on one machine.

    flock /tmp/tokenkit-bench.lock python bench/mpi_train.py [--repeats 5] [--shapes default,m]

Runs `tk train-model` on the default corpus twice per repeat, alternating: in one process with
`--workers 2`, and as `mpirun -n 2 ... --workers 1`. Both compute the same two shards per step
(their files are byte-identical, tests/test_train_mpi.py); the difference is how the second
shard's gradients come back: through shared memory from a forked worker, or through MPI's
Allgather. Each run reports its training tokens/s (training steps only, not start-up, encoding or
evaluation); the script prints each side's median and the ratio MPI / pool (goal >= 0.9x).

Two model shapes: the default one (0.5M parameters) and `--shape m` (bench/model.py's M: width
256, 4 layers, context 128, batch 16; 3.4M parameters with a 1024-token vocabulary), where a step
moves 7x more gradient bytes. Needs mpi4py and mpirun (`pip install -e '.[mpi]'`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "corpora" / "tiny_tales.txt"
SHAPES = {  # name: (steps, flags)
    "default": (150, []),
    "m": (
        40,
        ["--d-model", "256", "--n-layers", "4", "--n-heads", "8", "--context-length", "128", "--batch-size", "16"],
    ),
}


def tokens_per_s(cmd: list[str]) -> float:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    found = re.search(r"([\d,]+) tokens/s", proc.stdout)
    return float(found.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shapes", default="default,m")
    args = ap.parse_args()
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("no mpirun on PATH: pip install -e '.[mpi]'")
    tk = [sys.executable, "-m", "tokenkit.cli.main"]
    with tempfile.TemporaryDirectory() as tmp:
        tok = Path(tmp) / "tok.safetensors"
        subprocess.run(
            [*tk, "bpe-train", str(CORPUS), "--vocab-size", "1024", "-q", "-o", str(tok)], cwd=REPO, check=True
        )
        print(
            f"tk train-model {CORPUS.name} (eval every 1000 steps), tokens/s of the training steps; "
            f"median of {args.repeats}, alternating"
        )
        for shape in args.shapes.split(","):
            steps, flags = SHAPES[shape]
            common = [
                str(CORPUS),
                "-t",
                str(tok),
                "--steps",
                str(steps),
                "--eval-interval",
                "1000",
                "-q",
                "--overwrite",
                *flags,
            ]
            pool, ranks = [], []
            for _ in range(args.repeats):
                run = Path(tmp) / "run"
                pool.append(tokens_per_s([*tk, "train-model", *common, "-o", str(run), "--workers", "2"]))
                ranks.append(
                    tokens_per_s([mpirun, "-n", "2", *tk, "train-model", *common, "-o", str(run), "--workers", "1"])
                )
            p, r = statistics.median(pool), statistics.median(ranks)
            print(
                f"{shape:>8}  ({steps} steps) --workers 2: {p:>9,.0f} tok/s   "
                f"mpirun -n 2 --workers 1: {r:>9,.0f} tok/s   "
                f"ratio {r / p:.2f}x (goal >= 0.9x)"
            )
            print(f"{'':>8}  runs: pool {[round(x) for x in pool]}, mpi {[round(x) for x in ranks]}")


if __name__ == "__main__":
    main()
