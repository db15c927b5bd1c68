"""The model commands end to end through `tk`: learning a rule, resume, kills, NaN, bad input.

The corpus is generated here: lines that count up to the next multiple of ten or down to the
previous one ("up 23 24 25 26 27 28 29 30", "down 47 46 45 44 43 42 41 40"). After the start
number every token is fixed by the rule (the direction is the line's first word, or the step
between the last two numbers), so a model that learned it predicts held-out lines exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import signal_at_step

from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint, trainlog
from tokenkit.pipeline.checkpoint import load_model
from tokenkit.pipeline.train_state import load_train_state

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--n-layers", "2", "--n-heads", "2", "--d-model", "64", "--context-length", "16"]


def counting_line(rng: np.random.Generator) -> tuple[str, str]:
    """One rule line and its unpredictable prefix (direction word + start number)."""
    start = int(rng.integers(1, 100))
    while start % 10 == 0:
        start = int(rng.integers(1, 100))
    if rng.random() < 0.5:
        numbers = range(start, (start // 10 + 1) * 10 + 1)
        word = "up"
    else:
        numbers = range(start, (start // 10) * 10 - 1, -1)
        word = "down"
    return f"{word} " + " ".join(map(str, numbers)), f"{word} {start}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = np.random.default_rng(12345)
    path = tmp_path_factory.mktemp("corpus") / "counting.txt"
    path.write_text("\n".join(counting_line(rng)[0] for _ in range(3000)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory) -> Path:
    """A model trained through the CLI (tokenizer trained by train-model itself, no -t)."""
    run_dir = tmp_path_factory.mktemp("runs") / "counting"
    code = main(
        [
            "train-model",
            str(corpus),
            "-o",
            str(run_dir),
            *SMALL,
            "--batch-size",
            "32",
            "--steps",
            "400",
            "--lr",
            "5e-3",
            "--warmup-steps",
            "20",
            "--eval-interval",
            "100",
            "--quiet",
        ]
    )
    assert code == 0
    return run_dir


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, fragment: str) -> None:
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in err


# --- learning --------------------------------------------------------------------------------


def test_learns_the_counting_rule_on_held_out_lines(run):
    model, tok, meta = load_model(run)
    rng = np.random.default_rng(999)  # lines the training corpus never had in this order
    correct = total = 0
    previous, _ = counting_line(rng)
    for _ in range(150):
        line, prefix = counting_line(rng)
        context = tok.encode(previous + "\n")
        fixed_from = len(context) + len(tok.encode(prefix))  # first rule-determined position
        ids = context + tok.encode(line + "\n")
        ids = ids[-model.config.context_length :]
        fixed_from -= len(context) + len(tok.encode(line + "\n")) - len(ids)
        logits = model.forward(np.array(ids[:-1])[None, :])[0]  # (T-1, V)
        guess = logits.argmax(-1)
        targets = np.array(ids[1:])
        positions = np.arange(max(fixed_from - 1, 0), len(targets))
        correct += int((guess[positions] == targets[positions]).sum())
        total += len(positions)
        previous = line
    accuracy = correct / total
    assert accuracy >= 0.95, f"next-token accuracy {accuracy:.3f} on {total} rule-determined tokens"
    assert meta["best_val_loss"] < meta["provenance"]["unigram_baseline"] / 3


def test_predict_next_table_matches_the_model(run, capsys):
    code, out, _ = cli(capsys, "predict-next", "-m", str(run), "up 23 24 25", "--top-k", "4")
    assert code == 0
    model, tok, _ = load_model(run)
    logits = model.forward(np.array(tok.encode("up 23 24 25"))[None, :])[0, -1].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    best = int(np.argmax(probs))
    assert tok.decode([best]) == " 26"
    assert out.splitlines()[0] == f"next token: ' 26' (id {best}, p = {probs[best]:.4f})"
    rows = [line.split() for line in out.splitlines()[3:]]
    assert len(rows) == 4
    assert [int(r[1]) for r in rows] == sorted(range(len(probs)), key=lambda i: -probs[i])[:4]
    assert [float(r[2]) for r in rows] == [round(float(probs[int(r[1])]), 4) for r in rows]


def test_generate_streams_the_rule(run, capsys):
    code, out, _ = cli(capsys, "generate", "-m", str(run), "down 57", "-n", "7", "--temperature", "0")
    assert code == 0
    assert out.startswith("down 57 56 55 54 53 52 51 50")
    code, again, _ = cli(
        capsys,
        "generate",
        "-m",
        str(run / "model.safetensors"),
        "up 3",
        "-n",
        "12",
        "--temperature",
        "0.7",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
        "--seed",
        "3",
    )
    code2, same, _ = cli(
        capsys,
        "generate",
        "-m",
        str(run),
        "up 3",
        "-n",
        "12",
        "--temperature",
        "0.7",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
        "--seed",
        "3",
    )
    assert code == code2 == 0 and again == same and again.startswith("up 3")


def test_generate_holds_partial_utf8_until_the_character_completes():
    from tokenkit.bpe import Tokenizer
    from tokenkit.pipeline.run import generate

    tok = Tokenizer([])  # byte-level: every multi-byte character takes several tokens

    class Bytes:
        """Stands in for a model that emits the bytes of 'é€!' one token at a time."""

        class config:
            context_length = 8
            vocab_size = 256  # the tokenizer's: no padding

        def generate(self, ids, max_new_tokens, **kwargs):
            yield from "é€!".encode()[:max_new_tokens]

    assert list(generate(Bytes(), tok, "a", max_new_tokens=6)) == ["é", "€", "!"]
    assert list(generate(Bytes(), tok, "a", max_new_tokens=4)) == ["é", "\ufffd"]  # cut mid-character


def test_info_on_model_tokenizer_state_and_run_dir(run, capsys):
    model, tok, meta = load_model(run)
    n_params = sum(p.size for p in model.params.values())
    for target in (run, run / "model.safetensors"):
        code, out, _ = cli(capsys, "info", str(target))
        assert code == 0
        assert f"parameters:           {n_params:,}" in out
        assert f"training step:        {meta['step']}" in out
        assert f"vocab size:           {tok.vocab_size}" in out
        assert "provenance" not in out or "corpus" in out
    code, out, _ = cli(capsys, "info", str(run / "tokenizer.safetensors"))
    assert code == 0 and f"vocab size:           {tok.vocab_size}" in out and "tokenizer" in out
    code, out, _ = cli(capsys, "info", str(run / "train_state.safetensors"))
    assert code == 0 and "training step:        400 of 400" in out


# --- bad input -------------------------------------------------------------------------------


def test_missing_and_foreign_model_files(run, tmp_path, capsys):
    code, _, err = cli(capsys, "predict-next", "-m", str(tmp_path / "nope.safetensors"), "up 1")
    assert_one_line_error(code, err, "not found")
    code, _, err = cli(capsys, "generate", "-m", str(tmp_path), "up 1")
    assert_one_line_error(code, err, "no model.safetensors")
    code, _, err = cli(capsys, "predict-next", "-m", str(run / "tokenizer.safetensors"), "up 1")
    assert_one_line_error(code, err, "tokenizer file, not a model")
    text = tmp_path / "notes.txt"
    text.write_text("hello", encoding="utf-8")
    code, _, err = cli(capsys, "generate", "-m", str(text), "up 1")
    assert_one_line_error(code, err, "not a safetensors file")
    from safetensors.numpy import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, str(foreign))
    code, _, err = cli(capsys, "predict-next", "-m", str(foreign), "up 1")
    assert_one_line_error(code, err, "not a tokenkit.model file")
    code, _, err = cli(capsys, "info", str(foreign))
    assert_one_line_error(code, err, "not a tokenkit tokenizer, model or training-state file")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((run / "model.safetensors").read_bytes()[:-100])
    code, _, err = cli(capsys, "predict-next", "-m", str(truncated), "up 1")
    assert_one_line_error(code, err, str(truncated))


def test_empty_prompt_and_bad_sampling_flags(run, capsys):
    for command in ("predict-next", "generate"):
        code, out, err = cli(capsys, command, "-m", str(run), "")
        assert_one_line_error(code, err, "prompt is empty")
        assert out == ""
    code, _, err = cli(capsys, "generate", "-m", str(run), "up 1", "--top-p", "1.5")
    assert_one_line_error(code, err, "--top-p")
    code, _, err = cli(capsys, "predict-next", "-m", str(run), "up 1", "--top-k", "0")
    assert_one_line_error(code, err, "--top-k")


def test_prompt_longer_than_context_is_cropped_with_a_warning(run, capsys):
    long = " ".join(["up 1 2 3 4 5 6 7 8 9 10"] * 10) + " up 41 42"
    code, out, err = cli(capsys, "predict-next", "-m", str(run), long, "--top-k", "3")
    assert code == 0
    assert err.count("\n") == 1 and err.startswith("warning: the text is") and "using its last 16" in err
    assert out.startswith("next token: ' 43'")
    code, out, err = cli(capsys, "generate", "-m", str(run), long, "-n", "3", "--temperature", "0")
    assert code == 0 and "warning: the text is" in err and "Traceback" not in err
    assert out.startswith(long + " 43 44 45")


def test_resume_flags_contradicting_the_checkpoint(run, corpus, tmp_path, capsys):
    code, _, err = cli(capsys, "train-model", "--resume", str(run), "--d-model", "32")
    assert_one_line_error(code, err, "--d-model 32 contradicts the checkpoint")
    code, _, err = cli(capsys, "train-model", str(corpus), "-o", str(run), "--resume", "--steps", "999")
    assert_one_line_error(code, err, "--steps 999 contradicts the checkpoint")
    other = tmp_path / "other.txt"
    other.write_text("up 1 2 3 4 5 6 7 8 9 10\n" * 50, encoding="utf-8")
    code, _, err = cli(capsys, "train-model", str(other), "--resume", str(run))
    assert_one_line_error(code, err, "is not the one")
    code, _, err = cli(capsys, "train-model", str(corpus), "-o", str(run))
    assert_one_line_error(code, err, "already holds files of another run")
    code, _, err = cli(capsys, "train-model", "--resume", str(tmp_path / "none"))
    assert_one_line_error(code, err, "run directory not found")


def test_other_bad_training_input(corpus, tmp_path, capsys):
    code, _, err = cli(capsys, "train-model", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "r"))
    assert_one_line_error(code, err, "not found")
    code, _, err = cli(
        capsys, "train-model", str(corpus), "-o", str(tmp_path / "r"), "-t", str(tmp_path / "t.safetensors")
    )
    assert_one_line_error(code, err, "tokenizer file not found")
    code, _, err = cli(
        capsys, "train-model", str(corpus), "-o", str(tmp_path / "r"), "--d-model", "30", "--n-heads", "4"
    )
    assert_one_line_error(code, err, "divisible")
    code, _, err = cli(capsys, "train-model", str(corpus), "-o", str(tmp_path / "r"), "--workers", "-1")
    assert_one_line_error(code, err, "--workers must not be negative")
    bad = tmp_path / "bad.toml"
    bad.write_text("learning_rate = 1\n", encoding="utf-8")
    code, _, err = cli(capsys, "train-model", str(corpus), "-o", str(tmp_path / "r"), "--config", str(bad))
    assert_one_line_error(code, err, "unknown training setting 'learning_rate'")
    code, _, err = cli(capsys, "train-model", str(corpus))
    assert_one_line_error(code, err, "missing -o")


# --- resume, interrupts, kills ---------------------------------------------------------------

RESUME_FLAGS = [*SMALL, "--batch-size", "8", "--steps", "24", "--eval-interval", "5", "--warmup-steps", "4", "--quiet"]


def _tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _losses(run_dir: Path) -> list[tuple]:
    return [
        (r["type"], r["step"], r.get("loss"), r.get("val_loss"))
        for r in trainlog.read_log(run_dir / "log.jsonl")
        if r["type"] in ("step", "eval")
    ]


def test_ctrl_c_before_the_first_evaluation_says_what_the_saved_loss_is(corpus, run, tmp_path, monkeypatch, capsys):
    """The model saved at the interrupt is evaluated there: the summary names that loss as what it
    is, and claims no best (none was due), agreeing with the model file's own val loss."""

    restore = signal_at_step(monkeypatch, 3)
    tok = ["-t", str(run / "tokenizer.safetensors")]
    code, out, _ = cli(capsys, "train-model", str(corpus), "-o", str(tmp_path / "r"), *tok, *RESUME_FLAGS)
    assert code == 130
    summary = next(line for line in out.splitlines() if line.startswith("step 3/24"))
    assert "none yet" not in summary and "measured at the interrupt" in summary, summary
    restore()
    code, info, _ = cli(capsys, "info", str(tmp_path / "r" / "model.safetensors"))
    val = summary.split("val loss ")[1].split()[0]
    assert code == 0 and val in info


