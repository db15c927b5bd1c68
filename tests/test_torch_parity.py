"""Our GPT and AdamW against PyTorch autograd and torch.optim.AdamW, with identical weights.

Runs only where PyTorch is installed (skipped cleanly elsewhere, e.g. in CI). The reference
model below is written from GPT-2's definition with torch's own layers (F.layer_norm with eps
1e-5, tanh F.gelu, F.cross_entropy), reading our parameter dict as GPT-2 checkpoints lay it out:
linear weights are Conv1D-style (in, out), so a linear layer is x @ W + b. Llama's family's
pieces are written as HF's modeling_llama writes them (rotate_half, repeat_kv, RMSNorm,
silu(gate) * up). Where transformers is installed too, its own LlamaForCausalLM and
Qwen2ForCausalLM, given our weights, give our logits. Every comparison prints the max difference
of every tensor when one of them is off.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from tokenkit.transformer import GPT, GPTConfig, ops  # noqa: E402
from tokenkit.transformer.config import llama_config  # noqa: E402
from tokenkit.transformer.optim import AdamW, clip_grad_norm  # noqa: E402

VARIANTS = {
    "gpt2": dict(),
    "seed001-encoder": dict(positional="sinusoidal", activation="relu", norm="post", causal=False, bias=False),
    "post-causal": dict(norm="post"),
    "pre-bidirectional-relu-nobias": dict(causal=False, activation="relu", bias=False, positional="sinusoidal"),
    "llama-gqa": dict(positional="rope", norm_type="rmsnorm", activation="swiglu", mlp_hidden=20, bias=False,
                      tie_embeddings=False, n_kv_heads=1, rope_theta=500.0, norm_eps=1e-6),
    "qwen2-qkv-bias": dict(positional="rope", norm_type="rmsnorm", activation="swiglu", mlp_hidden=20, bias=False,
                           qkv_bias=True),
    "rope-post-layernorm-relu": dict(positional="rope", norm="post", activation="relu", n_kv_heads=3, causal=False),
}  # fmt: skip


def torch_rotate_half(x: "torch.Tensor") -> "torch.Tensor":
    """HF Llama's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def torch_rope(x: "torch.Tensor", theta: float, start: int = 0) -> "torch.Tensor":
    """x (B, heads, T, hd) rotated as HF's apply_rotary_pos_emb does (angles in float64)."""
    hd, T = x.shape[-1], x.shape[-2]
    inv_freq = theta ** -(torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angle = torch.arange(start, start + T, dtype=torch.float64)[:, None] * inv_freq
    emb = torch.cat([angle, angle], dim=-1)
    return x * emb.cos().to(x.dtype) + torch_rotate_half(x) * emb.sin().to(x.dtype)


def torch_rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def torch_gqa(qkv, H, Hkv, causal, theta=None):
    """qkv (B, T, (H + 2 Hkv) hd) -> (B, T, H hd) by torch's scaled_dot_product_attention,
    K/V heads repeated for their groups (HF's repeat_kv); rotary positions first with theta."""
    B, T, W = qkv.shape
    hd = W // (H + 2 * Hkv)
    q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    q, k, v = (t.reshape(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
    if theta is not None:
        q, k = torch_rope(q, theta), torch_rope(k, theta)
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return y.transpose(1, 2).reshape(B, T, H * hd)


def torch_gpt(p: dict, cfg: GPTConfig, ids: "torch.Tensor") -> "torch.Tensor":
    """GPT-2's forward on a dict of torch tensors with our names: ids (B, T) -> logits (B, T, V)."""
    B, T = ids.shape
    C, H, Hkv = cfg.d_model, cfg.n_heads, cfg.kv_heads
    hd = C // H

    def ln(name, x):
        if cfg.norm_type == "rmsnorm":
            return torch_rmsnorm(x, p[f"{name}.weight"], cfg.norm_eps)
        return F.layer_norm(x, (C,), p[f"{name}.weight"], p.get(f"{name}.bias"), eps=cfg.norm_eps)

    def linear(name, x):
        y = x @ p[f"{name}.weight"]
        return y + p[f"{name}.bias"] if f"{name}.bias" in p else y

    def attention(i, x):
        q, k, v = linear(f"h.{i}.attn.c_attn", x).split([C, Hkv * hd, Hkv * hd], dim=-1)
        q, k, v = (t.reshape(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
        if cfg.positional == "rope":
            q, k = torch_rope(q, cfg.rope_theta), torch_rope(k, cfg.rope_theta)
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)  # HF's repeat_kv
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if cfg.causal:
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return linear(f"h.{i}.attn.c_proj", y.transpose(1, 2).reshape(B, T, C))

    def mlp(i, x):
        pre = linear(f"h.{i}.mlp.c_fc", x)
        if cfg.activation == "swiglu":
            gate, up = pre.chunk(2, dim=-1)
            act = F.silu(gate) * up
        else:
            act = F.gelu(pre, approximate="tanh") if cfg.activation == "gelu" else F.relu(pre)
        return linear(f"h.{i}.mlp.c_proj", act)

    x = p["wte.weight"][ids]
    if cfg.positional == "learned":
        x = x + p["wpe.weight"][:T]
    elif cfg.positional == "sinusoidal":  # "Attention is all you need": PE[t, 2j] = sin(t / 10000^(2j/C)), cos(...)
        t = torch.arange(T, dtype=x.dtype)[:, None]
        angle = t / 10000.0 ** (torch.arange(0, C, 2, dtype=x.dtype) / C)
        pe = torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(T, C)
        x = x + pe
    for i in range(cfg.n_layers):
        if cfg.norm == "pre":
            x = x + attention(i, ln(f"h.{i}.ln_1", x))
            x = x + mlp(i, ln(f"h.{i}.ln_2", x))
        else:
            x = ln(f"h.{i}.ln_1", x + attention(i, x))
            x = ln(f"h.{i}.ln_2", x + mlp(i, x))
    return ln("ln_f", x) @ p["wte.weight" if cfg.tie_embeddings else "lm_head.weight"].T


def randomised_model(cfg: GPTConfig, dtype, seed: int) -> GPT:
    """A GPT whose every parameter is random and O(1)-ish (not GPT-2's tiny init, under which
    biases are 0 and LayerNorm gains 1, and wrong gradients of them could hide)."""
    model = GPT(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    for name, value in model.params.items():
        if ".ln_" in name or name.startswith("ln_f"):
            new = (1.0 if name.endswith(".weight") else 0.0) + 0.2 * rng.standard_normal(value.shape)
        else:
            fan_in = value.shape[0] if value.ndim == 2 and not name.startswith(("wte", "wpe", "lm_head")) else 1
            new = rng.standard_normal(value.shape) / math.sqrt(fan_in) * (0.5 if value.ndim == 2 else 0.2)
        model.params[name] = np.ascontiguousarray(new, dtype=dtype)
    return model


def diff_report(ours: dict, theirs: dict, rtol: float, atol: float) -> tuple[bool, str]:
    """(all close, one line per tensor with its max absolute and relative differences)."""
    ok, lines = True, []
    for name in theirs:
        a, b = np.asarray(ours[name], dtype=np.float64), np.asarray(theirs[name], dtype=np.float64)
        if a.shape != b.shape:
            ok = False
            lines.append(f"{name:<28} shape {a.shape} vs {b.shape}")
            continue
        abs_diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        close = bool(np.allclose(a, b, rtol=rtol, atol=atol))
        ok &= close
        lines.append(f"{name:<28} max|diff| {abs_diff:.3e}  max|ref| {scale:.3e}  {'ok' if close else 'MISMATCH'}")
    return ok, "\n".join(lines)


@pytest.mark.parametrize(
    "dtype, rtol, atol", [(np.float64, 1e-9, 1e-11), (np.float32, 2e-4, 2e-5)], ids=["float64", "float32"]
)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_loss_logits_and_every_gradient_match_autograd(variant, dtype, rtol, atol):
    cfg = GPTConfig(vocab_size=13, context_length=9, d_model=12, n_layers=2, n_heads=3, **VARIANTS[variant])
    model = randomised_model(cfg, dtype, seed=sorted(VARIANTS).index(variant))
    rng = np.random.default_rng(7)
    ids = rng.integers(0, cfg.vocab_size, size=(3, 7))  # T < context_length: unused wpe rows get 0
    targets = rng.integers(0, cfg.vocab_size, size=(3, 7))

    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    tp = {name: torch.tensor(value, dtype=tdtype, requires_grad=True) for name, value in model.params.items()}
    t_logits = torch_gpt(tp, cfg, torch.from_numpy(ids))
    t_loss = F.cross_entropy(t_logits.reshape(-1, cfg.vocab_size), torch.from_numpy(targets).reshape(-1))
    t_loss.backward()

    logits = model.forward(ids)
    loss, grads = model.loss_and_grads(ids, targets)
    assert logits.dtype == dtype and all(g.dtype == dtype for g in grads.values())
    assert grads.keys() == model.params.keys()
    ok, report = diff_report(
        {"loss": np.array(loss), "logits": logits, **grads},
        {
            "loss": t_loss.detach().numpy(),
            "logits": t_logits.detach().numpy(),
            **{n: t.grad.numpy() for n, t in tp.items()},
        },
        rtol,
        atol,
    )
    assert ok, f"{variant} {np.dtype(dtype).name}, max differences to autograd:\n{report}"


def check_against_autograd(f_np, backward, f_torch, inputs, dtype, rtol, atol, seed=0):
    """Our op (f_np -> (out, cache), backward(dout, cache) -> input gradient(s)) against torch's
    autograd of f_torch: the output and every input's gradient under a random upstream gradient."""
    rng = np.random.default_rng(seed)
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    out, cache = f_np(*inputs)
    r = rng.standard_normal(out.shape).astype(dtype)
    ours = backward(r, cache)
    ours = ours if isinstance(ours, tuple) else (ours,)
    tin = [torch.tensor(a, dtype=tdtype, requires_grad=True) for a in inputs]
    t_out = f_torch(*tin)
    (t_out * torch.from_numpy(r)).sum().backward()
    ok, report = diff_report(
        {"out": out, **{f"d{i}": g for i, g in enumerate(ours)}},
        {"out": t_out.detach().numpy(), **{f"d{i}": t.grad.numpy() for i, t in enumerate(tin)}},
        rtol,
        atol,
    )
    assert ok, report


OP_TOLERANCES = pytest.mark.parametrize(
    "dtype, rtol, atol", [(np.float64, 1e-11, 1e-12), (np.float32, 2e-5, 2e-6)], ids=["float64", "float32"]
)


@OP_TOLERANCES
def test_rmsnorm_and_swiglu_match_autograd(dtype, rtol, atol):
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((2, 5, 12)) * 2 + 0.5).astype(dtype)
    w = rng.standard_normal(12).astype(dtype)
    check_against_autograd(lambda x, w: ops.rmsnorm_forward(x, w, 1e-6), ops.rmsnorm_backward,
                           lambda x, w: torch_rmsnorm(x, w, 1e-6), (x, w), dtype, rtol, atol)  # fmt: skip
    h = (rng.standard_normal((2, 5, 16)) * 2).astype(dtype)
    check_against_autograd(ops.swiglu_forward, ops.swiglu_backward, lambda h: F.silu(h[..., :8]) * h[..., 8:], (h,),
                           dtype, rtol, atol)  # fmt: skip


@OP_TOLERANCES
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H, Hkv", [(4, 1), (4, 2), (4, 4)], ids=["multi-query", "grouped", "multi-head"])
def test_grouped_query_attention_and_rope_match_autograd(H, Hkv, causal, dtype, rtol, atol):
    """Grouped-query attention against torch's scaled_dot_product_attention with repeated K/V
    heads, with and without rotary positions (HF's rotate_half) applied first."""
    qkv = np.random.default_rng(22).standard_normal((2, 6, (H + 2 * Hkv) * 4)).astype(dtype)
    check_against_autograd(lambda a: ops.attention_forward(a, H, causal, n_kv_heads=Hkv), ops.attention_backward,
                           lambda a: torch_gqa(a, H, Hkv, causal), (qkv,), dtype, rtol, atol)  # fmt: skip

    def rope_attention(a):
        rotated, rope = ops.rope_forward(a, H, Hkv, 500000.0)
        out, attn = ops.attention_forward(rotated, H, causal, n_kv_heads=Hkv)
        return out, (rope, attn)

    def rope_attention_backward(dout, cache):
        return ops.rope_backward(ops.attention_backward(dout, cache[1]), cache[0])

    check_against_autograd(rope_attention, rope_attention_backward,
                           lambda a: torch_gqa(a, H, Hkv, causal, theta=5e5), (qkv,), dtype, rtol, atol)  # fmt: skip


@pytest.mark.parametrize(
    "dtype, rtol, atol", [(np.float64, 1e-12, 1e-14), (np.float32, 1e-5, 1e-6)], ids=["float64", "float32"]
)
def test_adamw_and_clipping_match_torch(dtype, rtol, atol):
    rng = np.random.default_rng(3)
    shapes = {
        "wte.weight": (7, 4),
        "h.0.attn.c_attn.weight": (4, 12),
        "h.0.attn.c_attn.bias": (12,),
        "ln_f.weight": (4,),
    }
    params = {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    tparams = {n: torch.nn.Parameter(torch.tensor(v, dtype=tdtype)) for n, v in params.items()}
    groups = [
        {"params": [t for t in tparams.values() if t.dim() >= 2], "weight_decay": 0.1},
        {"params": [t for t in tparams.values() if t.dim() < 2], "weight_decay": 0.0},
    ]
    t_opt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    opt = AdamW(params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(6):
        grads = {n: (rng.standard_normal(s) * 3).astype(dtype) for n, s in shapes.items()}
        for n, t in tparams.items():
            t.grad = torch.tensor(grads[n], dtype=tdtype)
        t_norm = float(torch.nn.utils.clip_grad_norm_(list(tparams.values()), max_norm=4.0))
        norm = clip_grad_norm(grads, 4.0)
        assert norm == pytest.approx(t_norm, rel=1e-6)
        lr = 1e-2 * (0.7**step)
        for group in t_opt.param_groups:
            group["lr"] = lr
        t_opt.step()
        opt.step(grads, lr=lr)
        ok, report = diff_report(params, {n: t.detach().numpy() for n, t in tparams.items()}, rtol, atol)
        assert ok, f"after step {step + 1}:\n{report}"


# ----------------------------------------------------------------------------- transformers' own models


def hf_weights(model: GPT) -> dict[str, "torch.Tensor"]:
    """Our parameters under HF Llama's (and Qwen2's) names: the fused c_attn split into q, k, v,
    c_fc into gate and up, every (in, out) weight transposed to torch's (out, in)."""
    cfg, p = model.config, model.params
    C, F, kv = cfg.d_model, cfg.hidden, cfg.kv_heads * cfg.head_dim
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    out = {"model.embed_tokens.weight": t(p["wte.weight"]), "model.norm.weight": t(p["ln_f.weight"])}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = t(p["lm_head.weight"])
    for i in range(cfg.n_layers):
        h, hf = f"h.{i}.", f"model.layers.{i}."
        w = p[h + "attn.c_attn.weight"]
        columns = {"q_proj": slice(0, C), "k_proj": slice(C, C + kv), "v_proj": slice(C + kv, C + 2 * kv)}
        for name, cols in columns.items():
            out[f"{hf}self_attn.{name}.weight"] = t(w[:, cols].T)
            if cfg.has_qkv_bias:
                out[f"{hf}self_attn.{name}.bias"] = t(p[h + "attn.c_attn.bias"][cols])
        out[f"{hf}self_attn.o_proj.weight"] = t(p[h + "attn.c_proj.weight"].T)
        out[f"{hf}mlp.gate_proj.weight"] = t(p[h + "mlp.c_fc.weight"][:, :F].T)
        out[f"{hf}mlp.up_proj.weight"] = t(p[h + "mlp.c_fc.weight"][:, F:].T)
        out[f"{hf}mlp.down_proj.weight"] = t(p[h + "mlp.c_proj.weight"].T)
        out[f"{hf}input_layernorm.weight"] = t(p[h + "ln_1.weight"])
        out[f"{hf}post_attention_layernorm.weight"] = t(p[h + "ln_2.weight"])
    return out


def in_float64(hf, inv_freq: "torch.Tensor | None" = None) -> None:
    """HF computes its rotary angles and RMSNorm in float32 whatever the model's dtype (and its
    eager attention's softmax: the test uses torch's SDPA); in a float64 model this does both in
    float64 (the same arithmetic without the round trip through float32), as ours are, so the
    two compare at float64's precision. `inv_freq`: a scaled model's frequencies in float64
    (default: the unscaled ones of its rope_theta)."""
    cfg = hf.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    if inv_freq is None:
        inv_freq = cfg.rope_parameters["rope_theta"] ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def rotary(x, position_ids):
        emb = (position_ids[..., None].double() * inv_freq).repeat(1, 1, 2)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def rmsnorm(module):
        return lambda h: module.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon))

    hf.model.rotary_emb.forward = rotary
    for module in hf.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = rmsnorm(module)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-9), (np.float32, 1e-4)], ids=["float64", "float32"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_transformers_llama_and_qwen2_give_our_logits(arch, dtype, tol):
    """transformers' LlamaForCausalLM (grouped-query, untied) and Qwen2ForCausalLM (q, k, v
    biases, tied embeddings), randomly initialised and then given our weights under their
    names: the same logits (the float64 run with HF's float32 steps made float64)."""
    transformers = pytest.importorskip("transformers")
    qwen2 = arch == "qwen2"
    cfg = llama_config(vocab_size=37, context_length=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                       mlp_hidden=48, rope_theta=1e4 if qwen2 else 5e5, norm_eps=1e-6,
                       qkv_bias=qwen2, tie_embeddings=qwen2)  # fmt: skip
    model = randomised_model(cfg, dtype, seed=5)
    hf_config = (transformers.Qwen2Config if qwen2 else transformers.LlamaConfig)(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.context_length, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
    )  # fmt: skip
    hf_config._attn_implementation = "sdpa"  # torch's attention: eager's softmax is float32 whatever the dtype
    torch.manual_seed(0)
    hf = (transformers.Qwen2ForCausalLM if qwen2 else transformers.LlamaForCausalLM)(hf_config)
    hf = hf.to(torch.float64 if dtype == np.float64 else torch.float32).eval()
    missing, unexpected = hf.load_state_dict(hf_weights(model), strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if cfg.tie_embeddings else set()), missing
    if dtype == np.float64:
        in_float64(hf)
    ids = np.random.default_rng(8).integers(0, cfg.vocab_size, size=(2, 11))
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids)).logits.numpy()
    ours = model.forward(ids)
    ok, report = diff_report({"logits": ours}, {"logits": theirs}, rtol=tol, atol=tol)
    assert ok, f"{arch} {np.dtype(dtype).name}:\n{report}"


def tk_named(tensors: dict[str, "torch.Tensor"], cfg: GPTConfig) -> dict[str, np.ndarray]:
    """HF Llama's tensors (parameters or their gradients) under our names and layouts: hf_weights'
    way back (q, k, v side by side in c_attn, gate and up in c_fc, (out, in) transposed); no biases."""
    a = lambda name: tensors[name].detach().numpy()  # noqa: E731
    out = {"wte.weight": a("model.embed_tokens.weight"), "ln_f.weight": a("model.norm.weight")}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = a("lm_head.weight")
    for i in range(cfg.n_layers):
        h, hf = f"h.{i}.", f"model.layers.{i}."
        out[h + "ln_1.weight"] = a(hf + "input_layernorm.weight")
        out[h + "attn.c_attn.weight"] = np.concatenate([a(f"{hf}self_attn.{x}_proj.weight").T for x in "qkv"], axis=1)
        out[h + "attn.c_proj.weight"] = a(hf + "self_attn.o_proj.weight").T
        out[h + "ln_2.weight"] = a(hf + "post_attention_layernorm.weight")
        out[h + "mlp.c_fc.weight"] = np.concatenate([a(f"{hf}mlp.{x}_proj.weight").T for x in ("gate", "up")], axis=1)
        out[h + "mlp.c_proj.weight"] = a(hf + "mlp.down_proj.weight").T
    return out


# Llama 3.1's scaling with its three bands on heads of 8 at theta 100 (wavelengths 6.3, 19.9, 63,
# 199: under 16 / 2 kept, 19.9 blended, over 16 / 0.5 divided by 8), and linear's; transformers' names
HF_SCALINGS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
               "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "factor": 4.0},
}  # fmt: skip


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-9), (np.float32, 2e-4)], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", HF_SCALINGS)
def test_a_rope_scaled_llama_trains_as_transformers_llama_does(kind, dtype, tol):
    """transformers' LlamaForCausalLM with the same rope_scaling and our weights, trained side by
    side on windows of 30 (past the original context of 16): the same loss and every gradient,
    then, in float64, the same clipped AdamW steps (torch.optim.AdamW) for three steps. HF's own
    float32 table of scaled frequencies is ours to float32's rounding; the float64 run computes
    its angles in float64 from ours (`in_float64`), the float32 run with HF's own table."""
    transformers = pytest.importorskip("transformers")
    numbers = {k: v for k, v in HF_SCALINGS[kind].items() if k != "rope_type"}
    scaling = {"type": kind, **numbers}
    if kind == "llama3":
        scaling["original_context_length"] = scaling.pop("original_max_position_embeddings")
    cfg = llama_config(vocab_size=37, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                       mlp_hidden=48, rope_theta=100.0, norm_eps=1e-6, rope_scaling=scaling)  # fmt: skip
    model = randomised_model(cfg, dtype, seed=9)
    hf_config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.context_length, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False,
        rope_parameters={**HF_SCALINGS[kind], "rope_theta": cfg.rope_theta},
    )  # fmt: skip
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_config).to(torch.float64 if dtype == np.float64 else torch.float32)
    missing, unexpected = hf.load_state_dict(hf_weights(model), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    rotary = hf.model.rotary_emb
    inv_freq = ops.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    assert rotary.attention_scaling == 1.0  # neither scaling scales the attention
    np.testing.assert_allclose(rotary.inv_freq.double().numpy(), inv_freq, rtol=1e-6)
    assert not np.allclose(inv_freq, ops.rope_inv_freq(cfg.head_dim, cfg.rope_theta), rtol=1e-3)  # the premise
    if dtype == np.float64:
        in_float64(hf, torch.from_numpy(inv_freq))
    params = dict(hf.named_parameters())
    t_opt = torch.optim.AdamW(
        [
            {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    opt = AdamW(model.params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    rng = np.random.default_rng(10)
    for step in range(3 if dtype == np.float64 else 1):  # float32's updates of near-zero gradients differ
        ids, targets = (rng.integers(0, cfg.vocab_size, size=(2, 30)) for _ in range(2))
        loss, grads = model.loss_and_grads(ids, targets)
        t_opt.zero_grad()
        logits = hf(torch.from_numpy(ids)).logits
        t_loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.from_numpy(targets).reshape(-1))
        t_loss.backward()
        theirs = tk_named({n: p.grad for n, p in params.items()}, cfg)
        assert theirs.keys() == grads.keys()
        ours = {"loss": np.array(loss), **grads}
        ok, report = diff_report(ours, {"loss": t_loss.detach().numpy(), **theirs}, tol, tol)
        assert ok, f"{kind} {np.dtype(dtype).name}, step {step + 1}, max differences to transformers:\n{report}"
        if dtype != np.float64:
            break
        norm = clip_grad_norm(grads, 1.0)
        assert norm == pytest.approx(float(torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)), rel=1e-9)
        opt.step(grads, lr=1e-2)
        t_opt.step()
        ok, report = diff_report(model.params, tk_named(params, cfg), tol, tol)
        assert ok, f"{kind}: weights after step {step + 1}:\n{report}"
