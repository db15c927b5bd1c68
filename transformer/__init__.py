"""A GPT-style transformer in NumPy with a hand-written backward pass. Arrays in, arrays out."""

from tokenkit.common.lazy import lazy_names

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; type checkers read the block
if TYPE_CHECKING:
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

# imported on first use (common/lazy.py): `tk --help` must not wait for NumPy
_HOMES = {
    "GPT": "model",
    "GPTConfig": "config",
    "DataParallel": "parallel",
    "ModelError": "errors",
    "AdamW": "optim",
    "clip_grad_norm": "optim",
    "cosine_schedule": "optim",
    "llama_config": "config",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
