"""A first run that stopped before its first checkpoint: the same command starts it again.

Such a run (its loss diverged, or it was killed) leaves its log, its token cache and the
tokenizer it trained, but no model and no training state: nothing to resume. `tk train-model
--resume` says so in one line and names what to do; the plain command given again takes the
directory (staged, as `--overwrite` is: until its own first checkpoint the dead run's files stay)
and writes the files a run in an empty directory writes, byte for byte. Each command runs as a
subprocess, so that NumPy's overflow warnings would show on stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_MODEL as SMALL  # the tiny model of runs that only start, stop or repeat

REPO = Path(__file__).resolve().parents[1]
TK = [sys.executable, "-m", "tokenkit.cli.main"]
SAME = ["--workers", "1", "--seed", "5"]
DIVERGES = ["--lr", "1", "--grad-clip", "0", "--beta2", "0"]  # sign steps of size 1: inf by step 9
RUN_FILES = ("model.safetensors", "train_state.safetensors", "tokenizer.safetensors", "tokens.npy", "tokens.json")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "tales.txt"
    path.write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:60_000])
    return path


def _tk(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*TK, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}


def _one_error(proc: subprocess.CompletedProcess, *parts: str) -> None:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for part in parts:
        assert part in lines[0], proc.stderr


@pytest.fixture(scope="module")
def fresh_run(corpus, tmp_path_factory) -> Path:
    """What the command writes in an empty directory: the rerun must write the same bytes."""
    run = tmp_path_factory.mktemp("fresh") / "run"
    proc = _tk("train-model", corpus, "-o", run, "--steps", "20", "--eval-interval", "10", *SMALL, *SAME, "-q")
    assert proc.returncode == 0, proc.stderr
    return run


def test_a_first_run_that_diverged_is_started_again_by_the_same_command(corpus, fresh_run, tmp_path):
    run = tmp_path / "run"
    command = ["train-model", corpus, "-o", run, "--steps", "20", "--eval-interval", "10", *SMALL, *SAME, "-q"]
    diverged = _tk(*command, *DIVERGES)
    _one_error(diverged, "training diverged", "no checkpoint had been saved yet")  # and no NumPy warnings
    left = _files(run)
    assert "log.jsonl" in left and "train_state.safetensors" not in left and "model.safetensors" not in left

    resumed = _tk("train-model", "--resume", run)
    _one_error(
        resumed,
        f"{run} has no checkpoint yet (its first run stopped at step ",
        "before its first checkpoint); run the same train-model command again without --resume",
    )
    again = _tk(*command, *DIVERGES)  # fails before its first checkpoint too: the first one's files stay
    _one_error(again, "training diverged")
    assert _files(run) == left

    rerun = _tk(*command)
    assert rerun.returncode == 0, rerun.stderr
    for name in RUN_FILES:
        assert (run / name).read_bytes() == (fresh_run / name).read_bytes(), name
    assert '"type": "stop"' not in (run / "log.jsonl").read_text()
    assert not (run / ".tk-new-run").exists()
    assert _tk("train-model", "--resume", run, "-q").stdout.startswith("step 20/20: nothing left to train")


def test_a_first_run_killed_before_its_first_checkpoint_is_started_again(corpus, fresh_run, tmp_path):
    run = tmp_path / "run"
    slow = [*SMALL, *SAME, "--eval-interval", "100000", "--steps", "100000", "-q"]
    proc = subprocess.Popen([*TK, "train-model", str(corpus), "-o", str(run), *slow], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        log = run / "log.jsonl"
        while time.monotonic() < deadline and not (log.exists() and '"type": "step"' in log.read_text()):
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run / "train_state.safetensors").exists()

    _one_error(_tk("train-model", "--resume", run), "has no checkpoint yet (its first run stopped at step ")
    rerun = _tk("train-model", corpus, "-o", run, "--steps", "20", "--eval-interval", "10", *SMALL, *SAME, "-q")
    assert rerun.returncode == 0, rerun.stderr
    for name in RUN_FILES:
        assert (run / name).read_bytes() == (fresh_run / name).read_bytes(), name


def test_a_run_with_a_checkpoint_is_still_another_run(corpus, fresh_run, tmp_path):
    """Only a run without any checkpoint is taken over: one that saved is refused as before."""
    run = tmp_path / "run"
    run.mkdir()
    for name, data in _files(fresh_run).items():
        (run / name).write_bytes(data)
    proc = _tk("train-model", corpus, "-o", run, "--steps", "20", *SMALL, *SAME, "-q")
    _one_error(proc, "already holds files of another run", "--resume")
    assert _files(run) == _files(fresh_run)


def test_resume_in_a_pipeline_that_stopped_before_its_first_checkpoint_names_tk_pipeline(corpus, tmp_path):
    run = tmp_path / "run"
    flags = [corpus, "-o", run, "--vocab-size", "300", "--steps", "20", "--eval-interval", "20", *SMALL, *SAME, "-q"]
    _one_error(_tk("pipeline", *flags, *DIVERGES), "training diverged")
    _one_error(_tk("train-model", "--resume", run), "run the same tk pipeline command again without --resume")
    rerun = _tk("pipeline", *flags)
    assert rerun.returncode == 0, rerun.stderr
    assert (run / "train_state.safetensors").exists()


@pytest.mark.parametrize("stamp", ["[]", '{"vocab_size": "many"}', "{not json", ""])
def test_a_damaged_pipeline_json_is_refused_before_the_tokenizer_trains_again(corpus, tmp_path, stamp):
    """A pipeline run whose pipeline.json is damaged no longer says which corpus its tokenizer
    came from: the rerun refuses in one line at once (its tokenizer would be replaced), instead of
    training a new tokenizer first and refusing after; with --overwrite it starts again."""
    run = tmp_path / "pipe"
    flags = [*SMALL, *SAME, "--steps", "4", "--eval-interval", "2", "--vocab-size", "300", "-n", "2"]
    assert _tk("pipeline", corpus, "-o", run, *flags, "-q").returncode == 0
    tokenizer = (run / "tokenizer.safetensors").read_bytes()
    (run / "pipeline.json").write_text(stamp, encoding="utf-8")
    proc = _tk("pipeline", corpus, "-o", run, *flags)  # not quiet: a tokenizer trained first would say so
    _one_error(proc, "tokenizer.safetensors", "--overwrite")
    assert "training BPE" not in proc.stderr and (run / "tokenizer.safetensors").read_bytes() == tokenizer
    assert (run / "pipeline.json").read_text(encoding="utf-8") == stamp  # nothing of the run was touched
    assert _tk("pipeline", corpus, "-o", run, *flags, "-q", "--overwrite").returncode == 0
