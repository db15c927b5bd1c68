"""The forward trace: what `GPT.forward(ids, trace=...)` records, named and shaped in one place.

A trace is a dict from names to arrays. The model-wide entries have plain names (`tok_emb`, `x0`,
`ln_f`, `logits`); each block's are named `h.{layer}.{entry}` (`h.0.attn.weights`), as its
parameters are (`h.0.attn.c_attn.weight`). `MODEL` and `BLOCK` list them with their shapes in the
config's letters:

    B batch rows, T positions, C d_model, H n_heads, hd head_dim, F the MLP's width (`hidden`),
    V vocab_size

and `shapes(config, B, T)` gives a config's entries as numbers (a model with rotary positions
adds nothing to the embeddings and records q and k before their rotation too). A block's
attention entries are what `ops.attention_forward(..., trace=)` records (`ATTENTION_OP`), under
`attn.`. `tk explain`'s steps add names computed from these (`DERIVED`), and the page finds each
number by these names in the steps' keys, its sizes in the steps' shapes.

>>> layer_key(3, "attn.weights"), split_key("h.3.attn.weights"), split_key("x0")
('h.3.attn.weights', (3, 'attn.weights'), (None, 'x0'))

`stream_keys(config)` names the residual stream at each layer boundary (x0, then each block's
output: `resid_2` pre-norm, `ln_2` post-norm), what the logit lens reads (transformer/lens.py).

`Recorder` is a trace that keeps only the names its filter accepts, each made smaller as it
arrives if asked: a reader that needs one entry of a long text (the page's thumbnails) passes
one, so that the pass does not hold every layer's T x T maps.

What it deliberately does not do: compute anything (model.py fills the trace; explain.py and
pipeline/views.py read it), or say how an entry is shown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# name -> (shape, what it holds), in the order the forward pass records them
MODEL: dict[str, tuple[str, str]] = {
    "tok_emb": ("B, T, C", "the token embeddings, wte[ids]"),
    "pos_emb": ("T, C", "the positional encodings added to them (none with rotary positions)"),
    "x0": ("B, T, C", "the first block's input: tok_emb + pos_emb, or tok_emb with rotary positions"),
    "ln_f": ("B, T, C", "the final norm's output"),
    "logits": ("B, T, V", "ln_f @ wte^T (or lm_head^T when untied)"),
}

# What `ops.attention_forward` records into a `trace` dict, each per query head (k and v as each
# query head sees them: its group's K/V head).
ATTENTION_OP: dict[str, tuple[str, str]] = {
    "scores": ("B, H, T, T", "q k^T / sqrt(hd), masked scores -inf"),
    "weights": ("B, H, T, T", "softmax(scores): each row sums to 1, masked cells 0"),
    "q": ("B, H, T, hd", "the queries (after the rotation with rotary positions)"),
    "k": ("B, H, T, hd", "the keys (after the rotation with rotary positions)"),
    "v": ("B, H, T, hd", "the values"),
    "scores_raw": ("B, H, T, T", "q k^T, unscaled and unmasked"),
    "mix": ("B, H, T, hd", "weights @ v: each head's weighted sum"),
}

# Each block's entries, under h.{layer}.; `ln_1` and `ln_2` are the norms' outputs wherever they
# sit (before each half in a pre-norm block, after each residual in a post-norm one).
BLOCK: dict[str, tuple[str, str]] = {
    "attn.q_pre": ("B, H, T, hd", "q before the rotation (rotary positions only)"),
    "attn.k_pre": ("B, H, T, hd", "k before the rotation, as each query head sees it (rotary positions only)"),
    **{"attn." + name: entry for name, entry in ATTENTION_OP.items()},
    "ln_1": ("B, T, C", "the attention's norm"),
    "attn.out": ("B, T, C", "the heads' weighted sums side by side @ attn.c_proj (+ its bias)"),
    "resid_1": ("B, T, C", "the block's input + attn.out"),
    "ln_2": ("B, T, C", "the MLP's norm"),
    "mlp.pre": ("B, T, F", "c_fc's output; with SwiGLU (B, T, 2F): [gate | up]"),
    "mlp.act": ("B, T, F", "the activation of mlp.pre (SwiGLU: silu(gate) * up)"),
    "mlp.out": ("B, T, C", "mlp.act @ mlp.c_proj (+ its bias)"),
    "resid_2": ("B, T, C", "resid_1 (or ln_1, post-norm) + mlp.out: the block's output before a post-norm ln_2"),
}
ROPE_ONLY = ("attn.q_pre", "attn.k_pre")

# Names of `tk explain`'s steps computed from the trace, not recorded by the forward pass.
DERIVED: dict[str, str] = {
    "layer_input": "the residual stream entering the explained layer (the previous block's output)",
    "rope_angle": "(T, hd / 2) position * inv_freq, the rotation's angles",
    "attn.head_out": "one head's mix @ its rows of attn.c_proj, under h.{layer}.",
    "mlp.gate": "SwiGLU: mlp.pre's first half, under h.{layer}.",
    "mlp.silu_gate": "SwiGLU: silu(gate), under h.{layer}.",
    "mlp.up": "SwiGLU: mlp.pre's second half, under h.{layer}.",
    "rms": "RMSNorm: each row's sqrt(mean(x^2) + eps), as h.{layer}.ln_N.rms",
    "scaled": "RMSNorm: x / rms, as h.{layer}.ln_N.scaled",
    "gain": "RMSNorm: the norm's weight, as h.{layer}.ln_N.gain",
}


def layer_key(layer: int, name: str) -> str:
    """Block `layer`'s entry `name` as the trace names it."""
    return f"h.{layer}.{name}"


