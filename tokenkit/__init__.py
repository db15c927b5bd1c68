"""tokenkit: a byte-level BPE tokenizer and a GPT-style transformer in NumPy, from scratch.

The public API in one place; each name lives in the subpackage that owns it:

- `tokenkit.bpe`: text <-> token ids (`Tokenizer`, `Corpus`).
- `tokenkit.transformer`: arrays in, arrays out (`GPT`, `GPTConfig`, `llama_config`, `DataParallel`, `AdamW`).
- `tokenkit.pipeline`: corpora to token files, training runs and their files.
- `tokenkit.common`: file safety and process hygiene the packages share.
- `tokenkit.cli`: the `tk` command, a thin layer over the above; `show`, `tk serve`'s page for one
  text inline in a Jupyter notebook (`tokenkit.cli.notebook`).

>>> from tokenkit import Tokenizer
>>> tok = Tokenizer.train([b"aaabdaaabac"], vocab_size=259, min_frequency=1, quiet=True)
>>> tok.decode(tok.encode("aaabdaaabac"))
'aaabdaaabac'

The repository keeps these subpackages as top-level folders (`bpe/`, `transformer/`, ...); the
build maps them under this one name (pyproject.toml's `package-dir`).
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it, `tk --version` and files record it

import importlib as _importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at tk's start; type checkers read the block
if TYPE_CHECKING:  # `show` is left out: tokenkit.cli reads this package's __version__ (tests/test_layers.py's cycle)
    from tokenkit.bpe import Corpus, Tokenizer, TokenizerError
    from tokenkit.common import FileError
    from tokenkit.pipeline import PipelineError
    from tokenkit.transformer import (
        GPT,
        AdamW,
        DataParallel,
        GPTConfig,
        ModelError,
        clip_grad_norm,
        cosine_schedule,
        llama_config,
    )

__all__ = [
    "GPT",
    "AdamW",
    "Corpus",
    "DataParallel",
    "FileError",
    "GPTConfig",
    "ModelError",
    "PipelineError",
    "Tokenizer",
    "TokenizerError",
    "__version__",
    "clip_grad_norm",
    "cosine_schedule",
    "llama_config",
    "show",
]

# Imported on first use (PEP 562), not here: every entry to `tk` imports this package first, and
# `tk` must install its signal handlers before NumPy and the rest load (see cli/main.py).
_HOMES = {
    "Corpus": "bpe",
    "Tokenizer": "bpe",
    "TokenizerError": "bpe",
    "FileError": "common",
    "PipelineError": "pipeline",
    "GPT": "transformer",
    "AdamW": "transformer",
    "DataParallel": "transformer",
    "GPTConfig": "transformer",
    "ModelError": "transformer",
    "clip_grad_norm": "transformer",
    "cosine_schedule": "transformer",
    "llama_config": "transformer",
    "show": "cli.notebook",
}
_SUBPACKAGES = frozenset({"bpe", "cli", "common", "pipeline", "transformer"})


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return _importlib.import_module(f"{__name__}.{name}")
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | _SUBPACKAGES)
