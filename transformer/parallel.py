"""Data parallelism: a GPT's batches split over worker processes or MPI ranks, as DDP wraps a module.

    model = DataParallel(GPT(config, seed=0), workers=2)          # one machine, forked workers
    model = MPIDataParallel(GPT(config, seed=0), comm, workers=1)  # one rank of `mpirun -n N`
    loss, grads = model.loss_and_grads(ids, targets)              # the GPT's own signature

Each call splits the batch's rows into contiguous shards (`shard_rows`, the one split every
executor uses). DataParallel computes the first shard in this process and the others in forked
worker processes (transformer/workers.py) at the same time, each with single-threaded BLAS
(`runtime.tuned`). A shard's loss and gradients come already scaled for the whole batch's mean
(`GPT.shard_loss_and_grads`), so they are summed, in shard order: the same shard split gives
the same bits wherever the shards run, here, in workers or on other ranks
(`ordered_allreduce`).

Training's extras ride on the same split: a step's dropout (transformer/dropout.py) reaches each
shard with the index of its first row in the step's batch, so a row draws the same masks wherever
it is computed; and gradient accumulation (`micro_batches`) computes the batch a micro-batch at a
time, every shard in one running sum in order (`step_shards`): under MPI each rank keeps adding
its segment of the parameters micro-batch after micro-batch, and the sums are gathered once.

DataParallel moves the wrapped model's parameters into shared memory (`params` is the model's
own dict, now of shared arrays), so an optimizer's in-place updates reach the workers: wrap the
model before creating its optimizer. An entry replaced by another array is copied in before the
next call.

A model on a GPU runs in this process under DataParallel (workers=1 passes its calls through;
more workers are refused: they are CPU processes). Under MPI each rank computes one shard on its
own GPU (`backends.use_gpu`, before the model is made); its gradients come to the host in one
transfer, are summed in shard order by `ordered_allreduce` and go back: the same bits as one
process computing the same shards in turn on such a GPU (`sum_of_shards`), for any number of
ranks per GPU.

What it deliberately does not do: any math (the GPT does it), BLAS and malloc settings beyond
switching `runtime.tuned` on around its calls, or reduce on the GPU (NCCL, CUDA-aware MPI): an
in-order sum there is not built, and NCCL refuses two ranks on one GPU.
"""

from __future__ import annotations

import numpy as np

from tokenkit.common.mpi import wait
from tokenkit.transformer.dropout import Dropout
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.loss import batch_counted, counted_positions
from tokenkit.transformer.model import GPT
from tokenkit.transformer.runtime import available_cores, tuned
from tokenkit.transformer.workers import LOSS, LOSS_AND_GRADS, WorkerPool, fork_available


def shard_rows(batch_rows: int, n_shards: int) -> list[slice]:
    """The rows of each of min(n_shards, batch_rows) contiguous, near-equal shards of a batch: the
    one split every executor uses, so that they all give the same numbers.

    >>> shard_rows(7, 3)
    [slice(0, 2, None), slice(2, 5, None), slice(5, 7, None)]
    """
    n = max(1, min(n_shards, batch_rows))
    cuts = np.linspace(0, batch_rows, n + 1).round().astype(int)
    return [slice(int(cuts[k]), int(cuts[k + 1])) for k in range(n)]


def step_shards(batch_rows: int, n_shards: int, micro_batches: int = 1) -> list[slice]:
    """The shards of a step's `batch_rows` rows computed as `micro_batches` equal micro-batches,
    each cut by `shard_rows`: in the order they are summed.

    >>> step_shards(8, 2, micro_batches=2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 6, None), slice(6, 8, None)]
    """
    size = micro_rows(batch_rows, micro_batches)
    return [
        slice(k * size + rows.start, k * size + rows.stop)
        for k in range(micro_batches)
        for rows in shard_rows(size, n_shards)
    ]


def micro_rows(batch_rows: int, micro_batches: int) -> int:
    """Rows of each of a step's `micro_batches` equal micro-batches; ModelError when they do not cut."""
    if micro_batches < 1 or batch_rows % micro_batches:
        raise ModelError(f"a batch of {batch_rows} rows does not cut into {micro_batches} equal micro-batches")
    return batch_rows // micro_batches


