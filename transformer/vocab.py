"""A model's vocabulary grown to a tokenizer that gained tokens: its embedding and head get rows.

When a tokenizer gains special tokens (`bpe.chat_template.add_chat_tokens` appends the chat
template's after its last id), a model trained with it must read and predict the new ids. The
rule: `grow_vocab` appends rows to the token embedding `wte.weight` (V, C) and, when the
embeddings are untied, to the head `lm_head.weight` (V, C); every existing row stays bit for bit,
so the model's outputs for the old ids are what they were (the logits gain entries for the new
ids, that is all). Each new row is the mean of the existing rows of its array: a new token then
reads, and is predicted, like an average token, so its logit starts near the others' mean instead
of at an arbitrary value that may dwarf them (Hewitt, "Initializing New Word Embeddings for
Pretrained Language Models", 2021; transformers' `resize_token_embeddings(mean_resizing=True)`
draws around the same mean). Fine-tuning then tells the new tokens apart: each occurs in its own
places. A model whose vocabulary is already large enough (padded past its tokenizer) is
returned as it is.

Bounds: the vocabulary only grows (rows of trained tokens are never dropped), up to the config's
MAX_VOCAB_SIZE, and the new arrays must fit in the memory available
(`transformer.memory.available_bytes`); each refusal is one ModelError.

What it deliberately does not do: touch the tokenizer or files, or decide when to grow (the
fine-tuning that adds tokens does: the grown model's config is what its checkpoint records).

>>> from tokenkit.transformer.config import GPTConfig
>>> from tokenkit.transformer.model import init_params
>>> config = GPTConfig(vocab_size=10, context_length=4, d_model=8, n_layers=1, n_heads=2)
>>> params, grown = grow_vocab(init_params(config), config, 12)
>>> grown.vocab_size, params["wte.weight"].shape
(12, (12, 8))
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tokenkit.transformer.config import MAX_VOCAB_SIZE, GPTConfig
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.memory import available_bytes

__all__ = ["grow_vocab", "grown_names"]


def grown_names(config: GPTConfig) -> tuple[str, ...]:
    """The parameters with a row per token: the embedding, and the head when untied."""
    return ("wte.weight",) if config.tie_embeddings else ("wte.weight", "lm_head.weight")


def grow_vocab(params: dict[str, np.ndarray], config: GPTConfig, vocab_size: int) -> tuple[dict, GPTConfig]:
    """(params, config) for `vocab_size` tokens: `grown_names`' arrays (V, C) -> (vocab_size, C),
    their first V rows the old ones exactly, each new row the mean of the old ones (in float64,
    stored in the array's dtype); every other array is the same object. `params` itself and
    `config` when vocab_size is not larger. ModelError when vocab_size is smaller (that would drop
    trained tokens), beyond MAX_VOCAB_SIZE, or the new arrays do not fit in memory."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise ModelError(f"the new vocabulary size must be an integer, got {type(vocab_size).__name__}")
    vocab_size = int(vocab_size)
    old = config.vocab_size
    if vocab_size < old:
        raise ModelError(
            f"the model has {old:,} token rows and the tokenizer {vocab_size:,} ids; a vocabulary only grows "
            "(shrinking would drop trained tokens): give the tokenizer the model was trained with, or one that "
            "appends to it"
        )
    if vocab_size > MAX_VOCAB_SIZE:
        raise ModelError(f"a vocabulary of {vocab_size:,} tokens is more than the {MAX_VOCAB_SIZE:,} a model may have")
    if vocab_size == old:
        return params, config
    names = grown_names(config)
    for name in names:
        shape = tuple(params[name].shape) if name in params else None
        if shape != (old, config.d_model):
            raise ModelError(f"parameter {name} has shape {shape}; the config says {(old, config.d_model)}")
    need = sum((vocab_size * config.d_model) * params[name].dtype.itemsize for name in names)
    free = available_bytes()
    if free is not None and need > free:
        raise ModelError(
            f"growing the vocabulary to {vocab_size:,} tokens needs {need / 2**30:.1f} GiB for the new "
            f"embedding{'s' if len(names) > 1 else ''}; {free / 2**30:.1f} GiB are free"
        )
    grown = dict(params)
    for name in names:
        rows = np.asarray(params[name])
        new = np.empty((vocab_size, rows.shape[1]), dtype=rows.dtype)
        new[:old] = rows
        new[old:] = rows.mean(axis=0, dtype=np.float64).astype(rows.dtype)
        grown[name] = new
    return grown, dataclasses.replace(config, vocab_size=vocab_size)
