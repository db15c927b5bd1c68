"""What tk promises about a user's files: failed runs touch nothing, one process per run directory,
atomic writes that leave only temps the next run removes, one-line write failures, the umask,
and byte-identical files from identical runs. The README's "What tk promises about your files"
names these tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import HILL_WORDS, TINY_MODEL, signal_at_step  # the tiny model and the twelve words other modules share

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint, train
from tokenkit.pipeline.checkpoint import load_model
from tokenkit.pipeline.rundir import RunDir
from tokenkit.pipeline.train_state import load_train_state
from tokenkit.transformer import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
TINY = [
    *TINY_MODEL,
    "--warmup-steps",
    "2",
    "--eval-batches",
    "2",
    "--quiet",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_words(tmp_path_factory.mktemp("corpus") / "words.txt")


def write_words(path: Path) -> Path:
    """1,500 lines of 12 words drawn from 12 (seed 7): a corpus a tiny model learns in a few steps."""
    rng = np.random.default_rng(7)
    path.write_text("\n".join(" ".join(rng.choice(HILL_WORDS, size=12)) for _ in range(1500)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok_path(corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tok.safetensors"
    Tokenizer.train(corpus, vocab_size=300, quiet=True).save(path)
    return path


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `directory`: its bytes and mode."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mode)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def one_line_error(code: int, err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]


def tk(*argv: str, cwd: Path = REPO, umask: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run(
        [sys.executable, "-m", "tokenkit.cli.main", *argv],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=pre,
    )


def other_runs_files(d: Path, model_from: Path) -> None:
    """A directory as a user may have it: another run's model, a log, a tokenizer, a file of theirs."""
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(model_from, d / "model.safetensors")
    (d / "log.jsonl").write_text("{}\n", encoding="utf-8")
    (d / "tokenizer.safetensors").write_bytes(b"the user's tokenizer")
    (d / ".draft.tmp").write_bytes(b"the user's temp file")
    (d / "notes.txt").write_text("mine", encoding="utf-8")


