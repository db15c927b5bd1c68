"""A GPT-style transformer in NumPy with a hand-written backward pass. Arrays in, arrays out."""

from transformer.config import GPTConfig
from transformer.errors import ModelError
from transformer.model import GPT
from transformer.optim import AdamW, clip_grad_norm, cosine_schedule
from transformer.parallel import DataParallel

__all__ = ["GPT", "GPTConfig", "DataParallel", "ModelError", "AdamW", "clip_grad_norm", "cosine_schedule"]
