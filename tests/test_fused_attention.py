"""Fused ("flash") attention on a machine without a GPU: its NumPy twins against exact attention,
where DeviceOps takes the fused path and where it does not, a model training through it, and
the CUDA source compiling (where nvcc is installed).

The CUDA kernels themselves, run on the CPU by the emulator, are checked against these twins in
tests/test_cuda_emulator.py; on a real GPU in tests/test_gpu.py.
"""

import math
import shutil
import subprocess

import numpy as np
import pytest
from attention_checks import SHAPES, PoisonedXp, check_against_twins, check_decode_against_twin, generated_tokens
from kernel_checks import close

from tokenkit.transformer import GPT, GPTConfig, ops
from tokenkit.transformer.backends import Backend, attention_source, set_tf32
from tokenkit.transformer.backends import attention_twins as twins
from tokenkit.transformer.backends.cuda_launch import CudaKernels
from tokenkit.transformer.backends.cuda_twins import TwinKernels, twin_backend
from tokenkit.transformer.backends.device_ops import DeviceOps, FusedAttention

FUSED = DeviceOps(np, TwinKernels(fused_attention=True))
TF32_TOL = 3e-3  # TF32 operands: ~1e-3 relative to the largest magnitude, float64 accumulation


def tf32_reference(x: float) -> float:
    """x rounded to 11 significant bits, half away from zero, by frexp (normal numbers)."""
    if not math.isfinite(x) or x == 0.0:
        return x
    m, e = math.frexp(abs(x))  # abs(x) = m 2^e, 0.5 <= m < 1
    return math.copysign(math.floor(m * 2.0**11 + 0.5) * 2.0 ** (e - 11), x)


def test_tf32_rounds_to_eleven_significant_bits_ties_away_from_zero():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20_000) * 10.0 ** rng.integers(-30, 30, 20_000)).astype(np.float32)
    ulp = np.float32(2.0**-10)  # ties: 1 + (k + 1/2) 2^-10, exactly representable in float32
    ties = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 2 - ulp / 4], dtype=np.float32)
    x = np.concatenate([x, ties, np.float32([0.0, -0.0, np.inf, -np.inf, 3.4e38])])
    got = twins.tf32(x)
    want = np.array([tf32_reference(float(v)) for v in x], dtype=np.float64)
    finite = np.isfinite(want) & (np.abs(want) < 3.4028235e38)
    assert np.array_equal(got[finite].astype(np.float64), want[finite])
    assert twins.tf32(np.float32([1 + ulp / 2]))[0] == np.float32(1 + ulp)  # a tie goes away from zero
    assert np.isnan(twins.tf32(np.float32([np.nan]))[0])


def _case(rng, B, T, H, Hkv, D):
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32)
    dout = rng.standard_normal((B, T, H * D)).astype(np.float32)
    return qkv, dout


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_ops_equal_exact_attention_to_tf32(shape, causal):
    """DeviceOps' fused path (on the twins) against the CPU ops in float64: forward and backward."""
    rng = np.random.default_rng(sum(shape))
    B, T, H, Hkv, D = shape
    qkv, dout = _case(rng, B, T, H, Hkv, D)
    out, cache = FUSED.attention_forward(qkv, H, causal, None, Hkv)
    assert isinstance(cache, FusedAttention) and out.shape == (B, T, H * D) and out.dtype == np.float32
    want, want_cache = ops.attention_forward(qkv.astype(np.float64), H, causal, None, Hkv)
    close(out, want, TF32_TOL, "out")
    close(FUSED.attention_backward(dout, cache), ops.attention_backward(dout.astype(np.float64), want_cache),
          TF32_TOL, "dqkv")  # fmt: skip


