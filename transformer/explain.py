"""Explain mode: a real model's forward pass laid out step by step, the way the worked examples are.

`explain_model(model, ids, ...)` reads the model's own `forward(ids, trace=...)` (the entries
transformer/trace.py declares) and lays out one layer and one head as `Step`s
(transformer/explanation.py). Nothing is recomputed differently: every number shown (and the
logits) is what the model produced; the few steps it adds (a head's share of the output
projection, RoPE's angles, RMSNorm's rms, SwiGLU's halves) are computed from the trace in float64.

The steps come from one builder per part, in the order the data flows: `embedding_steps`, then
the layer's `attention_steps` (with `rope_steps` for rotary positions), `norm_steps` (with
`rmsnorm_steps`) and `mlp_steps` (with `swiglu_steps`), put in the block's order by
`block_steps`, then `output_steps`. The worked examples are transformer/explain_examples.py's.

What it deliberately does not do: print, plot or read files (cli/explain_*.py do), or know about the
tokenizer (the caller passes each token's text).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tokenkit.transformer import attribution, lens, ops
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.explanation import Explanation, Step, dim_labels, token_labels
from tokenkit.transformer.trace import layer_key, stream_keys


def _f64(a) -> np.ndarray:
    """An array on the host in float64: how a step shows it (the values are the model's)."""
    return np.asarray(as_host(a), dtype=np.float64)


class Rows:
    """Makes the steps that have one row per token: `rows(key, title, value, cols, note)`."""

    def __init__(self, toks: list[str]) -> None:
        self.toks = toks

    def __call__(self, key: str, title: str, value, cols: list[str] | None, note: str) -> Step:
        return Step(key, title, _f64(value), self.toks, cols, note)


# ----------------------------------------------------------------------------- the embeddings


def embedding_steps(cfg, trace, layer: int, row: Rows) -> list[Step]:
    """The token embeddings, the positions added to them (none with RoPE: q and k are rotated in
    every layer instead), and for a later layer the residual stream entering it."""
    C = cfg.d_model
    tok_emb = trace["tok_emb"][0]
    steps = [row("tok_emb", "token embeddings (rows of wte)", tok_emb, dim_labels(C), "wte[id] for each token.")]
    if cfg.positional == "rope":
        steps.append(
            row(
                "x0",
                "input x0 = token embedding",
                trace["x0"][0],
                dim_labels(C),
                "rotary positions: Q and K of"
                " every layer are turned by angles that grow with the position; nothing is added here.",
            )
        )
    else:
        steps += [
            row(
                "pos_emb",
                f"positional encodings ({cfg.positional})",
                trace["pos_emb"],
                dim_labels(C),
                "wpe[position]"
                if cfg.positional == "learned"
                else "PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(...)",
            ),
            row("x0", "input x0 = token embedding + positional encoding", trace["x0"][0], dim_labels(C), ""),
        ]
    if layer > 0:
        prev = stream_keys(cfg)[layer]  # block layer-1's output
        steps.append(row("layer_input", f"residual stream entering layer {layer}", trace[prev][0], dim_labels(C), ""))
    return steps


# ----------------------------------------------------------------------------- attention


def gqa_note(cfg, head: int) -> str:
    """Which K/V head query head `head` reads, and which query heads share it."""
    group = cfg.n_heads // cfg.kv_heads
    kv = head // group
    mates = list(range(kv * group, kv * group + group))
    shared = ", ".join(map(str, mates[:-1])) + f" and {mates[-1]}" if group > 1 else str(head)
    return f"head {head} reads K/V head {kv}, shared with heads {shared}."


def rope_angles(T: int, head_dim: int, theta: float, scaling=None) -> np.ndarray:
    """(T, head_dim / 2) rotary angles position * inv_freq, inv_freq_i = theta^(-2i / head_dim)
    (stretched by a RoPE scaling, `ops.rope_inv_freq`), in float64 as ops.rope_table computes them
    (it then takes their cos and sin)."""
    return np.arange(T, dtype=np.float64)[:, None] * ops.rope_inv_freq(head_dim, theta, scaling)


def rope_steps(cfg, trace, h: str, head: int, toks, row, q_note: str, kv_name: str, kv_note: str) -> list[Step]:
    """Q and K before and after the rotary rotation, and the rotation's angles (RoPE configs)."""
    hd, T = cfg.head_dim, len(toks)
    half, cols = hd // 2, dim_labels(hd)
    pairs = f"dimension i turns with i + {half} (HF's rotate_half): by the angle of column i mod {half}"
    scaling = cfg.rope_scaling
    angles = Step(
        "rope_angle",
        f"rotation angles position * inv_freq (theta {cfg.rope_theta:g}"
        + (f", {scaling.type} scaling)" if scaling else ")"),
        rope_angles(T, hd, cfg.rope_theta, scaling),
        toks,
        dim_labels(half, "i"),
        f"inv_freq_i = theta^(-2i/{hd})"
        + (f", then {scaling.describe()}" if scaling else "")
        + "; the same angles turn q and k of every head and layer.",
    )
    return [
        row(f"{h}attn.q_pre", f"Q before rotation, head {head}", trace[h + "attn.q_pre"][0, head], cols, q_note),
        row(f"{h}attn.k_pre", f"K before rotation, {kv_name}", trace[h + "attn.k_pre"][0, head], cols, kv_note),
        angles,
        row(
            f"{h}attn.q",
            f"Q rotated (RoPE), head {head}",
            trace[h + "attn.q"][0, head],
            cols,
            f"q_i cos - q_(i+{half}) sin, q_(i+{half}) cos + q_i sin: {pairs}.",
        ),
        row(
            f"{h}attn.k",
            f"K rotated (RoPE), {kv_name}",
            trace[h + "attn.k"][0, head],
            cols,
            (kv_note + " " if kv_note else "")
            + "The same rotation by each key's position; q . k then depends on their distance only.",
        ),
    ]


def attention_steps(cfg, trace, c_proj: np.ndarray, layer: int, head: int, row: Rows) -> list[Step]:
    """Head `head` of layer `layer`: Q and K (before and after the rotation with RoPE), V, the raw
    and scaled scores, the weights, the weighted sum, this head's share of the output projection
    (its mix @ its rows of c_proj (C, C)), and the projection of all heads."""
    C, hd, toks = cfg.d_model, cfg.head_dim, row.toks
    h = layer_key(layer, "")
    scale = 1.0 / math.sqrt(hd)
    mask = "; positions after the query are masked (-inf)" if cfg.causal else " (bidirectional: no mask)"
    q_note = f"rows of x W_Q for head {head} (c_attn's first third)."
    kv_note, kv_name = "", f"head {head}"
    if cfg.kv_heads != cfg.n_heads:
        group = cfg.n_heads // cfg.kv_heads
        kv = head // group
        q_note = f"rows of x W_Q for head {head} (c_attn's first {C} columns). {gqa_note(cfg, head)}"
        kv_note = f"K/V head {kv}, shared by query heads {kv * group}..{kv * group + group - 1}."
        kv_name = f"K/V head {kv} (read by query head {head})"
    if cfg.positional == "rope":
        steps = rope_steps(cfg, trace, h, head, toks, row, q_note, kv_name, kv_note)
    else:
        steps = [
            row(f"{h}attn.q", f"Q, head {head}", trace[h + "attn.q"][0, head], dim_labels(hd), q_note),
            row(f"{h}attn.k", f"K, {kv_name}", trace[h + "attn.k"][0, head], dim_labels(hd), kv_note),
        ]
    return steps + [
        row(f"{h}attn.v", f"V, {kv_name}", trace[h + "attn.v"][0, head], dim_labels(hd), kv_note),
        row(
            f"{h}attn.scores_raw",
            "raw scores Q K^T",
            trace[h + "attn.scores_raw"][0, head],
            toks,
            "row = query token, column = key token.",
        ),
        row(
            f"{h}attn.scores",
            f"scaled scores Q K^T / sqrt({hd})",
            trace[h + "attn.scores"][0, head],
            toks,
            f"times 1/sqrt(d_head) = {scale:.6g}{mask}.",
        ),
        row(
            f"{h}attn.weights",
            "attention weights softmax(scores)",
            trace[h + "attn.weights"][0, head],
            toks,
            "each row sums to 1.",
        ),
        row(
            f"{h}attn.mix",
            f"weighted sum of V, head {head}",
            trace[h + "attn.mix"][0, head],
            dim_labels(hd),
            "weights @ V.",
        ),
        row(
            f"{h}attn.head_out",
            f"head {head}'s share of the output projection",
            _f64(trace[h + "attn.mix"][0, head]) @ _f64(c_proj[head * hd : (head + 1) * hd]),
            dim_labels(C),
            f"weighted sum @ rows {head * hd}..{(head + 1) * hd - 1} of attn.c_proj: what this head writes into the"
            " residual stream (the heads' shares plus the bias make the next step).",
        ),
        row(
            f"{h}attn.out",
            "output projection (all heads concatenated) @ c_proj",
            trace[h + "attn.out"][0],
            dim_labels(C),
            f"the {cfg.n_heads} heads' weighted sums side by side, times attn.c_proj.",
        ),
    ]


# ----------------------------------------------------------------------------- norms and the MLP


def rmsnorm_steps(name: str, x, gain, eps: float, toks) -> list[Step]:
    """RMSNorm's scale: each row's rms = sqrt(mean(x^2) + eps), and x / rms, before the gain
    (computed here in float64 from the norm's input; the output after them is the model's)."""
    x = _f64(x)
    rms = np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    C = x.shape[-1]
    return [
        Step(
            name + ".rms",
            f"rms of each row ({name})",
            rms,
            toks,
            ["rms"],
            f"sqrt(mean(x^2) + {eps:g}); no mean subtracted.",
        ),
        Step(name + ".scaled", f"x / rms ({name})", x / rms, toks, dim_labels(C), "each row scaled to rms 1."),
        Step(name + ".gain", f"gain ({name}.weight)", _f64(gain), None, dim_labels(C), "no bias."),
    ]


def norm_steps(cfg, trace, params, name: str, what: str, x_in, row: Rows) -> list[Step]:
    """The norm `name` ("h.L.ln_1", ...) of x_in: its output, after RMSNorm's rms, x / rms and gain."""
    rms = cfg.norm_type == "rmsnorm"
    title = f"{'RMSNorm' if rms else 'LayerNorm'} {name.rsplit('.', 1)[1]} {what}"
    out = row(name, title, trace[name][0], dim_labels(cfg.d_model), "x / rms * gain." if rms else "")
    if not rms:
        return [out]
    return [*rmsnorm_steps(name, x_in, params[name + ".weight"], cfg.norm_eps, row.toks), out]


def swiglu_steps(pre, h: str, row) -> list[Step]:
    """SwiGLU's halves of c_fc: the gate, silu(gate) (the library's op on the model's gate) and up."""
    F = pre.shape[-1] // 2
    gate, up = pre[..., :F], pre[..., F:]
    silu, _ = ops.silu_forward(np.asarray(gate), grad=False)
    return [
        row(f"{h}mlp.gate", "gate (c_fc's first half)", gate, dim_labels(F), "x W_gate."),
        row(
            f"{h}mlp.silu_gate",
            "silu(gate) = gate * sigmoid(gate)",
            silu,
            dim_labels(F),
            "the gate's switch, 0 for a very negative gate.",
        ),
        row(
            f"{h}mlp.up",
            "up (c_fc's second half)",
            up,
            dim_labels(F),
            "x W_up; multiplied by silu(gate) in the next step.",
        ),
    ]


def mlp_steps(cfg, trace, layer: int, row: Rows) -> list[Step]:
    """Layer `layer`'s MLP: c_fc's pre-activation (its width the trace's, mlp_hidden or not), the
    activation (SwiGLU's gate, silu(gate) and up first), and c_proj's output."""
    h = layer_key(layer, "")
    pre, act = trace[h + "mlp.pre"][0], trace[h + "mlp.act"][0]
    swiglu = cfg.activation == "swiglu"
    gated = "columns: gate then up; the next step is silu(gate) * up." if swiglu else ""
    steps = [row(f"{h}mlp.pre", "MLP hidden pre-activation (c_fc)", pre, dim_labels(pre.shape[-1]), gated)]
    if swiglu:
        steps += swiglu_steps(pre, h, row)
        steps.append(row(f"{h}mlp.act", "MLP hidden silu(gate) * up (SwiGLU)", act, dim_labels(act.shape[-1]), ""))
    else:
        title = f"MLP hidden after {cfg.activation.upper()}"
        steps.append(row(f"{h}mlp.act", title, act, dim_labels(act.shape[-1]), ""))
    steps.append(row(f"{h}mlp.out", "MLP output (c_proj)", trace[h + "mlp.out"][0], dim_labels(cfg.d_model), ""))
    return steps


# ----------------------------------------------------------------------------- a block, the output


def block_steps(cfg, trace, params, layer: int, head: int, layer_in, row: Rows) -> list[Step]:
    """Layer `layer` in its block's order, layer_in (T, C) its input: pre-norm (GPT-2) x +
    attn(ln_1(x)), then x + mlp(ln_2(x)); post-norm (the original encoder) ln_1(x + attn(x)),
    then ln_2(x + mlp(x))."""
    h, C = layer_key(layer, ""), cfg.d_model
    attention = attention_steps(cfg, trace, params[h + "attn.c_proj.weight"], layer, head, row)
    resid_1 = row(f"{h}resid_1", "residual: input + attention output", trace[h + "resid_1"][0], dim_labels(C), "")
    mlp = mlp_steps(cfg, trace, layer, row)
    resid_2 = row(f"{h}resid_2", "residual: + MLP output", trace[h + "resid_2"][0], dim_labels(C), "")

    def norm(n: int, what: str, x_in) -> list[Step]:
        return norm_steps(cfg, trace, params, f"{h}ln_{n}", what, x_in, row)

    if cfg.norm == "pre":
        return [
            *norm(1, "(the attention's input)", layer_in),
            *attention,
            resid_1,
            *norm(2, "(the MLP's input)", resid_1.value),
            *mlp,
            resid_2,
        ]
    return [
        *attention,
        resid_1,
        *norm(1, "of the residual", resid_1.value),
        *mlp,
        resid_2,
        *norm(2, "of the residual", resid_2.value),
    ]


def output_steps(cfg, trace, last: np.ndarray, vocab: list[str], row: Rows) -> list[Step]:
    """The final norm, and the last position's logits last (V,) labelled by `vocab`."""
    rms = cfg.norm_type == "rmsnorm"
    norm_name = "RMSNorm" if rms else "LayerNorm"
    unembed = "ln_f(x) @ wte^T (tied embedding)." if cfg.tie_embeddings else "ln_f(x) @ lm_head^T (untied)."
    return [
        row(
            "ln_f",
            f"final {norm_name} ln_f (all layers done)",
            trace["ln_f"][0],
            dim_labels(cfg.d_model),
            "x / rms * gain." if rms else "",
        ),
        Step("logits", f"logits of the last position {row.toks[-1]}", last, None, vocab, unembed),
    ]


# ----------------------------------------------------------------------------- the lens and the attribution

LENS_TOP_K = 5  # the lens's candidates per layer and position in the JSON: (n_layers + 1) x T x 5 pairs


class Inside:
    """The logit lens (transformer/lens.py) and the direct logit attribution
    (transformer/attribution.py) of an explained pass, from its trace, computed when asked: the
    JSON carries them (`Explanation.to_dict`), the text tables do not. Holds only the trace
    entries they read, batch row 0: (T, ...) each, pos_emb (T, C), a head's (H, T, hd)."""

    def __init__(self, model, ids: np.ndarray, trace: dict, logits: np.ndarray) -> None:
        wanted = set(stream_keys(model.config)) | attribution.keys(model.config)
        self.model, self.ids, self.logits = model, ids, logits
        self.trace = {key: trace[key] if key == "pos_emb" else trace[key][0] for key in wanted}

    def lens(self, top_k: int = LENS_TOP_K) -> list[dict]:
        """`Lens.to_json`: one dict per layer boundary."""
        return lens.logit_lens(self.model, self.ids, top_k, trace=self.trace, logits=self.logits).to_json()

    def attribution(self, position: int = -1, token: int | None = None) -> dict:
        """`Attribution.to_json` of `token` (default: the prediction) at `position` (default: the last)."""
        found = attribution.attribution_from_trace(self.model, self.trace, self.logits, position, token)
        return found.to_json()

    def to_json(self) -> dict:
        return {"lens": self.lens(), "attribution": self.attribution()}


# ----------------------------------------------------------------------------- the whole pass


def _check(cfg, ids: np.ndarray, shown: Sequence[str], layer: int, head: int, top_k: int) -> None:
    """Raise ModelError (one line) for a layer, head, top-k or input explain cannot take."""
    if not 0 <= layer < cfg.n_layers:
        raise ModelError(f"layer {layer} does not exist: the model has {cfg.n_layers} layer(s), 0..{cfg.n_layers - 1}")
    if not 0 <= head < cfg.n_heads:
        raise ModelError(
            f"head {head} does not exist: the model has {cfg.n_heads} head(s) per layer, 0..{cfg.n_heads - 1}"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ModelError(f"top-k must be a positive integer, got {top_k!r}")
    if ids.ndim != 1 or len(shown) != ids.size:
        raise ModelError(
            f"explain takes one sequence of ids (T,) and one label per id; got shape {ids.shape}, {len(shown)} labels"
        )


def explain_model(
    model,
    ids: Sequence[int] | np.ndarray,
    shown: Sequence[str],
    *,
    layer: int = 0,
    head: int = 0,
    top_k: int = 5,
    label: Callable[[int], str] = str,
) -> Explanation:
    """The forward pass of `model` (a transformer.GPT) on one sequence ids (T,), for one layer/head.

    shown: each token as it should be shown, quoted (row and column labels); label(id): the same
    for any id of the vocabulary (the logits' labels).
    Every array comes from `model.forward(ids, trace=...)`; the logits are the model's own.
    """
    cfg = model.config
    ids = np.asarray(ids)
    _check(cfg, ids, shown, layer, head, top_k)
    trace: dict[str, np.ndarray] = {}
    with np.errstate(over="ignore", invalid="ignore"):  # weights too large for float32 show as inf, not as warnings
        logits = as_host(model.forward(ids[None, :], trace=trace)[0])  # (T, V)
    trace = {key: None if value is None else as_host(value) for key, value in trace.items()}  # off a GPU
    row = Rows(token_labels(shown))

    steps = embedding_steps(cfg, trace, layer, row)
    layer_in = trace["x0"][0] if layer == 0 else steps[-1].value
    steps += block_steps(cfg, trace, model.params, layer, head, layer_in, row)
    last = _f64(logits[-1])
    vocab = [label(i) for i in range(last.size)]
    steps += output_steps(cfg, trace, last, vocab, row)

    probs = np.exp(last - last.max())
    probs /= probs.sum()
    best = np.argsort(-probs, kind="stable")[:top_k]
    return Explanation(
        title=f"layer {layer}, head {head} of a {cfg.n_layers}-layer, {cfg.n_heads}-head model (d_model {cfg.d_model})",
        steps=steps,
        tokens=list(shown),
        layer=layer,
        head=head,
        attention=_f64(trace[layer_key(layer, "attn.weights")][0]),
        top=[(int(i), vocab[i], float(probs[i]), float(last[i])) for i in best],
        inside=Inside(model, ids, trace, logits),
    )
