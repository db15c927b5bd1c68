"""tokenkit: a byte-level BPE tokenizer and a GPT-style transformer in NumPy, from scratch.

The public API in one place; each name lives in the subpackage that owns it:

- `tokenkit.bpe`: text <-> token ids (`Tokenizer`, `Corpus`).
- `tokenkit.transformer`: arrays in, arrays out (`GPT`, `GPTConfig`, `DataParallel`, `AdamW`).
- `tokenkit.pipeline`: corpora to token files, training runs and their files.
- `tokenkit.common`: file safety and process hygiene the packages share.
- `tokenkit.cli`: the `tk` command, a thin layer over the above.

>>> from tokenkit import Tokenizer
>>> tok = Tokenizer.train([b"aaabdaaabac"], vocab_size=259, min_frequency=1, quiet=True)
>>> tok.decode(tok.encode("aaabdaaabac"))
'aaabdaaabac'

The repository keeps these subpackages as top-level folders (`bpe/`, `transformer/`, ...); the
build maps them under this one name (pyproject.toml's `package-dir`).
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it, `tk --version` and files record it

from tokenkit.bpe import Corpus, Tokenizer, TokenizerError
from tokenkit.common import FileError
from tokenkit.pipeline import PipelineError
from tokenkit.transformer import GPT, AdamW, DataParallel, GPTConfig, ModelError, clip_grad_norm, cosine_schedule

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
]