def test_lse_is_each_rows_log_sum_exp():
    rng = np.random.default_rng(1)
    B, T, H, Hkv, D = 2, 40, 2, 1, 32
    qkv, _ = _case(rng, B, T, H, Hkv, D)
    _, lse = twins.flash_forward(qkv, H, Hkv, True, 1 / math.sqrt(D))
    x = qkv.astype(np.float64).reshape(B, T, H + 2 * Hkv, D)
    for b, h in [(0, 0), (1, 1)]:
        s = x[b, :, h] @ x[b, :, H].T / math.sqrt(D)
        s[np.triu_indices(T, 1)] = -np.inf
        want = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
        close(lse[b, h], want, 2e-3, "lse")


def test_where_the_fused_path_applies():
    qkv = np.random.default_rng(3).standard_normal((1, 8, 3 * 2 * 16)).astype(np.float32)
    assert isinstance(FUSED.attention_forward(qkv, 2, True)[1], FusedAttention)
    not_fused = [
        FUSED.attention_forward(qkv.astype(np.float64), 2, True)[1],  # float64 models
        FUSED.attention_forward(qkv, 2, True, trace={})[1],  # explain's trace wants the weights
        FUSED.attention_forward(qkv, 4, True)[1],  # head dim 8
        DeviceOps(np, TwinKernels()).attention_forward(qkv, 2, True)[1],  # kernels without it
    ]
    assert not any(isinstance(c, FusedAttention) for c in not_fused)
    set_tf32(False)  # full float32 asked for: TF32 products are not
    try:
        assert not isinstance(FUSED.attention_forward(qkv, 2, True)[1], FusedAttention)
    finally:
        set_tf32(True)


def test_a_model_trains_through_fused_attention():
    """A float32 model on the twins with fused attention against the same model on the CPU:
    loss and every gradient to TF32's tolerance, and the fused path was the one taken."""
    base = twin_backend()
    fused = Backend("cuda-twin-fused", np, FUSED, base.to_device, base.to_host, base.synchronize)
    cfg = GPTConfig(vocab_size=97, context_length=40, d_model=64, n_layers=2, n_heads=2)
    cpu = GPT(cfg, seed=0)
    cpu.params = {k: v.astype(np.float32) for k, v in cpu.params.items()}
    model = GPT(cfg, seed=0, device=fused)
    model.params = {k: v.copy() for k, v in cpu.params.items()}
    rng = np.random.default_rng(4)
    ids, targets = rng.integers(0, 97, (3, 40)), rng.integers(0, 97, (3, 40))
    calls = []
    backward = FUSED.kernels.flash_attention_backward
    FUSED.kernels.flash_attention_backward = lambda *a: calls.append(1) or backward(*a)
    try:
        loss, grads = model.loss_and_grads(ids, targets)
    finally:
        del FUSED.kernels.flash_attention_backward
    assert len(calls) == cfg.n_layers
    want_loss, want = cpu.loss_and_grads(ids, targets)
    assert abs(loss - want_loss) <= 1e-3 * abs(want_loss)
    for name in want:
        close(grads[name], want[name], 2e-2, name)  # TF32 attention, float32 elsewhere


