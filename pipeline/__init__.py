"""Joins `bpe` and `transformer`: corpora to token files, training runs, checkpoints."""

from pipeline.errors import PipelineError

__all__ = ["PipelineError"]
