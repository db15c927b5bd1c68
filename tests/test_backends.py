"""The backend seam (transformer/backends), on a machine without a GPU.

- `get_backend`: the CPU default, one-line errors for an unknown device, for missing CuPy and
  for CuPy without a GPU; CuPy never imported by a CPU run.
- The GPU's op set has the CPU's op names and parameters; the CUDA launchers have the twins'.
- Each CUDA kernel's NumPy twin (cuda_twins.py), through the GPU's ops (device_ops.py), against
  transformer/reference.py and ops.py on many random inputs: float64 to 1e-12, float32 to 1e-5
  (relative to the largest magnitude); the embedding gradient and AdamW bit for bit.
- A whole model on the twin backend against the CPU model: loss, gradients, generation.
- The CUDA source compiles (where nvcc is installed).

What runs on a real GPU is in tests/test_gpu.py (skipped here).
"""

import ast
import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kernel_checks import close, tol_for

import tokenkit.transformer.backends as backends
from tokenkit.transformer import GPT, GPTConfig, ModelError, ops
from tokenkit.transformer import reference as ref
from tokenkit.transformer.backends import cpu as cpu_ops
from tokenkit.transformer.backends import cuda_source
from tokenkit.transformer.backends.cuda_twins import TwinKernels, twin_backend
from tokenkit.transformer.backends.device_ops import DeviceOps
from tokenkit.transformer.config import RopeScaling
from tokenkit.transformer.parallel import DataParallel

ROOT = Path(__file__).resolve().parents[1]
TWIN = twin_backend()
T_OPS = TWIN.ops
KERNELS = TwinKernels()
SEEDS = range(12)


def rows_shape(rng) -> tuple[int, int]:
    """(N, C) with C off and on multiples of the warp, N past the column sums' chunk."""
    return int(rng.choice([1, 3, 70, 200])), int(rng.choice([1, 5, 32, 33, 100, 130]))


# ----------------------------------------------------------------------------- get_backend


def test_cpu_backend_is_numpy_and_todays_ops():
    b = backends.get_backend("cpu")
    assert b.name == "cpu" and b.xp is np and b is backends.get_backend() is backends.get_backend(b)
    assert all(getattr(b.ops, name) is getattr(ops, name) for name in cpu_ops.OPS)
    a = np.ones(3)
    assert b.to_device(a) is a and b.to_host(a) is a and backends.as_host(a) is a
    assert backends.backend_of(a) is b


def test_unknown_device_is_one_line():
    with pytest.raises(ModelError, match="unknown device 'tpu'; choose one of cpu, cuda"):
        backends.get_backend("tpu")
    with pytest.raises(ModelError, match="unknown device"):
        GPT(GPTConfig(vocab_size=8, context_length=4, d_model=8, n_layers=1, n_heads=2), device="gpu")


