"""A training run's settings: `TrainConfig` (the model's shape and the optimisation) and settings files.

Every field has a flag in `tk train-model` (cli/model_commands.py) and may come from a JSON or
TOML file (`load_config_file`); values are type-checked and range-checked here, before any work.

What it deliberately does not do: run anything (pipeline/train.py does).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenkit.common import FileError, jsonsafe, readfile
from tokenkit.common.messages import short
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPTConfig
from tokenkit.transformer.config import (
    ARCHITECTURES,
    MAX_CONTEXT_LENGTH,
    MAX_D_MODEL,
    MAX_LAYERS,
    MAX_MLP_HIDDEN,
    MAX_ROPE_FACTOR,
    ROPE_SCALINGS,
)

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

DEFAULT_VOCAB_SIZE = 1024  # tokenizer trained when none is given: laptop-sized, like the model defaults
MODEL_FIELDS = (
    "n_layers", "n_heads", "d_model", "context_length", "positional", "activation", "norm", "bias", "norm_type",
    "norm_eps", "rope_theta", "mlp_hidden", "n_kv_heads", "tie_embeddings", "qkv_bias",
)  # fmt: skip
# The settings of a RoPE scaling (`--rope-scaling TYPE`) -> the RopeScaling field each one is; a
# type takes those its ROPE_SCALINGS entry names, and the others keep their defaults.
ROPE_FIELDS = {
    "rope_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_context_length": "original_context_length",
}
MAX_STEPS = 10**12  # a million steps an hour for a century; also bounds --eval-interval and --warmup-steps
MAX_BATCH = 1 << 20  # windows per step; the memory check refuses much less on most machines
MAX_EVAL_BATCHES = 100_000  # validation batches per evaluation, each a forward pass
MAX_WORKERS = 1024  # processes per command (each holds its own gradients or text pieces)


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


def _setting(default: Any, help: str, allowed: Range | tuple[str, ...] | None = None) -> Any:
    """A TrainConfig field: its default, its flag's help, and the numbers (a Range) or names it may take."""
    return field(default=default, metadata={"help": help, "allowed": allowed})


