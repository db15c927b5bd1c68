"""`mpirun -n N tk train-model` / `tk pipeline`: the files and losses of one process with N x workers shards.

Every MPI run is a subprocess (`mpirun -n N python -m tokenkit.cli.main ...`), skipped when mpirun or
mpi4py is missing (`pip install -e '.[mpi]'`). The one-process twins run the same way, so the
comparison is between two command lines a user would type.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_mpi import _mpirun  # mpirun's path, or a skip without mpi4py or mpirun

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
SMALL = [
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--context-length",
    "16",
    "--batch-size",
    "6",
    "--eval-interval",
    "10",
    "--eval-batches",
    "2",
    "--seed",
    "3",
]
SAME_FILES = ("model.safetensors", "train_state.safetensors", "tokens.npy")


def _cmd(ranks: int, *args: str) -> list[str]:
    tk = [sys.executable, "-m", "tokenkit.cli.main", *args]
    return [_mpirun(), "-n", str(ranks), *tk] if ranks > 1 else tk


def _tk(ranks: int, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(ranks, *args), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    text = (REPO / "corpora" / "tiny_tales.txt").read_bytes()[:150_000]
    path = tmp_path_factory.mktemp("corpus") / "tales.txt"
    path.write_bytes(text)
    return path


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tok.safetensors"
    proc = _tk(1, "bpe-train", str(corpus), "--vocab-size", "300", "-q", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _steps(run: Path) -> list[tuple]:
    """The log's per-step numbers, without the wall-clock times."""
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records if r["type"] == "step"]


def _assert_same_run(a: Path, b: Path) -> None:
    for name in SAME_FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert _steps(a) == _steps(b)


@pytest.fixture(scope="module")
def one_process_runs(corpus, tokenizer, tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted one-process runs of 40 steps with --workers 2 and 4."""
    runs = {}
    for workers in (2, 4):
        run = tmp_path_factory.mktemp(f"one{workers}") / "run"
        proc = _tk(
            1,
            "train-model",
            str(corpus),
            "-t",
            str(tokenizer),
            "-o",
            str(run),
            "--steps",
            "40",
            "--workers",
            str(workers),
            "-q",
            *SMALL,
        )
        assert proc.returncode == 0, proc.stderr
        runs[workers] = run
    return runs


@pytest.mark.parametrize("ranks, workers", [(2, 1), (2, 2)])
def test_train_model_on_ranks_writes_the_one_process_files(
    corpus, tokenizer, one_process_runs, tmp_path, ranks, workers
):
    run = tmp_path / "run"
    proc = _tk(
        ranks,
        "train-model",
        str(corpus),
        "-t",
        str(tokenizer),
        "-o",
        str(run),
        "--steps",
        "40",
        "--workers",
        str(workers),
        *SMALL,
    )
    assert proc.returncode == 0, proc.stderr
    _assert_same_run(run, one_process_runs[ranks * workers])
    assert proc.stdout.count("step 40/40") == 1  # rank 0 alone prints
    assert f"mpi: {ranks} ranks x {workers} worker" in proc.stderr
    sessions = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if '"session"' in line]
    assert [(s["ranks"], s["workers"]) for s in sessions] == [(ranks, ranks * workers)]
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in one_process_runs[2].iterdir())


def _sigterm_midway(cmd: list[str], run: Path, after_step: int) -> subprocess.CompletedProcess:
    """Start `cmd`, send SIGTERM once log.jsonl shows `after_step` (mpirun forwards it to every rank)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    log = run / "log.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and f'"step": {after_step}, "type": "step"' in log.read_text():
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.005)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)])
def test_sigterm_saves_once_and_resume_crosses_between_mpi_and_one_process(
    corpus, tokenizer, one_process_runs, tmp_path, first, then
):
    """Stopped on `first` ranks (--workers 2 in all), resumed on `then`: the uninterrupted run's files."""
    run = tmp_path / "run"
    long = ["--steps", "40", *SMALL]
    workers = str(2 // first)
    cmd = _cmd(first, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run), "--workers", workers, *long)
    stopped = _sigterm_midway(cmd, run, after_step=5)
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.count("interrupted at step") == 1
    sessions = (run / "log.jsonl").read_text().count('"interrupt"')
    assert sessions == 1
    resumed = _tk(then, "train-model", "--resume", str(run), "-q")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("step 40/40") == 1
    _assert_same_run(run, one_process_runs[2])


