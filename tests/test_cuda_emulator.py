"""The CUDA source on the CPU (tests/cuda_emulator.py): first the emulator itself, on small kernels
whose answers are obvious (barriers, shared memory, shuffles, the guard bytes, the TF32 tensor
core helpers), then the project's real kernels, launched by cuda_launch.py exactly as on a GPU,
against their NumPy twins (cuda_twins.py), and a whole training step on them against the CPU.

Float64 to 1e-12 and float32 to 1e-5 relative to the largest magnitude, as tests/test_gpu.py;
the embedding gradient and AdamW bit for bit. Skipped without g++.
"""

import numpy as np
import pytest
from cuda_emulator import CXX, CompileError, EmulatedModule
from kernel_checks import (
    TWINS,
    check_attention_kernels,
    check_embedding_and_adamw_bit_identical,
    check_fused_kernels,
    check_row_kernels,
    check_skinny_kernels,
    check_xent_kernels,
    close,
)

from tokenkit.transformer import GPT, AdamW, GPTConfig, ops
from tokenkit.transformer.backends import Backend
from tokenkit.transformer.backends import cuda_source as src
from tokenkit.transformer.backends.cuda_launch import CudaKernels
from tokenkit.transformer.backends.device_ops import DeviceOps

if CXX is None:
    pytest.skip("g++ is not installed: the CUDA emulator compiles kernels with it", allow_module_level=True)

DTYPES = [np.float64, np.float32]


# ----------------------------------------------------------------------------- the emulator itself

TOYS = r"""
#define FULL 0xffffffffu

#ifndef TK_CPU_EMULATION  // the tensor cores' helpers as a kernel source defines them for the GPU
__device__ __forceinline__ unsigned tk_to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void tk_mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// out[block] = the sum of x[block * n ..][:n], n = the block's threads: a tree in shared memory;
// positive[block] = how many of them are > 0
__global__ void block_sum(const float* x, float* out, int* positive) {
    __shared__ float part[1024];
    int n = blockDim.x * blockDim.y * blockDim.z;
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    part[t] = x[b * n + t];
    int count = __syncthreads_count(part[t] > 0.0f);
    for (int half = n / 2; half > 0; half /= 2) {
        if (t < half) part[t] += part[t + half];
        __syncthreads();
    }
    if (t == 0) out[b] = part[0], positive[b] = count;
}

// out[i] = x of thread i + 1 (mod the block) of the same block, through shared memory
template <int SYNC> __global__ void neighbour(const int* x, int* out) {
    __shared__ int seen[1024];
    int t = threadIdx.x, n = blockDim.x, i = blockIdx.x * n + t;
    seen[t] = x[i];
    if (SYNC) __syncthreads();
    out[i] = seen[(t + 1) % n];
}

// per thread: xor partner 5, lane (lane * 7 + 3) % 32, down 3, up 2; any, all and ballot of x > 0
template <typename T> __global__ void shuffles(const T* x, T* out, unsigned* votes) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    T v = x[i];
    out[4 * i + 0] = __shfl_xor_sync(FULL, v, 5);
    out[4 * i + 1] = __shfl_sync(FULL, v, (lane * 7 + 3) % 32);
    out[4 * i + 2] = __shfl_down_sync(FULL, v, 3);
    out[4 * i + 3] = __shfl_up_sync(FULL, v, 2);
    votes[3 * i] = __any_sync(FULL, v > T(0));
    votes[3 * i + 1] = __all_sync(FULL, v > T(0));
    votes[3 * i + 2] = __ballot_sync(FULL, v > T(0));
}

// x[i] += 1, one thread per element; `past` more threads than elements, unchecked
__global__ void add_one(float* x, long long n, int past) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n + past) x[i] += 1.0f;
}

__global__ void write_before(float* x) { x[(int)threadIdx.x - 1] = 7.0f; }

__global__ void wild_write(float* x) { x[threadIdx.x - 1] = 7.0f; }  // unsigned: 2^32 - 1 past x

__global__ void returns_early(float* x) {
    if (threadIdx.x == 3) return;
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}

__global__ void mixed_warp_ops(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x == 0) __syncwarp();
    else v = __shfl_xor_sync(FULL, v, 1);
    x[threadIdx.x] = v;
}

__global__ void half_mask(float* x) { x[threadIdx.x] = __shfl_xor_sync(0xffffu, x[threadIdx.x], 1); }

__global__ void takes_int(float* x, int n) { x[0] = (float)n; }

__global__ void to_tf32(const float* x, unsigned* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tk_to_tf32(x[i]);
}

// D (16, 8) = C + A (16, 8) B (8, 8), all row-major, by one warp through the fragment layout
__global__ void mma(const float* A, const float* B, const float* C, float* D) {
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    unsigned a[4] = {tk_to_tf32(A[g * 8 + t]), tk_to_tf32(A[(g + 8) * 8 + t]), tk_to_tf32(A[g * 8 + t + 4]),
                     tk_to_tf32(A[(g + 8) * 8 + t + 4])};
    unsigned b[2] = {tk_to_tf32(B[t * 8 + g]), tk_to_tf32(B[(t + 4) * 8 + g])};
    float d[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    tk_mma_tf32(d, a, b);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
"""
TOY_NAMES = ("block_sum", "neighbour<1>", "neighbour<0>", "shuffles<float>", "shuffles<double>", "shuffles<int>",
             "shuffles<unsigned>", "add_one", "write_before", "wild_write", "returns_early", "mixed_warp_ops",
             "half_mask", "takes_int", "to_tf32", "mma")  # fmt: skip
