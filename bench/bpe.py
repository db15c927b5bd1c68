"""Tokenizer speed next to the peers, side by side in one run.

    flock /tmp/tokenkit-bench.lock python bench/bpe.py [--repeats 3] [--vocab 8192,32000] [--big-gb 0]

Training, on ../shared/data/gutenberg/train.txt at each --vocab size:
  ours (2 worker processes; the whole `Tokenizer.train` call, counting included), Hugging Face
  tokenizers' byte-level BPE (1 and 2 threads), SentencePiece BPE (characters with byte fallback;
  2 threads), and a minbpe-like naive trainer (recount every pair per merge) on a 100 KB slice
  next to ours on the same slice.
Encoding the same file with GPT-2's vocabulary (ours imported from ../shared/data/gpt2):
  ours `encode_file` as `tk encode -f FILE -o ids.npy` runs it (default workers: all cores;
  and 1 worker), cold cache, file read and .npy written included, taking turns with tiktoken
  (one thread, text already in memory), whose time over ours is printed; HF tokenizers (one
  `encode` of the whole text). Our ids are checked against tiktoken's and HF's.
Peak memory: every measurement runs in a fresh child process; its ru_maxrss (os.wait4) and the
largest of its own worker processes are reported. --big-gb N also trains on an N GB file made of
copies of the corpus, to show memory following the number of distinct chunks, not the file size.
--large-mb 200 (the default; 0 skips it) trains `tk bpe-train` and HF tokenizers at vocab 32000
on 200 MB of distinct Python source from this machine's installation (bench/bpe_large.py: time
and peak memory of each process tree, taking turns).

Peers are optional (`pip install -e '.[bench]'`): a missing one is reported and skipped.
Figures are medians of --repeats runs; ratios are peer time / our time (> 1: we are faster).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"
CORPUS = DATA / "gutenberg" / "train.txt"
GPT2 = DATA / "gpt2"
GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SLICE_BYTES = 100_000
NAIVE_VOCAB = 384

sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------- child processes


def _children_maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def child_train_ours(corpus: str, vocab: int, workers: int) -> dict:
    from tokenkit.bpe import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer.train([corpus], vocab_size=vocab, workers=workers, quiet=True)
    return {"seconds": time.perf_counter() - t0, "merges": len(tok.merges), "stop": tok.train_report.stop_reason}


def child_train_hf(corpus: str, vocab: int) -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    t0 = time.perf_counter()
    tok.train([corpus], trainer)
    return {"seconds": time.perf_counter() - t0, "vocab": tok.get_vocab_size()}


def child_train_spm(corpus: str, vocab: int, threads: int) -> dict:
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        spm.SentencePieceTrainer.train(
            input=corpus,
            model_prefix=f"{tmp}/m",
            vocab_size=vocab,
            model_type="bpe",
            byte_fallback=True,
            num_threads=threads,
            minloglevel=2,
        )
        return {"seconds": time.perf_counter() - t0}


def child_train_naive(corpus: str, vocab: int) -> dict:
    """minbpe's RegexTokenizer loop: recount every pair of every chunk for each merge."""
    import regex

    text = Path(corpus).read_bytes()[:SLICE_BYTES].decode("utf-8", "ignore")
    t0 = time.perf_counter()
    chunks = [list(c.encode("utf-8")) for c in regex.findall(GPT2_SPLIT, text)]
    merges = []
    for r in range(vocab - 256):
        stats: dict = {}
        for ids in chunks:
            for pair in zip(ids, ids[1:], strict=False):  # consecutive pairs, as minbpe counts them
                stats[pair] = stats.get(pair, 0) + 1
        if not stats:
            break
        pair = max(stats, key=stats.get)
        new = 256 + r
        for k, ids in enumerate(chunks):
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
                    out.append(new)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            chunks[k] = out
        merges.append(pair)
    return {"seconds": time.perf_counter() - t0, "merges": len(merges)}


def child_train_ours_slice(corpus: str, vocab: int) -> dict:
    from tokenkit.bpe import Tokenizer

    data = Path(corpus).read_bytes()[:SLICE_BYTES].decode("utf-8", "ignore").encode("utf-8")
    t0 = time.perf_counter()
    tok = Tokenizer.train([data], vocab_size=vocab, min_frequency=1, workers=1, quiet=True)
    return {"seconds": time.perf_counter() - t0, "merges": len(tok.merges)}


def child_encode_ours(corpus: str, tok_path: str, workers: int) -> dict:
    """`encode_file` as `tk encode -f FILE -o ids.npy` runs it: ids streamed to a .npy (workers 0:
    the default, all cores)."""
    from tokenkit.bpe import Tokenizer

    tok = Tokenizer.load(tok_path)  # fresh: empty chunk cache
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        ids = tok.encode_file(corpus, Path(tmp) / "ids.npy", workers=workers or None, quiet=True)
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "tokens": int(ids.shape[0])}