def test_train_model_on_ranks_without_workers_takes_each_nodes_share_of_the_cores(corpus, tokenizer, tmp_path):
    """--workers 0 (the default) is counted by every rank together: rank 0 once counted it alone,
    in a collective the others, already waiting for the run, never joined (a hang)."""
    run = tmp_path / "run"
    proc = _tk(2, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run), "--steps", "4", *SMALL, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("step 4/4") == 1
    state = _tk(1, "info", str(run / "train_state.safetensors"))
    per_rank = max(1, len(os.sched_getaffinity(0)) // 2)
    assert f'"workers": {2 * per_rank}' in state.stdout, state.stdout


def test_resume_on_a_rank_count_that_cannot_share_the_shards_is_one_line(corpus, tokenizer, tmp_path):
    run = tmp_path / "run"
    cmd = _cmd(
        1, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run), "--workers", "2", "--steps", "40", *SMALL
    )
    assert _sigterm_midway(cmd, run, after_step=3).returncode == 143
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = _tk(3, "train-model", "--resume", str(run))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "3 ranks cannot share evenly" in errors[0], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_a_killed_rank_ends_the_job_and_leaves_the_last_checkpoint(corpus, tokenizer, tmp_path):
    """The launcher ends every rank when one dies: nothing waits forever, and the checkpoint stays whole."""
    run = tmp_path / "run"
    cmd = _cmd(
        2, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run), "--workers", "1", "--steps", "2000", *SMALL
    )
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (run / "train_state.safetensors").exists():
        time.sleep(0.005)
    found = subprocess.run(
        ["pgrep", "-f", "--", f"tokenkit.cli.main train-model .* -o {run} "], capture_output=True, text=True
    )
    ranks = [pid for pid in found.stdout.split() if int(pid) != proc.pid]  # not mpirun itself
    assert len(ranks) == 2, ranks
    os.kill(int(max(ranks, key=int)), signal.SIGKILL)
    t0 = time.monotonic()
    proc.communicate(timeout=30)
    assert proc.returncode != 0 and time.monotonic() - t0 < 10
    info = _tk(1, "info", str(run / "train_state.safetensors"))
    assert info.returncode == 0 and re.search(r"training step: +[1-9]\d*0 of 2000", info.stdout), (
        info.stdout + info.stderr
    )


