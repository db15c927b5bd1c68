"""Fixtures more than one test module uses, registered once here (a session fixture imported into
two modules would start twice), and the constants several modules share: a module imports those
with `from conftest import NAME`. What a module sizes on purpose stays in that module."""

import os

# The suite's models are tiny: OpenBLAS's threads cost them more than they give (a step of a
# width-32 model took 3x as long with them on a busy 2-core machine). Before NumPy loads, and
# inherited by every tk process a test starts; a user's own setting stays.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import pytest  # noqa: E402
from browser import browser  # noqa: E402, F401 -- the system Chromium, for test_page*.py

# Modules that drive a browser, MPI ranks, many processes or the CUDA emulator: most of the
# suite's time. `python -m pytest -q -m "not slow"` runs the rest, for the edit-test loop; CI
# and the README's command run everything.
SLOW_MODULES = {
    "test_page", "test_page_html", "test_page_llama", "test_page_eval", "test_page_lens", "test_page_trips",
    "test_cuda_emulator", "test_fused_attention", "test_mpi", "test_train_mpi", "test_run_dir", "test_children",
    "test_reliability_signals", "test_reliability_runs", "test_reliability_files", "test_reliability_hangs",
    "test_reliability_mounts", "test_reliability_sizes", "test_interop", "test_workers", "test_gpu_ranks",
    "test_eval_mpi", "test_chat_pipeline",
}  # fmt: skip


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


# A one-layer model of width 32 over windows of 16, 8 at a time: `train-model` and `pipeline`
# flags for runs that must only start, stop or repeat (test_children, test_reliability_runs,
# test_reliability_signals, test_run_dir).
TINY_MODEL = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--context-length", "16", "--batch-size", "8"]

# Twelve short words: a corpus drawn from them is one a tiny model learns in a few steps
# (test_run_dir's `write_words`, test_reliability_hangs's `base`).
HILL_WORDS = ["the", "fox", "ran", "up", "a", "hill", "and", "down", "again", "to", "see", "sun"]


def signal_at_step(monkeypatch, step: int, signum=None):
    """Send this process `signum` (default SIGINT, a user's Ctrl-C) in the middle of training step
    `step` of what runs next, through DataParallel.loss_and_grads; returns the undo."""
    import os
    import signal

    from tokenkit.transformer.parallel import DataParallel

    real = DataParallel.loss_and_grads
    calls = {"n": 0}

    def signalling(self, x, y, **kw):
        calls["n"] += 1
        if calls["n"] == step:
            os.kill(os.getpid(), signal.SIGINT if signum is None else signum)
        return real(self, x, y, **kw)

    monkeypatch.setattr(DataParallel, "loss_and_grads", signalling)
    return lambda: monkeypatch.setattr(DataParallel, "loss_and_grads", real)


def random_model(path, tok, seed: int = 0, d_model: int = 32, **variant):
    """A random GPT-2-style model over `tok` (2 layers of 4 heads, windows of 32) whose every weight
    matters: biases and LayerNorm gains far from their init; saved as a tk checkpoint at `path`
    (test_hf, test_reliability_files, test_reliability_interop). tokenkit is imported here, not
    above, so that a conftest.py every test loads imports no more than the browser's."""
    import numpy as np

    from tokenkit.pipeline import checkpoint
    from tokenkit.transformer import GPT, GPTConfig

    config = GPTConfig(vocab_size=tok.vocab_size, context_length=32, d_model=d_model, n_layers=2, n_heads=4, **variant)
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed)
    for value in model.params.values():
        value[...] = rng.normal(0.0, 0.3, value.shape)
    checkpoint.save_model(
        path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
    )
    return model