def _tiktoken_gpt2():
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(GPT2 / "gpt2.tiktoken"))
    return tiktoken.Encoding(
        "gpt2-local", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )


def _hf_gpt2():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def child_encode_tiktoken(corpus: str) -> dict:
    enc = _tiktoken_gpt2()
    text = Path(corpus).read_text(encoding="utf-8")
    t0 = time.perf_counter()
    ids = enc.encode_ordinary(text)
    return {"seconds": time.perf_counter() - t0, "tokens": len(ids)}


def child_encode_hf(corpus: str) -> dict:
    tok = _hf_gpt2()
    text = Path(corpus).read_text(encoding="utf-8")
    t0 = time.perf_counter()
    ids = tok.encode(text).ids
    return {"seconds": time.perf_counter() - t0, "tokens": len(ids)}


def child_check(corpus: str, tok_path: str) -> dict:
    from tokenkit.bpe import Tokenizer

    ours = Tokenizer.load(tok_path).encode_file(corpus, workers=2, quiet=True).tolist()
    text = Path(corpus).read_text(encoding="utf-8")
    out = {"tokens": len(ours), "bytes_per_token": Path(corpus).stat().st_size / len(ours)}
    try:
        out["equal_tiktoken"] = ours == _tiktoken_gpt2().encode_ordinary(text)
    except ImportError:
        pass
    try:
        out["equal_hf"] = ours == _hf_gpt2().encode(text).ids
    except ImportError:
        pass
    return out


CHILDREN = {
    f.__name__[len("child_") :]: f
    for f in list(globals().values())
    if callable(f) and getattr(f, "__name__", "").startswith("child_")
}


