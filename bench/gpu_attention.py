"""Causal attention alone on a GPU, forward and backward, at GPT-2 124M's shapes: tk's fused
kernels (attention_source.py), tk's GEMM path (the (T, T) weights), and PyTorch eager's
`scaled_dot_product_attention`, side by side in one run.

    python bench/gpu_attention.py [--batch 8] [--context 1024] [--heads 12] [--head-dim 64] [--repeat 20]

Each figure is the median of `--repeat` timed calls (CUDA events) after 3 warm-ups, on random
inputs, TF32 on for everyone (as in bench/gpu.py). TFLOP/s count the causal half: forward
4 B H T^2 D / 2 (two products), backward 2.5 times that (five products), whatever a method
really computes. Needs CuPy and a GPU; PyTorch is optional.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.transformer.backends import get_backend, set_tf32  # noqa: E402


def median_ms(fn, repeat: int, new_event, synchronize_event, elapsed_ms) -> float:
    """The median time of `repeat` calls of fn (device events around each) after 3 warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start, end = new_event(), new_event()
        start.record()
        fn()
        end.record()
        synchronize_event(end)
        times.append(elapsed_ms(start, end))
    return float(np.median(times))


def tk_rows(args, fused: bool) -> tuple[float, float, float]:
    import cupy

    ops = get_backend("cuda").ops
    B, T, H, D = args.batch, args.context, args.heads, args.head_dim
    rng = cupy.random.default_rng(0)
    qkv = rng.standard_normal((B, T, 3 * H * D), dtype=cupy.float32)
    dout = rng.standard_normal((B, T, H * D), dtype=cupy.float32)
    was = ops.kernels.fused_attention
    ops.kernels.fused_attention = fused
    try:
        pool = cupy.get_default_memory_pool()
        before = pool.used_bytes()
        _, cache = ops.attention_forward(qkv, H, True)
        kept = pool.used_bytes() - before  # the output and what the backward keeps

        def elapsed(fn):
            return median_ms(fn, args.repeat, cupy.cuda.Event, lambda e: e.synchronize(), cupy.cuda.get_elapsed_time)

        forward = elapsed(lambda: ops.attention_forward(qkv, H, True))
        backward = elapsed(lambda: ops.attention_backward(dout, cache))
        return forward, backward, kept / 1e6
    finally:
        ops.kernels.fused_attention = was


def torch_row(args) -> tuple[float, float, float] | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    B, T, H, D = args.batch, args.context, args.heads, args.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", generator=g, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, T, D, device="cuda", generator=g)

    def elapsed(fn):
        return median_ms(fn, args.repeat, lambda: torch.cuda.Event(enable_timing=True), lambda e: e.synchronize(),
                         lambda start, end: start.elapsed_time(end))  # fmt: skip

    forward = elapsed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    kept = torch.cuda.memory_allocated() - before  # the output and what autograd keeps
    backward = elapsed(lambda: torch.autograd.grad(y, (q, k, v), dout, retain_graph=True))
    return forward, backward, kept / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    set_tf32(True)
    B, T, H, D = args.batch, args.context, args.heads, args.head_dim
    flop = 4 * B * H * T * T * D / 2
    rows = [("tk fused", tk_rows(args, True)), ("tk GEMMs + softmax", tk_rows(args, False))]
    theirs = torch_row(args)
    if theirs is not None:
        rows.append(("PyTorch SDPA", theirs))
    print(f"causal attention, B {B} T {T} H {H} D {D}, one layer; medians of {args.repeat} (ms)")
    print(f"{'method':<20} {'forward':>8} {'backward':>9} {'TFLOP/s':>8} {'kept MB':>8}")
    for name, (fwd, bwd, kept) in rows:
        tflops = 3.5 * flop / ((fwd + bwd) * 1e-3) / 1e12
        print(f"{name:<20} {fwd:8.3f} {bwd:9.3f} {tflops:8.1f} {kept:8.1f}")
    if theirs is not None:
        ours = rows[0][1]
        print(f"fused / PyTorch time: forward {ours[0] / theirs[0]:.2f}x, backward {ours[1] / theirs[1]:.2f}x")


if __name__ == "__main__":
    main()
