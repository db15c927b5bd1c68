"""Supervised fine-tuning on conversations: `tk train-model --chat DATA.jsonl --init-from BASE` (issue 32).

Checked: packing against a plain next-fit packer (every conversation whole, in one row, in order;
the mask where the template put it), the refusal of a conversation one token longer than a row,
the batches' targets (IGNORE exactly where the mask is 0, the whole batch's count on an MPI
rank's share), a run's first logged loss against a plain recomputation (the grown base model in
float64, the batch drawn from the seeded generator, the cross-entropy over the assistant's tokens
alone), the chat tokens and grown rows in the run's files, a run stopped and resumed against the
uninterrupted run bit for bit, two MPI ranks against one process (skipped without mpirun), and
every refusal in one line, before the run directory is touched.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.chat_template import CHAT_TOKENS, add_chat_tokens
from tokenkit.cli.main import main
from tokenkit.pipeline import chat_data, checkpoint, trainlog
from tokenkit.pipeline.checkpoint import load_model
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.train_state import load_train_state
from tokenkit.transformer import GPT
from tokenkit.transformer import reference as ref
from tokenkit.transformer.loss import IGNORE
from tokenkit.transformer.vocab import grow_vocab

REPO = Path(__file__).resolve().parents[1]
T = 64
SMALL = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--context-length", str(T)]
TUNE = ["--steps", "8", "--eval-interval", "4", "--batch-size", "6", "--eval-batches", "2", "--lr", "0.01",
        "--warmup-steps", "1", "--workers", "2", "--seed", "5", "--quiet"]  # fmt: skip


def tk(*argv: str) -> tuple[int, str]:
    """`tk argv` in this process: (exit code, stdout)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Short question-and-answer conversations about a hero and a find, some of two turns, some
    with a system message."""
    rng = random.Random(seed)
    names, things = ["Ben", "Mia", "Otto", "Ada", "Sam"], ["a red ball", "an old key", "a kite"]
    out = []
    for _ in range(n):
        name, thing = rng.choice(names), rng.choice(things)
        messages = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.3 else []
        messages += [{"role": "user", "content": f"{name} found {thing}. Who?"}, {"role": "assistant", "content": name}]
        if rng.random() < 0.5:
            messages += [{"role": "user", "content": "What?"}, {"role": "assistant", "content": thing}]
        out.append({"messages": messages})
    return out


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("chat")
    (d / "tales.txt").write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:30_000])
    tok = Tokenizer.train([d / "tales.txt"], vocab_size=300, quiet=True)
    tok.save(d / "tok.safetensors")
    return {
        "tales": d / "tales.txt",
        "tok": d / "tok.safetensors",
        "chats": write_jsonl(d / "chats.jsonl", conversations(60)),
        "val": write_jsonl(d / "val.jsonl", conversations(8, seed=1)),
    }


@pytest.fixture(scope="module")
def base(files, tmp_path_factory) -> Path:
    """A tiny base model trained on tales (its tokenizer lacks the chat tokens)."""
    run = tmp_path_factory.mktemp("base") / "run"
    code, _ = tk("train-model", str(files["tales"]), "-t", str(files["tok"]), "-o", str(run), *SMALL, "--steps", "6",
                 "--eval-interval", "6", "--batch-size", "4", "--eval-batches", "1", "--quiet")  # fmt: skip
    assert code == 0
    return run


@pytest.fixture(scope="module")
def tuned(files, base, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("tuned") / "run"
    code, out = tk("train-model", "--chat", str(files["chats"]), "--init-from", str(base), "-o", str(run), *TUNE)
    assert code == 0 and "step 8/8" in out
    return run


# ----------------------------------------------------------------------------- packing


def plain_pack(convs: list[tuple[list[int], list[bool]]], row: int) -> list[list[tuple[int, bool]]]:
    """Next-fit, written plainly: rows of (id, counts) pairs, each conversation appended whole."""
    rows: list[list[tuple[int, bool]]] = []
    for ids, mask in convs:
        if not rows or len(rows[-1]) + len(ids) > row:
            rows.append([])
        rows[-1].extend(zip(ids, mask, strict=True))
    return rows


@pytest.mark.parametrize("seed", range(12))
def test_packing_keeps_every_conversation_whole_in_order_as_the_plain_packer(seed):
    rng = np.random.default_rng(seed)
    context = int(rng.integers(1, 20))
    convs = []
    for _ in range(int(rng.integers(1, 30))):
        n = int(rng.integers(1, context + 2))  # up to a whole row
        convs.append((rng.integers(0, 50, n).tolist(), (rng.random(n) < 0.5).tolist()))
    packed = chat_data.pack([(np.array(i), np.array(m, bool)) for i, m in convs], context, 99, np.uint16)
    plain = plain_pack(convs, context + 1)
    assert packed.ids.shape == (len(plain), context + 1) and packed.conversations == len(convs)
    for r, row in enumerate(plain):
        ids = [i for i, _ in row] + [99] * (context + 1 - len(row))
        mask = [m for _, m in row] + [False] * (context + 1 - len(row))
        assert packed.ids[r].tolist() == ids and packed.mask[r].tolist() == mask
    assert packed.counted.tolist() == packed.mask[:, 1:].sum(axis=1).tolist()


def test_a_conversation_longer_than_a_row_is_refused_naming_its_line(tmp_path):
    """Byte-level ids: a user turn of a bytes and an answer of b render to a + b + 4 tokens."""
    tok = add_chat_tokens(Tokenizer([]))

    def chat(a: int, b: int) -> dict:
        return {"messages": [{"role": "user", "content": "u" * a}, {"role": "assistant", "content": "v" * b}]}

    fits = write_jsonl(tmp_path / "fits.jsonl", [chat(1, 1), chat(5, T + 1 - 9), chat(2, 2)])
    data = chat_data.ChatData.load(chat_data.ChatSpec(str(fits)), tok, T, 0.3)
    assert data.train.conversations == 2 and len(data.train) == 2  # the whole row's conversation alone in its row
    assert data.train.ids[1, -1] == tok.special_tokens["<|end|>"] and data.train.mask[1, -1]
    long = write_jsonl(tmp_path / "long.jsonl", [chat(1, 1), chat(2, 2), chat(5, T + 2 - 9)])
    with pytest.raises(PipelineError) as err:
        chat_data.ChatData.load(chat_data.ChatSpec(str(long)), tok, T, 0.3)
    assert str(err.value).startswith(f"{long}:3: the conversation is {T + 2} tokens") and "never cut" in str(err.value)


def test_batches_ignore_exactly_the_masked_targets_and_count_the_whole_batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (7, 9)).astype(np.uint16)
    mask = rng.random((7, 9)) < 0.4
    packed = chat_data.Packed(ids, mask, mask[:, 1:].sum(axis=1), 7)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    x, y, counted = chat_data.get_batch(packed, 5, a)
    xs, ys, counted_share = chat_data.get_batch(packed, 5, b, rows=slice(2, 4))
    picks = np.random.default_rng(3).integers(0, 7, size=5)
    assert np.array_equal(x, ids[picks, :-1]) and counted == counted_share == int(mask[picks, 1:].sum())
    assert np.array_equal(y, np.where(mask[picks, 1:], ids[picks, 1:].astype(np.int64), IGNORE))
    assert np.array_equal(xs, x[2:4]) and np.array_equal(ys, y[2:4])
    assert a.bit_generator.state == b.bit_generator.state  # a rank's share draws the whole batch


# ----------------------------------------------------------------------------- a run


def test_the_first_step_s_loss_is_the_masked_loss_of_the_grown_base(files, base, tuned):
    tok = load_model(tuned).tokenizer
    assert [tok.special_tokens[t] for t in CHAT_TOKENS] == [300, 301, 302, 303]  # appended after the base's
    model, _, _ = load_model(base)
    params, config = grow_vocab({k: v.astype(np.float64) for k, v in model.host_params().items()}, model.config, 304)
    grown = GPT.from_params(config, params)
    grown.params = {k: v.astype(np.float64) for k, v in params.items()}
    data = chat_data.ChatData.load(chat_data.ChatSpec(str(files["chats"])), tok, T, 0.1)
    x, y, counted = chat_data.get_batch(data.train, 6, np.random.default_rng(5))
    plain = ref.softmax_xent(grown.forward(x).reshape(-1, 304), y.reshape(-1))
    records = trainlog.read_log(tuned / checkpoint.LOG_FILE)
    first = next(r for r in records if r["type"] == "step")
    assert first["loss"] == pytest.approx(plain, rel=1e-5)
    assert first["counted"] == counted / (6 * T) and 0 < counted < 6 * T
    assert all("counted" in r for r in records if r["type"] == "step")
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [0, 4, 8] and evals[-1]["val_loss"] < evals[0]["val_loss"]
    state = load_train_state(tuned / checkpoint.STATE_FILE)
    assert state.data["n_conversations"] == 54 and state.data["n_val_conversations"] == 6
    assert state.tokenizer.fingerprint() == tok.fingerprint() and state.model_config["vocab_size"] == 304


def _same_run(a: Path, b: Path) -> None:
    from safetensors.numpy import load_file

    for name in (checkpoint.STATE_FILE, checkpoint.MODEL_FILE):
        x, y = load_file(str(a / name)), load_file(str(b / name))
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x), name

    def numbers(run):
        keep = ("type", "step", "loss", "counted", "grad_norm", "val_loss", "best_val_loss")
        records = trainlog.read_log(run / checkpoint.LOG_FILE)
        return [tuple(r.get(k) for k in keep) for r in records if r["type"] in ("step", "eval")]

    assert numbers(a) == numbers(b)


def test_stopped_and_resumed_is_the_uninterrupted_run(files, base, tuned, tmp_path, monkeypatch):
    from tokenkit.transformer.parallel import DataParallel

    real = DataParallel.loss_and_grads
    calls = {"n": 0}

    def ctrl_c(self, x, y, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C in the step's middle
        return real(self, x, y, **kw)

    run = tmp_path / "run"
    monkeypatch.setattr(DataParallel, "loss_and_grads", ctrl_c)
    code, _ = tk("train-model", "--chat", str(files["chats"]), "--init-from", str(base), "-o", str(run), *TUNE)
    assert code == 130
    monkeypatch.setattr(DataParallel, "loss_and_grads", real)
    assert load_train_state(run / checkpoint.STATE_FILE).step == 3
    code, out = tk("train-model", "--resume", str(run), "--quiet")
    assert code == 0 and "step 8/8" in out
    _same_run(run, tuned)


def test_two_mpi_ranks_are_one_process_of_two_workers(files, base, tuned, tmp_path):
    from test_mpi import _mpirun  # mpirun's path, or a skip without mpi4py or mpirun

    run = tmp_path / "run"
    flags = " ".join(TUNE).replace("--workers 2", "--workers 1").split()  # under mpirun: each rank's workers
    cmd = [_mpirun(), "-n", "2", sys.executable, "-m", "tokenkit.cli.main", "train-model", "--chat",
           str(files["chats"]), "--init-from", str(base), "-o", str(run), *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _same_run(run, tuned)


def test_device_cuda_fine_tunes_on_the_kernels_twins_close_to_the_cpu(files, base, tmp_path, monkeypatch):
    """`--device cuda` on the CUDA kernels' NumPy twins: the loss head's device path (the counted
    rows gathered on the device, the ignored rows' zero gradient) trains as the CPU does: close,
    other kernels."""
    from tokenkit.transformer import backends
    from tokenkit.transformer.backends.cuda_twins import twin_backend

    monkeypatch.setitem(backends._BACKENDS, "cuda", twin_backend())
    runs = {device: tmp_path / device for device in ("cpu", "cuda")}
    for device, run in runs.items():
        workers = "--workers 2" if device == "cpu" else "--workers 1"  # on the GPU: the whole batch at once
        flags = " ".join(TUNE).replace("--workers 2", workers).split()
        code, _ = tk("train-model", "--chat", str(files["chats"]), "--init-from", str(base), "-o", str(run),
                     "--device", device, *flags)  # fmt: skip
        assert code == 0
    cpu, gpu = (load_train_state(run / checkpoint.STATE_FILE) for run in runs.values())
    assert gpu.step == 8
    for name, p in cpu.params.items():
        np.testing.assert_allclose(gpu.params[name], p, rtol=1e-3, atol=1e-4, err_msg=name)


def test_val_file_is_used_recorded_and_checked_on_resume(files, base, tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--chat", str(files["chats"]), "--val", str(files["val"]), "--init-from", str(base), "-o", str(run)]
    code, _ = tk("train-model", *flags, *TUNE[:2], "--eval-interval", "2", "--batch-size", "4", "--quiet")
    assert code == 0
    state = load_train_state(run / checkpoint.STATE_FILE)
    assert state.data["n_conversations"] == 60 and state.data["n_val_conversations"] == 8
    assert state.data["chat"] == {"path": str(files["chats"]), "val": str(files["val"])}
    for shown in (run / checkpoint.STATE_FILE, run):  # tk info: the conversations, not "corpus: None"
        code, out = tk("info", str(shown))
        rows = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        assert code == 0 and "corpus" not in rows, out
        assert rows["conversations"].strip().startswith(str(files["chats"])), out
        assert rows["val conversations"].strip() == str(files["val"]), out
    changed = write_jsonl(tmp_path / "other.jsonl", conversations(8, seed=2))
    capsys.readouterr()
    code, _ = tk("train-model", "--resume", str(run), "--val", str(changed), "--steps", "8")
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "not what" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- refusals


def _bad_lines(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = json.dumps(conversations(1)[0])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{good}\n{good}\n{{not json\n", encoding="utf-8")
    order = tmp_path / "order.jsonl"
    order.write_text(good + "\n" + json.dumps({"messages": [{"role": "assistant", "content": "Hi"}]}) + "\n")
    long = write_jsonl(tmp_path / "long.jsonl", [{"messages": [{"role": "user", "content": "Why? " * 200},
                                                               {"role": "assistant", "content": "No."}]}])  # fmt: skip
    return {
        "a broken line": (bad, f"{bad}:3 is not valid JSON"),
        "a role out of order": (order, f"{order}:2: message 1 is the assistant's"),
        "a conversation longer than a row": (long, f"{long}:1: the conversation is"),
    }


@pytest.mark.parametrize("case", ["a broken line", "a role out of order", "a conversation longer than a row"])
def test_bad_conversations_are_one_line_before_the_run_directory_is_made(base, tmp_path, capsys, case):
    path, start = _bad_lines(tmp_path)[case]
    run = tmp_path / "run"
    loud = [flag for flag in TUNE if flag != "--quiet"]  # no note before the refusal either
    code, _ = tk("train-model", "--chat", str(path), "--init-from", str(base), "-o", str(run), *loud)
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(f"error: {start}") and err.count("\n") == 1, err
    assert not run.exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--chat", "{chats}", "-o", "{run}"], "--init-from MODEL"),
        (["{tales}", "--chat", "{chats}", "--init-from", "{base}", "-o", "{run}"], "drop CORPUS"),
        (["--chat", "{chats}", "--init-from", "{base}", "-t", "{tok}", "-o", "{run}"], "drop -t"),
        (["--chat", "{chats}", "--init-from", "{base}", "--eot", "<|x|>", "-o", "{run}"], "drop --eot"),
        (
            ["--chat", "{chats}", "--init-from", "{base}", "--val", "{val}", "--val", "{val}", "-o", "{run}"],
            "one JSONL",
        ),
        (["--chat", "{chats}", "--init-from", "{base}", "--n-layers", "3", "-o", "{run}"], "--n-layers 3 contradicts"),
    ],
)
def test_flags_that_do_not_fit_chat_are_one_line(files, base, tmp_path, capsys, flags, says):
    run = tmp_path / "run"
    values = {**{k: str(v) for k, v in files.items()}, "base": str(base), "run": str(run)}
    code, _ = tk("train-model", *[f.format(**values) for f in flags])
    err = capsys.readouterr().err
    assert code in (1, 2) and says in err and "Traceback" not in err, err
    assert not run.exists()


def test_resume_of_a_chat_run_refuses_other_data(files, tuned, tmp_path, capsys):
    changed = write_jsonl(tmp_path / "changed.jsonl", conversations(60, seed=9))
    before = (tuned / checkpoint.STATE_FILE).read_bytes()
    for flags, says in [
        (["--chat", str(changed)], "not what"),
        ([str(files["tales"])], "drop CORPUS"),
        (["--chat", str(tmp_path / "gone.jsonl")], "is missing"),
    ]:
        code, _ = tk("train-model", "--resume", str(tuned), *flags)
        err = capsys.readouterr().err
        assert code in (1, 2) and says in err and err.count("\n") == 1, err
    assert (tuned / checkpoint.STATE_FILE).read_bytes() == before


def test_another_run_s_directory_and_a_corpus_run_are_refused_in_one_line(files, base, tuned, capsys):
    before = {p.name: p.read_bytes() for p in tuned.iterdir() if p.is_file()}
    cases = [
        (["--chat", str(files["chats"]), "--init-from", str(base), "-o", str(tuned), *TUNE], "--overwrite"),
        (["--resume", str(base), "--chat", str(files["chats"])], "drop --chat"),
    ]
    for flags, says in cases:
        code, _ = tk("train-model", *flags)
        err = capsys.readouterr().err
        assert code == 1 and says in err and err.count("\n") == 1, err
    assert {p.name: p.read_bytes() for p in tuned.iterdir() if p.is_file()} == before
