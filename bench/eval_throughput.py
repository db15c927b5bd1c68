"""`tk eval -m`'s scoring speed next to transformers' sliding-window perplexity loop, side by side.

    flock /tmp/tokenkit-bench.lock python bench/eval_throughput.py [--configs M,gpt2] [--repeats 3] [--profile]

Two models of random weights (tk's init, seed 0), each saved as a tk model file and exported with
`tk export-hf`'s function (`pipeline.hf_export.export_hf`), so that both frameworks hold the same
weights:
- M: the M config of bench/model.py (vocab 4096, context 128, width 256, 4 layers, 8 heads), with a
  tokenizer tk trains at 4096 on wikitext-2's valid split;
- gpt2: GPT-2 124M's shapes (vocab 50257, context 1024, width 768, 12 layers, 12 heads), with
  GPT-2's own tokenizer.
The text is the start of wikitext-2's test split (the perplexity guide's), encoded once; both
frameworks score the same ids, one document, with the same windows: the context, stride half of
it. Timed: tk's API call (`pipeline.evaluate.score_documents`, what `tk eval -m` runs after
loading and encoding) and transformers' loop from its perplexity guide (GPT2LMHeadModel in
float32 under torch.no_grad, one window a forward pass, the labels before the window's new tokens
set to -100). Neither side's start-up, model loading or encoding counts. They take turns call by
call, with a short pause before each (bench/model.py: PyTorch's threads spin after a call), each
on its default threads (all cores; OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 for one thread each:
on a busy machine threads that spin-wait for a core make both many times slower); the figure is
the median of --repeats calls, tokens scored per second. Before timing, both losses must agree within 1e-5 relative (the
guide's count of scored tokens is one short for every window after the first; the loss here
divides by the tokens each window really scores, as tk does).

--profile prints cProfile's view of one tk call per config.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenkit.bpe import Tokenizer  # noqa: E402
from tokenkit.bpe.formats import from_files  # noqa: E402
from tokenkit.pipeline import checkpoint  # noqa: E402
from tokenkit.pipeline.evaluate import default_stride, score_documents  # noqa: E402
from tokenkit.pipeline.hf_export import export_hf  # noqa: E402
from tokenkit.pipeline.run import load_model_and_tokenizer  # noqa: E402
from tokenkit.transformer import GPT, GPTConfig  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CONFIGS = {  # name: (vocab, context, d_model, layers, heads, bytes of wikitext-2's test split scored)
    "M": (4096, 128, 256, 4, 8, 30_000),
    "gpt2": (50257, 1024, 768, 12, 12, 9_000),
}
PAUSE_S = 0.02
LOSS_RTOL = 1e-5


def tokenizer_for(name: str) -> Tokenizer:
    if name == "gpt2":
        return from_files(Tokenizer, [DATA / "gpt2" / "encoder.json", DATA / "gpt2" / "vocab.bpe"])
    train = (DATA / "wikitext2" / "valid.txt").read_bytes()
    return Tokenizer.train([train], vocab_size=CONFIGS[name][0], special_tokens=["<|endoftext|>"], quiet=True)


def build(name: str, root: Path):
    """(tk model, transformers model, ids, UTF-8 bytes of their text) for config `name`."""
    from transformers import AutoModelForCausalLM

    V, T, C, n_layers, n_heads, n_bytes = CONFIGS[name]
    tok = tokenizer_for(name)
    config = GPTConfig(vocab_size=V, context_length=T, d_model=C, n_layers=n_layers, n_heads=n_heads)
    path = root / f"{name}.safetensors"
    params = GPT(config, seed=0).params
    checkpoint.save_model(
        path, params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
    )
    export_hf(path, root / f"{name}_hf")
    model, tok = load_model_and_tokenizer(path)  # as `tk eval -m` loads it
    hf = AutoModelForCausalLM.from_pretrained(root / f"{name}_hf", dtype="float32").eval()
    text = (DATA / "wikitext2" / "test.txt").read_bytes()[:n_bytes]
    ids = np.asarray(tok.encode_for_model(text.decode("utf-8")), dtype=np.int64)
    return model, hf, ids, len(text)


def tk_score(model, ids: np.ndarray, n_bytes: int, stride: int) -> tuple[float, int]:
    """(summed nats, tokens scored): `tk eval -m`'s scoring of one document."""
    score = score_documents(model, [(ids, n_bytes)], stride=stride)
    return score.nats, score.tokens