TOY = EmulatedModule(TOYS, (), TOY_NAMES)


@pytest.mark.parametrize("block", [(256,), (8, 4, 2), (1,), (1024,)])
def test_a_shared_memory_reduction_waits_at_each_barrier(block):
    n = int(np.prod(block))
    x = np.random.default_rng(n).integers(-50, 50, (6, n)).astype(np.float32)  # small integers: exact sums
    out, positive = np.zeros(6, np.float32), np.zeros(6, np.int32)
    TOY.get_function("block_sum")((3, 2), block, (x, out, positive))
    assert np.array_equal(out, x.sum(axis=1)) and np.array_equal(positive, (x > 0).sum(axis=1))


def test_a_neighbour_s_shared_write_is_seen_after_the_barrier_only():
    x = np.arange(3 * 64, dtype=np.int32)
    want = x.reshape(3, 64)[:, np.r_[1:64, 0]].reshape(-1)
    out = np.zeros_like(x)
    TOY.get_function("neighbour<1>")((3,), (64,), (x, out))
    assert np.array_equal(out, want)
    TOY.get_function("neighbour<0>")((3,), (64,), (x + 1000, out))  # threads run in turn between barriers
    assert not np.array_equal(out, want + 1000)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint32])
def test_shuffles_and_votes_exchange_within_each_warp(dtype):
    rng = np.random.default_rng(1)
    x = rng.integers(1, 1000, 128).astype(dtype)  # warps 1 and 3: all positive
    x[[5, 64]] = 0  # warps 0 and 2: one zero each
    out, votes = np.zeros((128, 4), dtype), np.zeros((128, 3), np.uint32)
    name = {np.float32: "float", np.float64: "double", np.int32: "int", np.uint32: "unsigned"}[dtype]
    TOY.get_function(f"shuffles<{name}>")((2,), (64,), (x, out, votes))
    lane = np.arange(128) % 32
    base = np.arange(128) - lane
    for k, source in enumerate([lane ^ 5, (lane * 7 + 3) % 32, np.where(lane + 3 < 32, lane + 3, lane),
                                np.where(lane >= 2, lane - 2, lane)]):  # fmt: skip
        assert np.array_equal(out[:, k], x[base + source]), k
    warps = x.reshape(4, 32) > 0
    assert np.array_equal(votes[:, 0], np.repeat(warps.any(axis=1), 32))
    assert np.array_equal(votes[:, 1], np.repeat(warps.all(axis=1), 32))
    assert np.array_equal(votes[:, 2], np.repeat((warps << np.arange(32)).sum(axis=1), 32))


