"""Training on a large corpus of distinct text: `tk bpe-train` next to HF tokenizers, time and memory.

    flock /tmp/tokenkit-bench.lock python bench/bpe_large.py [--mb 200] [--vocab 32000] [--repeats 1]

The corpus is built by bench/python_corpus.py from this machine's Python installation (~200 MB
of distinct Python source by default; --kinds/--roots as there for more) into /tmp, unless it
is there already. Both trainers run as whole processes, taking turns: ours is the command line
a user runs (`tk bpe-train CORPUS --vocab-size V -o FILE -q`, default workers: all cores; its
time includes the bytes-per-token line it prints), HF's is a child process training byte-level
BPE on the file (its default threads: all cores) and saving it. Time is wall time of the
process; memory is the peak over the run of the summed proportional set size (PSS: shared pages
split between the processes sharing them) of the process and all its descendants, sampled every
20 ms, and each process's ru_maxrss. bench/bpe.py runs this with --large-mb.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import python_corpus  # noqa: E402


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_mb(pid: int) -> float:
    """Summed PSS of `pid` and all its descendants, in MB."""
    todo, total = [pid], 0
    while todo:
        p = todo.pop()
        total += _pss_kb(p)
        todo += _children(p)
    return total / 1024


def run_tree(cmd: list[str], env: dict | None = None) -> dict:
    """Run `cmd`; its wall time, the peak PSS of its process tree and its ru_maxrss (MB)."""
    peak = 0.0
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_pss_mb(proc.pid))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    out, err = proc.stdout.read().decode(errors="replace"), proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed: {(err.strip().splitlines() or ['?'])[-1]}")
    return {"seconds": seconds, "tree_peak_mb": peak, "maxrss_mb": usage.ru_maxrss / 1024, "stdout": out}


def hf_train(corpus: str, vocab: int, out: str) -> None:
    """Child process: HF tokenizers byte-level BPE on `corpus`, saved to `out`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train([corpus], trainer)
    tok.save(out)
    print(json.dumps({"vocab": tok.get_vocab_size()}))


def ensure_corpus(path: Path, mb: float, kinds: str, roots: list[Path]) -> Path:
    if not path.exists():
        kinds_ = tuple("." + k.strip().lstrip(".") for k in kinds.split(",") if k.strip())
        info = python_corpus.build(path, int(mb * 1e6), kinds_, roots)
        print(
            f"built {path}: {info['bytes'] / 1e6:.1f} MB from {info['files']:,} files "
            f"({info['duplicates_skipped']:,} duplicates skipped)"
        )
    return path


def hf_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tokenizers") is not None


def compare(corpus: Path, vocab: int, repeats: int) -> None:
    """Print our row and HF's, medians of `repeats` runs taking turns."""
    size_mb = corpus.stat().st_size / 1e6
    print(
        f"\ntraining on {corpus} ({size_mb:.0f} MB of distinct text), vocab {vocab}, "
        f"{os.cpu_count()} cores, medians of {repeats} (taking turns); memory: peak PSS of the process tree"
    )
    runs: dict[str, list[dict]] = {"ours": [], "hf": []}
    with tempfile.TemporaryDirectory() as tmp:
        ours_cmd = [
            sys.executable,
            "-m",
            "tokenkit.cli.main",
            "bpe-train",
            str(corpus),
            "--vocab-size",
            str(vocab),
            "-o",
            f"{tmp}/ours.safetensors",
            "-q",
        ]
        hf_cmd = [sys.executable, __file__, "--child-hf", str(corpus), str(vocab), f"{tmp}/hf.json"]
        for _ in range(repeats):
            runs["ours"].append(run_tree(ours_cmd))
            if hf_available():
                runs["hf"].append(run_tree(hf_cmd))
    summary = {}
    for name, rs in runs.items():
        if rs:
            summary[name] = {
                "seconds": statistics.median(r["seconds"] for r in rs),
                "tree_peak_mb": statistics.median(r["tree_peak_mb"] for r in rs),
                "maxrss_mb": max(r["maxrss_mb"] for r in rs),
                "all": [round(r["seconds"], 1) for r in rs],
                "peaks": [round(r["tree_peak_mb"]) for r in rs],
            }
    ours = summary["ours"]
    chunks = next((line for line in runs["ours"][-1]["stdout"].splitlines() if "distinct chunks" in line), "").strip()
    print(
        f"  {'ours: tk bpe-train (default workers)':<40} {ours['seconds']:7.1f} s  peak {ours['tree_peak_mb']:5.0f} MB"
        f"   runs {ours['all']} s, {ours['peaks']} MB   [{chunks}]"
    )
    if "hf" not in summary:
        print("  HF tokenizers: not installed (pip install tokenizers)")
        return
    hf = summary["hf"]
    print(
        f"  {'HF tokenizers byte-level BPE':<40} {hf['seconds']:7.1f} s  peak {hf['tree_peak_mb']:5.0f} MB"
        f"   runs {hf['all']} s, {hf['peaks']} MB"
    )
    print(
        f"  HF / ours: time {hf['seconds'] / ours['seconds']:.2f}x, "
        f"memory {hf['tree_peak_mb'] / ours['tree_peak_mb']:.2f}x (> 1: ours is lower)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--corpus", type=Path, help="default: /tmp/tokenkit-python-corpus-<MB>mb.txt, built if missing")
    parser.add_argument("--kinds", default="py")
    parser.add_argument("--roots", nargs="*", type=Path, default=[])
    parser.add_argument("--child-hf", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_hf:
        hf_train(args.child_hf[0], int(args.child_hf[1]), args.child_hf[2])
        return
    corpus = args.corpus or Path(f"/tmp/tokenkit-python-corpus-{args.mb:g}mb.txt")
    compare(ensure_corpus(corpus, args.mb, args.kinds, args.roots), args.vocab, args.repeats)


if __name__ == "__main__":
    main()
