"""Batch shards in worker processes: the data parallelism of one GPT on one machine.

A step splits its batch into shards: this process computes the first, forked worker
processes the others at the same time, each with single-threaded BLAS. Processes, not
threads: NumPy releases the GIL inside a call, but a shard makes hundreds of short calls per
step and every one must take the GIL back, so two threads queue for it (BENCHMARKS.md).

The parameters live in shared memory, one anonymous MAP_SHARED mapping that forked workers
inherit, so a worker always reads the weights the optimizer has just updated in place. Each
worker writes its gradients into a shared buffer of its own; its loss, the ids of its shard and
any error travel over a socket pair as raw bytes (no pickle).

Lifecycle: workers are forked on the first parallel call. A worker leaves when its socket
closes (the pool was closed or collected, or this process died), when this process dies (a
death signal: see common.processes.die_with_parent), or after IDLE_EXIT_S without
work, which hands its memory back (a model left alone in a notebook holds no processes); it
says goodbye first, so a request that crossed the goodbye is known to be undone and its shard
is computed here instead. An interrupted or failed call kills the pool's workers. The next call
forks whatever is missing. Fork is Linux-only here (elsewhere `fork_available()` is False and a
model computes its shards in this process, one after the other).

What this module does not do: the model's math (model.py) or any choice of shard sizes.
"""

from __future__ import annotations

import gc
import mmap
import os
import struct
import sys
import warnings
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import NoReturn

import numpy as np

from tokenkit.common.pool import kill_and_reap
from tokenkit.common.processes import die_with_parent, signals_held
from tokenkit.transformer.dropout import Dropout
from tokenkit.transformer.errors import ModelError

LOSS, LOSS_AND_GRADS = 0, 1
# op, rows, T, n_total (counted positions of the whole batch), B total; dropout's p (0: none), seed,
# step and the shard's first row (transformer/dropout.py)
_REQUEST = struct.Struct("<BqqqQdQqq")
_REPLY = struct.Struct("<Bd")  # status (below), loss share
_OK, _ERROR, _BYE = 0, 1, 2  # _ERROR: a message follows; _BYE: the worker left idle, unasked
_ALIGN = 64  # bytes: each array starts on a cache line (and an AVX-512 vector)
IDLE_EXIT_S = 60.0  # a worker with no request for this long exits; training calls come far more often

_live_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()  # closed in every new worker


