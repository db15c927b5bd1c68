"""What each view of `tk serve`'s page shows, as JSON-ready dicts: the one place it is computed.

The commands' `--json` (`tk explain`, `tk predict-next`) print these same dicts and the server
(cli/serve.py) sends them, so the page's numbers are the commands' by construction. Each function
takes loaded objects (a Tokenizer, a GPT, a run directory) and plain settings, and returns plain
lists, dicts, strings, ints and finite floats (a value JSON cannot hold, such as a masked score's
-inf, is None). docs/serve.md lists every shape.

The views live in three modules by what they show, and this one names them all for the server
and the commands:
- pipeline/token_views.py, a tokenizer's: `tokens_view`, `compare_view` (a text cut into tokens),
  `bpe_view` (merge by merge), and how the page shows one token (`piece`, ...);
- pipeline/forward_views.py, one forward pass's: `attention_view`, `thumbnails_view`,
  `explain_doc`, `example_doc` (transformer/explain.py), the attention maps' packing;
- pipeline/lens_views.py, inside the model: `lens_view` (the logit lens), `attribution_view`
  (direct logit attribution);
- here, the rest: `next_view`, `generate_view` (the next-token distribution; generation step by
  step), `training_view` (a run's log, `pipeline.live.TrainingLog`), `model_view` (a model's
  blocks) and `info_view` (what the server holds, and the limits of what it answers).

What it deliberately does not do: read request parameters, hold locks or follow files (cli/serve.py
and pipeline/live.py do), or print.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit import __version__
from tokenkit.pipeline import checkpoint, eval_record
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.forward_views import (
    ATTENTION_NUMBERS,
    THUMBNAIL_CELLS,
    attention_tokens,
    attention_view,
    block_edges,
    example_doc,
    examples_list,
    explain_doc,
    explain_run,
    explain_tokens,
    model_doc,
    model_ids,
    pack_weights,
    pool,
    thumbnails_view,
    unpack_weights,
)
from tokenkit.pipeline.lens_views import LENS_TOP_K_MAX, attribution_view, lens_tokens, lens_view
from tokenkit.pipeline.live import TrainingLog
from tokenkit.pipeline.names import VIEWS
from tokenkit.pipeline.run import cut_field, generate_ids, predict_next
from tokenkit.pipeline.token_views import (
    FIRST_MERGES,
    REFUSE,
    SPECIALS,
    bpe_view,
    compare_view,
    merge_counts,
    token_pieces,
    tokens_view,
    vocab_labels,
)
from tokenkit.transformer.sampling import softmax

# the other modules' views and constants, reached as views.NAME by the server, the commands and the tests
__all__ = [
    "ATTENTION_NUMBERS",
    "FIRST_MERGES",
    "LENS_TOP_K_MAX",
    "SPECIALS",
    "THUMBNAIL_CELLS",
    "attention_tokens",
    "attention_view",
    "attribution_view",
    "block_edges",
    "bpe_view",
    "compare_view",
    "example_doc",
    "explain_doc",
    "explain_run",
    "explain_tokens",
    "lens_tokens",
    "lens_view",
    "model_doc",
    "model_ids",
    "pack_weights",
    "pool",
    "thumbnails_view",
    "tokens_view",
    "unpack_weights",
    "vocab_labels",
]

TEXT_CHARS = 20_000  # the longest text a view takes: a tokenization of it is a few hundred KB of JSON
TRAIN_POINTS = 2000  # training-curve points sent at most; a longer log is thinned (`chart_points`)
RECENT_POINTS = 250  # the latest points always sent as they are (the page's tokens/s is a median of the last 50)
TOP_K_MAX = 100  # next tokens listed (top_k, and show per generated token)
NEW_TOKENS_MAX = 200  # tokens one /api/generate makes: each is a forward pass under the server's one lock
TEMPERATURE_MAX = 10.0
SEED_MAX = 2**32 - 1


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
    """/api/next and `tk predict-next --json`: the top_k most likely next tokens and the prompt's ids
    (the last context_length of a longer text, and `cut`: run.cut_field)."""
    pred = predict_next(model, tokenizer, text, top_k=top_k, say=say, **policy)
    texts = token_pieces(tokenizer, [i for i, _ in pred.top])  # a part of a character as \xNN
    top = [{"id": i, "token": t, "p": p} for (i, p), t in zip(pred.top, texts, strict=True)]
    return {"top": top, "prompt_ids": pred.prompt_ids, **cut_field(pred.cut)}


def drawn_step(tokenizer, token: int, logits, probs, show: int) -> dict[str, Any]:
    """One generated token and the distribution it was drawn from, as /api/generate and /api/chat
    send it: the token (`id`, its text `token`, `p` its probability when drawn) and the `show` most
    likely tokens by the (V,) `logits`, each with `p` in `probs` (the (V,) distribution drawn from:
    after temperature, top-k and top-p; one-hot when greedy) and `p_model` (the logits' softmax)."""
    logits = np.asarray(logits, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        model_p = softmax(logits)
    best = np.argsort(-logits, kind="stable")[:show].tolist()  # ties: the smaller id first
    top = [
        {"id": i, "token": t, "p": _finite(probs[i]), "p_model": _finite(model_p[i])}
        for i, t in zip(best, token_pieces(tokenizer, best), strict=True)
    ]
    return {"id": token, "token": tokenizer.token_pieces([token])[0], "p": _finite(probs[token]), "top": top}


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
    prompt, tokens = generate_ids(
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
        steps.append(drawn_step(tokenizer, token, logits, probs, show))
    new_ids = [s["id"] for s in steps]
    return {"prompt_ids": prompt.ids, "steps": steps, "text": tokenizer.decode(new_ids), **cut_field(prompt.cut)}


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


def chart_points(values: np.ndarray, most: int = TRAIN_POINTS, recent: int = RECENT_POINTS) -> np.ndarray:
    """Indices (ascending) of at most `most` of the points of a curve of `values` (float64, NaN
    for a missing value) that draw it honestly: all of them when there are no more than `most`;
    else the first point, the last `recent` points as they are, and, for the points before those,
    the lowest and highest value of each bucket of consecutive points. So the curve's minimum and
    maximum, first and last points and its latest stretch are always sent, and a spike inside a
    bucket is never averaged away. Buckets are a power of two points wide and start at multiples
    of their width, so a full bucket's two points stay the same while a log grows, until the
    width doubles. A bucket of NaN alone gives its first point. `most` must exceed `recent` + 2.

    >>> chart_points(np.array([5.0, 1.0, 4.0, 3.0, 9.0, 2.0, 8.0, 7.0]), most=7, recent=2).tolist()
    [0, 1, 4, 5, 6, 7]
    """
    n = len(values)
    if n <= most:
        return np.arange(n)
    head = n - recent  # the points before the recent ones, cut into buckets
    buckets = (most - recent - 1) // 2  # two points each, plus the first point
    width = 1 << max(0, math.ceil(math.log2(head / buckets)))
    while -(-head // width) > buckets:  # log2's rounding
        width *= 2
    older = values[:head]
    missing = np.isnan(older)
    lows, highs = (np.where(missing, fill, older) if missing.any() else older for fill in (np.inf, -np.inf))
    picked = [np.zeros(1, dtype=np.int64), np.arange(head, n)]
    full = head // width * width
    for start, stop, size in ((0, full, width), (full, head, head - full)):  # the full buckets, then the last
        if stop > start:
            starts = np.arange(start, stop, size)
            picked.append(lows[start:stop].reshape(-1, size).argmin(axis=1) + starts)
            picked.append(highs[start:stop].reshape(-1, size).argmax(axis=1) + starts)
    return np.unique(np.concatenate(picked))


def training_view(run_dir: Path, *, name: str, log: TrainingLog | None = None) -> dict[str, Any]:
    """/api/training: the run's log as curves (`log`: a `TrainingLog` kept between calls, so that
    only new lines are read; a fresh one otherwise). tokens_per_s = batch_size x context_length /
    the step's seconds. At most TRAIN_POINTS train points and as many evaluations, chosen by
    `chart_points` on their losses (`decimated` says when some were left out: the first and last
    points, the lowest and highest loss and the latest RECENT_POINTS steps stay). `status`:
    "waiting" (no record yet), "training", "done" (the last step reached the configured steps),
    "interrupted" or "diverged"; `finished` unless waiting or training. Damaged log lines are
    skipped and counted (`damaged_lines`). Each evaluation has its bits per byte beside its loss
    (None in a log written before tk logged them); `evaluations` are what `tk eval -m RUN_DIR`
    recorded in the run's eval.json (pipeline/eval_record.py; `evaluations_error` says why they
    cannot be read, None when they can)."""
    run_dir = Path(run_dir)
    log = (log or TrainingLog(run_dir / checkpoint.LOG_FILE)).read()
    config, baseline = log.config, log.unigram_baseline
    if config is None or baseline is None:
        found_config, found_baseline = _run_settings(run_dir)
        config = config if config is not None else found_config
        baseline = baseline if baseline is not None else found_baseline
    n = len(log.steps)
    keep = chart_points(np.frombuffer(log.loss, dtype=np.float64)) if n else np.arange(0)
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
    picked = range(len(log.evals))
    if len(log.evals) > TRAIN_POINTS:
        picked = chart_points(np.array([v for _, v in log.evals], dtype=np.float64)).tolist()
    val = [
        {"step": log.evals[i][0], "val_loss": _finite(log.evals[i][1]), "val_bits_per_byte": _finite(log.eval_bpb[i])}
        for i in picked
    ]
    evaluations, evaluations_error = eval_record.evaluations(run_dir)
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
        "val": val,
        "last_step": last_step,
        "status": status,
        "finished": status not in ("waiting", "training"),
        "decimated": n > TRAIN_POINTS or len(log.evals) > TRAIN_POINTS,
        "damaged_lines": log.damaged,
        "evaluations": evaluations,
        "evaluations_error": evaluations_error,
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
    at work (an MLP's: the lens, whose attribution gives its share of the prediction). The counts
    add up to the model's parameters. The pieces are named as the config says: learned, sinusoidal
    or rotary positions; LayerNorm or RMSNorm; a GELU/ReLU or SwiGLU MLP; K/V heads shared by
    groups of query heads; the head tied to wte or its own lm_head."""
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
        # an MLP's effect shows in the lens view (its attribution bar); the rest of a block, in its attention
        shown_in = {"mlp.c_fc": "lens", "mlp.c_proj": "lens"}
        blocks += [
            _block(params, h + name, what, shown_in.get(name, "attention"), layer=i, **extra)
            for name, what, extra in layer
        ]
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
        out.update(explain_tokens=explain_tokens(config), lens_tokens=lens_tokens(config))
    return out


def tokenizer_info(tokenizer, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "vocab_size": tokenizer.vocab_size,
        "merges": len(tokenizer.merges),
        "pattern": tokenizer.pattern,
        "special_tokens": tokenizer.special_tokens,
        "merge_counts": merge_counts(tokenizer) is not None,
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
