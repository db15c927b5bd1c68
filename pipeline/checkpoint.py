"""Every file the pipeline writes, and the checks made when reading them back.

A run directory holds:

    tokenizer.safetensors    the tokenizer (when the pipeline trained it)
    pipeline.json            what `tk pipeline` trained that tokenizer on (its up-to-date check)
    tokens.npy, tokens.json  the corpus encoded once, and what it was encoded from (the cache key)
    val_tokens.npy           the validation corpus (`--val`) encoded once, recorded in tokens.json too
    corpus.stream            a corpus given as stdin (-) or a pipe, kept as it came (val.stream for
                             --val; corpus.2.stream, ... for more streams): the run's corpus from then on
    model.safetensors        weights with the best validation loss + the tokenizer under `tokenizer.*`
                             + metadata: ONE file is enough to predict
    train_state.safetensors  the last step's full state (weights, AdamW moments, data generator)
                             for an exact `--resume` (written and read by pipeline/train_state.py)
    log.jsonl                one JSON object per training step and per evaluation
    eval.json                what `tk eval -m RUN_DIR` measured, one entry per corpus (pipeline/eval_record.py)
    .tk-new-run/             a fresh run's files while they would replace another run's, until its
                             first checkpoint moves them in (`pipeline.rundir.NewRun`)

Writes go through the one atomic writer, `common.atomic` (temp file beside the target, fsync,
rename, fsync of the directory; mode 0o666 under the umask): a crash or Ctrl-C at any moment
leaves either the old file or the new one, never half of one, and a SIGKILL leaves only a temp
name that the next run removes once it holds the directory's lock (`pipeline.rundir`). The model
file is `transformer.io`'s one model format, with the tokenizer embedded; identical runs write
byte-identical model, state and tokenizer files (sorted metadata, no timestamps: those live in
log.jsonl, which pipeline/trainlog.py appends and reads). A model file is read for what is asked
of it, from one open file: `describe_model` its header and embedded tokenizer (`tk info`, `-t
MODEL`), `load_model` the weights too, mapped rather than copied, once the header's config is
known to fit the memory available. This module does not decide *when* to save; `pipeline.train`
does.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.common import FileError, atomic, jsonsafe, readfile, safetensors_file
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPTConfig, ModelError
from tokenkit.transformer import io as model_io

MODEL_FORMAT = model_io.FORMAT
STATE_FORMAT = "tokenkit.train_state"
FORMAT_VERSION = "1"
TOKENIZER_PREFIX = "tokenizer."
TOKENIZER_FORMAT = "tokenkit.bpe"  # the format tag bpe/io.py writes into tokenizer.safetensors

MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.safetensors"
TOKENIZER_FILE = "tokenizer.safetensors"
TOKENS_FILE = "tokens.npy"
VAL_TOKENS_FILE = "val_tokens.npy"
TOKENS_META_FILE = "tokens.json"
LOG_FILE = "log.jsonl"
# a model's provenance (and a run's train state) key: the transformers class `tk import-hf` read the
# weights from, kept through fine-tuning; export-hf writes that class again (Qwen2ForCausalLM)
HF_ARCHITECTURE = "hf_architecture"
PIPELINE_FILE = "pipeline.json"
EVAL_FILE = "eval.json"
CORPUS_STREAM_FILE = "corpus.stream"
VAL_STREAM_FILE = "val.stream"
STAGED_DIR = ".tk-new-run"


# --- atomic writes ---------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; when the block succeeds, it becomes `path` atomically
    (`common.atomic.atomic_path`; a failed write is a one-line PipelineError)."""
    try:
        with atomic.atomic_path(path) as tmp:
            yield tmp
    except FileError as err:
        raise PipelineError(str(err)) from None


def write_bytes(path: str | os.PathLike, data) -> None:
    """Write bytes (or what a function writes into the open file) atomically; PipelineError on failure."""
    try:
        atomic.write_atomic(path, data)
    except FileError as err:
        raise PipelineError(str(err)) from None


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a UTF-8 text file atomically."""
    write_bytes(path, text.encode("utf-8"))


def json_bytes(obj: Any) -> bytes:
    """`obj` as the indented, key-sorted JSON every JSON file of tk holds."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON atomically."""
    write_bytes(path, json_bytes(obj))


def read_json(path: str | os.PathLike, limit: int = 1 << 20) -> Any:
    """A small JSON file of the run (pipeline.json, tokens.json), or None when it is missing, too
    big, not a regular file or damaged: callers treat that as 'no cache' and redo the stage."""
    try:
        return jsonsafe.loads(readfile.read_bytes(path, limit, "a small JSON file"), str(path))
    except FileError:
        return None


def loads(text: str, what: str) -> Any:
    """JSON from a file's metadata, nesting bounded; one-line PipelineError when it is not."""
    try:
        return jsonsafe.loads(text, what)
    except FileError as err:
        raise PipelineError(str(err)) from None


