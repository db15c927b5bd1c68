"""Direct logit attribution: one token's logit at one position, split into what each part of the
model wrote into the residual stream.

The residual stream the final norm reads is a sum: the embeddings (token + position; the token's
alone with rotary positions), each head's output (its weighted sum of values through its rows of
the output projection W_o, attn.c_proj), each MLP's output without its bias (mlp.act @ mlp.c_proj)
and the output biases (attn.c_proj's and mlp.c_proj's). The logit is ln_f(stream) . W_U[token]
(W_U = wte tied, lm_head untied), and ln_f is not linear; the standard linearisation freezes its
scale at the actual value:

    LayerNorm  ln_f(x) = (x - mean(x)) * s * g + b,  s = 1 / sqrt(var(x) + eps) frozen
    RMSNorm    ln_f(x) = x * s * g,                  s = 1 / sqrt(mean(x^2) + eps) frozen

With s fixed, ln_f is affine in x (the mean-centring is linear), so each part's share is its
vector dotted with one direction, d = centre(s * g * W_U[token]) (no centring for RMSNorm), and
ln_f's bias adds b . W_U[token]. At the actual stream the frozen s is the real one, so the shares
sum to the model's logit exactly (to float rounding; the tests hold them to 1e-4).

A post-norm model (`PostNormBlock`) has two more norms in each block on the residual path, ln_1
after the attention and ln_2 after the MLP; each is frozen the same way at its actual scale, so a
part's direction is d carried back through every norm after it, and those norms' biases join the
biases' share. A pre-norm block's ln_1 and ln_2 are not on the path (they feed the attention and
the MLP, whose outputs are taken as they are): nothing of them is frozen.

What a share is, and what it is not: a part's direct effect with every norm's scale held. It is
exactly the logit's change when that part's output is removed and the scales stay frozen, for a
part nothing later reads (the last block's MLP; a last-block head when that block's MLP does not
see it): tests/test_attribution.py checks it on a real ablation. It is not the first-order effect
of removing the part with the real norm (the norm's scale moves with the stream, and that term is
left out), and it leaves out every indirect path: a head's output that later layers read counts
only where it reaches ln_f directly. A head's share includes what its value bias (c_attn's) carries,
since the attention weights of a row sum to 1.

Shapes: L n_layers, H n_heads, hd head_dim, C d_model, F the MLP's width, V vocab_size. Computed in
float64 on the host from the trace of the model's own forward pass (transformer/trace.py), the
parameters brought to the host.

A model run with an ablation (`GPT.ablation`) is attributed as it ran: a knocked-out head's share
is its replaced weighted sum's (0 when zeroed), a knocked-out MLP's its replacement's, bias and
all (its bias's share is then 0).

What it deliberately does not do: ablate (running a model with parts knocked out is ablation.py's),
follow indirect paths (path patching), or draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenkit.transformer.ablation import Part
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.lens import one_sequence, record
from tokenkit.transformer.trace import layer_key, stream_keys


def keys(config) -> set[str]:
    """The trace entries `attribution_from_trace` reads for `config`."""
    out = {"tok_emb", stream_keys(config)[-1]}
    if config.positional != "rope":
        out.add("pos_emb")
    for layer in range(config.n_layers):
        out |= {layer_key(layer, "attn.mix"), layer_key(layer, "mlp.act")}
        if config.norm == "post":
            out |= {layer_key(layer, "resid_1"), layer_key(layer, "resid_2")}  # ln_1's and ln_2's inputs
    return out


@dataclass
class Attribution:
    """One logit split into shares that sum to it (see the module's docstring).

    position, token: which logit; logit: the model's own value of it. token_embedding,
    position_embedding: the embeddings' shares (position_embedding is 0.0 with rotary positions).
    heads (L, H): each head's share; mlps (L,): each MLP's, without its output bias.
    attn_biases (L,), mlp_biases (L,): attn.c_proj's and mlp.c_proj's biases' shares (0 without
    biases). norm_biases: ln_f's bias's share, and a post-norm block's ln_1's and ln_2's.
    scale: ln_f's frozen 1/std (1/rms for RMSNorm) at the position.
    """

    position: int
    token: int
    logit: float
    token_embedding: float
    position_embedding: float
    heads: np.ndarray
    mlps: np.ndarray
    attn_biases: np.ndarray
    mlp_biases: np.ndarray
    norm_biases: float
    scale: float

    def total(self) -> float:
        """The shares' sum: the logit, to float rounding."""
        parts = (self.heads.sum(), self.mlps.sum(), self.attn_biases.sum(), self.mlp_biases.sum())
        return float(self.token_embedding + self.position_embedding + self.norm_biases + sum(parts))

    def to_json(self) -> dict:
        """JSON-ready: `position`, `token`, `logit`, `sum` (of the shares), `scale` (ln_f's frozen
        1/std or 1/rms), `embeddings` {token, position}, `heads` [layer][head], `mlps` [layer],
        `biases` {attn: [layer], mlp: [layer], norm}."""
        return {
            "position": self.position,
            "token": self.token,
            "logit": self.logit,
            "sum": self.total(),
            "scale": self.scale,
            "embeddings": {"token": self.token_embedding, "position": self.position_embedding},
            "heads": self.heads.tolist(),
            "mlps": self.mlps.tolist(),
            "biases": {"attn": self.attn_biases.tolist(), "mlp": self.mlp_biases.tolist(), "norm": self.norm_biases},
        }


