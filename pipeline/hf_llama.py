"""Llama's family in transformers' terms: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM.

tk's GPT with rotary positions, RMSNorm and a SwiGLU MLP (`llama_config`) computes what these
three compute; they differ in their configs (Qwen2: biases on q, k and v; Mistral: a sliding
window) and name their tensors alike. This module translates, and reads or writes no file
(pipeline/hf_export.py and pipeline/hf_import.py do, one tensor at a time):

    gpt_config(path, hf)   config.json -> (GPTConfig, the checkpoint's tensor names), or one
                           line naming what tk's GPT does not compute (a RoPE scaling other than
                           linear and Llama 3's, a sliding window shorter than the context,
                           another activation, head_dim, ...)
    links(config)          tk's parameters <-> HF's tensors: which columns of which tk parameter
                           each HF tensor is (q_proj, k_proj, v_proj are c_attn's columns side by
                           side; gate_proj, up_proj c_fc's), transposed for the Linear layers
                           (torch's (out, in) against tk's (in, out))
    hf_config(config, ...) the LlamaForCausalLM (or Qwen2ForCausalLM) config.json of a tk model,
                           and its tensor names

A bias one side has and the other lacks is zero on the other side: Llama's attention_bias (q,
k, v and o) and mlp_bias read into tk's `bias` (the missing ones zero), and tk's Qwen2-style
q, k, v biases are written as Llama's attention_bias with a zero o_proj bias. Exports are
LlamaForCausalLM, except a model imported from Qwen2ForCausalLM (and fine-tuned from one),
which is written as Qwen2ForCausalLM again: transformers (5.x) reads a qwen2 directory's
tokenizer as its Qwen2Tokenizer (Qwen2's split and NFC, whatever tokenizer.json says), which a
Qwen2 import's tokenizer is, and a llama one's as tokenizer.json says. `vocab_size` is the
model's, which may exceed its tokenizer's (Qwen2 pads its embeddings; the extra rows are kept).

RoPE scalings: `linear` and `llama3` (Llama 3.1's and 3.2's) change the rotary angles only, and
tk computes them (GPTConfig.rope_scaling); transformers gives neither an attention factor.

What it deliberately does not do: the other RoPE scalings (dynamic, YaRN, LongRoPE, ...), sliding
windows shorter than the context, partial rotary dimensions, head_dim other than
hidden_size / heads: refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPTConfig, ModelError
from tokenkit.transformer.config import MAX_CONTEXT_LENGTH, ROPE_SCALINGS, llama_config

MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_ACTIVATIONS = ("silu", "swish")  # transformers' names for SiLU
_KV_HEADS = {"mistral": 8, "qwen2": 32}  # num_key_value_heads when config.json lacks it (Llama's: the heads)
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "max_position_embeddings")  # fmt: skip
_ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")  # what a default RoPE may say
_HF_ROPE_NAMES = {"original_context_length": "original_max_position_embeddings"}  # tk's name: transformers'
BUFFER_SUFFIX = "rotary_emb.inv_freq"  # older saves hold the rotary frequencies: computed, not weights


@dataclass(frozen=True)
class Link:
    """tk parameter `tk` columns [start, stop) of its last axis (None: all) are HF tensor `hf`."""

    tk: str
    hf: str
    cols: tuple[int, int] | None = None

    @property
    def transposed(self) -> bool:
        """A Linear layer's weight: torch stores (out, in), tk (in, out)."""
        return self.hf.endswith("_proj.weight")

    def hf_shape(self, tk_shape: tuple[int, ...]) -> tuple[int, ...]:
        width = tk_shape[-1] if self.cols is None else self.cols[1] - self.cols[0]
        shape = (*tk_shape[:-1], width)
        return shape[::-1] if self.transposed else shape