class RerunCapture:
    """The Backend's `capture` without a GPU: it runs the step once to "record" it, and each replay
    reruns it over the same input arrays into the same output array, as a CUDA graph writes the
    addresses it recorded. It counts captures and replays."""

    def __init__(self):
        self.captures = self.replays = self.closed = 0

    def __call__(self, step):
        self.captures += 1
        out = step()
        counts = self

        class Replay:
            def __call__(self):
                counts.replays += 1
                out[...] = step()
                return out

            def close(self):
                counts.closed += 1

        return Replay()


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
def test_generation_replays_a_captured_step_with_the_eager_tokens(positional):
    """Generation through a captured one-position step (ids and position in device arrays, the
    decode kernel reading the position from memory) gives the eager steps' tokens bit for bit,
    sampled at batch 1 and greedy at batch 3, past the context (prefills and window shifts run
    eagerly between replays). Rotary positions are not captured (the table is indexed on the host)."""

    capture = RerunCapture()
    base = twin_backend()
    backend = Backend("cuda-twin-graphs", np, FUSED, base.to_device, base.to_host, base.synchronize, capture)
    cfg = GPTConfig(vocab_size=61, context_length=24, d_model=64, n_layers=2, n_heads=2, positional=positional)
    model = GPT(cfg, seed=3, device=backend)
    model.params = {k: v.astype(np.float32) for k, v in model.params.items()}
    prompts = np.random.default_rng(5).integers(0, 61, (3, 5))

    eager = generated_tokens(model, prompts, 40, graphs=False)
    assert capture.captures == 0
    captured = generated_tokens(model, prompts, 40)
    assert captured[0] == eager[0] and np.array_equal(captured[1], eager[1])
    if positional == "rope":
        assert capture.captures == 0
    else:  # one capture per generation; the steps that are not prefills replay it
        assert capture.captures == 2 and capture.replays > 60 and capture.closed == 2