def fork_available() -> bool:
    """True where shards can run in forked workers (Linux)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def shared_arrays(like: dict[str, np.ndarray], copy: bool = True) -> dict[str, np.ndarray]:
    """Arrays with the names, shapes and dtypes of `like` (and its values, with `copy`; zeros
    without) in one anonymous shared mapping, each C-contiguous and 64-byte aligned: memory
    that processes forked later share."""
    offsets, size = {}, 0
    for name, a in like.items():
        offsets[name] = size
        size += -(-a.nbytes // _ALIGN) * _ALIGN
    buf = mmap.mmap(-1, max(size, 1))  # anonymous, MAP_SHARED on Unix
    out = {}
    for name, a in like.items():
        view = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=offsets[name]).reshape(a.shape)
        if copy:
            view[...] = a
        out[name] = view  # a new anonymous mapping is zero-filled
    return out


class WorkerPool:
    """`n` forked workers computing shards of one model, reading `params` from shared memory.

    `make_worker(params)` is called in each worker, after the fork, with the shared parameters;
    it returns the two functions that compute a shard there: `shard_loss(ids, targets, batch,
    n_total) -> loss share` and `shard_loss_and_grads(ids, targets, n_total, into) -> loss share, grads`,
    which writes the gradients into the arrays of `into`.
    """

    def __init__(self, params: dict[str, np.ndarray], n: int, make_worker: Callable):
        if not fork_available():
            raise ModelError("worker processes need os.fork (Linux); use workers=1 here")
        self.params = shared_arrays(params)
        self.n = n
        self._make_worker = make_worker
        self._conns: list[Connection] = []
        self._pids: list[int] = []
        self._grads: list[dict[str, np.ndarray]] = []
        self._replies: list[bytes | None] = []
        self._owner = os.getpid()
        _live_pools.add(self)
        self._finalizer = weakref.finalize(self, _shut_down, self._conns, self._pids, self._owner)

    def usable_with(self, params: dict[str, np.ndarray]) -> bool:
        """Whether this process owns the pool (a process forked from the owner, by the user, must
        not talk to the owner's workers) and `params` have the names, shapes and dtypes of the
        shared copies."""
        return (
            os.getpid() == self._owner
            and params.keys() == self.params.keys()
            and all(params[k].shape == v.shape and params[k].dtype == v.dtype for k, v in self.params.items())
        )

    def sync(self, params: dict[str, np.ndarray]) -> None:
        """Copy into shared memory every parameter that is not already the shared array (only
        when an entry of the model's dict was replaced: the model's own arrays are shared)."""
        for name, shared in self.params.items():
            if params[name] is not shared:
                np.copyto(shared, params[name])

    def _start(self) -> None:
        """Fork the missing workers, each with a shared gradient buffer of its own. A socket
        that is readable between calls holds a goodbye (or the end of a killed worker): then all
        are reaped and forked anew."""
        if any(conn.poll(0) for conn in self._conns):
            self.close()
        while len(self._conns) < self.n:
            grads = shared_arrays(self.params, copy=False)
            mine, theirs = Pipe(duplex=True)
            parent = os.getpid()
            with warnings.catch_warnings(), signals_held():  # the child hears no Ctrl-C before it ignores it
                # Python >= 3.12 warns on fork in a process with threads: a child could inherit a
                # lock some thread held. The worker only runs NumPy and this module; malloc,
                # OpenBLAS and CPython reset their own locks at fork.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
                if pid == 0:  # the worker, inside the block: it must not unblock the signals itself
                    self._work(parent, mine, theirs, grads)
            theirs.close()
            self._conns.append(mine)
            self._pids.append(pid)
            self._grads.append(grads)

    def _work(self, parent: int, mine: Connection, theirs: Connection, grads: dict[str, np.ndarray]) -> NoReturn:
        """The forked worker's life: never returns to the caller's stack."""
        code = 1
        try:
            # EOF alone is not enough: a process forked from the parent later holds its socket too.
            # Deaf to SIGTERM and SIGHUP too: training finishes its step after one (pipeline.train)
            die_with_parent(parent, ignore_stop=True)
            gc.freeze()  # else the collector writes to, so copies, every inherited object's page
            mine.close()
            for pool in list(_live_pools):  # sockets of other workers: theirs to close
                for conn in pool._conns:
                    conn.close()
            _serve(*self._make_worker(self.params), theirs, grads)
            code = 0
        finally:
            os._exit(code)

    def submit(self, op: int, shards: list[tuple], n_total: int, batch: int) -> None:
        """Send shard k, (ids, targets) or (ids, targets, dropout), to worker k (at most n shards);
        `collect` gathers the results."""
        self._start()
        self._replies = [None] * len(shards)  # replies already read (a goodbye, found on a failed send)
        for k, (ids, targets, *more) in enumerate(shards):
            rows, T = ids.shape
            drop = more[0] if more and more[0] is not None else Dropout(0.0, 0, 0)
            try:
                self._conns[k].send_bytes(
                    _REQUEST.pack(op, rows, T, n_total, batch, drop.p, drop.seed, drop.step, drop.first_row)
                    + ids.astype(np.int64).tobytes()
                    + targets.astype(np.int64).tobytes()
                )
            except OSError:  # gone: if it said goodbye first, the shard is merely undone
                self._replies[k] = self._receive(k)

    def _receive(self, k: int) -> bytes:
        """Worker k's next message; a closed socket means it died (ModelError)."""
        try:
            return self._conns[k].recv_bytes()
        except (EOFError, OSError):
            self._died(k)

    def collect(self, n_shards: int, op: int) -> list[tuple[float, dict[str, np.ndarray] | None] | None]:
        """[(loss share, gradients)] of the first n_shards workers, in order; None for a shard
        whose worker had left idle before reading it (undone: the caller computes it). The
        gradients are the workers' shared buffers: valid until the next call."""
        out, failures = [], []
        for k in range(n_shards):
            reply = self._replies[k] if self._replies[k] is not None else self._receive(k)
            status, loss = _REPLY.unpack_from(reply)
            if status == _ERROR:
                failures.append(reply[_REPLY.size :].decode("utf-8", "replace"))
            out.append(None if status == _BYE else (loss, self._grads[k] if op == LOSS_AND_GRADS else None))
        if failures:
            raise ModelError(f"a worker process failed: {failures[0]}")
        if None in out:  # a worker left: reap them all now (their buffers stay valid), fork anew next call
            self.close()
        return out

    def _died(self, k: int) -> NoReturn:
        pid = self._pids[k]
        self.close()
        raise ModelError(f"worker process {pid} died (killed, or out of memory?); the next call starts new workers")

    def close(self) -> None:
        """Stop the workers (their sockets close, they exit) and wait for them; the next call
        forks new ones."""
        _shut_down(self._conns, self._pids, self._owner)
        self._grads.clear()


def _shut_down(conns: list[Connection], pids: list[int], owner: int) -> None:
    """Close the sockets (a worker blocked on its socket then sees EOF and exits), kill workers
    that may be busy with a shard nobody will collect, and reap them (only the process that
    forked them can)."""
    for conn in conns:
        conn.close()
    if os.getpid() == owner:
        kill_and_reap(pids)  # common.pool's one way to stop workers: nothing is read from them again
    conns.clear()
    pids.clear()


def _serve(shard_loss, shard_loss_and_grads, conn: Connection, grads_out: dict[str, np.ndarray]) -> None:
    """The worker's loop: read a request, compute the shard, reply; leave at EOF or when idle
    for IDLE_EXIT_S."""
    while True:
        try:
            if not conn.poll(IDLE_EXIT_S):
                conn.send_bytes(_REPLY.pack(_BYE, float("nan")))
                return
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            return
        op, rows, T, n_total, batch, p, seed, step, first_row = _REQUEST.unpack_from(msg)
        drop = {"dropout": Dropout(p, seed, step, first_row)} if p > 0 else {}
        n = rows * T
        ids = np.frombuffer(msg, np.int64, n, _REQUEST.size).reshape(rows, T)
        targets = np.frombuffer(msg, np.int64, n, _REQUEST.size + 8 * n).reshape(rows, T)
        try:
            if op == LOSS:
                reply = _REPLY.pack(_OK, shard_loss(ids, targets, batch, n_total))
            else:
                reply = _REPLY.pack(_OK, shard_loss_and_grads(ids, targets, n_total, grads_out, **drop)[0])
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it; the worker lives on
            reply = _REPLY.pack(_ERROR, float("nan")) + f"{type(exc).__name__}: {exc}".encode()
        try:
            conn.send_bytes(reply)
        except OSError:
            return