def links(config: GPTConfig) -> list[Link]:
    """Every pairing of tk's names and HF's for this shape, biases and lm_head included whether
    or not either side has them (callers keep those both have; the rest are zeros or absent)."""
    F = config.hidden
    q, kv = config.n_heads * config.head_dim, config.kv_heads * config.head_dim
    out = [
        Link("wte.weight", "model.embed_tokens.weight"),
        Link("ln_f.weight", "model.norm.weight"),
        Link("lm_head.weight", "lm_head.weight"),
    ]
    for i in range(config.n_layers):
        h, m = f"h.{i}.", f"model.layers.{i}."
        out += [Link(h + "ln_1.weight", m + "input_layernorm.weight"),
                Link(h + "ln_2.weight", m + "post_attention_layernorm.weight")]  # fmt: skip
        for kind in ("weight", "bias"):
            out += [
                Link(f"{h}attn.c_attn.{kind}", f"{m}self_attn.q_proj.{kind}", (0, q)),
                Link(f"{h}attn.c_attn.{kind}", f"{m}self_attn.k_proj.{kind}", (q, q + kv)),
                Link(f"{h}attn.c_attn.{kind}", f"{m}self_attn.v_proj.{kind}", (q + kv, q + 2 * kv)),
                Link(f"{h}attn.c_proj.{kind}", f"{m}self_attn.o_proj.{kind}"),
                Link(f"{h}mlp.c_fc.{kind}", f"{m}mlp.gate_proj.{kind}", (0, F)),
                Link(f"{h}mlp.c_fc.{kind}", f"{m}mlp.up_proj.{kind}", (F, 2 * F)),
                Link(f"{h}mlp.c_proj.{kind}", f"{m}mlp.down_proj.{kind}"),
            ]
    return out


def widest(config: GPTConfig) -> GPTConfig:
    """`config` with every bias and an untied head: a shape for every tk name `links` uses."""
    return GPTConfig.from_dict({**config.to_dict(), "bias": True, "qkv_bias": True, "tie_embeddings": False})


def hf_names(config: GPTConfig, *, qkv_bias: bool, o_bias: bool, mlp_bias: bool, tied: bool) -> set[str]:
    """The tensors a transformers checkpoint of this shape holds, given its biases and tying."""

    def has(name: str) -> bool:
        if name == "lm_head.weight":
            return not tied
        if not name.endswith(".bias"):
            return True
        return mlp_bias if ".mlp." in name else o_bias if ".o_proj." in name else qkv_bias

    return {link.hf for link in links(config) if has(link.hf)}


@dataclass(frozen=True)
class Imported:
    """What a transformers config.json says in tk's terms."""

    config: GPTConfig  # tied as config.json says; the checkpoint may untie it (see pipeline/hf_import.py)
    hf_names: set[str]  # the tensors the checkpoint must hold (lm_head.weight only when untied)
    architecture: str  # LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM


