"""Starting a fine-tuning run on conversations (`tk train-model --chat DATA.jsonl --init-from BASE`):
the base model's tokenizer given the chat template's tokens, the model grown to match, the
conversations read, rendered and packed, the run directory locked and its first files written.

The base's tokenizer gets the template's special tokens it lacks (`bpe.chat_template.add_chat_tokens`:
appended after its last id, every other id unchanged) and the model a row for each new id in its
embedding and untied head (`transformer.vocab.grow_vocab`: each new row the mean of the old ones).
The run's tokenizer is the grown one: its model.safetensors and train_state.safetensors hold it,
so `--resume`, `tk generate` and a later `tk chat` read the tokens the model was tuned with.

Everything is validated first (the flags, the base, the conversations, the memory) and nothing
in the run directory is replaced or removed before the run starts, as `pipeline.start.train_model`
does; a run replacing another's files writes beside them until its first checkpoint.

What it deliberately does not do: pack the conversations (pipeline/chat_data.py), train
(pipeline/train.py), or continue a run (pipeline/resume.py reads a fine-tuning run's record).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from tokenkit.bpe.chat_template import add_chat_tokens, missing
from tokenkit.bpe.jinja_template import with_template
from tokenkit.pipeline import chat_data, rundir
from tokenkit.pipeline.config import TrainConfig
from tokenkit.pipeline.join import describe_split
from tokenkit.pipeline.ranks import Ranks
from tokenkit.pipeline.start import new_run, train_fresh
from tokenkit.pipeline.start_from import StartFrom
from tokenkit.pipeline.train import TrainingRun, TrainResult
from tokenkit.pipeline.train_memory import check_training_memory
from tokenkit.transformer.vocab import grow_vocab


def with_chat_tokens(init: StartFrom) -> tuple[StartFrom, str | None]:
    """(`init` with the chat template's tokens in its tokenizer and rows for them in its model,
    the note that says so): `init` itself and None when it has them all. A tokenizer reading one
    of them as text is a TokenizerError."""
    new = missing(init.tokenizer)
    if not new:  # its own template, if it kept one, gives way to the one it now learns
        plain = with_template(init.tokenizer, None)
        if plain is init.tokenizer:
            return init, None
        note = "chat: the model has the chat tokens; its own chat template gives way to tk's, which it now learns"
        return dataclasses.replace(init, tokenizer=plain), note
    tokenizer = add_chat_tokens(init.tokenizer)
    old = init.model_config.vocab_size
    params, config = grow_vocab(init.params, init.model_config, max(old, tokenizer.vocab_size))
    ids = [tokenizer.special_tokens[name] for name in new]
    grown = (
        f"the model's {old:,} token rows grow to {config.vocab_size:,}, each new row the mean of the old ones"
        if config.vocab_size > old
        else f"the model's {old:,} token rows already cover them"
    )
    note = f"chat: the tokenizer gains {', '.join(new)} (ids {ids[0]}..{ids[-1]}); {grown}"
    return dataclasses.replace(init, params=params, tokenizer=tokenizer, model_config=config), note


def train_chat(
    spec: chat_data.ChatSpec,
    run_dir: str | Path,
    init: StartFrom,
    config: TrainConfig,
    *,
    overwrite: bool = False,
    ranks: Ranks | None = None,
    device: str = "cpu",
    quiet: bool = False,
    say: Callable[[str], None] = lambda msg: None,
) -> TrainResult:
    """Fine-tune `init` (with the chat tokens: `with_chat_tokens`) on `spec`'s conversations in
    `run_dir`. `config` must have the model's shape (`StartFrom.settings`). A directory holding
    another run's files is refused unless `overwrite`. `ranks`, `device`: as `train_model`'s."""
    init, grown = with_chat_tokens(init)
    init.check_shape(config)
    check_training_memory(config, init.model_config.vocab_size, ranks, device)
    chat = chat_data.ChatData.load(spec, init.tokenizer, config.context_length, config.val_fraction)
    with rundir.RunDir(run_dir) as rd:
        rd.replaced(rundir.TRAINED_FILES, overwrite, say)
        with new_run(rd, chat, init.tokenizer, config, init=init, ranks=ranks, device=device, quiet=quiet) as run:
            if grown is not None:  # said once everything is checked: a refusal is one line
                say(grown)
            return train_fresh(run, describe, say)


def describe(run: TrainingRun, say: Callable[[str], None]) -> None:
    """The run's summary lines: the model, the conversations, and under MPI how each batch is shared."""
    n_params = sum(int(p.size) for p in run.model.params.values())
    say(f"model: {n_params:,} parameters ({run.model.config.describe()})")
    chat: chat_data.ChatData = run.tokens
    train, val = chat.train, chat.val
    T = run.config.context_length
    held = f"--val {chat.spec.val}" if chat.spec.val is not None else "held out of the file"
    say(
        f"chat: {train.conversations:,} conversations in {len(train):,} rows of {T + 1} tokens "
        f"({int(train.counted.sum()) / (len(train) * T):.0%} of the targets count), "
        f"{val.conversations:,} validation conversations ({held}) in {len(val):,} rows; "
        f"unigram baseline {run.baseline:.3f} nats per counted token"
    )
    if run.ranks is not None:
        say(describe_split(run))