def run_child(kind: str, *args, env: dict | None = None) -> dict:
    """Run one measurement in a fresh process; adds its peak RSS (MB) and its workers' peak."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", kind, *map(str, args)],
            stdout=out,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            tail = err.read().decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            if "ModuleNotFoundError" in tail[0] or "ImportError" in tail[0]:
                return {"missing": tail[0]}
            raise RuntimeError(f"{kind} failed: {tail[0]}")
        result = json.loads(out.read().decode().strip().splitlines()[-1])
    result["maxrss_mb"] = usage.ru_maxrss / 1024
    return result


def measure(kind: str, *args, repeats: int, env: dict | None = None) -> dict:
    return summarize([run_child(kind, *args, env=env) for _ in range(repeats)])


def measure_side_by_side(specs: list[tuple], repeats: int) -> list[dict]:
    """`measure` for each (kind, *args) of `specs`, their runs taking turns (a, b, a, b, ...), so
    that a burst of outside load on a shared machine hits all of them alike."""
    runs: list[list[dict]] = [[] for _ in specs]
    for _ in range(repeats):
        for spec, out in zip(specs, runs, strict=True):
            if not out or "missing" not in out[0]:
                out.append(run_child(*spec))
    return [summarize(r) for r in runs]


def summarize(runs: list[dict]) -> dict:
    if "missing" in runs[0]:
        return runs[0]
    summary = dict(runs[-1])
    summary["seconds"] = statistics.median(r["seconds"] for r in runs)
    summary["all"] = [round(r["seconds"], 3) for r in runs]
    summary["maxrss_mb"] = max(r["maxrss_mb"] for r in runs)
    summary["workers_maxrss_mb"] = max(r.get("workers_maxrss_mb", 0) for r in runs)
    return summary


def child_main(kind: str, args: list[str]) -> None:
    func = CHILDREN[kind]
    converted = [int(a) if a.isdigit() else a for a in args]
    result = func(*converted)
    result["workers_maxrss_mb"] = _children_maxrss_mb()
    print(json.dumps(result))


# ----------------------------------------------------------------------------- report


def row(name: str, r: dict, ours_seconds: float | None = None, mb: float | None = None) -> str:
    if "missing" in r:
        return f"  {name:<38} not installed ({r['missing']})"
    text = f"  {name:<38} {r['seconds']:8.2f} s"
    if mb is not None:
        text += f"  {mb / r['seconds']:6.2f} MB/s"
    if ours_seconds is not None:
        text += f"  x{r['seconds'] / ours_seconds:5.2f}"
    text += f"   peak {r['maxrss_mb']:6.0f} MB"
    if r.get("workers_maxrss_mb"):
        text += f" (workers {r['workers_maxrss_mb']:.0f} MB)"
    return text + f"   runs {r['all']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", default="8192,32000")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--big-gb", type=float, default=0.0, help="also train on a generated file of this many GB")
    parser.add_argument(
        "--large-mb",
        type=float,
        default=200.0,
        help="also train at vocab 32000 on this many MB of distinct Python source against HF "
        "(bench/bpe_large.py; 0: skip)",
    )
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-encode", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child[0], args.child[1:])
        return
    corpus = args.corpus.resolve()
    if not corpus.exists():
        sys.exit(f"error: {corpus} not found (the shared data sits next to the repository)")
    mb = corpus.stat().st_size / 1e6
    n = args.repeats
    print(f"corpus {corpus.name}: {mb:.1f} MB; {os.cpu_count()} cores; medians of {n} runs; xR = peer time / our time")
    if not args.skip_train:
        for vocab in [int(v) for v in args.vocab.split(",")]:
            print(f"\ntraining, vocab {vocab}:")
            ours = measure("train_ours", corpus, vocab, 2, repeats=n)
            print(row("ours (2 workers)", ours) + f"   [{ours['merges']} merges, stop: {ours['stop']}]")
            for threads in (1, 2):
                hf = measure("train_hf", corpus, vocab, repeats=n, env={"RAYON_NUM_THREADS": str(threads)})
                print(row(f"HF tokenizers byte-level BPE ({threads} thr)", hf, ours["seconds"]))
            spm_r = measure("train_spm", corpus, vocab, 2, repeats=n)
            print(row("SentencePiece BPE (2 threads)", spm_r, ours["seconds"]))
        print(f"\ntraining on the first {SLICE_BYTES // 1000} KB, vocab {NAIVE_VOCAB}:")
        ours_slice = measure("train_ours_slice", corpus, NAIVE_VOCAB, repeats=n)
        print(row("ours (1 process)", ours_slice))
        naive = measure("train_naive", corpus, NAIVE_VOCAB, repeats=1)
        print(row("naive minbpe-like (recount per merge)", naive, ours_slice["seconds"]))
    if args.big_gb > 0:
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            big = Path(tmp) / "big.txt"
            data = corpus.read_bytes()
            copies = max(1, int(args.big_gb * 1e9 / len(data)))
            with open(big, "wb") as f:
                for _ in range(copies):
                    f.write(data)
            print(
                f"\ntraining on {copies} copies of the corpus ({big.stat().st_size / 1e9:.2f} GB), vocab 8192, 1 run:"
            )
            small = measure("train_ours", corpus, 8192, 2, repeats=1)
            print(row(f"ours on {corpus.name} ({mb:.0f} MB)", small))
            large = measure("train_ours", big, 8192, 2, repeats=1)
            print(row(f"ours on the {big.stat().st_size / 1e9:.2f} GB file", large, mb=big.stat().st_size / 1e6))
    if args.large_mb > 0 and not args.skip_train:
        import bpe_large

        bpe_large.compare(
            bpe_large.ensure_corpus(
                Path(f"/tmp/tokenkit-python-corpus-{args.large_mb:g}mb.txt"), args.large_mb, "py", []
            ),
            32000,
            1,
        )
    if not args.skip_encode:
        with tempfile.TemporaryDirectory() as tmp:
            from tokenkit.bpe import Tokenizer

            tok_path = Path(tmp) / "gpt2.safetensors"
            Tokenizer.from_gpt2(GPT2 / "encoder.json", GPT2 / "vocab.bpe").save(tok_path)
            print(f"\nencoding {corpus.name} with GPT-2's vocabulary (ours and tiktoken taking turns):")
            ours, ours1, tt = measure_side_by_side(
                [
                    ("encode_ours", corpus, tok_path, 0),
                    ("encode_ours", corpus, tok_path, 1),
                    ("encode_tiktoken", corpus),
                ],
                n,
            )
            print(row(f"ours encode_file ({os.cpu_count()} workers: default)", ours, mb=mb))
            print(row("ours encode_file (1 worker)", ours1, mb=mb))
            print(row("tiktoken (1 thread)", tt, ours["seconds"], mb=mb))
            if "missing" not in tt:
                ratios = [t / o for t, o in zip(tt["all"], ours["all"], strict=True)]
                print(
                    "  encode speed ours (default workers) / tiktoken (1 thread): "
                    f"{tt['seconds'] / ours['seconds']:.2f}x (ratio of medians; "
                    f"run by run {min(ratios):.2f}-{max(ratios):.2f}x, median {statistics.median(ratios):.2f}x)"
                )
            ours2 = ours
            hf = measure("encode_hf", corpus, repeats=n)
            print(row("HF tokenizers (encode of the whole text)", hf, ours2["seconds"], mb=mb))
            check = run_child("check", corpus, tok_path)
            print(
                f"  ids: {check['tokens']:,} tokens, {check['bytes_per_token']:.3f} bytes/token; "
                f"equal to tiktoken: {check.get('equal_tiktoken', 'n/a')}; equal to HF: {check.get('equal_hf', 'n/a')}"
            )


if __name__ == "__main__":
    main()
