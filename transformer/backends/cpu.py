"""The CPU backend's ops: transformer/ops.py as it is (NumPy, cache-tiled row blocks and query
tiles, every op beside its plain twin in transformer/reference.py).

`OPS` names what a backend's op module provides: the model (transformer/model.py) and AdamW
(transformer/optim.py) call nothing else, and the GPU's op set
(transformer/backends/device_ops.py) has each of these names with the same parameters
(tests/test_backends.py checks it).

What this module deliberately does not do: define any math of its own.
"""

from tokenkit.transformer.ops import (
    LN_EPS,
    adamw_update,
    attention_backward,
    attention_forward,
    attention_forward_cached,
    bias_residual_backward,
    bias_residual_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    layernorm_add_backward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
    linear_gelu_backward,
    linear_gelu_forward,
    positional_backward,
    positional_forward,
    relu_backward,
    relu_forward,
    residual_backward,
    residual_forward,
    residual_layernorm_backward,
    residual_layernorm_forward,
    rmsnorm_backward,
    rmsnorm_forward,
    rope_backward,
    rope_forward,
    silu_backward,
    silu_forward,
    sinusoidal_table,
    softmax_xent_backward,
    softmax_xent_forward,
    swiglu_backward,
    swiglu_forward,
    unembed,
)

OPS = (
    "embedding_forward", "embedding_backward", "sinusoidal_table", "positional_forward", "positional_backward",
    "layernorm_forward", "layernorm_backward", "linear_forward", "linear_backward", "residual_forward",
    "residual_backward", "attention_forward", "attention_backward", "attention_forward_cached", "gelu_forward",
    "gelu_backward", "relu_forward", "relu_backward", "softmax_xent_forward", "softmax_xent_backward", "adamw_update",
    "rope_forward", "rope_backward", "rmsnorm_forward", "rmsnorm_backward", "silu_forward", "silu_backward",
    "swiglu_forward", "swiglu_backward", "linear_gelu_forward", "linear_gelu_backward", "bias_residual_forward",
    "bias_residual_backward", "residual_layernorm_forward", "residual_layernorm_backward", "layernorm_add_backward",
    "unembed",
)  # fmt: skip

__all__ = ["LN_EPS", "OPS", *OPS]
