"""A Hugging Face transformers checkpoint directory to one tk model file: GPT-2's, or Llama's
family's (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM; pipeline/hf_llama.py says how
their configs and names translate, pipeline/hf_files.py why GPT-2's tensors are tk's own).

    import_hf(DIR, FILE)    config.json + model.safetensors (or model.safetensors.index.json
                            and its shards) + tokenizer -> one tokenkit model file

Reading never unpickles (`pytorch_model.bin` is refused), validates every safetensors header
against its file before reading, and reads one tensor at a time, converting it to float32
(F16, BF16 and F64 checkpoints included): the checkpoint is never held twice. A weight holding
NaN or infinity is refused by name, and so is an `lm_head.weight` that differs from `wte`:
transformers then predicts with that head, untied even under `tie_word_embeddings`, and tk's
GPT-2 cannot (a Llama-family model is imported untied then, as transformers predicts). Each
weight is read, transposed or placed in its columns one at a time, so the import holds the
model and one tensor more; a model whose float32 weights do not fit the memory free is refused
from its config and headers before a weight is read (`transformer.memory.check_memory`).
Everything is checked before the first file is written; every failure is one PipelineError line.

A checkpoint's vocab_size may exceed its tokenizer's size (Qwen2 pads 151,665 tokens to 151,936
rows; others to a multiple of 64): every row is kept, so the probabilities are transformers'
over all of them, and the ids past the tokenizer are padding that no text encodes to
(`checkpoint.paired_tokenizer` says how tk uses such a model). The class a checkpoint was read
from is recorded in the model's provenance (`checkpoint.HF_ARCHITECTURE`).

What it deliberately does not do: write a transformers directory (pipeline/hf_export.py does),
import transformers or torch (tests do, to check the round trip), or read a config whose model
tk's GPT does not compute (refused by name: GPT-2's here, Llama's in pipeline/hf_llama.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit import __version__
from tokenkit.bpe import Tokenizer, TokenizerError, jinja_template, library_files
from tokenkit.common import FileError, readfile, safetensors_file
from tokenkit.pipeline import checkpoint, hf_llama
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.hf_files import CONFIG_FILE, INDEX_LIMIT, PREFIX, WEIGHTS_FILE, read_json
from tokenkit.transformer import GPTConfig, ModelError
from tokenkit.transformer.config import param_shapes
from tokenkit.transformer.memory import check_memory
from tokenkit.transformer.ops import LN_EPS

INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")

# transformers' activation_function -> tk's activation (gelu_pytorch_tanh is the same tanh GELU)
_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
_FLOATS = {"F32", "F16", "F64", safetensors_file.BF16}


@dataclass
class ImportResult:
    path: Path
    config: GPTConfig
    n_params: int
    tokenizer: Tokenizer
    dtypes: list[str] = field(default_factory=list)  # the checkpoint's float types
    shards: int = 1
    architecture: str = "GPT2LMHeadModel"  # the checkpoint's transformers class


def gpt_config(path: Path, hf: Any) -> GPTConfig:
    """tk's GPTConfig for a transformers GPT-2 config.json, or one line naming what tk lacks."""
    if not isinstance(hf, dict):
        raise PipelineError(f"{path} is not a JSON object; is this a transformers model directory?")
    kind = hf.get("model_type")
    if kind != "gpt2":
        known = ", ".join(repr(k) for k in ("gpt2", *hf_llama.MODEL_TYPES))
        raise PipelineError(f"{path}: model_type {kind!r}; tk imports the model types {known}")

    def get(key: str, default: Any) -> Any:
        return hf[key] if hf.get(key) is not None else default

    act = get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        exact = " (the exact erf GELU; tk's is the tanh approximation, gelu_new)" if act == "gelu" else ""
        raise PipelineError(f"{path}: activation_function {act!r}{exact} is not one of tk's: {', '.join(_ACTIVATIONS)}")
    eps = get("layer_norm_epsilon", 1e-5)
    if not isinstance(eps, (int, float)) or not math.isclose(eps, LN_EPS, rel_tol=1e-6):
        raise PipelineError(f"{path}: layer_norm_epsilon {eps!r}; tk's LayerNorm uses {LN_EPS}")
    d_model = get("n_embd", 768)
    unsupported = [
        (
            get("n_inner", None) not in (None, 4 * d_model) if isinstance(d_model, int) else False,
            f"n_inner {hf.get('n_inner')!r} (tk's MLP is 4 * n_embd wide)",
        ),
        (get("scale_attn_weights", True) is not True, "scale_attn_weights false (tk scales by 1/sqrt(head size))"),
        (get("scale_attn_by_inverse_layer_idx", False) is not False, "scale_attn_by_inverse_layer_idx"),
        (get("add_cross_attention", False) is not False, "add_cross_attention"),
    ]
    for bad, what in unsupported:
        if bad:
            raise PipelineError(f"{path}: {what} is not part of tk's GPT")
    try:
        return GPTConfig(
            vocab_size=get("vocab_size", 50257),
            context_length=get("n_positions", get("n_ctx", 1024)),
            d_model=d_model,
            n_layers=get("n_layer", 12),
            n_heads=get("n_head", 12),
            activation=_ACTIVATIONS[act],
        )
    except ModelError as err:
        raise PipelineError(f"{path}: {err}") from None


