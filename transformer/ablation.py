"""Ablation: a model run with some of its heads and MLPs knocked out, and what that does to its
next-token distribution.

A SPEC names the parts, comma-separated, counted from 0 as the trace names them
(transformer/trace.py): `L.H` is head H of block L, `L.mlp` block L's MLP. `parse(spec)` reads
it, `check(parts, config)` holds it against a model; each says what is wrong in one line.

>>> [str(part) for part in parse("1.3, 0.mlp")]
['1.3', '0.mlp']

What a knocked-out part gives, in its block's forward (transformer/block.py):
- a head: its slice of the attention's output (B, T, H hd), the weighted sum of its values
  before the output projection c_proj, is replaced; c_proj's bias belongs to no head and stays.
  With grouped K/V heads (GQA) it is the query head named: the K/V head its group shares is
  untouched, so the group's other heads are too.
- an MLP: its output (B, T, C), c_proj's bias included, is replaced: the block adds that instead.

`zero_ablation` replaces each with zeros. `mean_ablation` replaces each with its mean over every
position of a reference text, as the model computes it unablated (the text in windows of
context_length): the part then carries what it carries on average, not what this input makes it
carry. Either is constant over positions, so a KV-cached decode (generation) gives what a whole
forward does.

How a model runs ablated: `GPT.ablation` holds an `Ablation` (None, the default: the plain
forward, untouched). `ablated(model, ablation)` sets it for a `with` block. `GPT._block_forward`,
the one place every forward passes through (whole, KV-cached, traced), hands each block its
layer's `Knockout`, which the block applies after its attention and after its MLP; a traced
forward's `attn.mix` and `mlp.out` show the replaced values, so the lens and the attribution of
an ablated pass read what it computed. An ablated model runs forward only (no gradients).

`shift(model, ids, ablation)` compares the next-token distribution after ids with and without the
ablation: both distributions, the KL divergence of the ablated one from the unablated one, and
the tokens whose probability moved most.

Shapes: L n_layers, H n_heads, hd head_dim, C d_model, V vocab_size.

What it deliberately does not do: read texts or tokenize (the caller gives ids), patch
activations from another input (path patching), or ablate anything but whole heads and MLPs.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tokenkit.transformer.backends import as_host
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.trace import Recorder, layer_key, split_key

MODES = ("zero", "mean")
EXAMPLE = "e.g. 1.3 (block 1's head 3) or 0.mlp (block 0's MLP), comma-separated"
_PART = re.compile(r"([0-9]+)\.([0-9]+|mlp)")  # ASCII digits only: str.isdigit takes '²'


@dataclass(frozen=True, order=True)
class Part:
    """One knocked-out part: head `head` of block `layer`, or its MLP when `head` is None."""

    layer: int
    head: int | None

    def __str__(self) -> str:
        return f"{self.layer}.{'mlp' if self.head is None else self.head}"


def parse(spec: str) -> tuple[Part, ...]:
    """SPEC -> its parts in the order given; ModelError (one line) for an empty SPEC, a part that
    is not `L.H` or `L.mlp`, or a part named twice. Spaces around a part are ignored."""
    if not spec.strip(" ,"):
        raise ModelError(f"the ablation SPEC is empty: name the parts to knock out, {EXAMPLE}")
    parts: list[Part] = []
    for text in spec.split(","):
        if not text.strip(" "):
            raise ModelError(f"the ablation SPEC {spec!r} has an empty part (a comma too many); name parts {EXAMPLE}")
        match = _PART.fullmatch(text.strip(" "))
        if match is None:
            raise ModelError(f"ablation part {text.strip(' ')!r} is not L.H (a head) or L.mlp (an MLP), {EXAMPLE}")
        layer, head = match.groups()
        part = Part(int(layer), None if head == "mlp" else int(head))
        if part in parts:
            raise ModelError(f"ablation part {part} is named twice in {spec!r}; name each part once")
        parts.append(part)
    return tuple(parts)


def check(parts: Sequence[Part], config) -> None:
    """ModelError (one line) for a part `config`'s model does not have."""
    L, H = config.n_layers, config.n_heads
    for part in parts:
        if not 0 <= part.layer < L:
            raise ModelError(f"ablation part {part}: layer {part.layer} does not exist; the model has {L}, 0..{L - 1}")
        if part.head is not None and not 0 <= part.head < H:
            raise ModelError(
                f"ablation part {part}: head {part.head} does not exist; each layer has {H} heads, 0..{H - 1}"
            )


