"""The linear layers' weight gradient on a GPU, two ways, at GPT-2 124M's shapes: each GEMM alone,
then whole training steps with each (issue 23's last known lever for training).

    python bench/gpu_linear.py [--steps 10] [--rounds 3]

dW = x^T dout (Cin, Cout) is one GEMM whose reduction runs over all N = B T rows; cuBLAS gets it
as `x.T @ d` (the form DeviceOps.linear_backward uses) or as the transpose of `d.T @ x`, the same
products summed in another layout, for which it may pick another kernel. The table gives each
GEMM's median time (CUDA events, 10 calls after a warm-up) for each layer shape, then the median
ms per whole step (loss_and_grads and AdamW) with each form, the forms alternating round by
round in one process. Needs CuPy and a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.transformer import GPT, AdamW, GPTConfig  # noqa: E402
from tokenkit.transformer.backends import get_backend  # noqa: E402
from tokenkit.transformer.backends.device_ops import DeviceOps  # noqa: E402

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # qkv, proj, fc, fc_proj


def dweight_plain(x2, d2):
    return x2.T @ d2


def dweight_transposed(x2, d2):
    import cupy

    return cupy.ascontiguousarray((d2.T @ x2).T)


FORMS = {"x.T @ d": dweight_plain, "(d.T @ x).T": dweight_transposed}


def gemm_ms(fn, cupy) -> float:
    fn()
    times = []
    for _ in range(10):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def with_form(form):
    """DeviceOps.linear_backward with dW computed by `form` (the rest as in device_ops.py)."""

    def linear_backward(self, dout, cache):
        x, weight, has_bias = cache
        d2 = self.xp.ascontiguousarray(dout.reshape(-1, dout.shape[-1]))
        x2 = x.reshape(-1, x.shape[-1])
        dx = (d2 @ weight.T).reshape(x.shape)
        dbias = self.kernels.column_sums(d2, None) if has_bias else None
        return dx, form(x2, d2), dbias

    return linear_backward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import cupy

    backend = get_backend("cuda")
    N = 8 * 1024
    rng = cupy.random.default_rng(0)
    print(f"weight gradient GEMMs, N {N} rows; medians of 10 (ms)")
    print(f"{'Cin x Cout':>12} " + " ".join(f"{name:>12}" for name in FORMS))
    for cin, cout in SHAPES:
        x = rng.standard_normal((N, cin), dtype=cupy.float32)
        d = rng.standard_normal((N, cout), dtype=cupy.float32)
        row = [gemm_ms(lambda f=f, x=x, d=d: f(x, d), cupy) for f in FORMS.values()]
        print(f"{f'{cin} x {cout}':>12} " + " ".join(f"{ms:12.3f}" for ms in row))

    V, T, C, L, H, B = 50304, 1024, 768, 12, 12, 8
    model = GPT(GPTConfig(vocab_size=V, context_length=T, d_model=C, n_layers=L, n_heads=H), seed=0, device="cuda")
    opt = AdamW(model.params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    data = np.random.default_rng(0).integers(0, V, size=(B, T + 1))
    original = DeviceOps.linear_backward
    spent: dict[str, list[float]] = {name: [] for name in FORMS}
    try:
        for _ in range(args.rounds):
            for name, form in FORMS.items():
                DeviceOps.linear_backward = with_form(form)
                for _ in range(2):  # warm-up of this form
                    opt.step(model.loss_and_grads(data[:, :-1], data[:, 1:])[1])
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                for _ in range(args.steps):
                    opt.step(model.loss_and_grads(data[:, :-1], data[:, 1:])[1])
                end.record()
                end.synchronize()
                spent[name].append(cupy.cuda.get_elapsed_time(start, end) / args.steps)
    finally:
        DeviceOps.linear_backward = original
    backend.synchronize()
    print(f"whole GPT-2 steps (batch {B} x {T}), {args.rounds} rounds of {args.steps}: median ms/step")
    for name, times in spent.items():
        print(f"{name:>14} {np.median(times):8.2f}  ({', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