def remove_stale_temps(run_dir: str | os.PathLike) -> list[Path]:
    """Delete temp files of writers that died mid-write (only our own temp names)."""
    return atomic.remove_stale_temps(run_dir)


def _save_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    write_bytes(path, lambda f: safetensors_file.write(f, tensors, metadata))


# --- reading safetensors headers safely -------------------------------------------------------


_WHAT_FILE = {  # read_header's `what` -> what a path that is not a regular file should have been
    "file": "a tokenizer, model or training-state file",
    "tokenizer": "a tokenizer.safetensors, a model file or a run directory",
    "model file": "a model file (model.safetensors)",
    "training state": f"a training state ({STATE_FILE})",
}


def _check_path(path: Path, what: str) -> None:
    if not os.path.lexists(path):
        raise PipelineError(f"{what} not found: {path}")
    if path.is_dir():
        raise PipelineError(f"{what} {path} is a directory; give a .safetensors file")


def read_header(path: str | os.PathLike, what: str = "file") -> dict[str, str]:
    """The string metadata of a safetensors file; one-line PipelineError when it is not one."""
    path = Path(path)
    _check_path(path, what)
    try:
        return safetensors_file.read_header(path, what_file=_WHAT_FILE.get(what, safetensors_file.WHAT))[1]
    except FileError as err:
        raise PipelineError(str(err)) from None


@contextlib.contextmanager
def _opened(path: Path, what: str) -> Iterator[safetensors_file.Opened]:
    """The file opened once, its header checked (`read_header`'s errors); read from it with `_read`."""
    _check_path(path, what)
    try:
        with safetensors_file.opened(path, what_file=_WHAT_FILE.get(what, safetensors_file.WHAT)) as st:
            yield st
    except FileError as err:
        raise PipelineError(str(err)) from None


def _read(st: safetensors_file.Opened, names, *, mapped: bool = False) -> dict[str, np.ndarray]:
    """Only these tensors of the open file (`mapped`: float32 weights mapped, not copied)."""
    try:
        return st.read(names, mapped=mapped)
    except FileError as err:
        raise PipelineError(f"{err}; delete it or restore a good copy") from None


def _check_format(path: Path, meta: Mapping[str, str], expected: str, hint: str) -> None:
    fmt = meta.get("format")
    if fmt != expected:
        found = f"format {fmt!r}" if fmt else "no tokenkit format tag"
        raise PipelineError(f"{path} is not a {expected} file ({found}); {hint}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise PipelineError(
            f"{path} has {expected} version {meta.get('format_version')!r}; "
            f"this tokenkit reads version {FORMAT_VERSION}"
        )


# --- model.safetensors -----------------------------------------------------------------------


def save_model(
    path: str | os.PathLike,
    params: Mapping[str, np.ndarray],
    tokenizer: Any,
    *,
    config: Mapping[str, Any],
    step: int,
    val_loss: float | None,
    best_val_loss: float | None,
    provenance: Mapping[str, Any],
) -> None:
    """Write model.safetensors: the model format of `transformer.io` + embedded tokenizer + metadata.

    `params` keys are GPT-2 names; the tokenizer's own tensors and metadata go under
    `tokenizer.` so that `GPT.load` (which ignores non-parameter keys) and
    `Tokenizer.from_tensors` can both read the one file.
    """
    tok_tensors, tok_meta = tokenizer.to_tensors()
    metadata = {
        "step": str(step),
        "val_loss": json.dumps(val_loss),
        "best_val_loss": json.dumps(best_val_loss),
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "provenance": json.dumps(dict(provenance), sort_keys=True),
    }
    metadata.update({TOKENIZER_PREFIX + k: v for k, v in tok_meta.items()})
    try:
        model_io.save_model(
            path,
            dict(params),
            dict(config),
            metadata=metadata,
            extra_tensors={TOKENIZER_PREFIX + k: v for k, v in tok_tensors.items()},
        )
    except ModelError as err:
        raise PipelineError(str(err)) from None


def resolve_model_path(path_or_run_dir: str | os.PathLike) -> Path:
    """A run directory means its model.safetensors; a file means itself."""
    path = Path(path_or_run_dir)
    if path.is_dir():
        candidate = path / MODEL_FILE
        if not candidate.exists():
            hint = (
                " (training was interrupted before its first evaluation; resume it)"
                if (path / STATE_FILE).exists()
                else ""
            )
            raise PipelineError(f"no {MODEL_FILE} in run directory {path}{hint}; train one with `tk train-model`")
        return candidate
    if not path.exists():
        raise PipelineError(f"model file not found: {path}; give a run directory or a model.safetensors")
    return path