@dataclass
class _Source:
    """Where one tensor lies: its file, dtype, shape and absolute byte offset."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int


def _headers(directory: Path) -> tuple[dict[str, _Source], int]:
    """name -> _Source for every tensor of the checkpoint (one file or an index of shards)."""
    single, index = directory / WEIGHTS_FILE, directory / INDEX_FILE
    if os.path.lexists(single):
        files = [single]
    elif os.path.lexists(index):
        table = read_json(index, "safetensors index", INDEX_LIMIT)
        weight_map = table.get("weight_map") if isinstance(table, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise PipelineError(f"{index} has no weight_map of tensor name -> file; is it damaged?")
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if Path(n).name != n or n in ("", ".", "..") or not n.endswith(".safetensors")]
        if bad:
            raise PipelineError(f"{index} names shard {bad[0]!r}; shards must be .safetensors files in {directory}")
        files = [directory / n for n in names]
        missing = [p for p in files if not os.path.lexists(p)]
        if missing:
            raise PipelineError(
                f"{index} names {missing[0].name}, which is not in {directory}; is the download incomplete?"
            )
    else:
        pickles = [n for n in PICKLE_FILES if (directory / n).exists()]
        if pickles:
            raise PipelineError(
                f"{directory} holds {pickles[0]}, a pickle, which tk never loads (loading runs code); "
                "convert it first: "
                "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR) writes model.safetensors"
            )
        raise PipelineError(f"{directory} has no {WEIGHTS_FILE} or {INDEX_FILE}; is it a transformers model directory?")
    sources: dict[str, _Source] = {}
    for path in files:
        try:
            entries, _, start = safetensors_file.read_layout(path, bfloat16=True, what_file="a .safetensors shard")
        except FileError as err:
            raise PipelineError(f"{err}; is the download complete?") from None
        for name, entry in entries.items():
            if name in sources:
                raise PipelineError(
                    f"{path}: tensor {name!r} is also in {sources[name].file.name}; the checkpoint is inconsistent"
                )
            sources[name] = _Source(path, entry["dtype"], tuple(entry["shape"]), start + entry["data_offsets"][0])
    return sources, len(files)


def _read_tensor(name: str, src: _Source) -> np.ndarray:
    """One tensor as float32, read straight from its file (BF16: the high half of a float32)."""
    if src.dtype not in _FLOATS:
        raise PipelineError(f"{src.file}: {name} is {src.dtype}; a model's weights are floats (F32, F16, BF16, F64)")
    raw = np.dtype("<u2") if src.dtype == safetensors_file.BF16 else safetensors_file.DTYPES[src.dtype]
    a = np.empty(src.shape, dtype=raw)
    try:
        with readfile.open_regular(src.file, readfile.NO_LIMIT, "a .safetensors shard") as (f, _):
            safetensors_file.read_into(f, src.offset, a, f"{src.file}: {name}")
    except FileError as err:
        raise PipelineError(str(err)) from None
    if src.dtype == safetensors_file.BF16:
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32, copy=False).reshape(src.shape)


def _read_weight(name: str, src: _Source) -> np.ndarray:
    """`_read_tensor`, refused in one line when any value is NaN or infinite (a model computing
    with it predicts NaN, or nothing useful)."""
    a = _read_tensor(name, src)
    n_bad = a.size - int(np.count_nonzero(np.isfinite(a)))
    if n_bad:
        n_nan = int(np.count_nonzero(np.isnan(a)))
        kind = "NaN" if n_nan == n_bad else "infinite" if n_nan == 0 else "NaN or infinite"
        raise PipelineError(
            f"{src.file}: {name} has {n_bad:,} of its {a.size:,} values {kind}; "
            "the checkpoint is damaged: download or save it again"
        )
    return a


def _is_buffer(name: str) -> bool:
    """GPT-2's causal-mask buffers (`h.N.attn.bias`, `h.N.attn.masked_bias`): not weights."""
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias")


