"""SIGINT and SIGTERM at random moments of `tk encode --workers 2` and `tk bpe-train --workers 2`:
how many runs hang, leave a child behind, or end otherwise than with their one line.

    python bench/signal_stress.py [--tries 200] [--load 2] [--seed 0] [--commands encode,bpe-train]

Each try starts one command in a session of its own on a ~3 MB corpus, waits a random delay
within the command's own running time (measured once, at the start), then sends SIGINT or
SIGTERM, chosen at random, either to the whole process group (a terminal's Ctrl-C) or to tk's
main process alone (`kill PID`). It then counts:

- a hang: the main process has not exited HANG_S (30 s) after the signal;
- a leftover: a process of the group still alive GONE_WITHIN_S (3 s) after the main one exited;
- a bad end: an exit code other than 0 (finished first) or 128 + the signal, or a stderr other
  than its one line (`interrupted`, `terminated (SIGTERM)`).

`--load N` keeps N busy-loop processes running meanwhile (CPU contention, where issue 36's
hangs showed up more often). A hung run is dumped with py-spy where it is installed, then killed.

Not a test: a timed test cannot catch a race that shows once in fifty runs; this counts them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TK = [sys.executable, "-m", "tokenkit.cli.main"]
HANG_S = 30.0
GONE_WITHIN_S = 3.0


def _random_words_text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 10, size=50_000)
    letters = rng.integers(ord("a"), ord("z") + 1, size=int(lengths.sum()), dtype=np.uint8).tobytes().decode()
    ends = np.cumsum(lengths).tolist()
    words = [letters[e - n : e] for e, n in zip(ends, lengths.tolist(), strict=True)]
    picks = rng.integers(0, len(words), size=n_words).tolist()
    return "".join(" ".join(words[i] for i in picks[k : k + 12]) + ".\n" for k in range(0, n_words, 12))


def _commands(root: Path) -> dict[str, list[str]]:
    big, small, tok = root / "big.txt", root / "small.txt", root / "tok.safetensors"
    if not big.exists():
        big.write_text(_random_words_text(480_000, seed=0), encoding="utf-8")
        small.write_text(_random_words_text(40_000, seed=1), encoding="utf-8")
        subprocess.run([*TK, "bpe-train", str(small), "--vocab-size", "400", "-o", str(tok), "-q"], check=True)
    w = ["--workers", "2", "-q"]
    return {
        "encode": ["encode", "-t", str(tok), "-f", str(big), "-o", str(root / "out" / "ids.npy"), *w],
        "bpe-train": ["bpe-train", str(big), "--vocab-size", "600", "-o", str(root / "out" / "t.safetensors"), *w],
    }


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            alive.append(int(entry))
    return alive


def _dump(pid: int) -> str:
    spy = shutil.which("py-spy")
    if not spy:
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20).stdout
    return ""


def one_try(cmd: list[str], out: Path, delay: float, sig: int, whole_group: bool) -> tuple[str, str]:
    """('ok' | 'hang' | 'leftover' | 'bad', detail) of one interrupted run."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    err_path = out.parent / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [*TK, *cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
    time.sleep(delay)
    with contextlib.suppress(ProcessLookupError):
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    try:
        code = proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        dump = _dump(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "hang", dump[-3000:]
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := _group_alive(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return "leftover", f"pids {left}"
    err = err_path.read_text(errors="replace")
    expected = "interrupted" if sig == signal.SIGINT else f"terminated ({signal.Signals(sig).name})"
    if code == 0 or (code == 128 + sig and err.strip() == expected):
        return "ok", ""
    if delay < 0.3 and "tokenkit" not in err and (code == -sig or err.rstrip().endswith("KeyboardInterrupt")):
        return "ok", ""  # before tk's first line (Python's own start, `site`): Python's to report
    return "bad", f"exit {code}: {err[-500:]!r}"


def _busy() -> None:
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=200)
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes running meanwhile")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commands", default="encode,bpe-train")
    ap.add_argument("--dir", help="keep the corpus here between runs (default: a temp directory)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tk-signal-stress-"))
    root.mkdir(parents=True, exist_ok=True)
    commands = {k: v for k, v in _commands(root).items() if k in args.commands.split(",")}
    out = root / "out"
    durations = {}
    for name, cmd in commands.items():  # each command's own time: the delays fall within it
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        start = time.monotonic()
        subprocess.run([*TK, *cmd], check=True, stdin=subprocess.DEVNULL)
        durations[name] = time.monotonic() - start
    print("uninterrupted:", ", ".join(f"{k} {v:.2f} s" for k, v in durations.items()), flush=True)
    load = []
    for _ in range(args.load):
        pid = os.fork()
        if pid == 0:
            _busy()
        load.append(pid)
    counts: dict[tuple[str, str], int] = {}
    try:
        for i in range(args.tries):
            name = rng.choice(sorted(commands))
            sig = rng.choice([signal.SIGINT, signal.SIGTERM])
            whole_group = rng.random() < 0.5
            delay = rng.uniform(0, durations[name])
            outcome, detail = one_try(commands[name], out, delay, sig, whole_group)
            counts[(name, outcome)] = counts.get((name, outcome), 0) + 1
            if outcome != "ok":
                to = "group" if whole_group else "main"
                print(f"try {i}: {name} {signal.Signals(sig).name} to {to} at {delay:.3f} s: {outcome} {detail}")
            if (i + 1) % 20 == 0:
                print(f"{i + 1} tries: {dict(sorted(counts.items()))}", flush=True)
    finally:
        for pid in load:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    for name in sorted(commands):
        n = sum(v for (c, _), v in counts.items() if c == name)
        bad = {o: v for (c, o), v in counts.items() if c == name and o != "ok"}
        print(
            f"{name}: {n} tries, load {args.load}: hangs {bad.get('hang', 0)}, leftovers {bad.get('leftover', 0)}, "
            f"bad ends {bad.get('bad', 0)}"
        )
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if any(o != "ok" for (_, o) in counts) else 0


if __name__ == "__main__":
    sys.exit(main())