def test_cuda_without_cupy_says_how_to_install(monkeypatch):
    monkeypatch.delitem(backends._BACKENDS, "cuda", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(ModelError) as err:
        backends.get_backend("cuda")
    text = str(err.value)
    assert "needs CuPy" in text and "pip install 'tokenkit[gpu]'" in text and "\n" not in text, text
    with pytest.raises(ModelError, match="needs CuPy"):
        GPT(GPTConfig(vocab_size=8, context_length=4, d_model=8, n_layers=1, n_heads=2), device="cuda")


class _FakeRuntime:
    def __init__(self, result):
        self.result = result

    def getDeviceCount(self):  # noqa: N802 (CuPy's name)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class _FakeCupy:
    def __init__(self, result):
        self.cuda = type("cuda", (), {"runtime": _FakeRuntime(result)})()


@pytest.mark.parametrize(
    "result, expected",
    [(RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"), "no usable GPU"),
     (RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"), "no usable GPU"),
     (0, "no GPU (the CUDA driver reports 0 devices)")],
)  # fmt: skip
def test_cuda_without_gpu_says_which_is_missing(monkeypatch, result, expected):
    monkeypatch.delitem(backends._BACKENDS, "cuda", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(result))
    with pytest.raises(ModelError) as err:
        backends.get_backend("cuda")
    text = str(err.value)
    assert expected in text and "found CuPy" in text and "\n" not in text, text
    assert "cuda" not in backends._BACKENDS  # a later call tries again


class _CupyOfGpus:
    """CuPy whose driver reports `n` GPUs, the current one chosen by `Device(i).use()`."""

    def __init__(self, n: int):
        fake = self

        class Device:
            def __init__(self, index):
                self.index = index

            def use(self):
                fake.current = self.index

        runtime = type("runtime", (), {"getDeviceCount": lambda: n, "getDevice": lambda: fake.current})
        self.cuda = type("cuda", (), {"runtime": runtime, "Device": Device})
        self.current = 0


@pytest.mark.parametrize("local_rank, gpus, chosen", [(0, 1, 0), (1, 1, 0), (3, 2, 1), (2, 4, 2), (5, 4, 1)])
def test_use_gpu_gives_each_local_rank_a_gpu_in_turn(monkeypatch, local_rank, gpus, chosen):
    """The GPU is current before the backend is made (its kernels load there), and a backend
    already made on another GPU is one line."""
    cupy = _CupyOfGpus(gpus)
    monkeypatch.setattr(backends, "_BACKENDS", {})  # the fake backend made here goes with it
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    made_on = []
    fake = backends.Backend("cuda", np, None, np.asarray, np.asarray, lambda: None)
    monkeypatch.setattr(backends, "_make_cuda", lambda: made_on.append(cupy.current) or fake)
    assert backends.use_gpu(local_rank) is fake and made_on == [chosen] and cupy.current == chosen
    assert backends.use_gpu(local_rank) is fake and made_on == [chosen]  # made once
    if gpus > 1:
        with pytest.raises(ModelError, match=f"already runs on GPU {chosen}, and local rank {local_rank + 1} of"):
            backends.use_gpu(local_rank + 1)


def test_use_gpu_returns_a_stand_in_backend_as_it_is(monkeypatch):
    monkeypatch.setitem(backends._BACKENDS, "cuda", TWIN)
    monkeypatch.setitem(sys.modules, "cupy", None)  # never imported
    assert backends.use_gpu(3) is TWIN


def test_use_gpu_without_cupy_is_one_line(monkeypatch):
    monkeypatch.delitem(backends._BACKENDS, "cuda", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ModelError, match="needs CuPy"):
        backends.use_gpu(0)


def test_a_cpu_run_never_imports_cupy(tmp_path):
    code = """
import sys
import numpy as np
from tokenkit.transformer import GPT, GPTConfig, AdamW, clip_grad_norm
m = GPT(GPTConfig(vocab_size=16, context_length=8, d_model=16, n_layers=1, n_heads=2), seed=0, device="cpu")
opt = AdamW(m.params, lr=1e-3)
loss, grads = m.loss_and_grads(np.zeros((2, 8), int), np.ones((2, 8), int))
clip_grad_norm(grads, 1.0)
opt.step(grads)
list(m.generate([1, 2], 3, temperature=0))
m.save(sys.argv[1])
GPT.load(sys.argv[1])
assert not any(name == "cupy" or name.startswith("cupy.") for name in sys.modules), "cupy was imported"
assert "tokenkit.transformer.backends.cuda" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.safetensors")], cwd=ROOT, check=True)


def test_tf32_flag_defaults_on_and_switches():
    assert backends.tf32_enabled()  # TK_TF32 is not set in the tests
    try:
        backends.set_tf32(False)
        assert not backends.tf32_enabled()
    finally:
        backends.set_tf32(True)


# ----------------------------------------------------------------------------- the seam's shape


def test_gpu_ops_have_the_cpu_ops_names_and_parameters():
    for name in cpu_ops.OPS:
        want = list(inspect.signature(getattr(cpu_ops, name)).parameters)
        got = list(inspect.signature(getattr(DeviceOps, name)).parameters)[1:]  # without self
        assert got == want, f"{name}: GPU op takes {got}, CPU op {want}"


def _methods(tree: ast.Module, class_name: str) -> dict[str, list[str]]:
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name)
    return {f.name: [a.arg for a in f.args.args] for f in cls.body
            if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}  # fmt: skip


def test_cuda_launchers_match_their_twins_and_every_kernel_is_launched():
    """Each CudaKernels method (cuda_launch.py) has the twin's parameters, and each kernel of the
    source is launched by name."""
    text = (ROOT / "transformer/backends/cuda_launch.py").read_text(encoding="utf-8")
    launched = _methods(ast.parse(text), "CudaKernels")
    twins = {
        name: params
        for name, params in _methods(
            ast.parse((ROOT / "transformer/backends/cuda_twins.py").read_text(encoding="utf-8")), "TwinKernels"
        ).items()
    }
    assert launched == twins
    for kernel in cuda_source.KERNELS:
        assert f'self._fn("{kernel}"' in text, f"kernel {kernel} is never launched"
        assert f"__global__ void {kernel}(" in cuda_source.SOURCE


# ----------------------------------------------------------------------------- twins against references


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_layernorm_twin(seed, dtype):
    rng = np.random.default_rng(seed)
    N, C = rows_shape(rng)
    x = (rng.standard_normal((N, C)) * rng.uniform(0.1, 10) + rng.uniform(-5, 5)).astype(dtype)
    w, b = rng.standard_normal(C).astype(dtype), rng.standard_normal(C).astype(dtype)
    bias = b if seed % 3 else None
    out, cache = T_OPS.layernorm_forward(x.reshape(1, N, C), w, bias)
    assert out.dtype == dtype and out.shape == (1, N, C)
    close(out[0], ref.layernorm(x.astype(np.float64), w, bias), tol_for(dtype), "forward vs reference")
    dout = rng.standard_normal((1, N, C)).astype(dtype)
    dx, dw, db = T_OPS.layernorm_backward(dout, cache)
    cdx, cdw, cdb = ops.layernorm_backward(dout, ops.layernorm_forward(x.reshape(1, N, C), w, bias)[1])
    close(dx, cdx, tol_for(dtype), "dx vs ops")
    close(dw, cdw, tol_for(dtype), "dweight vs ops")
    assert (db is None) == (bias is None)
    if bias is not None:
        close(db, cdb, tol_for(dtype), "dbias vs ops")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_gpt2_block_fused_ops_twins(seed, dtype):
    """The ops that fuse GPT-2's elementwise passes, on the twins, against the CPU ops of the same
    names (today's ops in a row): c_fc with GELU, the bias with the residual, the residual with
    ln_2, LayerNorm's dx added into the skip; forward, in-place x, trace and backward."""
    rng = np.random.default_rng(seed)
    N, C = rows_shape(rng)
    tol = tol_for(dtype)

    def arrays(*shapes):
        return [(rng.standard_normal(shape) * 2 + 0.5).astype(dtype) for shape in shapes]

    x, h, skip, dout = arrays(*[(1, N, C)] * 4)
    w, b, hb = arrays(C, C, C)
    if seed % 3 == 0:
        b = hb = None
    mine, theirs = {}, {}
    W, Wb = arrays((C, 3 * C), 3 * C)
    Wb = None if seed % 3 == 0 else Wb
    act, cache = T_OPS.linear_gelu_forward(x, W, Wb, True, mine)
    cpu_act, cpu_cache = ops.linear_gelu_forward(x, W, Wb, True, theirs)
    close(act, cpu_act, tol, "linear gelu")
    close(mine["pre"], theirs["pre"], tol, "linear gelu's trace")
    (dact,) = arrays(act.shape)
    grads = T_OPS.linear_gelu_backward(dact, cache)
    for name, g, c in zip(("dx", "dW", "db"), grads, ops.linear_gelu_backward(dact, cpu_cache), strict=True):
        assert (g is None) == (c is None) == (name == "db" and Wb is None)
        if c is not None:
            close(g, c, tol, f"linear gelu {name}")
    xt, xc = x.copy(), x.copy()
    out, cache = T_OPS.residual_layernorm_forward(xt, h.copy(), hb, w, b)
    cpu_out, cpu_cache = ops.residual_layernorm_forward(xc, h.copy(), hb, w, b)
    close(xt, xc, tol, "x += branch + bias")
    close(out, cpu_out, tol, "residual layernorm")
    dt, dc = skip.copy(), skip.copy()
    got = T_OPS.residual_layernorm_backward(dt, dout, cache)
    want = ops.residual_layernorm_backward(dc, dout, cpu_cache)
    assert got[0] is dt and want[0] is dc  # written over the skip's gradient
    for name, g, c in zip(("dx", "dw", "db", "dbranch_bias"), got, want, strict=True):
        assert (g is None) == (c is None) == (name != "dx" and name != "dw" and b is None)
        if c is not None:
            close(g, c, tol, f"residual layernorm {name}")
    dt, dc = skip.copy(), skip.copy()
    got = T_OPS.layernorm_add_backward(dt, dout, T_OPS.layernorm_forward(x, w, b)[1])
    want = ops.layernorm_add_backward(dc, dout, ops.layernorm_forward(x, w, b)[1])
    assert got[0] is dt and want[0] is dc
    for name, g, c in zip(("dx", "dw", "db"), got, want, strict=True):
        if c is not None:
            close(g, c, tol, f"layernorm added {name}")
    xt, xc = x.copy(), x.copy()
    assert T_OPS.bias_residual_forward(xt, h.copy(), hb)[0] is xt
    assert ops.bias_residual_forward(xc, h.copy(), hb)[0] is xc
    assert np.array_equal(xt, xc), "bias residual"  # the same two additions
    got = T_OPS.bias_residual_backward(dout, hb is not None)
    want = ops.bias_residual_backward(dout, hb is not None)
    assert got[0] is got[1] is dout and want[0] is want[1] is dout
    assert (got[2] is None) == (want[2] is None) == (hb is None)
    if hb is not None:
        close(got[2], want[2], tol, "bias residual dbias")


@pytest.mark.parametrize("seed", SEEDS)
def test_column_sums_twin_in_one_and_two_stages(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    N, C = rows_shape(rng)
    a, b = rng.standard_normal((N, C)), rng.standard_normal((N, C))
    close(KERNELS.column_sums(a, b), (a * b).sum(axis=0), 1e-12, "sum of products")
    close(KERNELS.column_sums(a, None), a.sum(axis=0), 1e-12, "sum")
    monkeypatch.setattr(cuda_source, "MAX_GRID_Y", 2)  # few chunks allowed: longer chunks, same sums
    close(KERNELS.column_sums(a, None), a.sum(axis=0), 1e-12, "sum with long chunks")


def test_column_sums_twin_sums_more_chunks_than_a_chunk_has_rows():
    """GPT-2's 8 x 1024 rows make 128 chunks of 64: their sums are summed in two more passes."""
    rows = cuda_source.COLUMN_CHUNK**2 * 2 + 3
    assert np.array_equal(KERNELS.column_sums(np.ones((rows, 3)), None), np.full(3, float(rows)))


def test_column_sums_twin_adds_each_chunk_in_order():
    """Chunk sums are sequential: 1 + 1e16 - 1e16 in order is 0, not the exact 1."""
    a = np.array([[1.0], [1e16], [-1e16]])
    assert KERNELS.column_sums(a, None)[0] == 0.0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_gelu_twin(seed, dtype):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, 3, 17)) * 4).astype(dtype)
    out, deriv = T_OPS.gelu_forward(x)
    close(out, ref.gelu(x.astype(np.float64)), tol_for(dtype), "forward vs reference")
    cpu_out, cpu_deriv = ops.gelu_forward(x)
    close(deriv, cpu_deriv, tol_for(dtype), "derivative vs ops")
    dout = rng.standard_normal(x.shape).astype(dtype)
    close(T_OPS.gelu_backward(dout, deriv), ops.gelu_backward(dout, cpu_deriv), tol_for(dtype), "backward")
    assert T_OPS.gelu_forward(x, grad=False)[1] is None


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_softmax_xent_twin(seed, dtype):
    rng = np.random.default_rng(seed)
    N = int(rng.integers(1, 9))
    V = int(rng.choice([2, 7, 256, 300, 1000]))
    spread = [1.0, 10.0, 100.0][seed % 3]  # 100: exp overflows unless rows are shifted
    logits = (rng.standard_normal((N, V)) * spread + rng.uniform(-50, 50)).astype(dtype)
    targets = rng.integers(0, V, N)
    loss, cache = T_OPS.softmax_xent_forward(logits.copy(), targets)
    close(loss, ref.softmax_xent(logits.astype(np.float64), targets), tol_for(dtype), "loss vs reference")
    n_total = N * int(rng.integers(1, 4))  # a shard of a bigger batch
    dlogits = T_OPS.softmax_xent_backward(cache, n_total)
    want = ref.softmax_xent_grad(logits.astype(np.float64), targets) * N / n_total
    close(dlogits, want, tol_for(dtype), "dlogits vs reference")


def test_softmax_xent_twin_online_max_sees_every_thread():
    """One large logit on each thread's stride in turn: the online max and the butterfly find it."""
    V = 3 * cuda_source.ROW_THREADS + 5
    for hot in (0, 1, 255, 256, V - 1):
        z = np.zeros((1, V))
        z[0, hot] = 80.0
        loss, _ = T_OPS.softmax_xent_forward(z.copy(), np.array([hot]))
        assert abs(loss - ref.softmax_xent(z, np.array([hot]))) < 1e-12


def _attention_case(rng, dtype):
    """(qkv, H, Hkv): Hkv one of 1, 2 and H (multi-query, grouped, ordinary attention)."""
    B, T, H = int(rng.integers(1, 3)), int(rng.choice([1, 5, 33, 40])), int(rng.choice([1, 2, 4]))
    Hkv = int(rng.choice([h for h in (1, 2, H) if H % h == 0]))
    hd = int(rng.choice([1, 3, 8]))
    return (rng.standard_normal((B, T, (H + 2 * Hkv) * hd)) * 2).astype(dtype), H, Hkv


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_attention_twin(seed, dtype, causal):
    rng = np.random.default_rng(seed)
    qkv, H, Hkv = _attention_case(rng, dtype)
    out, cache = T_OPS.attention_forward(qkv, H, causal, None, Hkv)
    close(out, ref.attention(qkv.astype(np.float64), H, causal, Hkv), tol_for(dtype), "forward vs reference")
    dout = rng.standard_normal(out.shape).astype(dtype)
    want = ops.attention_backward(dout, ops.attention_forward(qkv, H, causal, None, Hkv)[1])
    close(T_OPS.attention_backward(dout, cache), want, tol_for(dtype), "backward vs ops")


def test_attention_twin_trace_matches_the_cpu_trace():
    rng = np.random.default_rng(0)
    qkv, H, Hkv = _attention_case(rng, np.float64)
    mine, theirs = {}, {}
    T_OPS.attention_forward(qkv, H, True, mine, Hkv)
    ops.attention_forward(qkv, H, True, theirs, Hkv)
    assert mine.keys() == theirs.keys()
    for key in theirs:
        finite = np.isfinite(theirs[key])
        assert np.array_equal(finite, np.isfinite(mine[key])), key  # the same masked (-inf) scores
        close(mine[key][finite], theirs[key][finite], 1e-12, key)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_attention_cached_twin(seed, dtype):
    """New positions in chunks through the KV cache give the full causal attention's rows."""
    rng = np.random.default_rng(seed)
    qkv, H, Hkv = _attention_case(rng, dtype)
    B, T, W = qkv.shape
    hd = W // (H + 2 * Hkv)
    k_cache, v_cache = np.zeros((B, Hkv, T + 3, hd), dtype), np.zeros((B, Hkv, T + 3, hd), dtype)
    full, _ = ops.attention_forward(qkv, H, True, n_kv_heads=Hkv)
    start = 0
    while start < T:
        n = int(rng.integers(1, T - start + 1))
        out, _ = T_OPS.attention_forward_cached(qkv[:, start : start + n], k_cache, v_cache, start, H, Hkv)
        close(out, full[:, start : start + n], tol_for(dtype), f"positions {start}..{start + n}")
        start += n


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_llama_ops_on_the_device_side(seed, dtype):
    """RMSNorm, rotary positions, SiLU and SwiGLU as the GPU's ops compute them (plain xp code;
    RMSNorm's dweight by the column sums twin) against the references and the CPU ops."""
    rng = np.random.default_rng(seed)
    N, C = rows_shape(rng)
    x = (rng.standard_normal((1, N, C)) * 3 + 0.5).astype(dtype)
    w = rng.standard_normal(C).astype(dtype)
    out, cache = T_OPS.rmsnorm_forward(x, w, 1e-6)
    close(out, ref.rmsnorm(x.astype(np.float64), w, 1e-6), tol_for(dtype), "rmsnorm vs reference")
    dout = rng.standard_normal(x.shape).astype(dtype)
    want = ops.rmsnorm_backward(dout, ops.rmsnorm_forward(x, w, 1e-6)[1])
    for name, got, cpu in zip(("dx", "dweight"), T_OPS.rmsnorm_backward(dout, cache), want, strict=True):
        close(got, cpu, tol_for(dtype), f"rmsnorm {name} vs ops")
    qkv, H, Hkv = _attention_case(rng, dtype)
    hd = qkv.shape[-1] // (H + 2 * Hkv)
    for scaling in (None, RopeScaling("llama3", 8.0, 1.0, 4.0, 4)) if hd % 2 == 0 else ():
        start = int(rng.integers(0, 9))
        out, cache = T_OPS.rope_forward(qkv, H, Hkv, 10000.0, start, scaling=scaling)
        want = ref.rope(qkv.astype(np.float64), H, Hkv, 10000.0, start, scaling)
        close(out, want, tol_for(dtype), f"rope vs reference ({scaling})")
        d = rng.standard_normal(qkv.shape).astype(dtype)
        want = ops.rope_backward(d, ops.rope_forward(qkv, H, Hkv, 10000.0, start, scaling=scaling)[1])
        close(T_OPS.rope_backward(d, cache), want, tol_for(dtype), f"rope backward vs ops ({scaling})")
    h = (rng.standard_normal((2, 3, 2 * C)) * 4).astype(dtype)
    out, cache = T_OPS.swiglu_forward(h)
    close(out, ref.swiglu(h.astype(np.float64)), tol_for(dtype), "swiglu vs reference")
    d = rng.standard_normal(out.shape).astype(dtype)
    close(T_OPS.swiglu_backward(d, cache), ops.swiglu_backward(d, ops.swiglu_forward(h)[1]), tol_for(dtype), "dh")
    assert T_OPS.swiglu_forward(h, grad=False)[1] is None and T_OPS.silu_forward(h, grad=False)[1] is None


@pytest.mark.parametrize("seed", SEEDS)
def test_embedding_backward_twin_is_bit_identical(seed):
    """Stable sort + in-order segment sums do add.at's additions in add.at's order."""
    rng = np.random.default_rng(seed)
    V, C = int(rng.integers(1, 20)), int(rng.integers(1, 40))
    ids = rng.integers(0, V, (int(rng.integers(1, 4)), int(rng.integers(1, 50))))
    dout = rng.standard_normal((*ids.shape, C)).astype(np.float32)
    start = rng.standard_normal((V, C)).astype(np.float32)  # the unembedding's gradient, added to
    want = ops.embedding_backward(dout, (ids, (V, C)), dweight=start.copy())
    got = T_OPS.embedding_backward(dout, (ids, (V, C)), dweight=start.copy())
    assert np.array_equal(got, want)
    assert np.array_equal(T_OPS.embedding_backward(dout, (ids, (V, C))), ops.embedding_backward(dout, (ids, (V, C))))


@pytest.mark.parametrize("decay", [1.0, 0.99])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adamw_twin_is_bit_identical(dtype, decay):
    rng = np.random.default_rng(0)
    p, g = rng.standard_normal(1000).astype(dtype), rng.standard_normal(1000).astype(dtype)
    m, v = rng.standard_normal(1000).astype(dtype), rng.random(1000).astype(dtype)
    consts = (0.9, 0.95, 3e-4 * 0.1 / 0.3, 1e-8 / 0.3, decay)
    want = [a.copy() for a in (p, g, m, v)]
    ops.adamw_update(*want, *consts)
    got = [a.copy() for a in (p, g, m, v)]
    T_OPS.adamw_update(*got, *consts)
    for name, a, b in zip("pgmv", got, want, strict=True):
        assert np.array_equal(a, b), name


def test_adamw_many_twin_is_bit_identical():
    """The lists' update (one launch on a GPU): each tensor as ops.adamw_update with its decay."""
    rng = np.random.default_rng(1)
    sizes = [1, 0, 7, 5000]
    lists = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(3)]
    lists.append([rng.random(n).astype(np.float32) for n in sizes])
    decayed = [True, False, False, True]
    consts = (0.9, 0.95, 1e-3, 1e-8, 0.99)
    want = [[a.copy() for a in arrays] for arrays in lists]
    for k in range(len(sizes)):
        ops.adamw_update(*(arrays[k] for arrays in want), *consts[:4], consts[4] if decayed[k] else 1.0)
    T_OPS.adamw_update_many(*lists, decayed, *consts)
    for name, got, ref_ in zip("pgmv", lists, want, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(got, ref_, strict=True)), name


# ----------------------------------------------------------------------------- the whole model on the twins


CONFIGS = [
    dict(),
    dict(norm="post", activation="relu", positional="sinusoidal", causal=False, bias=False),
    dict(positional="rope", norm_type="rmsnorm", activation="swiglu", mlp_hidden=72, bias=False, qkv_bias=True,
         tie_embeddings=False, n_kv_heads=2),  # Llama's family: grouped-query attention, Qwen2's q, k, v biases
]  # fmt: skip


def _pair(kw, dtype):
    cfg = GPTConfig(vocab_size=300, context_length=24, d_model=40, n_layers=2, n_heads=4, **kw)
    cpu = GPT(cfg, seed=3)
    cpu.params = {k: v.astype(dtype) for k, v in cpu.params.items()}
    twin = GPT(cfg, seed=3, device=TWIN)
    twin.params = {k: v.copy() for k, v in cpu.params.items()}
    return cfg, cpu, twin


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kw", CONFIGS)
def test_model_on_the_twins_trains_as_on_the_cpu(kw, dtype):
    cfg, cpu, twin = _pair(kw, dtype)
    assert twin.device == "cuda-twin" and twin.ops is T_OPS
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, 300, (3, 24)), rng.integers(0, 300, (3, 24))
    loss, grads = cpu.loss_and_grads(ids, targets)
    twin_loss, twin_grads = twin.loss_and_grads(ids, targets)
    close(twin_loss, loss, tol_for(dtype), "loss")
    assert twin_grads.keys() == grads.keys()
    for name in grads:
        close(twin_grads[name], grads[name], tol_for(dtype), name)
    close(twin.forward(ids), cpu.forward(ids), tol_for(dtype), "logits")
    assert abs(twin.loss(ids, targets) - loss) <= tol_for(dtype) * abs(loss)


