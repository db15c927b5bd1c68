"""Training in bits per byte, and a run started --init-from evaluated at step 0 (issue 31).

The log's `val_bits_per_byte` is checked against a plain recomputation from the weights, the
validation ids and the tokenizer (a forward pass, a float64 log-softmax, each target's bytes
looked up one by one); a special token counts no bytes (the run validates on documents joined by
--eot, so its targets hold some). A run --init-from a model logs the base model's loss at step 0:
the same bits as the base run's own evaluation of those weights, never a checkpoint nor a best,
and a run stopped and resumed around it is the uninterrupted run, bit for bit, on one process or
two MPI ranks.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.tokenizer_eval import token_lengths
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint, data, trainlog, val_bytes, views
from tokenkit.pipeline.checkpoint import load_model
from tokenkit.pipeline.train_state import load_train_state
from tokenkit.transformer import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"
SMALL = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--context-length", "16"]
EVALS = ["--batch-size", "8", "--eval-batches", "4", "--workers", "2", "--quiet"]
TUNE = ["--steps", "6", "--eval-interval", "3", "--lr", "0.05", "--warmup-steps", "1", *EVALS]


def tk(*argv: str) -> tuple[int, str]:
    """`tk argv` in this process: (exit code, stdout)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """A training text and a validation directory of stories, one document each (--eot joins them)."""
    d = tmp_path_factory.mktemp("corpus")
    (d / "tales.txt").write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:40_000])
    stories = (REPO / "corpora" / "tiny_tales_test.txt").read_text(encoding="utf-8").split("\n\n")[:30]
    (d / "val").mkdir()
    for i, story in enumerate(stories):
        (d / "val" / f"{i:02d}.txt").write_text(story + " naïve café 日本 😀", encoding="utf-8")  # bytes of 1 to 4
    return {"train": d / "tales.txt", "val": d / "val"}


def corpus_flags(corpus) -> list[str]:
    return [str(corpus["train"]), "--val", str(corpus["val"]), "--eot", EOT]


@pytest.fixture(scope="module")
def base(corpus, tmp_path_factory) -> tuple[Path, str]:
    """A run trained from scratch (its own tokenizer, with the eot token); its stdout."""
    run = tmp_path_factory.mktemp("base") / "run"
    code, out = tk("train-model", *corpus_flags(corpus), "-o", str(run), *SMALL, "--steps", "12",
                   "--eval-interval", "6", "--lr", "0.01", *EVALS)  # fmt: skip
    assert code == 0
    return run, out


@pytest.fixture(scope="module")
def tuned(corpus, base, tmp_path_factory) -> Path:
    """A run started --init-from the base run's model."""
    run = tmp_path_factory.mktemp("tuned") / "run"
    code, _ = tk("train-model", *corpus_flags(corpus), "--init-from", str(base[0]), "-o", str(run), *TUNE)
    assert code == 0
    return run


def evals(run: Path) -> list[dict]:
    return [r for r in trainlog.read_log(run / checkpoint.LOG_FILE) if r["type"] == "eval"]


