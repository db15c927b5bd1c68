"""GPTConfig: the shape and variant choices of a model, GPT-2 small's as the defaults.

The variant fields cover the seed documents: sinusoidal positions, ReLU, post-norm and a
bidirectional encoder (seed 001), next to GPT-2's learned positions, tanh GELU, pre-norm and
causal attention; and today's decoders (Llama's family): rotary positions (`positional="rope"`
with `rope_theta`, and `rope_scaling`: Llama 3.1's or linear), RMSNorm (`norm_type`, with
`norm_eps`), a SwiGLU MLP (`activation="swiglu"` with `mlp_hidden`), grouped-query attention
(`n_kv_heads`), untied embeddings (`tie_embeddings=False`) and biases on q, k, v only
(`bias=False, qkv_bias=True`, as Qwen2).
`llama_config(...)` fills those in. A config validates itself on construction, so a bad value is
reported once, in one line, before any array is allocated. It holds no weights and does no I/O.
Each field declares its range and a line of help once (`setting`); the training settings and
their flags are derived from them.

Files: `to_dict` leaves out the fields added for Llama's family while they hold their defaults,
so a GPT-2-style config is written exactly as before (and older tk versions read it), and a
file without them reads as GPT-2's choices.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from tokenkit.common.messages import short
from tokenkit.transformer.errors import ModelError

# The fields that came with Llama's family (issue 22); written to files only when not at their
# default, so GPT-2-style configs keep their old JSON.
LATER_FIELDS = ("norm_type", "norm_eps", "rope_theta", "mlp_hidden", "n_kv_heads", "tie_embeddings", "qkv_bias",
                "rope_scaling")  # fmt: skip
# The variant choices of each architecture family; the sizes, n_kv_heads, rope_theta, norm_eps
# and mlp_hidden are free within a family. `GPTConfig.architecture` names a config's family,
# `llama_config` and train-model's --arch start from them.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "gpt2": dict(positional="learned", activation="gelu", norm="pre", norm_type="layernorm", bias=True,
                 tie_embeddings=True),
    "llama": dict(positional="rope", activation="swiglu", norm="pre", norm_type="rmsnorm", bias=False,
                  tie_embeddings=False),
}  # fmt: skip

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
MAX_MLP_HIDDEN = 1 << 18  # Llama 3 405B's MLP: 53,248


# What each RoPE scaling takes besides its type (`RopeScaling`); the factor's bound is far beyond
# any published one (Llama 3.2: 32).
ROPE_SCALINGS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_context_length"),
}
MAX_ROPE_FACTOR = 1e6


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: a finite number from `low` to `high` (None: no
    bound; `low_open`/`high_open` exclude that end). `problem` says what is wrong with a value.

    >>> Range(0, 1, low_open=True).problem(float("inf")), Range(1, 8).problem(9), Range(0).problem(0)
    ('must be a finite number', 'must be at most 8', None)
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def problem(self, value: float) -> str | None:
        """What is wrong with `value` ("must be at least 1"), or None when it is in range."""
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        low, high = self.low, self.high
        if low is not None and (value < low or (self.low_open and value == low)):
            if low == 0:
                return "must be positive" if self.low_open else "must not be negative"
            return f"must be above {low:,}" if self.low_open else f"must be at least {low:,}"
        if high is not None and (value > high or (self.high_open and value == high)):
            return f"must be below {high:,}" if self.high_open else f"must be at most {high:,}"
        return None


def setting(default: Any, help: str, allowed: Range | tuple[str, ...] | None = None, *, unset: str = "") -> Any:
    """A settings field: its default (MISSING: none), its help (the line `tk train-model --help`
    shows for its flag), and the numbers (a Range) or names it may take. `unset` says what None
    means for a field that may be None; train-model's flags spell that None 0, off or none
    (`pipeline.config.model_setting`)."""
    return field(default=default, metadata={"help": help, "allowed": allowed, "unset": unset})


@dataclass(frozen=True)
class RopeScaling:
    """How a model's rotary frequencies are stretched to serve a longer context than it was
    first trained on; only the table of angles changes (`ops.rope_inv_freq` computes it):

    - "linear": every inverse frequency divided by `factor` (positions squeezed factor times);
    - "llama3" (Llama 3.1's): wavelengths 2 pi / inv_freq longer than original_context_length /
      low_freq_factor divided by `factor`, those shorter than original_context_length /
      high_freq_factor kept, and those between blended from one to the other.

    Fields a type does not take are None. GPTConfig checks the values (`GPTConfig.rope_scaling`).

    >>> RopeScaling("linear", 4.0).describe()
    'linear scaling: frequencies divided by 4'
    """

    type: str = setting(
        MISSING,
        "stretch the rotary frequencies for a longer context (linear: every one divided by --rope-factor; "
        "llama3: Llama 3.1's, by wavelength)",
        tuple(ROPE_SCALINGS),
        unset="not stretched",
    )
    factor: float = setting(MISSING, "RoPE scaling: how far the frequencies are divided", Range(1, MAX_ROPE_FACTOR))
    low_freq_factor: float | None = setting(
        None, "llama3 scaling: wavelengths over --rope-original-context-length / this are divided",
        Range(0, MAX_ROPE_FACTOR, low_open=True),
    )  # fmt: skip
    high_freq_factor: float | None = setting(
        None, "llama3 scaling: wavelengths under --rope-original-context-length / this are kept, those between blended",
        Range(0, MAX_ROPE_FACTOR, low_open=True),
    )  # fmt: skip
    original_context_length: int | None = setting(
        None, "llama3 scaling: the context the model was first trained on", Range(1, MAX_CONTEXT_LENGTH)
    )

    def to_dict(self) -> dict[str, Any]:
        """The type and the numbers it takes (JSON-ready; `GPTConfig.to_dict` writes it)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        """One clause for a reader (explain, the page's model view)."""
        if self.type == "llama3":
            long = self.original_context_length / self.low_freq_factor
            short = self.original_context_length / self.high_freq_factor
            return (
                f"llama3 scaling: frequencies of wavelengths over {long:g} positions divided by {self.factor:g},"
                f" under {short:g} kept, blended between"
            )
        return f"{self.type} scaling: frequencies divided by {self.factor:g}"


@dataclass(frozen=True)
class GPTConfig:
    """Hyperparameters of a GPT; head size is d_model // n_heads.

    GPT-2's fields, then Llama's family's (each default is GPT-2's choice):
    - positional: "learned" (wpe), "sinusoidal" (fixed), or "rope" (q and k rotated in every
      layer, HF Llama's layout), with rope_theta, the base of its wavelengths, and rope_scaling,
      how they are stretched (a `RopeScaling`, or its dict; None: not at all);
    - norm_type: "layernorm" (with a bias when `bias`) or "rmsnorm" (a gain only), both with
      norm_eps; `norm` says where they sit (pre or post);
    - activation: "gelu", "relu" or "swiglu" (a gated MLP, silu(x W_gate) * (x W_up), its
      mlp.c_fc holding W_gate and W_up side by side); mlp_hidden is the MLP's width (None: the
      activation's usual one, `default_hidden`);
    - n_kv_heads: K/V heads, each shared by n_heads / n_kv_heads query heads (None: n_heads,
      ordinary attention; 1: multi-query);
    - tie_embeddings: logits from wte (GPT-2) or from a separate lm_head.weight;
    - bias: biases on every linear layer and LayerNorm; qkv_bias: on the q, k, v projection
      alone (None: as `bias`; Qwen2 is bias=False, qkv_bias=True).

    A value that says what the default says is stored as the default (n_kv_heads equal to
    n_heads, mlp_hidden equal to `default_hidden`, qkv_bias equal to bias become None), so two
    configs of the same model are equal, and a GPT-2-style config keeps GPT-2's JSON.

    Each field is a `setting`: its range or names, checked here, and its help, which train-model's
    flags show (pipeline/config.py's TrainConfig takes both from here).

    >>> GPTConfig(vocab_size=256, context_length=64, d_model=128, n_layers=4, n_heads=4).head_dim
    32
    """

    vocab_size: int = setting(50257, "tokens in the vocabulary", Range(1, MAX_VOCAB_SIZE))
    context_length: int = setting(1024, "tokens of context (T)", Range(1, MAX_CONTEXT_LENGTH))
    d_model: int = setting(768, "width of the residual stream", Range(1, MAX_D_MODEL))
    n_layers: int = setting(12, "transformer blocks", Range(1, MAX_LAYERS))
    # n_heads divides d_model, so its bound only caps the message's number
    n_heads: int = setting(12, "attention heads (must divide --d-model)", Range(1, MAX_D_MODEL))
    positional: str = setting("learned", "positional encoding", ("learned", "sinusoidal", "rope"))
    activation: str = setting("gelu", "MLP activation (swiglu: a gated MLP)", ("gelu", "relu", "swiglu"))
    norm: str = setting("pre", "normalisation placement", ("pre", "post"))
    causal: bool = setting(True, "each position attends to those before it (off: a bidirectional encoder)")
    bias: bool = setting(True, "biases in linear layers and LayerNorms")
    norm_type: str = setting("layernorm", "normalisation", ("layernorm", "rmsnorm"))
    norm_eps: float = setting(1e-5, "epsilon of the normalisation", Range(0, 1, low_open=True))
    rope_theta: float = setting(10000.0, "base of the rotary positions' wavelengths", Range(0, 1e12, low_open=True))
    mlp_hidden: int | None = setting(
        None, "MLP width", Range(1, MAX_MLP_HIDDEN), unset="4 x --d-model; with swiglu about 8/3 x"
    )
    n_kv_heads: int | None = setting(
        None, "K/V heads, each shared by a group of query heads; must divide --n-heads", Range(1, MAX_D_MODEL),
        unset="one per head",
    )  # fmt: skip
    tie_embeddings: bool = setting(True, "logits from the token embedding (off: a separate lm_head)")
    qkv_bias: bool | None = setting(None, "biases on q, k, v even without --bias (as Qwen2)", unset="as --bias")
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden"):
            value = getattr(self, name)
            if value is None and name in ("n_kv_heads", "mlp_hidden"):
                continue
            # bool is an int subclass; `n_layers=True` is a mistake, not a 1.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelError(f"config: {name} must be a positive integer, got {short(value)}")
            high = _allowed(name).high
            if value > high:
                raise ModelError(f"config: {name} must be at most {high:,}, got {short(value)}")
        if self.d_model % self.n_heads:
            raise ModelError(
                f"config: d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads});"
                " pick a head count that divides it"
            )
        if self.n_heads % self.kv_heads:
            raise ModelError(
                f"config: n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}):"
                " each K/V head serves a group of query heads of the same size"
            )
        for name in ("positional", "activation", "norm", "norm_type"):
            value, allowed = getattr(self, name), _allowed(name)
            if value not in allowed:
                raise ModelError(f"config: {name} must be one of {', '.join(allowed)}; got {value!r}")
        for name in ("causal", "bias", "tie_embeddings", "qkv_bias"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "qkv_bias" and value is None):
                raise ModelError(f"config: {name} must be true or false, got {short(value)}")
        for name in ("norm_eps", "rope_theta"):
            value, high = getattr(self, name), _allowed(name).high
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= high:
                raise ModelError(f"config: {name} must be a number above 0 and at most {high:g}, got {short(value)}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ModelError(
                f"config: rotary positions turn pairs of dimensions, so the head size d_model / n_heads must be"
                f" even; got {self.head_dim}"
            )
        self._check_rope_scaling()
        # one spelling per model: values equal to their defaults' meaning are the defaults
        if self.n_kv_heads == self.n_heads:
            object.__setattr__(self, "n_kv_heads", None)
        if self.mlp_hidden == default_hidden(self.activation, self.d_model):
            object.__setattr__(self, "mlp_hidden", None)
        if self.qkv_bias == self.bias:
            object.__setattr__(self, "qkv_bias", None)
        if self.rope_scaling is not None and self.rope_scaling.factor == 1:  # either type then changes nothing
            object.__setattr__(self, "rope_scaling", None)

    def _check_rope_scaling(self) -> None:
        """rope_scaling: None, or a RopeScaling (a dict, as read from a file, is made one) of a type
        in ROPE_SCALINGS with exactly that type's numbers, each in range; rotary positions only."""
        scaling = self.rope_scaling
        if scaling is None:
            return
        if isinstance(scaling, dict):
            scaling = _rope_scaling_from_dict(scaling)
            object.__setattr__(self, "rope_scaling", scaling)
        if not isinstance(scaling, RopeScaling):
            raise ModelError(f"config: rope_scaling must be a JSON object or null, got {short(scaling)}")
        if self.positional != "rope":
            raise ModelError(f"config: rope_scaling stretches rotary positions; positional is {self.positional!r}")
        kind = scaling.type
        if not isinstance(kind, str) or kind not in ROPE_SCALINGS:
            raise ModelError(f"config: rope_scaling type must be one of {', '.join(ROPE_SCALINGS)}; got {short(kind)}")
        for name in ("low_freq_factor", "high_freq_factor", "original_context_length"):
            if name not in ROPE_SCALINGS[kind] and getattr(scaling, name) is not None:
                raise ModelError(f"config: rope_scaling {kind!r} does not take {name}")
        for name in ROPE_SCALINGS[kind]:
            value = getattr(scaling, name)
            if name == "original_context_length":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_CONTEXT_LENGTH:
                    raise ModelError(
                        f"config: rope_scaling {name} must be an integer from 1 to {MAX_CONTEXT_LENGTH:,},"
                        f" got {short(value)}"
                    )
                continue
            wrong = isinstance(value, bool) or not isinstance(value, (int, float)) or not value <= MAX_ROPE_FACTOR
            if name == "factor" and (wrong or not value >= 1):
                raise ModelError(
                    f"config: rope_scaling factor must be a number from 1 to {MAX_ROPE_FACTOR:g}, got {short(value)}"
                )
            if wrong or not value > 0:
                raise ModelError(
                    f"config: rope_scaling {name} must be a number above 0 and at most {MAX_ROPE_FACTOR:g},"
                    f" got {short(value)}"
                )
        if kind == "llama3" and not scaling.high_freq_factor > scaling.low_freq_factor:
            raise ModelError(
                f"config: rope_scaling high_freq_factor ({scaling.high_freq_factor:g}) must be above low_freq_factor"
                f" ({scaling.low_freq_factor:g}): the wavelengths between them are blended"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """K/V heads per layer: n_kv_heads, or n_heads when unset."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def hidden(self) -> int:
        """The MLP's hidden width: mlp_hidden, or the activation's usual one (`default_hidden`)."""
        return default_hidden(self.activation, self.d_model) if self.mlp_hidden is None else self.mlp_hidden

    @property
    def architecture(self) -> str:
        """The family whose variant choices this config makes (`ARCHITECTURES`: "gpt2" or
        "llama"), or "custom" for another mix.

        >>> GPTConfig().architecture, llama_config().architecture, GPTConfig(positional="rope").architecture
        ('gpt2', 'llama', 'custom')
        """
        for name, choices in ARCHITECTURES.items():
            if all(getattr(self, key) == value for key, value in choices.items()):
                return name
        return "custom"

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the q, k, v projection (attn.c_attn) has a bias."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    def describe(self) -> str:
        """The model's sizes in a few words, as the commands' summaries show them (K/V heads where
        fewer than the query heads).

        >>> GPTConfig(n_kv_heads=4).describe()
        '12 layers, 12 heads (4 K/V), width 768, context 1024, vocab 50257'
        """
        heads = f"{self.n_heads} heads" + (f" ({self.kv_heads} K/V)" if self.kv_heads != self.n_heads else "")
        sizes = f"width {self.d_model}, context {self.context_length}, vocab {self.vocab_size}"
        return f"{self.n_layers} layers, {heads}, {sizes}"

    def n_params(self) -> int:
        """Number of parameters (float32 each: 4 bytes).

        >>> GPTConfig().n_params()  # GPT-2 small
        124439808
        """
        return sum(math.prod(shape) for shape in param_shapes(self).values())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; `GPTConfig.from_dict(c.to_dict()) == c`. Llama's family's
        fields are left out while at their defaults (`LATER_FIELDS`): GPT-2-style configs keep
        the JSON they always had.

        >>> sorted(set(GPTConfig(norm_type="rmsnorm").to_dict()) - set(GPTConfig().to_dict()))
        ['norm_type']
        """
        defaults = {f.name: f.default for f in fields(self)}
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.rope_scaling is not None:
            values["rope_scaling"] = self.rope_scaling.to_dict()
        return {k: v for k, v in values.items() if k not in LATER_FIELDS or v != defaults[k]}

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


def _allowed(name: str) -> Any:
    """The Range or names GPTConfig's field `name` may take (its `setting`'s)."""
    return GPTConfig.__dataclass_fields__[name].metadata["allowed"]


def _rope_scaling_from_dict(d: dict) -> RopeScaling:
    """A RopeScaling from its JSON object (`RopeScaling.to_dict`): a known type and exactly its
    numbers (GPTConfig then checks their values)."""
    kind = d.get("type")
    if not isinstance(kind, str) or kind not in ROPE_SCALINGS:
        raise ModelError(f"config: rope_scaling type must be one of {', '.join(ROPE_SCALINGS)}; got {short(kind)}")
    odd = sorted(set(d) - {"type", *ROPE_SCALINGS[kind]}, key=str)
    if odd:
        raise ModelError(
            f"config: rope_scaling {kind!r} does not take {short(odd[0])}; it takes {', '.join(ROPE_SCALINGS[kind])}"
        )
    missing = [name for name in ROPE_SCALINGS[kind] if name not in d]
    if missing:
        raise ModelError(f"config: rope_scaling {kind!r} lacks {missing[0]}")
    return RopeScaling(**d)


def default_hidden(activation: str, d_model: int) -> int:
    """The MLP's usual width: 4 * d_model (GPT-2), or for SwiGLU, whose three matrices hold as
    many weights as two of 4 * d_model, 2/3 of that, rounded up to a multiple of 64 (Llama's
    rule, with 64 for its 256).

    >>> default_hidden("gelu", 768), default_hidden("swiglu", 768), default_hidden("swiglu", 4096)
    (3072, 2048, 10944)
    """
    if activation == "swiglu":
        return -(-(8 * d_model // 3) // 64) * 64
    return 4 * d_model


def llama_config(**overrides: Any) -> GPTConfig:
    """A Llama-style decoder (`ARCHITECTURES["llama"]`): rotary positions (theta 10,000),
    pre-norm RMSNorm (eps 1e-5), a SwiGLU MLP (`default_hidden`), no biases, untied embeddings;
    n_kv_heads as given (None: ordinary attention). Any field can be overridden; the sizes
    default to GPT-2 small's.

    >>> c = llama_config(vocab_size=256, context_length=64, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2)
    >>> c.positional, c.norm_type, c.activation, c.hidden, c.kv_heads, c.tie_embeddings
    ('rope', 'rmsnorm', 'swiglu', 384, 2, False)
    """
    return GPTConfig(**{**ARCHITECTURES["llama"], **overrides})


def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape for every parameter, in GPT-2's names and order.

    GPT-2's names serve Llama's family too, place for place (HF Llama's names on the right):
    wte (embed_tokens), h.i.ln_1 (input_layernorm), h.i.attn.c_attn (q_proj, k_proj and v_proj
    side by side: (C, (H + 2 Hkv) hd)), h.i.attn.c_proj (o_proj), h.i.ln_2
    (post_attention_layernorm), h.i.mlp.c_fc (with SwiGLU gate_proj then up_proj side by side:
    (C, 2 F)), h.i.mlp.c_proj (down_proj), ln_f (norm), and lm_head.weight (lm_head, (V, C))
    when the embeddings are untied. Weights are (in, out), GPT-2's Conv1D layout. Biases only
    with bias=True (c_attn's with qkv_bias); RMSNorm has none.

    >>> from tokenkit.transformer.config import llama_config
    >>> shapes = param_shapes(llama_config(vocab_size=10, d_model=8, n_layers=1, n_heads=4, n_kv_heads=1))
    >>> shapes["h.0.attn.c_attn.weight"], shapes["h.0.mlp.c_fc.weight"], shapes["lm_head.weight"]
    ((8, 12), (8, 128), (10, 8))
    """
    V, T, C = config.vocab_size, config.context_length, config.d_model
    hd, F = config.head_dim, config.hidden
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (V, C)}
    if config.positional == "learned":
        shapes["wpe.weight"] = (T, C)
    norm_bias = config.bias and config.norm_type == "layernorm"

    def add(name: str, weight_shape: tuple[int, ...], bias: bool) -> None:
        shapes[f"{name}.weight"] = weight_shape
        if bias:
            shapes[f"{name}.bias"] = weight_shape[-1:]

    for i in range(config.n_layers):
        add(f"h.{i}.ln_1", (C,), norm_bias)
        add(f"h.{i}.attn.c_attn", (C, (config.n_heads + 2 * config.kv_heads) * hd), config.has_qkv_bias)
        add(f"h.{i}.attn.c_proj", (C, C), config.bias)
        add(f"h.{i}.ln_2", (C,), norm_bias)
        add(f"h.{i}.mlp.c_fc", (C, 2 * F if config.activation == "swiglu" else F), config.bias)
        add(f"h.{i}.mlp.c_proj", (F, C), config.bias)
    add("ln_f", (C,), norm_bias)
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (V, C)
    return shapes
