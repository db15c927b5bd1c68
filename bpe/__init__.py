"""Byte-level BPE: text <-> token ids. Knows nothing of models, files beyond its own, or the CLI."""

from bpe.errors import TokenizerError

__all__ = ["TokenizerError"]
