"""Continuing a run where its train_state.safetensors left off (`tk train-model --resume`),
after checking that it is the same run: the settings given, the tokenizer and the corpus
(fingerprints, eot token, special-token policy, a kept stream's copy) against the checkpoint's,
each difference one line saying which flag to drop. A fine-tuning run on conversations reads its
conversations again and checks their fingerprints (`_resumed_chat`).

What it deliberately does not do: train (pipeline/train.py), or restore the state itself
(`TrainingRun` loads the checkpoint's weights, moments and generator).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tokenkit.pipeline import chat_data, checkpoint, data, names, rundir, sources, train_state, trainlog
from tokenkit.pipeline.config import TrainConfig, coerce_setting, flag_of
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.join import describe_split, train_joined
from tokenkit.pipeline.ranks import Ranks
from tokenkit.pipeline.start import refuse_streams_under_mpi
from tokenkit.pipeline.train import TrainingRun, TrainResult
from tokenkit.transformer.backends import get_backend


def resume_training(
    run_dir: str | Path,
    *,
    corpus=None,
    tokenizer=None,
    overrides: Mapping[str, Any] | None = None,
    corpus_overrides: Mapping[str, Any] | None = None,
    chat: str | os.PathLike | None = None,
    ranks: Ranks | None = None,
    device: str = "cpu",
    quiet: bool = False,
    say: Callable[[str], None] = lambda msg: None,
) -> TrainResult:
    """Continue the run in `run_dir` exactly where its train_state.safetensors left off.

    `overrides` are settings the user gave explicitly: any that differs from the checkpoint's is a
    one-line error (a resumed run must be the same run). The corpus is the recorded one
    (`sources.CorpusSpec`; a v1 run's one file; a stream's copy kept in `run_dir`), with `corpus`
    (paths: other inputs; a CorpusSpec or RunCorpus: all of it) or `corpus_overrides` (CorpusSpec
    fields the user gave, e.g. a moved --val) in its place; it must have the recorded fingerprints,
    eot token and special-token policy (`CorpusSpec.specials`), and a given `tokenizer` the run's
    fingerprint. A stream given in its place is copied into `run_dir` as a fresh run's is, and
    checked the same way. The run uses the worker count recorded in the checkpoint, so it continues
    bit for bit on any core count, and on any number of MPI `ranks` that divides it (with or
    without MPI before). On another `device` it continues numerically close, not bit-identical.
    A fine-tuning run (`tk train-model --chat`) reads its recorded conversations again, or `chat`
    (and a --val in `corpus_overrides`) in their place, which must be the same files' contents.
    """
    get_backend(device)  # a missing GPU is one line before anything is read
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PipelineError(f"run directory not found: {run_dir}")
    with rundir.RunDir(run_dir) as rd:
        state_path = run_dir / checkpoint.STATE_FILE
        stopped = rd.stopped_first_run()
        if stopped is not None:
            command = "tk pipeline" if rd.present([checkpoint.PIPELINE_FILE]) else "train-model"
            raise PipelineError(
                f"{run_dir} has no checkpoint yet (its first run stopped {stopped + ', ' if stopped else ''}before its "
                f"first checkpoint); run the same {command} command again without --resume"
            )
        if not state_path.exists():
            raise PipelineError(
                f"nothing to resume in {run_dir}: no {checkpoint.STATE_FILE}; start a run with `tk train-model`"
            )
        state = train_state.load_train_state(state_path)
        try:
            config = TrainConfig.from_dict(state.train_config)
        except PipelineError as err:  # no run records these: the file is damaged
            raise PipelineError(f"{state_path}: its recorded settings are not a run's ({err}); it is corrupt") from None
        for key, value in (overrides or {}).items():
            key = key.replace("-", "_")
            old = getattr(config, key)
            if key == "workers" and value == 0:
                continue  # "one per core" means the count the run recorded
            if coerce_setting(key, type(old).__name__, value) != old:
                raise PipelineError(
                    f"{flag_of(key)} {value} contradicts the checkpoint in {run_dir} ({old}); drop the flag to resume, "
                    "or start a new run with another -o"
                )
        if tokenizer is not None and tokenizer.fingerprint() != state.tokenizer.fingerprint():
            raise PipelineError(
                f"the given tokenizer is not the one {run_dir} was trained with; drop -t to use the run's own"
            )
        if chat_data.CHAT_KEY in state.data:  # a fine-tuning run: its conversations, read and packed again
            tokens = _resumed_chat(run_dir, state, config, chat, corpus, corpus_overrides)
        else:
            if chat is not None:
                raise PipelineError(f"{run_dir} trains on a corpus, not on conversations; drop --chat to resume")
            rc = _resumed_corpus(run_dir, state, corpus, corpus_overrides, ranks, say)
            try:
                tokens = data.prepare_tokens(rc, state.tokenizer, run_dir, quiet=quiet, commit=False)
            finally:
                rc.discard()  # copies of streams are still the corpus's only when this failed
        try:
            run = TrainingRun(
                run_dir,
                tokens,
                state.tokenizer,
                config,
                quiet=quiet,
                state=state,
                ranks=ranks,
                device=device,
                vocab_size=state.model_config.get("vocab_size"),
            )
            data.commit_tokens(tokens, run_dir)
        except BaseException:
            tokens.discard()
            raise
        if state.step >= config.steps:
            say(f"{run_dir} already finished its {config.steps} steps; nothing to resume")
            return run.result(time.perf_counter(), 0.0, 0, interrupted=False)
        say(f"resuming {run_dir} at step {state.step} of {config.steps}")
        if ranks is not None:
            say(describe_split(run))
        # records past the checkpoint we continue from go, and so does damage (said in one line)
        note = trainlog.truncate_log(run_dir / checkpoint.LOG_FILE, state.step)
        if note is not None:
            say(note)
        return train_joined(run)


def _resumed_corpus(run_dir: Path, state: train_state.TrainState, corpus, overrides, ranks, say) -> sources.RunCorpus:
    """The corpus a resumed run reads: the recorded one, or what the caller gave in its place,
    checked against the recorded fingerprints (one line when it is not the same corpus). A
    stream given in its place is copied into the run directory first (pending until the run
    commits its tokens)."""
    recorded = sources.CorpusSpec.from_record(state.data, str(run_dir / checkpoint.STATE_FILE)).kept_in(run_dir)
    key = data.record_key(state.data)
    if isinstance(corpus, sources.RunCorpus):
        rc = corpus
    else:
        spec = corpus if isinstance(corpus, sources.CorpusSpec) else recorded
        changes = dict(overrides or {})
        if corpus is not None and not isinstance(corpus, sources.CorpusSpec):
            changes["inputs"] = sources.CorpusSpec.of(corpus).inputs
        changes = {k: tuple(os.fspath(p) for p in v) if k in ("inputs", "val") else v for k, v in changes.items()}
        spec = dataclasses.replace(spec, **changes)
        if spec.eot != key["eot"]:
            shown = {None: "none"}
            raise PipelineError(
                f"--eot {shown.get(spec.eot, repr(spec.eot))} contradicts the checkpoint in {run_dir} "
                f"({shown.get(key['eot'], repr(key['eot']))}); drop the flag to resume"
            )
        if spec.val and key["val_fingerprint"] is None:
            raise PipelineError(
                f"{run_dir} was validated on a held-out part of its corpus, not on --val; drop --val to resume"
            )
        _check_kept_streams(spec, run_dir)
        rc = spec.open(warn=lambda msg: say(f"warning: {msg}"))
    # the run's tokens keep the policy they were encoded with (or serve any: data.same_ids)
    if not data.same_ids({"specials": key["specials"]}, {"specials": rc.spec.specials}):
        flags = names.SPECIAL_FLAGS
        raise PipelineError(
            f"{flags[rc.spec.specials]} contradicts the checkpoint in {run_dir} (its corpus was encoded with "
            f"{flags.get(key['specials'], repr(key['specials']))}); drop the flag to resume"
        )
    refuse_streams_under_mpi(rc.spec, ranks)
    rc = sources.store_streams(rc, run_dir, say)
    try:
        if rc.fingerprint() != key["corpus_fingerprint"]:
            raise PipelineError(
                f"corpus {rc.spec.describe()} is not the one {run_dir} was trained on (its contents changed); "
                "resume needs the same corpus"
            )
        if rc.val_fingerprint() != key["val_fingerprint"]:
            raise PipelineError(
                f"validation corpus {rc.spec.describe(val=True) or '(none)'} is not the one {run_dir} was validated on "
                f"({recorded.describe(val=True) or 'a held-out part of its corpus'}); resume needs the same --val"
            )
    except BaseException:
        rc.discard()
        raise
    return rc


def _resumed_chat(run_dir: Path, state, config: TrainConfig, chat, corpus, overrides) -> chat_data.ChatData:
    """The conversations a resumed fine-tuning run reads: the recorded files, or `chat` (and
    overrides' "val") in their place, packed again and checked against the recorded fingerprints."""
    where = str(run_dir / checkpoint.STATE_FILE)
    spec = chat_data.spec_from_record(state.data, where)
    extra = sorted(set(overrides or {}) - {"val"}) + (["inputs"] if corpus else [])
    if extra:
        flag = "CORPUS" if "inputs" in extra else flag_of(extra[0])
        raise PipelineError(f"{run_dir} fine-tunes on conversations; drop {flag} to resume (--chat FILE names them)")
    val = (overrides or {}).get("val")
    if val and spec.val is None:
        raise PipelineError(
            f"{run_dir} was validated on a held-out part of its conversations, not on --val; drop --val to resume"
        )
    spec = chat_data.ChatSpec(
        os.fspath(chat) if chat is not None else spec.path, os.fspath(val[0]) if val else spec.val
    )
    for path, flag in ((spec.path, "--chat"), (spec.val, "--val")):
        if path is not None and not os.path.lexists(path):
            raise PipelineError(
                f"{path} is missing: {run_dir} fine-tunes on it; give it again: tk train-model --resume {run_dir} "
                f"{flag} FILE"
            )
    tokens = chat_data.ChatData.load(spec, state.tokenizer, config.context_length, config.val_fraction)
    key = {k: state.data.get(k) for k in tokens.key()}
    for name, path, what in (("chat_fingerprint", spec.path, "conversations"), ("val_fingerprint", spec.val, "--val")):
        if tokens.key()[name] != key[name]:
            raise PipelineError(
                f"{what} {path} {'are' if what == 'conversations' else 'is'} not what {run_dir} was fine-tuned on "
                "(its contents changed); resume needs the same file"
            )
    return tokens


def _check_kept_streams(spec: sources.CorpusSpec, run_dir: Path) -> None:
    """One line when the copy of a stream that a run kept as its corpus is gone: give it again."""
    for path, origin in spec.to_dict().get("streams", {}).items():
        if not os.path.lexists(path):
            flag = "--val " if path in spec.val else ""
            raise PipelineError(
                f"{path} is missing: {run_dir} kept its {'validation ' if flag else ''}corpus ({origin}) there; "
                "give the same corpus again in its place: "
                f"tk train-model --resume {run_dir} {flag}FILE (or {flag}- to pipe it in)"
            )