def _f64(a) -> np.ndarray:
    return np.asarray(as_host(a), dtype=np.float64)


def _through_norm(config, x: np.ndarray, weight: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float]:
    """The norm of the row x (C,) with its scale frozen, read backwards: the direction d (C,) a
    vector is dotted with after it -> the direction before it, and the frozen scale."""
    if config.norm_type == "rmsnorm":
        s = 1.0 / np.sqrt((x * x).mean() + config.norm_eps)
        return s * weight * d, float(s)
    s = 1.0 / np.sqrt(x.var() + config.norm_eps)
    back = s * weight * d
    return back - back.mean(), float(s)  # (x - mean x) . v = x . (v - mean v)


def _check(config, T: int, position: int, token: int | None) -> tuple[int, int | None]:
    """position (negative from the end) and token (None: the prediction) -> (position from 0, token)."""

    def whole(n) -> bool:
        return isinstance(n, (int, np.integer)) and not isinstance(n, bool)

    if not whole(position) or not -T <= position < T:
        raise ModelError(f"position {position} is not a position of this text: it has {T} token(s), 0..{T - 1}")
    V = config.vocab_size
    if token is not None and (not whole(token) or not 0 <= token < V):
        raise ModelError(f"token {token} is not in the model's vocabulary: ids are 0..{V - 1}")
    return int(position) % T, None if token is None else int(token)


@np.errstate(over="ignore", invalid="ignore")  # weights too large for float32 give inf, not warnings
def attribute(model, ids, position: int = -1, token: int | None = None) -> Attribution:
    """Direct logit attribution of `model` (a transformer.GPT) on ids (T,): the logit of `token`
    (default: the model's prediction there, its logits' argmax) at `position` (default the last;
    negative counts from the end), split into shares (`Attribution`)."""
    ids = one_sequence(ids)
    _check(model.config, ids.size, position, token)  # before the forward pass
    trace, logits = record(model, ids, keys(model.config))
    return attribution_from_trace(model, trace, logits, position, token)


@np.errstate(over="ignore", invalid="ignore")  # weights too large for float32 give inf, not warnings
def attribution_from_trace(model, trace: dict, logits: np.ndarray, position: int = -1, token: int | None = None):
    """`attribute` from `lens.record`'s (trace, logits (T, V)), the trace holding `keys(config)`."""
    cfg, p = model.config, model.params
    t, token = _check(cfg, logits.shape[0], position, token)
    if token is None:
        token = int(np.argmax(logits[t]))
    L, H, hd = cfg.n_layers, cfg.n_heads, cfg.head_dim
    unembed = p["wte.weight" if cfg.tie_embeddings else "lm_head.weight"]
    d = _f64(unembed[token])  # (C,): the direction the stream is read along after every norm so far

    def bias_share(name: str) -> float:
        return float(_f64(p[name]) @ d) if name in p else 0.0

    norm_biases = bias_share("ln_f.bias")
    d, scale = _through_norm(cfg, _f64(trace[stream_keys(cfg)[-1]][t]), _f64(p["ln_f.weight"]), d)
    heads, mlps = np.zeros((L, H)), np.zeros(L)
    attn_biases, mlp_biases = np.zeros(L), np.zeros(L)
    for layer in reversed(range(L)):
        h = layer_key(layer, "")
        if cfg.norm == "post":  # block output = ln_2(resid_2)
            norm_biases += bias_share(h + "ln_2.bias")
            d, _ = _through_norm(cfg, _f64(trace[h + "resid_2"][t]), _f64(p[h + "ln_2.weight"]), d)
        knocked = None if model.ablation is None else model.ablation.replacement(Part(layer, None))
        if knocked is not None:  # an ablated MLP's output is its replacement, bias and all (transformer/ablation.py)
            mlps[layer] = knocked @ d
        else:
            mlps[layer] = _f64(trace[h + "mlp.act"][t]) @ (_f64(p[h + "mlp.c_proj.weight"]) @ d)
            mlp_biases[layer] = bias_share(h + "mlp.c_proj.bias")
        if cfg.norm == "post":  # the MLP's input = ln_1(resid_1)
            norm_biases += bias_share(h + "ln_1.bias")
            d, _ = _through_norm(cfg, _f64(trace[h + "resid_1"][t]), _f64(p[h + "ln_1.weight"]), d)
        per_head = (_f64(p[h + "attn.c_proj.weight"]) @ d).reshape(H, hd)  # each head's rows of W_o, read along d
        heads[layer] = np.einsum("hd,hd->h", _f64(trace[h + "attn.mix"][:, t]), per_head)
        attn_biases[layer] = bias_share(h + "attn.c_proj.bias")
    pos = 0.0 if cfg.positional == "rope" else float(_f64(trace["pos_emb"][t]) @ d)
    return Attribution(
        position=t,
        token=token,
        logit=float(logits[t, token]),
        token_embedding=float(_f64(trace["tok_emb"][t]) @ d),
        position_embedding=pos,
        heads=heads,
        mlps=mlps,
        attn_biases=attn_biases,
        mlp_biases=mlp_biases,
        norm_biases=norm_biases,
        scale=scale,
    )
