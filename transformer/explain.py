"""Explain mode: a forward pass laid out step by step, the way the worked example documents work.

Two sources of steps, one shape of result (an `Explanation`: an ordered list of `Step`s):

- `explain_model(model, ids, ...)` reads a real model's own `forward(ids, trace=...)`. Nothing is
  recomputed differently: every number shown (and the logits) is what the model produced.
- `explain_example(name)` runs a worked example (`EXAMPLES`) through the library's
  real ops with the worked example's hand-set weights, in float64. Where the worked example printed a value, the step
  carries that text (`Printed`) and whether it is the exact value rounded to the printed digits;
  ../shared/seeds/ERRATA.md lists the ones that are not.

What this module does not do: print, plot or read files (cli/explain_*.py do), or know about the
tokenizer (the caller passes each token's text).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenkit.transformer import ops
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.errors import ModelError

# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Printed:
    """A value as a seed document printed it, e.g. "[0.291, 0.454, 0.199, 0.056]".

    `agrees` is True when every printed number is the exact value rounded to the digits printed
    (half a unit of the last digit), i.e. the worked example's arithmetic holds at its own precision.
    """

    text: str
    agrees: bool


_NUMBER = re.compile(r"-?\d+(?:\.(\d+))?")


def parse_printed(text: str) -> list[tuple[float, int]]:
    """The numbers of a seed's printed vector with their decimal places.

    >>> parse_printed("[−0.1, 0.40, 2]")
    [(-0.1, 1), (0.4, 2), (2.0, 0)]
    """
    return [(float(m.group(0)), len(m.group(1) or "")) for m in _NUMBER.finditer(text.replace("−", "-"))]


def printed(text: str, exact: np.ndarray) -> Printed:
    """Compare a seed's printed vector with the exact one (same length)."""
    numbers = parse_printed(text)
    exact = np.asarray(exact, dtype=np.float64).reshape(-1)
    if len(numbers) != exact.size:
        raise ValueError(f"printed {text!r} has {len(numbers)} numbers, the value has {exact.size}")
    # 1e-9 absorbs float64 noise on values that sit exactly on a rounding boundary
    agrees = all(abs(p - x) <= 0.5 * 10.0**-d + 1e-9 for (p, d), x in zip(numbers, exact, strict=True))
    return Printed(text, agrees)


@dataclass
class Step:
    """One intermediate of a forward pass.

    value: 0-, 1- or 2-D float64 array; -inf marks a masked attention score.
    rows / cols: labels of the axes (tokens, positions or dimension indices), None when unlabelled.
    note: what the step computes, in one or two sentences.
    seed: for a seed example, what the worked example printed: {row index: Printed} for a 2-D value (rows it
      did not print are absent), {None: Printed} for a 1-D value.
    """

    key: str
    title: str
    value: np.ndarray
    rows: list[str] | None = None
    cols: list[str] | None = None
    note: str = ""
    seed: dict[int | None, Printed] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready: arrays as nested lists, -inf / nan as null (JSON has no infinities)."""
        v = np.asarray(self.value, dtype=np.float64)
        out = {
            "key": self.key,
            "title": self.title,
            "note": self.note,
            "shape": list(v.shape),
            "rows": self.rows,
            "cols": self.cols,
            "value": json_array(v),
        }
        if self.seed:
            out["example_printed"] = [
                {"row": row, "text": p.text, "agrees": p.agrees} for row, p in sorted(self.seed.items(), key=_row_key)
            ]
        return out


def _row_key(item):
    return -1 if item[0] is None else item[0]


def json_array(v: np.ndarray):
    """An array as nested lists of floats, -inf / inf / nan as None (JSON has no infinities).

    `tolist` builds the lists in C; only an array holding a non-finite value goes through an
    object array, where those cells become None (a GPT-2-sized explain is millions of numbers).

    >>> json_array(np.array([[1.0, -np.inf], [0.5, 2.0]]))
    [[1.0, None], [0.5, 2.0]]
    """
    v = np.asarray(v, dtype=np.float64)
    finite = np.isfinite(v)
    if finite.all():
        return v.tolist()
    cells = v.astype(object)
    cells[~finite] = None
    return cells.tolist()


@dataclass
class Explanation:
    """The steps of one forward pass, plus what the CLI needs around them.

    tokens: each position's text. attention: (H, T, T) weights of every head of the explained
    layer (for one heatmap panel per head). top: the last position's most likely next tokens as
    (id, label, probability, logit), best first (real models only).
    """

    title: str
    steps: list[Step]
    tokens: list[str]
    notes: list[str] = field(default_factory=list)
    layer: int = 0
    head: int = 0
    attention: np.ndarray | None = None
    top: list[tuple[int, str, float, float]] = field(default_factory=list)

    def step(self, key: str) -> Step:
        for s in self.steps:
            if s.key == key:
                return s
        raise KeyError(key)

    def to_dict(self, query: int | None = None) -> dict:
        """JSON-ready. With `query` (a position), the steps with one row per token keep that row
        only, the others null (same shapes, a fiftieth of the text for 64 tokens): what one
        query's arithmetic reads. Keys and values stay whole: every query reads all of them."""
        doc = {
            "title": self.title,
            "notes": self.notes,
            "tokens": self.tokens,
            "layer": self.layer,
            "head": self.head,
            "steps": [s.to_dict() for s in self.steps],
            "attention_all_heads": None if self.attention is None else json_array(self.attention),
            "top": [{"id": i, "token": t, "probability": p, "logit": z} for i, t, p, z in self.top],
        }
        if query is None:
            return doc
        T = len(self.tokens)
        if not 0 <= query < T:
            raise ModelError(f"query {query} is not a position of this text: it has {T} token(s), 0..{T - 1}")
        doc["query"] = query
        for step in doc["steps"]:
            whole = step["key"].endswith((".attn.k", ".attn.v", ".attn.k_pre")) or step["key"] == "rope_angle"
            if len(step["shape"]) == 2 and step["shape"][0] == T and not whole:
                step["value"] = [row if t == query else None for t, row in enumerate(step["value"])]
        if doc["attention_all_heads"] is not None:
            doc["attention_all_heads"] = [
                [row if t == query else None for t, row in enumerate(head)] for head in doc["attention_all_heads"]
            ]
        return doc


