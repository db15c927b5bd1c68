"""Checks of cuda_source.py's kernels against their NumPy twins, shared by the GPU's tests
(tests/test_gpu.py: CuPy arrays on a GPU) and the emulator's (tests/test_cuda_emulator.py: the
same CUDA source on the CPU). `kernels` is a CudaKernels; `dev` puts a host array where the
kernels read it (a copy: in-place kernels write into it), `host` brings one back.

Float64 to 1e-12 and float32 to 1e-5 relative to the largest magnitude; the embedding gradient
and AdamW bit for bit (both do the CPU's additions and roundings in the CPU's order:
--fmad=false, IEEE sqrt and division), and so each fused kernel of GPT-2's block against the
unfused kernels (and array additions) it replaces, on the same device."""

import numpy as np

from tokenkit.transformer import ops
from tokenkit.transformer.backends.cuda_twins import TwinKernels

TWINS = TwinKernels()


def relative_error(a, b) -> float:
    """max |a - b| over the reference b's largest magnitude."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max(initial=0.0)) / max(float(np.abs(b).max(initial=0.0)), 1e-30)


def close(a, b, tol: float, what: str) -> None:
    """|a - b| <= tol * max|b| elementwise (relative to the reference's largest magnitude)."""
    err = relative_error(a, b)
    assert err <= tol, f"{what}: max relative difference {err:.2e} > {tol:.0e}"


def tol_for(dtype) -> float:
    return 1e-12 if np.dtype(dtype) == np.float64 else 1e-5


def check_row_kernels(kernels, dev, host, shape, dtype) -> None:
    """LayerNorm forward (with and without bias) and backward, column sums, GELU (with and
    without its derivative) on (N, C) rows."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    w, b = rng.standard_normal(shape[1]).astype(dtype), rng.standard_normal(shape[1]).astype(dtype)
    got = [host(a) for a in kernels.layernorm_forward(dev(x), dev(w), dev(b), 1e-5)]
    for name, g, t in zip(("out", "xhat", "rstd"), got, TWINS.layernorm_forward(x, w, b, 1e-5), strict=True):
        close(g, t, tol_for(dtype), f"layernorm {name}")
    close(host(kernels.layernorm_forward(dev(x), dev(w), None, 1e-5)[0]), TWINS.layernorm_forward(x, w, None, 1e-5)[0],
          tol_for(dtype), "layernorm without bias")  # fmt: skip
    d = rng.standard_normal(shape).astype(dtype)
    close(host(kernels.layernorm_backward(dev(d), dev(got[1]), dev(got[2]), dev(w))),
          TWINS.layernorm_backward(d, got[1], got[2], w), tol_for(dtype), "layernorm dx")  # fmt: skip
    close(host(kernels.column_sums(dev(d), dev(x))), TWINS.column_sums(d, x), tol_for(dtype), "column sums")
    close(host(kernels.column_sums(dev(d), None)), TWINS.column_sums(d, None), tol_for(dtype), "column sums of one")
    for grad in (True, False):
        out, deriv = kernels.gelu(dev(x), None, grad)
        t_out, t_deriv = TWINS.gelu(x, None, grad)
        close(host(out), t_out, tol_for(dtype), "gelu")
        assert (deriv is None) == (not grad)
        if grad:
            close(host(deriv), t_deriv, tol_for(dtype), "gelu'")


def check_xent_kernels(kernels, dev, host, shape, dtype) -> None:
    """The cross-entropy's forward (row max, sum, losses) and its in-place backward."""
    rng = np.random.default_rng(1)
    z = (rng.standard_normal(shape) * 5).astype(dtype)
    t = rng.integers(0, shape[1], shape[0])
    got = kernels.xent_forward(dev(z), dev(t))
    want = TWINS.xent_forward(z, t)
    for name, g, w in zip(("max", "sum", "losses"), got, want, strict=True):
        close(host(g), w, tol_for(dtype), f"xent {name}")
    zd, zt = dev(z), z.copy()
    kernels.xent_backward(zd, dev(t), got[0], got[1], 3 * shape[0])
    TWINS.xent_backward(zt, t, want[0], want[1], 3 * shape[0])
    close(host(zd), zt, tol_for(dtype), "dlogits")


def check_attention_kernels(kernels, dev, host, causal: bool, q_offset: int, dtype) -> None:
    """The softmax that masks scores in place, and its in-place backward."""
    rng = np.random.default_rng(2)
    s = (rng.standard_normal((2, 3, 40, 47)) * 3).astype(dtype)
    sd, st = dev(s), s.copy()
    kernels.attention_softmax(sd, q_offset, causal)
    TWINS.attention_softmax(st, q_offset, causal)
    close(host(sd), st, tol_for(dtype), "weights")
    dw, rd = rng.standard_normal(s.shape).astype(dtype), rng.standard_normal(s.shape[:-1]).astype(dtype)
    dd, dt = dev(dw), dw.copy()
    kernels.softmax_backward(dd, sd, dev(rd))
    TWINS.softmax_backward(dt, st, rd)
    close(host(dd), dt, tol_for(dtype), "softmax backward")


def check_embedding_and_adamw_bit_identical(kernels, dev, host, rows: int, width: int, size: int) -> None:
    """The embedding gradient over (4, rows) ids of width `width`, and AdamW on `size` elements
    (float32 decayed, float64 not), against the CPU ops, bit for bit."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, (4, rows))
    dout = rng.standard_normal((4, rows, width)).astype(np.float32)
    start = rng.standard_normal((50, width)).astype(np.float32)
    want = ops.embedding_backward(dout, (ids, (50, width)), dweight=start.copy())
    got = dev(start)
    kernels.embedding_backward(dev(dout.reshape(-1, width)), dev(ids.reshape(-1)), got)
    assert np.array_equal(host(got), want)
    for dtype, decay in ((np.float32, 0.9999), (np.float64, 1.0)):
        arrays = [rng.standard_normal(size).astype(dtype) for _ in range(3)] + [rng.random(size).astype(dtype)]
        p, g, m, v = (a.copy() for a in arrays)
        consts = (0.9, 0.95, 1e-3, 1e-8, decay)
        ops.adamw_update(p, g, m, v, *consts)
        on_device = [dev(a) for a in arrays]
        kernels.adamw(*on_device, *consts)
        for name, a, b in zip("pgmv", on_device, (p, g, m, v), strict=True):
            assert np.array_equal(host(a), b), name


def check_skinny_kernels(kernels, dev, host, rows: int, k: int, n: int, dtype) -> None:
    """The products of a few rows (a generation step's linear layers and logits) against their
    twins bit for bit (the same products added in the same order, --fmad=false), and the twins
    against NumPy's matmul to the dtype's tolerance; with and without the bias."""
    rng = np.random.default_rng(rows * 1000 + k + n)
    x = rng.standard_normal((rows, k)).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    for bias in (b, None):
        got = host(kernels.skinny_matmul(dev(x), dev(w), None if bias is None else dev(bias)))
        twin = TWINS.skinny_matmul(x, w, bias)
        assert got.shape == (rows, n) and np.array_equal(got, twin), "skinny_matmul against its twin"
        close(twin, x.astype(np.float64) @ w + (0 if bias is None else bias), tol_for(dtype), "skinny_matmul")
    wt = np.ascontiguousarray(w.T)  # (V, C) = (n, k): the unembedding's layout
    got = host(kernels.skinny_matmul_nt(dev(x), dev(wt)))
    twin = TWINS.skinny_matmul_nt(x, wt)
    assert got.shape == (rows, n) and np.array_equal(got, twin), "skinny_matmul_nt against its twin"
    close(twin, x.astype(np.float64) @ wt.T, tol_for(dtype), "skinny_matmul_nt")


def check_fused_kernels(kernels, dev, host, shape, dtype) -> None:
    """The kernels that fuse GPT-2's elementwise passes, on (N, C) rows: each against its twin, and
    bit for bit against the unfused kernels and array arithmetic it replaces (the same operations
    in the same order): residual + bias + LayerNorm, LayerNorm's dx added into a skip, LayerNorm's
    two column sums in one pass, a product with its column sums, a bias with a residual, GELU of
    x + b."""
    rng = np.random.default_rng(5)
    tol = tol_for(dtype)
    x, h, d, skip = ((rng.standard_normal(shape) * 3 + 1).astype(dtype) for _ in range(4))
    w, b, hb = (rng.standard_normal(shape[1]).astype(dtype) for _ in range(3))

    def opt(a):
        return None if a is None else dev(a)

    for bias, branch_bias in ((b, hb), (None, None)):
        xd, xt = dev(x), x.copy()
        fused = kernels.residual_layernorm_forward(xd, dev(h), opt(branch_bias), dev(w), opt(bias), 1e-5)
        got = [host(a) for a in fused]
        want = TWINS.residual_layernorm_forward(xt, h, branch_bias, w, bias, 1e-5)
        summed = x + (h if branch_bias is None else h + branch_bias)
        assert np.array_equal(host(xd), summed) and np.array_equal(xt, summed), "x += h + b"
        unfused = kernels.layernorm_forward(dev(summed), dev(w), opt(bias), 1e-5)
        for name, g, t, u in zip(("out", "xhat", "rstd"), got, want, unfused, strict=True):
            close(g, t, tol, f"residual layernorm {name}")
            assert np.array_equal(g, host(u)), f"residual layernorm {name} vs layernorm_forward"
    sd = dev(skip)
    added = kernels.layernorm_backward(dev(d), dev(got[1]), dev(got[2]), dev(w), sd)
    assert added is sd
    dx = host(kernels.layernorm_backward(dev(d), dev(got[1]), dev(got[2]), dev(w)))
    assert np.array_equal(host(sd), skip + dx), "layernorm dx added into the skip"
    close(host(sd), TWINS.layernorm_backward(d, got[1], got[2], w, skip.copy()), tol, "layernorm dx added (twin)")
    pair = [host(a) for a in kernels.column_sums_pair(dev(d), dev(x))]
    assert np.array_equal(pair[0], host(kernels.column_sums(dev(d), dev(x)))), "column sums pair: of products"
    assert np.array_equal(pair[1], host(kernels.column_sums(dev(d), None))), "column sums pair: of one"
    for name, g, t in zip(("products", "one"), pair, TWINS.column_sums_pair(d, x), strict=True):
        close(g, t, tol, f"column sums pair ({name})")
    prod, sums = (host(a) for a in kernels.product_column_sums(dev(d), dev(x)))
    assert np.array_equal(prod, d * x), "product"
    assert np.array_equal(sums, host(kernels.column_sums(dev(d * x), None))), "product's column sums"
    close(sums, TWINS.product_column_sums(d, x)[1], tol, "product's column sums (twin)")
    for bias in (hb, None):
        xd = dev(x)
        kernels.bias_residual(xd, dev(h), opt(bias))
        assert np.array_equal(host(xd), x + (h if bias is None else h + bias)), "bias residual"
    for grad in (True, False):
        fused = kernels.gelu(dev(x), dev(b), grad)
        unfused = kernels.gelu(dev(x + b), None, grad)
        for name, f, u, t in zip(("gelu", "gelu'"), fused, unfused, TWINS.gelu(x, b, grad), strict=True):
            assert (f is None) == (u is None) == (t is None) == (name == "gelu'" and not grad)
            if f is not None:
                assert np.array_equal(host(f), host(u)), f"{name} of x + b vs of the sum"
                close(host(f), t, tol, f"{name} of x + b (twin)")
