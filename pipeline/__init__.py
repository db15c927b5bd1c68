"""Joins `bpe` and `transformer`: corpora to token files, training runs, checkpoints."""

from tokenkit.pipeline.errors import PipelineError

__all__ = ["PipelineError"]