def token_labels(shown: Sequence[str]) -> list[str]:
    """Row/column labels that stay distinct when a token repeats: "0 'The'", "1 ' cat'" from
    each token as shown ("'The'", "' cat'")."""
    return [f"{i} {p}" for i, p in enumerate(shown)]


def _dims(n: int, prefix: str = "") -> list[str]:
    return [f"{prefix}{j}" for j in range(n)]


# ----------------------------------------------------------------------------- real models


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
    half = hd // 2
    pairs = f"dimension i turns with i + {half} (HF's rotate_half): by the angle of column i mod {half}"
    scaling = cfg.rope_scaling
    angles = Step(
        "rope_angle",
        f"rotation angles position * inv_freq (theta {cfg.rope_theta:g}"
        + (f", {scaling.type} scaling)" if scaling else ")"),
        rope_angles(T, hd, cfg.rope_theta, scaling),
        toks,
        _dims(half, "i"),
        f"inv_freq_i = theta^(-2i/{hd})"
        + (f", then {scaling.describe()}" if scaling else "")
        + "; the same angles turn q and k of every head and layer.",
    )
    return [
        row(f"{h}attn.q_pre", f"Q before rotation, head {head}", trace[h + "attn.q_pre"][0, head], _dims(hd), q_note),
        row(f"{h}attn.k_pre", f"K before rotation, {kv_name}", trace[h + "attn.k_pre"][0, head], _dims(hd), kv_note),
        angles,
        row(
            f"{h}attn.q",
            f"Q rotated (RoPE), head {head}",
            trace[h + "attn.q"][0, head],
            _dims(hd),
            f"q_i cos - q_(i+{half}) sin, q_(i+{half}) cos + q_i sin: {pairs}.",
        ),
        row(
            f"{h}attn.k",
            f"K rotated (RoPE), {kv_name}",
            trace[h + "attn.k"][0, head],
            _dims(hd),
            (kv_note + " " if kv_note else "")
            + "The same rotation by each key's position; q . k then depends on their distance only.",
        ),
    ]


def rmsnorm_steps(name: str, x, gain, eps: float, toks) -> list[Step]:
    """RMSNorm's scale: each row's rms = sqrt(mean(x^2) + eps), and x / rms, before the gain
    (computed here in float64 from the norm's input; the output after them is the model's)."""
    x = np.asarray(as_host(x), dtype=np.float64)
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
        Step(name + ".scaled", f"x / rms ({name})", x / rms, toks, _dims(C), "each row scaled to rms 1."),
        Step(
            name + ".gain",
            f"gain ({name}.weight)",
            np.asarray(as_host(gain), dtype=np.float64),
            None,
            _dims(C),
            "no bias.",
        ),
    ]


