"""The logit lens: what a model would predict if it stopped after each layer.

For every layer boundary l (0 = the embeddings x0, l >= 1 = block l-1's output; the names are
`trace.stream_keys`) and every position, the residual stream is put through the model's own final
norm ln_f and output head (wte^T tied, lm_head^T untied), as the model itself does after its last
block: the lens at the last boundary is the model's output distribution.

Post-norm models (the original encoder's order, `PostNormBlock`) end each block in a norm of their
own, ln_2, and ln_f follows the last one. The stream between their blocks is that ln_2's output,
and the lens reads it as the model reads the last one: through ln_f and the head. Boundary 0 (x0)
is the un-normed embeddings there too; ln_f normalises it like any other boundary.

Shapes, in the trace's letters: L n_layers, N = L + 1 boundaries, T positions, C d_model, V
vocab_size, k top_k. `logit_lens` keeps per boundary and position the k most likely tokens with
their probabilities, the probability of the token the whole model predicts there (its argmax) and
the rank of the next actual token (0 = the lens's most likely; ties count in the next token's
favour), computed over row blocks of at most CELLS logits in float32 (the stream's dtype), so a
long text of a big vocabulary never holds N x T x V numbers. `lens_logits` gives them all (N, T, V),
for small models and tests.

The numbers are computed on the host with the CPU's ops (transformer/ops.py), from the trace of
the model's own forward pass (on its device) and its parameters, brought to the host.

What it deliberately does not do: tune or learn anything (no "tuned lens": the final norm and head
are the model's own), attribute a logit to the parts of the model (transformer/attribution.py), or
draw (the page does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tokenkit.transformer import ops
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.block import norm_forward
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.trace import Recorder, stream_keys

CELLS = 1 << 22  # logits held at once by `logit_lens` (16 MB in float32): a few dozen rows of GPT-2's vocabulary
TOP_K_MAX = 100  # the most candidates per boundary and position `logit_lens` keeps


def one_sequence(ids) -> np.ndarray:
    """ids (T,) or (1, T) -> (T,) host ints; the model checks their range when it runs."""
    a = np.asarray(as_host(ids))
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
        raise ModelError(f"the lens and attribution take one non-empty sequence of ids (T,), got shape {a.shape}")
    return a


def record(model, ids, keys: Iterable[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One forward pass of `model` on ids (T,) keeping only the trace entries `keys` (each brought
    to the host, batch row 0: (T, ...) for a (B, T, ...) entry, (H, T, ...) for a head's) -> (those
    entries, the logits (T, V) on the host)."""
    keys = set(keys)
    ids = one_sequence(ids)

    def take(name: str, value) -> np.ndarray:
        host = as_host(value)
        return host if name == "pos_emb" else host[0]  # pos_emb has no batch axis

    kept = Recorder(keys.__contains__, take)
    with np.errstate(over="ignore", invalid="ignore"):  # weights too large for float32 give inf, not warnings
        logits = as_host(model.forward(ids[None, :], trace=kept))[0]
    return dict(kept), logits


def head_weights(model) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The final norm's (weight (C,), bias (C,) or None) and the unembedding (V, C), on the host."""
    p = model.params
    unembed = p["wte.weight" if model.config.tie_embeddings else "lm_head.weight"]
    bias = p.get("ln_f.bias")
    return as_host(p["ln_f.weight"]), None if bias is None else as_host(bias), as_host(unembed)


def through_head(model, stream: np.ndarray, weights=None) -> np.ndarray:
    """stream (..., C) -> logits (..., V): ln_f, then the head, as the model ends its forward pass.
    `weights`: `head_weights(model)`, when the caller has them already."""
    weight, bias, unembed = head_weights(model) if weights is None else weights
    xf, _ = norm_forward(ops, model.config, np.ascontiguousarray(stream), weight, bias)
    return (xf.reshape(-1, xf.shape[-1]) @ unembed.T).reshape(*stream.shape[:-1], unembed.shape[0])


@np.errstate(over="ignore", invalid="ignore")  # weights too large for float32 give inf, not warnings
def lens_logits(model, ids) -> np.ndarray:
    """ids (T,) -> every boundary's logits (N, T, V), N = n_layers + 1: all of them at once, for
    small models (N x T x V numbers)."""
    trace, _ = record(model, ids, stream_keys(model.config))
    return through_head(model, np.stack([trace[key] for key in stream_keys(model.config)]))


