"""common.pool, the one pool of task workers: a teardown at any moment returns at once and leaves
no child, even when a worker is in the middle of writing its result (issue 36: a worker
terminated mid-message left `ProcessPoolExecutor.shutdown` waiting forever for the rest).

The races themselves (a signal at a random moment, under load, hundreds of times) are counted
by bench/signal_stress.py; these tests pin the mechanism deterministically.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tokenkit.common import pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; forked workers")

BIG = 32 << 20  # a result far larger than a pipe's buffer: its writer blocks mid-message
BOUND_S = 2.0


def _echo(task):
    return task


def _big(task):
    return b"x" * BIG


def _slow_big(task):
    time.sleep(0.05)
    return b"y" * (4 << 20)


def _fail(task):
    raise ValueError(f"bad task {task}")


def _exit(task):
    os._exit(7)


def _gone(pid: int) -> bool:
    """Whether `pid` no longer exists (not even as a zombie: it was reaped)."""
    return not os.path.exists(f"/proc/{pid}")


def _wait_until_mid_write(p: pool.TaskPool, k: int) -> None:
    deadline = time.monotonic() + 10
    while not p._conns[k].poll(0.01):  # the header and the first bytes are in the pipe: the rest waits
        assert time.monotonic() < deadline, "the worker never started writing"
    time.sleep(0.05)


def test_results_come_in_order_and_workers_leave_when_finished():
    with pool.TaskPool(3, _echo) as p:
        pids = [proc.pid for proc in p._procs]
        assert list(p.map(range(50), window=4)) == list(range(50))
        assert p.finish() == [None, None, None]
    assert all(_gone(pid) for pid in pids)


def test_a_teardown_while_a_worker_is_mid_write_returns_at_once_and_leaves_no_child():
    p = pool.TaskPool(2, _big)
    pids = [proc.pid for proc in p._procs]
    for k in range(2):
        p._send(k, (pool._TASK, k))
    for k in range(2):
        _wait_until_mid_write(p, k)
    start = time.monotonic()
    p.close()
    assert time.monotonic() - start < BOUND_S
    assert all(_gone(pid) for pid in pids)


def test_a_worker_killed_mid_write_is_one_error_not_a_wait_for_the_rest():
    p = pool.TaskPool(1, _big)
    pid = p._procs[0].pid
    p._send(0, (pool._TASK, 0))
    _wait_until_mid_write(p, 0)
    os.kill(pid, signal.SIGKILL)  # half a message in the pipe, and its writer gone
    start = time.monotonic()
    with pytest.raises(pool.PoolError, match=f"process {pid} died"):
        p._answer(0)
    assert time.monotonic() - start < BOUND_S
    assert _gone(pid)


@pytest.mark.parametrize("after_s", [0.0, 0.03, 0.1, 0.3])
def test_an_interrupt_during_map_stops_the_pool_within_the_bound(after_s):
    """A KeyboardInterrupt (what tk's SIGINT and SIGTERM handler raises) at some moment of a map
    whose results are larger than the pipe: it may land while the parent reads a message."""

    fired = []

    def interrupt(signum, frame):
        fired.append(time.monotonic())
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    pids = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with pool.TaskPool(2, _slow_big) as p:
                pids = [proc.pid for proc in p._procs]
                signal.setitimer(signal.ITIMER_REAL, after_s or 1e-6)
                for _ in p.map(range(10_000), window=4):
                    pass
        assert time.monotonic() - fired[0] < BOUND_S
        assert not [pid for pid in pids if not _gone(pid)]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_workers_exception_is_raised_here_and_a_dead_worker_is_a_pool_error():
    with pytest.raises(ValueError, match="bad task 0"):
        with pool.TaskPool(2, _fail) as p:
            list(p.map(range(4), window=2))
    with pytest.raises(pool.PoolError, match="exit code 7"):
        with pool.TaskPool(2, _exit) as p:
            list(p.map(range(4), window=2))


def test_kill_and_reap_stops_forked_children_that_ignore_every_stop_signal():
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    start = time.monotonic()
    pool.kill_and_reap(pids)
    assert time.monotonic() - start < BOUND_S
    assert all(_gone(pid) for pid in pids)