def read_checkpoint(
    directory: Path, sources: dict[str, _Source], config: GPTConfig, tied: bool
) -> tuple[dict[str, np.ndarray], list[str]]:
    """(params keyed by tk's names, the checkpoint's dtypes) from `_headers`' sources: every name
    and shape checked before the first tensor is read, then one tensor at a time."""
    ours: dict[str, str] = {}  # tk name -> checkpoint name
    head = None
    for key in sources:
        name = key[len(PREFIX) :] if key.startswith(PREFIX) else key
        if name == "lm_head.weight":
            head = key
        elif not _is_buffer(name):
            if name in ours:
                raise PipelineError(f"{directory}: {name} appears twice (with and without {PREFIX!r})")
            ours[name] = key
    expected = param_shapes(config)
    missing = [n for n in expected if n not in ours]
    extra = sorted(set(ours) - set(expected))
    if missing:
        raise PipelineError(
            f"{directory}: the checkpoint lacks {len(missing)} tensor(s) of its config, e.g. {PREFIX}{missing[0]}"
        )
    if extra:
        raise PipelineError(f"{directory}: tensor {extra[0]!r} is not part of GPT-2's language model; tk cannot use it")
    for name, shape in expected.items():
        if sources[ours[name]].shape != shape:
            raise PipelineError(
                f"{directory}: {name} has shape {sources[ours[name]].shape}; config.json implies {shape}"
            )
    ties = "tk's GPT ties its output head to the token embedding"
    if head is None and not tied:
        raise PipelineError(f"{directory}: tie_word_embeddings is false but there is no lm_head.weight; {ties}")
    if head is not None and sources[head].shape != expected["wte.weight"]:
        raise PipelineError(
            f"{directory}: lm_head.weight has shape {sources[head].shape} and wte.weight {expected['wte.weight']}; "
            f"{ties}, so it cannot use this head"
        )
    params = {name: _read_weight(name, sources[ours[name]]) for name in expected}
    if head is not None and not np.array_equal(_read_weight("lm_head.weight", sources[head]), params["wte.weight"]):
        # transformers unties the two when both are stored and differ, whatever the config says
        raise PipelineError(
            f"{directory}: lm_head.weight differs from wte.weight, and transformers predicts with the stored head "
            f"(untied, even when tie_word_embeddings is true); {ties}, so it would predict otherwise"
        )
    dtypes = sorted({sources[ours[name]].dtype for name in expected})
    return params, dtypes


