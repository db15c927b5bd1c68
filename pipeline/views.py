"""What each view of `tk serve`'s page shows, as JSON-ready dicts: the one place it is computed.

The commands' `--json` (`tk explain`, `tk predict-next`) print these same dicts and the server
(cli/serve.py) sends them, so the page's numbers are the commands' by construction. Each function
takes loaded objects (a Tokenizer, a GPT, a run directory) and plain settings, and returns plain
lists, dicts, strings, ints and finite floats (a value JSON cannot hold, such as a masked score's
-inf, is None); attention maps go as their float32 bytes in base64 (`pack_weights`), exact and
about a fifth of their JSON. docs/serve.md lists every shape.

- `tokens_view`, `compare_view`: a text cut into tokens, by one tokenizer or two side by side.
- `bpe_view`: the text from bytes to tokens, merge by merge (`Tokenizer.replay`).
- `attention_view`, `thumbnails_view`, `explain_doc`, `example_doc`: a forward pass (transformer/explain.py).
- `next_view`, `generate_view`: the next-token distribution; generation step by step.
- `training_view`: a run's log (`pipeline.live.TrainingLog`); `model_view`: a model's blocks.
- `info_view`: what the server holds, and the limits of what it answers.

What it deliberately does not do: read request parameters, hold locks or follow files (cli/serve.py
and pipeline/live.py do), or print. It keeps two things between calls, each per tokenizer or model
and dropped with it: the vocabulary's labels, and the last text's attention thumbnails.
"""

from __future__ import annotations

import base64
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit import __version__
from tokenkit.pipeline import checkpoint, sources
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.live import TrainingLog
from tokenkit.pipeline.run import generate_ids, pad_label, predict_next
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.explain import EXAMPLES, Explanation, explain_example, explain_model
from tokenkit.transformer.sampling import softmax

TEXT_CHARS = 20_000  # the longest text a view takes: a tokenization of it is a few hundred KB of JSON
FIRST_MERGES = 50  # merges listed by bpe_view
TRAIN_POINTS = 2000  # training-curve points sent at most; a longer log is decimated, its last step kept
ATTENTION_NUMBERS = 1 << 20  # weights one text's two attention answers hold at most, together (< 6 MB of base64)
THUMBNAIL_CELLS = 48  # an attention thumbnail is at most this many cells a side (block means above)
EXPLAIN_NUMBERS = 1 << 22  # numbers one explain answer holds at most (a GPT-2 explain of 64 tokens: ~1.1 M)
TOP_K_MAX = 100  # next tokens listed (top_k, and show per generated token)
NEW_TOKENS_MAX = 200  # tokens one /api/generate makes: each is a forward pass under the server's one lock
TEMPERATURE_MAX = 10.0
SEED_MAX = 2**32 - 1

# The special-token policies by name (docs/serve.md's `specials`), as a run's corpus has them
# (`sources.SPECIALS`: keyword arguments of `Tokenizer.encode`, as cli/specials.py's flags give them).
SPECIALS: dict[str, dict[str, Any]] = sources.SPECIALS
REFUSE = SPECIALS["refuse"]

# The page's views (docs/serve.md), and which of them show each block of a model at work.
VIEWS = ("tokens", "bpe", "attention", "next", "training", "model", "examples")


# ----------------------------------------------------------------------------- tokens


def show_token(raw: bytes) -> str:
    """A token's bytes, quoted, as text when they are valid UTF-8, else as escaped bytes.

    >>> show_token(b" the"), show_token(b"\\r"), show_token(b"\\xc3")
    ("' the'", "'\\\\r'", "'\\\\xc3'")
    """
    try:
        return repr(raw.decode("utf-8"))
    except UnicodeDecodeError:  # part of a multi-byte character: show the bytes themselves
        return repr(raw)[1:]


