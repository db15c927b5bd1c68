"""MPI ranks on real GPUs: `mpirun -n N` with --device cuda, each rank on GPU (local rank % GPUs).

- The executor: MPIDataParallel on 2 and 3 ranks trains to the bits of one process computing
  the same shards in turn on the GPU (`sum_of_shards`): the gradients come to the host, are summed
  in shard order, and go back (test_mpi.py's DEVICE_STEPS, there on the kernels' NumPy twins).
- `tk train-model --device cuda` on 2 ranks: one summary, rank 0's files, weights close to the
  one-process GPU run (which computes the batch whole), and SIGTERM + --resume on 2 ranks ending
  with the uninterrupted run's files (the weights reach the other rank's GPU through the host).

On a machine with one GPU the ranks share it. Skipped without CuPy, a GPU, mpi4py or mpirun.
TF32 is off in the training runs (TK_TF32=0), so that the one-process comparison can be close.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import test_train_mpi  # noqa: E402
from test_mpi import REPO, _mpirun, device_steps  # noqa: E402
from test_train_mpi import SMALL, _assert_same_run, _sigterm_midway, corpus, tokenizer  # noqa: E402, F401

from tokenkit.transformer import ModelError  # noqa: E402
from tokenkit.transformer.backends import get_backend  # noqa: E402

try:
    get_backend("cuda")
except ModelError as err:
    pytest.skip(f"no GPU: {err}", allow_module_level=True)

ENV = {**os.environ, "PYTHONPATH": str(REPO), "TK_TF32": "0"}


@pytest.mark.parametrize("ranks, rows", [(2, 7), (3, 5)])
def test_gpu_ranks_are_bit_identical_to_their_shards_in_one_process(tmp_path, ranks, rows):
    on_ranks, alone = device_steps(tmp_path, "cuda", ranks, rows, timeout=300)
    assert on_ranks["losses"].tolist() == alone["losses"].tolist()
    for name, p in alone.items():
        np.testing.assert_array_equal(on_ranks[name], p, err_msg=name)


def _tk(ranks: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    tk = [sys.executable, "-m", "tokenkit.cli.main", *args, "--device", "cuda"]
    cmd = [_mpirun(), "-n", str(ranks), *tk] if ranks > 1 else tk
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_train_model_on_gpu_ranks_stops_resumes_and_stays_close_to_one_gpu(
    corpus,  # noqa: F811
    tokenizer,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    monkeypatch.setitem(test_train_mpi.ENV, "TK_TF32", "0")  # _sigterm_midway's runs too
    runs = {}
    for ranks in (1, 2):
        run = runs[ranks] = tmp_path / f"run{ranks}"
        proc = _tk(ranks, "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run), "--steps", "40", *SMALL)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("step 40/40") == 1
    assert "each on its rank's GPU" in proc.stderr
    sessions = [json.loads(line) for line in (runs[2] / "log.jsonl").read_text().splitlines() if '"session"' in line]
    assert [s["ranks"] for s in sessions] == [2]

    from tokenkit.pipeline.train_state import load_train_state

    one, two = (load_train_state(runs[n] / "train_state.safetensors") for n in (1, 2))
    for name, p in one.params.items():
        np.testing.assert_allclose(two.params[name], p, rtol=1e-3, atol=1e-4, err_msg=name)

    run = tmp_path / "stopped"
    tk = [sys.executable, "-m", "tokenkit.cli.main", "train-model", str(corpus), "-t", str(tokenizer), "-o", str(run)]
    cmd = [_mpirun(), "-n", "2", *tk, "--steps", "40", *SMALL, "--device", "cuda"]
    stopped = _sigterm_midway(cmd, run, after_step=5)
    assert stopped.returncode == 143, stopped.stderr
    resumed = _tk(2, "train-model", "--resume", str(run), "-q")
    assert resumed.returncode == 0, resumed.stderr
    _assert_same_run(run, runs[2])
