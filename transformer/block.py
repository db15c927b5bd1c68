"""One transformer block, as a forward/backward pair: the three kinds a GPTConfig can ask for.

- `PostNormBlock`: the original encoder (seed 001), x = ln_1(x + attn(x)); x = ln_2(x + mlp(x)).
- `PreNormBlock`: GPT-2's and Llama's order, x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), with any
  norm (LayerNorm, RMSNorm) and activation (GELU, SwiGLU, ...).
- `GPT2Block`: `PreNormBlock` with LayerNorm and GELU, over the ops that fuse its elementwise
  passes on a GPU. The same math in the same order: on the CPU its numbers are PreNormBlock's bits.

`block_for(ops, config)` picks one. Each block's `forward(p, x, attend, grad, record, drop=None)` takes the
layer's parameters as (weight, bias or None) pairs under short names ("ln_1", "attn.c_attn", ...),
x (B, T, C) and `attend(qkv) -> (y, cache)`, the attention op the caller chose (full-sequence for
training, against a KV cache for generation; it rotates q and k when the positions are rotary).
It returns (x (B, T, C), cache, seen), `seen` being the block's trace entries under their short
names (transformer/trace.py; None values when `record` is off). `backward(dx, cache, g)` returns
d(input) and writes the layer's gradients into `g` under the same short names. `drop`, in a
training step with dropout (transformer/dropout.py's `for_layer`), makes the masks that multiply
each residual branch before it joins the stream (the attention weights' mask is `attend`'s);
GPT2Block then runs as PreNormBlock, whose unfused branches it can multiply (the same math).

A block given a `knockout` (transformer/ablation.py's, for this layer) replaces the outputs of the
heads and the MLP it names, after the attention (before c_proj) and after the MLP; without one (the
default) the forward is the plain one. Ablation is inference only: no backward follows it.

What this module does not do: the ops themselves (ops.py, or a GPU's device_ops.py), the
attention's caches and positions (model.py), the names of the whole model's parameters.
"""

from __future__ import annotations

import numpy as np

from tokenkit.transformer.config import GPTConfig
from tokenkit.transformer.dropout import ATTN_OUT, MLP_OUT


def norm_forward(ops, config: GPTConfig, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None):
    """The config's normalisation of x (..., C): LayerNorm (with its bias, if any) or RMSNorm."""
    if config.norm_type == "rmsnorm":
        return ops.rmsnorm_forward(x, weight, config.norm_eps)
    return ops.layernorm_forward(x, weight, bias, config.norm_eps)


def norm_backward(ops, config: GPTConfig, dout: np.ndarray, cache):
    """-> dx, dweight, dbias (None for RMSNorm, or LayerNorm without a bias)."""
    if config.norm_type == "rmsnorm":
        return (*ops.rmsnorm_backward(dout, cache), None)
    return ops.layernorm_backward(dout, cache)


def _with_bias(h, bias):
    """h + bias (a new array), or h without a bias: a projection's output as the trace shows it."""
    return h if bias is None else h + bias


def _pre_norm_seen(ln_1, attn_out, resid_1, ln_2, pre, act, mlp_out, x, record: bool) -> dict:
    """A pre-norm block's trace entries in the trace's order; the residual stream x (updated in
    place) is copied when recorded."""
    seen = {"ln_1": ln_1, "attn.out": attn_out, "resid_1": resid_1, "ln_2": ln_2, "mlp.pre": pre}
    return seen | {"mlp.act": act, "mlp.out": mlp_out, "resid_2": x.copy() if record else None}