def piece(raw: bytes) -> dict[str, Any]:
    """A token's bytes as the page shows them: hex, text, and whether they are part of a
    character (`partial`: not UTF-8 alone; the text then writes those bytes as \\xNN).

    >>> piece(b"\\xc3"), piece(b"hi")
    ({'bytes': 'c3', 'text': '\\\\xc3', 'partial': True}, {'bytes': '6869', 'text': 'hi', 'partial': False})
    """
    try:
        return {"bytes": raw.hex(), "text": raw.decode("utf-8"), "partial": False}
    except UnicodeDecodeError:
        return {"bytes": raw.hex(), "text": raw.decode("utf-8", errors="backslashreplace"), "partial": True}


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each model id's text on its own (`Tokenizer.token_pieces`: part of a character as \\xNN);
    an id of a padded vocabulary with no token as `pad_label` (`<pad id N>`)."""
    return [tokenizer.token_pieces([i])[0] if i < tokenizer.vocab_size else pad_label(i) for i in ids]


_LABELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> vocab_labels


def vocab_labels(tokenizer, n: int) -> list[str]:
    """`token_label` of ids 0..n-1, made once per tokenizer: explain's logits step labels every id
    of the vocabulary, 47 ms of each explain of GPT-2's (a server answers many)."""
    labels = _LABELS.get(tokenizer)
    if labels is None or len(labels) != n:
        labels = _LABELS[tokenizer] = [token_label(tokenizer, i) for i in range(n)]
    return labels


def token_label(tokenizer, token_id: int) -> str:
    """A model id as tables show it: `show_token` of its bytes, or `pad_label` for an id with no token."""
    if token_id >= tokenizer.vocab_size:
        return pad_label(token_id)
    return show_token(tokenizer.decode_bytes([token_id]))


def token_entries(tokenizer, ids: Sequence[int]) -> list[dict[str, Any]]:
    """Each token of `ids` with its byte span in the text they decode to (start, end)."""
    specials = set(tokenizer.special_tokens.values())
    out, start = [], 0
    for i in ids:
        raw = tokenizer.decode_bytes([i])
        shown = piece(raw)
        end = start + len(raw)
        out.append({"id": int(i), "bytes": shown["bytes"], "text": shown["text"], "start": start, "end": end})
        out[-1].update(special=i in specials, partial=shown["partial"])
        start = end
    return out


def tokens_view(tokenizer, text: str, *, name: str, policy: Mapping[str, Any] = REFUSE) -> dict[str, Any]:
    """/api/tokens: `text` cut into tokens; `ids` is what `tk encode -t TOKENIZER TEXT --json`
    prints with the same special-token policy (`policy`: one of SPECIALS)."""
    ids = tokenizer.encode(text, **policy)
    tokens = token_entries(tokenizer, ids)
    n_bytes = tokens[-1]["end"] if tokens else 0
    return {
        "tokenizer": name,
        "ids": ids,
        "tokens": tokens,
        "n_bytes": n_bytes,
        "n_tokens": len(ids),
        "bytes_per_token": n_bytes / len(ids) if ids else None,
    }


def differ_spans(a: Sequence[Mapping[str, int]], b: Sequence[Mapping[str, int]]) -> list[list[int]]:
    """The byte spans two tokenizations of one text do not cut the same way: between each two
    neighbouring cut points they share, the span where either cuts in between.

    >>> differ_spans([{"start": 0, "end": 2}, {"start": 2, "end": 5}], [{"start": 0, "end": 5}])
    [[0, 5]]
    >>> differ_spans([{"start": 0, "end": 2}, {"start": 2, "end": 4}], [{"start": 0, "end": 2}, {"start": 2, "end": 3},
    ...               {"start": 3, "end": 4}])
    [[2, 4]]
    """
    cuts_a = {0} | {t["end"] for t in a}
    cuts_b = {0} | {t["end"] for t in b}
    shared = sorted(cuts_a & cuts_b)
    whole = {(t["start"], t["end"]) for t in a} & {(t["start"], t["end"]) for t in b}  # one token in both
    return [[s, e] for s, e in zip(shared, shared[1:], strict=False) if (s, e) not in whole]


def compare_view(
    main, compare, text: str, *, names: tuple[str, str], policy: Mapping[str, Any] = REFUSE
) -> dict[str, Any]:
    """/api/compare: `text` by both tokenizers, and the spans they cut differently."""
    a = tokens_view(main, text, name=names[0], policy=policy)
    b = tokens_view(compare, text, name=names[1], policy=policy)
    return {"main": a, "compare": b, "differ": differ_spans(a["tokens"], b["tokens"])}


