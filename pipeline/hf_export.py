"""A tk model to a Hugging Face transformers checkpoint directory: GPT-2's, or Llama's family's
(LlamaForCausalLM, or Qwen2ForCausalLM for a model imported from one; pipeline/hf_llama.py says
how their configs and names translate, pipeline/hf_files.py why GPT-2's tensors are tk's own).

    export_hf(model, DIR)   config.json, model.safetensors, generation_config.json and the
                            tokenizer's files (its chat template in tokenizer_config.json:
                            bpe/formats.py): `AutoModelForCausalLM.from_pretrained(DIR)`
                            and `AutoTokenizer.from_pretrained(DIR)` load them (GPT2LMHeadModel,
                            LlamaForCausalLM, or Qwen2ForCausalLM for a model imported from one)

The files replace an earlier export's as one change; every failure is one PipelineError line.

What it deliberately does not do: read a transformers checkpoint (pipeline/hf_import.py does),
import transformers or torch (tests do, to check the round trip), or express variants neither
family has a field for (post-norm, sinusoidal positions, bidirectional attention, rotary
positions with LayerNorm or a GELU MLP: refused by name).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenkit import __version__
from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.bpe.hf_import import QWEN2_PATTERN
from tokenkit.common import FileError, atomic, atomic_dir, safetensors_file
from tokenkit.pipeline import checkpoint, hf_llama
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.hf_files import CONFIG_FILE, PREFIX, WEIGHTS_FILE, read_json
from tokenkit.pipeline.run import eos_id, load_model_and_tokenizer
from tokenkit.transformer import GPTConfig
from tokenkit.transformer.config import param_shapes
from tokenkit.transformer.ops import LN_EPS

GENERATION_FILE = "generation_config.json"
# every file an export may write; one that this export did not write is an earlier export's, removed
EXPORT_FILES = (
    CONFIG_FILE,
    WEIGHTS_FILE,
    GENERATION_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",  # never written (tokenizer_config.json holds the template); stale, it would win
)
EOT = "<|endoftext|>"
MARKER = "tokenkit_version"  # in an export's config.json: the directory may be exported into again


@dataclass
class ExportResult:
    directory: Path
    files: list[Path]
    removed: list[Path]
    config: GPTConfig
    n_params: int
    architecture: str = "GPT2LMHeadModel"


def export_architecture(config: GPTConfig, imported_as: str | None = None) -> str:
    """The transformers class a tk model is written as: for rotary positions Qwen2ForCausalLM when
    its weights were imported from one (`imported_as`, the file's `checkpoint.HF_ARCHITECTURE`)
    and it has no biases but q, k and v's (Qwen2's shape), else LlamaForCausalLM; GPT2LMHeadModel
    otherwise. One line naming the first choice of `config` that class's config cannot express."""
    llama = config.positional == "rope"
    family = "Llama" if llama else "GPT-2"
    variants = [
        (config.norm == "post", "post-norm (a norm after each residual add)", f"{family} normalises before (pre-norm)"),
        (config.positional == "sinusoidal", "sinusoidal positions", "GPT-2 learns its position table (wpe)"),
        (not config.causal, "bidirectional attention", f"{family} attends causally"),
    ]
    for bad, name, why in variants:
        if bad:
            raise PipelineError(
                f"cannot export a model with {name} as {family}: {why}, and transformers has no setting for it"
            )
    if llama:
        for bad, name, why in [
            (config.norm_type != "rmsnorm", "LayerNorm", "Llama normalises with RMSNorm"),
            (config.activation != "swiglu", f"a {config.activation.upper()} MLP", "Llama's MLP is SwiGLU"),
        ]:
            if bad:
                raise PipelineError(
                    f"cannot export a model with rotary positions and {name} as Llama: {why}, and transformers has "
                    "no setting for it"
                )
        return "Qwen2ForCausalLM" if imported_as == "Qwen2ForCausalLM" and not config.bias else "LlamaForCausalLM"
    llama_family = [  # GPT-2's config cannot say these; with rotary positions the model would be Llama's
        (config.norm_type == "rmsnorm", "RMSNorm", "GPT-2 uses LayerNorm"),
        (config.activation == "swiglu", "a SwiGLU MLP", "GPT-2's MLP is not gated"),
        (config.kv_heads != config.n_heads, "grouped-query attention", "GPT-2 has a K/V head per query head"),
        (not config.tie_embeddings, "untied embeddings", "GPT-2's lm_head is wte"),
        (config.has_qkv_bias != config.bias, "biases on q, k, v alone", "GPT-2 has all biases or none"),
        (config.hidden != 4 * config.d_model, f"an MLP {config.hidden} wide", "tk's GPT-2 MLP is 4 * d_model wide"),
        (config.norm_eps != LN_EPS, f"norm_eps {config.norm_eps:g}", f"tk's GPT-2 LayerNorm uses {LN_EPS:g}"),
    ]
    for bad, name, why in llama_family:
        if bad:
            raise PipelineError(
                f"cannot export a model with {name} as GPT-2: {why}; a model with learned positions is exported as "
                "GPT-2 (one with rotary positions, RMSNorm and SwiGLU as Llama)"
            )
    return "GPT2LMHeadModel"


