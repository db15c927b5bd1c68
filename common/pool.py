"""The one pool of worker processes for tasks (BPE counting, file encoding): started, fed and
stopped here, so that a signal at any moment ends it at once.

`TaskPool(n, work, init=..., done=...)` starts n worker processes, each connected to this
process by a pipe of its own. `map(tasks, window)` hands each task to an idle worker, which runs
`work(task)` and sends the result back; the results come out in the tasks' order, with at most
`window` tasks taken ahead of the one awaited. `finish()` asks each worker for `done()`, what it
gathered over its tasks (a Counter of chunks), and lets it exit. A worker's exception comes back
and is raised here; a worker that died (killed, out of memory) is a PoolError.

Stopping: `close()` (the `with` block's end, on any exception, Ctrl-C and SIGTERM included)
kills every worker with SIGKILL and reaps it, and never reads a pipe again. A worker killed in
the middle of sending its result leaves half a message in its pipe; a reader waiting for the
rest would wait forever (issue 36: `ProcessPoolExecutor.shutdown` joined its manager thread,
blocked on such a message). Here nothing waits on a pipe once the pool is closing: there are no
threads, no queues and no locks shared with a worker, and the only wait is `waitpid` on a process
that SIGKILL has ended. The stop signals are held while the pool starts workers and while it
stops them: a second Ctrl-C cannot leave a worker unkilled (and the death signal of
`common.processes.die_with_parent` covers this process's own death).

One task at a time per worker: a worker is handed its next task only once its result has been
read, so neither side ever blocks writing to a full pipe while the other writes too.

What this module deliberately does not do: decide what a task is (bpe/encode_corpus.py,
bpe/pretokenize.py), or run training's shards (transformer/workers.py keeps its workers across
steps, with shared memory; it stops them with `kill_and_reap`, this module's one way to stop).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from tokenkit.common.processes import die_with_parent, signals_held

if TYPE_CHECKING:
    import multiprocessing
    from multiprocessing.connection import Connection

# multiprocessing is imported when a pool starts: a command that never starts one (`tk encode
# TEXT`) does not pay for it.

__all__ = ["PoolError", "TaskPool", "kill_and_reap"]


_TASK, _DONE = 0, 1  # what this process asks a worker
_OK, _RAISED = 0, 1  # what a worker answers


class PoolError(Exception):
    """A worker process died without answering (killed, out of memory); one line."""


def kill_and_reap(pids: Iterable[int]) -> None:
    """SIGKILL each worker and reap it: the one way workers are stopped. Nothing is read from
    them, so a worker killed mid-message costs nothing; waitpid returns once the kernel ended it."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already
            pass


def _context() -> multiprocessing.context.BaseContext:
    """fork on Linux (workers inherit what the parent built: a tokenizer and its warm cache);
    elsewhere fork is missing or unsafe (macOS system libraries), so spawn."""
    import multiprocessing

    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def forked() -> bool:
    """Whether workers are forked (and inherit this process's memory) rather than spawned."""
    return _context().get_start_method() == "fork"