def hf_score(hf, ids: np.ndarray, context: int, stride: int) -> tuple[float, int]:
    """(summed nats, tokens scored): transformers' perplexity guide's loop, one window a pass."""
    import torch

    encodings = torch.from_numpy(ids)[None, :]
    seq_len = encodings.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + context, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = encodings[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            outputs = hf(input_ids, labels=target_ids)
        scored = int((target_ids[:, 1:] != -100).sum())  # the labels the shifted loss counts
        nll_sum += float(outputs.loss) * scored
        n_tokens += scored
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return nll_sum, n_tokens


def blas_threads() -> int | str:
    """The threads NumPy's OpenBLAS runs with ("?" where another BLAS)."""
    from tokenkit.transformer.runtime import _openblas_threads_api

    api = _openblas_threads_api()
    return "?" if api is None else api[1]()


def timed(fn, *args) -> tuple[float, tuple]:
    time.sleep(PAUSE_S)
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def run(name: str, repeats: int, profile: bool, root: Path) -> dict:
    import torch

    model, hf, ids, n_bytes = build(name, root)
    context = model.config.context_length
    stride = default_stride(context)
    (ours, ours_n), (theirs, theirs_n) = tk_score(model, ids, n_bytes, stride), hf_score(hf, ids, context, stride)
    if ours_n != theirs_n or abs(ours - theirs) > LOSS_RTOL * abs(theirs):
        raise SystemExit(f"{name}: the losses differ: tk {ours / ours_n!r} over {ours_n}, transformers "
                         f"{theirs / theirs_n!r} over {theirs_n}")  # fmt: skip
    tk_s, hf_s = [], []
    for _ in range(repeats):  # turns, call by call
        tk_s.append(timed(tk_score, model, ids, n_bytes, stride)[0])
        hf_s.append(timed(hf_score, hf, ids, context, stride)[0])
    if profile:
        prof = cProfile.Profile()
        prof.runcall(tk_score, model, ids, n_bytes, stride)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        print(f"\n--- cProfile of one tk call on {name} (by own time) ---")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:4000])
    return {
        "name": name,
        "tokens": ours_n,
        "tk": ours_n / statistics.median(tk_s),
        "hf": ours_n / statistics.median(hf_s),
        "loss_tk": ours / ours_n,
        "loss_hf": theirs / theirs_n,
        "threads": torch.get_num_threads(),
        "context": context,
        "stride": stride,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="M,gpt2", help="comma-separated: M, gpt2")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per framework and config (median)")
    ap.add_argument("--profile", action="store_true", help="print cProfile of one tk call per config")
    args = ap.parse_args()
    names = args.configs.split(",")
    for n in names:
        if n not in CONFIGS:
            ap.error(f"unknown config {n!r}; choose from {', '.join(CONFIGS)}")
    try:
        import torch
        import transformers
    except ImportError:
        raise SystemExit("needs torch and transformers: pip install torch transformers") from None
    print(f"load average before: {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} cores; "
          f"NumPy {np.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(n, args.repeats, args.profile, Path(tmp)) for n in names]
    head = f"{'cfg':<5} {'window':>6} {'stride':>6} {'tokens':>7} {'tk tok/s':>9} {'hf tok/s':>9} {'tk/hf':>6}"
    print(f"\n{head}  loss tk / hf")
    for r in rows:
        ratio = r["tk"] / r["hf"]
        print(f"{r['name']:<5} {r['context']:>6} {r['stride']:>6} {r['tokens']:>7,} {r['tk']:>9,.0f} {r['hf']:>9,.0f} "
              f"{ratio:>5.2f}x  {r['loss_tk']:.6f} / {r['loss_hf']:.6f}")  # fmt: skip
    worst = max(abs(r["loss_tk"] / r["loss_hf"] - 1) for r in rows)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}; threads: OpenBLAS {blas_threads()}, torch "
          f"{rows[0]['threads']}; relative loss difference at most {worst:.1e}")  # fmt: skip
    assert all(math.isfinite(r["tk"]) for r in rows)


if __name__ == "__main__":
    main()
