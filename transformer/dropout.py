"""Dropout while training (nanoGPT's `--dropout`): which elements are dropped, and where.

nanoGPT drops, with probability p and the survivors scaled by 1 / (1 - p), the attention weights
(after the softmax, before they weigh v) and each residual branch before it joins the stream
(after attention's output projection and after the MLP's). tk drops the same three, in every
layer, in training steps only: evaluation, generation, `tk explain` and the page never draw a
mask (they never pass a `Dropout`).

The masks are a pure function of (seed, step, global row, layer, site): each row of the step's
batch draws its own from a generator seeded with those numbers, so a row's mask is the same
whichever shard, worker, MPI rank or micro-batch computes it. That is what keeps a run with
dropout bit-identical across worker counts that cut the batch alike, under `mpirun`, and through
`--resume` (the step and the seed are the whole of the state: nothing is drawn ahead).

A mask is stored in the activations' dtype, 0 or 1 / (1 - p), and the backward multiplies by
the same array. Plain twins: `transformer.reference.dropout` and `dropout_backward`.

What it does not do: decide p (TrainConfig.dropout), run on a GPU (the masks are drawn on the
host and moved; the GPU's fused attention takes none, so training with dropout there is
refused), or apply them (block.py and attention.py do).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the three places of a layer that drop (the last number of a mask's seed)
ATTN_WEIGHTS, ATTN_OUT, MLP_OUT = 0, 1, 2


@dataclass(frozen=True)
class Dropout:
    """Dropout of probability `p` in the training step `step` of a run seeded `seed`, for the
    rows of a batch from `first_row` on (a shard's first row in the whole step's batch).

    >>> d = Dropout(0.5, seed=1, step=3)
    >>> m = d.mask(0, MLP_OUT, rows=2, shape=(2, 4), dtype=np.float32)
    >>> m.shape, sorted(set(m.ravel().tolist())) == [0.0, 2.0]
    ((2, 2, 4), True)
    >>> bool((d.shifted(1).mask(0, MLP_OUT, 1, (2, 4), np.float32)[0] == m[1]).all())
    True
    """

    p: float
    seed: int
    step: int
    first_row: int = 0

    def shifted(self, rows: int) -> Dropout:
        """The same dropout for the rows from `first_row + rows` on (a later shard's)."""
        return Dropout(self.p, self.seed, self.step, self.first_row + rows)

    def mask(self, layer: int, site: int, rows: int, shape: tuple[int, ...], dtype) -> np.ndarray:
        """(rows, *shape) host array of 0 and 1 / (1 - p), in `dtype`: row r's from a generator
        seeded (seed, step, first_row + r, layer, site), so it depends on nothing else."""
        dtype = np.dtype(dtype)
        out = np.empty((rows, *shape), dtype=dtype)
        scale = dtype.type(1.0 / (1.0 - self.p))
        for r in range(rows):
            rng = np.random.default_rng([self.seed, self.step, self.first_row + r, layer, site])
            keep = rng.random(shape, dtype=np.float32) >= np.float32(self.p)  # float32 draws: half the bytes
            np.multiply(keep, scale, out=out[r])
        return out


def for_layer(dropout: Dropout | None, layer: int, backend):
    """Block `layer`'s mask maker, `drop(site, x_shape, dtype) -> mask on the backend's device`
    (shape (B, ...) of the activations it multiplies), or None without dropout."""
    if dropout is None or dropout.p == 0:
        return None

    def drop(site: int, shape: tuple[int, ...], dtype):
        return backend.to_device(dropout.mask(layer, site, shape[0], tuple(shape[1:]), np.dtype(dtype)))

    return drop