class Block:
    """The halves every kind is made of: attention (c_attn, attend, c_proj) and MLP (c_fc, the
    activation, c_proj), each with its backward."""

    knockout = None  # this layer's parts knocked out (transformer/ablation.py's Knockout), set when ablated

    def __init__(self, ops, config: GPTConfig):
        self.ops, self.config = ops, config

    def norm(self, x, weight, bias):
        return norm_forward(self.ops, self.config, x, weight, bias)

    def norm_backward(self, dout, cache):
        return norm_backward(self.ops, self.config, dout, cache)

    def attention_half(self, p, a: np.ndarray, attend):
        """a (B, T, C) -> c_proj(attention(c_attn(a))) (B, T, C), caches (c_attn, attention, c_proj)."""
        y, qkv_caches = self.qkv_attention(p, a, attend)
        out, c_proj = self.ops.linear_forward(y, *p["attn.c_proj"])
        return out, (*qkv_caches, c_proj)

    def attention_half_backward(self, dout: np.ndarray, cache, g) -> np.ndarray:
        c_attn, attn, c_proj = cache
        dy, g["attn.c_proj.weight"], g["attn.c_proj.bias"] = self.ops.linear_backward(dout, c_proj)
        return self.qkv_attention_backward(dy, (c_attn, attn), g)

    def qkv_attention(self, p, a: np.ndarray, attend):
        """a (B, T, C) -> attention(c_attn(a)) (B, T, H hd), caches (c_attn, attention)."""
        qkv, c_attn = self.ops.linear_forward(a, *p["attn.c_attn"])  # (B, T, (H + 2 Hkv) hd)
        y, attn = attend(qkv)
        if self.knockout is not None:
            self.knockout.replace_heads(y)
        return y, (c_attn, attn)

    def qkv_attention_backward(self, dy: np.ndarray, cache, g) -> np.ndarray:
        """d(attention's output) -> d(c_attn's input): `qkv_attention` read backwards."""
        c_attn, (rope, attn) = cache
        dqkv = self.ops.attention_backward(dy, attn)
        if rope is not None:
            dqkv = self.ops.rope_backward(dqkv, rope)
        da, g["attn.c_attn.weight"], g["attn.c_attn.bias"] = self.ops.linear_backward(dqkv, c_attn)
        return da

    def mlp_half(self, p, m: np.ndarray, grad: bool):
        """m (B, T, C) -> c_proj(act(c_fc(m))) (B, T, C), caches (c_fc, act, c_proj), (pre, act).
        SwiGLU's act takes c_fc's [gate | up] (B, T, 2F) to (B, T, F)."""
        pre, c_fc = self.ops.linear_forward(m, *p["mlp.c_fc"])  # (B, T, F), or (B, T, 2F) with SwiGLU
        act, act_cache = getattr(self.ops, f"{self.config.activation}_forward")(pre, grad=grad)
        out, c_proj = self.ops.linear_forward(act, *p["mlp.c_proj"])
        if self.knockout is not None:
            self.knockout.replace_mlp(out)
        return out, (c_fc, act_cache, c_proj), (pre, act)

    def mlp_half_backward(self, dout: np.ndarray, cache, g) -> np.ndarray:
        c_fc, act_cache, c_proj = cache
        dact, g["mlp.c_proj.weight"], g["mlp.c_proj.bias"] = self.ops.linear_backward(dout, c_proj)
        dpre = getattr(self.ops, f"{self.config.activation}_backward")(dact, act_cache)
        dm, g["mlp.c_fc.weight"], g["mlp.c_fc.bias"] = self.ops.linear_backward(dpre, c_fc)
        return dm


def _dropped(branch: np.ndarray, drop, site: int):
    """(branch times its dropout mask, the mask), or (branch, None) without dropout."""
    if drop is None:
        return branch, None
    mask = drop(site, branch.shape, branch.dtype)
    return branch * mask, mask


def _undropped(dbranch: np.ndarray, mask):
    """d(a dropped branch) -> d(the branch): the same mask (a new array: dbranch may be dx)."""
    return dbranch if mask is None else dbranch * mask


class _Unfused(tuple):
    """A PreNormBlock's cache (GPT2Block's backward tells its own fused ones from it)."""


