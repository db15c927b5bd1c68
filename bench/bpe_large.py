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


def gpt2_pieces(text: str, size: int = 1 << 20):
    """`text` in pieces of about `size` characters, each cut before a space that follows printable
    ASCII (tk's first cut rule): split apart, they give the chunks of the whole text."""
    start = 0
    while start < len(text):
        cut = text.find(" ", start + size)
        while cut > 0 and not ("!" <= text[cut - 1] <= "~"):
            cut = text.find(" ", cut + 1)
        end = len(text) if cut < 0 else cut
        yield text[start:end]
        start = end


def rust_train(corpus: str, vocab: int, out: str, pattern: str) -> None:
    """Child process: rustbpe (nanochat's trainer) on `corpus` with `pattern` (GPT-2's, given by
    the parent: this process imports nothing of tk's), its ranks saved to `out`. The text goes in
    as pieces of ~1 MB cut before a space that follows printable ASCII (tk's first cut rule), so
    both trainers see exactly the chunks of the whole text."""
    import rustbpe

    with open(corpus, encoding="utf-8", errors="replace") as f:
        text = f.read()

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(gpt2_pieces(text), vocab, pattern=pattern)
    ranks = tok.get_mergeable_ranks()
    with open(out, "w", encoding="ascii") as f:
        json.dump([[list(token), rank] for token, rank in ranks], f)
    print(json.dumps({"vocab": len(ranks)}))


def ensure_corpus(path: Path, mb: float, kinds: str, roots: list[Path]) -> Path:
    if not path.exists():
        kinds_ = tuple("." + k.strip().lstrip(".") for k in kinds.split(",") if k.strip())
        info = python_corpus.build(path, int(mb * 1e6), kinds_, roots)
        print(
            f"built {path}: {info['bytes'] / 1e6:.1f} MB from {info['files']:,} files "
            f"({info['duplicates_skipped']:,} duplicates skipped)"
        )
    return path


def available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


PEERS = {  # name shown, the module it needs, the --child flag that runs it
    "hf": ("HF tokenizers byte-level BPE", "tokenizers", "--child-hf"),
    "rustbpe": ("rustbpe (nanochat's trainer)", "rustbpe", "--child-rustbpe"),
}


def compare(corpus: Path, vocab: int, repeats: int) -> None:
    """Print our row and each installed peer's, medians of `repeats` runs taking turns."""
    size_mb = corpus.stat().st_size / 1e6
    print(
        f"\ntraining on {corpus} ({size_mb:.1f} MB), vocab {vocab}, GPT-2's pattern, {os.cpu_count()} cores, "
        f"medians of {repeats} whole processes taking turns; memory: peak PSS of the process tree"
    )
    from tokenkit.bpe.patterns import GPT2_PATTERN  # here: a peer's child process imports nothing of tk's

    peers = {name: peer for name, peer in PEERS.items() if available(peer[1])}
    runs: dict[str, list[dict]] = {"ours": [], **{name: [] for name in peers}}
    with tempfile.TemporaryDirectory() as tmp:
        cmds = {
            "ours": [sys.executable, "-m", "tokenkit.cli.main", "bpe-train", str(corpus), "--vocab-size", str(vocab)]
            + ["-o", f"{tmp}/ours.safetensors", "-q"],
            **{
                name: [sys.executable, __file__, flag, str(corpus), str(vocab), f"{tmp}/{name}.out"]
                + ([GPT2_PATTERN] if name == "rustbpe" else [])
                for name, (_, _, flag) in peers.items()
            },
        }
        for _ in range(repeats):
            for name, cmd in cmds.items():
                runs[name].append(run_tree(cmd))
    summary = {
        name: {
            "seconds": statistics.median(r["seconds"] for r in rs),
            "tree_peak_mb": statistics.median(r["tree_peak_mb"] for r in rs),
            "all": [round(r["seconds"], 2) for r in rs],
            "peaks": [round(r["tree_peak_mb"]) for r in rs],
        }
        for name, rs in runs.items()
    }
    ours = summary["ours"]
    chunks = next((line for line in runs["ours"][-1]["stdout"].splitlines() if "distinct chunks" in line), "").strip()
    print(
        f"  {'ours: tk bpe-train (default workers)':<40} {ours['seconds']:7.2f} s  peak {ours['tree_peak_mb']:5.0f} MB"
        f"   runs {ours['all']} s, {ours['peaks']} MB   [{chunks}]"
    )
    for name, (shown, module, _) in PEERS.items():
        if name not in summary:
            print(f"  {shown}: not installed (pip install {module})")
            continue
        peer = summary[name]
        print(
            f"  {shown:<40} {peer['seconds']:7.2f} s  peak {peer['tree_peak_mb']:5.0f} MB"
            f"   runs {peer['all']} s, {peer['peaks']} MB"
        )
        print(
            f"    {name} / ours: time {peer['seconds'] / ours['seconds']:.2f}x, "
            f"memory {peer['tree_peak_mb'] / ours['tree_peak_mb']:.2f}x (> 1: ours is faster / lower)"
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
    parser.add_argument("--child-rustbpe", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_hf:
        hf_train(args.child_hf[0], int(args.child_hf[1]), args.child_hf[2])
        return
    if args.child_rustbpe:
        corpus_, vocab_, out_, pattern_ = args.child_rustbpe
        rust_train(corpus_, int(vocab_), out_, pattern_)
        return
    corpus = args.corpus or Path(f"/tmp/tokenkit-python-corpus-{args.mb:g}mb.txt")
    compare(ensure_corpus(corpus, args.mb, args.kinds, args.roots), args.vocab, args.repeats)


if __name__ == "__main__":
    main()
