"""The CUDA C++ of fused causal attention ("flash" attention), forward and backward, on the
tensor cores in TF32: attention that never writes the (B, H, T, T) weights.

FlashAttention-2's algorithm (Dao, 2023) for float32 models with TF32 switched on, written for
`mma.sync.m16n8k8` (a warp multiplies 16 x 8 by 8 x 8 per instruction; sm_80 and newer):

- `flash_forward<D>`: a block of 4 warps takes 64 queries of one (batch, head), each warp 16 of
  them, and walks the key blocks of 64 (only those at or below the diagonal when causal). Per key
  block: scores S = Q K^T on the tensor cores, the running row maximum and sum of exp updated
  (the "online softmax": what was accumulated is rescaled by exp(m_old - m_new)), P = exp(S - m)
  written to shared memory and O += P V. At the end O / rowsum goes straight into the (B, T, H D)
  output and the row's log-sum-exp into `lse` (B, H, T), all the backward keeps.
- `flash_backward_dq<D>`: the same walk; recomputes P = exp(S - lse), dP = dO V^T, dS = P (dP -
  delta) with delta = rowsum(dO * O), and accumulates dQ = dS K.
- `flash_backward_dkv<D>`: a block takes 64 keys of one (batch, K/V head) and walks every query
  head of its group and the query tiles of 32 at or after its keys: dV += P^T dO, dK += dS^T Q.
  dQ and dK/dV come from separate kernels so that every sum runs in one block in a fixed order:
  no atomics, the same bits on every run (FlashAttention-2 adds dQ atomically instead).

Numbers: each operand of a product is rounded to TF32 (10 mantissa bits, `tk_to_tf32`, as
`cvt.rna` rounds); products accumulate in float32, as TF32 GEMMs do. Q is scaled by
scale * log2(e) before rounding, so that scores come out in log2 units and exp is exp2.
K, V, Q and dO tiles are rounded as they enter shared memory, once per block. The NumPy twins
(cuda_twins.TwinKernels.flash_attention_*) round the same operands the same way.

Layout: q, k and v are read in place from the fused (B, T, (H + 2 Hkv) D) projection, the output
written as (B, T, H D), and dQ, dK, dV straight into the fused (B, T, (H + 2 Hkv) D) gradient: no
head transposes, no copies. Head dims 16, 32 and 64 (the tile loops are unrolled for them).

Shared memory rows are padded so that the lanes of a warp reading a fragment fall in distinct
banks: a row stride of D + 4 floats for tiles read as [row g][column t] (lane = 4 g + t), D + 8 for
those read as [row t][column g].

- `decode_attention<D>`: generation's step, one new query per row against the KV cache: a block
  per (batch, head), a thread per key (strided), each keeping its own running max, sum and
  weighted sum of values in float32 (no tensor cores: a query is one row), combined across the
  block in thread order at the end. It also writes the new key and value into the cache (the
  first query head of each K/V head does), and reads them from the projection, so one launch
  replaces the eight of the GEMM path (two cache writes, the scaling, two copies, two GEMMs, the
  softmax): generation at batch 1 is launch-bound. `decode_attention_at<D>` is the same step at a
  position read from device memory, so that one CUDA graph of a whole decode step serves every
  position (transformer/backends/cuda_graph.py).

What this module deliberately does not do: import CuPy or launch anything
(transformer/backends/cuda_launch.py), or keep any (T, T) array.
"""

HEAD_DIMS = (16, 32, 64)
THREADS = 128  # 4 warps
BLOCK_ROWS = 64  # queries of a forward / dQ block, keys of a dK/dV block; 16 per warp
KEY_TILE = 64  # keys per step of the forward and dQ walks
QUERY_TILE = 32  # queries per step of the dK/dV walk
OPTIONS = ("-std=c++14",)
KERNELS = ("flash_forward", "flash_backward_dq", "flash_backward_dkv", "decode_attention", "decode_attention_at")
DECODE_THREADS = 128  # decode_attention: a thread per key, strided
MIN_COMPUTE_CAPABILITY = 80  # mma.sync with TF32 operands

