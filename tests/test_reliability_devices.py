"""`--device cuda` where CuPy or a GPU is missing: one line from every command, before any work.

train-model, pipeline, predict-next, generate and explain (on a model and on a worked example)
each end with exit code 1 and the backend's own line (`device 'cuda' needs CuPy ...` or `found
CuPy but no ... GPU`), print nothing on stdout and create no run directory. CuPy is hidden (or
replaced by one whose driver finds no GPU) in this process, so the tests mean the same on a
machine that has both. `explain --example`, whose numbers NumPy works on the CPU, is refused
with --device cuda even where a GPU is usable, rather than run there quietly.
"""

from __future__ import annotations

import sys

import pytest

from tokenkit.cli.main import main
from tokenkit.transformer import backends

SMALL = ["--n-layers", "1", "--n-heads", "2", "--d-model", "16", "--context-length", "8", "--batch-size", "4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("device")
    corpus = root / "c.txt"
    corpus.write_text("the cat sat on the mat. the dog sat on the log. " * 200, encoding="utf-8")
    run = root / "run"
    args = ["pipeline", str(corpus), "-o", str(run), "--vocab-size", "280", "--steps", "4", *SMALL, "--workers", "1"]
    assert main([*args, "-n", "2", "-q"]) == 0
    return {"corpus": corpus, "run": run}


class _NoGpuCupy:
    """CuPy whose CUDA driver reports no device."""

    class cuda:  # noqa: N801 (CuPy's name)
        class runtime:  # noqa: N801
            @staticmethod
            def getDeviceCount():  # noqa: N802
                return 0


@pytest.fixture(params=["no CuPy", "no GPU"])
def missing(request, monkeypatch):
    monkeypatch.delitem(backends._BACKENDS, "cuda", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None if request.param == "no CuPy" else _NoGpuCupy())
    return "device 'cuda' needs CuPy" if request.param == "no CuPy" else "device 'cuda' found CuPy but no GPU"


def _commands(run, tmp_path) -> dict[str, list[str]]:
    model, corpus = str(run["run"]), str(run["corpus"])
    return {
        "train-model": ["train-model", corpus, "-o", str(tmp_path / "new"), "--steps", "4", *SMALL],
        "pipeline": ["pipeline", corpus, "-o", str(tmp_path / "new"), "--steps", "4", *SMALL],
        "predict-next": ["predict-next", "-m", model, "the cat"],
        "generate": ["generate", "-m", model, "the cat", "-n", "3"],
        "explain": ["explain", "-m", model, "the cat"],
        "explain --example": ["explain", "--example", "chai"],
    }


@pytest.mark.parametrize(
    "command", ["train-model", "pipeline", "predict-next", "generate", "explain", "explain --example"]
)
def test_device_cuda_without_cupy_or_gpu_is_one_line_in_every_command(run, tmp_path, capsys, missing, command):
    code = main([*_commands(run, tmp_path)[command], "--device", "cuda"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", out
    assert err.startswith(f"error: {missing}") and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists()


def test_worked_examples_are_refused_on_a_usable_gpu(capsys, monkeypatch):
    from tokenkit.transformer.backends.cuda_twins import twin_backend

    monkeypatch.setitem(backends._BACKENDS, "cuda", twin_backend())  # a "GPU" that works
    assert main(["explain", "--example", "chai", "--device", "cuda"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: the worked examples are computed with NumPy on the CPU; drop --device cuda")


def test_a_model_beyond_the_gpus_free_memory_is_one_line_before_allocating(monkeypatch):
    """On "cuda" the check reads the GPU's free memory (here made 1 GB), says GPU memory, and
    counts a loaded model's weights, which still go to the GPU; where it cannot read it, nothing
    is refused (get_backend names a missing GPU first)."""
    from tokenkit.transformer import GPTConfig, ModelError, memory

    gpt2 = GPTConfig(vocab_size=50304, context_length=1024, d_model=768, n_layers=12, n_heads=12)
    monkeypatch.setattr(memory, "_device_free_bytes", lambda: 10**9)
    with pytest.raises(ModelError, match=r"GB of GPU memory \(.*\), more than the 1\.0 GB available; .* free GPU"):
        memory.check_memory(gpt2, training=True, batch_rows=8, device="cuda")
    tiny = GPTConfig(vocab_size=300, context_length=16, d_model=16, n_layers=1, n_heads=2)
    assert memory.check_memory(tiny, device="cuda") == memory.check_memory(tiny, loaded=True, device="cuda")
    assert memory.check_memory(tiny, loaded=True) < memory.check_memory(tiny)  # on the CPU the weights are there
    monkeypatch.setattr(memory, "_device_free_bytes", lambda: None)
    assert memory.check_memory(gpt2, training=True, batch_rows=8, device="cuda") > 10**9