def _merge_counts(tokenizer) -> list[int] | None:
    counts = tokenizer.training.get("merge_counts")
    ok = isinstance(counts, list) and all(type(c) is int for c in counts)
    return counts if ok else None


def bpe_view(
    tokenizer, text: str, *, name: str, policy: Mapping[str, Any] = REFUSE, first: int = FIRST_MERGES
) -> dict[str, Any]:
    """/api/bpe: the text from bytes to tokens, merge by merge (`Tokenizer.replay`), the pieces
    of every id it shows, and the tokenizer's `first` merges with the pair counts it recorded
    when it learned them (None when it did not: imported, or made before tk recorded them)."""
    replay = tokenizer.replay(text, **policy)
    shown = sorted(set(replay.initial) | {s.new_id for s in replay.steps})
    counts = _merge_counts(tokenizer) or []
    first_merges = []
    for rank, (a, b) in enumerate(tokenizer.merges[:first]):
        new_id = tokenizer.merged_id(rank)
        made = piece(tokenizer.decode_bytes([new_id]))["text"]
        count = counts[rank] if rank < len(counts) else None
        first_merges.append({"rank": rank, "pair": [a, b], "new_id": new_id, "text": made, "count": count})
    return {
        "tokenizer": name,
        "initial": replay.initial,
        "chunks": [list(c) for c in replay.chunks],
        "steps": [{"rank": s.rank, "pair": list(s.pair), "new_id": s.new_id, "at": s.at} for s in replay.steps],
        "pieces": {str(i): piece(tokenizer.decode_bytes([i])) for i in shown},
        "ids": replay.ids,
        "first_merges": first_merges,
    }


# ----------------------------------------------------------------------------- a forward pass


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


def model_ids(model, tokenizer, text: str, policy: Mapping[str, Any], limit: int | None = None) -> list[int]:
    """`text`'s ids for a forward pass (after the tokenizer's BOS, when it has one): at least one,
    at most `limit` (default: the model's context)."""
    ids = tokenizer.encode_for_model(text, **policy)
    if not ids:
        raise PipelineError("the text gives no tokens; give some text")
    context = model.config.context_length
    limit = context if limit is None else limit
    if len(ids) > limit:
        what = f"the model's context of {context}" if limit == context else f"the {limit} this view shows"
        raise PipelineError(f"the text is {len(ids)} tokens, more than {what}; shorten it")
    return ids


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
    """`pack_weights`' map again, bit for bit (what cli/page/attention.js's `unpackWeights` does).

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


class _Thumbnails(dict):
    """A forward trace that keeps each layer's attention weights pooled (`thumbnails`) and one
    head's whole (`chosen`; none for layer -1), and drops the rest as the layers fill it: a trace
    of a long text holds every layer's scores and weights, gigabytes."""

    def __init__(self, layer: int, head: int) -> None:
        super().__init__()
        self.layer, self.head = layer, head
        self.chosen: np.ndarray | None = None
        self.thumbnails: dict[int, np.ndarray] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        name, _, kind = key.partition(".attn.")
        if kind == "weights":
            i, w = int(name.removeprefix("h.")), as_host(value)[0]  # (H, T, T)
            self.thumbnails[i] = pool(w)
            if i == self.layer:
                self.chosen = np.array(w[self.head])

    def update(self, other=(), **more: Any) -> None:
        for key, value in dict(other, **more).items():
            self[key] = value