SOURCE = r"""
#define FULL_MASK 0xffffffffu
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define ROWS 64
#define KT 64
#define QT 32

#ifndef TK_CPU_EMULATION
// x rounded to TF32 (nearest, ties away from zero), as its bit pattern
__device__ __forceinline__ unsigned tk_to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// d += A (16 x 8) B (8 x 8), the warp's lanes holding the fragments of PTX's m16n8k8 layout:
// lane = 4 g + t: a = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]; b = B[t][g], B[t+4][g];
// d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]
__device__ __forceinline__ void tk_mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

__device__ __forceinline__ float tf32_value(float x) { return __uint_as_float(tk_to_tf32(x)); }
__device__ __forceinline__ unsigned bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float minus_inf() { return __int_as_float((int)0xff800000u); }

__device__ __forceinline__ float quad_max(float v) {  // over the 4 lanes holding one row
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// rows row0 .. row0 + N - 1 of a (T, ld) matrix at `src` (D columns) -> dst[N][STRIDE], each
// value times `mul` and rounded to TF32; rows past T read as zeros
template <int N, int D, int STRIDE>
__device__ __forceinline__ void load_tile(float* dst, const float* src, long long ld, int row0, int T, float mul) {
    constexpr int V = D / 4;  // float4s per row
    for (int e = threadIdx.x; e < N * V; e += blockDim.x) {
        const int r = e / V, c = (e % V) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < T) x = *reinterpret_cast<const float4*>(src + (long long)(row0 + r) * ld + c);
        float* o = dst + r * STRIDE + c;
        o[0] = tf32_value(x.x * mul);
        o[1] = tf32_value(x.y * mul);
        o[2] = tf32_value(x.z * mul);
        o[3] = tf32_value(x.w * mul);
    }
}

// the A fragments (16 rows from `row0`, D columns) of a (T, ld) matrix, times `mul`, rounded
template <int D>
__device__ __forceinline__ void load_a_fragments(unsigned (&a)[D / 8][4], const float* src, long long ld, int row0,
                                                 int T, float mul) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const bool in0 = row0 + g < T, in1 = row0 + g + 8 < T;
    const float* r0 = src + (long long)(row0 + g) * ld;
    const float* r1 = src + (long long)(row0 + g + 8) * ld;
#pragma unroll
    for (int s = 0; s < D / 8; ++s) {
        a[s][0] = tk_to_tf32(in0 ? r0[8 * s + t] * mul : 0.f);
        a[s][1] = tk_to_tf32(in1 ? r1[8 * s + t] * mul : 0.f);
        a[s][2] = tk_to_tf32(in0 ? r0[8 * s + t + 4] * mul : 0.f);
        a[s][3] = tk_to_tf32(in1 ? r1[8 * s + t + 4] * mul : 0.f);
    }
}

// acc[n] (16 x N, N/8 tiles) += A (16 x D, fragments) B^T, B = tile[N][STRIDE] rows (the pattern
// [row g][column t]: S = Q K^T, dP = dO V^T)
template <int D, int N, int STRIDE>
__device__ __forceinline__ void mma_rows(float (&acc)[N / 8][4], const unsigned (&a)[D / 8][4], const float* tile) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int s = 0; s < D / 8; ++s) {
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
            const float* p = tile + (n * 8 + g) * STRIDE + s * 8 + t;
            const unsigned b[2] = {bits(p[0]), bits(p[4])};
            tk_mma_tf32(acc[n], a[s], b);
        }
    }
}

// acc[n] (16 x D, D/8 tiles) += A B, A = a[16][A_STRIDE] (16 x K, in shared memory), B =
// tile[K][STRIDE] (the pattern [row t][column g]: O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q)
template <int K, int D, int A_STRIDE, int STRIDE>
__device__ __forceinline__ void mma_cols(float (&acc)[D / 8][4], const float* a, const float* tile) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int s = 0; s < K / 8; ++s) {
        const unsigned af[4] = {bits(a[g * A_STRIDE + s * 8 + t]), bits(a[(g + 8) * A_STRIDE + s * 8 + t]),
                                bits(a[g * A_STRIDE + s * 8 + t + 4]), bits(a[(g + 8) * A_STRIDE + s * 8 + t + 4])};
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const float* p = tile + (s * 8 + t) * STRIDE + n * 8 + g;
            const unsigned b[2] = {bits(p[0]), bits(p[4 * STRIDE])};
            tk_mma_tf32(acc[n], af, b);
        }
    }
}

// the accumulator tiles acc (16 x 8 N) of a warp -> dst[16][STRIDE], rounded to TF32
template <int N, int STRIDE>
__device__ __forceinline__ void store_rows(float* dst, const float (&acc)[N][4]) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        dst[g * STRIDE + n * 8 + 2 * t] = tf32_value(acc[n][0]);
        dst[g * STRIDE + n * 8 + 2 * t + 1] = tf32_value(acc[n][1]);
        dst[(g + 8) * STRIDE + n * 8 + 2 * t] = tf32_value(acc[n][2]);
        dst[(g + 8) * STRIDE + n * 8 + 2 * t + 1] = tf32_value(acc[n][3]);
    }
}

// acc (16 x D of rows row0 ..) times `mul` -> rows of a (T, ld) matrix at dst (rows past T skipped)
template <int D>
__device__ __forceinline__ void store_fragments(float* dst, long long ld, int row0, int T, const float (&acc)[D / 8][4],
                                                float mul0, float mul1) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        if (row0 + g < T) {
            float* o = dst + (long long)(row0 + g) * ld + n * 8 + 2 * t;
            o[0] = acc[n][0] * mul0;
            o[1] = acc[n][1] * mul0;
        }
        if (row0 + g + 8 < T) {
            float* o = dst + (long long)(row0 + g + 8) * ld + n * 8 + 2 * t;
            o[0] = acc[n][2] * mul1;
            o[1] = acc[n][3] * mul1;
        }
    }
}

template <int N> __device__ __forceinline__ void zero(float (&acc)[N][4]) {  // accumulator tiles := 0
#pragma unroll
    for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

template <int A, int B> struct larger_of { static constexpr int value = A > B ? A : B; };

// qkv (B, T, (H + 2 Hkv) D) -> out (B, T, H D), lse (B, H, T): softmax(q k^T scale + mask) v and
// each row's log-sum-exp of its scaled scores. grid (ceil(T / 64), B H), 128 threads.
template <int D>
__global__ void __launch_bounds__(128) flash_forward(const float* __restrict__ qkv, float* __restrict__ out,
                                                     float* __restrict__ lse, int T, int H, int Hkv, int causal,
                                                     float scale) {
    constexpr int KS = D + 4, VS = D + 8, PS = KT + 4;
    __shared__ float kp[larger_of<KT * KS, 4 * 16 * PS>::value];  // the K tile, then each warp's P
    __shared__ float vs[KT * VS];
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const int block = gridDim.x - 1 - blockIdx.x;  // the longest causal walks first
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const long long W = (long long)(H + 2 * Hkv) * D;
    const float* rows = qkv + (long long)b * T * W;
    const int q0 = block * ROWS + warp * 16, r0 = q0 + g, r1 = q0 + g + 8;

    unsigned qa[D / 8][4];
    load_a_fragments<D>(qa, rows + h * D, W, q0, T, scale * LOG2E);
    float o[D / 8][4];
    zero(o);
    float m0 = minus_inf(), m1 = minus_inf(), l0 = 0.f, l1 = 0.f;  // row maxima (log2 units), this lane's sums

    const int last_key = causal ? min(T, (block + 1) * ROWS) : T;
    for (int k0 = 0; k0 < last_key; k0 += KT) {
        __syncthreads();  // every warp is done with the previous P and V
        load_tile<KT, D, KS>(kp, rows + (H + hk) * D, W, k0, T, 1.f);
        load_tile<KT, D, VS>(vs, rows + (H + Hkv + hk) * D, W, k0, T, 1.f);
        __syncthreads();
        float s[KT / 8][4];
        zero(s);
        mma_rows<D, KT, KS>(s, qa, kp);

        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = k0 + n * 8 + 2 * t + e;
                if (j >= T || (causal && j > r0)) s[n][e] = minus_inf();
                if (j >= T || (causal && j > r1)) s[n][2 + e] = minus_inf();
                mx0 = fmaxf(mx0, s[n][e]);
                mx1 = fmaxf(mx1, s[n][2 + e]);
            }
        }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
        const float base0 = mx0 == minus_inf() ? 0.f : mx0, base1 = mx1 == minus_inf() ? 0.f : mx1;
        const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
        m0 = mx0;
        m1 = mx1;
        l0 *= alpha0;
        l1 *= alpha1;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= alpha0;
            o[n][1] *= alpha0;
            o[n][2] *= alpha1;
            o[n][3] *= alpha1;
        }
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) {
            s[n][0] = exp2f(s[n][0] - base0);
            s[n][1] = exp2f(s[n][1] - base0);
            s[n][2] = exp2f(s[n][2] - base1);
            s[n][3] = exp2f(s[n][3] - base1);
            l0 += s[n][0] + s[n][1];
            l1 += s[n][2] + s[n][3];
        }
        __syncthreads();  // every warp is done with K: P goes where it was
        float* p = kp + warp * 16 * PS;
        store_rows<KT / 8, PS>(p, s);
        __syncwarp();
        mma_cols<KT, D, PS, VS>(o, p, vs);
    }
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    store_fragments<D>(out + (long long)b * T * H * D + h * D, (long long)H * D, q0, T, o, 1.f / l0, 1.f / l1);
    if (t == 0) {
        if (r0 < T) lse[(long long)bh * T + r0] = (m0 + log2f(l0)) * LN2;
        if (r1 < T) lse[(long long)bh * T + r1] = (m1 + log2f(l1)) * LN2;
    }
}

// dout (B, T, H D), lse and delta = rowsum(dout * out) (B, H, T) -> the dQ part of dqkv
// (B, T, (H + 2 Hkv) D). grid (ceil(T / 64), B H), 128 threads.
template <int D>
__global__ void __launch_bounds__(128) flash_backward_dq(const float* __restrict__ qkv, const float* __restrict__ dout,
                                                         const float* __restrict__ lse,
                                                         const float* __restrict__ delta, float* __restrict__ dqkv,
                                                         int T, int H, int Hkv, int causal, float scale) {
    constexpr int KS = D + 4, PS = KT + 4;
    __shared__ float ks[KT * KS];
    __shared__ float vds[larger_of<KT * KS, 4 * 16 * PS>::value];  // the V tile, then each warp's dS
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const int block = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const long long W = (long long)(H + 2 * Hkv) * D;
    const float* rows = qkv + (long long)b * T * W;
    const int q0 = block * ROWS + warp * 16, r0 = q0 + g, r1 = q0 + g + 8;

    unsigned qa[D / 8][4], da[D / 8][4];
    load_a_fragments<D>(qa, rows + h * D, W, q0, T, scale * LOG2E);
    load_a_fragments<D>(da, dout + (long long)b * T * H * D + h * D, (long long)H * D, q0, T, 1.f);
    const float lse0 = r0 < T ? lse[(long long)bh * T + r0] * LOG2E : 0.f;
    const float lse1 = r1 < T ? lse[(long long)bh * T + r1] * LOG2E : 0.f;
    const float delta0 = r0 < T ? delta[(long long)bh * T + r0] : 0.f;
    const float delta1 = r1 < T ? delta[(long long)bh * T + r1] : 0.f;
    float dq[D / 8][4];
    zero(dq);

    const int last_key = causal ? min(T, (block + 1) * ROWS) : T;
    for (int k0 = 0; k0 < last_key; k0 += KT) {
        __syncthreads();
        load_tile<KT, D, KS>(ks, rows + (H + hk) * D, W, k0, T, 1.f);
        load_tile<KT, D, KS>(vds, rows + (H + Hkv + hk) * D, W, k0, T, 1.f);
        __syncthreads();
        float s[KT / 8][4], dp[KT / 8][4];
        zero(s);
        zero(dp);
        mma_rows<D, KT, KS>(s, qa, ks);
        mma_rows<D, KT, KS>(dp, da, vds);
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = k0 + n * 8 + 2 * t + e;
                const float p0 = (j >= T || (causal && j > r0)) ? 0.f : exp2f(s[n][e] - lse0);
                const float p1 = (j >= T || (causal && j > r1)) ? 0.f : exp2f(s[n][2 + e] - lse1);
                s[n][e] = p0 * (dp[n][e] - delta0);  // dS
                s[n][2 + e] = p1 * (dp[n][2 + e] - delta1);
            }
        }
        __syncthreads();  // every warp is done with V: dS goes where it was
        float* ds = vds + warp * 16 * PS;
        store_rows<KT / 8, PS>(ds, s);
        __syncwarp();
        mma_cols<KT, D, PS, KS>(dq, ds, ks);
    }
    store_fragments<D>(dqkv + (long long)b * T * W + h * D, W, q0, T, dq, scale, scale);
}

// the dK and dV parts of dqkv: a block takes 64 keys of one (batch, K/V head) and sums over the
// query heads of its group and every query at or after its keys (causal). grid (ceil(T / 64), B Hkv).
template <int D>
__global__ void __launch_bounds__(128) flash_backward_dkv(const float* __restrict__ qkv, const float* __restrict__ dout,
                                                          const float* __restrict__ lse,
                                                          const float* __restrict__ delta, float* __restrict__ dqkv,
                                                          int T, int H, int Hkv, int causal, float scale) {
    constexpr int QS = D + 4, PS = QT + 4;
    __shared__ float qs[QT * QS];
    __shared__ float dos[QT * QS];
    __shared__ float lse_tile[QT], delta_tile[QT];
    __shared__ float pds[4 * 16 * PS];  // each warp's P^T, then its dS^T
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const int bk = blockIdx.y, b = bk / Hkv, hk = bk % Hkv, group = H / Hkv;
    const long long W = (long long)(H + 2 * Hkv) * D;
    const float* rows = qkv + (long long)b * T * W;
    const float* drows = dout + (long long)b * T * H * D;
    const int c0 = blockIdx.x * ROWS + warp * 16, k0 = c0 + g, k1 = c0 + g + 8;

    unsigned ka[D / 8][4], va[D / 8][4];
    load_a_fragments<D>(ka, rows + (H + hk) * D, W, c0, T, 1.f);
    load_a_fragments<D>(va, rows + (H + Hkv + hk) * D, W, c0, T, 1.f);
    float dk[D / 8][4], dv[D / 8][4];
    zero(dk);
    zero(dv);
    float* pd = pds + warp * 16 * PS;
    const int first_query = causal ? blockIdx.x * ROWS : 0;  // earlier queries see none of these keys

    for (int i = 0; i < group; ++i) {
        const int h = hk * group + i;
        const long long bh = (long long)b * H + h;
        for (int qq0 = first_query; qq0 < T; qq0 += QT) {
            __syncthreads();
            load_tile<QT, D, QS>(qs, rows + h * D, W, qq0, T, scale * LOG2E);
            load_tile<QT, D, QS>(dos, drows + h * D, (long long)H * D, qq0, T, 1.f);
            if (threadIdx.x < QT) {
                const int q = qq0 + threadIdx.x;
                lse_tile[threadIdx.x] = q < T ? lse[bh * T + q] * LOG2E : 0.f;
                delta_tile[threadIdx.x] = q < T ? delta[bh * T + q] : 0.f;
            }
            __syncthreads();
            float st[QT / 8][4], dpt[QT / 8][4];  // S^T and dP^T: this warp's 16 keys x 32 queries
            zero(st);
            zero(dpt);
            mma_rows<D, QT, QS>(st, ka, qs);
            mma_rows<D, QT, QS>(dpt, va, dos);
#pragma unroll
            for (int n = 0; n < QT / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = e < 2 ? k0 : k1, col = n * 8 + 2 * t + (e & 1), q = qq0 + col;
                    const bool seen = q < T && c < T && !(causal && c > q);
                    const float p = seen ? exp2f(st[n][e] - lse_tile[col]) : 0.f;
                    st[n][e] = p;
                    dpt[n][e] = p * (dpt[n][e] - delta_tile[col]);  // dS^T
                }
            }
            store_rows<QT / 8, PS>(pd, st);
            __syncwarp();
            mma_cols<QT, D, PS, QS>(dv, pd, dos);
            __syncwarp();
            store_rows<QT / 8, PS>(pd, dpt);
            __syncwarp();
            mma_cols<QT, D, PS, QS>(dk, pd, qs);
        }
    }
    // dK summed dS^T (q scale log2e): times 1 / log2e gives dS^T q scale
    store_fragments<D>(dqkv + (long long)b * T * W + (H + hk) * D, W, c0, T, dk, 1.f / LOG2E, 1.f / LOG2E);
    store_fragments<D>(dqkv + (long long)b * T * W + (H + Hkv + hk) * D, W, c0, T, dv, 1.f, 1.f);
}

// generation's step: qkv (B, 1, (H + 2 Hkv) D) of position `start`, the caches (B, Hkv, Tmax, D) of
// positions 0 .. start - 1 -> out (B, 1, H D); the new key and value written at `start` (by each K/V
// head's first query head). grid (B H), 128 threads.
template <int D>
__device__ __forceinline__ void decode_step(const float* __restrict__ qkv, float* __restrict__ k_cache,
                                            float* __restrict__ v_cache, float* __restrict__ out, int Tmax, int H,
                                            int Hkv, int start, float scale) {
    __shared__ float q[D];
    __shared__ float acc_rows[128][D + 1];
    __shared__ float maxima[128], sums[128];
    const int bh = blockIdx.x, b = bh / H, h = bh % H, group = H / Hkv, hk = h / group;
    const long long W = (long long)(H + 2 * Hkv) * D;
    const float* row = qkv + (long long)b * W;
    const float* k_new = row + (H + hk) * D;
    const float* v_new = row + (H + Hkv + hk) * D;
    const long long cache = ((long long)b * Hkv + hk) * Tmax * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        q[d] = row[h * D + d] * scale;
        if (h % group == 0) {  // no block of this launch reads position `start` from the cache
            k_cache[cache + (long long)start * D + d] = k_new[d];
            v_cache[cache + (long long)start * D + d] = v_new[d];
        }
    }
    __syncthreads();
    float m = minus_inf(), l = 0.f, acc[D];
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = 0.f;
    for (int j = threadIdx.x; j <= start; j += blockDim.x) {
        const float* kj = j < start ? k_cache + cache + (long long)j * D : k_new;
        const float* vj = j < start ? v_cache + cache + (long long)j * D : v_new;
        float s = 0.f;
#pragma unroll
        for (int d = 0; d < D; d += 4) {
            const float4 k4 = *reinterpret_cast<const float4*>(kj + d);
            s += q[d] * k4.x + q[d + 1] * k4.y + q[d + 2] * k4.z + q[d + 3] * k4.w;
        }
        if (s > m) {  // a new maximum: what was summed is rescaled to it
            const float c = expf(m - s);
            l *= c;
#pragma unroll
            for (int d = 0; d < D; ++d) acc[d] *= c;
            m = s;
        }
        const float p = expf(s - m);
        l += p;
#pragma unroll
        for (int d = 0; d < D; d += 4) {
            const float4 v4 = *reinterpret_cast<const float4*>(vj + d);
            acc[d] += p * v4.x;
            acc[d + 1] += p * v4.y;
            acc[d + 2] += p * v4.z;
            acc[d + 3] += p * v4.w;
        }
    }
    maxima[threadIdx.x] = m;
    __syncthreads();
    float top = maxima[0];
    for (int i = 1; i < blockDim.x; ++i) top = fmaxf(top, maxima[i]);
    const float c = m == minus_inf() ? 0.f : expf(m - top);  // a thread without keys adds nothing
    sums[threadIdx.x] = l * c;
#pragma unroll
    for (int d = 0; d < D; ++d) acc_rows[threadIdx.x][d] = acc[d] * c;
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float total = 0.f, weight = 0.f;
        for (int i = 0; i < blockDim.x; ++i) {  // in thread order: the same bits on every run
            total += acc_rows[i][d];
            weight += sums[i];
        }
        out[(long long)b * H * D + h * D + d] = total / weight;
    }
}

// decode_step at a position given by the host
template <int D>
__global__ void __launch_bounds__(128) decode_attention(const float* __restrict__ qkv, float* __restrict__ k_cache,
                                                        float* __restrict__ v_cache, float* __restrict__ out, int Tmax,
                                                        int H, int Hkv, int start, float scale) {
    decode_step<D>(qkv, k_cache, v_cache, out, Tmax, H, Hkv, start, scale);
}

// decode_step at the position held in device memory, position[0]: a CUDA graph of the step replays
// at every position without being captured again
template <int D>
__global__ void __launch_bounds__(128) decode_attention_at(const float* __restrict__ qkv, float* __restrict__ k_cache,
                                                           float* __restrict__ v_cache, float* __restrict__ out,
                                                           int Tmax, int H, int Hkv, const int* __restrict__ position,
                                                           float scale) {
    decode_step<D>(qkv, k_cache, v_cache, out, Tmax, H, Hkv, position[0], scale);
}
"""
