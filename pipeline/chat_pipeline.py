"""The whole road in one call (`tk pipeline --chat`): pretraining on stories, fine-tuning on
dialogues about stories, and the held-out answer accuracy before and after.

`run_chat_pipeline(...)` runs the stages in order, each skipped when its output is present and up
to date, in one directory RUN that it locks for the whole call (`rundir.RunDir`):

    1. base      RUN/base/: `tk pipeline`'s run (tokenizer, tokens, pretraining) on the stories,
                 `run.run_pipeline` itself, with its reuse, resume and staleness rules
    2. chat      RUN/chat/: `tk train-model --chat`'s run (`chat_start.train_chat`) from
                 RUN/base's model on the dialogues; RUN/chat.json records the base model's sha256
                 and the fine-tuning's settings it started from. Kept when finished with the same
                 base, dialogues and settings, resumed when unfinished (`resume.resume_training`),
                 redone only with `overwrite` when stale
    3. accuracy  RUN/accuracy.json: the held-out answer accuracy (pipeline/chat_accuracy.py's rule,
                 greedy answers through ChatSession: pipeline/chat_answers.py) of the base model
                 (grown for the chat tokens, as fine-tuning starts from it), of the fine-tuned one,
                 and the majority baseline; kept while both models and the held-out file are the
                 same bytes

Each sub-run keeps every promise of its command: its own lock, atomic files, Ctrl-C saving a
checkpoint; running the same command again after an interrupt continues where it stopped. A stage
interrupted returns at once with `interrupted` set; the later stages wait for the next call.

What it deliberately does not do: print (it reports through `say` and its result), choose the
defaults of the flags (cli/chat_pipeline_commands.py), or run under MPI (one process: each stage
is one, and followers would need to follow two trainings).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkit.bpe.conversations import iter_conversations
from tokenkit.bpe.errors import TokenizerError
from tokenkit.common import readfile
from tokenkit.common.errors import FileError
from tokenkit.pipeline import chat_answers, chat_data, checkpoint, rundir
from tokenkit.pipeline.chat_accuracy import HeldOut, baseline, read_held_out
from tokenkit.pipeline.chat_start import train_chat
from tokenkit.pipeline.config import DEFAULT_VOCAB_SIZE, TrainConfig
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.resume import resume_training
from tokenkit.pipeline.run import run_pipeline
from tokenkit.pipeline.rundir import ACCURACY_FILE, BASE_DIR, CHAT_DIR, CHAT_STAMP
from tokenkit.pipeline.start_from import StartFrom
from tokenkit.pipeline.train import TrainResult

OWN_FILES = (CHAT_STAMP, ACCURACY_FILE)
RULE = "exact match of the key word (pipeline/chat_accuracy.py), greedy answers"
MODEL_LIMIT = 64 * readfile.GIB  # a model file hashed for the record: read in chunks, bounded


# The pretraining's defaults where they differ from TrainConfig's: a context that holds the longest
# bundled dialogue whole (259 tokens with the stories' tokenizer and the chat tokens; fine-tuning
# refuses a conversation longer than a row of context + 1), and steps that fit the whole road in
# about ten minutes on 2 cores (BENCHMARKS.md)
PRETRAIN = {"context_length": 288, "steps": 600, "eval_interval": 200, "eval_batches": 4}


def pretrain_config(given: dict[str, Any]) -> TrainConfig:
    """The pretraining's settings: PRETRAIN under the `given` ones (flags, a --config file)."""
    return TrainConfig.from_dict({**PRETRAIN, **given})