def _split_tokenizer(tensors: dict[str, np.ndarray], meta: Mapping[str, str]):
    tok_tensors = {k[len(TOKENIZER_PREFIX) :]: v for k, v in tensors.items() if k.startswith(TOKENIZER_PREFIX)}
    tok_meta = {k[len(TOKENIZER_PREFIX) :]: v for k, v in meta.items() if k.startswith(TOKENIZER_PREFIX)}
    return tok_tensors, tok_meta


def _tokenizer_from(path: Path, tensors: dict[str, np.ndarray], meta: Mapping[str, str], required: bool = True):
    tok_tensors, tok_meta = _split_tokenizer(tensors, meta)
    if not tok_tensors:
        if not required:
            return None
        raise PipelineError(f"{path} has no embedded tokenizer; it was not written by tokenkit's pipeline")
    try:
        tok = Tokenizer.from_tensors(tok_tensors, tok_meta)
    except TokenizerError as err:
        raise PipelineError(f"{path}: embedded tokenizer is invalid ({err})") from None
    if meta.get("tokenizer_fingerprint") not in (None, tok.fingerprint()):
        raise PipelineError(f"{path} is corrupt: its embedded tokenizer does not match its recorded fingerprint")
    return tok


def _model_error(path: Path, err: ModelError) -> PipelineError:
    return PipelineError(str(err) if str(path) in str(err) else f"{path}: {err}")


def _param_keys(
    path: Path, meta: Mapping[str, str], entries: Mapping[str, Mapping[str, Any]], prefix: str = ""
) -> tuple[GPTConfig, dict[str, str]]:
    """(GPTConfig, {parameter: its key in the file}) from the header alone: every name, shape and
    dtype checked against the file's config before a weight is read."""
    if "config" not in meta:
        raise PipelineError(f"{path} has no model config in its metadata; it is not a tokenkit model")
    shapes = {}
    for key, entry in entries.items():
        if key.startswith(prefix) and not key.startswith(TOKENIZER_PREFIX):
            if entry["dtype"] != "F32":  # float_params would convert silently; a tokenkit file is float32
                dtype = safetensors_file.DTYPES[entry["dtype"]]
                raise PipelineError(
                    f"{path}: parameter {key[len(prefix) :]!r} is {dtype}, expected float32; the file is corrupt"
                )
            shapes[key[len(prefix) :]] = tuple(entry["shape"])
    try:
        config, keys = model_io.param_keys(path, shapes, {"config": meta["config"]})
    except ModelError as err:
        raise _model_error(path, err) from None
    return config, {name: prefix + key for name, key in keys.items()}