def test_kernels_write_in_place_and_the_guard_catches_writes_out_of_bounds():
    x = np.arange(1000, dtype=np.float32)
    TOY.get_function("add_one")((4,), (256,), (x, np.int64(1000), np.int32(0)))
    assert np.array_equal(x, np.arange(1000) + 1)
    view = x[100:200]  # a view: the kernel writes through to x
    TOY.get_function("add_one")((1,), (128,), (view, np.int64(100), np.int32(0)))
    assert np.array_equal(x[100:200], np.arange(100, 200) + 2) and x[99] == 100 and x[200] == 201
    with pytest.raises(AssertionError, match=r"add_one wrote out of bounds: up to 4 bytes past the end of argument 0"):
        TOY.get_function("add_one")((4,), (256,), (x, np.int64(1000), np.int32(1)))
    with pytest.raises(AssertionError, match=r"write_before wrote out of bounds: up to 4 bytes before the start"):
        TOY.get_function("write_before")((1,), (32,), (np.zeros(64, np.float32),))
    with pytest.raises(AssertionError, match=r"wild_write, block \(0, 0, 0\), thread \(0, 0, 0\): memory fault"):
        TOY.get_function("wild_write")((1,), (32,), (np.zeros(64, np.float32),))


def test_a_thread_that_skips_a_barrier_stops_the_launch_instead_of_hanging():
    x = np.zeros(64, np.float32)
    deadlock = r"returns_early, block \(0, 0, 0\): deadlock: 63 threads wait at __syncthreads \(first: 0\), 0 at a"
    with pytest.raises(AssertionError, match=deadlock + r" warp operation \(first: -1\), 1 returned \(first: 3\)"):
        TOY.get_function("returns_early")((1,), (64,), (x,))
    with pytest.raises(AssertionError, match="lanes of warp 0 reached different warp operations"):
        TOY.get_function("mixed_warp_ops")((1,), (32,), (x,))
    with pytest.raises(AssertionError, match="mask 0x0000ffff: only the full mask is emulated"):
        TOY.get_function("half_mask")((1,), (32,), (x,))
    with pytest.raises(AssertionError, match="a warp operation in a block of 40 threads, not a multiple of 32"):
        TOY.get_function("shuffles<float>")((1,), (40,), (x[:40], np.zeros(160, np.float32), np.zeros(120, np.uint32)))
    positive = np.zeros(1, np.int32)
    TOY.get_function("block_sum")((1,), (64,), (np.ones(64, np.float32), x, positive))  # the next launch runs as usual
    assert x[0] == 64 and positive[0] == 64


def test_launches_a_gpu_would_misread_or_refuse_are_errors():
    x = np.zeros(4, np.float32)
    takes_int = TOY.get_function("takes_int")
    with pytest.raises(TypeError, match="takes_int: argument 1 is long long, but the kernel's parameter is int"):
        takes_int((1,), (1,), (x, np.int64(3)))
    with pytest.raises(TypeError, match="argument 0 is double\\*, but the kernel's parameter is float\\*"):
        takes_int((1,), (1,), (x.astype(np.float64), np.int32(3)))
    with pytest.raises(TypeError, match="argument 1 is a int; pass NumPy arrays and NumPy scalars"):
        takes_int((1,), (1,), (x, 3))
    with pytest.raises(TypeError, match="takes 2 arguments, the launch passes 1"):
        takes_int((1,), (1,), (x,))
    with pytest.raises(TypeError, match="argument 0 is not C-contiguous"):
        takes_int((1,), (1,), (np.zeros((4, 4), np.float32)[:, 1], np.int32(3)))
    with pytest.raises(ValueError, match=r"grid \(1, 65536, 1\) is outside CUDA's limits"):
        takes_int((1, 65536), (1,), (x, np.int32(3)))
    with pytest.raises(ValueError, match=r"block \(1025, 1, 1\) is outside"):
        takes_int((1,), (1025,), (x, np.int32(3)))
    with pytest.raises(CompileError, match="no_such_kernel"):
        TOY.get_function("no_such_kernel")
    takes_int((1,), (1,), (x, np.int32(3)))
    assert x[0] == 3


def tf32_reference(x: np.ndarray) -> np.ndarray:
    """float32 -> float32 with TF32's 11 significant bits, to nearest, ties away from zero, in
    float64 arithmetic: |x| = m 2^e with m in [1024, 2048) (subnormals: the float32 grid's
    exponent, 2^-136 for the last kept bit), m rounded half up, the sign put back."""
    a = np.abs(x.astype(np.float64))
    _, e = np.frexp(a)
    ulp = np.ldexp(1.0, np.maximum(e - 11, -136))
    with np.errstate(over="ignore"):
        return (np.sign(x) * np.floor(a / ulp + 0.5) * ulp).astype(np.float32)


