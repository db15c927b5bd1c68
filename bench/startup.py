"""How long `tk` takes to start, as whole processes, beside the floors a Python CLI stands on.

    flock /tmp/tokenkit-bench.lock python bench/startup.py [--runs 10] [--tokenizer TOK]

Each line is the median (and the range) of --runs runs of one command, taking turns so that a
noisy moment hits all alike, with Python's bytecode cached as an installed copy has it (an untimed
first round writes it): `tk --version`, `tk --help`, every `tk CMD --help`, and `tk encode
-t TOK "text"` (TOK: GPT-2's tokenizer imported from ../shared/data/gpt2 when it is there, else a
small one trained here), beside `python -c pass`, `import click` and `import numpy`: what any
Python CLI over NumPy pays. Issue 35's targets: under 100 ms for the first three, 250 ms for encode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPT2 = REPO.parent / "shared" / "data" / "gpt2"


def _tokenizer(tmp: Path) -> tuple[Path, str]:
    """GPT-2's tokenizer as a tk file, or one trained on the default corpus; and what it is."""
    tk = [sys.executable, "-m", "tokenkit"]
    out = tmp / "tok.safetensors"
    if (GPT2 / "vocab.json").is_file() and (GPT2 / "merges.txt").is_file():
        cmd = [*tk, "bpe-import", str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt"), "-o", str(out)]
        subprocess.run(cmd, check=True, capture_output=True)
        return out, "GPT-2's (50,257 tokens)"
    corpus = str(REPO / "corpora" / "tiny_tales.txt")
    subprocess.run([*tk, "bpe-train", corpus, "--vocab-size", "2048", "-o", str(out), "-q"], check=True)
    return out, "trained on tiny_tales.txt (2,048 tokens)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer file for the encode line (default: GPT-2's)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from tokenkit.cli.commands import COMMANDS

    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tok, what = (args.tokenizer, str(args.tokenizer)) if args.tokenizer else _tokenizer(Path(tmp))
        lines = {
            "python -c pass": [py, "-c", "pass"],
            "python -c 'import click'": [py, "-c", "import click"],
            "python -c 'import numpy'": [py, "-c", "import numpy"],
            "tk --version": [py, "-m", "tokenkit", "--version"],
            "tk --help": [py, "-m", "tokenkit", "--help"],
            **{f"tk {name} --help": [py, "-m", "tokenkit", name, "--help"] for name in COMMANDS},
            'tk encode -t TOK "Hello world"': [py, "-m", "tokenkit", "encode", "-t", str(tok), "Hello world"],
        }
        times: dict[str, list[float]] = {name: [] for name in lines}
        # as installed: bytecode cached (a first, untimed round writes it where it is missing)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        for cmd in lines.values():
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tmp, env=env)
        for _ in range(args.runs):
            for name, cmd in lines.items():
                start = time.perf_counter()
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tmp, env=env)
                times[name].append(time.perf_counter() - start)
    load = os.getloadavg()[0]
    print(f"{args.runs} runs each, taking turns; load average {load:.2f} on {os.cpu_count()} cores; TOK: {what}")
    print(f"{'command':<40} {'median ms':>10} {'range ms':>14}")
    for name, ts in times.items():
        ms = sorted(1000 * t for t in ts)
        print(f"{name:<40} {statistics.median(ms):>10.0f} {ms[0]:>6.0f}-{ms[-1]:<6.0f}")


if __name__ == "__main__":
    main()