def test_ctrl_c_then_resume_equals_uninterrupted(corpus, run, tmp_path, monkeypatch, capsys):
    tok = ["-t", str(run / "tokenizer.safetensors")]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(["train-model", str(corpus), "-o", str(whole), *tok, *RESUME_FLAGS]) == 0

    restore = signal_at_step(monkeypatch, 13)
    code, _, err = cli(capsys, "train-model", str(corpus), "-o", str(split), *tok, *RESUME_FLAGS)
    assert code == 130 and "interrupted at step 13/24" in err and "--resume" in err
    assert load_train_state(split / "train_state.safetensors").step == 13
    restore()
    code, out, _ = cli(capsys, "train-model", "--resume", str(split), "--quiet")
    assert code == 0 and "step 24/24" in out

    for name in ("train_state.safetensors", "model.safetensors"):
        a, b = _tensors(whole / name), _tensors(split / name)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), f"{name}:{key} differs"
    assert _losses(whole) == _losses(split)
    assert len(_losses(split)) == 24 + 5


def test_sigkill_at_any_moment_leaves_loadable_checkpoints(corpus, run, tmp_path):
    """Kill a training process (saving every step) at several moments; every time the files load."""
    run_dir = tmp_path / "killed"
    args = [
        sys.executable,
        "-m",
        "tokenkit.cli.main",
        "train-model",
        str(corpus),
        "-o",
        str(run_dir),
        "-t",
        str(run / "tokenizer.safetensors"),
        *SMALL,
        "--batch-size",
        "8",
        "--steps",
        "150",
        "--eval-interval",
        "1",
        "--eval-batches",
        "1",
        "--quiet",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    steps_seen = []
    for attempt, delay in enumerate((0.05, 0.17)):
        cmd = args if attempt == 0 else [*args[:3], "train-model", "--resume", str(run_dir), "--quiet"]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        state = run_dir / "train_state.safetensors"
        start_mtime = state.stat().st_mtime_ns if state.exists() else 0
        while time.monotonic() < deadline and (not state.exists() or state.stat().st_mtime_ns == start_mtime):
            time.sleep(0.01)
        time.sleep(delay)  # somewhere among the per-step saves
        proc.kill()
        proc.wait()
        model, tok, meta = load_model(run_dir)
        state_now = load_train_state(state)
        assert meta["step"] >= 1 and state_now.step >= 1
        steps_seen.append(state_now.step)
    assert steps_seen == sorted(steps_seen)
    code = main(["train-model", "--resume", str(run_dir), "--quiet", "--steps", "150"])
    assert code == 0 and load_train_state(run_dir / "train_state.safetensors").step == 150
    assert not list(run_dir.glob(".*.tmp"))


def test_nan_loss_stops_with_the_last_good_checkpoint(corpus, run, tmp_path, monkeypatch, capsys):
    from tokenkit.transformer.parallel import DataParallel

    real = DataParallel.loss_and_grads
    calls = {"n": 0}

    def diverge_at_step_8(self, x, y, **kw):
        calls["n"] += 1
        loss, grads = real(self, x, y, **kw)
        return (float("nan") if calls["n"] >= 8 else loss), grads

    monkeypatch.setattr(DataParallel, "loss_and_grads", diverge_at_step_8)
    run_dir = tmp_path / "nan"
    code, _, err = cli(
        capsys, "train-model", str(corpus), "-o", str(run_dir), "-t", str(run / "tokenizer.safetensors"), *RESUME_FLAGS
    )
    assert_one_line_error(code, err, "training diverged: loss nan")
    assert "at step 8" in err and "last good checkpoint (step 5)" in err
    model, _, meta = load_model(run_dir)
    assert meta["step"] == 5 and all(np.isfinite(p).all() for p in model.params.values())
    assert load_train_state(run_dir / "train_state.safetensors").step == 5
    assert trainlog.read_log(run_dir / "log.jsonl")[-1]["type"] == "stop"


# --- the pipeline command --------------------------------------------------------------------


def test_pipeline_runs_stages_and_skips_what_is_up_to_date(corpus, tmp_path, capsys):
    run_dir = tmp_path / "pipe"
    flags = [
        *SMALL,
        "--batch-size",
        "8",
        "--warmup-steps",
        "5",
        "--steps",
        "30",
        "--eval-interval",
        "10",
        "--vocab-size",
        "300",
        "-n",
        "8",
    ]
    code, out, err = cli(capsys, "pipeline", str(corpus), "-o", str(run_dir), *flags)
    assert code == 0, err
    assert "tokenizer: training BPE" in err and "encode: encoded" in err
    assert "predict-next" in out and "generate (greedy, 8 tokens)" in out
    first_model = _tensors(run_dir / "model.safetensors")

    long = " ".join(["up 1 2 3 4 5 6 7 8 9 10"] * 10)  # longer than the context: warned of once
    code, out, err = cli(capsys, "pipeline", str(corpus), "-o", str(run_dir), *flags, "--prompt", long)
    assert code == 0
    assert "tokenizer: up to date" in err and "encode: up to date" in err and "train: up to date" in err
    assert err.count("warning: the text is") == 1, err

    (run_dir / "tokens.npy").unlink()  # redo one stage alone
    code, out, err = cli(capsys, "pipeline", str(corpus), "-o", str(run_dir), *flags)
    assert code == 0 and "encode: encoded" in err and "train: up to date" in err

    changed = [*flags[:-4], "--steps", "40", "--vocab-size", "300", "-n", "8"]
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    code, out, err = cli(capsys, "pipeline", str(corpus), "-o", str(run_dir), *changed, "-q")
    assert_one_line_error(code, err, "training settings changed); pass --overwrite")
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before  # nothing touched
    code, out, err = cli(capsys, "pipeline", str(corpus), "-o", str(run_dir), *changed, "--overwrite")
    assert code == 0 and "training settings changed" in err
    assert json.loads((run_dir / "pipeline.json").read_text(encoding="utf-8"))["vocab_size"] == 300
    assert not np.array_equal(_tensors(run_dir / "model.safetensors")["wte.weight"], first_model["wte.weight"])


def test_every_model_flag_reaches_the_checkpoint(corpus, run, tmp_path, capsys):
    run_dir = tmp_path / "variant"
    code, out, _ = cli(
        capsys,
        "train-model",
        str(corpus),
        "-o",
        str(run_dir),
        "-t",
        str(run / "tokenizer.safetensors"),
        "--n-layers",
        "1",
        "--n-heads",
        "4",
        "--d-model",
        "32",
        "--context-length",
        "12",
        "--positional",
        "sinusoidal",
        "--activation",
        "relu",
        "--norm",
        "post",
        "--no-bias",
        "--batch-size",
        "4",
        "--steps",
        "6",
        "--warmup-steps",
        "2",
        "--eval-interval",
        "3",
        "--eval-batches",
        "2",
        "--seed",
        "7",
        "--workers",
        "1",
        "--quiet",
    )
    assert code == 0 and "step 6/6" in out
    model, tok, meta = load_model(run_dir)
    expected = {
        "n_layers": 1,
        "n_heads": 4,
        "d_model": 32,
        "context_length": 12,
        "positional": "sinusoidal",
        "activation": "relu",
        "norm": "post",
        "bias": False,
        "vocab_size": tok.vocab_size,
    }
    assert {k: model.config.to_dict()[k] for k in expected} == expected
    assert not any(name.endswith(".bias") for name in model.params) and "wpe.weight" not in model.params
    assert meta["provenance"]["train_config"]["seed"] == 7 and meta["provenance"]["train_config"]["workers"] == 1


def test_config_file_and_flags(corpus, run, tmp_path, capsys):
    config = tmp_path / "small.toml"
    config.write_text(
        "n_layers = 1\nd_model = 32\nn_heads = 2\ncontext_length = 12\nbatch_size = 4\n"
        "steps = 4\nwarmup_steps = 1\neval_interval = 2\nlr = 0.01\n",
        encoding="utf-8",
    )
    run_dir = tmp_path / "fromfile"
    code, _, _ = cli(
        capsys,
        "train-model",
        str(corpus),
        "-o",
        str(run_dir),
        "-t",
        str(run / "tokenizer.safetensors"),
        "--config",
        str(config),
        "--lr",
        "0.02",
        "--quiet",
    )
    assert code == 0
    state = load_train_state(run_dir / "train_state.safetensors")
    assert state.train_config["d_model"] == 32 and state.train_config["lr"] == 0.02  # the flag wins over the file
    code, out, _ = cli(capsys, "train-model", "--resume", str(run_dir), "--config", str(config), "--lr", "0.02")
    assert code == 0  # the same settings again are no contradiction


def test_pipeline_after_ctrl_c_resumes_training(corpus, tmp_path, monkeypatch, capsys):

    run_dir = tmp_path / "pipe"
    flags = [
        *SMALL,
        "--batch-size",
        "4",
        "--warmup-steps",
        "2",
        "--steps",
        "12",
        "--eval-interval",
        "6",
        "--vocab-size",
        "280",
        "-n",
        "4",
    ]
    restore = signal_at_step(monkeypatch, 4)
    code, out, err = cli(capsys, "pipeline", str(corpus), "-o", str(run_dir), *flags)
    assert code == 130 and "interrupted at step 4/12" in err and "predict-next" not in out
    restore()
    code, out, err = cli(capsys, "pipeline", str(corpus), "-o", str(run_dir), *flags)
    assert code == 0 and "resuming" in err and "step 12/12" in out and "generate (greedy, 4 tokens)" in out


def test_short_run_gets_a_warmup_that_fits_and_a_finished_run_says_so(corpus, run, tmp_path, capsys):
    run_dir = tmp_path / "short"
    code, _, _ = cli(
        capsys,
        "train-model",
        str(corpus),
        "-o",
        str(run_dir),
        "-t",
        str(run / "tokenizer.safetensors"),
        *SMALL,
        "--batch-size",
        "4",
        "--steps",
        "20",
        "--quiet",
    )
    assert code == 0
    assert load_train_state(run_dir / "train_state.safetensors").train_config["warmup_steps"] == 2
    code, out, _ = cli(capsys, "train-model", "--resume", str(run_dir), "--steps", "20")
    assert code == 0 and out.startswith("step 20/20: nothing left to train")
    code, _, err = cli(
        capsys, "train-model", str(corpus), "-o", str(tmp_path / "x"), "--steps", "20", "--warmup-steps", "30"
    )
    assert_one_line_error(code, err, "--warmup-steps (30) must not exceed --steps (20)")


# --- --device: the commands on the CUDA backend's NumPy twins (no GPU needed) ------------------


@pytest.fixture
def cuda_as_twins(monkeypatch):
    """`--device cuda` runs on the CUDA kernels' NumPy twins: the model's device path (device ops,
    set_params, host_params, host logits) without a GPU."""
    from tokenkit.transformer import backends
    from tokenkit.transformer.backends.cuda_twins import twin_backend

    monkeypatch.setitem(backends._BACKENDS, "cuda", twin_backend())


def test_device_cuda_trains_resumes_on_cpu_and_predicts_on_either(capsys, tmp_path, corpus, run, cuda_as_twins):
    tokenizer = run / "tokenizer.safetensors"
    flags = [*SMALL, "--batch-size", "4", "--steps", "12", "--eval-interval", "6", "--warmup-steps", "2", "--quiet"]
    cpu_run, gpu_run = tmp_path / "cpu", tmp_path / "gpu"
    assert (
        cli(capsys, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(cpu_run), "--workers", "1", *flags)[0]
        == 0
    )
    code, out, err = cli(
        capsys, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(gpu_run), "--device", "cuda", *flags
    )
    assert code == 0, err
    cpu_state = load_train_state(cpu_run / "train_state.safetensors")
    gpu_state = load_train_state(gpu_run / "train_state.safetensors")
    assert gpu_state.step == 12
    for name, p in cpu_state.params.items():  # the same training, other kernels: close, not the same bits
        np.testing.assert_allclose(gpu_state.params[name], p, rtol=1e-3, atol=1e-4, err_msg=name)
    assert any(not np.array_equal(gpu_state.params[name], p) for name, p in cpu_state.params.items())

    code, out, err = cli(capsys, "train-model", "--resume", str(gpu_run), "--steps", "12", "--quiet")
    assert code == 0 and "nothing left to train" in out, err
    code, on_gpu, err = cli(capsys, "predict-next", "-m", str(gpu_run), "up 3 4", "--json", "--device", "cuda")
    assert code == 0, err
    code, on_cpu, err = cli(capsys, "predict-next", "-m", str(gpu_run), "up 3 4", "--json")
    assert code == 0, err
    gpu_top, cpu_top = json.loads(on_gpu)["top"], json.loads(on_cpu)["top"]
    assert [t["id"] for t in gpu_top[:3]] == [t["id"] for t in cpu_top[:3]]
    np.testing.assert_allclose([t["p"] for t in gpu_top], [t["p"] for t in cpu_top], rtol=1e-4)


def test_device_cuda_refuses_workers_in_one_line(capsys, tmp_path, corpus, run, cuda_as_twins):
    tokenizer = run / "tokenizer.safetensors"
    code, _, err = cli(
        capsys,
        "train-model",
        str(corpus),
        "-t",
        str(tokenizer),
        "-o",
        str(tmp_path / "r"),
        "--device",
        "cuda",
        "--workers",
        "2",
        *SMALL,
    )
    assert code != 0 and "drop --workers" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


# --- --arch llama: Llama's family through train-model and pipeline ------------------------------


@pytest.fixture(scope="module")
def small_tokenizer(corpus, tmp_path_factory) -> Path:
    from tokenkit.bpe import Tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.safetensors"
    Tokenizer.train([corpus.read_bytes()[:20_000]], vocab_size=300, workers=1, quiet=True).save(path)
    return path


TINY_RUN = ["--n-layers", "1", "--n-heads", "4", "--d-model", "32", "--context-length", "12", "--batch-size", "4",
            "--warmup-steps", "1", "--eval-interval", "3", "--eval-batches", "1", "--workers", "1",
            "--quiet"]  # fmt: skip


def test_arch_llama_trains_records_resumes_and_starts_others(corpus, small_tokenizer, tmp_path, capsys):
    run_dir = tmp_path / "llama"
    argv = ["train-model", str(corpus), "-t", str(small_tokenizer), "-o", str(run_dir), *TINY_RUN]
    code, out, err = cli(capsys, *argv, "--arch", "llama", "--n-kv-heads", "2", "--steps", "6")
    assert code == 0 and "step 6/6" in out, err
    model, _, meta = load_model(run_dir)
    cfg = model.config
    assert (cfg.architecture, cfg.kv_heads, cfg.positional, cfg.norm_type, cfg.activation) == (
        "llama", 2, "rope", "rmsnorm", "swiglu")  # fmt: skip
    assert "lm_head.weight" in model.params and not any(k.endswith(".bias") for k in model.params)
    recorded = json.loads(checkpoint.read_header(run_dir / "model.safetensors")["config"])
    assert recorded["n_kv_heads"] == 2 and recorded["tie_embeddings"] is False  # the file says the architecture
    state = load_train_state(run_dir / "train_state.safetensors")
    assert state.train_config["arch"] == "llama" and state.model_config == cfg.to_dict()
    code, out, _ = cli(capsys, "info", str(run_dir / "model.safetensors"))
    assert code == 0 and "architecture:         llama" in out
    code, out, err = cli(capsys, "train-model", "--resume", str(run_dir), "--arch", "llama", "--n-kv-heads", "2")
    assert code == 0 and "nothing left to train" in out, err
    code, _, err = cli(capsys, "train-model", "--resume", str(run_dir), "--arch", "gpt2")
    assert_one_line_error(code, err, "--arch gpt2 contradicts the checkpoint")
    code, out, err = cli(capsys, "generate", "-m", str(run_dir), "up 3", "-n", "20", "--temperature", "0")
    assert code == 0, err  # past the 12-token context: the window shifts, the KV cache holds 2 heads

    tuned = tmp_path / "tuned"  # --init-from takes the model's shape, its family included
    code, out, err = cli(capsys, "train-model", str(corpus), "--init-from", str(run_dir), "-o", str(tuned),
                         "--steps", "3", "--eval-interval", "3", "--batch-size", "4", "--workers", "1",
                         "--quiet")  # fmt: skip
    assert code == 0, err
    assert load_model(tuned).model.config == cfg
    assert load_train_state(tuned / "train_state.safetensors").train_config["arch"] == "llama"
    code, _, err = cli(capsys, "train-model", str(corpus), "--init-from", str(run_dir), "-o", str(tmp_path / "x"),
                       "--arch", "gpt2")  # fmt: skip
    assert_one_line_error(code, err, "--arch gpt2 contradicts the model")
    code, _, err = cli(capsys, "train-model", str(corpus), "-t", str(small_tokenizer), "-o", str(tmp_path / "y"),
                       "--arch", "llama", "--n-kv-heads", "3")  # fmt: skip
    assert_one_line_error(code, err, "must be divisible by n_kv_heads")


# Llama 3.1's scaling at theta 100 on heads of 8 (wavelengths 6.3, 19.9, 63, 199): under 16 / 4
# kept, over 16 / 1 divided by 8, 6.3 blended
ROPE_LLAMA3 = ["--arch", "llama", "--rope-theta", "100", "--rope-scaling", "llama3", "--rope-factor", "8",
               "--rope-original-context-length", "16"]  # fmt: skip


def test_rope_scaling_flags_train_record_resume_and_show(corpus, small_tokenizer, tmp_path, capsys):
    """--rope-scaling and its numbers make a fresh run's model scaled; the run records them, so
    --resume rebuilds the same model (a contradicting flag is one line), `tk info` says the
    scaling, and the same settings from a --config file give the same run, bit for bit."""
    run_dir = tmp_path / "scaled"
    argv = ["train-model", str(corpus), "-t", str(small_tokenizer), *TINY_RUN, "--steps", "3"]
    code, out, err = cli(capsys, *argv, "-o", str(run_dir), *ROPE_LLAMA3)
    assert code == 0 and "step 3/3" in out, err
    model = load_model(run_dir).model
    want = dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=16)
    assert model.config.rope_scaling.to_dict() == want and model.config.architecture == "llama"
    recorded = json.loads(checkpoint.read_header(run_dir / "model.safetensors")["config"])
    assert recorded["rope_scaling"] == want
    state = load_train_state(run_dir / "train_state.safetensors")
    assert (state.train_config["rope_scaling"], state.train_config["rope_factor"]) == ("llama3", 8.0)
    assert state.model_config == model.config.to_dict()
    for path in (run_dir, run_dir / "train_state.safetensors"):
        code, out, _ = cli(capsys, "info", str(path))
        assert code == 0 and "rope scaling:         llama3 scaling: frequencies of wavelengths over 16" in out
    code, out, err = cli(capsys, "train-model", "--resume", str(run_dir), *ROPE_LLAMA3)
    assert code == 0 and "nothing left to train" in out, err
    for flag, value, old in (("--rope-factor", "4", "8.0"), ("--rope-scaling", "none", "llama3")):
        code, _, err = cli(capsys, "train-model", "--resume", str(run_dir), flag, value)
        assert_one_line_error(code, err, f"{flag} {value}")
        assert f"contradicts the checkpoint in {run_dir} ({old})" in err
    settings = tmp_path / "rope.toml"
    settings.write_text('arch = "llama"\nrope_theta = 100.0\nrope_scaling = "llama3"\nrope_factor = 8.0\n'
                        "rope_original_context_length = 16\n", encoding="utf-8")  # fmt: skip
    code, _, err = cli(capsys, *argv, "-o", str(tmp_path / "from-file"), "--config", str(settings))
    assert code == 0, err
    a, b = _tensors(run_dir / "train_state.safetensors"), _tensors(tmp_path / "from-file" / "train_state.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--arch", "llama", "--rope-scaling", "llama3"], "--rope-scaling llama3 needs a --rope-factor above 1"),
        (["--arch", "llama", "--rope-factor", "8"],
         "--rope-factor 8 needs --rope-scaling linear or llama3 (it is none)"),
        (["--arch", "llama", "--rope-scaling", "linear", "--rope-factor", "2", "--rope-low-freq-factor", "2"],
         "--rope-low-freq-factor 2 needs --rope-scaling llama3 (it is linear)"),
        (["--rope-scaling", "linear", "--rope-factor", "2"],
         "--rope-scaling linear stretches rotary positions, and --positional is learned"),
        ([*ROPE_LLAMA3, "--rope-high-freq-factor", "0.5"],
         "--rope-high-freq-factor (0.5) must be above --rope-low-freq-factor (1)"),
        (["--arch", "llama", "--rope-scaling", "yarn"], "'yarn' is not one of 'none', 'linear', 'llama3'"),
        (["--rope-factor", "0.5"], "--rope-factor must be at least 1, got 0.5"),
        (["--rope-factor", "inf"], "--rope-factor must be a finite number"),
        (["--rope-low-freq-factor", "0"], "--rope-low-freq-factor must be positive"),
        (["--rope-original-context-length", "1e5"], "1e5 is not a whole number"),
        (["--rope-original-context-length", "100000"], "--rope-original-context-length must be at most 65,536"),
    ],
)  # fmt: skip
def test_bad_rope_scaling_flags_are_one_line_before_any_work(flags, fragment, corpus, small_tokenizer, tmp_path,
                                                             capsys):  # fmt: skip
    run_dir = tmp_path / "never"
    code, _, err = cli(capsys, "train-model", str(corpus), "-t", str(small_tokenizer), "-o", str(run_dir), *TINY_RUN,
                       *flags)  # fmt: skip
    assert_one_line_error(code, err, fragment)
    assert not run_dir.exists()