def test_pipeline_on_ranks_is_the_one_process_pipeline(corpus, tmp_path):
    flags = ["--vocab-size", "280", "--steps", "20", "-n", "8", *SMALL]
    one, two = tmp_path / "one", tmp_path / "two"
    a = _tk(1, "pipeline", str(corpus), "-o", str(one), "--workers", "2", *flags)
    b = _tk(2, "pipeline", str(corpus), "-o", str(two), "--workers", "1", *flags)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    for name in (*SAME_FILES, "tokenizer.safetensors"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name

    def sample(stdout: str) -> str:  # what the model says, without the timing line
        return stdout[stdout.index("predict-next") :]

    assert sample(a.stdout) == sample(b.stdout)
    again = _tk(2, "pipeline", str(corpus), "-o", str(two), "--workers", "1", *flags)  # up to date: nothing to train
    assert again.returncode == 0, again.stderr
    assert "train: up to date" in again.stderr and sample(again.stdout) == sample(a.stdout)


# --- --grad-accum on ranks: each rank's rows of every micro-batch, one running sum ---------------


# On each rank: MPIDataParallel with micro-batches against the plain in-order sum of the same
# shards (`sum_of_shards`), some targets IGNORE, the batch given whole or as this rank's rows;
# 3 ranks over micro-batches of 5 rows (uneven shards) and of 2 (a rank without rows). On the CPU
# with and without dropout, and on a "GPU" (the CUDA kernels' NumPy twins: the device branch).
ACCUM_ON_RANKS = """
import numpy as np
from mpi4py import MPI
from tokenkit.transformer import GPT, GPTConfig, backends
from tokenkit.transformer.backends.cuda_twins import twin_backend
from tokenkit.transformer.dropout import Dropout
from tokenkit.transformer.loss import IGNORE
from tokenkit.transformer.parallel import MPIDataParallel, sum_of_shards

backends._BACKENDS["cuda"] = twin_backend()
config = GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=1, n_heads=2)
rng = np.random.default_rng(0)
runs = [("cpu", None), ("cpu", Dropout(0.3, 1, 2)), ("cuda", None)]
for (B, N), (device, dropout) in [(shape, run) for shape in ((5, 2), (2, 3)) for run in runs]:
    model = MPIDataParallel(GPT(config, seed=4, device=device), MPI.COMM_WORLD)
    ids, targets = rng.integers(0, 23, (B * N, 8)), rng.integers(0, 23, (B * N, 8))
    targets[rng.random(targets.shape) < 0.4] = IGNORE
    want = sum_of_shards(model.model, ids, targets, model.shards, dropout, micro_batches=N)
    rows = model.local_rows(B * N, N)
    counted = int((targets != IGNORE).sum())
    for got in (
        model.loss_and_grads(ids, targets, dropout=dropout, micro_batches=N),
        model.loss_and_grads(ids[rows], targets[rows], B * N, counted, dropout, micro_batches=N),
    ):
        assert got[0] == want[0], (B, N, device, got[0], want[0])
        host = backends.as_host
        assert all(np.array_equal(host(got[1][k]), host(want[1][k])) for k in want[1]), (B, N, device)
ok = np.empty(1, dtype=np.int64)
MPI.COMM_WORLD.Allreduce(np.ones(1, dtype=np.int64), ok)  # every rank got here: a failing one ends the job
if MPI.COMM_WORLD.Get_rank() == 0:
    print(f"{int(ok[0])} ranks ok")
"""


def test_micro_batches_on_ranks_are_the_in_order_sum_of_their_shards():
    cmd = [_mpirun(), "-n", "3", sys.executable, "-c", ACCUM_ON_RANKS]
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "3 ranks ok", proc.stdout


def _same_runs(runs: dict[str, Path], names=("model.safetensors", "train_state.safetensors")) -> None:
    first, *others = runs.values()
    for other in others:
        for name in names:
            assert (first / name).read_bytes() == (other / name).read_bytes(), (other.parent.name, name)
        assert _steps(first) == _steps(other), other.parent.name


def test_grad_accum_on_ranks_is_one_process_and_the_larger_batch(corpus, tokenizer, tmp_path):
    """mpirun -n 2 --grad-accum 2 --workers 1 is one process's --grad-accum 2 --workers 2, which
    is --batch-size 12 --workers 4 (test_finetune_flags.py): the same shards summed in the same
    order, micro-batch after micro-batch, byte for byte."""
    flags = [f for f in SMALL if f != "--batch-size"]
    flags.remove("6")  # --batch-size's value: each run gives its own
    tk = ["train-model", str(corpus), "-t", str(tokenizer), "--steps", "6", "--eval-interval", "3", *flags]
    runs = {
        "ranks": (2, "--grad-accum", "2", "--batch-size", "6", "--workers", "1"),
        "one": (1, "--grad-accum", "2", "--batch-size", "6", "--workers", "2"),
        "larger": (1, "--batch-size", "12", "--workers", "4"),
    }
    for name, (ranks, *more) in runs.items():
        quiet = ["-q"] if ranks == 1 else []  # the ranks' run says how a step is split
        proc = _tk(ranks, *tk, *quiet, "-o", str(tmp_path / name / "run"), *more)
        assert proc.returncode == 0, (name, proc.stderr)
        if ranks > 1:
            assert "2 shards of each 6-row micro-batch (rows rank 0: 3, rank 1: 3)" in proc.stderr, proc.stderr
    _same_runs({name: tmp_path / name / "run" for name in ("ranks", "one")})
    # the larger batch's files record other settings: its tensors and losses are the same
    from safetensors.numpy import load_file

    for name in ("model.safetensors", "train_state.safetensors"):
        a, b = (load_file(str(tmp_path / run / "run" / name)) for run in ("ranks", "larger"))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), name
    assert _steps(tmp_path / "ranks" / "run") == _steps(tmp_path / "larger" / "run")


