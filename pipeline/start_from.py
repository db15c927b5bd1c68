"""A fresh run started from a model's weights (`tk train-model --init-from MODEL`): the model and
its tokenizer loaded from any tk model file or run directory, and its shape as the run's settings.

What it deliberately does not do: train (pipeline/train.py), or start the run (pipeline/start.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenkit.bpe import Tokenizer
from tokenkit.pipeline import checkpoint
from tokenkit.pipeline.config import flag_of, model_settings
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPTConfig

if TYPE_CHECKING:
    from tokenkit.pipeline.config import TrainConfig


@dataclass
class StartFrom:
    """The weights and tokenizer a fresh run starts from (`tk train-model --init-from MODEL`)."""

    path: Path
    params: dict[str, np.ndarray]
    tokenizer: Tokenizer
    model_config: GPTConfig
    hf_architecture: str | None = None  # the transformers class it was imported from, if any

    @classmethod
    def load(cls, path: str | Path) -> StartFrom:
        """From any tk model file or run directory (one `tk import-hf` wrote, too)."""
        model, tokenizer, meta = checkpoint.load_model(path)
        if not model.config.causal:
            raise PipelineError(f"{path} is a bidirectional model; train-model trains causal language models")
        return cls(Path(path), model.params, tokenizer, model.config, checkpoint.hf_architecture(meta))

    def settings(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` (the user's settings) with the model's shape, its RoPE scaling included; a given
        shape that differs is an error (an --arch too, when the model is not of that family)."""
        shape = model_settings(self.model_config)
        for key, value in given.items():
            key = key.replace("-", "_")
            if (key in shape and value != shape[key]) or (key == "arch" and "arch" not in shape):
                raise PipelineError(
                    f"{flag_of(key)} {value} contradicts the model {self.path} "
                    f"({shape.get(key, self.model_config.architecture)}); "
                    "drop the flag: --init-from takes the model's shape"
                )
        return {**given, **shape}

    def check_shape(self, config: TrainConfig) -> None:
        """One line when `config`'s model settings are not the model's shape (`settings` gives them)."""
        if GPTConfig.from_dict(config.model_config(self.model_config.vocab_size)) != self.model_config:
            raise PipelineError(
                f"the run's model settings differ from the shape of {self.path}; take them from it (StartFrom.settings)"
            )
