"""The GPU backend on a real GPU: each CUDA kernel against its NumPy twin, each GPU op against its
CPU op (float64 to 1e-12, float32 to 1e-5, relative to the largest magnitude), and whole training
steps, optimizer and files against the CPU model's.

Skipped cleanly without CuPy or without a GPU (CI has none). TF32 is switched off here, so that
cuBLAS computes in full float32, except in the test that checks TF32 itself.
"""

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import kernel_checks  # noqa: E402
from kernel_checks import (  # noqa: E402
    check_attention_kernels,
    check_embedding_and_adamw_bit_identical,
    check_fused_kernels,
    check_row_kernels,
    check_skinny_kernels,
    check_xent_kernels,
    tol_for,
)

from tokenkit.transformer import GPT, AdamW, GPTConfig, ModelError, clip_grad_norm, ops  # noqa: E402
from tokenkit.transformer import reference as ref  # noqa: E402
from tokenkit.transformer.backends import cuda_source as src  # noqa: E402
from tokenkit.transformer.backends import get_backend, set_tf32  # noqa: E402

try:
    CUDA = get_backend("cuda")
except ModelError as err:
    pytest.skip(f"no GPU: {err}", allow_module_level=True)

G = CUDA.ops
KERNELS = G.kernels
TWINS = kernel_checks.TWINS
DTYPES = [np.float64, np.float32]


@pytest.fixture(autouse=True)
def full_float32_gemms():
    set_tf32(False)
    yield
    set_tf32(True)


def close(a, b, tol: float, what: str) -> None:
    """kernel_checks.close over CuPy or host arrays."""
    kernel_checks.close(*(cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else x for x in (a, b)), tol, what)


def dev(a):
    return cupy.asarray(a)


# ----------------------------------------------------------------------------- kernels against twins


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 33), (200, 768), (70, 1000)])
def test_row_kernels_against_twins(shape, dtype):
    check_row_kernels(KERNELS, dev, cupy.asnumpy, shape, dtype)


@pytest.mark.parametrize(
    "shape, dtype",
    [((1, 1), np.float64), ((3, 33), np.float64), ((200, 768), np.float64), ((4100, 130), np.float64),
     ((3, 33), np.float32), ((200, 768), np.float32), ((8 * 1024, 768), np.float32), ((8 * 1024, 3072), np.float32)],
)  # fmt: skip
def test_fused_kernels_against_twins_and_the_kernels_they_replace(shape, dtype):
    """GPT-2's fused passes, at its shapes too: (8 x 1024, 768) for the residual and LayerNorm,
    (8 x 1024, 3072) for c_fc's bias with GELU and dpre with its column sums."""
    check_fused_kernels(KERNELS, dev, cupy.asnumpy, shape, dtype)


def test_column_sums_count_every_row_of_a_gpt2_batch():
    """8 x 1024 rows: 128 chunks of 64, whose sums take two more passes (one dropped half the rows)."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((8 * 1024, 768)).astype(np.float32), rng.standard_normal((8 * 1024, 768))
    close(KERNELS.column_sums(dev(a), None), TWINS.column_sums(a, None), 1e-5, "column sums")
    close(KERNELS.column_sums(dev(b), dev(b)), (b * b).sum(axis=0), 1e-12, "column sums of products")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (5, 300), (64, 50304)])
def test_xent_kernels_against_twins(shape, dtype):
    check_xent_kernels(KERNELS, dev, cupy.asnumpy, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", [(1, 768, 2304), (8, 3072, 768), (3, 37, 65), (8, 768, 4099)])
def test_skinny_kernels_against_twins(rows, k, n, dtype):
    check_skinny_kernels(KERNELS, dev, cupy.asnumpy, rows, k, n, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal, q_offset", [(True, 0), (False, 0), (True, 7)])
def test_attention_kernels_against_twins(causal, q_offset, dtype):
    check_attention_kernels(KERNELS, dev, cupy.asnumpy, causal, q_offset, dtype)


def test_embedding_and_adamw_kernels_are_bit_identical_to_the_cpu():
    check_embedding_and_adamw_bit_identical(KERNELS, dev, cupy.asnumpy, rows=300, width=96, size=100_003)


def test_adamw_in_one_launch_is_bit_identical_to_one_launch_per_tensor():
    """Kernel adamw_multi over tensors of odd sizes (1, empty, past a chunk), decayed or not, gives
    kernel adamw's bits per tensor; AdamW, which steps a GPU's parameters with it, the CPU's."""
    rng = np.random.default_rng(8)
    sizes = [1, 0, 5, 257, src.ADAMW_CHUNK + 1, 3 * src.ADAMW_CHUNK, 100_003]
    lists = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(3)]
    lists.append([rng.random(n).astype(np.float32) for n in sizes])
    decayed = [bool(k % 2) for k in range(len(sizes))]
    consts = (0.9, 0.95, 1e-3, 1e-8, 0.999)
    single = [[dev(a) for a in arrays] for arrays in lists]
    for k in range(len(sizes)):
        KERNELS.adamw(*(arrays[k] for arrays in single), *consts[:4], consts[4] if decayed[k] else 1.0)
    multi = [[dev(a) for a in arrays] for arrays in lists]
    KERNELS.adamw_multi(*multi, decayed, *consts)
    for name, got, want in zip("pgmv", multi, single, strict=True):
        for k in range(len(sizes)):
            assert np.array_equal(cupy.asnumpy(got[k]), cupy.asnumpy(want[k])), f"{name}[{k}]"
    shapes = {"w": (70, 300), "b": (300,), "ln": (1,), "e": (3, 4097)}
    start = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    cpu_params, gpu_params = {k: v.copy() for k, v in start.items()}, {k: dev(v) for k, v in start.items()}
    cpu, gpu = AdamW(cpu_params, lr=1e-2), AdamW(gpu_params, lr=1e-2)
    for step in range(3):
        grads = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
        cpu.step(grads, lr=1e-2 / (step + 1))
        gpu.step({k: dev(v) for k, v in grads.items()}, lr=1e-2 / (step + 1))
        for name in shapes:
            assert np.array_equal(cupy.asnumpy(gpu_params[name]), cpu_params[name]), (step, name)