def gpt_config(path: Any, hf: dict, context_length: int | None = None) -> Imported:
    """tk's config for a llama, mistral or qwen2 config.json, or one PipelineError line naming
    what tk's GPT does not compute. `context_length`: a window shorter than the checkpoint's
    max_position_embeddings (rotary positions are relative, so the model computes the same on
    what fits in it; Llama 3.1's 131,072 is beyond tk's longest context)."""
    kind = hf["model_type"]

    def refuse(what: str) -> PipelineError:
        return PipelineError(f"{path}: {what}")

    def get(key: str, default: Any = None) -> Any:
        return hf[key] if hf.get(key) is not None else default

    missing = [key for key in _REQUIRED if hf.get(key) is None]
    if missing:
        raise refuse(f"lacks {missing[0]}; is it a {MODEL_TYPES[kind]} config.json as transformers saves it?")
    act = get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise refuse(f"hidden_act {act!r} is not SiLU; tk's SwiGLU gates with silu")
    heads, d_model = hf["num_attention_heads"], hf["hidden_size"]
    kv_heads = hf["num_key_value_heads"] if "num_key_value_heads" in hf else _KV_HEADS.get(kind)
    if kv_heads is None:  # transformers' None: one K/V head per query head
        kv_heads = heads
    head_dim = get("head_dim")
    if (
        head_dim is not None
        and isinstance(heads, int)
        and isinstance(d_model, int)
        and heads > 0
        and (type(head_dim) is not int or head_dim * heads != d_model)
    ):
        raise refuse(
            f"head_dim {head_dim!r} is not hidden_size / num_attention_heads ({d_model} / {heads}); tk's heads "
            "split the width evenly"
        )
    context = hf["max_position_embeddings"]
    theta, scaling = _rope(hf, context, refuse)
    if context_length is not None:
        if isinstance(context, int) and not 0 < context_length <= context:
            raise refuse(f"--context {context_length:,} must be from 1 to max_position_embeddings, {context:,}")
        context = context_length
    if isinstance(context, int) and context > MAX_CONTEXT_LENGTH:
        raise refuse(
            f"max_position_embeddings {context:,} is beyond tk's longest context, {MAX_CONTEXT_LENGTH:,}; give "
            f"--context N (at most {MAX_CONTEXT_LENGTH:,}) to import it with a window of N tokens"
        )
    _check_sliding_window(hf, kind, context, refuse)
    eps = get("rms_norm_eps", 1e-6)
    if kind == "llama":
        qkv = o = get("attention_bias", False) is True
        mlp = get("mlp_bias", False) is True
    else:  # Qwen2: q, k, v biases, always; Mistral: none
        qkv, o, mlp = kind == "qwen2", False, False
    bias = o or mlp  # tk's bias: every Linear layer's; the checkpoint's missing ones read as zeros
    tied = get("tie_word_embeddings", False) is True
    try:
        config = llama_config(
            vocab_size=hf["vocab_size"],
            context_length=context,
            d_model=d_model,
            n_layers=hf["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=kv_heads,
            mlp_hidden=hf["intermediate_size"],
            norm_eps=eps,
            rope_theta=theta,
            rope_scaling=scaling,
            tie_embeddings=tied,
            bias=bias,
            qkv_bias=qkv,
        )
    except ModelError as err:
        raise refuse(str(err)) from None
    return Imported(config, hf_names(config, qkv_bias=qkv, o_bias=o, mlp_bias=mlp, tied=tied), MODEL_TYPES[kind])


def _rope(hf: dict, context: Any, refuse) -> tuple[float, dict[str, Any] | None]:
    """The base of the rotary wavelengths and tk's rope_scaling (None: the default RoPE), read as
    transformers reads them: `rope_scaling` with `rope_theta` beside it when rope_scaling is
    there (transformers 4 reads only these; 5 takes them over `rope_parameters`), else
    `rope_parameters` (what transformers 5 writes). Llama 3's scaling without
    original_max_position_embeddings takes max_position_embeddings, as transformers 5 does.
    Any other RoPE is refused by name."""
    scaling = hf.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise refuse(f"rope_scaling {str(scaling)[:40]!r} is not a JSON object")
    params = hf.get("rope_parameters")
    if scaling:
        params = {"rope_theta": hf.get("rope_theta", 10000.0), **scaling}
    elif not isinstance(params, dict):
        params = {"rope_theta": hf.get("rope_theta", 10000.0)}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default" and (not isinstance(rope_type, str) or rope_type not in ROPE_SCALINGS):
        raise refuse(
            f"RoPE scaling {str(rope_type)[:40]!r} (rope_type) changes the rotary angles in a way tk does not compute;"
            f" tk computes the default RoPE, {' and '.join(ROPE_SCALINGS)}"
        )
    factor = params.get("partial_rotary_factor", 1.0)
    if factor != 1.0:
        raise refuse(f"partial_rotary_factor {factor!r} rotates part of each head; tk rotates all of it")
    taken = [_HF_ROPE_NAMES.get(name, name) for name in ROPE_SCALINGS.get(rope_type, ())]
    extra = sorted(set(params) - set(_ROPE_KEYS) - set(taken))
    if extra:
        which = (
            "the default RoPE does not take; is it scaled?" if rope_type == "default" else f"{rope_type} does not take"
        )
        raise refuse(f"rope_parameters holds {extra[0]!r}, which {which}")
    theta = params.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta):
        raise refuse(f"rope_theta {theta!r} is not a number")
    if rope_type == "default":
        return float(theta), None
    values = {"original_max_position_embeddings": context, **params}
    missing = [name for name in taken if name not in values]
    if missing:
        raise refuse(f"RoPE scaling {rope_type!r} lacks {missing[0]}")
    names = ROPE_SCALINGS[rope_type]
    return float(theta), {"type": rope_type, **{name: values[_HF_ROPE_NAMES.get(name, name)] for name in names}}


