"""The views of one forward pass on `tk serve`'s page: the attention maps and `tk explain`'s documents.

- `attention_view`: one head's weights, whole; `thumbnails_view`: every head's, pooled to at most
  THUMBNAIL_CELLS a side. Both come from one `forward(trace=...)` with a `trace.Recorder` that
  keeps the attention weights only, pooled as each layer records them.
- `explain_doc`, `example_doc`: what `tk explain -m MODEL TEXT --json` and `tk explain --example
  NAME --json` print (transformer/explain.py's steps).
- `pack_weights` / `unpack_weights`: an attention map as JSON carries it, exact (its float32
  bytes in base64, about a fifth of its JSON).
- `attention_tokens`, `explain_tokens`: how long a text each answers for, so an answer stays
  within ATTENTION_NUMBERS or EXPLAIN_NUMBERS numbers.

What it deliberately does not do: read request parameters or print (cli/serve_api.py and
cli/explain_commands.py do), or compute a step (the model and transformer/explain.py do). It keeps
one thing between calls, per model and dropped with it: the last text's thumbnails.
"""

from __future__ import annotations

import base64
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tokenkit.bpe.show import token_repr, token_str
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.run import ModelInput, cut_field, fit_context, pad_label
from tokenkit.pipeline.token_views import REFUSE, token_entries, vocab_labels
from tokenkit.transformer import trace
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.explain import explain_model
from tokenkit.transformer.explain_examples import EXAMPLES, explain_example
from tokenkit.transformer.explanation import Explanation

ATTENTION_NUMBERS = 1 << 20  # weights one text's two attention answers hold at most, together (< 6 MB of base64)
THUMBNAIL_CELLS = 48  # an attention thumbnail is at most this many cells a side (block means above)
EXPLAIN_NUMBERS = 1 << 22  # numbers one explain answer holds at most (a GPT-2 explain of 64 tokens: ~1.1 M)


# ----------------------------------------------------------------------------- how long a text each view takes


