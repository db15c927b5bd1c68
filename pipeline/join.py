"""An MPI training run joined: rank 0 announces its run and shares its state, the other ranks
`follow`, building the same run from the announcement (pipeline/ranks.py carries the messages).

Rank 0 announces a run once it is set up and about to train (`join`): its directory, settings,
corpus and token counts as JSON, and its tokenizer. Every rank then takes rank 0's weights,
AdamW moments, step and batch generator (`TrainingRun.state_arrays`), so all of them start the
loop from the same state; each follower opens the run's token files itself and trains its
shards alongside, writing nothing.

What it deliberately does not do: count ranks or move bytes (pipeline/ranks.py), or compute
and sum the shards (`transformer.parallel.MPIDataParallel`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenkit.pipeline import chat_data, data
from tokenkit.pipeline.config import TrainConfig
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.ranks import Ranks
from tokenkit.pipeline.train import TrainingRun, TrainResult
from tokenkit.transformer.parallel import shard_rows


def train_joined(run: TrainingRun) -> TrainResult:
    """Train `run`: alone, or under MPI once every rank has joined it."""
    if run.ranks is not None:
        join(run)
    return run.run()


def join(run: TrainingRun) -> None:
    """Rank 0 announces the run; then every rank takes rank 0's weights, moments, step and generator."""
    ranks = run.ranks
    if ranks.leader:
        ranks.start(_announcement(run), run.tokenizer)
    arrays = run.state_arrays()
    ranks.share_state(arrays)
    if not ranks.leader:
        run.take_state(arrays)


def _announcement(run: TrainingRun) -> dict[str, Any]:
    """What a follower needs to build rank 0's run (`follow` reads it)."""
    if run.chat is not None:  # conversations: each rank reads and packs them itself, checked by their key
        spec = run.chat.spec
        paths = {"path": os.path.abspath(spec.path), "val": spec.val and os.path.abspath(spec.val)}
        return {
            "run_dir": str(run.run_dir.resolve()),
            "config": run.config.to_dict(),
            chat_data.CHAT_KEY: paths,
            "key": run.chat.key(),
            "vocab_size": run.model_config.vocab_size,
        }
    val_ids = run.tokens.val_ids
    return {
        "run_dir": str(run.run_dir.resolve()),
        "config": run.config.to_dict(),
        "n_tokens": int(len(run.tokens.ids)),
        "n_val_tokens": None if val_ids is None else int(len(val_ids)),
        "corpus": run.tokens.spec.to_dict(),
        "key": run.tokens.key(),
        "vocab_size": run.model_config.vocab_size,
    }


def follow(ranks: Ranks, *, device: str = "cpu", quiet: bool = True) -> TrainResult | None:
    """A rank other than 0: wait for rank 0's run to start, then train it alongside (writing
    nothing), on `device` (its own GPU for "cuda": `backends.use_gpu`). None when rank 0 ended
    without training."""
    started = ranks.wait_for_start()
    if started is None:
        return None
    spec, tokenizer = started
    run_dir = Path(spec["run_dir"])
    config = TrainConfig.from_dict(spec["config"])
    if chat_data.CHAT_KEY in spec:
        tokens = chat_data.ChatData.load(
            chat_data.spec_from_record(spec, "rank 0's announcement"),
            tokenizer,
            config.context_length,
            config.val_fraction,
        )
        if tokens.key() != spec["key"]:
            raise PipelineError(
                f"{tokens.spec.path}: this process reads other conversations than rank 0; every rank needs the "
                "conversations on a filesystem they all see"
            )
    else:
        tokens = data.open_tokens(
            run_dir, tokenizer, spec["corpus"], spec["key"], spec["n_tokens"], spec.get("n_val_tokens")
        )
    run = TrainingRun(
        run_dir, tokens, tokenizer, config, quiet=quiet, ranks=ranks, device=device, vocab_size=spec.get("vocab_size")
    )
    return train_joined(run)


def describe_split(run: TrainingRun) -> str:
    """How each step's batch (each of its --grad-accum micro-batches) is shared (the summary's line under MPI)."""
    m, B = run.model, run.config.batch_size
    shards = shard_rows(B, m.shards)
    per_rank = [sum(s.stop - s.start for s in shards[r * m.workers : (r + 1) * m.workers]) for r in range(m.size)]
    rows = ", ".join(f"rank {r}: {n}" for r, n in enumerate(per_rank))
    where = "" if m.model.device == "cpu" else ", each on its rank's GPU (gradients summed on the host)"
    return (
        f"mpi: {m.size} ranks x {m.workers} worker{'s' * (m.workers != 1)} = {m.shards} shards of each "
        f"{B}-row {'micro-batch' if run.config.grad_accum > 1 else 'batch'} (rows {rows}){where}; rank 0 writes"
    )
