"""`mpirun -n N tk eval -m` (held-out text and --task) prints what one process prints, to the last bit.

The MPI runs are subprocesses (`mpirun -n N python SCRIPT ...`), skipped without mpirun or mpi4py
(`pip install -e '.[mpi]'`); their one-process twins run the same script, so the comparison is
between two command lines. The script shrinks the forward passes (LOGITS_BYTES) so that a small
corpus makes dozens of them, and every rank gets several. How the passes are shared is also
tested in this process, without MPI, against one process's windows.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import random_model
from test_mpi import _mpirun  # mpirun's path, or a skip without mpi4py or mpirun

from tokenkit.bpe import Tokenizer
from tokenkit.pipeline import choices, evaluate
from tokenkit.pipeline.evaluate import Score, passes, score_documents, summed, window_nats
from tokenkit.transformer import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
WORDS = ["the", "fox", "ran", "up", "a", "hill", "and", "down", "\n"]
EOT = "<|endoftext|>"
# tk with smaller forward passes: argv[1] is LOGITS_BYTES, the rest tk's arguments
SCRIPT = """import sys
from tokenkit.pipeline import choices, evaluate
evaluate.LOGITS_BYTES = choices.LOGITS_BYTES = int(sys.argv[1])
from tokenkit.cli.main import entry
sys.argv = ["tk", *sys.argv[2:]]
entry()
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A random model (windows of 32, vocab 301), 40 documents of 1 to 300 words (two too short to
    score, many widths of last window), a JSONL of the same, and a task of 30 items."""
    root = tmp_path_factory.mktemp("eval_mpi")
    rng = random.Random(5)
    text = " ".join(rng.choice(WORDS) for _ in range(3000))
    tok = Tokenizer.train([text.encode()], vocab_size=300, special_tokens=[EOT], quiet=True)
    random_model(root / "model.safetensors", tok, seed=2)
    docs = root / "docs"
    docs.mkdir()
    lines = []
    for i in range(40):
        n_words = [1, 1, 2, 3, 5, 8, 13, 20, 40, 90, 300][i] if i < 11 else rng.choice([2, 5, 13, 40, 90, 300])
        body = ["a", "u"][i] if i < 2 else " ".join(rng.choice(WORDS[:-1]) for _ in range(n_words))
        (docs / f"{i:02d}.txt").write_text(body, encoding="utf-8")
        lines.append(json.dumps({"text": body}))
    (root / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    items = []
    for _ in range(30):
        context = "" if rng.random() < 0.1 else " ".join(rng.choice(WORDS[:-1]) for _ in range(rng.randint(1, 40)))
        phrase = lambda: " " + " ".join(rng.choice(WORDS[:-1]) for _ in range(rng.randint(1, 4)))  # noqa: E731
        opts = [phrase() for _ in range(rng.randint(2, 4))]
        items.append(json.dumps({"context": context, "choices": opts, "gold": rng.randrange(len(opts))}))
    (root / "task.jsonl").write_text("\n".join(items) + "\n", encoding="utf-8")
    (root / "empty.txt").write_bytes(b"")
    (root / "tk_small_passes.py").write_text(SCRIPT, encoding="utf-8")
    names = {"model": "model.safetensors", "jsonl": "docs.jsonl", "task": "task.jsonl", "empty": "empty.txt"}
    return {"docs": docs, "script": root / "tk_small_passes.py", **{k: root / v for k, v in names.items()}}


PASS_BYTES = 3 * 32 * 301 * 4  # three windows (or task rows of up to 32 tokens) a forward pass


def _tk(files, ranks: int, *args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(files["script"]), str(PASS_BYTES), *map(str, args)]
    if ranks > 1:
        cmd = [_mpirun(), "-n", str(ranks), *cmd]
    return subprocess.run(cmd, cwd=REPO, env=ENV, stdin=stdin, capture_output=True, text=True, timeout=120)


# --- under mpirun: the same output as one process ----------------------------------------------------


@pytest.mark.parametrize("ranks", [2, 3])
def test_text_on_ranks_prints_one_process_s_figures_exactly(files, ranks):
    cases = [
        ["--stride", "8", "--json"],
        ["--stride", "32", "--json"],  # disjoint windows
        ["--json"],  # the default stride
    ]
    for flags in cases:
        one, many = _tk(files, 1, "eval", "-m", files["model"], files["docs"], *flags), None
        many = _tk(files, ranks, "eval", "-m", files["model"], files["docs"], *flags)
        assert one.returncode == 0 and many.returncode == 0, (one.stderr, many.stderr)
        assert many.stdout == one.stdout, flags  # the JSON text: every float to its last digit
        doc = json.loads(one.stdout)
        assert doc["documents"] == 38 and doc["skipped_documents"] == 2 and doc["tokens"] > 1000
    # JSON lines, read by every rank from the start; the plain report, its last line apart
    one = _tk(files, 1, "eval", "-m", files["model"], files["jsonl"], "--text-field", "text", "--stride", "5")
    many = _tk(files, ranks, "eval", "-m", files["model"], files["jsonl"], "--text-field", "text", "--stride", "5")
    assert one.returncode == 0 and many.returncode == 0, (one.stderr, many.stderr)
    assert many.stdout.splitlines() == [*one.stdout.splitlines(), f"scored on {ranks} MPI ranks"]
    assert many.stderr.count("skipped 2 documents") == 1  # the note, once: rank 0's


@pytest.mark.parametrize("ranks", [2, 3])
def test_task_on_ranks_gives_one_process_s_loglikelihoods_exactly(files, ranks):
    one = _tk(files, 1, "eval", "-m", files["model"], "--task", files["task"], "--json")
    many = _tk(files, ranks, "eval", "-m", files["model"], "--task", files["task"], "--json")
    assert one.returncode == 0 and many.returncode == 0, (one.stderr, many.stderr)
    assert many.stdout == one.stdout
    doc = json.loads(one.stdout)
    assert doc["n"] == 30 and len(doc["items"]) == 30
    assert len({ll for item in doc["items"] for ll in item["loglikelihoods"]}) > 60  # real, distinct numbers


@pytest.mark.parametrize(
    "args, message",
    [
        (["{empty}"], "error: the corpus is empty; give at least one file or text with some content"),
        (["-"], "error: under MPI every rank reads the whole corpus, and stdin (-) can be read only once"),
        (["{docs}", "--stride", "33"], "error: --stride 33 is more than the model's context (32); give at most 32"),
    ],
)
def test_bad_input_on_ranks_is_one_line(files, args, message):
    argv = [a.format(**files) for a in args]
    proc = _tk(files, 2, "eval", "-m", files["model"], *argv, stdin=subprocess.PIPE)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(message), proc.stderr
    assert proc.stdout == ""


def test_tokenizers_side_by_side_are_refused_on_ranks_in_one_line(files):
    proc = _tk(files, 2, "eval", "-t", files["model"], files["docs"])
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "run it without mpirun" in proc.stderr, proc.stderr


def test_ctrl_c_on_ranks_is_one_line_and_130(files, tmp_path):
    """SIGINT to the launcher's process group while the ranks score: `interrupted`, once, exit 130,
    and every rank gone."""
    mpirun = _mpirun()
    long_text = " ".join(random.Random(1).choice(WORDS) for _ in range(60_000))
    (tmp_path / "long.txt").write_text(long_text, encoding="utf-8")
    cmd = [mpirun, "-n", "2", sys.executable, "-m", "tokenkit.cli.main", "eval", "-m", str(files["model"]),
           str(tmp_path / "long.txt"), "--stride", "1", "-q"]  # fmt: skip
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:  # a file, not a pipe: a straggler holding a pipe would block the reading
        proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)  # fmt: skip
    try:
        time.sleep(5.0)  # loaded, and scoring: one process takes over 20 s of CPU on this corpus
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 130, err_path.read_text()
    assert err_path.read_text().splitlines() == ["interrupted"]


# --- in this process: how the passes are shared --------------------------------------------------------


def _model(vocab: int = 29) -> GPT:
    model = GPT(GPTConfig(vocab_size=vocab, context_length=8, d_model=16, n_layers=2, n_heads=2), seed=7)
    rng = np.random.default_rng(7)
    for value in model.params.values():
        value[...] = rng.normal(0.0, 0.5, value.shape)
    return model


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_the_shares_windows_are_one_process_s_windows(monkeypatch, stride):
    """Each share computes exactly the windows one process computes in the same passes (the same
    float64 values), every window once; the shares' sum is one process's sum, bit for bit."""
    monkeypatch.setattr(evaluate, "LOGITS_BYTES", 3 * 8 * 29 * 4)  # three windows a pass
    model = _model()
    rng = np.random.default_rng(stride)
    docs = [(rng.integers(0, 29, n).tolist(), 2 * n) for n in rng.integers(0, 40, 30)]
    whole, counts = window_nats(model, docs, stride=stride)
    sizes = [len(g) for g in passes(docs, 8, stride, 3, Score())]
    chunks = np.split(whole, np.cumsum(sizes)[:-1])
    assert len(chunks) > 10
    one = score_documents(model, docs, stride=stride)
    for n in (1, 2, 3, 5, len(chunks) + 2):
        shares = [window_nats(model, docs, stride=stride, share=(k, n)) for k in range(n)]
        for k, (mine, their_counts) in enumerate(shares):
            assert np.array_equal(mine, np.concatenate([np.zeros(0), *chunks[k::n]])), (n, k)
            assert their_counts == counts  # every share counts the whole corpus
        together = summed(shares[0][1], [s[0] for s in shares])
        assert together.nats == one.nats and together.to_dict() == one.to_dict()
    assert one.nats == math.fsum(whole.tolist())


def test_the_task_s_passes_take_every_row_once(monkeypatch):
    """choices.plan's passes partition the rows, longest first, within LOGITS_BYTES; every MPI rank
    makes the same, and scoring them in any share gives score_items's numbers."""
    monkeypatch.setattr(choices, "LOGITS_BYTES", 4 * 8 * 300 * 4)
    model = _model(300)
    rng = random.Random(3)
    tok = Tokenizer.train([" ".join(rng.choice(WORDS) for _ in range(500)).encode()], vocab_size=280, quiet=True)
    items = [
        choices.Item(" ".join(rng.choice(WORDS[:-1]) for _ in range(rng.randint(1, 12))),
                     tuple(" " + rng.choice(WORDS[:-1]) for _ in range(rng.randint(1, 4))), 0, i + 1)
        for i in range(25)
    ]  # fmt: skip
    plan = choices.plan(model, tok, items)
    flat = [i for batch in plan.batches for i in batch]
    assert sorted(flat) == list(range(len(plan.rows))) and len(plan.batches) > 5
    lengths = [len(plan.rows[i].ids) for i in flat]
    assert lengths == sorted(lengths, reverse=True)
    one = choices.score_items(model, tok, items)
    sums, greedy = np.zeros(len(plan.rows)), np.zeros(len(plan.rows), dtype=bool)
    for batch in reversed(plan.batches):  # another order, as ranks finish: the same numbers
        sums[batch], greedy[batch] = choices.row_logprobs(model, [plan.rows[i] for i in batch])
    again = choices.assemble(items, plan, sums, greedy)
    assert again.to_dict() == one.to_dict()