@pytest.mark.parametrize("kw", CONFIGS)
def test_model_on_the_twins_generates_the_cpu_tokens(kw):
    cfg, cpu, twin = _pair(kw, np.float64)
    for use_cache in (True, False):  # 40 tokens past a 24-token context: the window shifts
        args = dict(temperature=0.8, seed=5, use_cache=use_cache)
        with pytest.warns(UserWarning, match="context"):
            want = list(cpu.generate([1, 2, 3], 40, **args))
        with pytest.warns(UserWarning, match="context"):
            assert list(twin.generate([1, 2, 3], 40, **args)) == want


@pytest.mark.parametrize("kw", CONFIGS)
def test_model_on_the_twins_decodes_a_batch_as_the_cpu(kw):
    """Batched greedy decoding (argmax on the device) past the context: the CPU's tokens."""
    cfg, cpu, twin = _pair(kw, np.float64)
    prompts = np.random.default_rng(4).integers(0, 300, (3, 5))
    with pytest.warns(UserWarning, match="context"):
        want = np.stack(list(cpu.generate_batch(prompts, 30)))
    with pytest.warns(UserWarning, match="context"):
        assert np.array_equal(np.stack(list(twin.generate_batch(prompts, 30))), want)


def test_the_trace_comes_from_any_backend():
    cfg, cpu, twin = _pair({}, np.float64)
    ids = np.array([[5, 6, 7, 8]])
    mine, theirs = {}, {}
    twin.forward(ids, trace=mine)
    cpu.forward(ids, trace=theirs)
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        finite = np.isfinite(value)
        close(mine[key][finite], value[finite], 1e-12, key)


