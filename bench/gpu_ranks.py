"""Two MPI ranks on the GPU against one process: the same bits, and what the host-staged reduction costs.

    python bench/gpu_ranks.py [--shapes m,gpt2] [--steps 10] [--warmup 2] [--ranks 2]

For each shape, three fresh processes train --steps AdamW steps on the same random batches
(float32, TF32 GEMMs as by default), each step timed with the GPU synchronised at both ends:

- `alone:1`: one process, the batch whole (`GPT.loss_and_grads`: what `tk train-model --device cuda`
  runs without mpirun);
- `alone:N`: one process, the batch's N shards in turn, summed in shard order (`sum_of_shards`);
- `ranks:N`: `mpirun -n N`, MPIDataParallel, each rank on GPU (local rank % GPUs) with one shard,
  its gradients to the host, `ordered_allreduce`, back to the GPU.

`ranks:N` must end with the bits of `alone:N` (losses and weights); the table says whether it did,
and each side's median ms per step and tokens/s. On a machine with one GPU the ranks share it,
so `ranks:N` is no faster than one process there: it shows the reduction's cost, not a speed-up.

Shapes: m is width 256, 4 layers, 8 heads, context 128, batch 16, vocab 1024 (bench/model.py's M);
gpt2 is GPT-2 small's (vocab 50304, context 1024, 12 layers of width 768, 12 heads) at batch 8.
Needs CuPy and a GPU, mpi4py and mpirun; without them it prints one line and exits with status 1.
`--twins` stands the CUDA kernels' NumPy twins in for the GPU: a dry run of the script anywhere.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHAPES = {  # name: (vocab, context, d_model, layers, heads, batch)
    "m": (1024, 128, 256, 4, 8, 16),
    "gpt2": (50304, 1024, 768, 12, 12, 8),
}
LR = 3e-4


def train(shape: str, mode: str, steps: int, warmup: int, out: Path, twins: bool) -> None:
    """One side's steps, in this process (`mode`: alone:N or ranks); rank 0 writes `out`.npz / .json."""
    from tokenkit.transformer import GPT, AdamW, GPTConfig, backends, clip_grad_norm
    from tokenkit.transformer.parallel import MPIDataParallel, sum_of_shards

    if twins:
        use_twins()

    V, T, C, L, H, B = SHAPES[shape]
    config = GPTConfig(vocab_size=V, context_length=T, d_model=C, n_layers=L, n_heads=H)
    rank = 0
    if mode == "ranks":
        from mpi4py import MPI

        node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
        backend = backends.use_gpu(node.Get_rank())
        node.Free()
        model = MPIDataParallel(GPT(config, seed=0, device="cuda"), MPI.COMM_WORLD)
        gpt, rank = model.model, model.rank
        rows = model.local_rows(B)
        step = lambda x, y: model.loss_and_grads(x[rows], y[rows], batch_rows=B)  # noqa: E731
    else:
        backend = backends.get_backend("cuda")
        gpt, n = GPT(config, seed=0, device="cuda"), int(mode.split(":")[1])
        step = gpt.loss_and_grads if n == 1 else lambda x, y: sum_of_shards(gpt, x, y, n)  # noqa: E731
    opt = AdamW(gpt.params, lr=LR)
    rng = np.random.default_rng(0)
    losses, times = [], []
    for k in range(warmup + steps):
        seqs = rng.integers(0, V, size=(B, T + 1))
        backend.synchronize()
        t0 = time.perf_counter()
        loss, grads = step(seqs[:, :-1], seqs[:, 1:])
        clip_grad_norm(grads, 1.0)
        opt.step(grads)
        backend.synchronize()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(loss)
    if rank == 0:
        np.savez(out.with_suffix(".npz"), losses=np.array(losses), **gpt.host_params())
        out.with_suffix(".json").write_text(json.dumps({"times": times}), encoding="utf-8")


def use_twins() -> None:
    """The CUDA kernels' NumPy twins in place of the GPU: a dry run of this script on any machine."""
    from tokenkit.transformer import backends
    from tokenkit.transformer.backends.cuda_twins import twin_backend

    backends._BACKENDS["cuda"] = twin_backend()


def run_side(shape: str, mode: str, args, tmp: Path) -> tuple[dict | None, str]:
    """(results of one side, or None; its last error line)."""
    out = tmp / f"{shape}-{mode.replace(':', '')}"
    me = [sys.executable, str(Path(__file__).resolve()), "--side", mode, "--shapes", shape, "--out", str(out)]
    me += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    me += ["--twins"] if args.twins else []
    cmd = [shutil.which("mpirun"), "-n", str(args.ranks), *me] if mode == "ranks" else me
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.timeout} s"
    if proc.returncode:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return None, f"rc={proc.returncode}: {lines[-1] if lines else '(no output)'}"
    arrays = dict(np.load(out.with_suffix(".npz")))
    return {"arrays": arrays, "times": json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["times"]}, ""


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="m,gpt2")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=120, help="seconds for each side's process")
    ap.add_argument("--twins", action="store_true", help="the kernels' NumPy twins for the GPU: a dry run without one")
    ap.add_argument("--side", help=argparse.SUPPRESS)  # alone:N or ranks: one side, in this process
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side is not None:
        train(args.shapes, args.side, args.steps, args.warmup, args.out, args.twins)
        return 0
    if args.twins:
        use_twins()
    from tokenkit.transformer import ModelError
    from tokenkit.transformer.backends import get_backend

    try:
        get_backend("cuda")
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if shutil.which("mpirun") is None:
        print("error: no mpirun on PATH (pip install mpich, or the MPI of this machine)", file=sys.stderr)
        return 1
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            V, T, C, L, H, B = SHAPES[shape]
            sides = {}
            for mode in ("alone:1", f"alone:{args.ranks}", "ranks"):
                sides[mode], error = run_side(shape, mode, args, Path(tmp))
                ms = statistics.median(sides[mode]["times"]) * 1e3 if sides[mode] else float("nan")
                rows.append([shape, mode if mode != "ranks" else f"ranks:{args.ranks}", ms, B * T / ms * 1e3, error])
            ref, got = sides[f"alone:{args.ranks}"], sides["ranks"]
            same = ref is not None and got is not None and same_bits(ref["arrays"], got["arrays"])
            failed |= not same
            rows[-1][-1] = rows[-1][-1] or ("bit-identical to alone" if same else "DIFFERS from alone")
    print(f"{'shape':6} {'side':9} {'ms/step':>9} {'tokens/s':>10}  note")
    for shape, side, ms, tps, note in rows:
        print(f"{shape:6} {side:9} {ms:9.1f} {tps:10,.0f}  {note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