class TaskPool:
    """`n` worker processes running `work(task) -> result`; `init(*init_args)` first in each
    (after `die_with_parent`), `done() -> value` when `finish` asks. All three must be
    module-level functions (spawned workers import them by name)."""

    def __init__(
        self,
        n: int,
        work: Callable[[Any], Any],
        *,
        init: Callable[..., None] | None = None,
        init_args: tuple = (),
        done: Callable[[], Any] | None = None,
    ) -> None:
        self._conns: list[Connection] = []
        self._procs: list = []
        ctx = _context()
        parent = os.getpid()
        try:
            with signals_held():  # no worker hears a signal before it ignores it (die_with_parent)
                for _ in range(n):
                    mine, theirs = ctx.Pipe(duplex=True)
                    inherited = list(self._conns) if ctx.get_start_method() == "fork" else []
                    proc = ctx.Process(
                        target=_worker_main,
                        args=(theirs, inherited, parent, work, init, init_args, done),
                        daemon=True,
                    )
                    proc.start()
                    theirs.close()  # only the worker holds its end: its death is EOF here
                    self._conns.append(mine)
                    self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def map(self, tasks: Iterable, window: int) -> Iterator:
        """The result of each task, in order; at most `window` tasks (at least one per worker)
        are taken from `tasks` ahead of the result awaited."""
        from multiprocessing.connection import wait as multiprocessing_wait

        tasks = iter(tasks)
        window = max(window, len(self._conns))
        results: dict[int, Any] = {}  # index -> result, finished ahead of the one awaited
        busy: dict[int, int] = {}  # worker -> index of its task
        idle = list(range(len(self._conns)))
        taken = awaited = 0
        exhausted = False
        while True:
            while idle and not exhausted and taken < awaited + window:
                task = next(islice(tasks, 1), _END)
                if task is _END:
                    exhausted = True
                    break
                k = idle.pop()
                self._send(k, (_TASK, task))
                busy[k] = taken
                taken += 1
            if awaited in results:
                status, value = results.pop(awaited)
                if status == _RAISED:  # in the tasks' order: the same error whichever worker was first
                    raise value
                yield value
                awaited += 1
                continue
            if not busy:
                return
            for conn in multiprocessing_wait([self._conns[k] for k in busy]):
                k = self._conns.index(conn)
                results[busy.pop(k)] = self._reply(k)
                idle.append(k)

    def finish(self) -> list:
        """Each worker's `done()`, in worker order; the workers exit then (and are reaped)."""
        for k in range(len(self._conns)):
            self._send(k, (_DONE, None))
        out = [self._answer(k) for k in range(len(self._conns))]
        for proc in self._procs:
            proc.join()
        return out

    def close(self) -> None:
        """Kill and reap every worker, and close the pipes without reading them (idempotent)."""
        with signals_held():  # a second Ctrl-C waits until every worker is stopped
            started = [p for p in self._procs if p.pid is not None]
            for proc in started:
                if proc.exitcode is None:  # (reaps one that has exited already)
                    proc.kill()
            for proc in started:
                proc.join()  # waitpid on a process SIGKILL has ended: returns at once
            for conn in self._conns:
                conn.close()
            self._procs.clear()
            self._conns.clear()

    def _send(self, k: int, message: tuple) -> None:
        try:
            self._conns[k].send(message)
        except OSError:  # the worker is gone (its end closed)
            self._died(k)

    def _reply(self, k: int) -> tuple[int, Any]:
        try:
            return self._conns[k].recv()
        except (EOFError, OSError):  # half a message, then its writer's end closed: never a wait
            self._died(k)

    def _answer(self, k: int) -> Any:
        status, value = self._reply(k)
        if status == _RAISED:
            raise value
        return value

    def _died(self, k: int):
        proc = self._procs[k]
        proc.join(1.0)
        pid, code = proc.pid, proc.exitcode
        self.close()
        raise PoolError(f"process {pid} died (exit code {code}; killed, or out of memory?)")


_END = object()


def _worker_main(conn: Connection, inherited: list[Connection], parent: int, work, init, init_args, done) -> None:
    """A worker's life: answer tasks until asked for `done()` or the pipe closes."""
    die_with_parent(parent)
    for other in inherited:  # the other workers' pipes, copied by the fork: theirs, not ours
        other.close()
    try:
        failed = None  # an exception of init: the answer to every request
        try:
            if init is not None:
                init(*init_args)
        except Exception as exc:  # noqa: BLE001 - sent back, raised in the parent
            failed = exc
        while True:
            try:
                kind, task = conn.recv()
            except (EOFError, OSError):
                return
            try:
                if failed is not None:
                    raise failed
                answer = (_OK, work(task) if kind == _TASK else (done() if done is not None else None))
            except Exception as exc:  # noqa: BLE001 - sent back, raised in the parent
                answer = (_RAISED, exc)
            try:
                conn.send(answer)
            except (OSError, ValueError):
                return
            except Exception as exc:  # noqa: BLE001 - an exception that does not pickle: its words
                conn.send((_RAISED, RuntimeError(f"{type(answer[1]).__name__}: {exc}")))
            if kind == _DONE:
                return
    finally:
        conn.close()