def swiglu_steps(pre, h: str, row) -> list[Step]:
    """SwiGLU's halves of c_fc: the gate, silu(gate) (the library's op on the model's gate) and up."""
    F = pre.shape[-1] // 2
    gate, up = pre[..., :F], pre[..., F:]
    silu, _ = ops.silu_forward(np.asarray(gate), grad=False)
    return [
        row(f"{h}mlp.gate", "gate (c_fc's first half)", gate, _dims(F), "x W_gate."),
        row(
            f"{h}mlp.silu_gate",
            "silu(gate) = gate * sigmoid(gate)",
            silu,
            _dims(F),
            "the gate's switch, 0 for a very negative gate.",
        ),
        row(
            f"{h}mlp.up", "up (c_fc's second half)", up, _dims(F), "x W_up; multiplied by silu(gate) in the next step."
        ),
    ]


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
    if not 0 <= layer < cfg.n_layers:
        raise ModelError(f"layer {layer} does not exist: the model has {cfg.n_layers} layer(s), 0..{cfg.n_layers - 1}")
    if not 0 <= head < cfg.n_heads:
        raise ModelError(
            f"head {head} does not exist: the model has {cfg.n_heads} head(s) per layer, 0..{cfg.n_heads - 1}"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ModelError(f"top-k must be a positive integer, got {top_k!r}")
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(shown) != ids.size:
        raise ModelError(
            f"explain takes one sequence of ids (T,) and one label per id; got shape {ids.shape}, {len(shown)} labels"
        )

    trace: dict[str, np.ndarray] = {}
    with np.errstate(over="ignore", invalid="ignore"):  # weights too large for float32 show as inf, not as warnings
        logits = as_host(model.forward(ids[None, :], trace=trace)[0])  # (T, V)
    trace = {key: None if value is None else as_host(value) for key, value in trace.items()}  # off a GPU
    C, hd = cfg.d_model, cfg.head_dim
    toks = token_labels(shown)
    h = f"h.{layer}."
    f64 = lambda a: np.asarray(as_host(a), dtype=np.float64)  # noqa: E731 — display in float64, values unchanged
    row = lambda key, title, a, cols, note: Step(key, title, f64(a), toks, cols, note)  # noqa: E731

    norm_name = "RMSNorm" if cfg.norm_type == "rmsnorm" else "LayerNorm"
    steps = [row("tok_emb", "token embeddings (rows of wte)", trace["tok_emb"][0], _dims(C), "wte[id] for each token.")]
    if cfg.positional == "rope":  # nothing is added: q and k are rotated in every layer
        steps.append(
            row(
                "x0",
                "input x0 = token embedding",
                trace["x0"][0],
                _dims(C),
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
                _dims(C),
                "wpe[position]"
                if cfg.positional == "learned"
                else "PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(...)",
            ),
            row("x0", "input x0 = token embedding + positional encoding", trace["x0"][0], _dims(C), ""),
        ]
    if layer > 0:
        prev = f"h.{layer - 1}." + ("resid_2" if cfg.norm == "pre" else "ln_2")
        steps.append(row("layer_input", f"residual stream entering layer {layer}", trace[prev][0], _dims(C), ""))

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
    k_step = lambda key, a, note: row(key, f"K, {kv_name}", a, _dims(hd), note)  # noqa: E731
    if cfg.positional == "rope":
        attention_steps = rope_steps(cfg, trace, h, head, toks, row, q_note, kv_name, kv_note)
    else:
        attention_steps = [
            row(f"{h}attn.q", f"Q, head {head}", trace[h + "attn.q"][0, head], _dims(hd), q_note),
            k_step(f"{h}attn.k", trace[h + "attn.k"][0, head], kv_note),
        ]
    attention_steps += [
        row(f"{h}attn.v", f"V, {kv_name}", trace[h + "attn.v"][0, head], _dims(hd), kv_note),
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
            f"{h}attn.mix", f"weighted sum of V, head {head}", trace[h + "attn.mix"][0, head], _dims(hd), "weights @ V."
        ),
        row(
            f"{h}attn.head_out",
            f"head {head}'s share of the output projection",
            f64(trace[h + "attn.mix"][0, head])
            @ f64(model.params[h + "attn.c_proj.weight"][head * hd : (head + 1) * hd]),
            _dims(C),
            f"weighted sum @ rows {head * hd}..{(head + 1) * hd - 1} of attn.c_proj: what this head writes into the"
            " residual stream (the heads' shares plus the bias make the next step).",
        ),
        row(
            f"{h}attn.out",
            "output projection (all heads concatenated) @ c_proj",
            trace[h + "attn.out"][0],
            _dims(C),
            f"the {cfg.n_heads} heads' weighted sums side by side, times attn.c_proj.",
        ),
    ]
    resid_1 = row(f"{h}resid_1", "residual: input + attention output", trace[h + "resid_1"][0], _dims(C), "")
    pre, act = trace[h + "mlp.pre"][0], trace[h + "mlp.act"][0]
    gated = "columns: gate then up; the next step is silu(gate) * up." if cfg.activation == "swiglu" else ""
    mlp = [row(f"{h}mlp.pre", "MLP hidden pre-activation (c_fc)", pre, _dims(pre.shape[-1]), gated)]
    if cfg.activation == "swiglu":
        mlp += swiglu_steps(pre, h, row)
        mlp.append(row(f"{h}mlp.act", "MLP hidden silu(gate) * up (SwiGLU)", act, _dims(act.shape[-1]), ""))
    else:
        mlp.append(row(f"{h}mlp.act", f"MLP hidden after {cfg.activation.upper()}", act, _dims(act.shape[-1]), ""))
    mlp.append(row(f"{h}mlp.out", "MLP output (c_proj)", trace[h + "mlp.out"][0], _dims(C), ""))
    resid_2 = row(f"{h}resid_2", "residual: + MLP output", trace[h + "resid_2"][0], _dims(C), "")
    rms = cfg.norm_type == "rmsnorm"

    def ln(n, what, x_in):
        name = f"{h}ln_{n}"
        out = row(name, f"{norm_name} ln_{n} {what}", trace[name][0], _dims(C), "x / rms * gain." if rms else "")
        if not rms:
            return [out]
        return [*rmsnorm_steps(name, x_in, model.params[name + ".weight"], cfg.norm_eps, toks), out]

    layer_in = trace["x0"][0] if layer == 0 else steps[-1].value
    if cfg.norm == "pre":  # GPT-2: x + attn(ln_1(x)), then x + mlp(ln_2(x))
        steps += [
            *ln(1, "(the attention's input)", layer_in),
            *attention_steps,
            resid_1,
            *ln(2, "(the MLP's input)", resid_1.value),
            *mlp,
            resid_2,
        ]
    else:  # the original encoder: ln_1(x + attn(x)), then ln_2(x + mlp(x))
        steps += [
            *attention_steps,
            resid_1,
            *ln(1, "of the residual", resid_1.value),
            *mlp,
            resid_2,
            *ln(2, "of the residual", resid_2.value),
        ]

    last = f64(logits[-1])
    steps.append(
        row(
            "ln_f",
            f"final {norm_name} ln_f (all layers done)",
            trace["ln_f"][0],
            _dims(C),
            "x / rms * gain." if rms else "",
        )
    )
    vocab = [label(i) for i in range(last.size)]
    unembed = "ln_f(x) @ wte^T (tied embedding)." if cfg.tie_embeddings else "ln_f(x) @ lm_head^T (untied)."
    steps.append(Step("logits", f"logits of the last position {toks[-1]}", last, None, vocab, unembed))
    probs = np.exp(last - last.max())
    probs /= probs.sum()
    best = np.argsort(-probs, kind="stable")[:top_k]
    return Explanation(
        title=f"layer {layer}, head {head} of a {cfg.n_layers}-layer, {cfg.n_heads}-head model (d_model {C})",
        steps=steps,
        tokens=list(shown),
        layer=layer,
        head=head,
        attention=f64(trace[h + "attn.weights"][0]),
        top=[(int(i), vocab[i], float(probs[i]), float(last[i])) for i in best],
    )