def plain_evaluation(params, model_config: dict, run: Path, tok: Tokenizer) -> dict:
    """The validation loss and bits per byte from scratch: the run's eval batches (whole), each
    target's cross-entropy from a float64 log-softmax of the model's logits, each target's bytes
    from the tokenizer one id at a time (a special token: none)."""
    cfg = json.loads(checkpoint.read_header(run / checkpoint.MODEL_FILE)["provenance"])["train_config"]
    model = GPT(GPTConfig.from_dict(model_config))
    model.set_params(params)
    val_ids = np.load(run / checkpoint.VAL_TOKENS_FILE)
    batches = data.eval_batches(val_ids, cfg["eval_batches"], cfg["batch_size"], cfg["context_length"], cfg["seed"])
    specials = set(tok.special_tokens.values())
    nats, n, n_bytes, n_special, special_text = 0.0, 0, 0, 0, 0
    for x, y in batches:
        logits = model.forward(x).astype(np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        nats -= float(np.take_along_axis(logp, y[..., None], -1).sum())
        n += y.size
        for t in y.ravel().tolist():
            if t in specials:
                n_special += 1
                special_text += len(tok.decode_bytes([t]))
            else:
                n_bytes += len(tok.decode_bytes([t]))
    return {"loss": nats / n, "bpb": nats / math.log(2) / n_bytes, "n": n, "bytes": n_bytes,
            "specials": n_special, "special_text": special_text}  # fmt: skip


# ----------------------------------------------------------------------------- bits per byte


@pytest.mark.parametrize("seed", range(6))
def test_token_bytes_add_up_to_the_texts_bytes_and_a_special_token_to_none(seed):
    """The defect class: a token counted with the wrong bytes (part of a character, a special
    token's text, an id past the vocabulary's regular tokens in a listed vocabulary)."""
    from test_listed_vocab import random_listed

    rng = random.Random(seed)
    trained = Tokenizer.train(
        [(REPO / "corpora" / "tiny_tales.txt").read_bytes()[:5000] + "日本 😀 é".encode()],
        vocab_size=300, special_tokens=[EOT], workers=1, quiet=True,
    )  # fmt: skip
    for tok, alphabet in ((trained, "ab é日本😀\n"), (random_listed(rng, ignore_merges=False), "abc 1\n")):
        lengths = token_lengths(tok)
        assert lengths.shape == (tok.vocab_size,) and all(lengths[i] == 0 for i in tok.special_tokens.values())
        eot = next(iter(tok.special_tokens.values()))
        docs = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(5)]
        ids: list[int] = []
        for doc in docs:
            ids += tok.encode(doc) + [eot]
        assert int(lengths[ids].sum()) == sum(len(d.encode("utf-8")) for d in docs)
        y = np.array(ids[: len(ids) // 2 * 2]).reshape(2, -1)
        assert val_bytes.target_bytes([(None, y)], lengths) == int(lengths[y].sum())
    assert val_bytes.bits_per_byte(1.0, 10, 0) is None


def test_the_logged_bits_per_byte_is_a_plain_recomputation(base):
    run, out = base
    state = load_train_state(run / checkpoint.STATE_FILE)  # the last step's weights: the last evaluation's
    _, tok, _ = load_model(run)
    plain = plain_evaluation(state.params, state.model_config, run, tok)
    assert plain["specials"] > 0 and plain["special_text"] > 0  # the eot is among the targets: the choice shows
    records = evals(run)
    assert [r["step"] for r in records] == [6, 12]
    last = records[-1]
    assert last["val_loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert last["val_bits_per_byte"] == pytest.approx(plain["bpb"], rel=1e-5)
    # counting the eot's text would be another figure, farther than the float32 forward's error
    with_text = plain["loss"] * plain["n"] / math.log(2) / (plain["bytes"] + plain["special_text"])
    assert abs(with_text - plain["bpb"]) > 1e-3 * plain["bpb"]
    for r in records:  # each evaluation: exactly the formula of its own loss
        assert r["val_bits_per_byte"] == r["val_loss"] * plain["n"] / math.log(2) / plain["bytes"]
    summary = next(line for line in out.splitlines() if line.startswith("step 12/12"))
    assert f"val loss {last['val_loss']:.4f} ({last['val_bits_per_byte']:.4f} bits/byte; best " in summary


def test_an_old_log_without_bits_per_byte_still_reads(base, tmp_path):
    """A log written before the field (and one where it is damaged) reads; the view says None."""
    run = tmp_path / "run"
    run.mkdir()
    records = trainlog.read_log(base[0] / checkpoint.LOG_FILE)
    lines = []
    for r in records:
        if r["type"] == "eval":
            r = {k: v for k, v in r.items() if k != "val_bits_per_byte"}
            if r["step"] == 12:
                r["val_bits_per_byte"] = "high"  # damaged: the number is missing, the point stays
        lines.append(json.dumps(r))
    (run / checkpoint.LOG_FILE).write_text("\n".join(lines) + "\n")
    doc = views.training_view(run, name="old")
    assert doc["val"] == [{"step": r["step"], "val_loss": r["val_loss"], "val_bits_per_byte": None}
                          for r in records if r["type"] == "eval"]  # fmt: skip
    assert doc["damaged_lines"] == 0 and doc["evaluations"] == [] and doc["evaluations_error"] is None
    fresh = views.training_view(base[0], name="new")
    assert [v["val_bits_per_byte"] for v in fresh["val"]] == [r["val_bits_per_byte"] for r in evals(base[0])]


# ----------------------------------------------------------------------------- --init-from: step 0


def test_init_from_logs_the_base_models_loss_at_step_0(base, tuned):
    base_run = base[0]
    records = evals(tuned)
    assert [r["step"] for r in records] == [0, 3, 6]
    first = records[0]
    # the base run's model file holds its best weights; the tuned run evaluates them on the same batches
    base_meta = load_model(base_run).metadata
    best = next(r for r in evals(base_run) if r["step"] == base_meta["step"])
    assert (first["val_loss"], first["val_bits_per_byte"]) == (best["val_loss"], best["val_bits_per_byte"])
    model, tok, _ = load_model(base_run)
    plain = plain_evaluation(model.params, model.config.to_dict(), tuned, tok)
    assert first["val_loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert first["val_bits_per_byte"] == pytest.approx(plain["bpb"], rel=1e-5)
    # not a best: the run's best is among the weights it trained, even when the base was better
    assert first["best_val_loss"] is None
    trained = [r for r in records if r["step"] > 0]
    state = load_train_state(tuned / checkpoint.STATE_FILE)
    assert state.best_step > 0 and state.best_val_loss == min(r["val_loss"] for r in trained)
    assert load_model(tuned).metadata["step"] == state.best_step
    assert min(r["val_loss"] for r in trained) > first["val_loss"], "the case of a better base is not exercised"
    doc = views.training_view(tuned, name="tuned")
    assert doc["val"][0] == {"step": 0, "val_loss": first["val_loss"], "val_bits_per_byte": first["val_bits_per_byte"]}


def test_a_fresh_run_does_not_evaluate_at_step_0(base):
    assert all(r["step"] > 0 for r in evals(base[0]))


def _same_run(a: Path, b: Path) -> None:
    from safetensors.numpy import load_file

    for name in (checkpoint.STATE_FILE, checkpoint.MODEL_FILE):
        x, y = load_file(str(a / name)), load_file(str(b / name))
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x), name
    keep = ("type", "step", "loss", "val_loss", "val_bits_per_byte", "best_val_loss")

    def numbers(run):
        return [
            tuple(r.get(k) for k in keep)
            for r in trainlog.read_log(run / checkpoint.LOG_FILE)
            if r["type"] in ("step", "eval")
        ]

    assert numbers(a) == numbers(b)


@pytest.mark.parametrize("stop_in", ["the step-0 evaluation", "step 4"])
def test_init_from_stopped_and_resumed_is_the_uninterrupted_run(corpus, base, tuned, tmp_path, monkeypatch, stop_in):
    from tokenkit.transformer.parallel import DataParallel

    method = "loss" if stop_in == "the step-0 evaluation" else "loss_and_grads"
    real = getattr(DataParallel, method)
    calls = {"n": 0}

    def ctrl_c(self, x, y, **kw):
        calls["n"] += 1
        if calls["n"] == (1 if method == "loss" else 4):
            os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C in its middle
        return real(self, x, y, **kw)

    run = tmp_path / "run"
    monkeypatch.setattr(DataParallel, method, ctrl_c)
    code, _ = tk("train-model", *corpus_flags(corpus), "--init-from", str(base[0]), "-o", str(run), *TUNE)
    assert code == 130
    monkeypatch.setattr(DataParallel, method, real)
    assert load_train_state(run / checkpoint.STATE_FILE).step == (0 if method == "loss" else 4)
    code, out = tk("train-model", "--resume", str(run), "--quiet")
    assert code == 0 and "step 6/6" in out
    _same_run(run, tuned)
    assert [r["step"] for r in evals(run)] == [0, 3, 6]  # the base's evaluation once, not again at the resume


def test_init_from_on_mpi_ranks_logs_the_one_process_bits(corpus, base, tuned, tmp_path):
    """Two ranks of one worker each: the step-0 evaluation and every later one in the same bits as
    one process of two workers (the tuned run)."""
    from test_mpi import _mpirun  # mpirun's path, or a skip without mpi4py or mpirun

    run = tmp_path / "run"
    flags = " ".join(TUNE).replace("--workers 2", "--workers 1").split()  # under mpirun: each rank's workers
    cmd = [_mpirun(), "-n", "2", sys.executable, "-m", "tokenkit.cli.main", "train-model", *corpus_flags(corpus),
           "--init-from", str(base[0]), "-o", str(run), *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert evals(run) == evals(tuned)
    _same_run(run, tuned)
