"""The launches of cuda_source.py's kernels: grid and block shapes, argument lists and their
dtypes, and the output arrays each kernel writes, behind the kernel interface of device_ops.py.

`CudaKernels(xp, module)` takes the array module that allocates the outputs (CuPy on a GPU) and
a compiled module of the kernels: anything with CuPy's `RawModule.get_function(name)`, whose
result is called as `f(grid, block, args)`. transformer/backends/cuda.py builds it over CuPy
and NVRTC; tests/cuda_emulator.py builds it over NumPy and the same source compiled for the
CPU, so these launches run, exactly as written, on a machine without a GPU. The fused attention
kernels of attention_source.py come in a module of their own (`attention_module`).

What this module deliberately does not do: import CuPy, compile anything, or compute (each
method's twin, of the same name in cuda_twins.TwinKernels, says what its kernel computes).
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from tokenkit.transformer.activations import GELU_A, GELU_C
from tokenkit.transformer.backends import attention_source as attn
from tokenkit.transformer.backends import cuda_source as src
from tokenkit.transformer.backends.cuda_twins import embedding_segments

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_MAX_BLOCKS = 1 << 20  # grid-stride kernels: enough blocks to fill any GPU, each loops over the rest


def _blocks(n: int, threads: int) -> int:
    return max(1, min(_MAX_BLOCKS, -(-n // threads)))


def _chunks(n_rows: int) -> tuple[int, int]:
    """The column sums' (rows per chunk, chunks) over n_rows rows: the kernels' grid.y."""
    rows = src.column_chunk_rows(n_rows)
    return rows, max(1, -(-n_rows // rows))


def _row_grid(n_rows: int, C: int) -> tuple[int, int]:
    """The grid of a kernel over rows of C elements: a tile of ELEMENTWISE_THREADS columns by a
    group of rows (at most MAX_GRID_Y groups; each thread then loops over its column's rows)."""
    return max(1, -(-C // src.ELEMENTWISE_THREADS)), max(1, min(n_rows, src.MAX_GRID_Y))


def _pointers(xp, arrays) -> list[int]:
    """The arrays' data addresses, as a kernel dereferences them: device pointers for CuPy's
    arrays (`a.data.ptr`), host ones for NumPy's (`a.ctypes.data`, for the CPU emulator)."""
    address = attrgetter("ctypes.data" if xp is np else "data.ptr")
    return [address(a) for a in arrays]


class CudaKernels:
    """cuda_source.py's kernels behind the kernel interface of device_ops.py, launched through
    `module` with outputs allocated by `xp` (see the module docstring)."""

    def __init__(self, xp, module, attention_module=None):
        """`attention_module`: attention_source.py's kernels compiled the same way, or None where
        they cannot run (a GPU older than sm_80): then `fused_attention` is False."""
        self.xp = xp
        self._module = module
        self._functions: dict[tuple[str, np.dtype], object] = {}
        self._adamw_tables: dict[tuple, tuple] = {}  # adamw_multi's tables, by addresses and sizes
        self._attention_module = attention_module
        self._attention_functions: dict[tuple[str, int], object] = {}
        self.fused_attention = attention_module is not None

    def _fn(self, name: str, dtype):
        """The compiled kernel `name` for arrays of `dtype` (float32 or float64)."""
        key = (name, np.dtype(dtype))
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = self._module.get_function(f"{name}<{_CTYPES[key[1]]}>")
        return fn

    def layernorm_forward(self, x, w, b, eps):
        N, C = x.shape
        out, xhat = self.xp.empty_like(x), self.xp.empty_like(x)
        rstd = self.xp.empty(N, dtype=x.dtype)
        t = x.dtype.type
        grid = -(-N // src.ROWS_PER_BLOCK)
        self._fn("layernorm_forward", x.dtype)(
            (grid,),
            (src.ROWS_PER_BLOCK * src.WARP,),
            (x, w, w if b is None else b, np.int32(b is not None), out, xhat, rstd, np.int64(N), np.int32(C), t(eps)),
        )
        return out, xhat, rstd

    def residual_layernorm_forward(self, x, h, hb, w, b, eps):
        N, C = x.shape
        out, xhat = self.xp.empty_like(x), self.xp.empty_like(x)
        rstd = self.xp.empty(N, dtype=x.dtype)
        t = x.dtype.type
        grid = -(-N // src.ROWS_PER_BLOCK)
        self._fn("residual_layernorm_forward", x.dtype)(
            (grid,),
            (src.ROWS_PER_BLOCK * src.WARP,),
            (x, h, w if hb is None else hb, np.int32(hb is not None), w, w if b is None else b, np.int32(b is not None),
             out, xhat, rstd, np.int64(N), np.int32(C), t(eps)),
        )  # fmt: skip
        return out, xhat, rstd

    def layernorm_backward(self, dout, xhat, rstd, w, dx=None):
        N, C = dout.shape
        add = dx is not None
        if not add:
            dx = self.xp.empty_like(dout)
        grid = -(-N // src.ROWS_PER_BLOCK)
        self._fn("layernorm_backward", dout.dtype)(
            (grid,),
            (src.ROWS_PER_BLOCK * src.WARP,),
            (dout, xhat, rstd, w, dx, np.int32(add), np.int64(N), np.int32(C)),
        )
        return dx

    def column_sums(self, a, b):
        return self._total(self._chunk_sums(a, b))

    def _total(self, partial):
        """(n_chunks, C) chunks' sums -> (C,): summed chunk by chunk again until one row is left."""
        while partial.shape[0] > 1:
            partial = self._chunk_sums(partial, None)
        return partial[0]

    def _chunk_sums(self, a, b):
        N, C = a.shape
        rows, n_chunks = _chunks(N)
        out = self.xp.empty((n_chunks, C), dtype=a.dtype)
        self._fn("column_sums", a.dtype)(
            (-(-C // src.COLUMN_THREADS), n_chunks),
            (src.COLUMN_THREADS,),
            (a, a if b is None else b, np.int32(b is not None), out, np.int64(N), np.int64(C), np.int64(rows)),
        )
        return out

    def skinny_matmul(self, x, w, b):
        R, K = x.shape
        N = w.shape[1]
        n_chunks = -(-K // src.SKINNY_CHUNK)
        partial = self.xp.empty((n_chunks, R, N), dtype=x.dtype)
        self._fn("skinny_matmul", x.dtype)(
            (-(-N // src.WARP), n_chunks), (src.SKINNY_WARPS * src.WARP,),
            (x, w, partial, np.int32(R), np.int32(K), np.int32(N)),
        )  # fmt: skip
        out = self.xp.empty((R, N), dtype=x.dtype)
        self._fn("skinny_matmul_sum", x.dtype)(
            (_blocks(R * N, src.ELEMENTWISE_THREADS),), (src.ELEMENTWISE_THREADS,),
            (partial, w if b is None else b, np.int32(b is not None), out, np.int32(n_chunks), np.int64(R * N),
             np.int32(N)),
        )  # fmt: skip
        return out

    def skinny_matmul_nt(self, x, w):
        R, C = x.shape
        V = w.shape[0]
        out = self.xp.empty((R, V), dtype=x.dtype)
        self._fn("skinny_matmul_nt", x.dtype)(
            (-(-V // src.ROWS_PER_BLOCK),), (src.ROWS_PER_BLOCK * src.WARP,),
            (x, w, out, np.int32(R), np.int32(C), np.int64(V)),
        )  # fmt: skip
        return out

    def column_sums_pair(self, a, b):
        N, C = a.shape
        rows, n_chunks = _chunks(N)
        partial = self.xp.empty((n_chunks, 2, C), dtype=a.dtype)
        self._fn("column_sums_pair", a.dtype)(
            (-(-C // src.COLUMN_THREADS), n_chunks),
            (src.COLUMN_THREADS,),
            (a, b, partial, np.int64(N), np.int64(C), np.int64(rows)),
        )
        both = self._total(partial.reshape(n_chunks, 2 * C)).reshape(2, C)
        return both[0], both[1]

    def product_column_sums(self, a, b):
        N, C = a.shape
        rows, n_chunks = _chunks(N)
        prod = self.xp.empty_like(a)
        partial = self.xp.empty((n_chunks, C), dtype=a.dtype)
        self._fn("product_column_sums", a.dtype)(
            (-(-C // src.COLUMN_THREADS), n_chunks),
            (src.COLUMN_THREADS,),
            (a, b, prod, partial, np.int64(N), np.int64(C), np.int64(rows)),
        )
        return prod, self._total(partial)

    def bias_residual(self, x, h, b):
        N, C = x.shape
        self._fn("bias_residual", x.dtype)(
            _row_grid(N, C), (src.ELEMENTWISE_THREADS,),
            (x, h, h if b is None else b, np.int32(b is not None), np.int64(N), np.int32(C)),
        )  # fmt: skip

    def gelu(self, x, b, grad):
        N, C = x.shape
        t = x.dtype.type
        out = self.xp.empty_like(x)
        deriv = self.xp.empty_like(x) if grad else None
        self._fn("gelu_forward", x.dtype)(
            _row_grid(N, C), (src.ELEMENTWISE_THREADS,),
            (x, x if b is None else b, np.int32(b is not None), out, out if deriv is None else deriv, np.int32(grad),
             np.int64(N), np.int32(C), t(GELU_A * GELU_C), t(GELU_C), t(6.0 * GELU_A * GELU_C), t(2.0 * GELU_C)),
        )  # fmt: skip
        return out, deriv

    def xent_forward(self, logits, targets):
        N, V = logits.shape
        row_max = self.xp.empty(N, dtype=logits.dtype)
        row_sum = self.xp.empty(N, dtype=logits.dtype)
        losses = self.xp.empty(N, dtype=np.float64)
        targets = self.xp.ascontiguousarray(targets, dtype=np.int64)
        self._fn("xent_forward", logits.dtype)(
            (N,), (src.ROW_THREADS,), (logits, targets, row_max, row_sum, losses, np.int64(N), np.int32(V))
        )
        return row_max, row_sum, losses

    def xent_backward(self, logits, targets, row_max, row_sum, n_total):
        N, V = logits.shape
        t = logits.dtype.type
        self._fn("xent_backward", logits.dtype)(
            (N,), (src.ROW_THREADS,),
            (logits, self.xp.ascontiguousarray(targets, dtype=np.int64), row_max, row_sum, np.int64(N), np.int32(V),
             t(n_total), t(1.0 / n_total)),
        )  # fmt: skip

    def attention_softmax(self, scores, q_offset, causal):
        *_, Tq, keys = scores.shape
        n_rows = scores.size // keys
        self._fn("attention_softmax", scores.dtype)(
            (-(-n_rows // src.ROWS_PER_BLOCK),),
            (src.ROWS_PER_BLOCK * src.WARP,),
            (scores, np.int64(n_rows), np.int32(Tq), np.int32(keys), np.int32(q_offset), np.int32(causal)),
        )

    def softmax_backward(self, ds, w, row_dot):
        keys = ds.shape[-1]
        n_rows = ds.size // keys
        self._fn("softmax_backward", ds.dtype)(
            (-(-n_rows // src.ROWS_PER_BLOCK),),
            (src.ROWS_PER_BLOCK * src.WARP,),
            (ds, w, row_dot, np.int64(n_rows), np.int32(keys)),
        )

    def embedding_backward(self, dout, ids, dweight):
        C = dout.shape[1]
        order, seg_start, seg_id = embedding_segments(self.xp, ids)
        n_segments = seg_id.size
        self._fn("embedding_backward", dout.dtype)(
            (n_segments, -(-C // src.COLUMN_THREADS)),
            (src.COLUMN_THREADS,),
            (dout, order, seg_start, seg_id, dweight, np.int32(C)),
        )

    def adamw(self, p, g, m, v, beta1, beta2, scale, eps, decay):
        t = p.dtype.type
        n = p.size
        self._fn("adamw", p.dtype)(
            (_blocks(n, src.ELEMENTWISE_THREADS),),
            (src.ELEMENTWISE_THREADS,),
            (p, g, m, v, np.int64(n), t(beta1), t(beta2), t(scale), t(eps), t(decay)),
        )

    def adamw_multi(self, ps, gs, ms, vs, decayed, beta1, beta2, scale, eps, decay):
        groups: dict[np.dtype, list[int]] = {}  # one launch per dtype (the kernel's T)
        for k, p in enumerate(ps):
            groups.setdefault(p.dtype, []).append(k)
        for dtype, picked in groups.items():
            tensors = [(ps[k], gs[k], ms[k], vs[k]) for k in picked]
            table, first_block, blocks = self._adamw_table(tensors, [bool(decayed[k]) for k in picked])
            if blocks:
                t = dtype.type
                self._fn("adamw_multi", dtype)(
                    (blocks,),
                    (src.ELEMENTWISE_THREADS,),
                    (table, first_block, np.int32(len(tensors)), np.int64(src.ADAMW_CHUNK), t(beta1), t(beta2),
                     t(scale), t(eps), t(decay)),
                )  # fmt: skip

    def _adamw_table(self, tensors, decayed):
        """adamw_multi's (table, first_block, number of blocks) for [(p, g, m, v), ...], on the
        device; made once per list of arrays (their addresses and sizes: the table's content)."""
        addresses = _pointers(self.xp, [a for arrays in tensors for a in arrays])
        sizes = [arrays[0].size for arrays in tensors]
        key = (*addresses, *sizes, *decayed)
        made = self._adamw_tables.get(key)
        if made is None:
            chunks = [-(-n // src.ADAMW_CHUNK) for n in sizes]
            first_block = np.concatenate([[0], np.cumsum(chunks, dtype=np.int64)]).astype(np.int64)
            table = np.empty((len(tensors), 6), dtype=np.int64)
            table[:, :4] = np.array(addresses, dtype=np.int64).reshape(-1, 4)
            table[:, 4], table[:, 5] = sizes, decayed
            if len(self._adamw_tables) >= 8:  # gradients may come at new addresses: keep the latest few
                self._adamw_tables.clear()
            made = (self.xp.asarray(table), self.xp.asarray(first_block), int(first_block[-1]))
            self._adamw_tables[key] = made
        return made

    # ------------------------------------------------------------------ fused attention (attention_source.py)

    def _attention_fn(self, name: str, head_dim: int):
        """The compiled fused-attention kernel `name` for heads of `head_dim`."""
        key = (name, head_dim)
        fn = self._attention_functions.get(key)
        if fn is None:
            fn = self._attention_functions[key] = self._attention_module.get_function(f"{name}<{head_dim}>")
        return fn

    def flash_attention_forward(self, qkv, n_heads, n_kv_heads, causal, scale):
        B, T, W = qkv.shape
        D = W // (n_heads + 2 * n_kv_heads)
        out = self.xp.empty((B, T, n_heads * D), dtype=qkv.dtype)
        lse = self.xp.empty((B, n_heads, T), dtype=np.float32)
        self._attention_fn("flash_forward", D)(
            (-(-T // attn.BLOCK_ROWS), B * n_heads),
            (attn.THREADS,),
            (qkv, out, lse, np.int32(T), np.int32(n_heads), np.int32(n_kv_heads), np.int32(causal), np.float32(scale)),
        )
        return out, lse

    def flash_attention_backward(self, dout, qkv, out, lse, n_heads, n_kv_heads, causal, scale):
        B, T, W = qkv.shape
        D = W // (n_heads + 2 * n_kv_heads)
        # delta = rowsum(dout * out) per (batch, head, query), as the twins take it (float32)
        delta = self.xp.ascontiguousarray((dout * out).reshape(B, T, n_heads, D).sum(axis=-1).transpose(0, 2, 1))
        dqkv = self.xp.empty_like(qkv)
        args = (qkv, dout, lse, delta, dqkv, np.int32(T), np.int32(n_heads), np.int32(n_kv_heads), np.int32(causal),
                np.float32(scale))  # fmt: skip
        blocks = -(-T // attn.BLOCK_ROWS)
        self._attention_fn("flash_backward_dq", D)((blocks, B * n_heads), (attn.THREADS,), args)
        self._attention_fn("flash_backward_dkv", D)((blocks, B * n_kv_heads), (attn.THREADS,), args)
        return dqkv

    def decode_attention(self, qkv, k_cache, v_cache, start, n_heads, n_kv_heads, scale):
        B, _, W = qkv.shape
        D = W // (n_heads + 2 * n_kv_heads)
        out = self.xp.empty((B, 1, n_heads * D), dtype=qkv.dtype)
        # an int position goes in the launch; a device one (int32, (1,)) is read there, for a CUDA graph
        on_host = isinstance(start, (int, np.integer))
        self._attention_fn("decode_attention" if on_host else "decode_attention_at", D)(
            (B * n_heads,),
            (attn.DECODE_THREADS,),
            (qkv, k_cache, v_cache, out, np.int32(k_cache.shape[2]), np.int32(n_heads), np.int32(n_kv_heads),
             np.int32(start) if on_host else start, np.float32(scale)),
        )  # fmt: skip
        return out
