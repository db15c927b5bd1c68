"""Where the time of our training step goes, op by op, next to PyTorch's same ops.

    flock /tmp/tokenkit-bench.lock python bench/profile_model.py [--configs S,M,L] [--steps 5]

Everything runs on ONE thread (our plain GPT, one process, OpenBLAS and PyTorch at one thread)
and is timed in CPU time of the calling thread (time.thread_time), minimum over repeats: such
figures hardly move when other processes share the cores, unlike wall-clock medians of a
2-thread run. Two tables per config:

1. our step in context: every `transformer.ops` call of a real training step wrapped with a
   timer, summed per op and per linear shape (ms per step); "other" is what no op accounts
   for (the unembedding GEMMs, which the model calls inline, residual adds, Python).
2. op by op against PyTorch at the same shapes: ms per call of ours and torch's (F.layer_norm,
   tanh F.gelu, scaled_dot_product_attention, F.linear, F.cross_entropy, embedding), each
   backward through autograd, and the gap per step (per call x calls per step).

What this does not do: judge 2-thread scaling (see bench/model.py for the side-by-side run).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads OpenBLAS
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.transformer import GPT, AdamW, GPTConfig, ops  # noqa: E402
from tokenkit.transformer.backends import cpu  # noqa: E402

CONFIGS = {  # name: (vocab, context, d_model, layers, heads, batch), as bench/model.py
    "S": (256, 64, 128, 4, 4, 12),
    "M": (4096, 128, 256, 4, 8, 16),
    "L": (8192, 256, 384, 6, 6, 8),
}
clock = time.thread_time


def best_ms(fn, reps: int, setup=None) -> float:
    """Minimum CPU ms of fn() (or fn(setup()), setup untimed) over reps calls, after one untimed
    call (first calls pay for lazy initialisation, in PyTorch especially)."""
    fn(setup()) if setup else fn()
    best = math.inf
    for _ in range(reps):
        arg = setup() if setup else None
        t0 = clock()
        fn(arg) if setup else fn()
        best = min(best, clock() - t0)
    return 1e3 * best


# ----------------------------------------------------------------------------- 1. in context


class OpTimer:
    """Wraps the ops the model calls with timers: the CPU backend's op module's attributes
    (transformer/backends/cpu.py), which the model looks up at call time as `self.ops.<op>`; an
    op that calls another inside ops.py is timed once, as itself. The linear layers are timed by
    their weight's shape."""

    NAMES = tuple(name for name in cpu.OPS if name not in ("sinusoidal_table", "adamw_update"))
    BY_SHAPE = {
        "linear_forward": lambda a: "linear_forward {}x{}".format(*a[1].shape),
        "linear_backward": lambda a: "linear_backward {}x{}".format(*a[1][1].shape),
    }

    def __init__(self):
        self.total: dict[str, float] = defaultdict(float)
        self.saved = {name: getattr(cpu, name) for name in self.NAMES}

    def wrap(self, fn, label):
        def timed(*args, **kwargs):
            t0 = clock()
            out = fn(*args, **kwargs)
            key = label(args) if callable(label) else label
            self.total[key] += clock() - t0
            return out

        return timed

    def __enter__(self):
        for name in self.NAMES:
            setattr(cpu, name, self.wrap(self.saved[name], self.BY_SHAPE.get(name, name)))
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(cpu, name, fn)


def profile_step(name: str, steps: int) -> None:
    V, T, C, n_layers, n_heads, B = CONFIGS[name]
    model = GPT(GPTConfig(vocab_size=V, context_length=T, d_model=C, n_layers=n_layers, n_heads=n_heads), seed=0)
    opt = AdamW(model.params, lr=3e-4, threads=1)
    rng = np.random.default_rng(0)
    per_step: list[dict[str, float]] = []
    with OpTimer() as timer:
        for i in range(steps + 2):
            seq = rng.integers(0, V, size=(B, T + 1))
            timer.total.clear()
            t0 = clock()
            _, grads = model.loss_and_grads(seq[:, :-1], seq[:, 1:])
            t1 = clock()
            opt.step(grads)
            t2 = clock()
            if i >= 2:
                row = dict(timer.total)
                row["(forward + backward, all)"] = t1 - t0
                row["AdamW step"] = t2 - t1
                per_step.append(row)
    best = min(per_step, key=lambda r: r["(forward + backward, all)"])  # the least disturbed step
    total = best["(forward + backward, all)"] + best["AdamW step"]
    ops_sum = sum(v for k, v in best.items() if not k.startswith("(") and k != "AdamW step")
    best["other: unembedding GEMMs, residual adds, Python"] = best["(forward + backward, all)"] - ops_sum
    print(
        f"\n== {name}: our training step in context, 1 thread, CPU ms (fastest of {steps} steps): {1e3 * total:.1f} ms"
    )
    for key in sorted((k for k in best if not k.startswith("(")), key=lambda k: -best[k]):
        print(f"   {key:<58}{1e3 * best[key]:9.2f} ms {100 * best[key] / total:6.1f}%")


