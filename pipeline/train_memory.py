"""Whether a training run fits this machine's memory: which rows of each batch and how many
workers one process holds, and which parameters AdamW keeps moments for, handed to
`transformer.memory.check_memory` for a one-line error before any work instead of a MemoryError
(or a machine swapping to a halt) mid-run; and whether the fine-tuning flags run on this
executor (`check_fine_tuning_flags`).

What it deliberately does not do: estimate bytes (transformer/memory.py does), or decide the
workers (TrainConfig.workers; under MPI `Ranks.local_workers`).
"""

from __future__ import annotations

import math

from tokenkit.pipeline.config import TrainConfig
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.ranks import Ranks
from tokenkit.transformer import GPTConfig
from tokenkit.transformer.backends import get_backend
from tokenkit.transformer.config import param_shapes
from tokenkit.transformer.memory import check_memory
from tokenkit.transformer.runtime import available_cores


def check_training_memory(
    config: TrainConfig, vocab_size: int, ranks: Ranks | None = None, device: str = "cpu"
) -> None:
    """One line, before any work, when the run's model cannot train in this machine's memory: its
    parameters, optimizer state and the activations of a batch (`vocab_size`: the tokenizer's, or
    an upper bound of the one still to be trained; under MPI, this rank's share of the workers and
    rows), or on `device` (a missing CuPy or GPU)."""
    get_backend(device)
    check_fine_tuning_flags(config, device)
    model_config = GPTConfig.from_dict(config.model_config(vocab_size))
    total = config.workers or available_cores()  # no MPI call: the other ranks are not listening yet
    workers = total if ranks is None else max(1, total // ranks.size)
    check_step_memory(model_config, config, workers, total, ranks, device)


def check_fine_tuning_flags(config: TrainConfig, device: str) -> None:
    """One line when a fine-tuning flag asks for what this executor does not build: dropout on a
    GPU (its fused attention takes no mask)."""
    if config.dropout > 0 and device != "cpu":
        raise PipelineError(
            f"--dropout trains on the CPU only (the GPU's attention takes no mask); drop --device {device}"
        )


def check_step_memory(
    model_config: GPTConfig,
    config: TrainConfig,
    local_workers: int,
    total_workers: int,
    ranks: Ranks | None,
    device: str,
) -> None:
    """One line when a training step of this process does not fit: its `local_workers` of
    `total_workers` shards of a micro-batch (--batch-size rows) on the CPU, or on a GPU the
    whole micro-batch (under MPI, one shard per rank) in this process; with AdamW's moments for
    the parameters --freeze leaves trained, and dropout's masks."""
    batch_size = config.batch_size
    if device == "cpu":
        rows = _process_rows(batch_size, local_workers, total_workers)
    else:
        local_workers, rows = 1, _process_rows(batch_size, 1, 1 if ranks is None else ranks.size)
    shapes = param_shapes(model_config)
    frozen = config.frozen(shapes)
    trainable = sum(math.prod(shape) for name, shape in shapes.items() if name not in frozen)
    check_memory(
        model_config,
        training=True,
        workers=local_workers,
        batch_rows=rows,
        device=device,
        trainable=trainable,
        dropout=config.dropout > 0,
    )


def _process_rows(batch_size: int, local_workers: int, total_workers: int) -> int:
    """Rows of each batch this process and its workers compute: all of them, or under MPI this
    rank's share (its workers' shards of `total_workers`; rounded up, as `shard_rows` may).

    >>> _process_rows(16, 2, 8), _process_rows(16, 3, 3), _process_rows(5, 1, 2)
    (4, 16, 3)
    """
    return min(batch_size, -(-batch_size * local_workers // max(total_workers, local_workers)))
