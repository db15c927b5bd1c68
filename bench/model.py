"""Training and generation speed of our NumPy GPT next to PyTorch CPU eager, side by side.

    flock /tmp/tokenkit-bench.lock python bench/model.py [--arch gpt2|llama] [--configs S,M,L] [--steps 10] [--quick]

For each config it times the whole training step (forward + backward + AdamW) of both
frameworks on the same random batches, float32, medians over --steps after --warmup steps,
and the forward, backward and optimizer parts on their own; on M it times generation of 200
tokens from a 16-token prompt (ours with and without the KV cache, PyTorch with its own); and
it measures each framework's peak training memory in a fresh child process per config (the
child's ru_maxrss, read with os.wait4, plus the private memory of our worker processes), so
that neither pollutes the other's figure.

The PyTorch model is nanoGPT's, written out below with GPT-2's tanh GELU so that both compute
the same function: pre-norm blocks, fused qkv, scaled_dot_product_attention, tied unembedding,
torch.optim.AdamW with nanoGPT's decay groups. PyTorch is optional: without it only our figures
are printed.

With --arch llama both sides are Llama-family decoders of the same shapes (`llama_config`:
RoPE, RMSNorm, SwiGLU with its default width, grouped-query attention with half as many K/V
heads as query heads, no biases, an untied lm_head). The PyTorch twin is written below as HF's
modeling_llama computes it (rotate_half RoPE, RMSNorm, SwiGLU, scaled_dot_product_attention with
enable_gqa, PyTorch's fastest GQA path on CPU: no repeated K/V), its weights copied from ours, and
the logits of both are checked to agree before anything is timed.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.transformer import GPT, AdamW, GPTConfig  # noqa: E402
from tokenkit.transformer.config import llama_config  # noqa: E402
from tokenkit.transformer.model import init_params  # noqa: E402
from tokenkit.transformer.parallel import DataParallel  # noqa: E402

CONFIGS = {  # name: (vocab, context, d_model, layers, heads, batch)
    "S": (256, 64, 128, 4, 4, 12),
    "M": (4096, 128, 256, 4, 8, 16),
    "L": (8192, 256, 384, 6, 6, 8),
}
LR = 3e-4
N_CORES = len(os.sched_getaffinity(0))
# Idle time before each timed call. PyTorch's OpenMP threads spin for a while after their last
# parallel region (measured: ~6 ms of CPU right after an S step); without a pause they spin on
# the core the other framework's next step needs. 20 ms lets them go to sleep first.
PAUSE_S = 0.02


ARCHS = ("gpt2", "llama")
LOGIT_TOL = 1e-4  # max |ours - torch| of the logits, checked once per config before timing


def gpt_config(name: str, arch: str = "gpt2") -> GPTConfig:
    """The config `name`'s shape as GPT-2 (learned positions, LayerNorm, GELU, tied) or as a
    Llama-family decoder with n_heads / 2 K/V heads."""
    V, T, C, n_layers, n_heads, _ = CONFIGS[name]
    shape = dict(vocab_size=V, context_length=T, d_model=C, n_layers=n_layers, n_heads=n_heads)
    if arch == "llama":
        return llama_config(**shape, n_kv_heads=max(1, n_heads // 2))
    return GPTConfig(**shape)


def batches(name: str, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """n random (ids, targets) pairs, each (B, T) int64: the same data for both frameworks."""
    V, T, _, _, _, B = CONFIGS[name]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        seq = rng.integers(0, V, size=(B, T + 1))
        out.append((seq[:, :-1].copy(), seq[:, 1:].copy()))
    return out


def median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


# ----------------------------------------------------------------------------- ours


class Ours:
    """Our GPT (batches split over one process per core) + AdamW behind the small interface the bench drives."""

    def __init__(self, name: str, arch: str = "gpt2"):
        self.model = DataParallel(GPT(gpt_config(name, arch), seed=0))
        self.opt = AdamW(self.model.params, lr=LR)

    def train_step(self, ids, targets) -> dict[str, float]:
        t0 = time.perf_counter()
        loss, grads = self.model.loss_and_grads(ids, targets)
        t1 = time.perf_counter()
        self.opt.step(grads)
        t2 = time.perf_counter()
        if not math.isfinite(loss):
            raise RuntimeError(f"our loss is {loss}")
        return {"step": t2 - t0, "fwd+bwd": t1 - t0, "opt": t2 - t1}

    def forward(self, ids, targets) -> float:
        t0 = time.perf_counter()
        self.model.loss(ids, targets)
        return time.perf_counter() - t0

    def generate(self, prompt: np.ndarray, n_new: int, use_cache: bool) -> float:
        t0 = time.perf_counter()
        out = list(self.model.generate(prompt, n_new, top_k=None, seed=0, use_cache=use_cache))
        elapsed = time.perf_counter() - t0
        assert len(out) == n_new, len(out)
        return elapsed


# ----------------------------------------------------------------------------- PyTorch (nanoGPT)


def torch_classes():
    """nanoGPT's model with tanh GELU and a KV cache for generation; defined lazily so that the
    bench runs without torch."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, C, n_heads):
            super().__init__()
            self.n_heads = n_heads
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def attn(self, x, cache=None, pos=0):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
            if cache is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # cache: (k_all, v_all), each (1, H, T_max, hd)
                cache[0][:, :, pos : pos + T] = k
                cache[1][:, :, pos : pos + T] = v
                k, v = cache[0][:, :, : pos + T], cache[1][:, :, : pos + T]
                y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
            return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x, cache=None, pos=0):
            x = x + self.attn(self.ln_1(x), cache, pos)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class TorchGPT(nn.Module):
        def __init__(self, V, T, C, n_layers, n_heads):
            super().__init__()
            self.T = T
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block(C, n_heads) for _ in range(n_layers))
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():  # nanoGPT's init; LayerNorms keep ones and zeros
                if "ln_" in name:
                    continue
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
                else:
                    std = 0.02 / math.sqrt(2 * n_layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets=None, caches=None, pos=0):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(pos, pos + T, device=idx.device))
            for i, block in enumerate(self.h):
                x = block(x, None if caches is None else caches[i], pos)
            x = self.ln_f(x)
            if targets is None:
                return x[:, -1] @ self.wte.weight.T  # (B, V) logits of the last position
            logits = x @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    class LlamaBlock(nn.Module):
        """HF modeling_llama's decoder layer in nanoGPT's shape: q, k, v fused as our c_attn
        holds them (H, then Hkv, then Hkv heads), gate and up fused as our c_fc."""

        def __init__(self, C, n_heads, n_kv_heads, hidden, eps):
            super().__init__()
            self.n_heads, self.n_kv_heads, self.hd = n_heads, n_kv_heads, C // n_heads
            self.ln_1 = nn.RMSNorm(C, eps=eps)
            self.c_attn = nn.Linear(C, (n_heads + 2 * n_kv_heads) * self.hd, bias=False)
            self.attn_proj = nn.Linear(C, C, bias=False)
            self.ln_2 = nn.RMSNorm(C, eps=eps)
            self.c_fc = nn.Linear(C, 2 * hidden, bias=False)
            self.mlp_proj = nn.Linear(hidden, C, bias=False)

        def attn(self, x, cos, sin, cache=None, pos=0):
            B, T, C = x.shape
            H, Hkv, hd = self.n_heads, self.n_kv_heads, self.hd
            q, k, v = self.c_attn(x).split([H * hd, Hkv * hd, Hkv * hd], dim=2)
            q = q.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
            k, v = (t.view(B, T, Hkv, hd).transpose(1, 2) for t in (k, v))  # (B, Hkv, T, hd)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            if cache is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:  # cache: (k_all, v_all), each (1, Hkv, T_max, hd)
                cache[0][:, :, pos : pos + T] = k
                cache[1][:, :, pos : pos + T] = v
                k, v = cache[0][:, :, : pos + T], cache[1][:, :, : pos + T]
                y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True)
            return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x, cos, sin, cache=None, pos=0):
            x = x + self.attn(self.ln_1(x), cos, sin, cache, pos)
            gate, up = self.c_fc(self.ln_2(x)).chunk(2, dim=-1)
            return x + self.mlp_proj(F.silu(gate) * up)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class TorchLlama(nn.Module):
        """A Llama-family decoder with our config's choices; `load(params)` copies our weights
        ((in, out) matrices transposed into nn.Linear's (out, in))."""

        def __init__(self, cfg):
            super().__init__()
            self.T = cfg.context_length
            self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
            block = (cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.hidden, cfg.norm_eps)
            self.h = nn.ModuleList(LlamaBlock(*block) for _ in range(cfg.n_layers))
            self.ln_f = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            # HF's cos and sin: (T, hd) with both halves alike, angles in float64 as ours
            hd = cfg.head_dim
            inv_freq = cfg.rope_theta ** -(torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            angle = torch.arange(cfg.context_length, dtype=torch.float64)[:, None] * inv_freq
            angle = torch.cat((angle, angle), dim=-1)
            self.register_buffer("cos", angle.cos().float(), persistent=False)
            self.register_buffer("sin", angle.sin().float(), persistent=False)

        @torch.no_grad()
        def load(self, params):
            ours = {"wte.weight": "wte.weight", "ln_f.weight": "ln_f.weight", "lm_head.weight": "lm_head.weight"}
            for i in range(len(self.h)):
                for mine, theirs in (("ln_1", "ln_1"), ("attn.c_attn", "c_attn"), ("attn.c_proj", "attn_proj"),
                                     ("ln_2", "ln_2"), ("mlp.c_fc", "c_fc"), ("mlp.c_proj", "mlp_proj")):  # fmt: skip
                    ours[f"h.{i}.{mine}.weight"] = f"h.{i}.{theirs}.weight"
            state = self.state_dict()
            assert set(ours) == set(params) and set(ours.values()) == set(state), (sorted(params), sorted(state))
            for mine, theirs in ours.items():
                w = torch.from_numpy(np.asarray(params[mine], dtype=np.float32))
                state[theirs].copy_(w.T if mine.startswith("h.") and w.dim() == 2 else w)

        def forward(self, idx, targets=None, caches=None, pos=0, all_logits=False):
            T = idx.shape[1]
            cos, sin = self.cos[pos : pos + T], self.sin[pos : pos + T]
            x = self.wte(idx)
            for i, block in enumerate(self.h):
                x = block(x, cos, sin, None if caches is None else caches[i], pos)
            x = self.ln_f(x)
            if all_logits:
                return self.lm_head(x)
            if targets is None:
                return self.lm_head(x[:, -1])  # (B, V) logits of the last position
            logits = self.lm_head(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return torch, TorchGPT, TorchLlama


class Torch:
    """PyTorch eager CPU, float32, one thread per core, with nanoGPT's AdamW groups."""

    def __init__(self, name: str, arch: str = "gpt2"):
        torch, TorchGPT, TorchLlama = torch_classes()
        torch.set_num_threads(N_CORES)
        torch.manual_seed(0)
        self.torch = torch
        V, T, C, n_layers, n_heads, _ = CONFIGS[name]
        if arch == "llama":  # our initial weights, so that both compute the same function
            self.model = TorchLlama(gpt_config(name, arch))
            self.model.load(init_params(gpt_config(name, arch), seed=0))
        else:
            self.model = TorchGPT(V, T, C, n_layers, n_heads)
        params = list(self.model.parameters())
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        self.opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8)

    def train_step(self, ids, targets) -> dict[str, float]:
        x, y = self.torch.from_numpy(ids), self.torch.from_numpy(targets)
        t0 = time.perf_counter()
        loss = self.model(x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        return {"step": t3 - t0, "fwd+bwd": t2 - t0, "opt": t3 - t2}

    def forward(self, ids, targets) -> float:
        x, y = self.torch.from_numpy(ids), self.torch.from_numpy(targets)
        t0 = time.perf_counter()
        with self.torch.no_grad():
            self.model(x, y)
        return time.perf_counter() - t0

    def generate(self, prompt: np.ndarray, n_new: int) -> float:
        """Sample n_new tokens with a per-layer KV cache, with our GPT.generate's policy: when the
        window of T tokens is full it shifts to the last T // 2 tokens and, positions being
        learned (or rotary from 0), the cache is refilled from those (the same tokens as without
        a cache)."""
        torch = self.torch
        m = self.model
        C, T = m.wte.weight.shape[1], m.T
        H = m.h[0].n_heads
        H_kv = getattr(m.h[0], "n_kv_heads", H)  # the Llama twin caches its K/V heads only
        gen = torch.Generator().manual_seed(0)
        t0 = time.perf_counter()
        with torch.no_grad():
            caches = [(torch.empty(1, H_kv, T, C // H), torch.empty(1, H_kv, T, C // H)) for _ in m.h]
            tokens = prompt.tolist()
            seq = torch.tensor([tokens[-T:]])
            logits, pos = m(seq, caches=caches, pos=0), seq.shape[1]
            for _ in range(n_new):
                nxt = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen))
                tokens.append(nxt)
                if pos == T:  # context shift
                    pos = max(1, T // 2)
                    logits = m(torch.tensor([tokens[-pos:]]), caches=caches, pos=0)
                else:
                    logits = m(torch.tensor([[nxt]]), caches=caches, pos=pos)
                    pos += 1
        return time.perf_counter() - t0


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- measurements


def time_training(runners: list, data, warmup: int) -> list[dict[str, float]]:
    """Median ms of each part of the training step over data[warmup:], plus forward-only ms,
    per runner. The runners take turns step by step, so that a burst of load from elsewhere
    hits both rather than whichever block happened to be running, with PAUSE_S of idle time
    before each call."""
    parts: list[dict[str, list[float]]] = [{} for _ in runners]
    for i, (ids, targets) in enumerate(data):
        for runner, acc in zip(runners, parts, strict=True):
            time.sleep(PAUSE_S)
            timing = runner.train_step(ids, targets)
            if i >= warmup:
                for key, value in timing.items():
                    acc.setdefault(key, []).append(value)
    for ids, targets in data[warmup:]:
        for runner, acc in zip(runners, parts, strict=True):
            time.sleep(PAUSE_S)
            acc.setdefault("fwd_only", []).append(runner.forward(ids, targets))
    return [{key: median_ms(values) for key, values in acc.items()} for acc in parts]


# Runs in a tiny Python of its own: a child's ru_maxrss starts from the RSS of the process that
# forked it (Linux carries the old mm's high-water mark across exec), so the bench itself, with
# both models loaded, must not be the parent. The child prints the private memory of its own
# worker processes, if any, which the launcher passes on.
_LAUNCHER = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
workers_kib = proc.stdout.read().strip() or "0"
_, status, usage = os.wait4(proc.pid, 0)
print(status, usage.ru_maxrss, workers_kib)
"""


def peak_rss_mb(framework: str, name: str, steps: int, arch: str = "gpt2") -> float:
    """Peak memory (MB) of training `framework`'s model for config `name` `steps` steps in a
    fresh process: that process's ru_maxrss (from os.wait4 in a small launcher) plus the private
    memory (USS) of the worker processes it forked, if any. Their memory shared with it (the
    interpreter, NumPy, the shared parameters) is counted once, in its RSS."""
    cmd = [sys.executable, __file__, "--child", framework, "--configs", name, "--steps", str(steps), "--arch", arch]
    out = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], capture_output=True, text=True, check=True)
    status, maxrss_kib, workers_kib = (int(v) for v in out.stdout.split())
    if status != 0:
        raise RuntimeError(f"memory child {framework} {name} failed with wait status {status}")
    return (maxrss_kib + workers_kib) / 1024  # Linux reports KiB


def children_private_kib() -> int:
    """Private memory (USS: Private_Clean + Private_Dirty, KiB) of this process's children, read
    at the end of training. It is their peak too: freed memory stays with the allocator (the
    model's mallopt settings, inherited at fork) rather than going back to the OS."""
    me, total = os.getpid(), 0
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) != me:
                continue  # stat: pid (comm) state ppid ...
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):  # a process that ended meanwhile
            continue
    return total


def child_main(framework: str, name: str, steps: int, arch: str) -> None:
    runner = Ours(name, arch) if framework == "ours" else Torch(name, arch)
    for ids, targets in batches(name, steps):
        runner.train_step(ids, targets)
    print(children_private_kib())


def same_function(ours: Ours, theirs: Torch, ids: np.ndarray) -> list:
    """[ours, theirs] after checking, for the Llama twin (whose weights are ours), that both give
    the same logits for `ids` within LOGIT_TOL; a twin that computes something else stops the
    bench. (The GPT-2 twin draws its own weights, as nanoGPT does: nothing to compare.)"""
    if hasattr(theirs.model, "load"):
        torch = theirs.torch
        mine = ours.model.forward(ids)
        with torch.no_grad():
            other = theirs.model(torch.from_numpy(ids), all_logits=True).numpy()
        diff = float(np.abs(mine - other).max())
        if not diff <= LOGIT_TOL:
            raise SystemExit(f"the PyTorch twin's logits differ from ours by {diff:.3g} (> {LOGIT_TOL}): another model")
        print(f"  logits agree: max |ours - torch| = {diff:.2g}", flush=True)
    return [ours, theirs]


def fmt_ratio(ours: float, theirs: float | None, higher_is_better: bool = True) -> str:
    if theirs is None:
        return "-"
    return f"{(ours / theirs if higher_is_better else theirs / ours):.2f}x"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=ARCHS, default="gpt2", help="GPT-2's pieces or Llama's (see the docstring)")
    ap.add_argument("--configs", default="S,M,L", help="comma-separated subset of S,M,L")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per framework and config")
    ap.add_argument("--warmup", type=int, default=2, help="untimed training steps first")
    ap.add_argument("--gen-tokens", type=int, default=200, help="tokens to generate on M")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 steps, 1 warmup, 40 tokens, 2-step memory")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    ap.add_argument("--no-generate", action="store_true", help="skip the generation timing")
    ap.add_argument("--child", choices=("ours", "torch"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    for n in names:
        if n not in CONFIGS:
            ap.error(f"unknown config {n!r}; choose from {', '.join(CONFIGS)}")
    if args.child:
        child_main(args.child, names[0], args.steps, args.arch)
        return
    if args.quick:
        args.steps, args.warmup, args.gen_tokens = 3, 1, 40
    have_torch = torch_available()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {N_CORES} cores (figures are only comparable when low)")
    llama = " (RoPE, RMSNorm, SwiGLU, n_heads / 2 K/V heads, untied lm_head)" if args.arch == "llama" else ""
    print(f"architecture: {args.arch}{llama}")
    if have_torch:
        import torch

        print(
            f"PyTorch {torch.__version__}, {N_CORES} threads; NumPy {np.__version__}; "
            f"{args.steps} timed steps after {args.warmup} warmup; medians"
        )
    else:
        print(f"PyTorch not installed: our figures only. NumPy {np.__version__}; {args.steps} timed steps")

    rows = []
    for name in names:
        V, T, C, n_layers, n_heads, B = CONFIGS[name]
        data = batches(name, args.warmup + args.steps)
        ours, theirs = (
            time_training(same_function(Ours(name, args.arch), Torch(name, args.arch), data[0][0]), data, args.warmup)
            if have_torch
            else (time_training([Ours(name, args.arch)], data, args.warmup)[0], None)
        )
        rows.append((name, B * T, ours, theirs))
        print(
            f"  {name} done: ours {ours['step']:.1f} ms/step"
            + (f", torch {theirs['step']:.1f} ms/step" if theirs else ""),
            flush=True,
        )

    print()
    print("Training step (forward + backward + AdamW), float32, ms are medians")
    head = (
        f"{'cfg':<4}{'tokens/s ours':>14}{'torch':>9}{'ratio':>7} | {'step ms':>8}{'torch':>7} | "
        f"{'fwd ms':>7}{'torch':>7} | {'fwd+bwd':>8}{'torch':>7} | {'adamw ms':>8}{'torch':>7}"
    )
    print(head)
    print("-" * len(head))
    for name, tokens, ours, theirs in rows:
        t = theirs or {}

        def cell(v, w):
            return f"{v:>{w}.1f}" if v is not None else f"{'-':>{w}}"

        tps = tokens / ours["step"] * 1e3
        ttps = tokens / t["step"] * 1e3 if t else None
        print(
            f"{name:<4}{tps:>14.0f}{cell(ttps, 9)}{fmt_ratio(tps, ttps):>7} | {ours['step']:>8.1f}"
            f"{cell(t.get('step'), 7)} | {ours['fwd_only']:>7.1f}{cell(t.get('fwd_only'), 7)} | "
            f"{ours['fwd+bwd']:>8.1f}{cell(t.get('fwd+bwd'), 7)} | {ours['opt']:>8.1f}{cell(t.get('opt'), 7)}"
        )
    print(
        "(fwd: loss without gradients (torch: no_grad); fwd+bwd: loss_and_grads / forward + backward(); "
        "ratio: ours / torch tokens/s)"
    )

    if not args.no_generate:
        V, T, *_ = CONFIGS["M"]
        prompt = np.random.default_rng(1).integers(0, V, size=16)
        ours = Ours("M", args.arch)
        runner = Torch("M", args.arch) if have_torch else None
        ours.generate(prompt, 8, use_cache=True)  # warm up
        if runner:
            runner.generate(prompt, 8)
        print()
        print(f"Generation on M (context {T}), one sequence from a 16-token prompt, tokens/s (cached runs: best of 3)")
        print(
            f"{'new tokens':<34}{'ours+cache':>11}{'ours no cache':>14}{'speed-up':>9}"
            f"{'PyTorch+cache':>14}{'ours/PyTorch':>13}"
        )
        # The second length stays inside the context; past it, all three shift the window to its
        # last half whenever it fills (GPT.generate's policy) and refill it.
        for n in dict.fromkeys((args.gen_tokens, min(args.gen_tokens, T - 16))):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "context longer than context_length": expected here
                cached = n / min(ours.generate(prompt, n, use_cache=True) for _ in range(3))
                uncached = n / ours.generate(prompt, n, use_cache=False)
            theirs = n / min(runner.generate(prompt, n) for _ in range(3)) if runner else None
            label = f"{n}" + (f" (shifts past {T} after {T - 16})" if n > T - 16 else " (within the context)")
            print(
                f"{label:<34}{cached:>11.0f}{uncached:>14.0f}{cached / uncached:>8.1f}x"
                + (f"{theirs:>14.0f}{cached / theirs:>12.2f}x" if theirs else f"{'-':>14}")
            )

    if not args.no_memory:
        steps = 2 if args.quick else 3
        print()
        print(f"Peak memory of training ({steps} steps, fresh process each: ru_maxrss + our workers' private memory)")
        print(f"{'cfg':<4}{'ours MB':>9}{'torch MB':>10}{'ours / torch':>14}")
        for name in names:
            mine = peak_rss_mb("ours", name, steps, args.arch)
            theirs = peak_rss_mb("torch", name, steps, args.arch) if have_torch else None
            print(f"{name:<4}{mine:>9.0f}" + (f"{theirs:>10.0f}{mine / theirs:>13.2f}x" if theirs else f"{'-':>10}"))
        print("(includes each interpreter and its imports: PyTorch's own import is a few hundred MB)")

    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
