"""Batch shards in forked worker processes: same numbers as one process, parameters that stay
in sync with in-place and replaced updates, failures reported in one line, no stray processes."""

import gc
import os
import signal
import time

import numpy as np
import pytest

from tokenkit.transformer import GPT, AdamW, GPTConfig, ModelError
from tokenkit.transformer.parallel import DataParallel
from tokenkit.transformer.workers import fork_available, shared_arrays

pytestmark = pytest.mark.skipif(not fork_available(), reason="worker processes need os.fork (Linux)")

CONFIG = GPTConfig(vocab_size=11, context_length=8, d_model=16, n_layers=2, n_heads=2)


def batch(seed: int = 0, rows: int = 6):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 11, (rows, 8)), rng.integers(0, 11, (rows, 8))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def exited(pid: int) -> bool:
    """Whether the process has ended (a zombie waiting for its parent to reap it counts)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def worker_pids(model: DataParallel) -> list[int]:
    return list(model._pool._pids)


def in_workers_only(monkeypatch, method: str, misbehave) -> None:
    """Make GPT.<method> call misbehave() in worker processes (forked after this), and run as
    usual in this one; monkeypatch.undo or a new setattr restores it."""
    parent, real = os.getpid(), getattr(GPT, method)

    def patched(self, *args):
        if os.getpid() != parent:
            misbehave()
        return real(self, *args)

    monkeypatch.setattr(GPT, method, patched)


def assert_same_step(got, expected) -> None:
    """Two (loss, grads) results are equal, bit for bit."""
    assert got[0] == expected[0]
    for name, g in expected[1].items():
        np.testing.assert_array_equal(got[1][name], g, err_msg=name)


def test_shared_arrays_are_aligned_copies():
    like = {"a": np.arange(5, dtype=np.float32), "b": np.ones((3, 7)), "c": np.zeros((0,), np.float32)}
    out = shared_arrays(like)
    for name, a in like.items():
        assert out[name].dtype == a.dtype and out[name].shape == a.shape and out[name].flags.c_contiguous
        np.testing.assert_array_equal(out[name], a)
        assert out[name].ctypes.data % 64 == 0
    assert not np.shares_memory(out["a"], like["a"])


def test_training_with_workers_matches_shards_in_one_process(monkeypatch):
    """Worker processes must read the weights AdamW updated in place: every loss of a few steps
    equals, bit for bit, that of the same shards computed one after the other in this process."""
    losses = {}
    for label in ("processes", "sequential"):
        if label == "sequential":
            monkeypatch.setattr("tokenkit.transformer.parallel.fork_available", lambda: False)
        model = DataParallel(GPT(CONFIG, seed=1), workers=3)
        assert (model._pool is not None) == (label == "processes")
        opt = AdamW(model.params, lr=1e-2)
        losses[label] = []
        for step in range(4):
            ids, targets = batch(step, rows=7)  # uneven shards: 2, 3, 2
            loss, grads = model.loss_and_grads(ids, targets)
            opt.step(grads)
            losses[label].append((loss, model.loss(ids, targets)))
    assert losses["processes"] == losses["sequential"]


def test_replaced_parameters_reach_the_workers():
    model = DataParallel(GPT(CONFIG, seed=0), workers=2)
    ids, targets = batch()
    before = model.loss(ids, targets)
    model.params["wte.weight"] = model.params["wte.weight"] * 3.0  # a new array, not an in-place edit
    reference = GPT.from_params(CONFIG, model.params)
    assert model.loss(ids, targets) == pytest.approx(reference.loss(ids, targets), rel=1e-6) != before
    model.params = {k: v.astype(np.float64) for k, v in model.params.items()}  # new dtype: new pool
    loss64, grads = model.loss_and_grads(ids, targets)
    assert grads["wte.weight"].dtype == np.float64
    assert loss64 == pytest.approx(reference.loss(ids, targets), rel=1e-5)


def test_a_failure_in_a_worker_is_one_model_error_and_the_next_call_works(monkeypatch):
    def fail():
        raise MemoryError("no room for the activations")

    in_workers_only(monkeypatch, "shard_loss", fail)
    model = DataParallel(GPT(CONFIG), workers=2)
    ids, targets = batch()
    with pytest.raises(ModelError, match="worker process failed: MemoryError: no room"):
        model.loss(ids, targets)
    monkeypatch.undo()  # new workers are forked from the fixed code
    assert model.loss(ids, targets) == pytest.approx(GPT.from_params(CONFIG, model.params).loss(ids, targets))


def test_a_worker_dying_mid_step_is_one_error_and_the_next_call_gets_a_new_one(monkeypatch):
    in_workers_only(monkeypatch, "shard_loss_and_grads", lambda: os._exit(9))  # as the OOM killer would
    model = DataParallel(GPT(CONFIG), workers=2)
    ids, targets = batch()
    with pytest.raises(ModelError, match="died"):
        model.loss_and_grads(ids, targets)
    monkeypatch.undo()
    model.params["wte.weight"] *= 2  # the new worker's gradients, not a dead worker's buffer
    fresh = DataParallel(GPT.from_params(CONFIG, model.params), workers=2).loss_and_grads(ids, targets)
    assert_same_step(model.loss_and_grads(ids, targets), fresh)


def test_a_worker_killed_between_steps_is_reported_or_replaced_and_then_works():
    """Whether the end of a killed worker is seen before the next call (then it is replaced
    quietly) or only during it (then that call raises) is the kernel's timing; either way no
    wrong number comes out and the call after works."""
    model = DataParallel(GPT(CONFIG), workers=2)
    ids, targets = batch()
    expected = model.loss_and_grads(ids, targets)
    (pid,) = worker_pids(model)
    os.kill(pid, signal.SIGKILL)
    try:
        first = model.loss_and_grads(ids, targets)
    except ModelError as err:
        assert "died" in str(err)
        first = model.loss_and_grads(ids, targets)
    assert worker_pids(model) != [pid] and not alive(pid)
    for again in (first, model.loss_and_grads(ids, targets)):
        assert_same_step(again, expected)


def test_an_interrupted_call_leaves_no_stale_reply(monkeypatch):
    """Ctrl-C while the workers compute: the next call must not read the old call's reply."""
    model = DataParallel(GPT(CONFIG), workers=2)
    small, small_t = batch(0)
    other, other_t = batch(1)
    model.loss(small, small_t)
    real = GPT.shard_loss

    def interrupted(self, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(GPT, "shard_loss", interrupted)  # only this process's shard: workers run the forked code
    with pytest.raises(KeyboardInterrupt):
        model.loss(small, small_t)
    monkeypatch.setattr(GPT, "shard_loss", real)
    reference = GPT.from_params(CONFIG, model.params)
    assert model.loss(other, other_t) == pytest.approx(reference.loss(other, other_t), rel=1e-6)


def test_workers_exit_with_their_model_even_when_another_model_forked_later():
    first, second = DataParallel(GPT(CONFIG), workers=2), DataParallel(GPT(CONFIG), workers=2)
    ids, targets = batch()
    first.loss(ids, targets)
    second.loss(ids, targets)  # its worker was forked while first's socket was open
    pids = worker_pids(first) + worker_pids(second)
    del first
    gc.collect()
    assert not alive(pids[0]) and alive(pids[1])
    del second
    gc.collect()
    assert not alive(pids[1])


def test_a_process_forked_by_the_user_gets_workers_of_its_own():
    model = DataParallel(GPT(CONFIG), workers=2)
    ids, targets = batch()
    expected = model.loss(ids, targets)  # the parent's worker exists now
    pid = os.fork()
    if pid == 0:  # the child must not talk to the parent's worker
        code = 1
        try:
            ok = model.loss(ids, targets) == expected and worker_pids(model) and alive(worker_pids(model)[0])
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert model.loss(ids, targets) == expected  # and the parent's worker still answers the parent


def test_an_idle_worker_leaves_and_the_next_call_forks_a_new_one(monkeypatch):
    monkeypatch.setattr("tokenkit.transformer.workers.IDLE_EXIT_S", 0.2)  # read by the worker, after the fork
    model = DataParallel(GPT(CONFIG), workers=2)
    ids, targets = batch()
    expected = model.loss_and_grads(ids, targets)
    (pid,) = worker_pids(model)
    deadline = time.monotonic() + 10
    while not exited(pid) and time.monotonic() < deadline:  # it leaves by itself once idle
        time.sleep(0.05)
    assert exited(pid)
    again = model.loss_and_grads(ids, targets)
    assert worker_pids(model) != [pid] and not alive(pid)  # the pool reaped it and forked another
    assert_same_step(again, expected)


def test_workers_that_leave_at_once_never_lose_a_shard(monkeypatch):
    """With no idle time at all a worker says goodbye as soon as it has nothing to read, often
    before a request arrives (the request then crosses the goodbye and its shard is computed
    here) and otherwise right after replying. Every call still gives the one-process numbers."""
    monkeypatch.setattr("tokenkit.transformer.workers.IDLE_EXIT_S", 0.0)
    model = DataParallel(GPT(CONFIG, seed=2), workers=3)
    reference = DataParallel(GPT(CONFIG, seed=2), workers=3)
    monkeypatch.setattr(reference, "_pool", None)  # the same three shards, one after the other, here
    for step in range(6):
        ids, targets = batch(step, rows=7)
        assert_same_step(model.loss_and_grads(ids, targets), reference.loss_and_grads(ids, targets))
        assert model.loss(ids, targets) == reference.loss(ids, targets)
