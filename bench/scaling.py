"""Data-parallel training on N machines, on paper: per-step gradient traffic and predicted efficiency.

    flock /tmp/tokenkit-bench.lock python bench/scaling.py [--configs S,M,L,124M] [--repeats 3]

Measured here, per model shape (bench/model.py's S, M, L and GPT-2 124M: vocab 50257, context
1024, width 768, 12 layers, batch 8):
- P, the parameter count; a shard's gradients are 4P bytes (float32);
- t1, one training step of the whole batch on this machine (`DataParallel(workers=2)`, forward +
  backward + AdamW, median); for 124M, 2 rows are timed and scaled to 8 (time is linear in rows);
- t_add, one `total += shard` over P floats;
- between 2 ranks of this machine (`mpirun -n 2`, shared memory): tk's `ordered_allreduce` of P
  floats, and MPI's own `Allreduce` of the same for comparison.

Predicted, for N machines like this one (one rank each, `--workers 1`) joined by a network of
bandwidth BW and latency a:
- tk (bit-identical, `transformer.parallel.ordered_allreduce`): an Alltoallv of segments to
  their owners, each owner's ordered sum of N segments of P/N floats, an Allgatherv of the sums:
      t_comm = 2 (N - 1) (a + 4P / (N BW)) + t_add (N - 1) / N
  the bytes of a ring allreduce, 2 (N - 1) / N x 4P in and out per rank;
- for comparison, the simple exact design (every shard to every rank by Allgather, each rank
  sums all of them in order), which tk used at first:
      t_comm = (N - 1) (a + 4P / BW) + (N - 1) t_add
- compute: each rank runs ceil(B / N) of the batch's B rows: t_comp = t1 ceil(B / N) / B
- efficiency (no overlap of compute and communication, as in tk):  E(N) = t1 / (N (t_comp + t_comm))
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.transformer import GPT, AdamW, GPTConfig  # noqa: E402
from tokenkit.transformer.parallel import DataParallel  # noqa: E402

CONFIGS = {  # name: (vocab, context, d_model, layers, heads, batch); S, M, L as in bench/model.py
    "S": (256, 64, 128, 4, 4, 12),
    "M": (4096, 128, 256, 4, 8, 16),
    "L": (8192, 256, 384, 6, 6, 8),
    "124M": (50257, 1024, 768, 12, 12, 8),
}
TIMED_ROWS = {"124M": 2}  # rows actually timed when the whole batch would take minutes here
MACHINES = (2, 4, 8, 16, 32, 64)
NETWORKS = {"10 Gb/s": 10e9 / 8, "100 Gb/s": 100e9 / 8}  # bytes per second
LATENCY_S = 10e-6  # per message, a typical TCP/RoCE figure; it matters only for the smallest model

_REDUCE = """
import statistics, sys, time
import numpy as np
from mpi4py import MPI
from tokenkit.transformer.parallel import ordered_allreduce
comm = MPI.COMM_WORLD
flat = np.ones((1, int(sys.argv[1])), dtype=np.float32)
out = np.empty(flat.shape[1], dtype=np.float32)
times = {"tk": [], "mpi": []}
for _ in range(int(sys.argv[2]) + 1):
    for name in times:
        comm.Barrier()
        t = time.perf_counter()
        if name == "tk":
            ordered_allreduce(comm, flat, comm.Get_size())
        else:
            comm.Allreduce(flat[0], out)
        times[name].append(time.perf_counter() - t)
if comm.Get_rank() == 0:
    print(statistics.median(times["tk"][1:]), statistics.median(times["mpi"][1:]))
"""


def step_time(name: str, repeats: int) -> tuple[int, float]:
    """(P, median seconds of one whole-batch training step with 2 workers on this machine)."""
    V, T, C, L, H, B = CONFIGS[name]
    rows = TIMED_ROWS.get(name, B)
    model = DataParallel(
        GPT(GPTConfig(vocab_size=V, context_length=T, d_model=C, n_layers=L, n_heads=H), seed=0), workers=2
    )
    opt = AdamW(model.params, lr=1e-4)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(repeats + 1):  # the first step warms up
        ids, targets = rng.integers(0, V, (rows, T)), rng.integers(0, V, (rows, T))
        t = time.perf_counter()
        _, grads = model.loss_and_grads(ids, targets)
        opt.step(grads)
        times.append(time.perf_counter() - t)
    model.close()
    P = sum(int(p.size) for p in model.params.values())
    return P, statistics.median(times[1:]) * B / rows


def add_time(P: int, repeats: int) -> float:
    total, shard = np.zeros(P, dtype=np.float32), np.ones(P, dtype=np.float32)
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        total += shard
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def reduce_times_here(P: int, repeats: int) -> tuple[float, float] | None:
    """(tk's ordered_allreduce, MPI's Allreduce) of P floats between 2 ranks here, median seconds."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None
    proc = subprocess.run(
        [mpirun, "-n", "2", sys.executable, "-c", _REDUCE, str(P), str(repeats)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    if proc.returncode:
        return None
    tk, mpi = proc.stdout.split()
    return float(tk), float(mpi)


def efficiency(N: int, B: int, t1: float, t_comm: float) -> float:
    t_comp = t1 * math.ceil(B / N) / B
    return t1 / (N * (t_comp + t_comm))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="S,M,L,124M")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for name in args.configs.split(","):
        B = CONFIGS[name][5]
        P, t1 = step_time(name, args.repeats)
        t_add = add_time(P, max(args.repeats, 5))
        here = reduce_times_here(P, max(args.repeats, 5))
        shard_mb = 4 * P / 1e6
        print(
            f"\n{name}: P = {P:,} parameters, {shard_mb:,.1f} MB of gradients per shard; batch {B} rows; "
            f"step here t1 = {t1 * 1e3:,.1f} ms; t_add = {t_add * 1e3:.2f} ms"
        )
        if here is not None:
            print(
                f"  2 ranks here: ordered_allreduce {here[0] * 1e3:.2f} ms, MPI Allreduce {here[1] * 1e3:.2f} ms "
                f"({here[0] / here[1]:.2f}x)"
            )
        print(
            f"  {'N':>3}  {'MB in/rank':>10}"
            + "".join(f"  {'tk ' + net:>15}  {'allgather ' + net:>19}" for net in NETWORKS)
        )
        for N in MACHINES:
            row = f"  {N:>3}  {2 * (N - 1) / N * shard_mb:>10,.1f}"
            for bw in NETWORKS.values():
                tk = 2 * (N - 1) * (LATENCY_S + 4 * P / (N * bw)) + t_add * (N - 1) / N
                simple = (N - 1) * (LATENCY_S + 4 * P / bw) + (N - 1) * t_add
                row += (
                    f"  {efficiency(N, B, t1, tk):>6.0%} {tk * 1e3:>6.1f} ms"
                    f"  {efficiency(N, B, t1, simple):>10.0%} {simple * 1e3:>6.0f} ms"
                )
            print(row)


if __name__ == "__main__":
    main()