@dataclass
class TrainConfig:
    """Every setting of a training run: the model's shape and the optimisation.

    The defaults train the default corpus (`corpora/tiny_tales.txt`, with a 1024-token BPE) to a
    visibly learned model in about a minute on 2 cores: it learns to carry a story's hero's name
    (an induction head), steadily across seeds (the measurements behind them: BENCHMARKS.md).
    Each field's metadata holds its flag's help and its range, checked for a flag, a settings
    file and a recorded run alike; `tk train-model` derives its flags from them.
    """

    # model (the vocabulary size comes from the tokenizer)
    arch: str = _setting(
        "gpt2",
        "architecture: sets the variant settings not given (gpt2: learned positions, GELU, LayerNorm, biases, "
        "tied embeddings; llama: rotary positions, SwiGLU, RMSNorm, no biases, untied embeddings)",
        tuple(ARCHITECTURES),
    )
    n_layers: int = _setting(2, "transformer blocks", Range(1, MAX_LAYERS))
    n_heads: int = _setting(4, "attention heads (must divide --d-model)", Range(1, MAX_D_MODEL))
    d_model: int = _setting(128, "width of the residual stream", Range(1, MAX_D_MODEL))
    context_length: int = _setting(64, "tokens of context (T)", Range(1, MAX_CONTEXT_LENGTH))
    positional: str = _setting("learned", "positional encoding", ("learned", "sinusoidal", "rope"))
    activation: str = _setting("gelu", "MLP activation (swiglu: a gated MLP)", ("gelu", "relu", "swiglu"))
    norm: str = _setting("pre", "normalisation placement", ("pre", "post"))
    bias: bool = _setting(True, "biases in linear layers and LayerNorms")
    norm_type: str = _setting("layernorm", "normalisation", ("layernorm", "rmsnorm"))
    norm_eps: float = _setting(1e-5, "epsilon of the normalisation", Range(0, 1, low_open=True))
    rope_theta: float = _setting(10000.0, "base of the rotary positions' wavelengths", Range(0, 1e12, low_open=True))
    mlp_hidden: int = _setting(0, "MLP width (0: 4 x --d-model; with swiglu about 8/3 x)", Range(0, MAX_MLP_HIDDEN))
    n_kv_heads: int = _setting(
        0, "K/V heads, each shared by a group of query heads (must divide --n-heads; 0: one per head)",
        Range(0, MAX_D_MODEL),
    )  # fmt: skip
    tie_embeddings: bool = _setting(True, "logits from the token embedding (off: a separate lm_head)")
    qkv_bias: bool = _setting(False, "biases on q, k, v even without --bias (as Qwen2)")
    rope_scaling: str = _setting(
        "none",
        "stretch the rotary frequencies for a longer context (linear: every one divided by --rope-factor; "
        "llama3: Llama 3.1's, by wavelength)",
        ("none", *ROPE_SCALINGS),
    )
    rope_factor: float = _setting(1.0, "RoPE scaling: how far the frequencies are divided", Range(1, MAX_ROPE_FACTOR))
    rope_low_freq_factor: float = _setting(
        1.0, "llama3 scaling: wavelengths over --rope-original-context-length / this are divided",
        Range(0, MAX_ROPE_FACTOR, low_open=True),
    )  # fmt: skip
    rope_high_freq_factor: float = _setting(
        4.0, "llama3 scaling: wavelengths under --rope-original-context-length / this are kept, those between blended",
        Range(0, MAX_ROPE_FACTOR, low_open=True),
    )  # fmt: skip
    rope_original_context_length: int = _setting(
        8192, "llama3 scaling: the context the model was first trained on", Range(1, MAX_CONTEXT_LENGTH)
    )
    # optimisation
    batch_size: int = _setting(16, "windows per step (B)", Range(1, MAX_BATCH))
    steps: int = _setting(2000, "optimizer steps in total", Range(1, MAX_STEPS))
    lr: float = _setting(4e-3, "peak learning rate", Range(0, 1, low_open=True))
    min_lr: float = _setting(4e-4, "learning rate at the end of the cosine decay", Range(0, 1))
    warmup_steps: int = _setting(50, "linear warmup steps", Range(0, MAX_STEPS))
    weight_decay: float = _setting(0.1, "AdamW decoupled weight decay (2-D weights only)", Range(0, 1e4))
    beta1: float = _setting(0.9, "AdamW beta1", Range(0, 1, high_open=True))
    beta2: float = _setting(0.99, "AdamW beta2", Range(0, 1, high_open=True))
    grad_clip: float = _setting(1.0, "global gradient-norm clip (0: off)", Range(0))
    # evaluation and data
    eval_interval: int = _setting(100, "evaluate + checkpoint every N steps", Range(1, MAX_STEPS))
    eval_batches: int = _setting(10, "validation batches per evaluation", Range(1, MAX_EVAL_BATCHES))
    val_fraction: float = _setting(
        0.1, "last fraction of the corpus held out for validation", Range(0, 1, low_open=True, high_open=True)
    )
    seed: int = _setting(0, "seed for initialisation and batches", Range(0, 2**64 - 1))
    # the machine: processes computing each step's batch shards, 0 = one per core. Results are
    # bit-identical for the same seed and the same count, so giving it reproduces a run elsewhere.
    workers: int = _setting(
        0,
        "processes computing each step's batch shards (0: one per core; "
        "the same count gives bit-identical runs on any machine)",
        Range(0, MAX_WORKERS),
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """One-line PipelineError for values no run could use (the model checks its own fields too)."""
        for f in dataclasses.fields(self):
            allowed, value = f.metadata["allowed"], getattr(self, f.name)
            if isinstance(allowed, Range) and (problem := allowed.problem(value)) is not None:
                raise PipelineError(f"{_flag(f.name)} {problem}, got {short(value)}")
        if self.min_lr > self.lr:
            raise PipelineError(f"--min-lr must be between 0 and --lr ({self.lr}), got {self.min_lr}")
        if self.lr * self.weight_decay > 1:  # each step scales the weights by 1 - lr * weight_decay
            raise PipelineError(
                f"--weight-decay {self.weight_decay} times --lr {self.lr} must be at most 1 "
                "(each step multiplies the weights by 1 - lr x weight decay)"
            )
        if self.warmup_steps > self.steps:
            raise PipelineError(f"--warmup-steps ({self.warmup_steps}) must not exceed --steps ({self.steps})")
        self._check_rope_scaling()
        GPTConfig.from_dict(self.model_config(vocab_size=256))  # its own one-line ModelError, before any work

    def _check_rope_scaling(self) -> None:
        """A RoPE scaling's settings make sense together: its numbers given only with a type
        that takes them, a factor above 1, on rotary positions (the model checks the rest)."""
        kind = self.rope_scaling
        choices = _field("rope_scaling").metadata["allowed"]
        if kind not in choices:
            raise PipelineError(f"--rope-scaling must be one of {', '.join(choices)}, got {short(kind)}")
        for name, part in ROPE_FIELDS.items():
            value = getattr(self, name)
            if part not in ROPE_SCALINGS.get(kind, ()) and value != _field(name).default:
                takers = " or ".join(k for k, parts in ROPE_SCALINGS.items() if part in parts)
                raise PipelineError(f"{_flag(name)} {value:g} needs --rope-scaling {takers} (it is {kind})")
        if kind == "none":
            return
        if self.positional != "rope":
            raise PipelineError(
                f"--rope-scaling {kind} stretches rotary positions, and --positional is {self.positional}; "
                "give --positional rope (or --arch llama)"
            )
        if self.rope_factor == 1:
            raise PipelineError(f"--rope-scaling {kind} needs a --rope-factor above 1 (1 stretches nothing)")
        if kind == "llama3" and not self.rope_high_freq_factor > self.rope_low_freq_factor:
            raise PipelineError(
                f"--rope-high-freq-factor ({self.rope_high_freq_factor:g}) must be above --rope-low-freq-factor "
                f"({self.rope_low_freq_factor:g}): the wavelengths between them are blended"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], base: TrainConfig | None = None) -> TrainConfig:
        """`base` (or the defaults) updated with `values`; keys may use '-' or '_'; types are checked.
        An `arch` among the values sets its architecture's variant settings first
        (`ARCHITECTURES`); the values given beside it win.

        >>> c = TrainConfig.from_dict({"arch": "llama", "bias": True})
        >>> c.positional, c.norm_type, c.activation, c.bias, c.tie_embeddings
        ('rope', 'rmsnorm', 'swiglu', True, False)
        """
        merged = (base or cls()).to_dict()
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        given = {}
        for raw_key, value in values.items():
            key = str(raw_key).replace("-", "_")
            if key not in types:
                raise PipelineError(f"unknown training setting {raw_key!r}; known: {', '.join(types)}")
            given[key] = _coerce(key, types[key], value)
        if "arch" in given:
            if given["arch"] not in ARCHITECTURES:
                raise PipelineError(f"--arch must be one of {', '.join(ARCHITECTURES)}, got {short(given['arch'])}")
            merged.update(ARCHITECTURES[given["arch"]])
        merged.update(given)
        return cls(**merged)

    @classmethod
    def from_file(cls, path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
        """Load settings from a JSON or TOML file (a flat table of the field names above)."""
        return cls.from_dict(load_config_file(path), base)

    def model_config(self, vocab_size: int) -> dict[str, Any]:
        """The GPTConfig fields for this run (dropout-free, causal); 0 and off say "the default" here
        where GPTConfig says None (`model_settings` is the way back)."""
        cfg = {name: getattr(self, name) for name in MODEL_FIELDS}
        cfg.update(mlp_hidden=self.mlp_hidden or None, n_kv_heads=self.n_kv_heads or None)
        cfg["qkv_bias"] = self.qkv_bias or None
        cfg["rope_scaling"] = self.rope_scaling_dict()
        cfg["vocab_size"] = vocab_size
        return cfg

    def rope_scaling_dict(self) -> dict[str, Any] | None:
        """The model's rope_scaling (`config.RopeScaling.to_dict`): the type and the numbers it
        takes, or None for --rope-scaling none.

        >>> TrainConfig(positional="rope", rope_scaling="linear", rope_factor=4.0).rope_scaling_dict()
        {'type': 'linear', 'factor': 4.0}
        """
        if self.rope_scaling == "none":
            return None
        parts = ROPE_SCALINGS[self.rope_scaling]
        return {"type": self.rope_scaling, **{p: getattr(self, n) for n, p in ROPE_FIELDS.items() if p in parts}}


def model_settings(config: GPTConfig) -> dict[str, Any]:
    """The TrainConfig settings of a model's shape (`MODEL_FIELDS`, and `arch` when the model is
    of one of the families): `TrainConfig.model_config`'s inverse.

    >>> from tokenkit.transformer.config import llama_config
    >>> s = model_settings(llama_config(n_kv_heads=4))
    >>> s["arch"], s["n_kv_heads"], s["mlp_hidden"], s["qkv_bias"]
    ('llama', 4, 0, False)
    """
    values = {name: getattr(config, name) for name in MODEL_FIELDS}
    values.update(mlp_hidden=config.mlp_hidden or 0, n_kv_heads=config.n_kv_heads or 0, qkv_bias=bool(config.qkv_bias))
    scaling = config.rope_scaling
    values["rope_scaling"] = "none" if scaling is None else scaling.type
    for name, part in ROPE_FIELDS.items():  # the numbers a type does not take keep their defaults
        number = None if scaling is None else getattr(scaling, part)
        values[name] = _field(name).default if number is None else number
    if config.architecture in ARCHITECTURES:
        values["arch"] = config.architecture
    return values


def _field(name: str) -> dataclasses.Field:
    """TrainConfig's field `name` (its default and metadata)."""
    return TrainConfig.__dataclass_fields__[name]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _coerce(key: str, typ: str, value: Any) -> Any:
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[typ]
    if not ok:
        raise PipelineError(f"training setting {key!r} must be a {typ}, got {short(value)}")
    try:
        return float(value) if typ == "float" else value
    except OverflowError:  # an integer beyond any float, e.g. 10**400 in a JSON file
        raise PipelineError(f"{_flag(key)} must be a finite number, got {short(value)}") from None


def _read_small(path: Path) -> str:
    """A settings file's text (`common.readfile`: a regular file of at most SETTINGS_LIMIT bytes)."""
    try:
        data = readfile.read_bytes(path, readfile.SETTINGS_LIMIT, "a settings file", "give a .json or .toml file")
    except FileError as err:
        raise PipelineError(f"config file {err}") from None
    return data.decode("utf-8")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The settings table of a .json or .toml file (TOML needs Python >= 3.11 or the `tomli` package)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise PipelineError(f"config file not found: {path}")
    try:
        if path.suffix.lower() == ".toml":
            if tomllib is None:
                raise PipelineError("reading TOML needs Python >= 3.11 or `pip install tomli`; or give a .json config")
            values = tomllib.loads(_read_small(path))
        elif path.suffix.lower() == ".json":
            try:
                values = jsonsafe.loads(_read_small(path), "its text")
            except FileError as err:
                raise PipelineError(f"config file {path} does not parse: {err}") from None
        else:
            raise PipelineError(f"config file {path} must end in .json or .toml")
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise PipelineError(f"config file {path} does not parse: {str(err).splitlines()[0]}") from None
    except RecursionError:  # TOML nested thousands deep
        raise PipelineError(f"config file {path} is nested too deep; it must be one flat table of settings") from None
    if not isinstance(values, dict):
        raise PipelineError(f"config file {path} must hold one table of settings")
    return values
