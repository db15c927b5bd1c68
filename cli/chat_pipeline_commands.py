"""`tk pipeline --chat`: the flags the whole road adds to `tk pipeline`, and what it prints.

`chat_options` declares --chat, --dialogues, --held-out, --chat-steps and --chat-lr on the
pipeline command; `take(kwargs, corpus)` pops them from its keyword arguments (refusing the
chat-only ones without --chat); `run(...)` calls `pipeline.chat_pipeline.run_chat_pipeline` and
prints each training's summary, the held-out accuracy beside the base model's and the majority
baseline, and the closing conversation about a held-out story. Notes go to stderr, the results to
stdout.

What it deliberately does not do: the stages (pipeline/chat_pipeline.py), the answers and their
accuracy (pipeline/chat_answers.py), or the plain `tk pipeline` (cli/train_commands.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tokenkit.cli.options import path_option
from tokenkit.cli.params import Number
from tokenkit.pipeline.config import MAX_STEPS, Range

STORIES = Path("corpora/tiny_tales.txt")
DIALOGUES = Path("corpora/tiny_dialogues.jsonl")
HELD_OUT = Path("corpora/tiny_dialogues_test.jsonl")
_CHAT_ONLY = {
    "dialogues": "--dialogues",
    "held_out": "--held-out",
    "chat_steps": "--chat-steps",
    "chat_lr": "--chat-lr",
}


def chat_options(func):
    """The road's flags (default: unset; `run` fills them in)."""
    options = [
        click.option(
            "--chat",
            "chat",
            is_flag=True,
            help=f"the whole road: pretrain on CORPUS (default {STORIES}; the training flags are the "
            "pretraining's, with --context-length 288 and --steps 600 unless given), fine-tune on --dialogues, "
            "report the held-out answer accuracy before and after, and end with a conversation",
        ),
        path_option(
            "--dialogues",
            metavar="FILE.jsonl",
            help=f"with --chat: the conversations to fine-tune on [default: {DIALOGUES}]",
        ),
        path_option(
            "--held-out",
            metavar="FILE.jsonl",
            help=f"with --chat: held-out conversations with kind, key and choices, scored [default: {HELD_OUT}]",
        ),
        click.option(
            "--chat-steps",
            type=Number(int, Range(1, MAX_STEPS)),
            help="with --chat: fine-tuning steps [default: 800]",
        ),
        click.option(
            "--chat-lr",
            type=Number(float, Range(0, 1, low_open=True)),
            help="with --chat: the fine-tuning's peak learning rate [default: 0.002]",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def take(kwargs: dict[str, Any], corpus) -> dict[str, Any] | None:
    """The road's flags popped from `kwargs`: None without --chat (a chat-only flag then refused,
    and a missing CORPUS too), else {name: value} with the defaults filled in."""
    chat = kwargs.pop("chat", False)
    values = {name: kwargs.pop(name, None) for name in _CHAT_ONLY}
    if not chat:
        for name, flag in _CHAT_ONLY.items():
            if values[name] is not None:
                raise click.UsageError(f"{flag} belongs to the whole road: add --chat, or drop {flag}")
        if not corpus:
            raise click.UsageError("missing CORPUS (the text to train on; with --chat it defaults to the stories)")
        return None
    from tokenkit.pipeline.chat_pipeline import ChatSettings

    defaults = ChatSettings()
    values["dialogues"] = values["dialogues"] or DIALOGUES
    values["held_out"] = values["held_out"] or HELD_OUT
    values["chat_steps"] = values["chat_steps"] or defaults.steps
    values["chat_lr"] = values["chat_lr"] or defaults.lr
    return values


def _default_there(path: Path, flag: str) -> None:
    if not path.exists():
        raise click.UsageError(
            f"{path} not found: the default is read from tk's source checkout; run from there, or give {flag}"
        )


def run(ranks, corpus, run_dir: Path, road: dict[str, Any], given: dict[str, Any], *, vocab_size: int, prompt,
        max_new_tokens, overwrite: bool, quiet: bool, device: str, spec) -> int:  # fmt: skip
    """`tk pipeline --chat`: the stages, then the report. `spec(corpus)` opens the stories as
    the pipeline's flags read them; `given` are the training flags (the pretraining's)."""
    from tokenkit.cli.notes import notes
    from tokenkit.cli.train_commands import _summary
    from tokenkit.pipeline.chat_answers import ANSWER_TOKENS, conversation, pick_story
    from tokenkit.pipeline.chat_pipeline import CHAT_DIR, ChatSettings, pretrain_config, run_chat_pipeline
    from tokenkit.pipeline.checkpoint import MODEL_FILE, load_model

    if ranks is not None:
        raise click.UsageError("--chat runs in one process (two trainings and the answers): drop mpirun")
    if prompt is not None:
        raise click.UsageError(
            "--prompt samples a story; --chat ends with a conversation about a held-out one: drop it"
        )
    if not corpus:
        _default_there(STORIES, "CORPUS")
        corpus = (STORIES,)
    for name, flag, default in (("dialogues", "--dialogues", DIALOGUES), ("held_out", "--held-out", HELD_OUT)):
        if road[name] == default:
            _default_there(default, flag)
    settings = ChatSettings(steps=road["chat_steps"], lr=road["chat_lr"])
    answer_tokens = max_new_tokens if max_new_tokens is not None else ANSWER_TOKENS
    result = run_chat_pipeline(
        spec(corpus), road["dialogues"], road["held_out"], run_dir, vocab_size=vocab_size,
        config=pretrain_config(given), chat=settings, max_new_tokens=answer_tokens, overwrite=overwrite,
        device=device, quiet=quiet, say=notes(quiet),
    )  # fmt: skip
    for what, session in (("pretraining", result.base), ("fine-tuning", result.chat)):
        if session is not None:
            click.echo(f"{what}:")
            _summary(session)
    stopped = result.interrupted
    if stopped is not None:
        click.echo(
            f"interrupted at step {stopped.step}/{stopped.steps}; state saved in {stopped.run_dir}; continue with "
            "the same command (tk pipeline --chat ... -o RUN_DIR)",
            err=True,
        )
        return 130
    acc = result.accuracy
    click.echo(
        f"\nheld-out accuracy on {acc['held_out']} ({acc['chat']['total']} questions, exact match of the key word, "
        "greedy answers):"
    )
    order = dict.fromkeys(item.kind for item in result.items)  # as the file asks them (the JSON sorts its keys)
    for label, key in (("majority baseline", "baseline"), ("base model", "base"), ("fine-tuned", "chat")):
        part = acc[key]
        kinds = ", ".join(f"{kind} {part['by_kind'][kind][0]}/{part['by_kind'][kind][1]}" for kind in order)
        click.echo(f"  {label:<18} {100 * part['fraction']:5.1f}%  ({part['right']} of {part['total']}: {kinds})")
    click.echo(f"accuracy: {result.run_dir / 'accuracy.json'}")
    item = pick_story(result.items)
    model, tok, _ = load_model(result.run_dir / CHAT_DIR / MODEL_FILE, device=device)
    click.echo(f"\na conversation about a held-out story ({acc['held_out']} line {item.line}; greedy):")
    for role, text, stop in conversation(model, tok, item, answer_tokens):
        click.echo(f"{role}: {text}" + (f"  [stopped: {stop}]" if stop not in ("", "end") else ""))
    click.echo(f"\nchat with it: tk chat -m {result.run_dir / CHAT_DIR}")
    return 0
