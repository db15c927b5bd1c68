"""A training run's settings: `TrainConfig` (the model's shape and the optimisation) and settings files.

Every field has a flag in `tk train-model` (cli/model_commands.py) and may come from a JSON or
TOML file (`load_config_file`); values are type-checked and range-checked here, before any work.
The model's settings are GPTConfig's fields (`model_setting`): their help and ranges are declared
there once, and only their defaults, a laptop-sized model's, are set here.

What it deliberately does not do: declare the model's ranges (transformer/config.py does), or
run anything (pipeline/start.py and pipeline/train.py do).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenkit.common import FileError, jsonsafe, processes, readfile
from tokenkit.common.messages import short
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPTConfig
from tokenkit.transformer.config import ARCHITECTURES, ROPE_SCALINGS, Range, RopeScaling, param_shapes, setting

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

DEFAULT_VOCAB_SIZE = 1024  # tokenizer trained when none is given: laptop-sized, like the model defaults
MAX_STEPS = 10**12  # a million steps an hour for a century; also bounds --eval-interval and --warmup-steps
MAX_BATCH = 1 << 20  # windows per step; the memory check refuses much less on most machines
MAX_EVAL_BATCHES = 100_000  # validation batches per evaluation, each a forward pass
MAX_WORKERS = processes.MAX_WORKERS


def model_setting(name: str, default: Any, of: type = GPTConfig) -> Any:
    """A TrainConfig field that sets the model's field `name` (GPTConfig's, or RopeScaling's for
    the rope_* settings), with that field's help and range and this run's `default`. Where the
    model's field may be None (its `unset` meaning), a flag says None as 0, off or none.

    >>> model_setting("mlp_hidden", 0).metadata["help"]
    'MLP width (0: 4 x --d-model; with swiglu about 8/3 x)'
    """
    model_field = of.__dataclass_fields__[name]
    help, allowed, unset = (model_field.metadata[k] for k in ("help", "allowed", "unset"))
    if unset and isinstance(allowed, Range):
        help, allowed = f"{help} (0: {unset})", dataclasses.replace(allowed, low=0)
    elif unset and isinstance(allowed, tuple):
        allowed = ("none", *allowed)
    return field(default=default, metadata={"help": help, "allowed": allowed, "model": (of, name)})


@dataclass
class TrainConfig:
    """Every setting of a training run: the model's shape and the optimisation.

    The defaults train the default corpus (`corpora/tiny_tales.txt`, with a 1024-token BPE) to a
    visibly learned model in about a minute on 2 cores: it learns to carry a story's hero's name
    (an induction head), steadily across seeds (the measurements behind them: BENCHMARKS.md).
    Each field's metadata holds its flag's help and its range, checked for a flag, a settings
    file and a recorded run alike; `tk train-model` derives its flags from them. The model's
    settings take theirs from GPTConfig's fields (`model_setting`) and differ only in their
    defaults, a laptop-sized model's.
    """

    # model (the vocabulary size comes from the tokenizer)
    arch: str = setting(
        "gpt2",
        "architecture: sets the variant settings not given (gpt2: learned positions, GELU, LayerNorm, biases, "
        "tied embeddings; llama: rotary positions, SwiGLU, RMSNorm, no biases, untied embeddings)",
        tuple(ARCHITECTURES),
    )
    n_layers: int = model_setting("n_layers", 2)
    n_heads: int = model_setting("n_heads", 4)
    d_model: int = model_setting("d_model", 128)
    context_length: int = model_setting("context_length", 64)
    positional: str = model_setting("positional", "learned")
    activation: str = model_setting("activation", "gelu")
    norm: str = model_setting("norm", "pre")
    bias: bool = model_setting("bias", True)
    norm_type: str = model_setting("norm_type", "layernorm")
    norm_eps: float = model_setting("norm_eps", 1e-5)
    rope_theta: float = model_setting("rope_theta", 10000.0)
    mlp_hidden: int = model_setting("mlp_hidden", 0)
    n_kv_heads: int = model_setting("n_kv_heads", 0)
    tie_embeddings: bool = model_setting("tie_embeddings", True)
    qkv_bias: bool = model_setting("qkv_bias", False)
    # RoPE scaling, a RopeScaling's fields one by one: a type takes those its ROPE_SCALINGS entry
    # names, and the others keep their defaults (Llama 3.1's)
    rope_scaling: str = model_setting("type", "none", RopeScaling)
    rope_factor: float = model_setting("factor", 1.0, RopeScaling)
    rope_low_freq_factor: float = model_setting("low_freq_factor", 1.0, RopeScaling)
    rope_high_freq_factor: float = model_setting("high_freq_factor", 4.0, RopeScaling)
    rope_original_context_length: int = model_setting("original_context_length", 8192, RopeScaling)
    # optimisation
    batch_size: int = setting(16, "windows per step (B)", Range(1, MAX_BATCH))
    steps: int = setting(2000, "optimizer steps in total", Range(1, MAX_STEPS))
    lr: float = setting(4e-3, "peak learning rate", Range(0, 1, low_open=True))
    min_lr: float = setting(4e-4, "learning rate at the end of the cosine decay", Range(0, 1))
    warmup_steps: int = setting(50, "linear warmup steps", Range(0, MAX_STEPS))
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay (2-D weights only)", Range(0, 1e4))
    beta1: float = setting(0.9, "AdamW beta1", Range(0, 1, high_open=True))
    beta2: float = setting(0.99, "AdamW beta2", Range(0, 1, high_open=True))
    grad_clip: float = setting(1.0, "global gradient-norm clip (0: off)", Range(0))
    # fine-tuning as nanoGPT does it (transformer/dropout.py, the executors' micro-batches, `frozen_names`)
    dropout: float = setting(
        0.0,
        "dropout on the attention weights and the residual branches while training (0: off; never at evaluation)",
        Range(0, 1, high_open=True),
    )
    grad_accum: int = setting(
        1,
        "micro-batches of --batch-size windows per optimizer step (a step learns from N x B windows, "
        "holding one micro-batch's activations at a time)",
        Range(1, MAX_BATCH),
    )
    freeze: str = setting(
        "",
        "parameters not trained: comma-separated globs over their names, '!' keeping one trained "
        "(e.g. 'wte.*,h.0.*'; '*,!h.3.*,!ln_f.*' trains only block 3 and the final norm)",
    )
    # evaluation and data
    eval_interval: int = setting(100, "evaluate + checkpoint every N steps", Range(1, MAX_STEPS))
    eval_batches: int = setting(10, "validation batches per evaluation", Range(1, MAX_EVAL_BATCHES))
    val_fraction: float = setting(
        0.1, "last fraction of the corpus held out for validation", Range(0, 1, low_open=True, high_open=True)
    )
    seed: int = setting(0, "seed for initialisation and batches", Range(0, 2**64 - 1))
    # the machine: processes computing each step's batch shards, 0 = one per core. Results are
    # bit-identical for the same seed and the same count, so giving it reproduces a run elsewhere.
    workers: int = setting(
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
                raise PipelineError(f"{flag_of(f.name)} {problem}, got {short(value)}")
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
        model = GPTConfig.from_dict(self.model_config(vocab_size=256))  # its own one-line ModelError, before any work
        frozen_names(self.freeze, param_shapes(model))  # a pattern that matches nothing: one line, before any work

    @property
    def step_rows(self) -> int:
        """Windows per optimizer step: --grad-accum micro-batches of --batch-size."""
        return self.batch_size * self.grad_accum

    def frozen(self, names) -> set[str]:
        """The parameters of `names` that --freeze keeps as they are (`frozen_names`)."""
        return frozen_names(self.freeze, names)

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
                raise PipelineError(f"{flag_of(name)} {value:g} needs --rope-scaling {takers} (it is {kind})")
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
            given[key] = coerce_setting(key, types[key], value)
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
        """The GPTConfig fields for this run (causal); 0 and off say here what GPTConfig's None says
        (`model_setting`; `model_settings` is the way back)."""
        cfg = {name: getattr(self, name) for name in MODEL_FIELDS}
        cfg.update({name: cfg[name] or None for name in _NONE_AS_ZERO})
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


# TrainConfig's settings of the model (`model_setting`): GPTConfig's fields of the same names, and
# the RoPE scaling's fields (rope_scaling is its type, rope_* the RopeScaling field named)
_MODEL_PARTS = {f.name: f.metadata["model"] for f in dataclasses.fields(TrainConfig) if "model" in f.metadata}
MODEL_FIELDS = tuple(name for name, (of, _) in _MODEL_PARTS.items() if of is GPTConfig)
ROPE_FIELDS = {name: part for name, (of, part) in _MODEL_PARTS.items() if of is RopeScaling and part != "type"}
_NONE_AS_ZERO = tuple(name for name in MODEL_FIELDS if GPTConfig.__dataclass_fields__[name].metadata["unset"])


def model_settings(config: GPTConfig) -> dict[str, Any]:
    """The TrainConfig settings of a model's shape (`MODEL_FIELDS`, and `arch` when the model is
    of one of the families): `TrainConfig.model_config`'s inverse.

    >>> from tokenkit.transformer.config import llama_config
    >>> s = model_settings(llama_config(n_kv_heads=4))
    >>> s["arch"], s["n_kv_heads"], s["mlp_hidden"], s["qkv_bias"]
    ('llama', 4, 0, False)
    """
    values = {name: getattr(config, name) for name in MODEL_FIELDS}
    scaling = config.rope_scaling
    values["rope_scaling"] = None if scaling is None else scaling.type
    values.update({name: None if scaling is None else getattr(scaling, part) for name, part in ROPE_FIELDS.items()})
    # None (the usual value, or a number the scaling does not take) is the setting's default:
    # 0, off, none, or Llama 3.1's numbers
    values = {name: _field(name).default if value is None else value for name, value in values.items()}
    if config.architecture in ARCHITECTURES:
        values["arch"] = config.architecture
    return values


def frozen_names(pattern: str, names) -> set[str]:
    """The names among `names` that --freeze `pattern` selects: comma-separated globs (fnmatch's
    `*`, `?`, `[...]`) read in order, a glob adding the names it matches, a glob after '!' taking
    them out again. A glob that matches nothing, or a pattern that freezes every parameter, is
    one line (PipelineError). The names do not depend on the vocabulary, only on the shape.

    >>> sorted(frozen_names("h.*,!h.1.*", ["wte.weight", "h.0.ln_1.weight", "h.1.ln_1.weight"]))
    ['h.0.ln_1.weight']
    """
    names = list(names)
    frozen: set[str] = set()
    for piece in (p.strip() for p in pattern.split(",")):
        if not piece:
            continue
        keep = piece.startswith("!")
        glob = piece[1:].strip() if keep else piece
        matched = set(fnmatch.filter(names, glob)) if glob else set()
        if not matched:
            example = ", ".join(names[:3])
            raise PipelineError(
                f"--freeze {glob!r} matches no parameter; the names are like {example}, ..., h.N.attn.c_attn.weight, "
                "ln_f.weight"
            )
        frozen = frozen - matched if keep else frozen | matched
    if frozen and len(frozen) == len(names):
        raise PipelineError(f"--freeze {pattern!r} freezes every parameter, so nothing would train; keep some with '!'")
    return frozen


def _field(name: str) -> dataclasses.Field:
    """TrainConfig's field `name` (its default and metadata)."""
    return TrainConfig.__dataclass_fields__[name]


def flag_of(name: str) -> str:
    """The flag of setting `name`, as messages name it: "n_kv_heads" -> "--n-kv-heads"."""
    return "--" + name.replace("_", "-")


def coerce_setting(key: str, typ: str, value: Any) -> Any:
    """`value` of setting `key` as its type `typ` ("int", "float", "bool", "str") holds it; one
    line when it is of another type (an int is a float too)."""
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
        raise PipelineError(f"{flag_of(key)} must be a finite number, got {short(value)}") from None


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
