"""A training run's settings: `TrainConfig` (the model's shape and the optimisation) and settings files.

Every field has a flag in `tk train-model` (cli/model_commands.py) and may come from a JSON or
TOML file (`load_config_file`); values are type-checked and range-checked here, before any work.

What it deliberately does not do: run anything (pipeline/train.py does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkit.common import FileError, jsonsafe
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPTConfig

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

DEFAULT_VOCAB_SIZE = 1024  # tokenizer trained when none is given: laptop-sized, like the model defaults
MODEL_FIELDS = ("n_layers", "n_heads", "d_model", "context_length", "positional", "activation", "norm", "bias")


@dataclass
class TrainConfig:
    """Every setting of a training run: the model's shape and the optimisation.

    The defaults train the default corpus (`corpora/tiny_tales.txt`, with a 1024-token BPE) to a
    visibly learned model in about a minute on 2 cores: it learns to carry a story's hero's name
    (an induction head), steadily across seeds (the measurements behind them: BENCHMARKS.md).
    """

    # model (the vocabulary size comes from the tokenizer)
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    context_length: int = 64
    positional: str = "learned"
    activation: str = "gelu"
    norm: str = "pre"
    bias: bool = True
    # optimisation
    batch_size: int = 16
    steps: int = 2000
    lr: float = 4e-3
    min_lr: float = 4e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 turns clipping off
    # evaluation and data
    eval_interval: int = 100
    eval_batches: int = 10
    val_fraction: float = 0.1
    seed: int = 0
    # the machine: processes computing each step's batch shards, 0 = one per core. Results are
    # bit-identical for the same seed and the same count, so giving it reproduces a run elsewhere.
    workers: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """One-line PipelineError for values no run could use (the model checks its own fields too)."""
        positive = (
            "n_layers",
            "n_heads",
            "d_model",
            "context_length",
            "batch_size",
            "steps",
            "eval_interval",
            "eval_batches",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise PipelineError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise PipelineError(f"--lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise PipelineError(f"--min-lr must be between 0 and --lr ({self.lr}), got {self.min_lr}")
        for name in ("warmup_steps", "weight_decay", "grad_clip", "seed", "workers"):
            if getattr(self, name) < 0:
                raise PipelineError(f"{_flag(name)} must not be negative, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise PipelineError(f"{_flag(name)} must be in [0, 1), got {getattr(self, name)}")
        if self.warmup_steps > self.steps:
            raise PipelineError(f"--warmup-steps ({self.warmup_steps}) must not exceed --steps ({self.steps})")
        if not 0 < self.val_fraction < 1:
            raise PipelineError(f"--val-fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")

        GPTConfig.from_dict(self.model_config(vocab_size=256))  # its own one-line ModelError, before any work

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], base: TrainConfig | None = None) -> TrainConfig:
        """`base` (or the defaults) updated with `values`; keys may use '-' or '_'; types are checked."""
        merged = (base or cls()).to_dict()
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for raw_key, value in values.items():
            key = str(raw_key).replace("-", "_")
            if key not in types:
                raise PipelineError(f"unknown training setting {raw_key!r}; known: {', '.join(types)}")
            merged[key] = _coerce(key, types[key], value)
        return cls(**merged)

    @classmethod
    def from_file(cls, path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
        """Load settings from a JSON or TOML file (a flat table of the field names above)."""
        return cls.from_dict(load_config_file(path), base)

    def model_config(self, vocab_size: int) -> dict[str, Any]:
        """The GPTConfig fields for this run (dropout-free, causal)."""
        cfg = {name: getattr(self, name) for name in MODEL_FIELDS}
        cfg["vocab_size"] = vocab_size
        return cfg


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
        raise PipelineError(f"training setting {key!r} must be a {typ}, got {value!r}")
    return float(value) if typ == "float" else value


def _read_small(path: Path, limit: int = 1 << 20) -> str:
    """A settings file's text; a file over `limit` bytes is not one."""
    if path.stat().st_size > limit:
        raise PipelineError(f"config file {path} is {path.stat().st_size:,} bytes; a settings file is a few hundred")
    return path.read_text(encoding="utf-8")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The settings table of a .json or .toml file (TOML needs Python >= 3.11 or the `tomli` package)."""
    path = Path(path)
    if not path.is_file():
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