# ----------------------------------------------------------------------------- seed examples


def _seeded(step: Step, texts: dict[int | None, str]) -> Step:
    """Attach what the worked example printed ({row: text}, or {None: text} for a vector) to a step."""
    for r, text in texts.items():
        step.seed[r] = printed(text, step.value if r is None else step.value[r])
    return step


def _attention(qkv: np.ndarray, causal: bool):
    """qkv (T, 3d) one head -> (out (T, d), trace of the library's attention op)."""
    trace: dict[str, np.ndarray] = {}
    out, _ = ops.attention_forward(qkv[None], n_heads=1, causal=causal, trace=trace)
    return out[0], {k: v[0, 0] for k, v in trace.items()}


def example_attention_lookup() -> Explanation:
    """Seed 004: attention as a fuzzy key/value lookup."""
    keys = np.array([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]], dtype=np.float64)
    values = np.array([[1, 0, 1], [10, 0, 2], [100, 5, 0], [1000, 6, 0]], dtype=np.float64)
    queries = np.array([[0, 10, 0], [0, 0, 10], [10, 10, 0]], dtype=np.float64)
    # the library's op is self-attention (as many queries as keys): a zero 4th query fills the
    # slot and is dropped below; it changes nothing for the other rows.
    qkv = np.concatenate([np.vstack([queries, np.zeros(3)]), keys, values], axis=1)
    out, t = _attention(qkv, causal=False)
    kl = [f"k{j + 1} {keys[j].astype(int).tolist()}" for j in range(4)]
    ql = [f"q{j + 1} {queries[j].astype(int).tolist()}" for j in range(3)]
    dims = _dims(3)
    steps = [
        Step("keys", "keys", keys, kl, dims, "the table's keys (one per row)"),
        Step("values", "values", values, kl, dims, "the value stored under each key"),
        Step("queries", "queries", queries, ql, dims, "the three queries of the worked example"),
        Step(
            "scores_raw",
            "raw scores q . k",
            t["scores_raw"][:3],
            ql,
            kl,
            "a query 'matches' a key when their dot product is large.",
        ),
        Step(
            "scores",
            "scaled scores q . k / sqrt(3)",
            t["scores"][:3],
            ql,
            kl,
            "the 1/sqrt(d_k) scale; the worked example's answers hold with or without it.",
        ),
        Step(
            "weights",
            "attention weights softmax(scores)",
            t["weights"][:3],
            ql,
            kl,
            "near one-hot: each query picks the key(s) it matches, equally.",
        ),
        _seeded(
            Step(
                "output",
                "output = weights @ values",
                out[:3],
                ql,
                dims,
                "the looked-up value; a blend where two keys match.",
            ),
            {0: "[10, 0, 2]", 1: "[550, 5.5, 0]", 2: "[5.5, 0, 1.5]"},
        ),
    ]
    return Explanation(
        "attention as a fuzzy key/value lookup",
        steps,
        ["'q1'", "'q2'", "'q3'"],
        attention=t["weights"][None, :3],
        notes=[
            "Q, K and V are given directly (no projections); one head, d_k = 3, no mask.",
            "The library's op attends a sequence to itself, so a 4th zero query pads the queries to the 4 keys; "
            "it is not shown.",
        ],
    )