# ----------------------------------------------------------------------------- ops against the CPU ops


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ops_against_cpu_ops(dtype, causal):
    rng = np.random.default_rng(4)
    B, T, H, hd = 2, 37, 4, 16
    C = H * hd
    x = rng.standard_normal((B, T, C)).astype(dtype)
    w, b = rng.standard_normal(C).astype(dtype), rng.standard_normal(C).astype(dtype)
    out, cache = G.layernorm_forward(dev(x), dev(w), dev(b))
    close(out, ref.layernorm(x.astype(np.float64), w, b), tol_for(dtype), "layernorm")
    d = rng.standard_normal(x.shape).astype(dtype)
    for name, g, c in zip(("dx", "dw", "db"), G.layernorm_backward(dev(d), cache),
                          ops.layernorm_backward(d, ops.layernorm_forward(x, w, b)[1]), strict=True):  # fmt: skip
        close(g, c, tol_for(dtype), f"layernorm {name}")
    W, bias = rng.standard_normal((C, 3 * C)).astype(dtype), rng.standard_normal(3 * C).astype(dtype)
    qkv, lcache = G.linear_forward(dev(x), dev(W), dev(bias))
    close(qkv, ref.linear(x, W, bias), tol_for(dtype), "linear")
    dq = rng.standard_normal((B, T, 3 * C)).astype(dtype)
    for name, g, c in zip(("dx", "dW", "db"), G.linear_backward(dev(dq), lcache),
                          ops.linear_backward(dq, ops.linear_forward(x, W, bias)[1]), strict=True):  # fmt: skip
        close(g, c, tol_for(dtype), f"linear {name}")
    qkv_h = cupy.asnumpy(qkv)
    att, acache = G.attention_forward(qkv, H, causal)
    close(att, ref.attention(qkv_h.astype(np.float64), H, causal), tol_for(dtype), "attention")
    da = rng.standard_normal((B, T, C)).astype(dtype)
    close(G.attention_backward(dev(da), acache), ops.attention_backward(da, ops.attention_forward(qkv_h, H, causal)[1]),
          tol_for(dtype), "attention backward")  # fmt: skip
    ids = rng.integers(0, 97, (B, T))
    logits = rng.standard_normal((B * T, 97)).astype(dtype)
    loss, xcache = G.softmax_xent_forward(dev(logits), dev(ids.reshape(-1)))
    close(loss, ref.softmax_xent(logits.astype(np.float64), ids.reshape(-1)), tol_for(dtype), "loss")
    close(G.softmax_xent_backward(xcache), ref.softmax_xent_grad(logits.astype(np.float64), ids.reshape(-1)),
          tol_for(dtype), "dlogits")  # fmt: skip


# ----------------------------------------------------------------------------- the model


def _models(dtype, **kw):
    cfg = GPTConfig(vocab_size=500, context_length=64, d_model=128, n_layers=2, n_heads=4, **kw)
    cpu = GPT(cfg, seed=0)
    cpu.params = {k: v.astype(dtype) for k, v in cpu.params.items()}
    gpu = GPT.from_params(cfg, cpu.params, device="cuda")
    gpu.params = {k: cupy.asarray(v) for k, v in cpu.params.items()}  # keeps float64 too
    return cfg, cpu, gpu


LLAMA = dict(positional="rope", norm_type="rmsnorm", activation="swiglu", mlp_hidden=320, bias=False, qkv_bias=True,
             tie_embeddings=False, n_kv_heads=2)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", [{}, dict(norm="post", activation="relu", positional="sinusoidal", causal=False), LLAMA])