def sum_of_shards(
    model: GPT, ids, targets, n_shards: int, dropout: Dropout | None = None, micro_batches: int = 1
) -> tuple[float, dict[str, np.ndarray]]:
    """(mean loss, grads keyed like params) of `model` over `step_shards(B, n_shards, micro_batches)`,
    each shard computed in turn in this process, on the model's device, and summed in shard order: the plain
    version of what the executors compute. DataParallel(workers=n_shards) gives these bits on the
    CPU, and MPIDataParallel on n_shards ranks gives them on the CPU or on GPUs of one kind.
    `dropout`: a training step's, for the batch from its row 0 (each shard's masks are its rows')."""
    ids, targets = model.check_pair(ids, targets)
    shares, grads, counted = [], None, batch_counted(targets)
    for rows in step_shards(ids.shape[0], n_shards, micro_batches):
        drop = None if dropout is None else dropout.shifted(rows.start)
        share, more = model.shard_loss_and_grads(ids[rows], targets[rows], counted, **_given(drop))
        shares.append(share)
        if grads is None:
            grads = {name: more[name].copy() for name in model.params}
        else:
            for name, g in grads.items():
                g += more[name]
    return float(sum(shares)), grads  # sum() as the executors add: Python 3.12's compensates, unlike +=


def _given(dropout: Dropout | None) -> dict:
    """A shard call's dropout keyword, only when there is one (without it, the call of old)."""
    return {} if dropout is None else {"dropout": dropout}


class _Wrapper:
    """What every executor shares: the wrapped GPT, its config and params, and the calls that
    run in this process alone (forward, generation, save)."""

    def __init__(self, model: GPT):
        if not isinstance(model, GPT):
            raise ModelError(f"{type(self).__name__} wraps a GPT, got {type(model).__name__}")
        self.model = model

    @property
    def config(self):
        return self.model.config

    @property
    def params(self) -> dict[str, np.ndarray]:
        return self.model.params

    def host_params(self) -> dict[str, np.ndarray]:
        """The model's parameters as host NumPy arrays (`GPT.host_params`)."""
        return self.model.host_params()

    def forward(self, ids, trace: dict | None = None) -> np.ndarray:
        """The model's forward, in this process (a few sequences: nothing to split)."""
        return self.model.forward(ids, trace)

    def generate(self, ids, max_new_tokens: int, **kwargs):
        """The model's generation, in this process: one sequence, BLAS as configured (its GEMVs
        gain from BLAS threads, BENCHMARKS.md)."""
        return self.model.generate(ids, max_new_tokens, **kwargs)

    def generate_batch(self, ids, max_new_tokens: int, **kwargs):
        """The model's batched greedy decoding (`GPT.generate_batch`), in this process."""
        return self.model.generate_batch(ids, max_new_tokens, **kwargs)

    def save(self, path, metadata=None, extra_tensors=None) -> None:
        self.model.save(path, metadata=metadata, extra_tensors=extra_tensors)


