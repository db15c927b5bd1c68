"""A GPT-style transformer in NumPy with a hand-written backward pass. Arrays in, arrays out."""

from tokenkit.transformer.config import GPTConfig, llama_config
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.model import GPT
from tokenkit.transformer.optim import AdamW, clip_grad_norm, cosine_schedule
from tokenkit.transformer.parallel import DataParallel

__all__ = [
    "GPT",
    "GPTConfig",
    "DataParallel",
    "ModelError",
    "AdamW",
    "clip_grad_norm",
    "cosine_schedule",
    "llama_config",
]
