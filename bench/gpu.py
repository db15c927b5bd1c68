"""GPU training and generation speed of tk's CuPy backend next to PyTorch eager, side by side.

    python bench/gpu.py [--configs gpt2,S,M,L] [--steps 20] [--warmup 3] [--quick]

For each config, in a fresh process per framework (so that neither's memory pool holds the
other's memory): training tokens/s of whole steps (forward, backward, AdamW; float32 with TF32
GEMMs on both sides, as issue 11 asks), timed over --steps after --warmup with the GPU
synchronised at both ends, and the peak GPU memory (ours: CuPy's memory pool, all it ever
reserved; PyTorch: torch.cuda.max_memory_reserved, and max_memory_allocated beside it). On
gpt2 it also times KV-cache generation of --gen-tokens tokens from a 16-token prompt, sampling
at temperature 1 (ours samples on the host from each step's logits). Then one table of ratios.

gpt2 is GPT-2 small's shapes (vocab 50304, context 1024, 12 layers of width 768, 12 heads) at
batch 8; S, M, L are bench/model.py's. PyTorch runs nanoGPT's model from bench/model.py with
scaled_dot_product_attention and fused AdamW (torch.optim.AdamW(fused=True)). PyTorch is
optional: without it only our figures are printed.

Without CuPy or a GPU it prints one line saying which is missing and exits with status 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from tokenkit.transformer import GPT, AdamW, GPTConfig, ModelError  # noqa: E402
from tokenkit.transformer.backends import get_backend  # noqa: E402


def _bench_model():
    """bench/model.py as a module: its S/M/L configs and its PyTorch model (one definition of each)."""
    spec = importlib.util.spec_from_file_location("bench_model", BENCH / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIGS = {"gpt2": (50304, 1024, 768, 12, 12, 8)}  # name: (vocab, context, d_model, layers, heads, batch)
LR = 3e-4


def all_configs() -> dict[str, tuple]:
    return {**CONFIGS, **_bench_model().CONFIGS}


def batches(shape: tuple, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    V, T, _, _, _, B = shape
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, V, size=(B, T + 1)) for _ in range(n)]
    return [(s[:, :-1].copy(), s[:, 1:].copy()) for s in seqs]


# ----------------------------------------------------------------------------- one framework, one config


def run_ours(shape: tuple, steps: int, warmup: int, gen_tokens: int) -> dict:
    import cupy

    V, T, C, L, H, B = shape
    backend = get_backend("cuda")
    model = GPT(GPTConfig(vocab_size=V, context_length=T, d_model=C, n_layers=L, n_heads=H), seed=0, device="cuda")
    opt = AdamW(model.params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    data = batches(shape, warmup + steps)

    def step(ids, targets):
        _, grads = model.loss_and_grads(ids, targets)
        opt.step(grads)

    for ids, targets in data[:warmup]:
        step(ids, targets)
    backend.synchronize()
    t0 = time.perf_counter()
    for ids, targets in data[warmup:]:
        step(ids, targets)
    backend.synchronize()
    elapsed = time.perf_counter() - t0
    result = {"tokens_per_s": steps * B * T / elapsed, "peak_mb": cupy.get_default_memory_pool().total_bytes() / 2**20}
    if gen_tokens:
        del opt
        prompt = np.random.default_rng(1).integers(0, V, 16)
        list(model.generate(prompt, 8, seed=0))  # warm the kernels up
        backend.synchronize()
        t0 = time.perf_counter()
        out = list(model.generate(prompt, gen_tokens, seed=0))
        result["gen_tokens_per_s"] = len(out) / (time.perf_counter() - t0)
    return result


def run_torch(shape: tuple, steps: int, warmup: int, gen_tokens: int) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    _, TorchGPT, _ = _bench_model().torch_classes()
    V, T, C, L, H, B = shape
    torch.manual_seed(0)
    model = TorchGPT(V, T, C, L, H).cuda()
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
    data = [(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()) for x, y in batches(shape, warmup + steps)]

    def step(x, y):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for x, y in data[:warmup]:
        step(x, y)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for x, y in data[warmup:]:
        step(x, y)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    result = {"tokens_per_s": steps * B * T / elapsed, "peak_mb": torch.cuda.max_memory_reserved() / 2**20,
              "allocated_mb": torch.cuda.max_memory_allocated() / 2**20}  # fmt: skip
    if gen_tokens:
        del opt
        prompt = np.random.default_rng(1).integers(0, V, 16)
        _torch_generate(torch, model, prompt, 8)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = _torch_generate(torch, model, prompt, gen_tokens)
        result["gen_tokens_per_s"] = n / (time.perf_counter() - t0)
    return result


def _torch_generate(torch, model, prompt: np.ndarray, n_new: int) -> int:
    """Sample n_new tokens with per-layer KV caches, one at a time, the token read back to the host
    each step (as ours yields each token); the window shifts as ours does when it fills."""
    C, T = model.wte.weight.shape[1], model.T
    H = model.h[0].n_heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        caches = [(torch.empty(1, H, T, C // H, device="cuda"), torch.empty(1, H, T, C // H, device="cuda"))
                  for _ in model.h]  # fmt: skip
        tokens = prompt.tolist()
        logits = model(torch.tensor([tokens[-T:]], device="cuda"), caches=caches, pos=0)
        pos = min(len(tokens), T)
        for _ in range(n_new):
            nxt = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen))
            tokens.append(nxt)
            if pos == T:
                pos = max(1, T // 2)
                logits = model(torch.tensor([tokens[-pos:]], device="cuda"), caches=caches, pos=0)
            else:
                logits = model(torch.tensor([[nxt]], device="cuda"), caches=caches, pos=pos)
                pos += 1
    return n_new


# ----------------------------------------------------------------------------- the table


def child(framework: str, name: str, args) -> dict | None:
    """Run one framework on one config in a fresh process; None when it failed (said on stderr)."""
    cmd = [sys.executable, __file__, "--child", framework, "--configs", name, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--gen-tokens", str(args.gen_tokens)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        print(f"{framework} {name}: failed ({lines[-1] if lines else done.returncode})", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="gpt2,S,M,L", help="comma-separated subset of gpt2,S,M,L")
    ap.add_argument("--steps", type=int, default=20, help="timed training steps per framework and config")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (kernel compilation, pools)")
    ap.add_argument("--gen-tokens", type=int, default=200, help="tokens to generate on gpt2 (0: skip)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 steps, 1 warmup, 20 tokens")
    ap.add_argument("--child", choices=("ours", "torch"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.gen_tokens = 3, 1, min(args.gen_tokens, 20)
    try:
        backend = get_backend("cuda")
    except ModelError as err:
        sys.exit(f"bench/gpu.py: nothing to measure: {err}")
    configs = all_configs()
    names = args.configs.split(",")
    unknown = [n for n in names if n not in configs]
    if unknown:
        sys.exit(f"bench/gpu.py: unknown config {unknown[0]!r}; choose from {', '.join(configs)}")
    if args.child:
        run = run_ours if args.child == "ours" else run_torch
        gen = args.gen_tokens if names[0] == "gpt2" else 0
        print(json.dumps(run(configs[names[0]], args.steps, args.warmup, gen)))
        return
    import cupy

    gpu = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    try:
        import torch

        versions = f"CuPy {cupy.__version__}, PyTorch {torch.__version__}"
    except ImportError:
        torch = None
        versions = f"CuPy {cupy.__version__} (PyTorch not installed: our figures only)"
    print(f"{gpu}; {versions}; TF32 on both sides; {args.steps} steps after {args.warmup} warmup")
    del backend
    print(f"{'config':>6}  {'ours tok/s':>11}  {'torch tok/s':>11}  {'ratio':>6}  {'ours MB':>8}  {'torch MB':>8}"
          f"  {'gen ours':>9}  {'gen torch':>9}  {'ratio':>6}")  # fmt: skip
    for name in names:
        ours = child("ours", name, args) or {}
        theirs = (child("torch", name, args) if torch is not None else None) or {}
        print(f"{name:>6}  {ours.get('tokens_per_s', 0):>11,.0f}  {theirs.get('tokens_per_s', 0):>11,.0f}"
              f"  {ratio(ours.get('tokens_per_s'), theirs.get('tokens_per_s')):>6}"
              f"  {ours.get('peak_mb', 0):>8,.0f}  {theirs.get('peak_mb', 0):>8,.0f}"
              f"  {ours.get('gen_tokens_per_s', 0):>9,.0f}  {theirs.get('gen_tokens_per_s', 0):>9,.0f}"
              f"  {ratio(ours.get('gen_tokens_per_s'), theirs.get('gen_tokens_per_s')):>6}")  # fmt: skip
    print(
        "targets (issue 11): gpt2 training >= 1.0x with peak memory <= PyTorch's; S/M/L >= 0.5x;"
        " gpt2 generation >= 1.0x"
    )


if __name__ == "__main__":
    main()
