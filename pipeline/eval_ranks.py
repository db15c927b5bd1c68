"""`mpirun -n N tk eval -m MODEL FILE...` (and `--task`): one process's answer, bit for bit.

"The same answer" here means: the summed nats (so loss, bits per byte and perplexity), the
counts, and with --task every choice's log-likelihood, equal to the last bit to those of one
process on the same machine, device and BLAS settings, whatever N is. How:

- Every rank reads and encodes every document, and so makes the same forward passes as one
  process (`pipeline.evaluate.passes`: which windows share a pass depends on the documents
  alone); rank r runs passes r, r + N, r + 2N, ... A window's losses depend on the pass it is
  in (BLAS may block a GEMM differently for another batch), so the passes, not the documents,
  are what is shared out. Encoding is repeated on every rank: the price of the same passes,
  small next to the forward passes of any model worth spreading over ranks.
- Each rank keeps its windows' sums (float64) and sends them to rank 0 as one array
  (`common.mpi.send_arrays`, never pickled), in rank order; rank 0 adds all of them with
  math.fsum (`evaluate.summed`), whose correctly rounded sum is the same in any order.
- --task: the choices' rows are batched as one process batches them (`choices.batches`), rank
  r runs batches r, r + N, ...; each row's log-likelihood travels to rank 0 and lands at its
  own index, so each is the very float one process computes.

Rank 0 alone prints, shows the progress bar and writes a run directory's eval.json. Inputs
every rank can read from the start are required: stdin and pipes are refused in one line.

What it deliberately does not do: any scoring math (pipeline/evaluate.py, pipeline/choices.py),
or end the ranks on an error (cli.launch.end_together around the command does).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from tokenkit.common.mpi import recv_arrays, send_arrays, wait
from tokenkit.pipeline import choices, evaluate
from tokenkit.pipeline.errors import PipelineError

_POLL_S = 0.01  # a rank done with its share sleeps between polls instead of spinning on a core another needs


def check_inputs(paths: Iterable[str | os.PathLike]) -> None:
    """A one-line PipelineError for an input only one process can read: stdin ("-"), a pipe."""
    for path in paths:
        if str(path) == "-":
            kind = "stdin (-)"
        else:
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue  # missing: the corpus reader says so, in its words
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                continue
            kind = f"{path} (not a regular file)"
        raise PipelineError(
            f"under MPI every rank reads the whole corpus, and {kind} can be read only once; give files "
            "(save the text to a file first), or run tk eval without mpirun"
        )


def local_rank(comm) -> int:
    """This rank's number among the ranks of its node (which GPU it takes with --device cuda)."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def score_texts(
    comm,
    model,
    tokenizer,
    texts: Iterable[bytes],
    policy: dict,
    *,
    stride: int | None = None,
    progress: Callable[[int], None] = lambda n: None,
) -> evaluate.Score | None:
    """`evaluate.score_texts` over the ranks of `comm`: the Score on rank 0, None on the others."""
    rank, size = comm.Get_rank(), comm.Get_size()
    documents = ((tokenizer.encode_for_model(t, **policy), len(t)) for t in texts)
    nats, score = evaluate.window_nats(model, documents, stride=stride, progress=progress, share=(rank, size))
    parts = _to_root(comm, [nats], [np.float64])
    return None if parts is None else evaluate.summed(score, [p[0] for p in parts])


def score_items(
    comm,
    model,
    tokenizer,
    items: Sequence[choices.Item],
    policy: dict | None = None,
    *,
    progress: Callable[[int], None] = lambda n: None,
) -> choices.Scores | None:
    """`choices.score_items` over the ranks of `comm`: the Scores on rank 0, None on the others.
    `progress(n)` is told this rank's rows as each of its passes ends."""
    rank, size = comm.Get_rank(), comm.Get_size()
    plan = choices.plan(model, tokenizer, items, policy)
    mine = [batch for i, batch in enumerate(plan.batches) if i % size == rank]
    sums = np.zeros(len(plan.rows), dtype=np.float64)
    greedy = np.zeros(len(plan.rows), dtype=bool)
    for batch in mine:
        sums[batch], greedy[batch] = choices.row_logprobs(model, [plan.rows[i] for i in batch])
        progress(len(batch))
    at = np.concatenate([np.zeros(0, dtype=np.int64), *(np.asarray(b, dtype=np.int64) for b in mine)])
    parts = _to_root(comm, [at, sums[at], greedy[at].view(np.uint8)], [np.int64, np.float64, np.uint8])
    if parts is None:
        return None
    for where, values, flags in parts[1:]:  # each row at its own index: rank 0's own are in place
        sums[where], greedy[where] = values, flags.view(bool)
    return choices.assemble(items, plan, sums, greedy)


def _to_root(comm, arrays: list[np.ndarray], dtypes: list) -> list[list[np.ndarray]] | None:
    """Every rank's `arrays`, in rank order, on rank 0 (None on the others). The ranks meet first,
    sleeping while they wait: one done early does not spin on a core the others compute on."""
    wait(comm.Ibarrier(), poll_s=_POLL_S)
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank:
        send_arrays(comm, 0, arrays)
        return None
    return [arrays, *(recv_arrays(comm, r, dtypes) for r in range(1, size))]