# ----------------------------------------------------------------------------- moving, saving, wrapping


def test_to_and_host_params_on_the_cpu(tmp_path):
    cfg = GPTConfig(vocab_size=16, context_length=8, d_model=16, n_layers=1, n_heads=2)
    m = GPT(cfg, seed=0)
    before = m.params
    assert m.to("cpu") is m and m.params is before and m.device == "cpu"
    host = m.host_params()
    assert all(host[k] is before[k] for k in before)  # no copies on the CPU
    twin = GPT(cfg, seed=0).to(TWIN)
    assert twin.device == "cuda-twin" and all(np.array_equal(twin.params[k], before[k]) for k in before)
    twin.save(tmp_path / "m.safetensors")
    back = GPT.load(tmp_path / "m.safetensors", device="cpu")
    assert all(np.array_equal(back.params[k], before[k]) for k in before)
    assert GPT.from_params(cfg, before, device=TWIN).device == "cuda-twin"


def test_set_params_copies_in_place_on_any_backend():
    cfg = GPTConfig(vocab_size=16, context_length=8, d_model=16, n_layers=1, n_heads=2)
    source = {k: v.astype(np.float64) + 1 for k, v in GPT(cfg, seed=1).params.items()}
    for model in (GPT(cfg, seed=0), GPT(cfg, seed=0, device=TWIN)):
        arrays = dict(model.params)
        model.set_params(source)
        for name, a in arrays.items():
            assert model.params[name] is a and a.dtype == np.float32  # in place, in the model's dtype
            assert np.array_equal(a, source[name].astype(np.float32))
    with pytest.raises(ModelError, match="wte.weight has shape"):
        model.set_params({**source, "wte.weight": np.zeros((3, 16))})