# ----------------------------------------------------------------------------- 2. vs PyTorch


def compare_ops(name: str, reps: int) -> None:
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(1)
    V, T, C, L, H, B = CONFIGS[name]
    N = B * T
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    def leaf(a):
        return torch.from_numpy(a.copy()).requires_grad_(True)

    rows = []  # (op, calls per step, ours ms, torch ms)

    x, w, b, d = rand(B, T, C), rand(C), rand(C), rand(B, T, C)
    _, ln_cache = ops.layernorm_forward(x, w, b)
    xt, wt, bt, dt = leaf(x), leaf(w), leaf(b), torch.from_numpy(d)
    rows.append(
        (
            "layernorm forward",
            2 * L + 1,
            best_ms(lambda: ops.layernorm_forward(x, w, b), reps),
            best_ms(lambda: F.layer_norm(xt, (C,), wt, bt, 1e-5), reps),
        )
    )
    rows.append(
        (
            "layernorm backward",
            2 * L + 1,
            best_ms(lambda: ops.layernorm_backward(d, ln_cache), reps),
            best_ms(
                lambda y: torch.autograd.grad(y, (xt, wt, bt), dt),
                reps,
                setup=lambda: F.layer_norm(xt, (C,), wt, bt, 1e-5),
            ),
        )
    )

    h, dh = rand(B, T, 4 * C), rand(B, T, 4 * C)
    _, gelu_cache = ops.gelu_forward(h)
    ht, dht = leaf(h), torch.from_numpy(dh)
    rows.append(
        (
            "gelu forward",
            L,
            best_ms(lambda: ops.gelu_forward(h), reps),
            best_ms(lambda: F.gelu(ht, approximate="tanh"), reps),
        )
    )
    rows.append(
        (
            "gelu backward",
            L,
            best_ms(lambda: ops.gelu_backward(dh, gelu_cache), reps),
            best_ms(lambda y: torch.autograd.grad(y, ht, dht), reps, setup=lambda: F.gelu(ht, approximate="tanh")),
        )
    )

    qkv, dy = rand(B, T, 3 * C) * 0.5, rand(B, T, C)
    qkvt, dyt = leaf(qkv), torch.from_numpy(dy)

    def torch_attention():
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkvt.split(C, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)

    rows.append(
        (
            "attention forward (torch: SDPA)",
            L,
            best_ms(lambda: ops.attention_forward(qkv, H, True), reps),
            best_ms(torch_attention, reps),
        )
    )
    rows.append(
        (
            "attention backward (torch: SDPA)",
            L,
            best_ms(
                lambda cache: ops.attention_backward(dy, cache),
                reps,
                setup=lambda: ops.attention_forward(qkv, H, True)[1],
            ),
            best_ms(lambda y: torch.autograd.grad(y, qkvt, dyt), reps, setup=torch_attention),
        )
    )

    def linear_rows(c_in, c_out):
        # A function per shape, so that the timed lambdas close over its own locals, not loop variables.
        xi, W, bias, do = rand(B, T, c_in), rand(c_in, c_out), rand(c_out), rand(B, T, c_out)
        _, lin_cache = ops.linear_forward(xi, W, bias)
        xit, Wt, bt2, dot = leaf(xi), leaf(W.T), leaf(bias), torch.from_numpy(do)
        return [
            (
                f"linear forward {c_in}x{c_out}",
                L,
                best_ms(lambda: ops.linear_forward(xi, W, bias), reps),
                best_ms(lambda: F.linear(xit, Wt, bt2), reps),
            ),
            (
                f"linear backward {c_in}x{c_out}",
                L,
                best_ms(lambda: ops.linear_backward(do, lin_cache), reps),
                best_ms(
                    lambda y: torch.autograd.grad(y, (xit, Wt, bt2), dot), reps, setup=lambda: F.linear(xit, Wt, bt2)
                ),
            ),
        ]

    for c_in, c_out in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)):
        rows.extend(linear_rows(c_in, c_out))

    xf, wte, targets = rand(N, C), rand(V, C) * 0.02, rng.integers(0, V, N)
    xft, wtet, tgt = leaf(xf), leaf(wte), torch.from_numpy(targets)
    logits = xf @ wte.T
    rows.append(
        ("unembedding forward (N,C)@(C,V)", 1, best_ms(lambda: xf @ wte.T, reps), best_ms(lambda: xft @ wtet.T, reps))
    )
    dl = rand(N, V) * 1e-3
    dlt = torch.from_numpy(dl)
    rows.append(
        (
            "unembedding backward (dW and dx)",
            1,
            best_ms(lambda: (dl.T @ xf, dl @ wte), reps),
            best_ms(lambda y: torch.autograd.grad(y, (xft, wtet), dlt), reps, setup=lambda: xft @ wtet.T),
        )
    )
    rows.append(
        (
            "softmax cross-entropy forward",
            1,
            best_ms(lambda z: ops.softmax_xent_forward(z, targets), reps, setup=logits.copy),
            best_ms(lambda z: F.cross_entropy(z, tgt), reps, setup=lambda: leaf(logits)),
        )
    )

    def torch_xent():
        z = leaf(logits)
        return F.cross_entropy(z, tgt), z

    rows.append(
        (
            "softmax cross-entropy backward",
            1,
            best_ms(
                lambda cache: ops.softmax_xent_backward(cache, N),
                reps,
                setup=lambda: ops.softmax_xent_forward(logits.copy(), targets)[1],
            ),
            best_ms(lambda lz: torch.autograd.grad(lz[0], lz[1]), reps, setup=torch_xent),
        )
    )
    ids, de = rng.integers(0, V, (B, T)), rand(B, T, C)
    idst, det = torch.from_numpy(ids), torch.from_numpy(de)
    rows.append(
        (
            "embedding backward",
            1,
            best_ms(lambda: ops.embedding_backward(de, (ids, (V, C)), np.zeros((V, C), np.float32)), reps),
            best_ms(lambda y: torch.autograd.grad(y, wtet, det), reps, setup=lambda: F.embedding(idst, wtet)),
        )
    )

    print(f"\n== {name}: op by op, 1 thread, CPU ms per call (min of {reps}); gap = (ours - torch) x calls per step")
    print(f"   {'op':<36}{'calls':>6}{'ours':>9}{'torch':>9}{'ours/torch':>11}{'gap ms/step':>13}")
    ours_sum = torch_sum = 0.0
    for op, calls, ours_ms, torch_ms in sorted(rows, key=lambda r: -(r[2] - r[3]) * r[1]):
        ours_sum += calls * ours_ms
        torch_sum += calls * torch_ms
        print(
            f"   {op:<36}{calls:>6}{ours_ms:>9.3f}{torch_ms:>9.3f}{ours_ms / torch_ms:>11.2f}"
            f"{calls * (ours_ms - torch_ms):>13.2f}"
        )
    print(
        f"   {'all of the above, per step':<36}{'':>6}{ours_sum:>9.1f}{torch_sum:>9.1f}"
        f"{ours_sum / torch_sum:>11.2f}{ours_sum - torch_sum:>13.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="S,M,L")
    ap.add_argument("--steps", type=int, default=5, help="profiled training steps (after 2 warmup)")
    ap.add_argument("--reps", type=int, default=7, help="repeats per op in the comparison")
    args = ap.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    for n in names:
        if n not in CONFIGS:
            ap.error(f"unknown config {n!r}; choose from {', '.join(CONFIGS)}")
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    print(f"load average {os.getloadavg()[0]:.2f}; NumPy {np.__version__}; single thread, CPU time")
    for name in names:
        profile_step(name, args.steps)
        if have_torch:
            compare_ops(name, args.reps)


if __name__ == "__main__":
    main()