def example_sitting() -> Explanation:
    """Seed 003: self-attention with Q = K = V = X, scaled by sqrt(4) = 2."""
    words = ["The", "cat", "sat", "<end>"]
    X = np.array([[1.0, 0.5, 0.2, 0.1], [0.5, 1.0, 0.3, 0.2], [0.3, 0.2, 1.0, 0.5], [0.1, 0.1, 0.1, 1.0]])
    out, t = _attention(np.concatenate([X, X, X], axis=1), causal=False)
    toks, dims = token_labels([repr(w) for w in words]), _dims(4)
    steps = [
        Step(
            "x",
            "input embeddings X (= Q = K = V)",
            X,
            toks,
            dims,
            "no projections: every token is its own query, key and value.",
        ),
        _seeded(
            Step("scores_raw", "raw scores X X^T", t["scores_raw"], toks, toks, "dot products."),
            {0: "[1.30, 1.08, 0.65, 0.27]"},
        ),
        _seeded(
            Step("scores", "scaled scores / sqrt(4)", t["scores"], toks, toks, "divided by sqrt(d_k) = 2."),
            {0: "[0.65, 0.54, 0.325, 0.135]"},
        ),
        _seeded(
            Step("weights", "attention weights softmax(scores)", t["weights"], toks, toks, "each row sums to 1."),
            {0: "[0.311, 0.278, 0.225, 0.186]"},
        ),
        _seeded(
            Step("output", "output = weights @ V", out, toks, dims, "each token's context-aware vector."),
            {0: "[0.537, 0.498, 0.389, 0.386]"},
        ),
    ]
    return Explanation(
        '"The cat sat": self-attention with Q = K = V = X',
        steps,
        [repr(w) for w in words],
        attention=t["weights"][None],
        notes=['One head, d_k = 4, bidirectional (no mask). The example works only row 1 ("The"); all rows are shown.'],
    )


