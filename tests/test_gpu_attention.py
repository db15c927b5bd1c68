"""Fused attention on a real GPU (attention_source.py's kernels): against the twins and exact
attention on random inputs, every output written, the same bits on every run, and a model's
training step through it against the CPU model. Skipped without CuPy or a GPU (CI has none)."""

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from attention_checks import (  # noqa: E402
    SHAPES,
    PoisonedXp,
    check_against_twins,
    check_decode_against_twin,
)
from kernel_checks import relative_error  # noqa: E402

from tokenkit.transformer import GPT, GPTConfig, ModelError  # noqa: E402
from tokenkit.transformer.backends import get_backend, set_tf32, tf32_enabled  # noqa: E402
from tokenkit.transformer.backends.device_ops import FusedAttention  # noqa: E402

try:
    CUDA = get_backend("cuda")
except ModelError as err:
    pytest.skip(f"no GPU: {err}", allow_module_level=True)

KERNELS = CUDA.ops.kernels
if not getattr(KERNELS, "fused_attention", False):
    pytest.skip("this GPU has no TF32 tensor cores (sm_80 or newer)", allow_module_level=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [*SHAPES, (2, 1024, 12, 12, 64), (1, 333, 8, 2, 64)])
def test_kernels_against_twins(shape, causal, monkeypatch):
    monkeypatch.setattr(KERNELS, "xp", PoisonedXp(cupy))
    check_against_twins(KERNELS, cupy.asarray, cupy.asnumpy, shape, causal)


def test_the_same_bits_on_every_run():
    rng = np.random.default_rng(5)
    B, T, H, Hkv, D = 2, 300, 4, 2, 64
    qkv = cupy.asarray(rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32))
    dout = cupy.asarray(rng.standard_normal((B, T, H * D)).astype(np.float32))
    runs = []
    for _ in range(3):
        out, lse = KERNELS.flash_attention_forward(qkv, H, Hkv, True, 0.125)
        runs.append([cupy.asnumpy(a) for a in (out, lse, KERNELS.flash_attention_backward(dout, qkv, out, lse, H, Hkv,
                                                                                          True, 0.125))])  # fmt: skip
    for run in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(run, runs[0], strict=True))


def test_a_training_step_through_fused_attention_matches_the_cpu():
    was = tf32_enabled()
    set_tf32(True)
    try:
        cfg = GPTConfig(vocab_size=300, context_length=128, d_model=128, n_layers=2, n_heads=2)
        cpu = GPT(cfg, seed=0)
        cpu.params = {k: v.astype(np.float32) for k, v in cpu.params.items()}
        gpu = GPT(cfg, seed=0, device="cuda")
        gpu.params = {k: cupy.asarray(v) for k, v in cpu.params.items()}
        ids = np.random.default_rng(6).integers(0, 300, (4, 128))
        targets = np.roll(ids, -1, axis=1)
        x = cupy.asarray(np.random.default_rng(7).standard_normal((4, 128, 6 * 64)).astype(np.float32))
        assert isinstance(gpu.ops.attention_forward(x, 2, True)[1], FusedAttention)
        loss, grads = gpu.loss_and_grads(ids, targets)
        want_loss, want = cpu.loss_and_grads(ids, targets)
        assert abs(loss - want_loss) <= 1e-3 * abs(want_loss)
        for name in want:  # TF32 GEMMs and attention against float32 on the CPU
            assert relative_error(cupy.asnumpy(grads[name]), want[name]) <= 3e-2, name
    finally:
        set_tf32(was)


@pytest.mark.parametrize("on_device", [False, True], ids=["position-in-launch", "position-in-memory"])
@pytest.mark.parametrize("start", [0, 127, 128, 1000])
@pytest.mark.parametrize("heads", [(12, 12, 64), (8, 2, 64), (3, 1, 32), (2, 2, 16)])
def test_decode_kernel_against_its_twin(heads, start, on_device, monkeypatch):
    monkeypatch.setattr(KERNELS, "xp", PoisonedXp(cupy))
    check_decode_against_twin(KERNELS, cupy.asarray, cupy.asnumpy, heads, start, 8, 1024, on_device)