@dataclass
class Lens:
    """The logit lens of one sequence of T ids, at N = n_layers + 1 boundaries (0 = embeddings).

    top_ids (N, T, k), top_probs (N, T, k): each boundary and position's k most likely tokens, best
    first, and their probabilities. predicted (T,): the token the whole model predicts at each
    position (its logits' argmax); predicted_probs (N, T): its probability at each boundary.
    next_ids (T - 1,): the token that follows each position but the last; next_ranks (N, T - 1):
    its rank among the boundary's logits (0 = the most likely).
    """

    top_ids: np.ndarray
    top_probs: np.ndarray
    predicted: np.ndarray
    predicted_probs: np.ndarray
    next_ids: np.ndarray
    next_ranks: np.ndarray

    def to_json(self) -> list[dict]:
        """JSON-ready, one dict per boundary: `layer` (0 = the embeddings, l = after block l - 1),
        `after` (its name), `top` per position as [id, probability] pairs, best first,
        `predicted_probability` per position (of the whole model's prediction), `next_rank` per
        position (null at the last, which has no next token)."""
        N = self.top_ids.shape[0]
        ranks = np.full((N, self.predicted.size), -1, dtype=np.int64)
        ranks[:, : self.next_ranks.shape[1]] = self.next_ranks
        out = []
        for layer in range(N):
            top = [
                [[int(i), float(p)] for i, p in zip(ids, probs, strict=True)]
                for ids, probs in zip(self.top_ids[layer], self.top_probs[layer], strict=True)
            ]
            out.append(
                {
                    "layer": layer,
                    "after": "embeddings" if layer == 0 else f"block {layer - 1}",
                    "top": top,
                    "predicted_probability": [float(p) for p in self.predicted_probs[layer]],
                    "next_rank": [None if r < 0 else int(r) for r in ranks[layer]],
                }
            )
        return out


def check_top_k(top_k) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= TOP_K_MAX:
        raise ModelError(f"the lens's top-k must be an integer from 1 to {TOP_K_MAX}, got {top_k!r}")
    return int(top_k)


@np.errstate(over="ignore", invalid="ignore")  # weights too large for float32 give inf, not warnings
def logit_lens(model, ids, top_k: int = 5, *, trace: dict | None = None, logits: np.ndarray | None = None) -> Lens:
    """The logit lens of `model` (a transformer.GPT) on ids (T,): see `Lens`. With `trace` and
    `logits` (`record`'s, holding `trace.stream_keys`) no forward pass is run."""
    ids = one_sequence(ids)
    k = min(check_top_k(top_k), model.config.vocab_size)
    if trace is None or logits is None:
        trace, logits = record(model, ids, stream_keys(model.config))
    streams = np.stack([trace[key] for key in stream_keys(model.config)])  # (N, T, C)
    N, T, C = streams.shape
    predicted = np.argmax(logits, axis=-1)  # (T,)
    next_ids = ids[1:]
    # each boundary and position is one row; the row's wanted tokens: predicted, then next (the last position: itself)
    rows = streams.reshape(N * T, C)
    pred_rows = np.tile(predicted, N)
    next_rows = np.tile(np.append(next_ids, predicted[-1]), N)
    top_ids = np.empty((N * T, k), dtype=np.int64)
    top_probs = np.empty((N * T, k), dtype=rows.dtype)
    pred_probs = np.empty(N * T, dtype=rows.dtype)
    ranks = np.empty(N * T, dtype=np.int64)
    weights = head_weights(model)
    step = max(1, CELLS // model.config.vocab_size)
    for a in range(0, N * T, step):
        z = through_head(model, rows[a : a + step], weights)  # (r, V)
        r = np.arange(z.shape[0])
        shift = z.max(axis=1, keepdims=True)
        total = np.exp(z - shift).sum(axis=1, keepdims=True)
        best = np.argpartition(-z, k - 1, axis=1)[:, :k] if k < z.shape[1] else np.broadcast_to(np.arange(k), z.shape)
        best_z = np.take_along_axis(z, best, axis=1)
        order = np.lexsort((best, -best_z))  # by logit, then by id: the first max first, as argmax
        top_ids[a : a + step] = np.take_along_axis(best, order, axis=1)
        top_probs[a : a + step] = np.exp(np.take_along_axis(best_z, order, axis=1) - shift) / total
        pred_probs[a : a + step] = np.exp(z[r, pred_rows[a : a + step]] - shift[:, 0]) / total[:, 0]
        ranks[a : a + step] = (z > z[r, next_rows[a : a + step]][:, None]).sum(axis=1)
    return Lens(
        top_ids=top_ids.reshape(N, T, k),
        top_probs=top_probs.reshape(N, T, k),
        predicted=predicted,
        predicted_probs=pred_probs.reshape(N, T),
        next_ids=next_ids,
        next_ranks=ranks.reshape(N, T)[:, : T - 1],
    )