class Knockout:
    """One block's knocked-out parts, applied by the block's forward (transformer/block.py).

    heads: {head: its replacement (hd,), or None for zeros}; mlp: the MLP's replacement (C,) (zeros
    when zero-ablated), or None when the MLP is kept. Arrays on the model's device, in its dtype.
    """

    __slots__ = ("head_dim", "heads", "mlp")

    def __init__(self, head_dim: int, heads: dict, mlp) -> None:
        self.head_dim, self.heads, self.mlp = head_dim, heads, mlp

    def replace_heads(self, y) -> None:
        """y (B, T, H hd), the attention's output before c_proj: each knocked-out head's slice
        replaced, in place."""
        hd = self.head_dim
        for head, value in self.heads.items():
            y[..., head * hd : (head + 1) * hd] = 0 if value is None else value

    def replace_mix(self, mix) -> None:
        """mix (B, H, T, hd), the trace's per-head weighted sums: the same replacement, in place."""
        for head, value in self.heads.items():
            mix[:, head] = 0 if value is None else value

    def replace_mlp(self, out) -> bool:
        """out (B, T, C), the MLP's output: replaced in place when the MLP is knocked out (then
        True: the replacement holds c_proj's bias too, which must not be added again)."""
        if self.mlp is None:
            return False
        out[...] = self.mlp
        return True


@dataclass
class Ablation:
    """Parts knocked out the same way (`mode`, one of MODES), for one model's device and dtype.

    parts: as `parse` gives them. values: each part's replacement on the host (float64; (hd,) a
    head's, (C,) an MLP's): zeros for "zero", the reference text's means for "mean".
    reference_tokens: how many positions the means are over (0 for "zero").
    layers: each block's `Knockout`, by layer (only the blocks with a part knocked out)."""

    parts: tuple[Part, ...]
    mode: str
    values: dict[Part, np.ndarray]
    reference_tokens: int
    layers: dict[int, Knockout]

    @property
    def spec(self) -> str:
        """The parts as a SPEC: `parse(ablation.spec)` gives them back."""
        return ",".join(map(str, self.parts))

    def replacement(self, part: Part) -> np.ndarray | None:
        """A knocked-out part's replacement (float64, on the host), or None when `part` is kept."""
        return self.values.get(part)

    def __str__(self) -> str:
        """The parts and what replaced them, as the commands say it: "1.1, 0.mlp zeroed"."""
        parts = ", ".join(map(str, self.parts))
        if self.mode == "zero":
            return f"{parts} zeroed"
        means = "its mean" if len(self.parts) == 1 else "their means"
        return f"{parts} replaced by {means} over {self.reference_tokens:,} reference tokens"

    def to_json(self) -> dict:
        """{"spec", "parts" (as strings), "mode", "reference_tokens"}."""
        parts = [str(part) for part in self.parts]
        return {"spec": self.spec, "parts": parts, "mode": self.mode, "reference_tokens": self.reference_tokens}


def _build(model, parts: Sequence[Part], mode: str, values: dict[Part, np.ndarray], n: int) -> Ablation:
    """The Ablation of `parts` replaced by `values`, each block's Knockout on the model's device."""
    dtype = model.params["wte.weight"].dtype
    layers = {}
    for layer in sorted({part.layer for part in parts}):
        here = [part for part in parts if part.layer == layer]

        def on_device(part: Part):
            return model.backend.to_device(np.ascontiguousarray(values[part], dtype=dtype))

        heads = {part.head: None if mode == "zero" else on_device(part) for part in here if part.head is not None}
        mlp = next((on_device(part) for part in here if part.head is None), None)
        layers[layer] = Knockout(model.config.head_dim, heads, mlp)
    return Ablation(tuple(parts), mode, values, n, layers)


def _size(config, part: Part) -> int:
    return config.d_model if part.head is None else config.head_dim