def hf_config(config: GPTConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """transformers' GPT2Config for a tk model (no dropout: tk trains without it)."""
    eot = tokenizer.special_tokens.get(EOT)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "n_ctx": config.context_length,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": 4 * config.d_model,
        "activation_function": {"gelu": "gelu_new", "relu": "relu"}[config.activation],
        "layer_norm_epsilon": LN_EPS,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "dtype": "float32",
        MARKER: __version__,
    }


def hf_tensors(config: GPTConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GPT2LMHeadModel's state dict: tk's params under `transformer.`, zero biases where tk has
    none (a zero bias adds nothing), lm_head left out (tied to wte)."""
    biased = param_shapes(GPTConfig.from_dict({**config.to_dict(), "bias": True}))
    return {
        PREFIX + name: np.ascontiguousarray(params[name], dtype=np.float32)
        if name in params
        else np.zeros(shape, np.float32)
        for name, shape in biased.items()
    }


def hf_llama_tensors(config: GPTConfig, params: dict[str, np.ndarray], names: set[str]) -> dict[str, np.ndarray]:
    """LlamaForCausalLM's state dict (`names`): each tensor tk's columns for it, transposed for a
    Linear layer, or zeros where tk has no such parameter (a bias the config implies)."""
    widest = param_shapes(hf_llama.widest(config))
    out = {}
    for link in hf_llama.links(config):
        if link.hf not in names:
            continue
        if link.tk not in params:
            out[link.hf] = np.zeros(link.hf_shape(widest[link.tk]), np.float32)
            continue
        a = params[link.tk] if link.cols is None else params[link.tk][..., link.cols[0] : link.cols[1]]
        out[link.hf] = np.ascontiguousarray(a.T if link.transposed else a, dtype=np.float32)
    return out


def _check_qwen2_tokenizer(tokenizer: Tokenizer, model_path: Any) -> None:
    """One line unless transformers' Qwen2Tokenizer, which it loads for every qwen2 directory
    whatever tokenizer_config.json names, reads the exported tokenizer with tk's ids: Qwen2's
    split, NFC, no ignore_merges, and <|endoftext|> (its unk and pad token) in the vocabulary.
    A tokenizer read from a qwen2 directory is all of these (import-hf checks the same)."""
    differences = [
        (tokenizer.pattern != QWEN2_PATTERN, "splits with Qwen2's pattern"),
        (tokenizer.normalizer != "nfc", "puts text in NFC"),
        (tokenizer.ignore_merges, "has no ignore_merges"),
        (EOT not in tokenizer.special_tokens, f"adds {EOT} as a token"),
    ]
    for differs, what in differences:
        if differs:
            raise PipelineError(
                f"{model_path} was imported from Qwen2ForCausalLM and is exported as one, and transformers reads a "
                f"qwen2 directory's tokenizer as Qwen2Tokenizer, which {what} where this tokenizer does not; export "
                "it with the model's own tokenizer (drop -t)"
            )


def _is_tk_model(path: Path) -> bool:
    try:
        return safetensors_file.read_header(path, bfloat16=True)[1].get("format") == checkpoint.MODEL_FORMAT
    except FileError:
        return False


def _is_earlier_export(directory: Path) -> bool:
    try:
        config = read_json(directory / CONFIG_FILE, "config.json")
    except PipelineError:
        return False
    return isinstance(config, dict) and MARKER in config


def export_hf(
    model_path: str | os.PathLike,
    directory: str | os.PathLike,
    *,
    tokenizer_path: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Write a transformers GPT-2 directory for a tk model (a run directory or model file).

    A non-empty `directory` must be an earlier export (its config.json says so) unless
    `overwrite`. The export's files replace the old ones as one change
    (`common.atomic_dir.replace_files`): a reader, or a crash at any moment, finds the whole earlier
    export or the whole new one, never config.json of one beside the weights of the other (in a
    mount point, which cannot be renamed, a crash still ends all old or all new, but a reader
    during the milliseconds of the moves may see a mix: docs/files.md). An
    earlier export's files that this one does not write are removed; files in the directory
    that are not an export's stay.
    """
    directory = Path(directory)
    model, tokenizer = load_model_and_tokenizer(model_path, tokenizer_path)
    config = model.config
    meta = checkpoint.decode_metadata(checkpoint.read_header(checkpoint.resolve_model_path(model_path), "model file"))
    architecture = export_architecture(config, checkpoint.hf_architecture(meta))
    if architecture == "Qwen2ForCausalLM":
        _check_qwen2_tokenizer(tokenizer, model_path)
    if directory.exists() and not directory.is_dir():
        raise PipelineError(f"{directory} is a file; give a directory to export into")
    if (directory / WEIGHTS_FILE).is_file() and _is_tk_model(directory / WEIGHTS_FILE):
        raise PipelineError(
            f"{directory} holds a tokenkit model ({WEIGHTS_FILE}, e.g. a run's); export into another directory"
        )
    entries = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    if entries and not overwrite and not _is_earlier_export(directory):
        raise PipelineError(
            f"{directory} is not empty ({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}) and is not an "
            "earlier export; choose an empty directory, or pass --overwrite to replace its model and tokenizer files"
        )
    try:
        files: dict[str, atomic.Data] = dict(tokenizer.export_files("hf"))
    except TokenizerError as err:
        raise PipelineError(f"cannot export the tokenizer into {directory}: {err}") from None
    if architecture == "GPT2LMHeadModel":
        tensors = hf_tensors(config, model.params)
        bos = eos = tokenizer.special_tokens.get(EOT)
        hf = hf_config(config, tokenizer)
    else:
        bos, eos = tokenizer.special_tokens.get(tokenizer.bos), eos_id(tokenizer)  # no bos: None
        hf, names = hf_llama.hf_config(config, eos, {MARKER: __version__}, architecture)
        tensors = hf_llama_tensors(config, model.params, names)
    files[WEIGHTS_FILE] = lambda f: safetensors_file.write(f, tensors, {"format": "pt"})
    files[GENERATION_FILE] = checkpoint.json_bytes(
        {"_from_model_config": True, "bos_token_id": bos, "eos_token_id": eos}
    )
    files[CONFIG_FILE] = checkpoint.json_bytes(hf)
    try:
        removed = atomic_dir.replace_files(directory, files, remove=[n for n in EXPORT_FILES if n not in files])
    except FileError as err:
        raise PipelineError(str(err)) from None
    return ExportResult(
        directory,
        [directory / name for name in files],
        [directory / name for name in removed],
        config,
        sum(int(a.size) for a in model.params.values()),
        architecture,
    )