def example_chai() -> Explanation:
    """Seed 001: one post-norm encoder layer on "The chai is hot" (row convention Q = X W^Q)."""
    words = ["The", "chai", "is", "hot"]
    toks = token_labels([repr(w) for w in words])
    E = np.array([[1.0, 0.0, 0.5, 0.2], [0.2, 1.0, 0.8, 0.1], [0.5, 0.3, 1.0, 0.0], [0.1, 0.5, 0.3, 1.0]])
    W_Q = np.array([[1, 0], [0, 1], [0, 0], [0, 0]], dtype=np.float64)
    W_K = np.array([[0, 1], [1, 0], [0, 0], [0, 0]], dtype=np.float64)
    W_V = np.array([[1, 1], [0, 0], [1, 0], [0, 1]], dtype=np.float64)
    pe = ops.sinusoidal_table(4, 4, np.float64)
    x_exact = E + pe
    X = np.round(x_exact, 3)  # the worked example carries on from X rounded to 3 decimals; so do we, to stay comparable
    qkv, _ = ops.linear_forward(X, np.concatenate([W_Q, W_K, W_V], axis=1), None)
    z, t = _attention(qkv, causal=False)
    d4, d2 = _dims(4), _dims(2)

    # Step 5 needs W_O (d_v = 2 -> d_model = 4), which the worked example leaves as "?": we put Z into the
    # first two dimensions, as its "[1.792, 2.216, ?, ?]" suggests, and LayerNorm with gain 1, bias 0.
    W_O = np.eye(2, 4)
    zo, _ = ops.linear_forward(z, W_O, None)
    r1 = X + zo
    x1, _ = ops.layernorm_forward(r1, np.ones(4), np.zeros(4))
    # Step 6 gives only FFN(x) = max(0, x W1 + b1) W2 + b2: illustrative W1 = [I | -I] (d_ff = 8)
    # splits x into its positive and negative parts, and W2 = [I; 0] keeps the positive part.
    W1, b1 = np.hstack([np.eye(4), -np.eye(4)]), np.zeros(8)
    W2, b2 = np.vstack([np.eye(4), np.zeros((4, 4))]), np.zeros(4)
    pre, _ = ops.linear_forward(x1, W1, b1)
    act, _ = ops.relu_forward(pre)
    ffn, _ = ops.linear_forward(act, W2, b2)
    r2 = x1 + ffn
    x2, _ = ops.layernorm_forward(r2, np.ones(4), np.zeros(4))

    PE_PRINTED = [
        "[0.000, 1.000, 0.000, 1.000]",
        "[0.841, 0.540, 0.010, 1.000]",
        "[0.909, −0.416, 0.020, 1.000]",
        "[0.141, −0.990, 0.030, 1.000]",
    ]
    X_PRINTED = [
        "[1.000, 1.000, 0.500, 1.200]",
        "[1.041, 1.540, 0.810, 1.100]",
        "[1.409, −0.116, 1.020, 1.000]",
        "[0.241, −0.490, 0.330, 2.000]",
    ]
    h8 = _dims(8, "h")
    steps = [
        Step("tok_emb", "word embeddings e", E, toks, d4, "given by the worked example."),
        _seeded(
            Step(
                "pos_emb",
                "sinusoidal positional encodings PE (d_model = 4)",
                pe,
                toks,
                d4,
                "PE[p, 2i] = sin(p / 10000^(2i/4)), PE[p, 2i+1] = cos(p / 10000^(2i/4)).",
            ),
            dict(enumerate(PE_PRINTED)),
        ),  # fmt: skip
        Step("x_exact", "X = e + PE (exact)", x_exact, toks, d4, ""),
        _seeded(
            Step(
                "x",
                "X rounded to 3 decimals, as the worked example carries it on",
                X,
                toks,
                d4,
                "the worked example's later numbers (and ERRATA's) are computed from this rounded X.",
            ),
            dict(enumerate(X_PRINTED)),
        ),  # fmt: skip
        Step("W_Q", "W^Q", W_Q, d4, d2, "given by the worked example"),
        Step("W_K", "W^K", W_K, d4, d2, ""),
        Step("W_V", "W^V", W_V, d4, d2, ""),
        _seeded(
            Step("q", "Q = X W^Q", t["q"], toks, d2, ""),
            {0: "[1.000, 1.000]", 1: "[1.041, 1.540]", 2: "[1.409, −0.116]", 3: "[0.241, −0.490]"},
        ),  # fmt: skip
        _seeded(
            Step("k", "K = X W^K", t["k"], toks, d2, ""),
            {0: "[1.000, 1.000]", 1: "[1.540, 1.041]", 2: "[−0.116, 1.409]", 3: "[−0.490, 0.241]"},
        ),  # fmt: skip
        _seeded(
            Step("v", "V = X W^V", t["v"], toks, d2, ""),
            {0: "[1.500, 2.200]", 1: "[1.851, 2.141]", 2: "[2.429, 2.409]", 3: "[0.571, 2.241]"},
        ),  # fmt: skip
        _seeded(
            Step("scores_raw", "raw scores Q K^T", t["scores_raw"], toks, toks, "row = query, column = key."),
            {
                0: "[2.000, 2.581, 1.293, −0.249]",
                1: "[2.581, 3.210, 2.046, 0.258]",
                2: "[1.293, 2.049, −0.332, −0.717]",
                3: "[−0.249, 0.260, −0.719, −0.236]",
            },
        ),  # fmt: skip
        _seeded(
            Step(
                "scores",
                "scaled scores Q K^T / sqrt(2)",
                t["scores"],
                toks,
                toks,
                "d_k = 2; no mask (an encoder sees both directions).",
            ),
            {
                0: "[1.414, 1.826, 0.914, −0.176]",
                1: "[1.826, 2.270, 1.447, 0.182]",
                2: "[0.914, 1.449, −0.235, −0.507]",
                3: "[−0.176, 0.184, −0.509, −0.167]",
            },
        ),  # fmt: skip
        _seeded(
            Step(
                "weights",
                "attention weights A = softmax(scaled scores)",
                t["weights"],
                toks,
                toks,
                "each row sums to 1.",
            ),
            {
                0: "[0.330, 0.506, 0.199, 0.065]",
                1: "[0.291, 0.454, 0.199, 0.056]",
                2: "[0.296, 0.503, 0.095, 0.106]",
                3: "[0.218, 0.314, 0.153, 0.215]",
            },
        ),  # fmt: skip
        _seeded(
            Step("z", "Z = A V", z, toks, d2, 'the worked example works out row "chai" only.'), {1: "[1.792, 2.216]"}
        ),
        Step(
            "W_O",
            "W_O (assumed: the worked example leaves it undefined)",
            W_O,
            d2,
            d4,
            'puts Z into dimensions 0-1 of the residual stream (the worked example\'s "[1.792, 2.216, ?, ?]").',
        ),  # fmt: skip
        Step("resid_1", "residual X + Z W_O", r1, toks, d4, ""),
        Step(
            "ln_1",
            "X' = LayerNorm(X + Z W_O)",
            x1,
            toks,
            d4,
            "mean 0, variance 1 per row (eps 1e-5); "
            "gain 1 and bias 0 assumed (the worked example names learned gamma, beta without values).",
        ),  # fmt: skip
        Step(
            "W_1",
            "W_1 (illustrative: the worked example gives no FFN weights)",
            W1,
            d4,
            h8,
            "[I | -I], d_ff = 8, b_1 = 0.",
        ),
        Step("mlp.pre", "x' W_1 + b_1", pre, toks, h8, ""),
        Step("mlp.act", "max(0, x' W_1 + b_1)  (ReLU)", act, toks, h8, "ReLU zeroes the negative entries."),
        Step("W_2", "W_2 (illustrative)", W2, h8, d4, "[I; 0], b_2 = 0: keeps the positive part of x'."),
        Step("mlp.out", "FFN(x') = max(0, x' W_1 + b_1) W_2 + b_2", ffn, toks, d4, ""),
        Step("resid_2", "residual X' + FFN(X')", r2, toks, d4, ""),
        Step("ln_2", "layer output LayerNorm(X' + FFN(X'))", x2, toks, d4, "gain 1, bias 0 assumed."),
    ]
    return Explanation(
        'one encoder layer on "The chai is hot"',
        steps,
        [repr(w) for w in words],
        attention=t["weights"][None],
        notes=[
            "d_model = 4, one head with d_k = d_v = 2, bidirectional, post-norm, ReLU feed-forward; "
            "row convention Q = X W^Q.",
            "Given by the example: e, PE's formula, W^Q, W^K, W^V. It leaves W_O (\"?\"), LayerNorm's gamma and beta, "
            "and the FFN's W_1, b_1, W_2, b_2 undefined.",
            "From W_O on, the weights are our stated assumptions (W_O, gamma = 1, beta = 0) "
            "or illustrative (W_1, W_2), marked in each step's title.",
        ],
    )