def test_tk_to_tf32_rounds_to_nearest_with_ties_away_from_zero():
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
    bits[:1000] = (bits[:1000] & ~np.uint32(0x1FFF)) | np.uint32(0x1000)  # exact ties
    bits[1000:1100] = (bits[1000:1100] & ~np.uint32(0x1FFF)) | np.uint32(0x0FFF)  # just below a tie
    # the largest floats (to infinity), subnormals at and below a tie, infinities, a NaN
    extremes = np.array([0x7F7FFFFF, 0xFF7FF000, 0x00001000, 0x80000FFF, 0x7F800000, 0xFF800000, 0x7FC00001], np.uint32)
    x = np.concatenate([bits, extremes]).view(np.float32)
    out = np.zeros(x.size, np.uint32)
    TOY.get_function("to_tf32")((-(-x.size // 256),), (256,), (x, out, np.int64(x.size)))
    finite = np.isfinite(x)
    assert np.array_equal(out[finite].view(np.float32), tf32_reference(x[finite]))
    assert np.array_equal(out[~finite], x[~finite].view(np.uint32))  # infinities and NaN pass through
    with np.errstate(invalid="ignore"):
        grew = np.abs(out.view(np.float32)) > np.abs(x)
    assert grew[:1000][finite[:1000]].all() and not grew[1000:1100].any()  # ties away from zero, the rest to nearest


def test_tk_mma_tf32_multiplies_the_fragments_of_the_ptx_layout():
    rng = np.random.default_rng(3)
    for _ in range(3):
        A, B, C = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 8), (16, 8)))
        D = np.zeros((16, 8), np.float32)
        TOY.get_function("mma")((1,), (32,), (A, B, C, D))
        want = tf32_reference(A).astype(np.float64) @ tf32_reference(B).astype(np.float64) + C
        close(D, want, 1e-7, "D = A B + C")
        assert np.abs(D - (A.astype(np.float64) @ B + C)).max() > 1e-6  # the operands were rounded to TF32


# ----------------------------------------------------------------------------- the real kernels, as launched on a GPU

KERNELS = CudaKernels(np, EmulatedModule(src.SOURCE, src.OPTIONS, src.EXPRESSIONS))
EMULATED = Backend("cuda-emulated", np, DeviceOps(np, KERNELS), np.asarray, np.asarray, lambda: None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 33), (200, 768), (70, 1000)])
def test_row_kernels_against_twins(shape, dtype):
    check_row_kernels(KERNELS, np.copy, np.asarray, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 33), (70, 300), (4100, 3)])
def test_fused_kernels_against_twins_and_the_kernels_they_replace(shape, dtype):
    check_fused_kernels(KERNELS, np.copy, np.asarray, shape, dtype)


def test_column_sums_over_many_chunks(monkeypatch):
    """More chunks than MAX_GRID_Y allows: longer chunks, then a second pass over the chunks."""
    monkeypatch.setattr(src, "MAX_GRID_Y", 3)
    a = np.random.default_rng(1).standard_normal((700, 130))
    close(KERNELS.column_sums(a, None), TWINS.column_sums(a, None), 1e-12, "column sums")


def test_column_sums_of_more_chunks_than_a_chunk_has_rows():
    """GPT-2's 8 x 1024 rows: 128 chunks of 64, whose sums take two more passes; every row counts."""
    rows = src.COLUMN_CHUNK**2 * 2 + 3
    assert np.array_equal(KERNELS.column_sums(np.ones((rows, 5)), None), np.full(5, float(rows)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (5, 300), (3, 2000)])
