"""`tk info`: what a tokenizer, model or training-state file (or a run directory) holds, one
`key: value` row a line.

Which kind of file it is comes from its header's format tag; the rows come from the file's own
metadata, as `pipeline.checkpoint` reads it. A run's corpus is shown with the flags that read it,
so that it can be read again the same way.

What it deliberately does not do: check that a model still matches its corpus, or print weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

# the pipeline's heavy modules (NumPy, the codec) are imported by each function that reads a file,
# so that `tk info --help` does not wait for them (tests/test_cli_main.py)
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.names import SPECIAL_FLAGS
from tokenkit.transformer import GPTConfig


@click.command("info")
@click.argument("file", type=click.Path(path_type=Path))
def info_command(file) -> int:
    """What a tokenizer, model or training-state file (or a run directory) holds.

    \b
    Example:
      tk info runs/demo/model.safetensors
    """
    from tokenkit.pipeline import checkpoint

    path = checkpoint.resolve_model_path(file) if Path(file).is_dir() else Path(file)
    meta = checkpoint.read_header(path)
    fmt = meta.get("format")
    if fmt == checkpoint.TOKENIZER_FORMAT:
        _info_tokenizer(path, meta)
    elif fmt == checkpoint.MODEL_FORMAT:
        _info_model(path)
    elif fmt == checkpoint.STATE_FORMAT:
        _info_state(path)
    else:
        found = f"format {fmt!r}" if fmt else "no tokenkit format tag"
        raise PipelineError(f"{path} is not a tokenkit tokenizer, model or training-state file ({found})")
    return 0


def _row(key: str, value: Any) -> None:
    click.echo(f"{key + ':':<22}{value}")


def _info_tokenizer(path: Path, meta: dict[str, str]) -> None:
    from tokenkit.pipeline.checkpoint import load_tokenizer

    tok = load_tokenizer(path)
    _row("file", path)
    _row("format", f"{meta.get('format')} v{meta.get('format_version')} (tokenizer)")
    n_special = len(tok.special_tokens)
    parts = (
        f"{tok.vocab_size - n_special} tokens listed, {len(tok.merges)} merges, {n_special} special"
        if tok.listed
        else f"256 bytes + {len(tok.merges)} merges + {n_special} special"
    )
    _row("vocab size", f"{tok.vocab_size} ({parts})")
    _row("pattern", tok.pattern)
    _row("special tokens", json.dumps(tok.special_tokens, ensure_ascii=False) if tok.special_tokens else "none")
    if tok.bos is not None:
        _row("bos", f"{tok.bos} (before every text a model reads)")
    _row("fingerprint", tok.fingerprint())
    _chat_row(tok)
    for key in sorted(meta):
        if key == "training":
            _training_rows(tok.training)
        elif key not in ("format", "format_version", "pattern", "pattern_regex", "special_tokens"):
            _row(key, meta[key])


def _training_rows(training: dict[str, Any]) -> None:
    """How the tokenizer was made, its merge counts summed up (1,024 numbers are not a row)."""
    counts = training.pop("merge_counts", None)
    training.pop("chat_template", None)  # its own row (`_chat_row`)
    _row("training", json.dumps(training, ensure_ascii=False, sort_keys=True))
    if isinstance(counts, list) and counts:
        _row("merge counts", f"recorded for the first {len(counts):,} merges ({counts[0]:,} down to {counts[-1]:,})")


def _chat_row(tok) -> None:
    """The chat template the tokenizer chats in (docs/chat.md): its own Jinja one, kept from an
    import, or tk's, when it has tk's tokens; no row for neither."""
    from tokenkit.bpe.jinja_template import template_of
    from tokenkit.bpe.template_ids import template_name

    kind = template_name(tok)
    if kind == "jinja":
        template = template_of(tok)
        origin = f", from {template.origin}" if template.origin else ""
        _row("chat template", f"its own, {len(template.source):,} characters of Jinja{origin}")
    elif kind == "tk":
        _row("chat template", "tk's (<|system|>, <|user|>, <|assistant|>, <|end|>)")


def _info_model(path: Path) -> None:
    from tokenkit.pipeline import checkpoint

    described = checkpoint.describe_model(path, tokenizer_required=False)  # the header: no weight is read
    config, tok, meta = described.config, described.tokenizer, described.metadata
    _row("file", path)
    what = "model + embedded tokenizer" if tok is not None else "model; no tokenizer embedded"
    _row("format", f"{meta.get('format')} v{meta.get('format_version')} ({what})")
    _row("architecture", config.architecture)
    _row("config", json.dumps(config.to_dict()))
    if config.rope_scaling is not None:
        _row("rope scaling", config.rope_scaling.describe())
    _row("parameters", f"{described.n_params:,}")
    if tok is not None:
        padding = config.vocab_size - tok.vocab_size
        padded = f", and {padding:,} padding ids" if padding > 0 else ""
        _row(
            "vocab size",
            f"{config.vocab_size} (tokenizer {meta.get('tokenizer_fingerprint', '')[:16]}...{padded})",
        )
        if tok.bos is not None:
            _row("bos", f"{tok.bos} (before every text the model reads)")
        _chat_row(tok)
    prov = meta.get("provenance") or {}
    if "step" in meta and not (isinstance(prov, dict) and "imported_from" in prov):
        _row("training step", meta.get("step"))
    val = meta.get("val_loss")
    if val is not None:
        _row("validation loss", f"{val:.4f}" if isinstance(val, float) else val)
    if isinstance(prov, dict):
        base = prov.get("unigram_baseline")
        if isinstance(base, float):
            _row("unigram baseline", f"{base:.4f}")
        if "corpus" in prov or "chat" in prov:  # what it trained on: a corpus, or conversations
            _corpus_rows(prov)
        labels = {
            "corpus_sha256": "corpus sha256",
            "corpus_fingerprint": "corpus fingerprint",
            "val_fingerprint": "val fingerprint",
            "n_train_tokens": "train tokens",
            "tokenkit": "written by tokenkit",
            "imported_from": "imported from",
            "init_from": "initialised from",
        }
        for key, label in labels.items():
            if key in prov:
                _row(label, f"{prov[key]:,}" if isinstance(prov[key], int) else prov[key])
        if "train_config" in prov:
            _fine_tuning_row(prov["train_config"])
            _row("training config", json.dumps(prov["train_config"]))


def _fine_tuning_row(train_config: Any) -> None:
    """The fine-tuning flags a run trained with (--dropout, --grad-accum, --freeze), when any is
    not at its default: one row, as the flags are spelt."""
    if not isinstance(train_config, dict):
        return
    shown = []
    if train_config.get("dropout"):
        shown.append(f"--dropout {train_config['dropout']}")
    if train_config.get("grad_accum", 1) != 1:
        shown.append(f"--grad-accum {train_config['grad_accum']}")
    if train_config.get("freeze"):
        shown.append(f"--freeze {train_config['freeze']!r}")
    if shown:
        _row("fine-tuning", " ".join(shown))


def _corpus_rows(record: dict[str, Any], sizes: str = "") -> None:
    """The corpus a run recorded: its inputs and the flags that read them, and its --val."""
    from tokenkit.pipeline import chat_data
    from tokenkit.pipeline.sources import CorpusSpec

    if chat_data.CHAT_KEY in record:  # a run fine-tuned on conversations (train-model --chat)
        chat = chat_data.spec_from_record(record, "the run")
        _row("conversations", chat.describe() + sizes)
        _row("val conversations", chat.describe(val=True) or "the last share of the conversations")
        return
    try:
        spec = CorpusSpec.from_record(record)
    except PipelineError:
        _row("corpus", record.get("corpus"))
        return
    flags = [
        f"--glob {spec.glob!r}" if spec.glob is not None else "",
        f"--text-field {spec.text_field}" if spec.text_field else "",
        "--binary" if spec.binary else "",
        f"--eot {spec.eot!r}" if spec.eot is not None else "",
        SPECIAL_FLAGS[spec.specials] if spec.specials != "refuse" else "",
    ]
    flags = [f for f in flags if f]
    _row("corpus", spec.describe() + (f" ({', '.join(flags)})" if flags else "") + sizes)
    if spec.val:
        _row("val corpus", spec.describe(val=True))


def _info_state(path: Path) -> None:
    from tokenkit.pipeline import checkpoint, train_state

    state = train_state.describe_train_state(path)  # the header: no tensor is read
    _row("file", path)
    _row("format", f"{checkpoint.STATE_FORMAT} v{checkpoint.FORMAT_VERSION} (state for --resume)")
    _row("training step", f"{state.step} of {state.train_config.get('steps')}")
    best = f"{state.best_val_loss:.4f} at step {state.best_step}" if state.best_val_loss is not None else "none yet"
    _row("best val loss", best)
    _row("config", json.dumps(state.model_config))
    scaling = GPTConfig.from_dict(state.model_config).rope_scaling
    if scaling is not None:
        _row("rope scaling", scaling.describe())
    _row("parameters", f"{state.n_params:,}")
    _corpus_rows(state.data, f" ({state.data.get('n_train')} train / {state.data.get('n_val')} val tokens)")
    _fine_tuning_row(state.train_config)
    _row("training config", json.dumps(state.train_config))


COMMANDS = (info_command,)