class DataParallel(_Wrapper):
    """`model` with each batch split over `workers` processes (default: one per available core)."""

    def __init__(self, model: GPT, workers: int | None = None):
        super().__init__(model)
        workers = available_cores() if workers is None else workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ModelError(f"workers must be a positive integer or None, got {workers!r}")
        if workers > 1 and model.device != "cpu":
            raise ModelError(
                f"DataParallel splits batches over CPU processes, and this model is on {model.device}; "
                "use workers=1 (or no wrapper) to train it in this process"
            )
        self.workers = workers
        self._pool = self._new_pool(model.params) if workers > 1 and fork_available() else None
        if self._pool is not None:
            model.params.update(self._pool.params)  # the same dict, now of shared arrays

    @_Wrapper.params.setter
    def params(self, value: dict[str, np.ndarray]) -> None:  # copied into the workers' memory each call
        self.model.params = value

    def _new_pool(self, params: dict[str, np.ndarray]) -> WorkerPool:
        config = self.model.config  # the pool must not hold the model: it is closed when we go

        def make_worker(shared_params):  # runs in the worker, after the fork
            worker = _as_is(config, shared_params)
            return worker.shard_loss, worker.shard_loss_and_grads

        return WorkerPool(params, self.workers - 1, make_worker)

    def local_rows(self, batch_rows: int, micro_batches: int = 1) -> slice:
        """The rows of a batch (of a step of `micro_batches`) this process needs: all of them (the
        workers get theirs from it)."""
        return slice(0, batch_rows)

    def shard_results(
        self,
        op: int,
        ids: np.ndarray,
        targets: np.ndarray,
        shards: list[slice],
        batch_rows: int,
        batch_tokens: int,
        dropout: Dropout | None = None,
    ) -> list:
        """[(loss share, grads or None)] of each of `shards` (row slices of `ids`), in order, each
        scaled for a whole batch of `batch_rows` rows / `batch_tokens` counted positions. This process
        computes the first shard while the workers compute the others (or every shard, one after
        the other, without workers). `dropout` (training's, LOSS_AND_GRADS only): its first_row
        is the step batch's row of ids[0]; each shard draws its own rows' masks."""
        drops = [None if dropout is None else dropout.shifted(rows.start) for rows in shards]
        if op == LOSS:
            here = lambda i, t, d: (self.model.shard_loss(i, t, batch_rows, batch_tokens), None)  # noqa: E731
        else:
            here = lambda i, t, d: self.model.shard_loss_and_grads(i, t, batch_tokens, **_given(d))  # noqa: E731
        n = len(shards)
        with tuned():
            if n == 1 or self._pool is None:
                return [here(ids[rows], targets[rows], d) for rows, d in zip(shards, drops, strict=True)]
            if not self._pool.usable_with(self.params):  # e.g. float64 params, or this is a forked copy
                self._pool.close()
                self._pool = self._new_pool(self.params)
            pool = self._pool
            try:
                pool.sync(self.params)
                work = [(ids[rows], targets[rows], d) for rows, d in zip(shards[1:], drops[1:], strict=True)]
                pool.submit(op, work, batch_tokens, batch_rows)
                results = [here(ids[shards[0]], targets[shards[0]], drops[0]), *pool.collect(n - 1, op)]
            except BaseException:  # e.g. Ctrl-C: replies may still be on their way; fresh workers next time
                pool.close()
                raise
            # a shard whose worker had just left idle is computed here (same arithmetic, same numbers)
            return [
                r if r is not None else here(ids[rows], targets[rows], d)
                for r, rows, d in zip(results, shards, drops, strict=True)
            ]

    def _check_rows(self, ids, batch_rows: int | None) -> None:
        if batch_rows is not None and np.shape(ids)[0] != batch_rows:
            raise ModelError(
                f"this process computes all {batch_rows} rows of the batch (local_rows), got {np.shape(ids)[0]}"
            )

    def loss(self, ids, targets, batch_rows: int | None = None, counted: int | None = None) -> float:
        """Mean cross-entropy over the whole batch's counted positions (forward only), as `GPT.loss`.
        `batch_rows` and `counted`, for the executors' common call (MPIDataParallel's), must be
        the batch's own row count and counted positions."""
        ids, targets, counted = self._whole(ids, targets, batch_rows, counted)
        shards = self.shard_results(LOSS, ids, targets, shard_rows(ids.shape[0], self.workers), ids.shape[0], counted)
        return float(sum(loss for loss, _ in shards))

    def _whole(self, ids, targets, batch_rows: int | None, counted: int | None):
        """(ids, targets, counted positions) of a whole batch, checked."""
        self._check_rows(ids, batch_rows)
        ids, targets = self.model.check_pair(ids, targets)
        n = batch_counted(targets)
        if counted is not None and counted != n:
            raise ModelError(f"the batch's targets count {n} positions, not the {counted} given")
        return ids, targets, n

    def loss_and_grads(
        self,
        ids,
        targets,
        batch_rows: int | None = None,
        counted: int | None = None,
        dropout: Dropout | None = None,
        micro_batches: int = 1,
    ) -> tuple[float, dict[str, np.ndarray]]:
        """(mean loss, grads keyed like params), as `GPT.loss_and_grads`: the shards' gradients
        summed in shard order. The arrays are valid until the next call. `batch_rows`, `counted`:
        as `loss`. `dropout`: a training step's (transformer/dropout.py), for the batch from row 0.

        `micro_batches` N (gradient accumulation): the batch's rows are computed as N equal
        micro-batches one after the other, each cut over the workers, so a step holds one
        micro-batch's activations. Every shard is scaled for the whole batch's mean and the
        shards are summed in order, one running sum (`step_shards`): bit for bit what
        DataParallel(workers=N x workers) computes of the whole batch where both cut the rows
        alike, that is when the workers divide a micro-batch's rows."""
        ids, targets, counted = self._whole(ids, targets, batch_rows, counted)
        every = step_shards(ids.shape[0], self.workers, micro_batches)
        per = len(every) // micro_batches
        shares: list[float] = []
        grads: dict[str, np.ndarray] | None = None
        for k in range(micro_batches):
            results = self.shard_results(
                LOSS_AND_GRADS, ids, targets, every[k * per : (k + 1) * per], ids.shape[0], counted, dropout
            )
            shares += [loss for loss, _ in results]
            if grads is None:  # this process's first shard: arrays of its own, the running sum
                grads = {name: results[0][1][name] for name in self.params}  # drops the absent biases' None
                results = results[1:]
            for _, more in results:  # a worker's buffers are read before its next shard overwrites them
                for name, g in grads.items():
                    g += more[name]
        return float(sum(shares)), grads

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