def attention_tokens(config) -> int:
    """The longest text (in tokens) /api/attention and /api/thumbnails answer for: the model's
    context, or fewer when one head's T x T weights and every head's thumbnail (at most
    THUMBNAIL_CELLS a side) would pass ATTENTION_NUMBERS."""
    heads, S = config.n_layers * config.n_heads, THUMBNAIL_CELLS
    t = math.isqrt(ATTENTION_NUMBERS // (1 + heads))  # T <= S: the thumbnails are T x T too
    if t >= S:  # T > S: the thumbnails are S x S
        t = math.isqrt(ATTENTION_NUMBERS - heads * S * S)
    return max(1, min(config.context_length, t))


def explain_tokens(config) -> int:
    """The longest text (in tokens) /api/explain answers for: the model's context, or fewer when
    its steps would pass EXPLAIN_NUMBERS (about 20 T x d_model rows, (3 + heads) T x T squares and
    the logits' vocabulary)."""
    C, H = config.d_model, config.n_heads
    a, b = 3 + H, 20 * C + 4 * config.head_dim
    room = max(EXPLAIN_NUMBERS - 2 * config.vocab_size, 0)
    t = int((-b + math.sqrt(b * b + 4 * a * room)) / (2 * a))
    return max(1, min(config.context_length, t))


def model_ids(
    model,
    tokenizer,
    text: str,
    policy: Mapping[str, Any],
    limit: int | None = None,
    say: Callable[[str], None] = lambda m: None,
) -> ModelInput:
    """What the model reads of `text` for a forward pass (after the tokenizer's BOS, when it has
    one): at least one id, and of a text longer than the model's context its last ones
    (`run.fit_context`, said to `say`). A view whose answer holds fewer (`limit`: its bound on
    numbers, for a large model) refuses a text of more."""
    ids = tokenizer.encode_for_model(text, **policy)
    if not ids:
        raise PipelineError("the text gives no tokens; give some text")
    context = model.config.context_length
    read = fit_context(ids, context, tokenizer.bos is not None, say)
    if limit is not None and len(read.ids) > limit:
        read_of = f"; the model reads its last {context:,}" if read.cut else ""
        raise PipelineError(
            f"the text is {len(ids):,} tokens{read_of}, more than the {limit:,} this view shows; shorten it"
        )
    return read


# ----------------------------------------------------------------------------- attention maps: pooled, packed


def block_edges(n: int, cells: int = THUMBNAIL_CELLS) -> np.ndarray:
    """Where each of min(n, cells) blocks of n positions starts, then n: blocks as even as possible
    (their sizes differ by at most one).

    >>> block_edges(5, 2).tolist(), block_edges(3, 4).tolist()
    ([0, 2, 5], [0, 1, 2, 3])
    """
    m = min(n, cells)
    return np.arange(m + 1) * n // m


def pool(weights: np.ndarray, cells: int = THUMBNAIL_CELLS) -> np.ndarray:
    """weights (..., Tq, Tk) -> (..., min(Tq, cells), min(Tk, cells)): the mean of each block of
    query rows x key columns (block_edges); a side of at most `cells` is kept as it is, so a map
    that fits is its own thumbnail, bit for bit. The plain loop beside it is in tests/test_serve.py.

    >>> pool(np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]), 2).tolist()
    [[1.0, 0.0], [0.35, 0.325]]
    """
    rows, cols = block_edges(weights.shape[-2], cells), block_edges(weights.shape[-1], cells)
    sums = np.add.reduceat(np.add.reduceat(weights.astype(np.float64), rows[:-1], axis=-2), cols[:-1], axis=-1)
    return (sums / np.outer(np.diff(rows), np.diff(cols))).astype(weights.dtype)


def pack_weights(w: np.ndarray) -> dict[str, Any]:
    """A (T, T) map of attention weights as JSON carries it: its numbers as little-endian float32
    (float64 for a float64 model) in base64, row by row, exact. When every cell above the diagonal
    is 0 (a causal map: a key after its query), row q holds its first q + 1 cells only (`triangle`).

    >>> pack_weights(np.array([[1.0, 0.0], [0.25, 0.75]], dtype=np.float32))
    {'shape': [2, 2], 'dtype': 'float32', 'triangle': True, 'base64': 'AACAPwAAgD4AAEA/'}
    """
    n, m = w.shape
    w = np.asarray(w, dtype="<f8" if w.dtype == np.float64 else "<f4")
    triangle = n == m and not np.triu(w, 1).any()  # a NaN above the diagonal counts: the map goes whole
    cells = w[np.tri(n, dtype=bool)] if triangle else w
    raw = base64.b64encode(np.ascontiguousarray(cells).tobytes()).decode("ascii")
    return {"shape": [n, m], "dtype": w.dtype.name, "triangle": triangle, "base64": raw}


def unpack_weights(packed: Mapping[str, Any]) -> np.ndarray:
    """`pack_weights`' map again, bit for bit (what cli/page/explain.js's `unpackWeights` does).

    >>> unpack_weights({"shape": [2, 2], "dtype": "float32", "triangle": True, "base64": "AACAPwAAgD4AAEA/"}).tolist()
    [[1.0, 0.0], [0.25, 0.75]]
    """
    (n, m), dtype = packed["shape"], {"float32": "<f4", "float64": "<f8"}[packed["dtype"]]
    cells = np.frombuffer(base64.b64decode(packed["base64"], validate=True), dtype=dtype)
    if not packed["triangle"]:
        return cells.reshape(n, m).copy()
    w = np.zeros((n, m), dtype=dtype)
    w[np.tri(n, m, dtype=bool)] = cells
    return w


# model -> (ids, (L, H, s, s) thumbnails) of the last text a forward pass pooled (1.3 MB for GPT-2's 144
# heads): the page asks a text's thumbnails just after a head of it, and they come from that head's forward
# pass, not another. A served model never changes in place (pipeline/live.py loads a new one).
_LAST_THUMBNAILS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------------------- the views


def _attention_pass(model, ids: Sequence[int], layer: int = -1, head: int = 0) -> tuple[np.ndarray | None, np.ndarray]:
    """One forward pass of `ids`: (head `head` of `layer`'s weights, or None for layer -1; every
    head's thumbnail, (L, H, s, s)), kept as the model's last thumbnails. The trace keeps each
    layer's weights (1, H, T, T) as (their thumbnails, the chosen head's whole or None) as the
    layer records them: a whole trace of a long text holds every layer's scores and weights,
    gigabytes."""

    def pooled(key: str, weights) -> tuple[np.ndarray, np.ndarray | None]:
        w = as_host(weights)[0]  # (H, T, T)
        return pool(w), np.array(w[head]) if trace.split_key(key)[0] == layer else None

    seen = trace.Recorder(lambda key: trace.split_key(key)[1] == "attn.weights", pooled)
    with np.errstate(over="ignore", invalid="ignore"):  # a damaged model's overflow shows as NaN, not warnings
        model.forward(np.asarray(ids, dtype=np.int64)[None, :], trace=seen)
    per_layer = [seen[trace.layer_key(i, "attn.weights")] for i in range(model.config.n_layers)]
    thumbnails = np.stack([thumbnail for thumbnail, _ in per_layer])
    _LAST_THUMBNAILS[model] = (tuple(ids), thumbnails)
    return (per_layer[layer][1] if layer >= 0 else None), thumbnails


def attention_view(
    model, tokenizer, text: str, *, layer: int = 0, head: int = 0, policy: Mapping[str, Any] = REFUSE
) -> dict[str, Any]:
    """/api/attention: head `head` of layer `layer`'s weights (weights[query][key], `pack_weights`:
    exact), from one `forward(trace=...)`; masked cells are 0, as the softmax gives them. The pass
    pools every head too, for `thumbnails_view` of the same text next."""
    cfg = model.config
    if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
        where = f"{cfg.n_layers} layers of {cfg.n_heads} heads"
        raise PipelineError(f"layer {layer}, head {head} is not in the model ({where})")
    ids, cut = model_ids(model, tokenizer, text, policy, attention_tokens(cfg))
    chosen, _ = _attention_pass(model, ids, layer, head)
    return {
        "tokens": token_entries(tokenizer, ids),
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "layer": layer,
        "head": head,
        "weights": pack_weights(chosen),
        **cut_field(cut),
    }


def thumbnails_view(model, tokenizer, text: str, *, policy: Mapping[str, Any] = REFUSE) -> dict[str, Any]:
    """/api/thumbnails: every head's thumbnail (thumbnails[layer][head], `pack_weights`: `pool`ed to
    at most THUMBNAIL_CELLS a side, blocks starting at thumbnail_edges). Up to THUMBNAIL_CELLS
    tokens a thumbnail is its head's weights, what `attention_view` sends for it, bit for bit.
    Those of the text the model's last `attention_view` was of are its, without a forward pass."""
    cfg = model.config
    ids, cut = model_ids(model, tokenizer, text, policy, attention_tokens(cfg))
    last = _LAST_THUMBNAILS.get(model)
    thumbnails = last[1] if last is not None and last[0] == tuple(ids) else _attention_pass(model, ids)[1]
    return {
        "tokens": token_entries(tokenizer, ids),
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "thumbnail_edges": block_edges(len(ids)).tolist(),
        "thumbnails": [[pack_weights(t) for t in layer] for layer in thumbnails],
        **cut_field(cut),
    }


def explain_run(
    model,
    tokenizer,
    text: str,
    *,
    layer: int = 0,
    head: int = 0,
    top_k: int = 5,
    policy: Mapping[str, Any] = REFUSE,
    limit: int | None = None,
    say: Callable[[str], None] = lambda m: None,
) -> tuple[Explanation, ModelInput, list[bytes]]:
    """`transformer.explain.explain_model` on `text`: (the explanation, what the model read of the
    text (`model_ids`; a cut said to `say`), each id's bytes); what `tk explain` renders as tables
    and `explain_doc` as JSON."""
    read = model_ids(model, tokenizer, text, policy, limit, say)
    ids = read.ids
    raw = [tokenizer.decode_bytes([i]) for i in ids]
    labels = vocab_labels(tokenizer, model.config.vocab_size)
    expl = explain_model(
        model, ids, [token_repr(b) for b in raw], layer=layer, head=head, top_k=top_k, label=labels.__getitem__,
    )  # fmt: skip
    return expl, read, raw


def model_doc(
    expl: Explanation,
    ids: Sequence[int],
    raw: Sequence[bytes],
    tokenizer,
    text: str,
    model_name: str,
    query: int | None = None,
    cut: int = 0,
):
    """`tk explain -m MODEL TEXT --json`'s document, from `explain_run`'s result (`--query Q`:
    the per-token steps hold row Q only, see `Explanation.to_dict`; `cut`: run.cut_field)."""
    doc = {
        "kind": "model",
        "model": model_name,
        "text": text,
        **expl.to_dict(query),
        "tokens": [
            {"position": t, "id": i, "text": token_str(b), "bytes": b.hex()}
            for t, (i, b) in enumerate(zip(ids, raw, strict=True))
        ],
        **cut_field(cut),
    }
    for candidate in doc["top"]:  # plain text in JSON, like "tokens" (the tables show it quoted)
        i = candidate["id"]
        candidate["token"] = token_str(tokenizer.decode_bytes([i])) if i < tokenizer.vocab_size else pad_label(i)
    return doc


def explain_doc(
    model,
    tokenizer,
    text: str,
    *,
    layer: int = 0,
    head: int = 0,
    top_k: int = 5,
    policy: Mapping[str, Any] = REFUSE,
    model_name: str,
    limit: int | None = None,
    query: int | None = None,
) -> dict[str, Any]:
    """/api/explain: what `tk explain -m MODEL TEXT --layer L --head H --top-k K [--query Q] --json`
    prints."""
    expl, (ids, cut), raw = explain_run(
        model, tokenizer, text, layer=layer, head=head, top_k=top_k, policy=policy, limit=limit
    )
    return model_doc(expl, ids, raw, tokenizer, text, model_name, query, cut)


def example_doc(name: str) -> dict[str, Any]:
    """/api/example: what `tk explain --example NAME --json` prints."""
    return {"kind": "example", "example": name, **explain_example(name).to_dict()}


def examples_list() -> list[dict[str, str]]:
    return [{"name": name, "what": what} for name, (what, _) in EXAMPLES.items()]