class PreNormBlock(Block):
    """x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). The residuals add in place (x is in no
    cache), so a recorded residual stream is a copy."""

    def forward(self, p, x, attend, grad: bool, record: bool, drop=None):
        a, ln_1 = self.norm(x, *p["ln_1"])
        ao, attn = self.attention_half(p, a, attend)
        ao, attn_mask = _dropped(ao, drop, ATTN_OUT)
        x, _ = self.ops.residual_forward(x, ao, inplace=True)
        resid_1 = x.copy() if record else None
        m, ln_2 = self.norm(x, *p["ln_2"])
        mo, mlp, (pre, act) = self.mlp_half(p, m, grad)
        mo, mlp_mask = _dropped(mo, drop, MLP_OUT)
        x, _ = self.ops.residual_forward(x, mo, inplace=True)
        cache = _Unfused((ln_1, *attn, ln_2, *mlp, (attn_mask, mlp_mask)))
        return x, cache, _pre_norm_seen(a, ao, resid_1, m, pre, act, mo, x, record)

    def backward(self, dx: np.ndarray, cache, g) -> np.ndarray:
        """The MLP half (x2 = x1 + mlp(ln_2(x1))), then the attention half."""
        ln_1, c_attn, attn, c_proj, ln_2, c_fc, act_cache, mlp_proj, (attn_mask, mlp_mask) = cache
        dx, dbranch = self.ops.residual_backward(dx, None)
        dm = self.mlp_half_backward(_undropped(dbranch, mlp_mask), (c_fc, act_cache, mlp_proj), g)
        dm, g["ln_2.weight"], g["ln_2.bias"] = self.norm_backward(dm, ln_2)
        dx += dm  # x1 reaches x2 both through the skip and through the MLP
        dx, dbranch = self.ops.residual_backward(dx, None)
        da = self.attention_half_backward(_undropped(dbranch, attn_mask), (c_attn, attn, c_proj), g)
        da, g["ln_1.weight"], g["ln_1.bias"] = self.norm_backward(da, ln_1)
        dx += da
        return dx


class GPT2Block(PreNormBlock):
    """PreNormBlock with LayerNorm and GELU, over the ops that fuse its elementwise passes: c_fc
    with its GELU; each c_proj's GEMM without its bias, which is added with the residual; the
    attention's residual with ln_2. x is updated in place. With dropout it is PreNormBlock."""

    def forward(self, p, x, attend, grad: bool, record: bool, drop=None):
        if drop is not None:  # the branches are multiplied before they join: PreNormBlock's unfused order
            return super().forward(p, x, attend, grad, record, drop)
        eps = self.config.norm_eps
        (w_attn, b_attn), (w_mlp, b_mlp) = p["attn.c_proj"], p["mlp.c_proj"]
        a, ln_1 = self.ops.layernorm_forward(x, *p["ln_1"], eps)
        y, qkv_caches = self.qkv_attention(p, a, attend)
        h, c_proj = self.ops.linear_forward(y, w_attn, None)  # its bias joins the residual
        ao = _with_bias(h, b_attn) if record else None
        m, ln_2 = self.ops.residual_layernorm_forward(x, h, b_attn, *p["ln_2"], eps)  # x += h + b; m = ln_2(x)
        resid_1 = x.copy() if record else None
        mlp_trace = {} if record else None
        act, c_fc = self.ops.linear_gelu_forward(m, *p["mlp.c_fc"], grad, mlp_trace)
        h, mlp_proj = self.ops.linear_forward(act, w_mlp, None)
        if self.knockout is not None and self.knockout.replace_mlp(h):
            b_mlp = None  # the replacement is the MLP's whole output, its bias included
        mo = _with_bias(h, b_mlp) if record else None
        x, resid_2_cache = self.ops.bias_residual_forward(x, h, b_mlp)
        seen = _pre_norm_seen(a, ao, resid_1, m, mlp_trace["pre"] if record else None, act, mo, x, record)
        return x, (ln_1, *qkv_caches, c_proj, ln_2, c_fc, mlp_proj, resid_2_cache), seen

    def backward(self, dx: np.ndarray, cache, g) -> np.ndarray:
        """The MLP's residual, c_proj, c_fc with GELU, then ln_2 with the attention's residual,
        c_proj, attention and c_attn, ln_1 with the skip (dx in place)."""
        if isinstance(cache, _Unfused):
            return super().backward(dx, cache, g)
        ln_1, c_attn, attn, c_proj, ln_2, c_fc, mlp_proj, resid_2 = cache
        dx, dbranch, g["mlp.c_proj.bias"] = self.ops.bias_residual_backward(dx, resid_2)
        dact, g["mlp.c_proj.weight"], _ = self.ops.linear_backward(dbranch, mlp_proj)
        dm, g["mlp.c_fc.weight"], g["mlp.c_fc.bias"] = self.ops.linear_gelu_backward(dact, c_fc)
        dx, g["ln_2.weight"], g["ln_2.bias"], g["attn.c_proj.bias"] = self.ops.residual_layernorm_backward(dx, dm, ln_2)
        dy, g["attn.c_proj.weight"], _ = self.ops.linear_backward(dx, c_proj)
        da = self.qkv_attention_backward(dy, (c_attn, attn), g)
        dx, g["ln_1.weight"], g["ln_1.bias"] = self.ops.layernorm_add_backward(dx, da, ln_1)
        return dx