def test_xent_kernels_against_twins(shape, dtype):
    check_xent_kernels(KERNELS, np.copy, np.asarray, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", [(1, 1, 1), (1, 64, 200), (3, 37, 65), (8, 300, 33), (5, 96, 96)])
def test_skinny_kernels_against_twins(rows, k, n, dtype):
    check_skinny_kernels(KERNELS, np.copy, np.asarray, rows, k, n, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal, q_offset", [(True, 0), (False, 0), (True, 7)])
def test_attention_kernels_against_twins(causal, q_offset, dtype):
    check_attention_kernels(KERNELS, np.copy, np.asarray, causal, q_offset, dtype)


def test_embedding_and_adamw_kernels_are_bit_identical_to_the_cpu():
    check_embedding_and_adamw_bit_identical(KERNELS, np.copy, np.asarray, rows=30, width=200, size=1003)


def _adamw_lists(rng, sizes, dtypes):
    """[p, g, m, v] lists of flat arrays of the given sizes and dtypes (v >= 0), and decayed flags."""
    lists = [[rng.standard_normal(n).astype(d) for n, d in zip(sizes, dtypes, strict=True)] for _ in range(3)]
    lists.insert(3, [rng.random(n).astype(d) for n, d in zip(sizes, dtypes, strict=True)])
    return lists, [bool(k % 2) for k in range(len(sizes))]


@pytest.mark.parametrize("seed", range(4))
def test_adamw_multi_is_bit_identical_to_the_single_tensor_kernel_and_the_twin(seed):
    """Random lists of odd sizes (1, empty, past a chunk) and dtypes, in one launch per dtype."""
    rng = np.random.default_rng(seed)
    n = [0, 1, 3, 6][seed]
    sizes = [int(rng.choice([0, 1, 5, 255, 257, src.ADAMW_CHUNK + 1, 3 * src.ADAMW_CHUNK])) for _ in range(n)]
    if n:
        sizes[0] = 1
    dtypes = [np.float64 if seed == 3 and k % 3 == 0 else np.float32 for k in range(n)]
    lists, decayed = _adamw_lists(rng, sizes, dtypes)
    consts = (0.9, 0.95, 1e-3, 1e-8, 0.999)
    single = [[a.copy() for a in arrays] for arrays in lists]
    for k in range(n):
        KERNELS.adamw(*(arrays[k] for arrays in single), *consts[:4], consts[4] if decayed[k] else 1.0)
    twin = [[a.copy() for a in arrays] for arrays in lists]
    TWINS.adamw_multi(*twin, decayed, *consts)
    for _ in range(2):  # the second launch reuses the table made by the first
        multi = [[a.copy() for a in arrays] for arrays in lists]
        EMULATED.ops.adamw_update_many(*multi, decayed, *consts)
        for name, got, one, two in zip("pgmv", multi, single, twin, strict=True):
            for k in range(n):
                assert np.array_equal(got[k], one[k]) and np.array_equal(got[k], two[k]), f"{name}[{k}]"


def test_adamw_steps_every_parameter_in_one_launch_on_a_gpu_s_ops(monkeypatch):
    """AdamW on the emulated GPU ops (their adamw_update_many) steps as on the CPU, bit for bit,
    a transposed (non-contiguous) gradient included."""
    rng = np.random.default_rng(5)
    shapes = {"w": (7, 300), "b": (300,), "ln": (1,), "e": (2, 4097)}
    start = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    cpu_params, gpu_params = {k: v.copy() for k, v in start.items()}, {k: v.copy() for k, v in start.items()}
    cpu, gpu = AdamW(cpu_params, lr=1e-2), AdamW(gpu_params, lr=1e-2)
    monkeypatch.setattr(gpu, "backend", EMULATED)
    launches = []
    monkeypatch.setattr(KERNELS, "adamw", lambda *args: launches.append(args))  # never called: one launch for all
    for step in range(3):
        grads = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
        grads["w"] = np.ascontiguousarray(grads["w"].T).T  # the same values, in Fortran order
        cpu.step({k: v.copy() for k, v in grads.items()}, lr=1e-2 / (step + 1))
        gpu.step(grads, lr=1e-2 / (step + 1))
        for name in shapes:
            assert np.array_equal(gpu_params[name], cpu_params[name]), (step, name)
    assert not launches


CONFIGS = [
    dict(),
    dict(norm="post", activation="relu", positional="sinusoidal", causal=False, bias=False),
    dict(positional="rope", norm_type="rmsnorm", activation="swiglu", mlp_hidden=72, bias=False, qkv_bias=True,
         tie_embeddings=False, n_kv_heads=2),
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", CONFIGS)
def test_a_training_step_on_the_emulated_kernels_matches_the_cpu(kw, dtype):
    cfg = GPTConfig(vocab_size=300, context_length=24, d_model=40, n_layers=2, n_heads=4, **kw)
    cpu = GPT(cfg, seed=3)
    cpu.params = {k: v.astype(dtype) for k, v in cpu.params.items()}
    emulated = GPT(cfg, seed=3, device=EMULATED)
    emulated.params = {k: v.copy() for k, v in cpu.params.items()}
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, 300, (3, 24)), rng.integers(0, 300, (3, 24))
    loss, grads = cpu.loss_and_grads(ids, targets)
    e_loss, e_grads = emulated.loss_and_grads(ids, targets)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    close(e_loss, loss, tol, "loss")
    assert e_grads.keys() == grads.keys()
    for name in grads:
        close(e_grads[name], grads[name], tol, name)
    consts = (0.9, 0.95, 1e-3, 1e-8, 0.999)
    for name, g in grads.items():  # AdamW's update as the optimizer calls it, with the same gradients
        ops.adamw_update(cpu.params[name], g, np.zeros_like(g), np.zeros_like(g), *consts)
        EMULATED.ops.adamw_update(emulated.params[name], g, np.zeros_like(g), np.zeros_like(g), *consts)
        assert np.array_equal(emulated.params[name], cpu.params[name]), f"after AdamW: {name}"


def _toy_results(module, dev, host) -> dict[str, np.ndarray]:
    """The toys that run correctly on any device, on fixed inputs: arrays made by `dev`, results
    brought back by `host`, kernels from `module` (an EmulatedModule or a cupy.RawModule)."""
    rng = np.random.default_rng(4)
    results = {}
    x = dev(rng.integers(-50, 50, 6 * 256).astype(np.float32))
    sums, positive = dev(np.zeros(6, np.float32)), dev(np.zeros(6, np.int32))
    module.get_function("block_sum")((3, 2), (256,), (x, sums, positive))
    results["block_sum"], results["positive"] = host(sums), host(positive)
    x, seen = dev(rng.integers(0, 1000, 3 * 64).astype(np.int32)), dev(np.zeros(3 * 64, np.int32))
    module.get_function("neighbour<1>")((3,), (64,), (x, seen))
    results["neighbour"] = host(seen)
    for name, dtype in (("double", np.float64), ("int", np.int32)):
        x, out, votes = (
            dev(rng.integers(0, 9, 128).astype(dtype)),
            dev(np.zeros(512, dtype)),
            dev(np.zeros(384, np.uint32)),
        )
        module.get_function(f"shuffles<{name}>")((2,), (64,), (x, out, votes))
        results[f"shuffles<{name}>"], results[f"votes<{name}>"] = host(out), host(votes)
    x = rng.integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32)
    x = x[(x & 0x7F800000) != 0x7F800000].view(np.float32)  # finite: how a GPU writes NaN is its own
    out = dev(np.zeros(x.size, np.uint32))
    module.get_function("to_tf32")((-(-x.size // 256),), (256,), (dev(x), out, np.int64(x.size)))
    results["to_tf32"] = host(out)
    A, B, C = (dev(rng.standard_normal(s).astype(np.float32)) for s in ((16, 8), (8, 8), (16, 8)))
    D = dev(np.zeros((16, 8), np.float32))
    module.get_function("mma")((1,), (32,), (A, B, C, D))
    results["mma"] = host(D)
    return results


def test_the_toys_compute_on_a_gpu_what_they_compute_here():
    """Where CuPy and a GPU are (tests/test_gpu.py's machine): the emulator's answers are the GPU's,
    bit for bit, except the tensor cores' sums (summed in another order there)."""
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as err:
        pytest.skip(f"no GPU: {err}")
    names = ("block_sum", "neighbour<1>", "shuffles<double>", "shuffles<int>", "to_tf32", "mma")
    gpu = _toy_results(cupy.RawModule(code=TOYS, options=("--fmad=false",), name_expressions=names), cupy.asarray,
                       cupy.asnumpy)  # fmt: skip
    here = _toy_results(TOY, np.asarray, np.asarray)
    for name, want in gpu.items():
        if name == "mma":
            close(here[name], want, 1e-6, name)
        else:
            assert np.array_equal(here[name], want), name