def test_data_parallel_refuses_workers_for_a_model_off_the_cpu():
    cfg = GPTConfig(vocab_size=16, context_length=8, d_model=16, n_layers=1, n_heads=2)
    with pytest.raises(ModelError, match="use workers=1"):
        DataParallel(GPT(cfg, device=TWIN), workers=2)
    model = DataParallel(GPT(cfg, device=TWIN), workers=1)  # passes through, in this process
    ids = np.arange(16).reshape(2, 8) % 16
    assert abs(model.loss(ids, ids) - GPT(cfg).loss(ids, ids)) < 1e-5
    assert all(isinstance(v, np.ndarray) for v in model.host_params().values())


# ----------------------------------------------------------------------------- the CUDA source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_source_compiles(tmp_path):
    """Every kernel, for float and double, as NVRTC will see it (--fmad=false); sm_80 (A100) and sm_90 (H100)."""
    taken = ", ".join(f"(void*)&{k}<{t}>" for t in ("float", "double") for k in cuda_source.KERNELS)
    source = tmp_path / "kernels.cu"
    source.write_text(cuda_source.SOURCE + f"\nvoid* tk_all_kernels[] = {{{taken}}};\n", encoding="utf-8")
    for arch in ("sm_80", "sm_90"):
        done = subprocess.run(
            [
                "nvcc",
                "-c",
                f"-arch={arch}",
                *cuda_source.OPTIONS,
                "-Werror",
                "all-warnings",
                "-o",
                str(tmp_path / f"{arch}.o"),
                str(source),
            ],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