# model -> (ids, (L, H, s, s) thumbnails) of the last text a forward pass pooled (1.3 MB for GPT-2's 144
# heads): the page asks a text's thumbnails just after a head of it, and they come from that head's forward
# pass, not another. A served model never changes in place (pipeline/live.py loads a new one).
_LAST_THUMBNAILS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _attention_pass(model, ids: Sequence[int], layer: int = -1, head: int = 0) -> tuple[np.ndarray | None, np.ndarray]:
    """One forward pass of `ids`: (head `head` of `layer`'s weights, or None for layer -1; every
    head's thumbnail, (L, H, s, s)), kept as the model's last thumbnails."""
    trace = _Thumbnails(layer, head)
    with np.errstate(over="ignore", invalid="ignore"):  # a damaged model's overflow shows as NaN, not warnings
        model.forward(np.asarray(ids, dtype=np.int64)[None, :], trace=trace)
    thumbnails = np.stack([trace.thumbnails[i] for i in range(model.config.n_layers)])
    _LAST_THUMBNAILS[model] = (tuple(ids), thumbnails)
    return trace.chosen, thumbnails


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
    ids = model_ids(model, tokenizer, text, policy, attention_tokens(cfg))
    chosen, _ = _attention_pass(model, ids, layer, head)
    return {
        "tokens": token_entries(tokenizer, ids),
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "layer": layer,
        "head": head,
        "weights": pack_weights(chosen),
    }


def thumbnails_view(model, tokenizer, text: str, *, policy: Mapping[str, Any] = REFUSE) -> dict[str, Any]:
    """/api/thumbnails: every head's thumbnail (thumbnails[layer][head], `pack_weights`: `pool`ed to
    at most THUMBNAIL_CELLS a side, blocks starting at thumbnail_edges). Up to THUMBNAIL_CELLS
    tokens a thumbnail is its head's weights, what `attention_view` sends for it, bit for bit.
    Those of the text the model's last `attention_view` was of are its, without a forward pass."""
    cfg = model.config
    ids = model_ids(model, tokenizer, text, policy, attention_tokens(cfg))
    last = _LAST_THUMBNAILS.get(model)
    thumbnails = last[1] if last is not None and last[0] == tuple(ids) else _attention_pass(model, ids)[1]
    return {
        "tokens": token_entries(tokenizer, ids),
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "thumbnail_edges": block_edges(len(ids)).tolist(),
        "thumbnails": [[pack_weights(t) for t in layer] for layer in thumbnails],
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
) -> tuple[Explanation, list[int], list[bytes]]:
    """`transformer.explain.explain_model` on `text`: (the explanation, the ids, each id's bytes);
    what `tk explain` renders as tables and `explain_doc` as JSON."""
    ids = model_ids(model, tokenizer, text, policy, limit)
    raw = [tokenizer.decode_bytes([i]) for i in ids]
    labels = vocab_labels(tokenizer, model.config.vocab_size)
    expl = explain_model(
        model, ids, [show_token(b) for b in raw], layer=layer, head=head, top_k=top_k, label=labels.__getitem__,
    )  # fmt: skip
    return expl, ids, raw


def model_doc(
    expl: Explanation,
    ids: Sequence[int],
    raw: Sequence[bytes],
    tokenizer,
    text: str,
    model_name: str,
    query: int | None = None,
):
    """`tk explain -m MODEL TEXT --json`'s document, from `explain_run`'s result (`--query Q`:
    the per-token steps hold row Q only, see `Explanation.to_dict`)."""
    doc = {
        "kind": "model",
        "model": model_name,
        "text": text,
        **expl.to_dict(query),
        "tokens": [
            {"position": t, "id": i, "text": b.decode("utf-8", errors="replace"), "bytes": b.hex()}
            for t, (i, b) in enumerate(zip(ids, raw, strict=True))
        ],
    }
    for candidate in doc["top"]:  # plain text in JSON, like "tokens" (the tables show it quoted)
        i = candidate["id"]
        candidate["token"] = (
            tokenizer.decode_bytes([i]).decode("utf-8", errors="replace") if i < tokenizer.vocab_size else pad_label(i)
        )
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
    expl, ids, raw = explain_run(
        model, tokenizer, text, layer=layer, head=head, top_k=top_k, policy=policy, limit=limit
    )
    return model_doc(expl, ids, raw, tokenizer, text, model_name, query)


def example_doc(name: str) -> dict[str, Any]:
    """/api/example: what `tk explain --example NAME --json` prints."""
    return {"kind": "example", "example": name, **explain_example(name).to_dict()}


def examples_list() -> list[dict[str, str]]:
    return [{"name": name, "what": what} for name, (what, _) in EXAMPLES.items()]