def split_key(key: str) -> tuple[int | None, str]:
    """A trace name -> (its layer, or None for a model-wide entry; the entry's name)."""
    if key.startswith("h."):
        layer, _, name = key[2:].partition(".")
        return int(layer), name
    return None, key


def stream_keys(config) -> list[str]:
    """The residual stream at each of the n_layers + 1 layer boundaries, as trace names: boundary 0
    is the embeddings (x0), boundary l >= 1 block l-1's output, each (B, T, C). A pre-norm block's
    output is its resid_2; a post-norm block's is its ln_2, the norm that ends it.

    >>> from tokenkit.transformer.config import GPTConfig
    >>> stream_keys(GPTConfig(vocab_size=10, context_length=8, d_model=8, n_layers=2, n_heads=2, norm="post"))
    ['x0', 'h.0.ln_2', 'h.1.ln_2']
    """
    out = "resid_2" if config.norm == "pre" else "ln_2"
    return ["x0"] + [layer_key(layer, out) for layer in range(config.n_layers)]


def unrotated(config, qkv) -> dict[str, Any]:
    """q and k before the rotary rotation, from the packed qkv (B, T, (H + 2 Hkv) hd): attn.q_pre
    (B, H, T, hd) per query head and attn.k_pre (B, H, T, hd) as each query head sees it (its
    group's K/V head), like attn.k. Recorded where positions are rotary."""
    H, Hkv = config.n_heads, config.kv_heads
    B, T, W = qkv.shape
    x = qkv.reshape(B, T, H + 2 * Hkv, W // (H + 2 * Hkv))
    q = x[:, :, :H].transpose(0, 2, 1, 3).copy()
    k = x[:, :, H : H + Hkv].transpose(0, 2, 1, 3).repeat(H // Hkv, axis=1)
    return {"attn.q_pre": q, "attn.k_pre": k}


def shapes(config, B: int, T: int) -> dict[str, tuple[int, ...]]:
    """Every entry `GPT.forward` records for `config` on ids (B, T), with its shape.

    >>> from tokenkit.transformer.config import GPTConfig
    >>> s = shapes(GPTConfig(vocab_size=10, context_length=8, d_model=8, n_layers=1, n_heads=2), 1, 3)
    >>> s["h.0.attn.q"], s["h.0.mlp.pre"], len(s)
    ((1, 2, 3, 4), (1, 3, 32), 20)
    """
    rope, swiglu = config.positional == "rope", config.activation == "swiglu"
    sizes = {"B": B, "T": T, "C": config.d_model, "H": config.n_heads, "hd": config.head_dim}
    sizes.update(F=config.hidden, V=config.vocab_size)

    def shape(text: str) -> tuple[int, ...]:
        return tuple(sizes[letter] for letter in text.split(", "))

    out = {name: shape(s) for name, (s, _) in MODEL.items() if not (rope and name == "pos_emb")}
    logits, ln_f = out.pop("logits"), out.pop("ln_f")
    for layer in range(config.n_layers):
        for name, (s, _) in BLOCK.items():
            if name in ROPE_ONLY and not rope:
                continue
            out[layer_key(layer, name)] = shape(s)
        if swiglu:
            out[layer_key(layer, "mlp.pre")] = (B, T, 2 * config.hidden)
    return {**out, "ln_f": ln_f, "logits": logits}


class Recorder(dict):
    """A trace that records only the names `keep(name)` accepts, each as `take(name, value)` makes
    it (the value itself by default): what `GPT.forward` fills for a reader that needs a few entries.

    >>> r = Recorder(lambda name: name.endswith(".attn.weights"), lambda name, w: w * 2)
    >>> r.update({"h.0.ln_1": 1, "h.0.attn.weights": 3}); r["x0"] = 4; dict(r)
    {'h.0.attn.weights': 6}
    """

    def __init__(self, keep: Callable[[str], bool], take: Callable[[str, Any], Any] | None = None) -> None:
        super().__init__()
        self.keep, self.take = keep, take

    def __setitem__(self, name: str, value: Any) -> None:
        if self.keep(name):
            super().__setitem__(name, value if self.take is None else self.take(name, value))

    def update(self, other=(), **more: Any) -> None:
        for name, value in dict(other, **more).items():
            self[name] = value