def read_llama_checkpoint(
    directory: Path, sources: dict[str, _Source], imported: hf_llama.Imported
) -> tuple[dict[str, np.ndarray], list[str], GPTConfig]:
    """(params keyed by tk's names, the checkpoint's dtypes, the config) of a Llama-family
    checkpoint: every name and shape checked before the first tensor is read, then one tk
    parameter at a time from its tensors (transposed, or placed in its columns), zeros for a bias
    tk has and the checkpoint lacks. Biases that are all zero add nothing and are left out (a
    Qwen2-style model exported as Llama, with a zero o_proj bias, comes back as it was). A
    stored lm_head.weight under tie_word_embeddings is read too: when it differs from the
    embeddings transformers predicts with it, so the model is imported untied."""
    config, what = imported.config, imported.architecture
    expected = set(imported.hf_names)
    maybe_untied = config.tie_embeddings and "lm_head.weight" in sources
    if maybe_untied:
        expected.add("lm_head.weight")
    present = {name for name in sources if not name.endswith(hf_llama.BUFFER_SUFFIX)}
    missing, extra = sorted(expected - present), sorted(present - expected)
    if "lm_head.weight" in missing:
        raise PipelineError(f"{directory}: tie_word_embeddings is false but there is no lm_head.weight")
    if missing:
        raise PipelineError(
            f"{directory}: the checkpoint lacks {len(missing)} tensor(s) of its config ({what}), e.g. {missing[0]}"
        )
    if extra:
        raise PipelineError(
            f"{directory}: tensor {extra[0]!r} is not part of {what}'s language model as config.json describes it; "
            "tk cannot use it"
        )
    shapes = param_shapes(hf_llama.widest(config))
    for link in hf_llama.links(config):
        shape = link.hf_shape(shapes[link.tk])
        if link.hf in expected and sources[link.hf].shape != shape:
            found = sources[link.hf].shape
            raise PipelineError(f"{directory}: {link.hf} has shape {found}; config.json implies {shape}")
    biased = {"qkv": False, "rest": False}  # tk's qkv_bias and bias: whether any such bias is not zero
    for name in sorted(n for n in expected if n.endswith(".bias")):
        group = "qkv" if ".self_attn." in name and ".o_proj." not in name else "rest"
        biased[group] = biased[group] or bool(_read_weight(name, sources[name]).any())
    config = GPTConfig.from_dict({**config.to_dict(), "bias": biased["rest"], "qkv_bias": biased["qkv"]})
    untied = GPTConfig.from_dict({**config.to_dict(), "tie_embeddings": False})
    shapes = param_shapes(untied)
    parts: dict[str, list[hf_llama.Link]] = {}
    for link in hf_llama.links(config):
        if link.hf in expected and link.tk in shapes:
            parts.setdefault(link.tk, []).append(link)
    params = {name: _assemble(shape, parts.get(name, []), sources) for name, shape in param_shapes(config).items()}
    if maybe_untied:
        head = _read_weight("lm_head.weight", sources["lm_head.weight"])
        if not np.array_equal(head, params["wte.weight"]):  # transformers unties them, whatever the config says
            config, params["lm_head.weight"] = untied, head
    dtypes = sorted({sources[name].dtype for name in expected})
    return params, dtypes, config


def _assemble(shape: tuple[int, ...], links: list[hf_llama.Link], sources: dict[str, _Source]) -> np.ndarray:
    """One tk parameter from its checkpoint tensors (none: a zero bias)."""
    if len(links) == 1 and links[0].cols is None:
        a = _read_weight(links[0].hf, sources[links[0].hf])
        return np.ascontiguousarray(a.T) if links[0].transposed else a
    out = np.zeros(shape, np.float32)
    for link in links:
        a = _read_weight(link.hf, sources[link.hf])
        out[..., link.cols[0] : link.cols[1]] = a.T if link.transposed else a
    return out