@pytest.fixture(scope="module")
def trained(corpus, tok_path, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "trained"
    assert (
        main(
            [
                "train-model",
                str(corpus),
                "-o",
                str(run_dir),
                "-t",
                str(tok_path),
                *TINY,
                "--steps",
                "6",
                "--eval-interval",
                "3",
            ]
        )
        == 0
    )
    return run_dir


# --- nothing is touched before a run is known to start ------------------------------------------


def test_failed_fresh_run_keeps_every_file(trained, tmp_path, capsys):
    d = tmp_path / "d"
    other_runs_files(d, trained / "model.safetensors")
    tiny = tmp_path / "one.txt"
    tiny.write_text("x", encoding="utf-8")
    before = snapshot(d)
    one_line_error(
        main(["train-model", str(tiny), "-o", str(d)]), capsys.readouterr().err, "already holds files of another run"
    )
    assert snapshot(d) == before
    # even when asked to overwrite, a run that cannot start (corpus too small) replaces nothing
    one_line_error(
        main(["train-model", str(tiny), "-o", str(d), "--overwrite", "-q"]), capsys.readouterr().err, "corpus too small"
    )
    assert snapshot(d) == before
    one_line_error(
        main(["pipeline", str(tiny), "-o", str(d), "-q"]), capsys.readouterr().err, "not made by `tk pipeline`"
    )
    assert snapshot(d) == before


def test_failed_fresh_run_into_the_current_directory_keeps_every_file(trained, tmp_path):
    other_runs_files(tmp_path, trained / "model.safetensors")
    (tmp_path / "one.txt").write_text("x", encoding="utf-8")
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"]):
        result = tk("train-model", "one.txt", "-o", ".", "-q", *extra, cwd=tmp_path)
        assert result.returncode == 1 and result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
        assert snapshot(tmp_path) == before


def test_overwrite_replaces_another_runs_files_and_leaves_the_users_own(corpus, tok_path, trained, tmp_path, capsys):
    d = tmp_path / "d"
    other_runs_files(d, trained / "model.safetensors")
    code = main(
        ["train-model", str(corpus), "-o", str(d), "--overwrite", *TINY, "--steps", "4", "--eval-interval", "2"]
    )
    assert code == 0, capsys.readouterr().err
    assert load_model(d).metadata["step"] == 4 and load_train_state(d / "train_state.safetensors").step == 4
    assert Tokenizer.load(d / "tokenizer.safetensors").vocab_size > 256  # trained by this run, replacing the other
    assert (d / ".draft.tmp").read_bytes() == b"the user's temp file" and (d / "notes.txt").read_text(
        encoding="utf-8"
    ) == "mine"
    assert not (d / ".tk.lock").exists()


def test_a_failed_first_run_leaves_no_directory_behind(tmp_path, capsys):
    tiny = tmp_path / "one.txt"
    tiny.write_text("x", encoding="utf-8")
    one_line_error(
        main(["train-model", str(tiny), "-o", str(tmp_path / "new" / "run"), "-q"]),
        capsys.readouterr().err,
        "corpus too small",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "one.txt"]  # only what did not exist goes: the run dir
    assert list((tmp_path / "new").iterdir()) == []


# --- one process per run directory --------------------------------------------------------------


HOLD = (
    "import sys, time\n"
    "from tokenkit.pipeline.rundir import RunDir\n"
    "with RunDir(sys.argv[1]):\n"
    "    print('held', flush=True); time.sleep(60)\n"
)


def test_second_run_is_refused_while_the_first_holds_the_lock(corpus, tok_path, trained, tmp_path, capsys):
    d = tmp_path / "shared"
    shutil.copytree(trained, d)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (
            ["train-model", str(corpus), "-o", str(d), "-t", str(tok_path), "--overwrite", *TINY],
            ["train-model", "--resume", str(d), "-q"],
            ["pipeline", str(corpus), "-o", str(d), "--overwrite", "-q"],
        ):
            before = snapshot(d)
            one_line_error(main(argv), capsys.readouterr().err, f"is in use by process {holder.pid}")
            assert snapshot(d) == before
    finally:
        holder.kill()
        holder.wait()
    # the lock of a dead process never blocks
    assert main(["train-model", "--resume", str(d), "-q", "--steps", "6"]) == 0


def test_two_real_runs_started_together_one_wins(corpus, tok_path, tmp_path):
    d = tmp_path / "race"
    args = [
        "train-model",
        str(corpus),
        "-o",
        str(d),
        "-t",
        str(tok_path),
        *TINY,
        "--steps",
        "40",
        "--eval-interval",
        "10",
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tokenkit.cli.main", *args, "--seed", str(seed)],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, err in results if code == 1)
    # "by process PID", or "by another process" when the winner holds the lock but has not yet written its pid
    assert "is in use by" in loser or "already holds files of another run" in loser, loser
    winner_seed = 1 if results[0][0] == 0 else 2
    assert load_train_state(d / "train_state.safetensors").train_config["seed"] == winner_seed


# --- crashes leave only our temps, and the next run removes them ---------------------------------


def test_sigkill_during_saves_then_resume_leaves_no_temp(corpus, tok_path, tmp_path):
    d = tmp_path / "killed"
    args = [
        "train-model",
        str(corpus),
        "-o",
        str(d),
        "-t",
        str(tok_path),
        *TINY,
        "--d-model",
        "128",
        "--steps",
        "150",  # a save every step: the kill comes within the first few
        "--eval-interval",
        "1",
        "--eval-batches",
        "1",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkit.cli.main", *args],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    temps: list[Path] = []
    while time.monotonic() < deadline and not temps:  # kill it while a checkpoint is being written
        temps = [p for p in d.glob(".*.tk-*.tmp")] if d.exists() and (d / "train_state.safetensors").exists() else []
    proc.kill()
    proc.wait()
    assert temps, "never caught a save in progress"
    left = list(d.glob(".*.tk-*.tmp"))
    (d / ".keep.tmp").write_bytes(b"not ours")
    if not left:  # the save finished between the glob and the kill: leave what a killed writer leaves
        (d / f".model.safetensors.tk-{proc.pid}-0badc0de.tmp").write_bytes(b"half a file")
    assert main(["train-model", "--resume", str(d), "-q"]) == 0
    assert sorted(p.name for p in d.glob(".*.tmp")) == [".keep.tmp"]
    assert load_train_state(d / "train_state.safetensors").step == 150


# --- write failures are one line -----------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_read_only_run_directory_is_one_line(corpus, tok_path, trained, tmp_path):
    with tmpfs(tmp_path / "ro", "16m") as ro:
        shutil.copytree(trained, ro / "run")
        assert subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True).returncode == 0
        before = snapshot(ro)
        fresh = tk("train-model", str(corpus), "-o", str(ro / "new"), "-t", str(tok_path), *TINY)
        resumed = tk("train-model", "--resume", str(ro / "run"), "-q", "--steps", "6")
        overwrite = tk("train-model", str(corpus), "-o", str(ro / "run"), "-t", str(tok_path), "--overwrite", *TINY)
        encode = tk("encode", "-t", str(tok_path), "-f", str(corpus), "-o", str(ro / "ids.npy"))
        for result in (fresh, resumed, overwrite, encode):
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
            assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: ")
            assert "read-only" in result.stderr.lower() or "not writable" in result.stderr, result.stderr
        assert snapshot(ro) == before


def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(corpus, tok_path, trained, tmp_path):
    with tmpfs(tmp_path / "full", "1m") as full:
        shutil.copy(trained / "train_state.safetensors", full / "train_state.safetensors")  # as a run that resumes
        state_before = (full / "train_state.safetensors").read_bytes()
        (full / "filler").write_bytes(b"\0" * (1024 * 1024 - len(state_before) - 64 * 1024))
        result = tk(
            "train-model",
            str(corpus),
            "-o",
            str(full / "run"),
            "-t",
            str(tok_path),
            *TINY,
            "--d-model",
            "128",
            "--steps",
            "4",
            "--eval-interval",
            "2",
        )
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1 and "disk is full" in result.stderr, result.stderr
        assert (full / "train_state.safetensors").read_bytes() == state_before
        assert not list(full.rglob(".*.tmp"))


# --- permissions and reproducibility ------------------------------------------------------------


def test_outputs_respect_the_umask(corpus, tok_path, tmp_path):
    run = tk(
        "train-model",
        str(corpus),
        "-o",
        str(tmp_path / "run"),
        *TINY,
        "--steps",
        "3",
        "--eval-interval",
        "3",
        umask=0o077,
    )
    enc = tk("encode", "-t", str(tok_path), "-f", str(corpus), "-o", str(tmp_path / "ids.npy"), "-q", umask=0o077)
    bpe = tk(
        "bpe-train", str(corpus), "--vocab-size", "280", "-q", "-o", str(tmp_path / "tok.safetensors"), umask=0o077
    )
    assert run.returncode == enc.returncode == bpe.returncode == 0, (run.stderr, enc.stderr, bpe.stderr)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {
        "model.safetensors",
        "train_state.safetensors",
        "tokens.npy",
        "tokenizer.safetensors",
        "log.jsonl",
        "tokens.json",
        "ids.npy",
        "tok.safetensors",
    }
    for path in files:
        assert path.stat().st_mode & 0o077 == 0, f"{path.name} is {oct(path.stat().st_mode)} under umask 077"
    default = tk("encode", "-t", str(tok_path), "-f", str(corpus), "-o", str(tmp_path / "ids2.npy"), "-q", umask=0o022)
    assert default.returncode == 0 and (tmp_path / "ids2.npy").stat().st_mode & 0o777 == 0o644


def test_identical_runs_write_identical_files(corpus, tmp_path):
    for name in ("a", "b"):
        assert (
            main(
                [
                    "train-model",
                    str(corpus),
                    "-o",
                    str(tmp_path / name),
                    *TINY,
                    "--steps",
                    "6",
                    "--eval-interval",
                    "3",
                    "--workers",
                    "2",
                ]
            )
            == 0
        )
    for name in ("model.safetensors", "train_state.safetensors", "tokenizer.safetensors", "tokens.npy", "tokens.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_resume_uses_the_recorded_worker_count_on_any_core_count(corpus, tok_path, tmp_path, monkeypatch, capsys):
    """`--workers 0` (one per core) is recorded as the count used; a resume on a machine with another
    core count continues with it and ends bit-identical to the uninterrupted run."""
    flags = ["-t", str(tok_path), *TINY, "--steps", "12", "--eval-interval", "4", "--workers", "0"]
    monkeypatch.setattr(train, "available_cores", lambda: 3)
    assert main(["train-model", str(corpus), "-o", str(tmp_path / "whole"), *flags]) == 0
    restore = signal_at_step(monkeypatch, 5, signal.SIGTERM)
    assert main(["train-model", str(corpus), "-o", str(tmp_path / "split"), *flags]) == 128 + signal.SIGTERM
    assert load_train_state(tmp_path / "split" / "train_state.safetensors").train_config["workers"] == 3
    restore()
    monkeypatch.setattr(train, "available_cores", lambda: 1)  # "another machine"
    assert main(["train-model", "--resume", str(tmp_path / "split"), "-q", "--workers", "0"]) == 0
    for name in ("model.safetensors", "train_state.safetensors"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "split" / name).read_bytes(), name
    capsys.readouterr()


# --- one model format ---------------------------------------------------------------------------


def test_gpt_save_files_are_read_by_every_command(tok_path, tmp_path, capsys):
    tok = Tokenizer.load(tok_path)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=16, d_model=32, n_layers=1, n_heads=2), seed=3)
    path = tmp_path / "saved.safetensors"
    model.save(path)
    assert main(["info", str(path)]) == 0
    assert "tokenkit.model" in capsys.readouterr().out
    one_line_error(
        main(["predict-next", "-m", str(path), "the fox"]), capsys.readouterr().err, "give the tokenizer with -t"
    )
    assert main(["predict-next", "-m", str(path), "-t", str(tok_path), "the fox", "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    logits = model.forward(np.array(tok.encode("the fox")))[0, -1].astype(np.float64)
    best = int(np.argmax(logits))
    assert f"(id {best}," in out
    assert main(["generate", "-m", str(path), "-t", str(tok_path), "the fox", "-n", "3", "--temperature", "0"]) == 0
    # and the pipeline's model files are GPT.load's
    checkpoint.save_model(
        tmp_path / "m.safetensors",
        model.params,
        tok,
        config=model.config.to_dict(),
        step=1,
        val_loss=None,
        best_val_loss=None,
        provenance={},
    )
    assert GPT.load(tmp_path / "m.safetensors").config == model.config


def test_lock_is_closed_in_forked_children(tmp_path):
    """A worker forked while a run holds its directory must not keep the lock after the run ends."""
    with RunDir(tmp_path / "r"):
        pid = os.fork()
        if pid == 0:  # the child: hold on a while, as a worker would
            time.sleep(1.5)
            os._exit(0)
    try:
        with RunDir(tmp_path / "r"):  # the parent's run ended: the directory is free at once
            pass
    finally:
        os.waitpid(pid, 0)
