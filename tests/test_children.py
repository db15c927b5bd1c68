"""Worker processes never outlive `tk`: each pooled command is stopped while its workers run.

Commands: `tk encode -f` (common.pool's workers), `tk bpe-train` (counting processes), and
`tk train-model` during its encoding stage and during training (forked batch-shard workers).
Each runs as a subprocess; once it has children (read from /proc) it gets SIGTERM or SIGKILL, and
every child recorded must be gone within 3 s. After SIGTERM, the command must also exit 143 and
leave no temp file. A dead orphan may stay a zombie where PID 1 does not reap: that counts as gone.

The corpus is a few MB of seeded random words, so that the work lasts long enough to be stopped
in the middle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_MODEL  # the tiny model of runs that only start, stop or repeat

from tokenkit.cli.main import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the death signal is Linux's")

REPO = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 3.0


def _random_words_text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 10, size=50_000)
    letters = rng.integers(ord("a"), ord("z") + 1, size=int(lengths.sum()), dtype=np.uint8).tobytes().decode()
    ends = np.cumsum(lengths).tolist()
    words = [letters[e - n : e] for e, n in zip(ends, lengths.tolist(), strict=True)]
    picks = rng.integers(0, len(words), size=n_words).tolist()
    return "".join(" ".join(words[i] for i in picks[k : k + 12]) + ".\n" for k in range(0, n_words, 12))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("children")
    big = root / "big.txt"  # ~4 MB: four pieces of work, each long enough to be caught
    big.write_text(_random_words_text(650_000, seed=0))
    small = root / "small.txt"  # under two pieces: encoded here, so the only children train
    small.write_text(_random_words_text(40_000, seed=1))
    tok = root / "tok.safetensors"
    assert main(["bpe-train", str(small), "--vocab-size", "400", "--workers", "1", "-o", str(tok), "--quiet"]) == 0
    return {"big": big, "small": small, "tok": tok}


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}
    except OSError:  # gone (and reaped)
        return {}


def _children(pid: int) -> set[int]:
    return {int(e) for e in os.listdir("/proc") if e.isdigit() and _status(int(e)).get("PPid") == str(pid)}


def _alive(pid: int) -> bool:
    return _status(pid).get("State", "Z")[:1] != "Z"


def _stop_while_busy(tmp_path: Path, args: list, sig: int, ready=lambda: True) -> tuple[int, set[int], str]:
    """Run `tk ARGS`, wait until `ready()` and it has children, send `sig`; returns its exit code,
    the children seen and its stderr. Asserts that the children are gone within GONE_WITHIN_S."""
    err_path = tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(err_path, "wb") as err:  # a file, not a pipe: an orphan holding a pipe would block its reading
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenkit.cli.main", *map(str, args)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not kids and proc.poll() is None and time.monotonic() < deadline:
            kids = {k for k in _children(proc.pid) if _alive(k)} if ready() else set()
            time.sleep(0.005)
        time.sleep(0.05)  # a pool may start its workers one after the other
        kids |= _children(proc.pid)
        assert kids and proc.poll() is None, f"tk {args[0]} finished before it could be stopped: {err_path.read_text()}"
        proc.send_signal(sig)
        sent = time.monotonic()
        while time.monotonic() - sent < GONE_WITHIN_S and any(map(_alive, kids)):
            time.sleep(0.01)
        left = sorted(k for k in kids if _alive(k))
        assert not left, f"worker processes {left} outlived tk {args[0]} ({signal.Signals(sig).name})"
        code = proc.wait(timeout=30)
    finally:  # whatever failed: leave no process behind
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in kids:
            if _alive(k):
                os.kill(k, signal.SIGKILL)
    return code, kids, err_path.read_text()


def _assert_terminated(code: int, err: str, out_dir: Path) -> None:
    assert code == 128 + signal.SIGTERM, f"exit code {code}, stderr: {err[-500:]}"
    assert "Traceback" not in err, err
    assert not list(out_dir.glob(".*.tmp")), f"temp files left: {list(out_dir.glob('.*.tmp'))}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_encode_file(files, tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    args = ["encode", "-t", files["tok"], "-f", files["big"], "-o", out / "ids.npy", "--workers", "2", "--quiet"]
    code, kids, err = _stop_while_busy(tmp_path, args, sig)
    assert len(kids) == 2
    if sig == signal.SIGTERM:
        _assert_terminated(code, err, out)
        assert "terminated (SIGTERM)" in err and not (out / "ids.npy").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_bpe_train(files, tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    args = [
        "bpe-train",
        files["big"],
        "--vocab-size",
        "400",
        "--workers",
        "2",
        "-o",
        out / "tok.safetensors",
        "--quiet",
    ]
    code, _, err = _stop_while_busy(tmp_path, args, sig)
    if sig == signal.SIGTERM:
        _assert_terminated(code, err, out)
        assert not (out / "tok.safetensors").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_train_model_while_encoding(files, tmp_path, sig):
    run = tmp_path / "run"
    args = [
        "train-model",
        files["big"],
        "-t",
        files["tok"],
        "-o",
        run,
        "--workers",
        "2",
        "--steps",
        "1000",
        *TINY_MODEL,
        "--quiet",
    ]
    code, _, err = _stop_while_busy(tmp_path, args, sig)  # the first children are the encoding pool's
    assert not (run / "tokens.npy").exists()  # stopped while encoding
    if sig == signal.SIGTERM:
        _assert_terminated(code, err, run)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_train_model_while_training(files, tmp_path, sig):
    run = tmp_path / "run"
    args = [
        "train-model",
        files["small"],
        "-t",
        files["tok"],
        "-o",
        run,
        "--workers",
        "2",
        "--steps",
        "1000",
        "--eval-interval",
        "50",
        *TINY_MODEL,
        "--quiet",
    ]
    code, _, err = _stop_while_busy(tmp_path, args, sig, ready=lambda: (run / "tokens.npy").exists())
    if sig == signal.SIGTERM:  # like Ctrl-C: the state is saved at the step boundary, with a resume hint
        _assert_terminated(code, err, run)
        assert "interrupted at step" in err and "--resume" in err
        assert (run / "train_state.safetensors").exists()
