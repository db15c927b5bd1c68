"""Training on MPI ranks: rank 0 leads the run, the others follow it.

Under `mpirun -n N tk train-model ...` (or `tk pipeline`) rank 0 does everything a plain run
does: it takes the run directory's lock, validates, trains the tokenizer, encodes the corpus,
writes every file, the log and the progress bar. When its training loop starts it sends the
other ranks what they need to join (`start`): the run's settings and tokenizer as bytes (JSON
and safetensors, never pickle), then its weights, optimizer moments, step and batch generator
as raw arrays (`share_state`). Each follower then opens the run's token file itself (a
filesystem every rank sees, as on any cluster) and reads only its own windows of each batch.

Every step the ranks agree on whether to stop (`any`, one tiny Allreduce): Ctrl-C or SIGTERM
(mpirun forwards both to every rank) stops all of them at the same step boundary, where rank 0
alone saves. When rank 0 finishes without training (a finished run, an up-to-date pipeline)
it says so (`finish`), and the followers exit quietly.

What it deliberately does not do: decide what a run's announcement holds or build the
followers' run from it (pipeline/join.py), any math (`transformer.parallel.MPIDataParallel`
computes and sums the shards), or import mpi4py itself except to count the ranks on one node.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.io import deserialize, serialize
from tokenkit.common import jsonsafe
from tokenkit.common.mpi import wait
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.backends import as_host, backend_of
from tokenkit.transformer.runtime import available_cores

_POLL_S = 0.01  # a waiting follower sleeps between polls instead of spinning on a core rank 0 needs


class Ranks:
    """The MPI job a training run spreads over: `comm` (an mpi4py communicator of size > 1)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.leader = self.rank == 0
        self.started = False
        # Counted here, where every rank is: rank 0 needs it for `--workers 0` while the others
        # already wait for the run to start (a collective then was a deadlock)
        self.local_rank, self._default_workers = self._count_on_node()

    # -- how many shards ----------------------------------------------------------------------

    def default_workers(self) -> int:
        """Local workers per rank for `--workers 0`: this node's cores shared among its ranks,
        the smallest count of any node (every rank runs the same number)."""
        return self._default_workers

    def _count_on_node(self) -> tuple[int, int]:
        """(this rank's number among the ranks of its node, which picks its GPU; default workers)."""
        from mpi4py import MPI

        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            local_rank = node.Get_rank()
            mine = np.array([max(1, available_cores() // node.Get_size())], dtype=np.int64)
        finally:
            node.Free()
        least = np.empty(1, dtype=np.int64)
        wait(self.comm.Iallreduce(mine, least, op=MPI.MIN))
        return local_rank, int(least[0])

    def local_workers(self, shards: int) -> int:
        """Workers per rank for a run of `shards` batch shards per step (TrainConfig.workers)."""
        if shards % self.size:
            raise PipelineError(
                f"the run splits each batch into {shards} shards (--workers {shards} in one process), which "
                f"{self.size} ranks cannot share evenly; "
                f"run it on a rank count that divides {shards}, or without mpirun"
            )
        return shards // self.size

    # -- joining the leader's run ---------------------------------------------------------------

    def start(self, spec: dict[str, Any], tokenizer: Tokenizer) -> None:
        """Rank 0: tell the followers the run starts (`spec`: JSON-able settings) and with what tokenizer."""
        self.started = True
        self._send(json.dumps(spec, sort_keys=True).encode())
        self._send(serialize(*tokenizer.to_tensors()))

    def finish(self) -> None:
        """Rank 0, at the end of the command: if no training started, let the followers go."""
        if self.leader and not self.started:
            self.started = True
            self._send(b"")

    def wait_for_start(self) -> tuple[dict[str, Any], Tokenizer] | None:
        """A follower: (spec, tokenizer) of the run rank 0 starts, or None when it trains nothing."""
        spec_bytes = self._receive()
        if not spec_bytes:
            return None
        spec = jsonsafe.loads(spec_bytes.decode(), "the run's settings from rank 0")
        return spec, Tokenizer.from_tensors(*deserialize(self._receive(), "the tokenizer from rank 0"))

    def share_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Rank 0's arrays copied into every rank's arrays of the same names, shapes and dtypes
        (a GPU's arrays through the host)."""
        for name in sorted(arrays):
            a = arrays[name]
            if not isinstance(a, np.ndarray):  # on a GPU: broadcast a host copy, then copy it back
                buf = as_host(a)
                wait(self.comm.Ibcast(buf, root=0))
                a[...] = backend_of(a).to_device(buf)
                continue
            buf = a if a.flags.c_contiguous and a.flags.writeable else np.ascontiguousarray(a)
            wait(self.comm.Ibcast(buf, root=0))
            if buf is not a:
                a[...] = buf

    # -- agreeing every step --------------------------------------------------------------------

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any of them (every step: one byte per rank)."""
        flags = np.empty(self.size, dtype=np.int8)
        mine = np.array([int(flag)], dtype=np.int8)
        wait(self.comm.Iallgather(mine, flags))
        return bool(flags.any())

    def leaders(self, flag: bool) -> bool:
        """Rank 0's `flag`, on every rank."""
        buf = np.array([int(flag)], dtype=np.int8)
        wait(self.comm.Ibcast(buf, root=0))
        return bool(buf[0])

    # -- bytes from rank 0, waited for without spinning ------------------------------------------

    def _send(self, payload: bytes) -> None:
        self._bcast(np.array([len(payload)], dtype=np.int64))
        if payload:
            self._bcast(np.frombuffer(payload, dtype=np.uint8).copy())

    def _receive(self) -> bytes:
        n = np.empty(1, dtype=np.int64)
        self._bcast(n)
        if not 0 <= int(n[0]) <= 1 << 30:
            raise PipelineError(f"rank 0 announced a {int(n[0])}-byte message; the ranks disagree about the run")
        payload = np.empty(int(n[0]), dtype=np.uint8)
        if len(payload):
            self._bcast(payload)
        return payload.tobytes()

    def _bcast(self, buf: np.ndarray) -> None:
        wait(self.comm.Ibcast(buf, root=0), poll_s=_POLL_S)