def read_tokenizer(directory: Path, as_written: bool = False) -> Tokenizer:
    """The checkpoint's tokenizer (tokenizer.json, or vocab.json + merges.txt) with transformers'
    ids, or, `as_written`, its tokenizer.json as the file says (the `tokenizers` library's ids,
    whatever class tokenizer_config.json names: SmolLM's names GPT2Tokenizer, which transformers
    5 builds without the file's Digits step); either way with the checkpoint's chat template, kept
    in the tokenizer (bpe/jinja_template.py)."""
    if as_written and not os.path.lexists(directory / "tokenizer.json"):
        raise PipelineError(f"{directory} has no tokenizer.json to read as written (--tokenizer-json)")
    try:
        if not as_written:  # the directory's chat template comes with it (`bpe.formats.from_hf`)
            return Tokenizer.from_hf(directory)
        tok = Tokenizer.from_hf(directory / "tokenizer.json")
        config, _ = library_files.read_hf_configs(directory)
        template = jinja_template.from_hf(config, library_files.read_hf_chat_template(directory), str(directory))
        return jinja_template.with_template(tok, template)
    except TokenizerError as err:
        raise PipelineError(f"{directory}: the tokenizer cannot be read ({err})") from None


def import_hf(
    directory: str | os.PathLike,
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    context_length: int | None = None,
    tokenizer_json: bool = False,
) -> ImportResult:
    """Read a transformers checkpoint directory into one tk model file (tokenizer embedded).
    `context_length`: a shorter window for a rotary-position model (see `hf_llama.gpt_config`);
    `tokenizer_json`: its tokenizer.json read as written (`read_tokenizer`)."""
    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise PipelineError(f"{directory} is not a directory; give the directory transformers saved the model in")
    if out.is_dir():
        raise PipelineError(f"{out} is a directory; give the model file to write, e.g. {out / 'model.safetensors'}")
    if out.exists() and not overwrite:
        raise PipelineError(f"{out} exists; choose another name, or pass --overwrite to replace it")
    if not os.path.lexists(directory / CONFIG_FILE):
        raise PipelineError(f"{directory} has no {CONFIG_FILE}; is it a transformers model directory?")
    hf = read_json(directory / CONFIG_FILE, "model config")
    llama = isinstance(hf, dict) and isinstance(hf.get("model_type"), str) and hf["model_type"] in hf_llama.MODEL_TYPES
    if context_length is not None and not llama:
        raise PipelineError(
            f"{directory}: --context shortens the window of a rotary-position model (Llama, Mistral, Qwen2); "
            "GPT-2's positions are rows of its wpe table"
        )
    imported = hf_llama.gpt_config(directory / CONFIG_FILE, hf, context_length) if llama else None
    config = imported.config if imported else gpt_config(directory / CONFIG_FILE, hf)
    sources, shards = _headers(directory)
    try:  # the float32 weights the import holds, against the memory free, before one is read
        check_memory(config, run=False)
    except ModelError as err:
        raise PipelineError(f"{directory}: {err}") from None
    tokenizer = read_tokenizer(directory, as_written=tokenizer_json)
    if tokenizer.vocab_size > config.vocab_size:  # more rows than tokens is padding (Qwen2's 151,936 for 151,665)
        raise PipelineError(
            f"{directory}: the tokenizer has {tokenizer.vocab_size:,} tokens but config.json's vocab_size is "
            f"{config.vocab_size:,}: the model has no rows for its last {tokenizer.vocab_size - config.vocab_size:,}; "
            "give the tokenizer saved with this model"
        )
    if imported:
        params, dtypes, config = read_llama_checkpoint(directory, sources, imported)
    else:
        params, dtypes = read_checkpoint(
            directory, sources, config, tied=hf.get("tie_word_embeddings", True) is not False
        )
    architecture = imported.architecture if imported else "GPT2LMHeadModel"
    provenance = {
        "tokenkit": __version__,
        "imported_from": str(directory),
        "imported_dtypes": dtypes,
        checkpoint.HF_ARCHITECTURE: architecture,
    }
    checkpoint.save_model(
        out,
        params,
        tokenizer,
        config=config.to_dict(),
        step=0,
        val_loss=None,
        best_val_loss=None,
        provenance=provenance,
    )
    return ImportResult(out, config, sum(int(a.size) for a in params.values()), tokenizer, dtypes, shards, architecture)