def _float_params(path: Path, tensors: Mapping[str, np.ndarray], keys: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The parameters read, their values checked (finite: `model_io.float_params`)."""
    try:
        return model_io.float_params(path, {name: tensors[key] for name, key in keys.items()})
    except ModelError as err:
        raise _model_error(path, err) from None


@dataclass
class LoadedModel:
    """What `load_model` returns; unpacks as `(model, tokenizer, metadata)`."""

    model: Any
    tokenizer: Any
    metadata: dict[str, Any]

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.metadata))


def decode_metadata(meta: Mapping[str, str]) -> dict[str, Any]:
    """Model metadata with its JSON fields parsed (tokenizer.* keys left out)."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key.startswith(TOKENIZER_PREFIX):
            continue
        if key in ("config", "provenance", "val_loss", "best_val_loss", "train_config", "data"):
            try:
                out[key] = jsonsafe.loads(value, key)
            except FileError:
                out[key] = value
        elif key == "step":
            out[key] = int(value) if value.isdigit() and len(value) < 20 else value
        else:
            out[key] = value
    return out


@dataclass
class ModelFile:
    """A model file as its header and its embedded tokenizer describe it, no weight read: what
    `tk info` shows, `-t MODEL` uses, and `load_model` checks before it reads the weights."""

    path: Path
    config: GPTConfig
    tokenizer: Any  # None for a file GPT.save wrote without one
    metadata: dict[str, Any]  # decode_metadata's
    keys: dict[str, str]  # parameter name -> its key in the file

    @property
    def n_params(self) -> int:
        return self.config.n_params()


def _describe(path: Path, st: safetensors_file.Opened, tokenizer_required: bool) -> ModelFile:
    meta = st.metadata
    if meta.get("format") == TOKENIZER_FORMAT:
        raise PipelineError(f"{path} is a tokenizer file, not a model; give a run directory or its model.safetensors")
    _check_format(path, meta, MODEL_FORMAT, "give a run directory or a model.safetensors written by `tk train-model`")
    tok_names = [name for name in st.entries if name.startswith(TOKENIZER_PREFIX)]
    if st.nbytes(tok_names) > readfile.TOKENIZER_LIMIT:  # the bound of a tokenizer file, before reading
        raise PipelineError(
            f"{path}: its embedded tokenizer's tensors hold {st.nbytes(tok_names):,} bytes, more than a tokenizer "
            f"can ({readfile.TOKENIZER_LIMIT >> 30} GiB at most); the file is damaged"
        )
    tok_tensors = _read(st, tok_names)
    tokenizer = _tokenizer_from(path, tok_tensors, meta, required=False)
    if tokenizer is None and tokenizer_required:
        raise PipelineError(
            f"{path} has no embedded tokenizer (saved by GPT.save without one); give the tokenizer with -t"
        )
    config, keys = _param_keys(path, meta, st.entries)
    if tokenizer is not None and config.vocab_size < tokenizer.vocab_size:
        raise PipelineError(
            f"{path} is inconsistent: model vocab {config.vocab_size} < tokenizer vocab {tokenizer.vocab_size}"
        )
    return ModelFile(path, config, tokenizer, decode_metadata(meta), keys)


def describe_model(path_or_run_dir: str | os.PathLike, *, tokenizer_required: bool = True) -> ModelFile:
    """A model file (or a run dir's) checked as `load_model` checks it, reading its header and its
    tokenizer's tensors only: the weights' names, shapes and dtypes are checked, their values not."""
    path = resolve_model_path(path_or_run_dir)
    with _opened(path, "model file") as st:
        return _describe(path, st, tokenizer_required)


def load_tokenizer(path: str | Path):
    """A tokenizer from a tokenizer.safetensors, or the one embedded in a model file / run dir."""

    path = Path(path)
    if path.is_dir() or (os.path.lexists(path) and read_header(path, "tokenizer").get("format") == MODEL_FORMAT):
        return describe_model(path).tokenizer  # its header and tokenizer only, never the weights
    if not os.path.lexists(path):
        raise PipelineError(
            f"tokenizer file not found: {path}; give a tokenizer.safetensors (`tk bpe-train` makes one), "
            "a model file or a run directory"
        )
    return Tokenizer.load(path)


def load_model(
    path_or_run_dir: str | os.PathLike, *, tokenizer_required: bool = True, device: str = "cpu"
) -> LoadedModel:
    """Load a model.safetensors (or a run dir's) -> (GPT, Tokenizer, metadata), all validated.

    Reads every file in the model format: the pipeline's (tokenizer embedded) and `GPT.save`'s
    (tokenizer None when `tokenizer_required` is False, else a one-line error). A missing,
    foreign (e.g. a tokenizer file), truncated or corrupt file is a one-line PipelineError
    saying which and what to do, and so is a model that does not fit `device`'s memory, said
    from its header before a weight is read (`model_io.check_fits`). The weights are mapped
    from the file, not copied (`safetensors_file.Opened.read`), and their values checked.
    """
    path = resolve_model_path(path_or_run_dir)
    with _opened(path, "model file") as st:
        described = _describe(path, st, tokenizer_required)
        try:
            model_io.check_fits(path, described.config, device)
        except ModelError as err:
            raise PipelineError(str(err)) from None
        tensors = _read(st, described.keys.values(), mapped=True)
    params = _float_params(path, tensors, described.keys)
    try:
        from tokenkit.transformer.model import GPT  # here: reading a tokenizer or a header needs no model code

        model = GPT.from_params(described.config, params, device=device)
    except ModelError as err:
        raise PipelineError(f"{path}: {err}") from None
    return LoadedModel(model, described.tokenizer, described.metadata)


def hf_architecture(metadata: Mapping[str, Any]) -> str | None:
    """The transformers class a model file's weights were imported from (`HF_ARCHITECTURE` in its
    provenance), or None: trained by tk, or written before tk recorded it."""
    prov = metadata.get("provenance")
    value = prov.get(HF_ARCHITECTURE) if isinstance(prov, dict) else None
    return value if isinstance(value, str) else None


def paired_tokenizer(loaded: LoadedModel, given: Any | None, path: Any) -> Any:
    """The tokenizer a loaded model is used with: `given` (-t), else the one in its file.

    A model's vocabulary may be larger than its tokenizer's: ids from the tokenizer's size up
    are padding (a checkpoint `tk import-hf` read whose embedding has more rows than its
    tokenizer has tokens, as Qwen2's). No text encodes to them and generation never picks
    them (`pipeline.run.generate_ids`). A given tokenizer must have as many tokens as the
    model's own, or, for a file without one, as the model's vocabulary.
    """
    own = loaded.tokenizer
    if given is None:
        return own
    expected = own.vocab_size if own is not None else loaded.model.config.vocab_size
    if given.vocab_size != expected:
        whose = f"the one in {path} has {expected}" if own is not None else f"{path} expects {expected}"
        raise PipelineError(
            f"the tokenizer has {given.vocab_size} tokens but {whose}; give the tokenizer the model was trained with"
        )
    return given


# --- train_state.safetensors -----------------------------------------------------------------
