"""Choosing the next token from a row of logits: greedy, temperature, top-k, top-p.

Small pure functions on a (V,) vector, composed by `sample_next`. They work in float64, so the
choice does not depend on the model's dtype beyond its logits; the probabilities are the plain
`reference.softmax`, which one vector needs no faster version of. Randomness comes only from the
`numpy.random.Generator` passed in: the same seed gives the same tokens.

What this module does not do: run the model or keep the KV cache (see GPT.generate).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.reference import softmax  # the one vector softmax: (V,) -> (V,) in float64


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, seed: int | None = None) -> None:
    """Raise ModelError (one line) for settings no sampler can honour (a seed included)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ModelError(f"seed must be a non-negative integer or None, got {seed!r}")
    if not np.isfinite(temperature) or temperature < 0:
        raise ModelError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or int(top_k) != top_k or top_k < 1):
        raise ModelError(f"top_k must be a positive integer or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ModelError(f"top_p must be in (0, 1] or None, got {top_p}")


def greedy(logits: np.ndarray) -> int:
    """The most likely token (seed 002's argmax); ties go to the lowest id."""
    return int(np.argmax(logits))


def mask_from(logits: np.ndarray, start: int) -> np.ndarray:
    """(V,) -> (V,) float64 copy with the ids from `start` up at -inf: never chosen (a padded
    vocabulary's ids that have no token).

    >>> mask_from(np.array([1.0, 3.0, 2.0]), 2).tolist()
    [1.0, 3.0, -inf]
    """
    z = np.array(logits, dtype=np.float64)
    z[start:] = -np.inf
    return z


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """(V,) -> (V,) logits / temperature (> 0): below 1 sharpens, above 1 flattens."""
    return np.asarray(logits, dtype=np.float64) / temperature


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """(V,) -> (V,) copy keeping the k largest logits (and any tied with the k-th), the rest -inf.

    >>> top_k_filter(np.array([1.0, 3.0, 2.0]), 2).tolist()
    [-inf, 3.0, 2.0]
    """
    z = np.array(logits, dtype=np.float64)
    if k < z.size:
        kth = np.partition(z, z.size - k)[z.size - k]
        z[z < kth] = -np.inf
    return z


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """(V,) -> (V,) copy keeping the smallest set of most likely tokens whose probability sums
    to at least p (nucleus sampling), the rest -inf. The most likely token always stays.

    >>> top_p_filter(np.log(np.array([0.5, 0.3, 0.2])), 0.7).round(2).tolist()
    [-0.69, -1.2, -inf]
    """
    z = np.array(logits, dtype=np.float64)
    order = np.argsort(-z, kind="stable")
    cum = np.cumsum(softmax(z)[order])
    # keep a token if the mass strictly before it is still below p
    keep = np.concatenate(([True], cum[:-1] < p))
    z[order[~keep]] = -np.inf
    return z


def _filtered(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None) -> np.ndarray | None:
    """(V,) logits after temperature, top-k and top-p, in float64; None when the choice is greedy
    (temperature 0, or one so small, e.g. 1e-320, that the logits overflow)."""
    if temperature == 0:
        return None
    with np.errstate(over="ignore"):
        z = apply_temperature(logits, temperature)
    if np.isinf(z.max()):
        return None
    if top_k is not None:
        z = top_k_filter(z, int(top_k))
    if top_p is not None:
        z = top_p_filter(z, top_p)
    return z


def sample_next(
    logits: np.ndarray,
    rng: np.random.Generator,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    observe: Callable[[np.ndarray], None] | None = None,
) -> int:
    """(V,) logits -> one token id. temperature 0 is greedy; otherwise temperature, then top-k,
    then top-p, then one draw by inverse CDF from `rng`. observe(probs), when given, receives the
    (V,) float64 distribution the token is drawn from (one-hot at the argmax when greedy)."""
    z = _filtered(logits, temperature, top_k, top_p)
    if z is None:
        token = greedy(logits)
        if observe is not None:
            observe(np.eye(1, np.size(logits), token, dtype=np.float64)[0])
        return token
    probs = softmax(z)
    if observe is not None:
        observe(probs)
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    # side="right" never picks a zero-probability token: its cdf equals its predecessor's
    return int(min(np.searchsorted(cdf, u, side="right"), cdf.size - 1))