def test_training_step_matches_the_cpu(kw, dtype):
    cfg, cpu, gpu = _models(dtype, **kw)
    rng = np.random.default_rng(5)
    ids, targets = rng.integers(0, 500, (4, 64)), rng.integers(0, 500, (4, 64))
    loss, grads = cpu.loss_and_grads(ids, targets)
    g_loss, g_grads = gpu.loss_and_grads(ids, targets)
    assert isinstance(g_loss, float) and all(isinstance(g, cupy.ndarray) for g in g_grads.values())
    close(g_loss, loss, tol_for(dtype), "loss")
    for name in grads:
        close(g_grads[name], grads[name], tol_for(dtype), name)
    norm, g_norm = clip_grad_norm(grads, 0.5), clip_grad_norm(g_grads, 0.5)
    close(g_norm, norm, tol_for(dtype), "grad norm")
    opt, g_opt = AdamW(cpu.params, lr=1e-3), AdamW(gpu.params, lr=1e-3)
    opt.step(grads)
    g_opt.step({k: cupy.asarray(v) for k, v in grads.items()})  # the same gradients: the same update
    for name in cpu.params:
        close(gpu.params[name], cpu.params[name], tol_for(dtype), f"after AdamW: {name}")
    state = g_opt.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    opt.load_state_dict(state)  # a GPU optimizer's state resumes on the CPU


def test_files_are_device_free(tmp_path):
    cfg, cpu, gpu = _models(np.float32)
    gpu.save(tmp_path / "gpu.safetensors")
    back = GPT.load(tmp_path / "gpu.safetensors")  # onto the CPU
    ids = np.arange(20)[None] % 500
    close(back.forward(ids), gpu.forward(ids), 1e-5, "logits after GPU -> file -> CPU")
    again = GPT.load(tmp_path / "gpu.safetensors", device="cuda")
    assert again.device == "cuda" and back.to("cuda").device == "cuda"
    close(again.forward(ids), cpu.forward(ids), 1e-5, "logits after CPU -> file -> GPU")


@pytest.mark.parametrize("kw", [{}, LLAMA])
def test_generation_matches_the_cpu(kw):
    cfg, cpu, gpu = _models(np.float64, **kw)
    for use_cache in (True, False):
        args = dict(temperature=0.9, seed=1, use_cache=use_cache)
        with pytest.warns(UserWarning, match="context"):
            want = list(cpu.generate([1, 2, 3], 80, **args))
        with pytest.warns(UserWarning, match="context"):
            assert list(gpu.generate([1, 2, 3], 80, **args)) == want


@pytest.mark.parametrize("kw", [{}, LLAMA])
def test_batched_greedy_decoding_matches_the_cpu(kw):
    cfg, cpu, gpu = _models(np.float64, **kw)
    prompts = np.random.default_rng(2).integers(0, 500, (8, 16))
    with pytest.warns(UserWarning, match="context"):
        want = np.stack(list(cpu.generate_batch(prompts, 70)))
    with pytest.warns(UserWarning, match="context"):
        assert np.array_equal(np.stack(list(gpu.generate_batch(prompts, 70))), want)


def test_tf32_changes_little():
    cfg, cpu, gpu = _models(np.float32)
    rng = np.random.default_rng(6)
    ids, targets = rng.integers(0, 500, (4, 64)), rng.integers(0, 500, (4, 64))
    set_tf32(True)
    close(gpu.loss(ids, targets), cpu.loss(ids, targets), 1e-2, "loss with TF32")


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_captured_generation_steps_give_the_eager_tokens(positional, monkeypatch):
    """float32 (the fused decode kernel): generation replaying a CUDA graph of the one-position
    step gives the tokens of one launch per op, sampled at batch 1 and greedy at batch 8, past
    the context; the graphs were replayed, and their memory goes back to the pool afterwards."""
    from attention_checks import generated_tokens

    from tokenkit.transformer.backends import cuda_graph

    set_tf32(True)
    cfg, _, gpu = _models(np.float32, positional=positional)
    prompts = np.random.default_rng(3).integers(0, 500, (8, 16))

    eager = generated_tokens(gpu, prompts, 90, graphs=False)
    replays = []
    replay = cuda_graph.CapturedStep.__call__
    monkeypatch.setattr(cuda_graph.CapturedStep, "__call__", lambda self: replays.append(1) or replay(self))
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    captured = generated_tokens(gpu, prompts, 90)
    assert captured[0] == eager[0] and np.array_equal(captured[1], eager[1])
    assert len(replays) > 150
    assert pool.used_bytes() <= used, "a generation's graph or caches outlived it"


def test_the_memory_check_covers_a_training_step_tightly():
    """The memory check's estimate of a training step (fused attention: TF32 on) against what
    CuPy's pool grew by over three steps with AdamW: at least that, and within 1.3x of it."""
    from tokenkit.transformer.memory import check_memory

    set_tf32(True)
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.total_bytes()
    cfg = GPTConfig(vocab_size=4096, context_length=128, d_model=256, n_layers=4, n_heads=8)
    model = GPT(cfg, seed=0, device="cuda")
    opt = AdamW(model.params, lr=1e-3)
    rng = np.random.default_rng(7)
    for _ in range(3):
        _, grads = model.loss_and_grads(rng.integers(0, 4096, (16, 128)), rng.integers(0, 4096, (16, 128)))
        opt.step(grads)
    del grads
    peak = pool.total_bytes() - base
    estimate = check_memory(cfg, training=True, batch_rows=16, device="cuda")
    assert peak <= estimate <= 1.3 * peak, (estimate, peak)