# ----------------------------------------------------------------------------- next tokens


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def next_view(
    model,
    tokenizer,
    text: str,
    *,
    top_k: int = 10,
    policy: Mapping[str, Any] = REFUSE,
    say: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """/api/next and `tk predict-next --json`: the top_k most likely next tokens and the prompt's ids."""
    pred = predict_next(model, tokenizer, text, top_k=top_k, say=say, **policy)
    texts = token_pieces(tokenizer, [i for i, _ in pred.top])  # a part of a character as \xNN
    top = [{"id": i, "token": t, "p": p} for (i, p), t in zip(pred.top, texts, strict=True)]
    return {"top": top, "prompt_ids": pred.prompt_ids}


def generate_view(
    model,
    tokenizer,
    text: str,
    *,
    n: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    show: int = 10,
    policy: Mapping[str, Any] = REFUSE,
    say: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """/api/generate: generation step by step, the tokens `tk generate` prints with the same
    settings. Each step: the token, the probability it was drawn with (`p`), and the `show` most
    likely tokens by the model's logits, each with `p` in the distribution drawn from (after
    temperature, top-k and top-p; one-hot when greedy) and `p_model` (the model's own softmax).
    `text` is the new tokens decoded (what `tk generate` prints after the prompt)."""
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    prompt_ids, tokens = generate_ids(
        model,
        tokenizer,
        text,
        max_new_tokens=n,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        say=say,
        observe=lambda logits, probs: seen.append((logits, probs)),
        **policy,
    )
    steps = []
    for token in tokens:
        logits, probs = seen.pop()  # one distribution per token, just before it
        logits = np.asarray(logits, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            model_p = softmax(logits)
        best = np.argsort(-logits, kind="stable")[:show].tolist()  # ties: the smaller id first
        top = [
            {"id": i, "token": t, "p": _finite(probs[i]), "p_model": _finite(model_p[i])}
            for i, t in zip(best, token_pieces(tokenizer, best), strict=True)
        ]
        steps.append({"id": token, "token": tokenizer.token_pieces([token])[0], "p": _finite(probs[token]), "top": top})
    new_ids = [s["id"] for s in steps]
    return {"prompt_ids": prompt_ids, "steps": steps, "text": tokenizer.decode(new_ids)}


# ----------------------------------------------------------------------------- training


def _run_settings(run_dir: Path) -> tuple[dict[str, Any] | None, float | None]:
    """(training config, unigram baseline) from the run's model file, else its training state:
    for logs written before the session record carried them."""
    model = run_dir / checkpoint.MODEL_FILE
    try:
        if model.exists():
            prov = checkpoint.decode_metadata(checkpoint.read_header(model, "model file")).get("provenance")
            if isinstance(prov, dict) and isinstance(prov.get("train_config"), dict):
                base = prov.get("unigram_baseline")
                return prov["train_config"], base if type(base) is float and math.isfinite(base) else None
        state = run_dir / checkpoint.STATE_FILE
        if state.exists():
            config = checkpoint.loads(checkpoint.read_header(state, "training state").get("train_config", "null"), "")
            return (config if isinstance(config, dict) else None), None
    except PipelineError:
        pass  # a damaged file: the curves still show, without the settings
    return None, None


def _decimate(n: int, most: int) -> np.ndarray:
    """Indices of at most `most` of n points, evenly spaced, the last one always kept."""
    if n <= most:
        return np.arange(n)
    stride = -(-n // (most - 1))
    return np.append(np.arange(0, n - 1, stride), n - 1)


def training_view(run_dir: Path, *, name: str, log: TrainingLog | None = None) -> dict[str, Any]:
    """/api/training: the run's log as curves (`log`: a `TrainingLog` kept between calls, so that
    only new lines are read; a fresh one otherwise). tokens_per_s = batch_size x context_length /
    the step's seconds. At most TRAIN_POINTS train points (`decimated` says when some were left
    out; the last step stays). `status`: "waiting" (no record yet), "training", "done" (the last
    step reached the configured steps), "interrupted" or "diverged"; `finished` unless waiting or
    training. Damaged log lines are skipped and counted (`damaged_lines`)."""
    run_dir = Path(run_dir)
    log = (log or TrainingLog(run_dir / checkpoint.LOG_FILE)).read()
    config, baseline = log.config, log.unigram_baseline
    if config is None or baseline is None:
        found_config, found_baseline = _run_settings(run_dir)
        config = config if config is not None else found_config
        baseline = baseline if baseline is not None else found_baseline
    n = len(log.steps)
    keep = _decimate(n, TRAIN_POINTS)
    steps = np.frombuffer(log.steps, dtype=np.int64)[keep].tolist() if n else []
    loss, lr, dt, norm = (
        np.frombuffer(getattr(log, key), dtype=np.float64)[keep].tolist() if n else []
        for key in ("loss", "lr", "dt", "grad_norm")
    )
    tokens = None
    if isinstance(config, dict) and all(type(config.get(k)) is int for k in ("batch_size", "context_length")):
        tokens = config["batch_size"] * config["context_length"]
    train = [
        {"step": s, "loss": _finite(a), "lr": _finite(b), "grad_norm": _finite(g)}
        | {"tokens_per_s": _finite(tokens / t) if tokens and t > 0 else None}
        for s, a, b, t, g in zip(steps, loss, lr, dt, norm, strict=True)
    ]
    evals = log.evals
    if len(evals) > TRAIN_POINTS:
        evals = [evals[i] for i in _decimate(len(evals), TRAIN_POINTS).tolist()]
    last_step = int(log.steps[-1]) if n else None
    status = log.status
    total = config.get("steps") if isinstance(config, dict) else None
    if status == "training" and last_step is not None and type(total) is int and last_step >= total:
        status = "done"
    return {
        "run": name,
        "config": config,
        "unigram_baseline": baseline,
        "train": train,
        "val": [{"step": s, "val_loss": _finite(v)} for s, v in evals],
        "last_step": last_step,
        "status": status,
        "finished": status not in ("waiting", "training"),
        "decimated": n > TRAIN_POINTS or len(log.evals) > TRAIN_POINTS,
        "damaged_lines": log.damaged,
    }


# ----------------------------------------------------------------------------- the model


def _block(params: Mapping[str, Any], name: str, what: str, view: str, shape=None, **extra) -> dict[str, Any]:
    """One block of `model_view`: the tensors of `params` named `name`.weight / `name`.bias."""
    tensors = {key: list(params[key].shape) for key in (f"{name}.weight", f"{name}.bias") if key in params}
    n = sum(int(np.prod(s)) for s in tensors.values())
    shape = list(shape) if shape is not None else tensors.get(f"{name}.weight")
    return {"name": name, "what": what, "shape": shape, "parameters": n, "tensors": tensors, "view": view, **extra}


def model_view(config, params: Mapping[str, Any]) -> dict[str, Any]:
    """/api/model: the model's blocks in the order data flows through them, each with its tensors'
    shapes and parameter count (from `params`, the model's own), and the page view that shows it
    at work. The counts add up to the model's parameters. The pieces are named as the config
    says: learned, sinusoidal or rotary positions; LayerNorm or RMSNorm; a GELU/ReLU or SwiGLU MLP;
    K/V heads shared by groups of query heads; the head tied to wte or its own lm_head."""
    C, H, V, T = config.d_model, config.n_heads, config.vocab_size, config.context_length
    pre, hd, kv = config.norm == "pre", config.head_dim, config.kv_heads
    norm = "RMSNorm" if config.norm_type == "rmsnorm" else "LayerNorm"
    blocks = [_block(params, "wte", "token embeddings: one row of d_model numbers per token id", "tokens")]
    if config.positional == "learned":
        blocks.append(
            _block(params, "wpe", "learned positional embeddings, added to the token embeddings", "attention")
        )
    elif config.positional == "rope":
        scaled = f"; {config.rope_scaling.describe()}" if config.rope_scaling else ""
        what = (
            f"rotary positions: q and k rotated by their position (theta {config.rope_theta:g}{scaled}; no parameters)"
        )
        blocks.append(_block(params, "rope", what, "attention", shape=(T, hd)))
    else:
        what = "sinusoidal positional encodings, added to the token embeddings (fixed: no parameters)"
        blocks.append(_block(params, "wpe", what, "attention", shape=(T, C)))
    if kv == H:
        qkv = f"Q, K and V for {H} heads of {hd} dimensions"
    else:
        qkv = f"Q for {H} heads, K and V for {kv} (each shared by {H // kv} query heads), {hd} dimensions each"
    if config.activation == "swiglu":
        up = f"MLP: gate and up, {config.hidden} dimensions each; SiLU(gate) * up"
    else:
        up = f"MLP: up to {config.hidden} dimensions, then {config.activation.upper()}"
    for i in range(config.n_layers):
        h = f"h.{i}."
        layer = [
            ("ln_1", f"{norm} of the attention's input" if pre else f"{norm} of input + attention", {}),
            ("attn.c_attn", qkv, {"heads": H, "head_dim": hd, "kv_heads": kv}),
            ("attn.c_proj", "the heads' weighted sums, side by side, projected back", {}),
            ("ln_2", f"{norm} of the MLP's input" if pre else f"{norm} of input + MLP", {}),
            ("mlp.c_fc", up, {}),
            ("mlp.c_proj", f"MLP: back down to {C} dimensions", {}),
        ]
        blocks += [_block(params, h + name, what, "attention", layer=i, **extra) for name, what, extra in layer]
    blocks.append(_block(params, "ln_f", f"final {norm}", "next"))
    if config.tie_embeddings:
        head = _block(
            params, "head", "logits = ln_f(x) @ wte^T (tied to wte: no parameters of its own)", "next", (C, V)
        )
    else:
        head = _block(params, "lm_head", "logits = ln_f(x) @ lm_head^T (its own weights, untied from wte)", "next")
    blocks.append(head)
    counted = {key for b in blocks for key in b["tensors"]}
    for key in sorted(set(params) - counted):  # not a tokenkit GPT's name: shown, so that the total still adds up
        shape = list(params[key].shape)
        other = {"name": key, "what": "other", "shape": shape, "parameters": int(np.prod(shape))}
        blocks.append(other | {"tensors": {key: shape}, "view": "model"})
    return {"config": config.to_dict(), "parameters": sum(b["parameters"] for b in blocks), "blocks": blocks}


# ----------------------------------------------------------------------------- the server


def limits(config=None) -> dict[str, Any]:
    """What the server answers (docs/serve.md's limits); the token limits of a model's views."""
    out: dict[str, Any] = {"text_chars": TEXT_CHARS, "top_k": TOP_K_MAX, "new_tokens": NEW_TOKENS_MAX}
    out.update(show=TOP_K_MAX, temperature=TEMPERATURE_MAX, seed=SEED_MAX)
    if config is not None:
        out.update(context_length=config.context_length, attention_tokens=attention_tokens(config))
        out.update(explain_tokens=explain_tokens(config))
    return out


def tokenizer_info(tokenizer, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "vocab_size": tokenizer.vocab_size,
        "merges": len(tokenizer.merges),
        "pattern": tokenizer.pattern,
        "special_tokens": tokenizer.special_tokens,
        "merge_counts": _merge_counts(tokenizer) is not None,
    }


def info_view(
    *,
    tokenizer=None,
    tokenizer_name: str | None = None,
    compare=None,
    compare_name: str | None = None,
    model=None,
    model_name: str | None = None,
    run: str | None = None,
) -> dict[str, Any]:
    """/api/info: what the server holds (None for what it was not given) and its limits."""
    model_info = None
    if model is not None:
        model_info = {
            "name": model_name,
            "config": model.config.to_dict(),
            "parameters": sum(int(p.size) for p in model.params.values()),
        }
    return {
        "version": __version__,
        "tokenizer": None if tokenizer is None else tokenizer_info(tokenizer, tokenizer_name),
        "compare": None if compare is None else tokenizer_info(compare, compare_name),
        "model": model_info,
        "run": run,
        "views": list(VIEWS),
        "examples": examples_list(),
        "limits": limits(None if model is None else model.config),
    }