def zero_ablation(model, parts: Sequence[Part]) -> Ablation:
    """`parts` (checked against the model) replaced by zeros."""
    check(parts, model.config)
    values = {part: np.zeros(_size(model.config, part)) for part in parts}
    return _build(model, parts, "zero", values, 0)


def mean_ablation(model, parts: Sequence[Part], reference_ids) -> Ablation:
    """`parts` (checked against the model) replaced by their means over every position of
    reference_ids (N,), run unablated in windows of context_length: a head's attn.mix (hd,), an
    MLP's mlp.out (C,), c_proj's bias included. The sums are float64 on the host."""
    check(parts, model.config)
    ids = np.asarray(as_host(reference_ids))
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ModelError(f"mean ablation needs a non-empty reference text; its ids have shape {ids.shape}")
    wanted = {layer_key(part.layer, "mlp.out" if part.head is None else "attn.mix") for part in parts}
    sums: dict[str, np.ndarray] = {}

    def add(name: str, value) -> None:  # (1, T, C) mlp.out or (1, H, T, hd) mix -> summed over positions
        host = np.asarray(as_host(value), dtype=np.float64)
        total = host.sum(axis=(0, 1)) if split_key(name)[1] == "mlp.out" else host[0].sum(axis=1)
        sums[name] = sums.get(name, 0) + total

    T = model.config.context_length
    with ablated(model, None), np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, ids.size, T):
            model.forward(ids[None, lo : lo + T], trace=Recorder(wanted.__contains__, add))
    values = {}
    for part in parts:
        if part.head is None:
            values[part] = sums[layer_key(part.layer, "mlp.out")] / ids.size
        else:
            values[part] = sums[layer_key(part.layer, "attn.mix")][part.head] / ids.size
    if not all(np.isfinite(v).all() for v in values.values()):
        raise ModelError("the reference text's means are not finite: the model's weights overflow float32")
    return _build(model, parts, "mean", values, int(ids.size))


@contextlib.contextmanager
def ablated(model, ablation: Ablation | None) -> Iterator:
    """Run `model` with `ablation` (None: unablated) inside the `with` block; the one it had
    before is back after it. A generator made inside (GPT.generate) must be consumed there too."""
    before = model.ablation
    model.ablation = ablation
    try:
        yield model
    finally:
        model.ablation = before


# ----------------------------------------------------------------------------- the shift it makes


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max()
    return z - np.log(np.exp(z).sum())


@dataclass
class Shift:
    """The next-token distribution with and without an ablation.

    before, after: (V,) float64 probabilities, unablated and ablated. kl: KL(before || after) =
    sum before * log(before / after), in nats: what the ablation costs the model's prediction."""

    before: np.ndarray
    after: np.ndarray
    kl: float

    def moved(self, n: int) -> list[int]:
        """The n ids whose probability changed most (|after - before|), most first; ties: the
        smaller id first."""
        return np.argsort(-np.abs(self.after - self.before), kind="stable")[:n].tolist()

    def to_json(self, n: int) -> dict:
        """{"kl", "before": the n most likely tokens unablated [{"id", "p"}], "moved": the n that
        moved most [{"id", "before", "after"}]}."""
        best = np.argsort(-self.before, kind="stable")[:n].tolist()
        return {
            "kl": self.kl,
            "before": [{"id": i, "p": float(self.before[i])} for i in best],
            "moved": [{"id": i, "before": float(self.before[i]), "after": float(self.after[i])} for i in self.moved(n)],
        }


def shift(model, ids, ablation: Ablation) -> Shift:
    """The distribution after ids (T,) (the last position's), unablated and with `ablation`."""
    ids = np.asarray(as_host(ids))[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        with ablated(model, None):
            plain = np.asarray(as_host(model.forward(ids)[0, -1]), dtype=np.float64)
        with ablated(model, ablation):
            knocked = np.asarray(as_host(model.forward(ids)[0, -1]), dtype=np.float64)
    if not (np.isfinite(plain).all() and np.isfinite(knocked).all()):
        raise ModelError("the model's scores overflow float32 (infinite or NaN): its weights are damaged")
    log_p, log_q = _log_softmax(plain), _log_softmax(knocked)
    p = np.exp(log_p)
    return Shift(before=p, after=np.exp(log_q), kl=max(0.0, float(p @ (log_p - log_q))))
