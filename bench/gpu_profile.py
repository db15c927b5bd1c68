"""Where a GPU training step of GPT-2 124M's shapes spends its time, op by op (issue 23's levers).

    python bench/gpu_profile.py [--steps 5] [--batch 8]

Every op of the CUDA backend (`DeviceOps`: layernorm, linear, attention, the loss, AdamW, and
GPT-2's fused pieces: linear_gelu (c_fc with its GELU), residual_layernorm (a residual with ln_2),
bias_residual, layernorm_add_backward, ...) is wrapped so that the device is synchronised before
and after it and the time between counted under its name; matrix products count under the op
that makes them, and an op called inside another counts under the outer one only. The synchronisations cost
a little, so the ops' total is somewhat above a step's plain time, which is printed beside it. The
step is `GPT.loss_and_grads` then `AdamW.step`, as bench/gpu.py times it. Needs CuPy and a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.transformer import GPT, AdamW, GPTConfig  # noqa: E402
from tokenkit.transformer.backends import get_backend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    backend = get_backend("cuda")
    V, T, C, L, H, B = 50304, 1024, 768, 12, 12, args.batch
    model = GPT(GPTConfig(vocab_size=V, context_length=T, d_model=C, n_layers=L, n_heads=H), seed=0, device="cuda")
    opt = AdamW(model.params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(0)
    data = [rng.integers(0, V, size=(B, T + 1)) for _ in range(args.steps + 2)]

    def step(seq):
        _, grads = model.loss_and_grads(seq[:, :-1], seq[:, 1:])
        opt.step(grads)

    def per_step() -> float:
        """Seconds a step of data[2:] takes, the device synchronised at both ends."""
        backend.synchronize()
        start = time.perf_counter()
        for seq in data[2:]:
            step(seq)
        backend.synchronize()
        return (time.perf_counter() - start) / args.steps

    for seq in data[:2]:  # warm up: kernels compiled, pools filled
        step(seq)
    plain = per_step()

    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    ops = model.ops
    originals = {}
    inside = [False]  # an op that another op calls (linear_gelu_backward's linear_backward) is the outer one's
    for name in dir(type(ops)):
        fn = getattr(ops, name)
        if name.startswith("_") or not callable(fn):
            continue
        originals[name] = fn

        def timed(*a, _fn=fn, _name=name, **k):
            if inside[0]:
                return _fn(*a, **k)
            backend.synchronize()
            t = time.perf_counter()
            inside[0] = True
            try:
                out = _fn(*a, **k)
            finally:
                inside[0] = False
            backend.synchronize()
            spent[_name] += time.perf_counter() - t
            calls[_name] += 1
            return out

        setattr(ops, name, timed)
    try:
        wrapped = per_step()
    finally:
        for name in originals:
            delattr(ops, name)  # the instance's wrapper goes; the class's method shows again
    total = sum(spent.values()) / args.steps
    print(f"GPT-2 124M shapes, batch {B} x {T}: a step {1000 * plain:.1f} ms ({B * T / plain:,.0f} tokens/s); "
          f"with every op synchronised {1000 * wrapped:.1f} ms, of which the ops {1000 * total:.1f} ms")  # fmt: skip
    print(f"{'op':<26} {'ms/step':>9} {'share':>7} {'calls/step':>11}")
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        ms = 1000 * seconds / args.steps
        print(f"{name:<26} {ms:9.2f} {ms / (1000 * total):7.1%} {calls[name] / args.steps:11.0f}")


if __name__ == "__main__":
    main()