@dataclass(frozen=True)
class ChatSettings:
    """The fine-tuning's own settings; the rest (the shape) comes from the base model, and the
    batch size, evaluation batches, seed and workers from the pretraining's."""

    steps: int = 800
    lr: float = 2e-3
    warmup_steps: int = 20
    eval_interval: int = 100

    def config(self, base: StartFrom, pretrain: TrainConfig) -> TrainConfig:
        given = {
            "steps": self.steps,
            "lr": self.lr,
            "min_lr": self.lr / 10,
            "warmup_steps": min(self.warmup_steps, self.steps // 10),
            "eval_interval": min(self.eval_interval, self.steps),
            "batch_size": pretrain.batch_size,
            "eval_batches": pretrain.eval_batches,
            "seed": pretrain.seed,
            "workers": pretrain.workers,
        }
        return TrainConfig.from_dict(base.settings(given))


@dataclass
class ChatPipelineResult:
    """What each stage did (`stages`: "reused", "trained", "resumed", "measured"), the training
    sessions run (None when a stage was reused), the accuracy record (None when interrupted),
    and the held-out items (for the closing conversation)."""

    run_dir: Path
    stages: dict[str, str]
    base: TrainResult | None
    chat: TrainResult | None
    accuracy: dict[str, Any] | None
    items: list[HeldOut]

    @property
    def interrupted(self) -> TrainResult | None:
        """The training session that was interrupted, if any."""
        for result in (self.base, self.chat):
            if result is not None and result.interrupted:
                return result
        return None


def sha256_of(path: Path, what: str = "a model file") -> str:
    digest = hashlib.sha256()
    try:
        with readfile.open_regular(path, MODEL_LIMIT, what) as (f, _):
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except FileError as err:
        raise PipelineError(str(err)) from None
    return digest.hexdigest()


def _check_inputs(dialogues: str, held_out: str) -> list[HeldOut]:
    """Both files checked before anything is written, so that a mistake in them costs no
    pretraining: every dialogue line read and checked (its length in tokens waits for the
    tokenizer: the fine-tuning refuses one longer than a row), the held-out file read whole."""
    for path, flag in ((dialogues, "--dialogues"), (held_out, "--held-out")):
        if not os.path.lexists(path):
            raise PipelineError(f"{flag} {path} not found; give a JSONL file of conversations")
    try:
        n = sum(1 for _ in iter_conversations(dialogues))
    except (FileError, TokenizerError) as err:
        raise PipelineError(str(err)) from None
    if n < 2:
        raise PipelineError(f"--dialogues {dialogues} holds {n} conversation(s); fine-tuning needs at least 2")
    return read_held_out(held_out)


def run_chat_pipeline(
    corpus,
    dialogues: str | os.PathLike,
    held_out: str | os.PathLike,
    run_dir: str | os.PathLike,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    config: TrainConfig | None = None,
    chat: ChatSettings | None = None,
    max_new_tokens: int = chat_answers.ANSWER_TOKENS,
    overwrite: bool = False,
    device: str = "cpu",
    quiet: bool = False,
    say: Callable[[str], None] = lambda m: None,
) -> ChatPipelineResult:
    """The three stages of the module docstring in `run_dir`. `corpus`: the stories, as
    `run_pipeline` takes them; `config`: the pretraining's settings (the model's shape among them);
    `chat`: the fine-tuning's. The dialogues and the held-out file are checked before anything is
    written (a bad held-out line is one PipelineError naming it; a bad dialogue line is refused by
    the fine-tuning, before RUN/chat is touched). A RUN holding a plain run's files is refused."""
    dialogues, held_out = os.fspath(dialogues), os.fspath(held_out)
    config = config or TrainConfig()
    chat = chat or ChatSettings()
    items = _check_inputs(dialogues, held_out)
    with rundir.RunDir(run_dir) as rd:
        run_dir = rd.path
        plain = rd.present()
        if plain:
            raise PipelineError(
                f"{run_dir} holds a run's files ({', '.join(plain)}); tk pipeline --chat writes {BASE_DIR}/, "
                f"{CHAT_DIR}/ and {ACCURACY_FILE} in a directory of its own: choose another -o"
            )
        stages: dict[str, str] = {}
        base = run_pipeline(
            corpus, run_dir / BASE_DIR, vocab_size=vocab_size, config=config, overwrite=overwrite,
            device=device, quiet=quiet, say=say,
        )  # fmt: skip
        stages["base"] = base.stages["train"]
        result = ChatPipelineResult(run_dir, stages, base.train, None, None, items)
        if result.interrupted:
            return result
        base_path = run_dir / BASE_DIR / checkpoint.MODEL_FILE
        stages["chat"], result.chat = _chat_stage(run_dir, base_path, dialogues, config, chat, overwrite, device,
                                                  quiet, say)  # fmt: skip
        if result.interrupted:
            return result
        stages["accuracy"], result.accuracy = _accuracy_stage(run_dir, base_path, held_out, items, max_new_tokens,
                                                              device, say)  # fmt: skip
        return result


def _chat_stage(run_dir: Path, base_path: Path, dialogues: str, pretrain: TrainConfig, chat: ChatSettings,
                overwrite: bool, device: str, quiet: bool, say) -> tuple[str, TrainResult | None]:  # fmt: skip
    init = StartFrom.load(base_path)
    config = chat.config(init, pretrain)
    chat_dir = run_dir / CHAT_DIR
    stamp = {
        "base_model_sha256": sha256_of(base_path),
        "dialogues": dialogues,
        "dialogues_sha256": chat_data.file_fingerprint(dialogues),
        "train_config": config.to_dict(),
    }
    why = _chat_staleness(chat_dir, run_dir / CHAT_STAMP, stamp, config)
    if why == "finished":
        say(f"chat: up to date ({chat_dir / checkpoint.MODEL_FILE}, step {config.steps})")
        return "reused", None
    if why == "unfinished":
        return "resumed", resume_training(chat_dir, chat=dialogues, device=device, quiet=quiet, say=say)
    if why is not None:
        if not overwrite:
            raise PipelineError(
                f"{chat_dir} holds a fine-tuned model that is not up to date ({why}); pass --overwrite to "
                "fine-tune again, or choose another -o"
            )
        say(f"chat: {why} since the last run; fine-tuning again (--overwrite)")
    checkpoint.write_json(run_dir / CHAT_STAMP, stamp)  # before the run: a stopped run's stamp is its own
    say(f"chat: fine-tuning {base_path} on {dialogues}")
    spec = chat_data.ChatSpec(dialogues)
    overwrite = overwrite or why is not None
    return "trained", train_chat(spec, chat_dir, init, config, overwrite=overwrite, device=device, quiet=quiet, say=say)


def _chat_staleness(chat_dir: Path, stamp_path: Path, stamp: dict[str, Any], config: TrainConfig) -> str | None:
    """None: no fine-tuning run there yet (or one that stopped before its first checkpoint);
    "finished" or "unfinished": the same run; else why it is stale."""
    state_path = chat_dir / checkpoint.STATE_FILE
    if not state_path.exists():
        if (chat_dir / checkpoint.MODEL_FILE).exists():
            return f"{checkpoint.MODEL_FILE} has no {checkpoint.STATE_FILE} beside it to check it against"
        return None
    recorded = checkpoint.read_json(stamp_path)
    recorded = recorded if isinstance(recorded, dict) else {}
    try:
        meta = checkpoint.read_header(state_path)
        step = int(meta.get("step", -1))
        recorded_config = TrainConfig.from_dict(_loads(meta.get("train_config")))
        if config.workers == 0:  # "one per core": whatever count the run recorded
            recorded_config = dataclasses.replace(recorded_config, workers=0)
        same_config = recorded_config == config
        same_data = _loads(meta.get("data")).get("chat_fingerprint") == stamp["dialogues_sha256"]
    except (PipelineError, ValueError, TypeError, AttributeError):
        return f"its {checkpoint.STATE_FILE} cannot be read"
    if recorded.get("base_model_sha256") != stamp["base_model_sha256"]:
        return "the base model changed"
    if not same_data:
        return "the dialogues changed"
    if not same_config:
        return "the fine-tuning settings changed"
    if step == config.steps and (chat_dir / checkpoint.MODEL_FILE).exists():
        return "finished"
    return "unfinished" if 0 <= step < config.steps else f"its {checkpoint.STATE_FILE} is at step {step}"


def _loads(value: str | None) -> dict[str, Any]:
    parsed = checkpoint.loads(value, "training state metadata") if value else {}
    if not isinstance(parsed, dict):
        raise ValueError("not a JSON object")
    return parsed


def _accuracy_stage(run_dir: Path, base_path: Path, held_out: str, items: list[HeldOut], max_new_tokens: int,
                    device: str, say) -> tuple[str, dict[str, Any]]:  # fmt: skip
    chat_path = run_dir / CHAT_DIR / checkpoint.MODEL_FILE
    key = {
        "held_out": held_out,
        "held_out_sha256": sha256_of(Path(held_out), "a JSONL file of held-out conversations"),
        "base_model_sha256": sha256_of(base_path),
        "chat_model_sha256": sha256_of(chat_path),
        "max_new_tokens": max_new_tokens,
    }
    recorded = checkpoint.read_json(run_dir / ACCURACY_FILE, limit=16 * readfile.MIB)
    if isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in key.items()):
        say(f"accuracy: up to date ({run_dir / ACCURACY_FILE})")
        return "reused", recorded
    say(f"accuracy: answering {len(items)} held-out questions with the base model, then the fine-tuned one")
    model, tok = chat_answers.grown(base_path, device=device)
    before = chat_answers.score(model, tok, items, max_new_tokens)
    loaded = checkpoint.load_model(chat_path, device=device)
    after = chat_answers.score(loaded.model, loaded.tokenizer, items, max_new_tokens)
    record = {
        **key,
        "rule": RULE,
        "baseline": chat_answers.as_record(baseline(items), answers=False),
        "base": chat_answers.as_record(before),
        "chat": chat_answers.as_record(after),
    }
    checkpoint.write_json(run_dir / ACCURACY_FILE, record)
    return "measured", record