def example_one_layer() -> Explanation:
    """Seed 000: one attention layer, column convention (x is a column, v = W_V x), d_head = 2."""
    W_E = np.array([
        [1, -1, 0, 1, -1, 0, 1, -1, 0, 1],
        [-1, 0, 1, -1, 0, 1, -1, 0, 1, -1],
        [0, 1, -1, 0, 1, -1, 0, 1, -1, 0],
        [1, 0, -1, 1, 0, -1, 1, 0, -1, 1],
        [-1, 1, 0, -1, 1, 0, -1, 1, 0, -1],
    ], dtype=np.float64)  # fmt: skip
    W = np.array([[0.1, 0.2, 0.3, 0.4, 0.5], [0.2, 0.3, 0.4, 0.5, 0.6]])  # W_Q = W_K = W_V (d_head, d_model)
    W_O = np.array([[0.1, 0.2], [0.2, 0.3], [0.3, 0.4], [0.4, 0.5], [0.5, 0.6]])  # (d_model, d_head)
    words = ["t1", "t2", "t3"]
    toks = token_labels([repr(w) for w in words])
    # column convention x = W_E t is row convention x = t W_E^T: the library's (V, C) table is W_E^T
    x, _ = ops.embedding_forward(np.arange(3), W_E.T)  # (3, 5)
    qkv, _ = ops.linear_forward(x, np.concatenate([W.T, W.T, W.T], axis=1), None)
    r, t = _attention(qkv, causal=True)
    o, _ = ops.linear_forward(r, W_O.T, None)
    x1 = x + o
    d5, d2 = _dims(5), _dims(2)
    steps = [
        Step(
            "W_E",
            "embedding matrix W_E (d_model x d_vocab)",
            W_E,
            d5,
            _dims(10, "v"),
            "column convention: x_i = W_E t_i.",
        ),
        _seeded(
            Step("x", "x(0) = W_E t (tokens 0, 1, 2 one-hot)", x, toks, d5, ""),
            {0: "[1, -1, 0, 1, -1]", 1: "[-1, 0, 1, 0, 1]", 2: "[0, 1, -1, -1, 0]"},
        ),  # fmt: skip
        Step("W_V", "W_V = W_K = W_Q (d_head x d_model)", W, d2, d5, ""),
        _seeded(
            Step(
                "v",
                "v_i = W_V x_i",
                t["v"],
                toks,
                d2,
                "the worked example writes v as [0.1, 0.2] . x (W_V's first column) and its results are not W_V x; "
                "the exact products are these.",
            ),
            {0: "[-0.1, -0.1]", 1: "[0.1, 0.4]", 2: "[-0.1, -0.2]"},
        ),  # fmt: skip
        _seeded(
            Step("k", "k_i = W_K x_i", t["k"], toks, d2, "equal to v (same matrix)."),
            {0: "[-0.1, -0.1]", 1: "[0.1, 0.4]", 2: "[-0.1, -0.2]"},
        ),  # fmt: skip
        _seeded(Step("q", "q_i = W_Q x_i", t["q"], toks, d2, "the worked example uses q_3 only."), {2: "[-0.1, -0.2]"}),
        Step("scores_raw", "raw scores q_i . k_j", t["scores_raw"], toks, toks, ""),
        _seeded(
            Step(
                "scores",
                "scaled scores a = q . k / sqrt(2), causal",
                t["scores"],
                toks,
                toks,
                "causal: -inf where the key comes after the query. Row t3 is the worked example's a_1..a_3.",
            ),
            {2: "[0.021, -0.064, 0.035]"},
        ),  # fmt: skip
        _seeded(
            Step("weights", "attention weights w = softmax(a)", t["weights"], toks, toks, "each row sums to 1."),
            {2: "[0.34, 0.31, 0.35]"},
        ),  # fmt: skip
        _seeded(Step("r", "r = sum_j w_j v_j", r, toks, d2, ""), {2: "[-0.038, 0.02]"}),
        Step("W_O", "W_O (d_model x d_head)", W_O, d5, d2, ""),
        _seeded(Step("o", "o = W_O r", o, toks, d5, ""), {2: "[-0.0038, -0.0056, -0.0074, -0.0092, -0.011]"}),
        _seeded(
            Step("x1", "x(1) = x(0) + o  (residual)", x1, toks, d5, ""),
            {2: "[-0.0038, 0.9944, -1.0074, -1.0092, -0.011]"},
        ),  # fmt: skip
    ]
    return Explanation(
        "a one-layer toy (column convention, d_head = 2)",
        steps,
        [repr(w) for w in words],
        attention=t["weights"][None],
        notes=[
            "n = 3, d_vocab = 10, d_model = 5, d_head = 2; causal; the worked example follows token 3 (row t3).",
            "Column convention v = W_V x is computed as the library's row convention x W_V^T: same numbers.",
            "The example's arithmetic goes wrong from v on (its v = [0.1, 0.2] . x is not W_V x) and carries through; "
            "ERRATA.md has the exact values.",
        ],
    )


EXAMPLES: dict[str, tuple[str, Callable[[], Explanation]]] = {
    "attention-lookup": ("attention as a fuzzy key/value lookup", example_attention_lookup),
    "sitting": ('"The cat sat": Q = K = V = X, scaled by sqrt(4)', example_sitting),
    "chai": ('one encoder layer on "The chai is hot"', example_chai),
    "one-layer": ("a one-layer toy with d_head = 2 and W_O", example_one_layer),
}


def explain_example(name: str) -> Explanation:
    """A worked example by name (see EXAMPLES)."""
    if name not in EXAMPLES:
        raise ModelError(f"unknown example {name!r}; choose one of: {', '.join(EXAMPLES)}")
    return EXAMPLES[name][1]()