def hf_rope(config: GPTConfig) -> dict[str, Any]:
    """transformers' `rope_parameters` for a tk config: the rope_type, its numbers under
    transformers' names, and rope_theta.

    >>> hf_rope(llama_config(rope_scaling={"type": "linear", "factor": 4.0}))
    {'rope_type': 'linear', 'factor': 4.0, 'rope_theta': 10000.0}
    """
    scaling = config.rope_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    numbers = {_HF_ROPE_NAMES.get(name, name): getattr(scaling, name) for name in ROPE_SCALINGS[scaling.type]}
    return {"rope_type": scaling.type, **numbers, "rope_theta": config.rope_theta}


def _check_sliding_window(hf: dict, kind: str, context: Any, refuse) -> None:
    """Refuse a sliding window shorter than the context (attention to the last `window` positions
    only, where tk attends to every one); a window at least the context long never bites."""
    window = hf.get("sliding_window")
    layer_types = hf.get("layer_types")
    if isinstance(layer_types, list):
        odd = [t for t in layer_types if t not in ("full_attention", "sliding_attention")]
        if odd:
            raise refuse(f"layer_types holds {str(odd[0])[:40]!r}; tk's layers are full attention")
    if kind == "llama":
        return
    if kind == "qwen2":
        if not hf.get("use_sliding_window", False):
            return
        if isinstance(layer_types, list):
            sliding = "sliding_attention" in layer_types
        else:  # transformers makes the layers from max_window_layers on slide
            layers, first = hf.get("num_hidden_layers"), hf.get("max_window_layers", 28)
            sliding = not (isinstance(layers, int) and isinstance(first, int) and layers <= first)
        if not sliding:
            return
    if window is None or (isinstance(window, int) and isinstance(context, int) and window >= context):
        return
    raise refuse(
        f"sliding_window {window!r} is shorter than the context ({context!r}); its layers attend to the last "
        f"{window!r} positions only, and tk's to all of them"
    )


def hf_config(
    config: GPTConfig, eos: int | None, marker: dict[str, str], architecture: str = "LlamaForCausalLM"
) -> tuple[dict[str, Any], set[str]]:
    """transformers' config.json for a Llama-family tk model, and the tensor names of its
    checkpoint. LlamaForCausalLM: tk's `bias` is Llama's attention_bias and mlp_bias; q, k, v
    biases alone (Qwen2's) are attention_bias with a zero o_proj bias. Qwen2ForCausalLM (for a
    model without `bias`): q, k, v biases always (zeros where tk has none), no sliding window."""
    if architecture == "Qwen2ForCausalLM":
        return _qwen2_config(config, eos, marker), hf_names(
            config, qkv_bias=True, o_bias=False, mlp_bias=False, tied=config.tie_embeddings
        )
    attention_bias = config.bias or config.has_qkv_bias
    names = hf_names(
        config, qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=config.bias, tied=config.tie_embeddings
    )
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_common_config(config, eos, marker),
        "attention_bias": attention_bias,
        "mlp_bias": config.bias,
    }
    return hf, names


def _qwen2_config(config: GPTConfig, eos: int | None, marker: dict[str, str]) -> dict[str, Any]:
    """Qwen2ForCausalLM's config.json: every layer full attention (no sliding window)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **_common_config(config, eos, marker),
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config.n_layers,
        "layer_types": ["full_attention"] * config.n_layers,
    }


def _common_config(config: GPTConfig, eos: int | None, marker: dict[str, str]) -> dict[str, Any]:
    """What LlamaConfig and Qwen2Config say alike."""
    common = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.hidden,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": config.norm_eps,
        "rope_parameters": hf_rope(config),
        "rope_theta": config.rope_theta,  # what transformers 4 reads (5 reads rope_parameters first)
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos,
        "dtype": "float32",
        **marker,
    }
    if config.rope_scaling is not None:  # transformers 4 reads rope_scaling; 5 reads it first, with rope_theta
        common["rope_scaling"] = {k: v for k, v in common["rope_parameters"].items() if k != "rope_theta"}
    return common


__all__ = ["MODEL_TYPES", "Imported", "Link", "gpt_config", "hf_config", "hf_names", "hf_rope", "links", "widest"]