class MPIDataParallel(_Wrapper):
    """`model` with each batch split over the ranks of an MPI communicator, `workers` shards per
    rank (computed by local worker processes, as DataParallel does).

    The batch is cut as `DataParallel(model, workers=size * workers)` cuts it, rank r taking
    shards r*workers .. r*workers + workers - 1, and the shards' gradients are summed in shard
    order by `ordered_allreduce` (an allreduce's traffic, a fixed order): loss and gradients are
    bit for bit those of `DataParallel(model, workers=size * workers)` in one process (given the
    same BLAS build). Every rank ends a step with the same gradients, so identical optimizers keep
    identical weights without a broadcast. Arrays travel as raw buffers, never pickled.

    Each rank needs only its own rows of a batch (`local_rows`): pass just those with
    `batch_rows=` the whole batch's row count (and, when some targets are IGNORE, `counted=` the
    whole batch's counted positions), and a rank reads only its own windows.

    A model on a GPU (each rank's own: `backends.use_gpu` before the model is made) computes one
    shard per rank there (workers=1); the gradients are reduced through the host, as above, and
    returned on the GPU: bit for bit `sum_of_shards(model, ..., size)` on such a GPU.

    `comm` is an mpi4py communicator; this module never imports mpi4py itself.
    """

    def __init__(self, model: GPT, comm, workers: int = 1):
        super().__init__(model)
        if model.device != "cpu" and isinstance(workers, int) and workers > 1:
            raise ModelError(
                f"MPIDataParallel computes one shard per rank on a GPU, and this model is on {model.device}; "
                "use workers=1 (local workers are CPU processes)"
            )
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._local = DataParallel(model, workers=workers)  # validates `workers`; shares the model's params
        self.workers = workers
        self.shards = self.size * workers

    @_Wrapper.params.setter
    def params(self, value: dict[str, np.ndarray]) -> None:
        self.model.params = value

    def _my_shards(self, batch_rows: int) -> tuple[int, list[slice]]:
        """(number of shards of the whole batch, this rank's shards as rows of the batch)."""
        shards = shard_rows(batch_rows, self.shards)
        first = self.rank * self.workers
        return len(shards), shards[first : first + self.workers]

    def local_rows(self, batch_rows: int, micro_batches: int = 1) -> slice | np.ndarray:
        """The rows of a `batch_rows`-row batch whose shards this rank computes (maybe none); of a
        step of `micro_batches` micro-batches, this rank's rows of each in turn (an index array)."""
        if micro_batches != 1:
            size = micro_rows(batch_rows, micro_batches)
            mine = self.local_rows(size)
            return (np.arange(micro_batches)[:, None] * size + np.arange(mine.start, mine.stop)).reshape(-1)
        _, mine = self._my_shards(batch_rows)
        return slice(mine[0].start, mine[-1].stop) if mine else slice(0, 0)

    def _local_batch(self, ids, targets, batch_rows: int | None, counted: int | None, micro_batches: int = 1):
        """(ids, targets, batch rows, the batch's counted positions, this rank's shards of each
        micro-batch as rows of its block of `ids`, number of shards of each micro-batch), `ids`
        cut down to this rank's rows (`local_rows`: a block of each micro-batch in turn) when the
        whole batch was given. Given only its rows, a rank cannot count the others': `counted`
        says how many positions of the whole batch count (default: all)."""
        whole = batch_rows is None
        if whole:
            ids, targets = self.model.check_pair(ids, targets)
            counted = batch_counted(targets) if counted is None else counted
            batch_rows = ids.shape[0]
        n, mine = self._my_shards(micro_rows(batch_rows, micro_batches))
        first = mine[0].start if mine else 0
        if whole:
            rows = self.local_rows(batch_rows, micro_batches)
            ids, targets = ids[rows], targets[rows]
        else:
            block = mine[-1].stop - first if mine else 0
            if np.shape(ids)[0] != micro_batches * block:
                where = f"rows {first}..{first + block}" if micro_batches == 1 else f"{block} rows of each micro-batch"
                raise ModelError(
                    f"rank {self.rank} computes {where} of a {batch_rows}-row batch "
                    f"(local_rows), got {np.shape(ids)[0]} rows"
                )
            if block:
                ids, targets = self.model.check_pair(ids, targets)
                if counted is None and counted_positions(targets) != targets.size:
                    raise ModelError("targets with IGNORE among a rank's rows need counted=: the whole batch's count")
        local = [slice(s.start - first, s.stop - first) for s in mine]
        counted = counted or batch_rows * ids.shape[1]
        batch_tokens = counted if local else 0  # only a rank with rows computes a share
        return ids, targets, batch_rows, batch_tokens, local, n

    def _gather(self, local: np.ndarray) -> np.ndarray:
        """(size * workers, ...): every rank's `local` (workers, ...), in rank order, on every rank."""
        out = np.empty((self.size, *local.shape), dtype=local.dtype)
        local = np.ascontiguousarray(local)
        wait(self.comm.Iallgather(local, out))
        return out.reshape(self.shards, *local.shape[1:])

    def loss(self, ids, targets, batch_rows: int | None = None, counted: int | None = None) -> float:
        """Mean cross-entropy over the whole batch, as `GPT.loss` (`batch_rows`, `counted`: see
        the class)."""
        ids, targets, batch_rows, batch_tokens, local, n = self._local_batch(ids, targets, batch_rows, counted)
        shares = np.zeros(self.workers, dtype=np.float64)
        if local:
            results = self._local.shard_results(LOSS, ids, targets, local, batch_rows, batch_tokens)
            shares[: len(results)] = [loss for loss, _ in results]
        return float(sum(self._gather(shares)[:n].tolist()))

    def loss_and_grads(
        self,
        ids,
        targets,
        batch_rows: int | None = None,
        counted: int | None = None,
        dropout: Dropout | None = None,
        micro_batches: int = 1,
    ) -> tuple[float, dict[str, np.ndarray]]:
        """(mean loss, grads keyed like params), as `GPT.loss_and_grads` (`batch_rows`, `counted`:
        see the class). `dropout`: a training step's, for the whole batch from its row 0 (each
        rank's shards draw their own rows' masks).

        `micro_batches` N (gradient accumulation): the rows are N equal micro-batches, each cut
        as a batch of its own (`local_rows(batch_rows, N)`: this rank's rows of each), computed
        one after the other; every shard is scaled for the whole batch, and each rank adds its
        segment of the parameters on, shard by shard in order across the micro-batches, before
        the sums are gathered once: bit for bit `DataParallel(workers=size * workers)` with the
        same micro_batches."""
        ids, targets, batch_rows, batch_tokens, local, n = self._local_batch(
            ids, targets, batch_rows, counted, micro_batches
        )
        size = batch_rows // micro_batches
        block = local[-1].stop if local else 0  # this rank's rows of each micro-batch
        first = self.local_rows(size).start  # their first row in a micro-batch
        names = list(self.params)
        sizes = [self.params[name].size for name in names]
        flat = np.zeros((self.workers, sum(sizes)), dtype=self.params[names[0]].dtype)  # this rank's shards
        shares = np.zeros((self.workers, micro_batches), dtype=np.float64)
        segment = None  # this rank's segment of the running sum
        for k in range(micro_batches):
            if local:
                drop = None if dropout is None else dropout.shifted(k * size + first)
                mb = slice(k * block, (k + 1) * block)
                results = self._local.shard_results(
                    LOSS_AND_GRADS, ids[mb], targets[mb], local, batch_rows, batch_tokens, drop
                )
                for j, (loss, grads) in enumerate(results):
                    shares[j, k] = loss
                    if self.model.device == "cpu":
                        np.concatenate([grads[name].reshape(-1) for name in names], out=flat[j])
                    else:  # from the GPU in one transfer
                        flat[j] = self.model.backend.to_host(
                            self.model.xp.concatenate([grads[name].reshape(-1) for name in names])
                        )
            with tuned():
                segment = ordered_reduce_scatter(self.comm, flat, n, segment)
        with tuned():
            total = gather_segments(self.comm, segment, flat.shape[1])
        # the shards' shares, micro-batch after micro-batch, in shard order: as one process lists them
        loss = float(sum(self._gather(shares)[:n].T.reshape(-1).tolist()))
        offsets = np.cumsum([0, *sizes])
        # on the CPU views of `total`; to a GPU each tensor goes as an array of its own, as the model's own gradients
        put = self.model.backend.to_device
        return loss, {
            name: put(total[offsets[i] : offsets[i + 1]].reshape(self.params[name].shape))
            for i, name in enumerate(names)
        }

    def close(self) -> None:
        """Stop this rank's local workers."""
        self._local.close()