class PostNormBlock(Block):
    """x = ln_1(x + attn(x)); x = ln_2(x + mlp(x)), the original encoder's order (seed 001)."""

    def forward(self, p, x, attend, grad: bool, record: bool, drop=None):
        ao, attn = self.attention_half(p, x, attend)
        ao, attn_mask = _dropped(ao, drop, ATTN_OUT)
        r1, _ = self.ops.residual_forward(x, ao)  # not in place: x is in c_attn's cache
        x1, ln_1 = self.norm(r1, *p["ln_1"])
        mo, mlp, (pre, act) = self.mlp_half(p, x1, grad)
        mo, mlp_mask = _dropped(mo, drop, MLP_OUT)
        r2, _ = self.ops.residual_forward(x1, mo)
        x2, ln_2 = self.norm(r2, *p["ln_2"])
        seen = {"attn.out": ao, "resid_1": r1, "ln_1": x1, "mlp.pre": pre, "mlp.act": act}
        seen |= {"mlp.out": mo, "resid_2": r2, "ln_2": x2}
        return x2, (ln_1, *attn, ln_2, *mlp, (attn_mask, mlp_mask)), seen

    def backward(self, dx: np.ndarray, cache, g) -> np.ndarray:
        """x2 = ln_2(x1 + mlp(x1)) read backwards, then x1 = ln_1(x0 + attn(x0))."""
        ln_1, c_attn, attn, c_proj, ln_2, c_fc, act_cache, mlp_proj, (attn_mask, mlp_mask) = cache
        dx, g["ln_2.weight"], g["ln_2.bias"] = self.norm_backward(dx, ln_2)
        dx, dbranch = self.ops.residual_backward(dx, None)
        dx += self.mlp_half_backward(_undropped(dbranch, mlp_mask), (c_fc, act_cache, mlp_proj), g)
        dx, g["ln_1.weight"], g["ln_1.bias"] = self.norm_backward(dx, ln_1)
        dx, dbranch = self.ops.residual_backward(dx, None)
        dx += self.attention_half_backward(_undropped(dbranch, attn_mask), (c_attn, attn, c_proj), g)
        return dx


def block_kind(config: GPTConfig) -> type[Block]:
    """Post-norm, GPT-2's (pre-norm with LayerNorm and GELU, over the fused ops) or any other pre-norm."""
    if config.norm == "post":
        return PostNormBlock
    if config.norm_type == "layernorm" and config.activation == "gelu":
        return GPT2Block
    return PreNormBlock