def test_chat_grad_accum_on_ranks_is_one_process(corpus, tokenizer, tmp_path):
    """--chat: the masked loss's mean runs over the whole step's counted targets on every rank
    (each reads only its rows of each micro-batch), and dropout's masks go by the row in the
    step: 2 ranks write the one process's files, byte for byte."""
    from test_chat_sft import conversations, write_jsonl

    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(40))
    base = tmp_path / "base"
    shape = ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--context-length", "64", "--seed", "3"]
    from tokenkit.cli.main import main  # the base in this process: a second saved

    assert main(["train-model", str(corpus), "-t", str(tokenizer), "-o", str(base), "--steps", "1", *shape, "-q"]) == 0
    tune = ["train-model", "--chat", str(chats), "--init-from", str(base), "--steps", "4", "--eval-interval", "2",
            "--eval-batches", "1", "--batch-size", "3", "--grad-accum", "2", "--dropout", "0.2", "-q"]  # fmt: skip
    runs = {"ranks": (2, "1"), "one": (1, "2")}
    for name, (ranks, workers) in runs.items():
        proc = _tk(ranks, *tune, "-o", str(tmp_path / name), "--workers", workers)
        assert proc.returncode == 0, (name, proc.stderr)
    _same_runs({name: tmp_path / name for name in runs})
    counted = [r["counted"] for r in map(json.loads, (tmp_path / "ranks" / "log.jsonl").open()) if r["type"] == "step"]
    assert len(counted) == 4 and all(0 < c < 1 for c in counted)  # the assistant's targets alone


# --- --device cuda on ranks, each rank's "GPU" the CUDA kernels' NumPy twins ----------------------

# `tk` with the twins standing in for the cuda backend, in every rank (a monkeypatch stays in its process)
TK_ON_TWINS = (
    "from tokenkit.transformer import backends\n"
    "from tokenkit.transformer.backends.cuda_twins import twin_backend\n"
    "backends._BACKENDS['cuda'] = twin_backend()\n"
    "from tokenkit.cli.main import entry\n"
    "entry()\n"
)


def _twins_cmd(ranks: int, *args: str) -> list[str]:
    tk = [sys.executable, "-c", TK_ON_TWINS, *args, "--device", "cuda"]
    return [_mpirun(), "-n", str(ranks), *tk] if ranks > 1 else tk


@pytest.fixture(scope="module")
def twin_runs(corpus, tokenizer, tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted 40-step runs with --device cuda (twins): in one process, and on 2 ranks."""
    runs = {}
    for ranks in (1, 2):
        run = tmp_path_factory.mktemp(f"twins{ranks}") / "run"
        cmd = _twins_cmd(
            ranks, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run), "--steps", "40", *SMALL
        )
        proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("step 40/40") == 1  # rank 0 alone prints
        if ranks > 1:
            split = "2 shards of each 6-row batch (rows rank 0: 3, rank 1: 3), each on its rank's GPU"
            assert split in proc.stderr, proc.stderr
        runs[ranks] = run
    return runs


def test_device_cuda_on_ranks_trains_one_shard_per_rank(twin_runs):
    """Each rank's shard on its device, gradients summed on the host: the one-process device run
    computes the batch whole, so the numbers are close, not the same bits (those are the executor's
    test: test_mpi.py), and the files are of the same kind."""
    from tokenkit.pipeline.train_state import load_train_state

    one, two = (load_train_state(twin_runs[n] / "train_state.safetensors") for n in (1, 2))
    assert two.step == 40
    for name, p in one.params.items():
        np.testing.assert_allclose(two.params[name], p, rtol=1e-3, atol=1e-4, err_msg=name)
    assert sorted(p.name for p in twin_runs[2].iterdir()) == sorted(p.name for p in twin_runs[1].iterdir())
    sessions = [
        json.loads(line) for line in (twin_runs[2] / "log.jsonl").read_text().splitlines() if '"session"' in line
    ]
    assert [s["ranks"] for s in sessions] == [2]


def test_device_cuda_on_ranks_stops_and_resumes_bit_exactly(corpus, tokenizer, twin_runs, tmp_path):
    """SIGTERM on 2 ranks, resumed on 2 ranks: the weights travel from rank 0 to the others' devices
    (`Ranks.share_state`), and the run ends with the uninterrupted run's files."""
    run = tmp_path / "run"
    cmd = _twins_cmd(2, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run), "--steps", "40", *SMALL)
    stopped = _sigterm_midway(cmd, run, after_step=5)
    assert stopped.returncode == 143, stopped.stderr
    resumed = subprocess.run(
        _twins_cmd(2, "train-model", "--resume", str(run), "-q"),
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    _assert_same_run(run, twin_runs[2])


def test_device_cuda_on_ranks_refuses_local_workers_in_one_line(corpus, tokenizer, tmp_path):
    cmd = _twins_cmd(
        2, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(tmp_path / "run"), "--workers", "2", *SMALL
    )
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "with --device cuda the batch runs one shard per rank, on each rank's GPU: drop --workers" in errors[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
