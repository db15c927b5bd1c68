"""GPT: parameters in one flat dict with GPT-2's names, a forward pass that can record its
intermediates, the whole-model backward, and the forward of new positions against a KV cache
that generation steps through (`generate`, `generate_batch`; the loop is transformer/generation.py).

The forward reads as the architecture does: embed, add positions, N blocks of attention and
MLP with residuals and LayerNorm (pre- or post-norm), a final LayerNorm, and logits from the
tied token embedding. `_backward` walks the same list from the top down. The model computes in
the dtype of its parameters: float32 to train, float64 for finite-difference checks.

The same code runs Llama's family (transformer/config.py): with rotary positions nothing is
added to the embeddings and q and k are rotated in each layer's attention; RMSNorm stands where
LayerNorm does; the MLP's activation may be SwiGLU's gated product; attention may share K/V
heads between groups of query heads (the KV cache then holds n_kv_heads heads); and the logits
may come from an untied lm_head.

The model is one process over plain arrays, as nanoGPT's model.py: it knows nothing of worker
processes, ranks, BLAS threads or malloc. `transformer.parallel.DataParallel` wraps a GPT with
the same call signature to split each batch over processes (as DDP wraps a module), and
`transformer.runtime` holds the CPU settings that the executors and the pipeline switch on.
`shard_loss` and `shard_loss_and_grads` are the pieces they split a batch into: a shard's loss
and gradients already scaled for the whole batch's mean, so shards are summed.

Its arrays live on one device, "cpu" (NumPy) or "cuda" (CuPy): every layer is called as
`self.ops.<op>` and every array made with `self.xp`, both from the device's backend
(transformer/backends), so the math below is written once for both. `GPT(config,
device="cuda")`, `GPT.load(path, device=...)` and `model.to(device)` choose it. Ids, files and
sampling stay on the host (`host_params`, `save`), so a model trained on one device runs on the
other.

What this module does not do: the blocks' forward/backward pairs (block.py), the math of each
layer (ops.py, each op with its plain twin in reference.py; on a GPU backends/device_ops.py),
the choice of the next token (sampling.py), generation's windows, caches and captured steps
(generation.py), splitting batches over processes (parallel.py), CPU settings (runtime.py),
files (io.py), the optimizer (optim.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np

from tokenkit.transformer import generation, io
from tokenkit.transformer.backends import Backend, as_host, get_backend
from tokenkit.transformer.block import Block, block_kind, norm_backward, norm_forward
from tokenkit.transformer.config import GPTConfig, param_shapes
from tokenkit.transformer.dropout import ATTN_WEIGHTS, Dropout, for_layer
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.loss import IGNORE, batch_counted, head_backward, head_forward
from tokenkit.transformer.memory import check_memory
from tokenkit.transformer.sampling import check_sampling, mask_from, sample_next
from tokenkit.transformer.trace import layer_key, unrotated

# ----------------------------------------------------------------------------- the model


# Token embeddings' initial std beside fixed sinusoids of amplitude 1: at GPT-2's 0.02 the
# positions swamp the tokens and the model barely learns (the sweep is in BENCHMARKS.md).
SINUSOIDAL_WTE_STD = 0.2


def init_params(config: GPTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: weights N(0, 0.02), residual projections (attn.c_proj,
    mlp.c_proj) N(0, 0.02 / sqrt(2 * n_layers)) so the residual stream's variance does not grow
    with depth, biases 0, LayerNorm (and RMSNorm) gains 1; with sinusoidal positions the token
    embedding is N(0, SINUSOIDAL_WTE_STD) instead. An untied lm_head is N(0, 0.02) like wte.
    Drawn in a fixed order from one seeded generator."""
    rng = np.random.default_rng(seed)
    resid_std = 0.02 / math.sqrt(2 * config.n_layers)
    params = {}
    for name, shape in param_shapes(config).items():
        if name.endswith(".bias"):
            params[name] = np.zeros(shape, dtype=np.float32)
        elif ".ln_" in name or name.startswith("ln_f"):
            params[name] = np.ones(shape, dtype=np.float32)
        else:
            std = resid_std if name.endswith("c_proj.weight") else 0.02
            if name == "wte.weight" and config.positional == "sinusoidal":
                std = SINUSOIDAL_WTE_STD
            params[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    return params


class _CopyInto(dict):
    """A dict that stores each array by copying it into the preallocated array of the same name
    (None, an absent bias's gradient, is stored as is)."""

    def __init__(self, targets: dict[str, np.ndarray]):
        super().__init__()
        self.targets = targets

    def __setitem__(self, name: str, value) -> None:
        if value is not None:
            np.copyto(self.targets[name], value)
            value = self.targets[name]
        super().__setitem__(name, value)


class _Prefixed:
    """Writes `name` into `grads` as prefix + name: one block's gradients under their full names."""

    __slots__ = ("grads", "prefix")

    def __init__(self, grads: dict, prefix: str):
        self.grads, self.prefix = grads, prefix

    def __setitem__(self, name: str, value) -> None:
        self.grads[self.prefix + name] = value


class GPT:
    """A GPT-style transformer in NumPy (or CuPy on a GPU), in one process.

    One GPT must not be used from several threads at the same time (its scratch buffers are
    shared between calls).

    `device` ("cpu" or "cuda", default "cpu") is where its parameters live and its math runs;
    the initial weights are drawn on the host, so a seed gives the same model on either device.
    On "cuda", `params`, `forward`'s logits and `loss_and_grads`' gradients are CuPy arrays;
    ids may be NumPy or CuPy; losses are floats; generation yields ints (`generate_batch`: (B,)
    NumPy arrays).

    >>> m = GPT(GPTConfig(vocab_size=10, context_length=8, d_model=8, n_layers=1, n_heads=2))
    >>> m.forward(np.array([[1, 2, 3]])).shape, m.device
    ((1, 3, 10), 'cpu')
    """

    # A model made with GPT.__new__ (e.g. over a worker's shared arrays) is on the CPU.
    backend: Backend = get_backend("cpu")
    ops = backend.ops
    xp = backend.xp
    ablation = None  # heads and MLPs knocked out in every forward (transformer/ablation.py), or None

    def __init__(self, config: GPTConfig, seed: int = 0, device: str = "cpu"):
        if not isinstance(config, GPTConfig):
            raise ModelError(f"expected a GPTConfig, got {type(config).__name__}")
        backend = get_backend(device)  # before allocating: a missing GPU is one line
        check_memory(config, device=device)  # before init_params allocates: one line, not a MemoryError
        self.config = config
        self._use(backend)
        self.params: dict[str, np.ndarray] = self._on_device(init_params(config, seed))
        self._scratch: dict[tuple, np.ndarray] = {}

    def _use(self, backend: Backend) -> None:
        self.backend, self.ops, self.xp = backend, backend.ops, backend.xp

    def _on_device(self, params: dict) -> dict:
        """Host arrays -> the same arrays on this model's device (themselves on the CPU)."""
        return {name: self.backend.to_device(p) for name, p in params.items()}

    @property
    def device(self) -> str:
        """Where the parameters live: "cpu" or "cuda"."""
        return self.backend.name

    def to(self, device: str) -> GPT:
        """Move the parameters to `device` ("cpu" or "cuda") and return this model. Values are
        kept (float32 stays float32); scratch buffers are dropped. Move a model before creating
        its optimizer (AdamW keeps the arrays it was given), as with PyTorch."""
        backend = get_backend(device)
        if backend is not self.backend:
            host = {name: as_host(p) for name, p in self.params.items()}
            self._use(backend)
            self.params = self._on_device(host)
            self._scratch = {}
        return self

    def host_params(self) -> dict[str, np.ndarray]:
        """The parameters as host NumPy arrays, keyed like `params`: the arrays themselves on the
        CPU, copies from a GPU. What files and other processes get."""
        return {name: as_host(p) for name, p in self.params.items()}

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        """Copy `params` (host or device arrays keyed like `params`, of the same shapes) into this
        model's parameters, in place and on its device, cast to their dtype: whoever holds the
        arrays (an optimizer, worker processes) sees the new values."""
        for name, p in self.params.items():  # all checked before any is changed
            if tuple(params[name].shape) != p.shape:
                raise ModelError(f"parameter {name} has shape {p.shape}; the new value has {tuple(params[name].shape)}")
        for name, p in self.params.items():
            value = as_host(params[name])
            if isinstance(p, np.ndarray):
                p[...] = value
            else:  # a device array takes a device array of its dtype (CuPy copies no host array implicitly)
                p[...] = self.backend.to_device(np.asarray(value, dtype=p.dtype))

    @classmethod
    def from_params(cls, config: GPTConfig, params: dict[str, np.ndarray], device: str = "cpu") -> GPT:
        """A model on `device` with the given weights (checked against the config's names and
        shapes; on the CPU used as they are when already contiguous float32, else converted)."""
        if not isinstance(config, GPTConfig):
            raise ModelError(f"expected a GPTConfig, got {type(config).__name__}")
        get_backend(device)  # a missing GPU is one line first
        check_memory(config, loaded=True, device=device)  # the weights are here; the table and caches are not yet
        expected = param_shapes(config)
        missing = [name for name in expected if name not in params]
        if missing:
            raise ModelError(f"weights lack {len(missing)} parameter(s), e.g. {missing[0]}; is this the right model?")
        for name, shape in expected.items():
            if tuple(params[name].shape) != shape:
                raise ModelError(f"parameter {name} has shape {tuple(params[name].shape)}, the config needs {shape}")
        model = cls.__new__(cls)
        model.config = config
        model._use(get_backend(device))
        model.params = model._on_device(
            {name: np.ascontiguousarray(as_host(params[name]), dtype=np.float32) for name in expected}
        )
        model._scratch = {}
        return model

    # ------------------------------------------------------------------------- inputs

    def _check_ids(self, ids, what: str = "ids") -> np.ndarray:
        """int array (B, T) or (T,) -> (B, T) intp on the host, with the model's limits enforced."""
        a = as_host(ids)
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim != 2 or a.shape[1] == 0 or a.shape[0] == 0:
            raise ModelError(f"{what} must be a non-empty (B, T) or (T,) array of token ids, got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise ModelError(f"{what} must be integers, got dtype {a.dtype}")
        if a.shape[1] > self.config.context_length:
            raise ModelError(
                f"{what} has {a.shape[1]} positions, more than context_length {self.config.context_length};"
                " crop the sequence"
            )
        if a.min() < 0 or a.max() >= self.config.vocab_size:
            raise ModelError(
                f"{what} must lie in [0, {self.config.vocab_size}), got values in [{a.min()}, {a.max()}];"
                " was the tokenizer trained with a larger vocabulary?"
            )
        return a.astype(np.intp, copy=False)

    def _positions(self) -> np.ndarray:
        """(context_length, C) table: the learned wpe, or the fixed sinusoids in the model's dtype."""
        if self.config.positional == "learned":
            return self.params["wpe.weight"]
        dtype = self.params["wte.weight"].dtype
        key = ("sinusoidal", dtype)
        if key not in self._scratch:
            self._scratch[key] = self.ops.sinusoidal_table(self.config.context_length, self.config.d_model, dtype)
        return self._scratch[key]

    def _buffer(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A scratch array reused across calls of the same shape (the logits: the biggest one)."""
        key = (name, shape, np.dtype(dtype))
        buf = self._scratch.get(key)
        if buf is None:
            self._scratch = {k: v for k, v in self._scratch.items() if k[0] != name}
            buf = self._scratch[key] = self.xp.empty(shape, dtype=dtype)
        return buf

    # ------------------------------------------------------------------------- forward

    def _layer(self, i: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Block i's parameters as (weight, bias or None) pairs under short names ("ln_1", ...)."""
        p, h = self.params, f"h.{i}."
        names = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
        return {name: (p[h + name + ".weight"], p.get(h + name + ".bias")) for name in names}

    def _norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None):
        return norm_forward(self.ops, self.config, x, weight, bias)

    def _norm_backward(self, dout: np.ndarray, cache):
        return norm_backward(self.ops, self.config, dout, cache)

    def _unembedding(self) -> np.ndarray:
        """(V, C): the logits' weights, wte itself when tied (GPT-2), else lm_head.weight."""
        return self.params["wte.weight" if self.config.tie_embeddings else "lm_head.weight"]

    def _rope(self, qkv: np.ndarray, start: int):
        """qkv of positions start.. -> (q and k rotated, cache) with rotary positions, else (qkv, None)."""
        if self.config.positional != "rope":
            return qkv, None
        cfg = self.config
        return self.ops.rope_forward(qkv, cfg.n_heads, cfg.n_kv_heads, cfg.rope_theta, start, scaling=cfg.rope_scaling)

    def _block_forward(self, i: int, x: np.ndarray, trace: dict | None, attend, grad: bool = False, drop=None):
        """Block i: x (B, T, C) -> (B, T, C), cache. `attend(qkv, seen=None)` is the attention op:
        full-sequence for training, incremental with a KV cache for generation; given a dict `seen`,
        it records its entries there. `grad`: a backward will follow (the activation then caches
        its derivative). The block's trace is filled here, the one place, from what its attention
        and the block saw. `drop`: the layer's dropout masks (`dropout.for_layer`), training only. With an
        `ablation`, the block gets its layer's knockout, and the trace's per-head weighted sums show
        the heads as the ablation left them."""
        block = self._block()
        knockout = block.knockout = None if self.ablation is None else self.ablation.layers.get(i)
        if drop is not None:
            attend = partial(attend, drop=drop)
        if trace is None:
            x, cache, _ = block.forward(self._layer(i), x, attend, grad, False, drop)
            return x, cache
        attention_seen: dict[str, np.ndarray] = {}
        x, cache, seen = block.forward(self._layer(i), x, partial(attend, seen=attention_seen), grad, True, drop)
        if knockout is not None:
            knockout.replace_mix(attention_seen["attn.mix"])
        trace.update({layer_key(i, name): value for name, value in (attention_seen | seen).items()})
        return x, cache

    def _block(self) -> Block:
        """The config's kind of block (transformer/block.py) over this model's ops."""
        return block_kind(self.config)(self.ops, self.config)

    def _embed(self, ids: np.ndarray, trace: dict | None):
        """ids (B, T) -> x0 (B, T, C) = token embedding + positional encoding, cache. Rotary
        positions add nothing here (they turn q and k in every layer): x0 is the token embedding."""
        tok, emb = self.ops.embedding_forward(self.backend.to_device(ids), self.params["wte.weight"])
        if self.config.positional == "rope":
            if trace is not None:  # copies: the pre-norm residuals add into x in place
                trace["tok_emb"], trace["x0"] = tok.copy(), tok.copy()
            return tok, (emb, None)
        pos, pos_cache = self.ops.positional_forward(self._positions(), ids.shape[1])
        x = tok + pos
        if trace is not None:
            trace["tok_emb"], trace["pos_emb"], trace["x0"] = tok, pos.copy(), x.copy()
        return x, (emb, pos_cache)

    def _forward(self, ids: np.ndarray, trace: dict | None, keep_cache: bool, dropout: Dropout | None = None):
        """ids (B, T) -> final LayerNorm output (B, T, C), caches (None unless keep_cache).
        `dropout`: a training step's (transformer/dropout.py), for these rows of its batch."""
        cfg = self.config
        if keep_cache and self.ablation is not None:
            raise ModelError("an ablated model runs forward only; set its ablation to None to train or take gradients")
        x, embed_cache = self._embed(ids, trace)

        def attend(qkv, seen: dict | None = None, drop=None):
            rotated, rope = self._rope(qkv, 0)
            if seen is not None and rope is not None:
                seen.update(unrotated(cfg, qkv))
            op_seen = {} if seen is not None else None  # the op's names, without the block's "attn."
            extra = {}
            if drop is not None:  # training's mask of the weights, (B, H, T, T)
                B, T = qkv.shape[:2]
                extra["drop"] = drop(ATTN_WEIGHTS, (B, cfg.n_heads, T, T), qkv.dtype)
            out, cache = self.ops.attention_forward(rotated, cfg.n_heads, cfg.causal, op_seen, cfg.n_kv_heads, **extra)
            if seen is not None:
                seen.update({"attn." + name: value for name, value in op_seen.items()})
            return out, (rope, cache)

        blocks = []
        for i in range(cfg.n_layers):
            x, cache = self._block_forward(
                i, x, trace, attend, grad=keep_cache, drop=for_layer(dropout, i, self.backend)
            )
            if keep_cache:
                blocks.append(cache)
            del cache  # without keep_cache, a block's intermediates die with the block
        xf, ln_f = self._norm(x, self.params["ln_f.weight"], self.params.get("ln_f.bias"))
        if trace is not None:
            trace["ln_f"] = xf
        return xf, (embed_cache, blocks, ln_f) if keep_cache else None

    def forward(self, ids, trace: dict | None = None) -> np.ndarray:
        """ids (B, T) or (T,) -> logits (B, T, V) from the tied embedding: logits = ln_f(x) W_e^T
        (or ln_f(x) lm_head^T when untied).

        With `trace` (a dict) the intermediates are recorded under the names and shapes that
        transformer/trace.py declares; when it is None nothing extra is computed or kept.
        """
        ids = self._check_ids(ids)
        wte = self._unembedding()
        xf, _ = self._forward(ids, trace, keep_cache=False)
        logits = (xf.reshape(-1, xf.shape[-1]) @ wte.T).reshape(*ids.shape, wte.shape[0])
        if trace is not None:
            trace["logits"] = logits
        return logits

    def check_pair(self, ids, targets) -> tuple[np.ndarray, np.ndarray]:
        """(ids, targets) as (B, T) intp arrays of the same shape, within the model's limits; a
        target may be IGNORE (transformer/loss.py: it does not count)."""
        ids = self._check_ids(ids)
        targets = as_host(targets)
        counted = np.asarray(targets) != IGNORE
        targets = np.where(counted, self._check_ids(np.where(counted, targets, 0), "targets"), IGNORE)
        if targets.shape != ids.shape:
            raise ModelError(f"targets have shape {targets.shape}, ids {ids.shape}; they must match")
        return ids, targets

    def shard_loss(self, ids: np.ndarray, targets: np.ndarray, batch_rows: int, n_total: int | None = None) -> float:
        """A shard's share of a `batch_rows`-row batch's mean loss over its `n_total` counted
        positions (default: every position, batch_rows x T): its own mean times its counted
        positions / n_total. Inputs as `check_pair` returns them."""
        xf, _ = self._forward(ids, None, keep_cache=False)
        loss, n, _ = head_forward(self, xf, targets)
        return loss * (n / (n_total or batch_rows * ids.shape[1]))

    def shard_loss_and_grads(self, ids: np.ndarray, targets: np.ndarray, n_total: int, into=None, dropout=None):
        """A shard's (loss share, grads), both scaled for the mean over the n_total counted positions
        of the whole batch, so that the shards' results add up to the batch's. With `into` (arrays keyed
        like params, e.g. a worker's shared buffers) each gradient is copied there as soon as it
        is computed and its own array freed, so no second full set is ever held. `dropout`: a
        training step's (transformer/dropout.py), its `first_row` this shard's in the step's batch."""
        xf, caches = self._forward(ids, None, keep_cache=True, dropout=dropout)
        loss, n, head = head_forward(self, xf, targets)
        grads = _CopyInto(into) if into is not None else {}
        return loss * (n / n_total), self._backward(head, caches, n_total, grads)

    def loss(self, ids, targets) -> float:
        """Mean cross-entropy of predicting targets (B, T) from ids (B, T) over the positions
        that count (a target of IGNORE does not); forward only, for eval."""
        ids, targets = self.check_pair(ids, targets)
        return float(self.shard_loss(ids, targets, ids.shape[0], batch_counted(targets)))

    def loss_and_grads(self, ids, targets, dropout: Dropout | None = None) -> tuple[float, dict[str, np.ndarray]]:
        """-> (mean cross-entropy loss over the counted positions, grads keyed and ordered like params);
        with a training step's `dropout` (transformer/dropout.py) for these rows."""
        ids, targets = self.check_pair(ids, targets)
        loss, grads = self.shard_loss_and_grads(ids, targets, batch_counted(targets), dropout=dropout)
        return float(loss), {name: grads[name] for name in self.params}  # drops the absent biases' None

    # ------------------------------------------------------------------------- backward

    def _backward(self, head, caches, n_total: int, grads: dict) -> dict[str, np.ndarray]:
        """The forward read from the top down: loss, tied unembedding, ln_f, blocks N-1..0,
        positions, token embedding (whose gradient adds to the unembedding's when tied).
        `n_total` is the number of counted positions the mean loss runs over (more than this
        shard's); `head` the loss head's cache (transformer/loss.py). Fills and returns `grads`."""
        embed_cache, blocks, ln_f = caches
        tied = self.config.tie_embeddings
        unembed = "wte.weight" if tied else "lm_head.weight"
        grads[unembed], dxf = head_backward(self, head, self.params[unembed], n_total)  # (V, C), (B, T, C)
        dx, grads["ln_f.weight"], grads["ln_f.bias"] = self._norm_backward(dxf, ln_f)
        for i in reversed(range(self.config.n_layers)):
            dx = self._block_backward(i, dx, blocks[i], grads)
        emb, pos_cache = embed_cache
        if self.config.positional == "learned":
            grads["wpe.weight"] = self.ops.positional_backward(dx, pos_cache)
        if tied:
            self.ops.embedding_backward(dx, emb, dweight=grads["wte.weight"])
        else:
            grads["wte.weight"] = self.ops.embedding_backward(dx, emb)
        return grads

    def _block_backward(self, i: int, dx: np.ndarray, cache, grads: dict) -> np.ndarray:
        """d(block i's output) (B, T, C) -> d(its input) (B, T, C); its grads go into `grads`."""
        return self._block().backward(dx, cache, _Prefixed(grads, f"h.{i}."))

    # ------------------------------------------------------------------------- generation

    def generate(
        self,
        ids,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_token: int | None = None,
        use_cache: bool = True,
        observe: Callable[[np.ndarray, np.ndarray], None] | None = None,
        n_tokens: int | None = None,
    ) -> Iterator[int]:
        """Yield up to max_new_tokens new token ids, one at a time, continuing the prompt ids (T,).

        temperature 0 is greedy; top_k / top_p filter before sampling; `seed` makes it
        repeatable. Stops after yielding stop_token. Arguments are checked before the first token.
        observe(logits, probs), when given, is called before each token is yielded with the
        model's (V,) logits and the (V,) distribution the token was drawn from (after
        temperature, top-k and top-p; one-hot when greedy): what `tk serve` shows of each step.

        The model sees a window of at most context_length tokens. A prompt longer than that is
        cropped to its last context_length tokens. When the window is full, it shifts: the
        next token is predicted from the last context_length // 2 tokens only, and the window
        grows again from there until it is full once more (a "context shift", as llama.cpp
        does). Positions are absolute within the window, so every shift recomputes the window;
        shifting by half a window rather than by one token pays for that once per
        context_length // 2 new tokens instead of once per token, at the price of a shorter
        context just after each shift. One warning says when the prompt or the text outgrows
        the context.

        With use_cache (and causal attention) each step computes only the new position's
        q, k, v and appends k, v to per-layer caches; without it every step reruns the whole
        window. Both follow the same windows, so both give the same tokens.

        `n_tokens`: ids from it up are never picked (their logits count as -inf, greedy too):
        a vocabulary padded beyond its tokenizer's `n_tokens` has rows no text decodes from.
        """
        prompt = as_host(ids)
        if prompt.ndim == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.ndim != 1 or prompt.size == 0:
            raise ModelError(f"generate takes one non-empty prompt (T,) or (1, T), got shape {prompt.shape}")
        self._check_generation(prompt[None, :], max_new_tokens, n_tokens)
        check_sampling(temperature, top_k, top_p, seed)
        rng = np.random.default_rng(seed)

        def pick(logits) -> int:  # sampling runs on the host
            host = self.backend.to_host(logits[0])
            seen = None if observe is None else lambda probs: observe(host, probs)
            choose = host if n_tokens is None else mask_from(host, n_tokens)
            return sample_next(choose, rng, temperature=temperature, top_k=top_k, top_p=top_p, observe=seen)

        steps = (
            generation.steps_cached(self, 1) if use_cache and self.config.causal else generation.steps_uncached(self)
        )
        return generation.run(
            list(prompt.tolist()), int(max_new_tokens), self.config.context_length, pick, stop_token, steps
        )

    def generate_batch(
        self, ids, max_new_tokens: int, *, use_cache: bool = True, n_tokens: int | None = None
    ) -> Iterator[np.ndarray]:
        """Greedy decoding of B prompts at once: yield max_new_tokens (B,) int arrays, each step's
        next token of every row. ids (B, T): prompts of one length (no padding).

        Every row runs through each step's forward together, (B, 1) new positions against
        (B, Hkv, T_max, hd) caches, so a step costs one launch of each op whatever B is. Each row's
        tokens are the ones `generate(row, max_new_tokens, temperature=0)` gives, windows and
        context shifts included. The argmax runs on the model's device: B ids come back per
        step, not B x V logits. Greedy only, and no stop token (every row gets
        max_new_tokens); `use_cache` and `n_tokens` as in `generate`.
        """
        prompts = as_host(ids)
        if prompts.ndim != 2 or prompts.size == 0:
            raise ModelError(f"generate_batch takes non-empty prompts (B, T), got shape {prompts.shape}")
        self._check_generation(prompts, max_new_tokens, n_tokens)

        def pick(logits) -> np.ndarray:  # (B, V) on the device -> (B,) ids on the host
            if n_tokens is not None:
                logits[:, n_tokens:] = -np.inf
            return self.backend.to_host(self.xp.argmax(logits, axis=-1))

        rows = prompts.shape[0]
        steps = (
            generation.steps_cached(self, rows) if use_cache and self.config.causal else generation.steps_uncached(self)
        )
        columns = list(prompts.T.astype(np.intp))  # one (B,) column per position: `generation.window`'s form
        return generation.run(columns, int(max_new_tokens), self.config.context_length, pick, None, steps)

    def _check_generation(self, prompts: np.ndarray, max_new_tokens, n_tokens: int | None) -> None:
        """Raise ModelError (one line) for prompts (B, T) or counts that generation cannot take."""
        self._check_ids(prompts[:, -self.config.context_length :], "prompt")
        if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 0:
            raise ModelError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens}")
        if n_tokens is not None and not 0 < n_tokens <= self.config.vocab_size:
            raise ModelError(f"n_tokens must be in [1, {self.config.vocab_size}], got {n_tokens}")

    def next_logits(self, ids) -> np.ndarray:
        """ids (B, T) -> the next token's logits (B, V) after each row's last position: the whole
        window computed, only its last position unembedded (generation without a KV cache)."""
        xf, _ = self._forward(ids, None, keep_cache=False)
        return self._last_logits(xf[:, -1])

    def logits_at(self, ids, rows, positions) -> np.ndarray:
        """ids (B, T) -> the logits (K, V) at the K positions (rows[k], positions[k]): the whole
        windows computed, only those unembedded (held-out scoring: pipeline/evaluate.py)."""
        xf, _ = self._forward(self._check_ids(ids), None, keep_cache=False)
        return self._last_logits(xf[rows, positions])

    def _last_logits(self, xf_last: np.ndarray) -> np.ndarray:
        """xf_last (B, C) final-normed last positions -> logits (B, V)."""
        return self.ops.unembed(xf_last, self._unembedding())

    def forward_cached(self, ids, start, k_cache: list, v_cache: list):
        """ids (B, n) on the device, of positions start..start+n-1 -> next-token logits (B, V),
        their keys and values written into the per-layer caches (B, Hkv, T_max, hd) (generation
        with a KV cache). `start` is an int, or for one position an int32 device array (1,)
        where the ops read it there (a captured step, transformer/generation.py)."""
        cfg = self.config
        x = self.params["wte.weight"][ids]  # (B, n, C)
        if cfg.positional != "rope":
            table = self._positions()
            x = x + (table[start : start + ids.shape[1]] if isinstance(start, int) else table.take(start, axis=0))
        for i in range(cfg.n_layers):

            def attend(qkv, i=i):  # never given `seen`: generation records no trace
                qkv, _ = self._rope(qkv, start)
                return self.ops.attention_forward_cached(qkv, k_cache[i], v_cache[i], start, cfg.n_heads, cfg.kv_heads)

            x, _ = self._block_forward(i, x, None, attend)
        xf, _ = self._norm(x[:, -1], self.params["ln_f.weight"], self.params.get("ln_f.bias"))
        return self._last_logits(xf)

    # ------------------------------------------------------------------------- files

    def save(self, path, metadata: dict[str, str] | None = None, extra_tensors: dict[str, np.ndarray] | None = None):
        """Write params (+ extra_tensors, e.g. `tokenizer.*`) to a safetensors file atomically,
        with the config as JSON under the metadata key "config"."""
        io.save_model(path, self.host_params(), self.config.to_dict(), metadata=metadata, extra_tensors=extra_tensors)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> GPT:
        """Read a model saved by `save`, or a GPT-2 state dict (keys optionally `transformer.`
        prefixed), onto `device`; tensors that are not model parameters are ignored."""
        get_backend(device)  # a missing GPU is one line before the file is read
        config, params = io.load_model(path, device)
        return cls.from_params(config, params, device)
