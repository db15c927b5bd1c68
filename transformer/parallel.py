"""Data parallelism on one machine: a GPT's batches split over worker processes, as DDP wraps a module.

    model = DataParallel(GPT(config, seed=0), workers=2)
    loss, grads = model.loss_and_grads(ids, targets)   # the GPT's own signature

Each call splits the batch's rows into `workers` contiguous shards: this process computes the
first, forked worker processes (transformer/workers.py) the others at the same time, each with
single-threaded BLAS (`runtime.tuned`). A shard's loss and gradients come already scaled for the
whole batch's mean (`GPT.shard_loss_and_grads`), so they are summed, in shard order: the same
shard split gives the same bits wherever the shards run, here or in workers (one after the other
where fork is unavailable).

The wrapped model's parameters move into shared memory (`DataParallel.params` is the model's
own dict, now of shared arrays), so an optimizer's in-place updates reach the workers: wrap the
model before creating its optimizer. An entry replaced by another array is copied in before the
next call.

What it deliberately does not do: any math (the GPT does it), or BLAS and malloc settings beyond
switching `runtime.tuned` on around its calls.
"""

from __future__ import annotations

import numpy as np

from transformer.errors import ModelError
from transformer.model import GPT
from transformer.runtime import available_cores, tuned
from transformer.workers import LOSS, LOSS_AND_GRADS, WorkerPool, fork_available


class DataParallel:
    """`model` with each batch split over `workers` processes (default: one per available core)."""

    def __init__(self, model: GPT, workers: int | None = None):
        if not isinstance(model, GPT):
            raise ModelError(f"DataParallel wraps a GPT, got {type(model).__name__}")
        workers = available_cores() if workers is None else workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ModelError(f"workers must be a positive integer or None, got {workers!r}")
        self.model = model
        self.workers = workers
        self._pool = self._new_pool(model.params) if workers > 1 and fork_available() else None
        if self._pool is not None:
            model.params.update(self._pool.params)  # the same dict, now of shared arrays

    @property
    def config(self):
        return self.model.config

    @property
    def params(self) -> dict[str, np.ndarray]:
        return self.model.params

    @params.setter
    def params(self, value: dict[str, np.ndarray]) -> None:  # copied into the workers' memory each call
        self.model.params = value

    def _new_pool(self, params: dict[str, np.ndarray]) -> WorkerPool:
        config = self.model.config  # the pool must not hold the model: it is closed when we go

        def make_worker(shared_params):  # runs in the worker, after the fork
            worker = _as_is(config, shared_params)
            return worker.shard_loss, worker.shard_loss_and_grads

        return WorkerPool(params, self.workers - 1, make_worker)

    def _sharded(self, op: int, ids: np.ndarray, targets: np.ndarray, here) -> list:
        """[(loss share, grads or None)] of each batch shard, in shard order. `here(ids, targets)`
        computes a shard in this process: the first one, while the workers compute the others
        (or every shard, one after the other, without workers)."""
        B = ids.shape[0]
        n = max(1, min(self.workers, B))
        cuts = np.linspace(0, B, n + 1).round().astype(int)
        shards = [slice(cuts[k], cuts[k + 1]) for k in range(n)]
        with tuned():
            if n == 1 or self._pool is None:
                return [here(ids[rows], targets[rows]) for rows in shards]
            if not self._pool.usable_with(self.params):  # e.g. float64 params, or this is a forked copy
                self._pool.close()
                self._pool = self._new_pool(self.params)
            pool = self._pool
            try:
                pool.sync(self.params)
                pool.submit(op, [(ids[rows], targets[rows]) for rows in shards[1:]], ids.size, B)
                results = [here(ids[shards[0]], targets[shards[0]]), *pool.collect(n - 1, op)]
            except BaseException:  # e.g. Ctrl-C: replies may still be on their way; fresh workers next time
                pool.close()
                raise
            # a shard whose worker had just left idle is computed here (same arithmetic, same numbers)
            return [r if r is not None else here(ids[rows], targets[rows]) for r, rows in zip(results, shards)]

    def loss(self, ids, targets) -> float:
        """Mean cross-entropy over the whole batch (forward only), as `GPT.loss`."""
        ids, targets = self.model.check_pair(ids, targets)
        B = ids.shape[0]
        shards = self._sharded(LOSS, ids, targets, lambda i, t: (self.model.shard_loss(i, t, B), None))
        return float(sum(loss for loss, _ in shards))

    def loss_and_grads(self, ids, targets) -> tuple[float, dict[str, np.ndarray]]:
        """(mean loss, grads keyed like params), as `GPT.loss_and_grads`: the shards' gradients
        summed in shard order. The arrays are valid until the next call."""
        ids, targets = self.model.check_pair(ids, targets)
        shards = self._sharded(LOSS_AND_GRADS, ids, targets, lambda i, t: self.model.shard_loss_and_grads(i, t, ids.size))
        grads = {name: shards[0][1][name] for name in self.params}  # drops the absent biases' None
        for _, more in shards[1:]:
            for name, g in grads.items():
                g += more[name]
        return float(sum(loss for loss, _ in shards)), grads

    def forward(self, ids, trace: dict | None = None) -> np.ndarray:
        """The model's forward, in this process (a few sequences: nothing to split)."""
        return self.model.forward(ids, trace)

    def generate(self, ids, max_new_tokens: int, **kwargs):
        """The model's generation, in this process: one sequence, BLAS as configured (its GEMVs
        gain from BLAS threads, BENCHMARKS.md)."""
        return self.model.generate(ids, max_new_tokens, **kwargs)

    def save(self, path, metadata=None, extra_tensors=None) -> None:
        self.model.save(path, metadata=metadata, extra_tensors=extra_tensors)

    def close(self) -> None:
        """Stop the workers now (they also stop when this object goes, or after a minute idle)."""
        if self._pool is not None:
            self._pool.close()


def _as_is(config, params: dict[str, np.ndarray]) -> GPT:
    """A GPT over `params` exactly as given: the shared arrays themselves, in their dtype (float64
    for finite-difference checks)."""
    model = GPT.__new__(GPT)
    model.config, model.params, model._scratch = config, params, {}
    return model
