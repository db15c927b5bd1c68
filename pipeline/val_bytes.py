"""Bits per byte of training's validation loss: the bytes behind the validation batches' targets.

The validation loss is the mean cross-entropy, in nats, of every target token of the fixed
validation batches (`data.eval_batches`); bits per byte is the same sum in bits over the UTF-8
bytes those targets stand for:

    bits per byte = mean loss x n_targets / ln 2 / bytes

Each id's bytes are the tokenizer's (a token that is part of a character counts its own bytes,
so the tokens of a text add up to the text's bytes). A special token counts 0 bytes: it is a
marker, not text. The `--eot` put between documents is in none of them, so the bytes are the
documents' own, as `tk eval` counts them (pipeline/evaluate.py, which scores each document
apart); text the special-token policy read as a special token counts 0 too (where `tk eval`
counts that text's bytes). Its loss still counts, as it does in the validation loss. The batches
are fixed, so their bytes are counted once, from the whole batches (every MPI rank's rows): the
figure is a function of the logged loss and two whole numbers, the same bits on any number of ranks.

What it deliberately does not do: compute the loss (pipeline/train.py's `evaluate`) or score
documents (pipeline/evaluate.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def target_bytes(batches: Iterable[tuple[np.ndarray, np.ndarray]], lengths: np.ndarray) -> int:
    """The bytes of every target of `batches` ((x, y) pairs, y the targets), each id's from
    `lengths` (`bpe.tokenizer_eval.token_lengths`).

    >>> target_bytes([(None, np.array([[1, 2], [2, 0]]))], np.array([0, 3, 1]))
    5
    """
    return int(sum(int(lengths[np.asarray(y)].sum()) for _, y in batches))


def bits_per_byte(mean_loss: float, n_targets: int, n_bytes: int) -> float | None:
    """The mean loss in nats over `n_targets` targets, as bits per byte of their `n_bytes` bytes
    (None when they have none: targets that are all special tokens).

    >>> bits_per_byte(math.log(2), 10, 5)  # ten tokens of one bit each, over five bytes
    2.0
    """
    if n_bytes <= 0:
        return None
    return mean_loss * n_targets / math.log(2) / n_bytes
