"""A GPT-style transformer in NumPy with a hand-written backward pass. Arrays in, arrays out."""

from transformer.errors import ModelError

__all__ = ["ModelError"]
