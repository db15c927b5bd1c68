"""How the CPU ops cut their work into cache-sized pieces: blocks of rows for the elementwise
passes (LayerNorm, RMSNorm, GELU, the cross-entropy), tiles of queries for causal attention.

NumPy makes one pass over a whole array per call, so a chain of passes over an array bigger than
L2 reads it from memory each time. Cut into pieces of about a megabyte, the passes after the first
hit cache. The loops over pieces are short and bounded, each piece one NumPy call over many rows:
they cut the work for locality and are not loops over batch, heads or time.

The two sizes are read at call time, so a test can shrink them to cross piece boundaries on small
arrays.

>>> list(row_blocks(n_rows=10, row_len=ROW_BLOCK // 4))
[0, 4, 8]
>>> query_tiles(T=8, causal=True)
[(0, 8, 8)]

What this module deliberately does not do: any math of the ops (ops.py, attention.py,
activations.py), or the GPU's tiling (its kernels choose their own, transformer/backends/).
"""

from __future__ import annotations

import numpy as np

ROW_BLOCK = 1 << 18  # elements per row block: 1 MB of float32, so a block's passes mostly hit L2;
# smaller blocks only cost more NumPy calls
TILE_SCORES = 1 << 18  # score elements of one query tile, all (batch, head) pairs together, on
# average: 1 MB of float32, so a tile's scores and weights stay in L2 between the passes over them


def row_blocks(n_rows: int, row_len: int, share: int = 1) -> range:
    """Starts of the row blocks of an (n_rows, row_len) array, each of about ROW_BLOCK / share
    elements (at least one row); `share` > 1 for a pass that streams several such arrays at once."""
    return range(0, n_rows, max(1, ROW_BLOCK // share // max(row_len, 1)))


def query_tiles(T: int, causal: bool, pairs: int = 1) -> list[tuple[int, int, int]]:
    """(first query, end query, keys seen) of each tile of query rows; `pairs` is B * H.

    Causal attention cuts the queries into 2 to 8 tiles, as many as keep the average tile's
    scores within TILE_SCORES; tile [lo, hi) sees only the keys [0, hi), so the scores above
    the diagonal blocks ((n - 1) / 2n of the (T, T) scores with n tiles) are never computed, as
    FlashAttention skips masked tiles, and only each tile's diagonal block needs the mask. This
    is not a loop over time: each tile is one batched matmul over every batch row, head and its
    many query rows, and the tile count is bounded whatever T. Bidirectional attention, a short
    causal one, and one whose whole (B, H, T, T) scores fit a tile's budget are one tile seeing
    every key: there the extra calls of a second tile cost more than the masked quarter they
    skip.
    """
    if not causal or T < 16 or pairs * T * T <= TILE_SCORES:
        return [(0, T, T)]
    n = max(2, min(8, -(-pairs * T * T // 2 // TILE_SCORES)))
    cuts = np.linspace(0, T, n + 1).round().astype(int)
    return [(int(lo), int(hi), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