def ordered_allreduce(comm, flat: np.ndarray, n: int) -> np.ndarray:
    """(P,): the sum of the first `n` shards, in shard order, on every rank of `comm`, where
    `flat` (W, P) holds this rank's W shards (rank r's are shards r*W .. r*W + W - 1).

    An allreduce whose result does not depend on how many ranks there are: the vector is cut
    into one segment per rank; `Alltoallv` brings every shard's piece of segment j to rank j,
    which adds them in shard order (what one process does, element by element:
    `ordered_reduce_scatter`); `Allgatherv` hands the sums to every rank (`gather_segments`).
    Each rank sends and receives about 2 (size - 1) / size of P (W times that for the first
    half), as a ring allreduce does.
    """
    return gather_segments(comm, ordered_reduce_scatter(comm, flat, n), flat.shape[1])


def _segments(comm, P: int) -> np.ndarray:
    """(size + 1,): where each rank's segment of a P-vector starts, and P."""
    return np.linspace(0, P, comm.Get_size() + 1).round().astype(np.int64)


def ordered_reduce_scatter(comm, flat: np.ndarray, n: int, segment: np.ndarray | None = None) -> np.ndarray:
    """This rank's segment of the sum of the first `n` shards of `flat` (as `ordered_allreduce`),
    added in shard order onto `segment` when given: the running sum of earlier micro-batches,
    updated in place."""
    size, rank = comm.Get_size(), comm.Get_rank()
    W, P = flat.shape
    cuts = _segments(comm, P)
    lengths = np.diff(cuts)
    if W == 1:  # the segments already lie in destination order
        send = np.ascontiguousarray(flat).reshape(-1)
    else:
        send = np.concatenate([flat[:, cuts[j] : cuts[j + 1]].reshape(-1) for j in range(size)])
    send_counts = W * lengths
    mine = int(lengths[rank])
    received = np.empty((size * W, mine), dtype=flat.dtype)  # row = global shard index
    recv_counts = np.full(size, W * mine, dtype=np.int64)
    send_displs, recv_displs = np.cumsum(send_counts) - send_counts, np.arange(size, dtype=np.int64) * W * mine
    wait(comm.Ialltoallv([send, (send_counts, send_displs)], [received, (recv_counts, recv_displs)]))
    if segment is None:
        segment, received = received[0].copy(), received[1:n]
    else:
        received = received[:n]
    for shard in received:  # in shard order, as DataParallel sums
        segment += shard
    return segment


def gather_segments(comm, segment: np.ndarray, P: int) -> np.ndarray:
    """(P,): every rank's `segment` (`ordered_reduce_scatter`'s) in rank order, on every rank."""
    cuts = _segments(comm, P)
    total = np.empty(P, dtype=segment.dtype)
    wait(comm.Iallgatherv(segment, [total, (np.diff(cuts), cuts[:-1])]))
    return total