def test_pipeline_with_arch_llama(corpus, tmp_path, capsys):
    run_dir = tmp_path / "pipe"
    argv = ["pipeline", str(corpus), "-o", str(run_dir), "--vocab-size", "300", "--arch", "llama", "--steps", "3",
            "--prompt", "up 1", "-n", "3", *TINY_RUN]  # fmt: skip
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    assert load_model(run_dir).model.config.architecture == "llama"
    code, out, err = cli(capsys, *argv[:-1])  # the same settings: every stage up to date
    assert code == 0 and "train: up to date" in err, err


@pytest.mark.parametrize("scaling", [[], ROPE_LLAMA3[2:]], ids=["unscaled", "llama3-scaled"])
def test_arch_llama_on_the_device_backend(scaling, capsys, tmp_path, corpus, small_tokenizer, cuda_as_twins):
    """--device cuda trains a Llama-style model (on the CUDA ops' NumPy twins here) as the CPU
    does, with a RoPE scaling too (the device's tables are the CPU's)."""
    runs = {}
    for device in ("cpu", "cuda"):
        runs[device] = tmp_path / device
        code, _, err = cli(capsys, "train-model", str(corpus), "-t", str(small_tokenizer), "-o", str(runs[device]),
                           "--arch", "llama", "--n-kv-heads", "1", "--steps", "3", "--device", device,
                           *TINY_RUN, *scaling)  # fmt: skip
        assert code == 0, err
    cpu, gpu = (load_train_state(runs[d] / "train_state.safetensors") for d in ("cpu", "cuda"))
    assert ("rope_scaling" in gpu.model_config) is bool(scaling) and gpu.model_config == cpu.model_config
    for name, p in cpu.params.items():
        np.testing.assert_allclose(gpu.params[name], p, rtol=1e-3, atol=1e-4, err_msg=name)


def test_tokenizer_commands_take_a_run_directory_or_model_file(capsys, run):
    code, expected, err = cli(capsys, "encode", "-t", str(run / "tokenizer.safetensors"), "up 3 4 5")
    assert code == 0, err
    for source in (run, run / "model.safetensors"):
        assert cli(capsys, "encode", "-t", str(source), "up 3 4 5")[:2] == (0, expected)
    ids = expected.split()
    assert cli(capsys, "decode", "-t", str(run), *ids)[:2] == (0, "up 3 4 5\n")
