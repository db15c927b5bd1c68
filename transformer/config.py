"""GPTConfig: the shape and variant choices of a model, GPT-2 small's as the defaults.

The variant fields cover the seed documents: sinusoidal positions, ReLU, post-norm and a
bidirectional encoder (seed 001), next to GPT-2's learned positions, tanh GELU, pre-norm and
causal attention. A config validates itself on construction, so a bad value is reported once,
in one line, before any array is allocated. It holds no weights and does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from tokenkit.transformer.errors import ModelError

_CHOICES = {
    "positional": ("learned", "sinusoidal"),
    "activation": ("gelu", "relu"),
    "norm": ("pre", "post"),
}

# Upper bounds, so that a config read from a file cannot imply absurd work or allocations before
# any tensor is looked at (whether the model then fits in memory is GPT's check: see
# transformer.model.check_memory). Far beyond any model this NumPy code can train or run:
# - context_length 65,536 (GPT-2: 1,024): with sinusoidal positions no tensor backs it, and one
#   sequence of that length already needs 16 GiB of attention scores per head; learned positions
#   share the bound (their wpe table must be in the file anyway).
# - vocab_size 2**24 (GPT-2: 50,257; the largest tokenizers ~256k); token ids stay far inside uint32.
# - d_model 65,536 (GPT-2 small: 768, GPT-3: 12,288), n_layers 1,024 (GPT-3: 96).
MAX_CONTEXT_LENGTH = 1 << 16
MAX_VOCAB_SIZE = 1 << 24
MAX_D_MODEL = 1 << 16
MAX_LAYERS = 1 << 10
_LIMITS = {
    "vocab_size": MAX_VOCAB_SIZE,
    "context_length": MAX_CONTEXT_LENGTH,
    "d_model": MAX_D_MODEL,
    "n_layers": MAX_LAYERS,
    "n_heads": MAX_D_MODEL,  # n_heads divides d_model, so this only bounds the message's number
}


@dataclass(frozen=True)
class GPTConfig:
    """Hyperparameters of a GPT; head size is d_model // n_heads.

    >>> GPTConfig(vocab_size=256, context_length=64, d_model=128, n_layers=4, n_heads=4).head_dim
    32
    """

    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    positional: str = "learned"
    activation: str = "gelu"
    norm: str = "pre"
    causal: bool = True
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            # bool is an int subclass; `n_layers=True` is a mistake, not a 1.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelError(f"config: {name} must be a positive integer, got {_short(value)}")
            if value > _LIMITS[name]:
                raise ModelError(f"config: {name} must be at most {_LIMITS[name]:,}, got {_short(value)}")
        if self.d_model % self.n_heads:
            raise ModelError(
                f"config: d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads});"
                " pick a head count that divides it"
            )
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ModelError(f"config: {name} must be one of {', '.join(allowed)}; got {value!r}")
        for name in ("causal", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise ModelError(f"config: {name} must be true or false, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def n_params(self) -> int:
        """Number of parameters (float32 each: 4 bytes).

        >>> GPTConfig().n_params()  # GPT-2 small
        124439808
        """
        return sum(math.prod(shape) for shape in param_shapes(self).values())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; `GPTConfig.from_dict(c.to_dict()) == c`."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> GPTConfig:
        """Build and validate a config from a dict (e.g. parsed JSON); unknown keys are an error."""
        if not isinstance(d, dict):
            raise ModelError(f"config: expected a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ModelError(
                f"config: unknown field(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}"
            )
        return cls(**d)


def _short(value: Any) -> str:
    """A value for a one-line message: its repr, cut short (a config from a file may hold anything)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print (Python refuses over 4,300 digits)
        return f"an integer of {value.bit_length():,} bits"
    return text if len(text) <= 40 else text[:30] + "..."


def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape for every parameter, in GPT-2's names and order (biases only with bias=True)."""
    V, T, C = config.vocab_size, config.context_length, config.d_model
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (V, C)}
    if config.positional == "learned":
        shapes["wpe.weight"] = (T, C)

    def add(name: str, weight_shape: tuple[int, ...], bias_len: int) -> None:
        shapes[f"{name}.weight"] = weight_shape
        if config.bias:
            shapes[f"{name}.bias"] = (bias_len,)

    for i in range(config.n_layers):
        add(f"h.{i}.ln_1", (C,), C)
        add(f"h.{i}.attn.c_attn", (C, 3 * C), 3 * C)
        add(f"h.{i}.attn.c_proj", (C, C), C)
        add(f"h.{i}.ln_2", (C,), C)
        add(f"h.{i}.mlp.c_fc", (C, 4 * C), 4 * C)
        add(f"h.{i}.mlp.c_proj", (4 * C, C), C)
    add("ln_f", (C,), C)
    return shapes