def test_a_position_on_the_device_needs_the_fused_decode_kernel():
    qkv = np.ones((1, 1, 3 * 16), dtype=np.float32)
    cache = np.zeros((1, 1, 8, 16), dtype=np.float32)
    position = np.array([2], dtype=np.int32)
    for ops_, x in [(FUSED, qkv.astype(np.float64)), (FUSED, np.ones((1, 2, 48), np.float32))]:
        with pytest.raises(ValueError, match="position on the device"):
            ops_.attention_forward_cached(x, cache.astype(x.dtype), cache.astype(x.dtype), position, 1, 1)
    out, _ = FUSED.attention_forward_cached(qkv, cache, cache.copy(), position, 1, 1)
    want, _ = FUSED.attention_forward_cached(qkv, cache, cache.copy(), 2, 1, 1)
    assert np.array_equal(out, want)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_attention_source_compiles_without_spilling_much(tmp_path):
    """Every kernel and head dim for sm_80 and sm_90; ptxas reports no more than a few bytes of
    spills (registers are the kernels' budget: a spilled fragment array would cost a lot)."""
    taken = ", ".join(f"(void*)&{k}<{d}>" for k in attention_source.KERNELS for d in attention_source.HEAD_DIMS)
    source = tmp_path / "attention.cu"
    source.write_text(attention_source.SOURCE + f"\nvoid* tk_all_kernels[] = {{{taken}}};\n", encoding="utf-8")
    for arch in ("sm_80", "sm_90"):
        done = subprocess.run(
            ["nvcc", "-c", f"-arch={arch}", *attention_source.OPTIONS, "-Xptxas", "-v", "-Werror", "all-warnings",
             "-o", str(tmp_path / f"{arch}.o"), str(source)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        spills = [int(line.split("bytes spill stores")[0].split(",")[-1]) for line in done.stderr.splitlines()
                  if "bytes spill stores" in line]  # fmt: skip
        assert len(spills) == len(attention_source.KERNELS) * len(attention_source.HEAD_DIMS)
        assert max(spills) <= 64, done.stderr


# ----------------------------------------------------------------------------- the CUDA source, emulated


@pytest.fixture(scope="module")
def emulated_kernels():
    """cuda_launch.py's launches of the real attention source, compiled by g++ for the CPU
    emulator (tests/cuda_emulator.py), their outputs allocated full of NaN."""
    from cuda_emulator import CXX, EmulatedModule

    if CXX is None:
        pytest.skip("g++ is not installed")
    names = [f"{k}<{d}>" for k in attention_source.KERNELS for d in attention_source.HEAD_DIMS]
    module = EmulatedModule(attention_source.SOURCE, attention_source.OPTIONS, names)
    return CudaKernels(PoisonedXp(np), None, module)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_emulated_kernels_against_twins(emulated_kernels, shape, causal):
    check_against_twins(emulated_kernels, np.asarray, np.asarray, shape, causal, seed=len(shape) + causal)


def _decode_case(rng, B, H, Hkv, D, Tmax):
    qkv = rng.standard_normal((B, Tmax, (H + 2 * Hkv) * D)).astype(np.float32)
    caches = [np.full((B, Hkv, Tmax, D), np.nan, dtype=np.float32) for _ in range(2)]
    return qkv, caches


@pytest.mark.parametrize("shape", [(1, 2, 1, 16, 20), (2, 4, 2, 64, 300), (3, 3, 3, 32, 140)])
def test_generation_steps_through_the_decode_kernels_twin(shape):
    """A prompt through the GEMM path, then one position at a time through `decode_attention`
    (on the twins), against the CPU op step by step: outputs to 1e-5, the caches bit for bit."""
    B, H, Hkv, D, Tmax = shape
    rng = np.random.default_rng(Tmax)
    qkv, (k, v) = _decode_case(rng, B, H, Hkv, D, Tmax)
    _, (k_cpu, v_cpu) = _decode_case(rng, B, H, Hkv, D, Tmax)
    prompt = 5
    FUSED.attention_forward_cached(qkv[:, :prompt], k, v, 0, H, Hkv)
    ops.attention_forward_cached(qkv[:, :prompt], k_cpu, v_cpu, 0, H, Hkv)
    calls = []
    decode = FUSED.kernels.decode_attention
    FUSED.kernels.decode_attention = lambda *a: calls.append(1) or decode(*a)
    try:
        for start in range(prompt, Tmax):
            out, _ = FUSED.attention_forward_cached(qkv[:, start : start + 1], k, v, start, H, Hkv)
            want, _ = ops.attention_forward_cached(qkv[:, start : start + 1], k_cpu, v_cpu, start, H, Hkv)
            close(out, want, 1e-5, f"step {start}")
    finally:
        del FUSED.kernels.decode_attention
    assert len(calls) == Tmax - prompt
    assert np.array_equal(k, k_cpu) and np.array_equal(v, v_cpu)


@pytest.mark.parametrize("on_device", [False, True], ids=["position-in-launch", "position-in-memory"])
@pytest.mark.parametrize("start", [0, 1, 127, 128, 260])
@pytest.mark.parametrize("heads", [(2, 1, 16), (4, 2, 64), (3, 3, 32)])
def test_emulated_decode_kernel_against_its_twin(emulated_kernels, heads, start, on_device):
    check_decode_against_twin(emulated_kernels, np.asarray, np.asarray, heads, start, 2, 300, on_device)


def test_the_memory_check_counts_no_weights_where_attention_is_fused(monkeypatch):
    """On a backend whose attention is fused, a training step's estimate keeps each row's
    log-sum-exp instead of the (T, T) weights and the scaled q: less than the CPU's estimate."""
    import tokenkit.transformer.backends as backends
    from tokenkit.transformer import memory

    base = twin_backend()
    monkeypatch.setitem(
        backends._BACKENDS, "cuda", Backend("cuda", np, FUSED, base.to_device, base.to_host, base.synchronize)
    )
    monkeypatch.setattr(memory, "_device_free_bytes", lambda: None)
    gpt2 = GPTConfig(vocab_size=50304, context_length=1024, d_model=768, n_layers=12, n_heads=12)
    fused = memory.check_memory(gpt2, training=True, batch_rows=8, device="cuda")
    assert fused == memory.estimate_bytes(gpt2, training=True, batch_rows=8, fused_attention=True)
    assert fused < memory.estimate_bytes(gpt2, training=True, batch_rows=8)
    odd = GPTConfig(vocab_size=300, context_length=64, d_model=96, n_layers=1, n_heads=2)  # head dim 48: not fused
    assert memory.check_memory(odd, training=True, batch_rows=2, device="cuda") == memory.estimate_bytes(
        odd, training=True, batch_rows=2
    )
