"""The logit lens and the direct logit attribution of one text on `tk serve`'s page.

- `lens_view` (/api/lens): every layer boundary's prediction at every position
  (transformer/lens.py's `Lens.to_json`, the `lens` of `tk explain --json`), with the tokens, the
  whole model's prediction at each position and the text of every id it names.
- `attribution_view` (/api/attribution): one position's logit of one token (default: the whole
  model's prediction there) split into the embeddings', each head's, each MLP's and the biases'
  shares (transformer/attribution.py's `Attribution.to_json`, the `attribution` of `tk explain
  --json`), with the tokens and the token's text.
- `lens_tokens`: how long a text the lens answers for, so that its answer stays within
  forward_views.ATTENTION_NUMBERS numbers (the attention views' bound).

Each returns plain JSON-ready dicts, as pipeline/views.py describes; a value JSON cannot hold (a
damaged model's NaN) is None. What it deliberately does not do: compute the lens or the shares
(transformer/ does), read request parameters (cli/serve_api.py does), ablate, or draw. It keeps
one thing between calls, per model and dropped with it: the last text's trace (what both read),
when small, so that the page's lens and each position it clicks cost one forward pass.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tokenkit.pipeline.forward_views import ATTENTION_NUMBERS, model_ids
from tokenkit.pipeline.run import cut_field
from tokenkit.pipeline.token_views import REFUSE, token_entries, token_pieces
from tokenkit.transformer import attribution, lens
from tokenkit.transformer.explain import LENS_TOP_K
from tokenkit.transformer.trace import stream_keys

LENS_TOP_K_MAX = 10  # candidates per boundary and position /api/lens sends at most (the page shows 5)
KEEP_BYTES = 64 << 20  # the last text's trace is kept up to this size (GPT-2 124M at 64 tokens: 28 MB)

# model -> (ids, trace, logits) of the last text a lens or an attribution ran: the page asks a text's lens,
# then the attribution of each position clicked, of the same pass. A served model never changes in place.
_LAST_PASS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lens_tokens(config) -> int:
    """The longest text (in tokens) /api/lens answers for: the model's context, or fewer when
    its (n_layers + 1) boundaries x T positions of LENS_TOP_K_MAX [id, probability] pairs, the
    prediction's probability and the next token's rank would pass ATTENTION_NUMBERS numbers."""
    per_position = (config.n_layers + 1) * (2 * LENS_TOP_K_MAX + 2)
    return max(1, min(config.context_length, ATTENTION_NUMBERS // per_position))


def _finite(value: Any) -> Any:
    """`value` with every float that JSON cannot hold (NaN, infinity) as None, in lists and dicts."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _pass(model, ids: Sequence[int]) -> tuple[dict, np.ndarray]:
    """(trace, logits (T, V)) of one forward pass of `ids` keeping what the lens and the attribution
    read (`lens.record`): the model's last pass when it was of these ids, else a new one, kept
    when its trace is at most KEEP_BYTES."""
    key = tuple(int(i) for i in ids)
    last = _LAST_PASS.get(model)
    if last is not None and last[0] == key:
        return last[1], last[2]
    _LAST_PASS.pop(model, None)  # not held while the new pass runs
    wanted = set(stream_keys(model.config)) | attribution.keys(model.config)
    trace, logits = lens.record(model, np.asarray(key, dtype=np.int64), wanted)
    if sum(a.nbytes for a in trace.values()) + logits.nbytes <= KEEP_BYTES:
        _LAST_PASS[model] = (key, trace, logits)
    return trace, logits


def lens_view(
    model, tokenizer, text: str, *, top_k: int = LENS_TOP_K, policy: Mapping[str, Any] = REFUSE
) -> dict[str, Any]:
    """/api/lens: the logit lens of `text` (`lens`: `Lens.to_json`, one entry per boundary, layer 0
    the embeddings; the same list as `tk explain --json`'s for top_k 5), the `predicted` id at each
    position (the whole model's: the last boundary's first), and `labels`: the text of every id
    `lens` and `predicted` name, by id (a padded vocabulary's id as `<pad id N>`)."""
    cfg = model.config
    ids, cut = model_ids(model, tokenizer, text, policy, lens_tokens(cfg))
    trace, logits = _pass(model, ids)
    found = lens.logit_lens(model, ids, top_k, trace=trace, logits=logits)
    layers = found.to_json()
    named = {int(i) for layer in layers for row in layer["top"] for i, _ in row} | set(found.predicted.tolist())
    shown = sorted(named)
    return {
        "tokens": token_entries(tokenizer, ids),
        "n_layers": cfg.n_layers,
        "top_k": int(found.top_ids.shape[-1]),
        "predicted": [int(i) for i in found.predicted],
        "lens": _finite(layers),
        "labels": dict(zip(map(str, shown), token_pieces(tokenizer, shown), strict=True)),
        **cut_field(cut),
    }


def attribution_view(
    model,
    tokenizer,
    text: str,
    *,
    position: int | None = None,
    token: int | None = None,
    policy: Mapping[str, Any] = REFUSE,
) -> dict[str, Any]:
    """/api/attribution: the logit of `token` (default: the whole model's prediction there) at
    `position` (default: the last) split into shares (`Attribution.to_json`: `logit`, `sum`,
    `scale`, `embeddings`, `heads` [layer][head], `mlps`, `biases`), with the text's `tokens`,
    the model's `n_layers` and `n_heads`, `token_text` (the token's text) and `prediction` (the
    model's prediction at the position: `token` by default). A position outside the text or a
    token outside the vocabulary is a one-line ModelError."""
    cfg = model.config
    ids, cut = model_ids(model, tokenizer, text, policy)
    trace, logits = _pass(model, ids)
    at = len(ids) - 1 if position is None else position
    found = attribution.attribution_from_trace(model, trace, logits, at, token)
    return {
        "tokens": token_entries(tokenizer, ids),
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "token_text": token_pieces(tokenizer, [found.token])[0],
        "prediction": int(np.argmax(logits[found.position])),
        **_finite(found.to_json()),
        **cut_field(cut),
    }
