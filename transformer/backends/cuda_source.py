"""The CUDA C++ of the GPU backend's fused kernels, and the launch shapes they assume.

Run on an NVIDIA H200, where tests/test_gpu.py checks each kernel against its twin: a NumPy
mirror of its computation, operation for operation, in transformer/backends/cuda_twins.py, which
the CPU tests check against transformer/reference.py and ops.py. Without a GPU, the source is
compiled with g++ and run, launched as on the GPU, by the tests' CPU emulator
(tests/cuda_emulator.py: one fiber per CUDA thread, see docs/gpu.md), and nvcc compiles it for
sm_80/sm_90 where it is installed (tests/test_backends.py). The tensor-core kernels
(attention_source.py) go through two helpers, tk_to_tf32 and tk_mma_tf32, defined with inline
PTX inside #ifndef TK_CPU_EMULATION: the emulator defines its own (tests/cuda_emulator.h).

Every kernel is a template over T (float, double) and accumulates in T. Row-wise kernels give a
row to one warp (LayerNorm, attention softmax; rows of at most a few thousand) or one block
(the cross-entropy's vocabulary-long rows); lane l of a warp handles elements l, l + 32, ... in
order, and lanes combine by an xor butterfly (`warp_sum`), after which every lane holds the
same total, since each step adds the same two numbers in either order. Column sums run over
chunks of rows in a fixed order, then over the chunks' sums the same way until one row is left:
deterministic, unlike atomics; `column_sums_pair` (LayerNorm's dweight and dbias) and
`product_column_sums` (dout * gelu' and c_fc's dbias) do their first pass while reading what
they sum. Elementwise kernels over rows with a per-column bias (`gelu_forward`, `bias_residual`)
give a thread one column of a tile and loop over rows, so the bias is read once per thread and
no index is divided. GPT-2's block fuses its passes (device_ops.py): `residual_layernorm_forward`
adds the residual and c_proj's bias and normalises in one row kernel, and `layernorm_backward`
can add its dx into the skip's gradient in place. The source
is compiled with --fmad=false, so that no multiply-add is contracted and each kernel rounds as
its twin does (exp, log, tanh and sqrt's last bits aside).

What this module deliberately does not do: import CuPy, compile or launch anything (cuda.py,
cuda_launch.py).
"""

WARP = 32
ROWS_PER_BLOCK = 8  # warp-per-row kernels: 8 warps, 256 threads per block
ROW_THREADS = 256  # block-per-row kernels (the cross-entropy's rows of V logits)
ELEMENTWISE_THREADS = 256
COLUMN_THREADS = 128
COLUMN_CHUNK = 64  # rows per chunk of a column sum, at least; more when that would need > MAX_GRID_Y chunks
MAX_GRID_Y = 65535
ADAMW_CHUNK = 16 * ELEMENTWISE_THREADS  # adamw_multi: elements per block, 16 per thread
SKINNY_ROWS = 8  # the most rows the skinny products take (a generation step's batch); more go to cuBLAS
SKINNY_WARPS = 8  # skinny_matmul: a block is 32 columns x 8 warps over SKINNY_CHUNK rows of the weights
SKINNY_CHUNK = 64  # rows of the weights (k) per block of skinny_matmul: K / 64 blocks share a column tile
OPTIONS = ("--fmad=false", "-std=c++14")

KERNELS = (
    "layernorm_forward", "residual_layernorm_forward", "layernorm_backward", "column_sums", "column_sums_pair",
    "product_column_sums", "bias_residual", "gelu_forward", "xent_forward", "xent_backward", "attention_softmax",
    "softmax_backward", "embedding_backward", "adamw", "adamw_multi", "skinny_matmul",
    "skinny_matmul_sum", "skinny_matmul_nt",
)  # fmt: skip
EXPRESSIONS = tuple(f"{name}<{ctype}>" for name in KERNELS for ctype in ("float", "double"))  # each kernel's instances


def column_chunk_rows(n_rows: int) -> int:
    """Rows per chunk of `column_sums` over n_rows rows (the kernel's grid.y is the chunk count)."""
    return max(COLUMN_CHUNK, -(-n_rows // MAX_GRID_Y))


SOURCE = (
    f"#define SKINNY_ROWS {SKINNY_ROWS}\n#define SKINNY_WARPS {SKINNY_WARPS}\n#define SKINNY_CHUNK {SKINNY_CHUNK}\n"
    + r"""
#define FULL_MASK 0xffffffffu

template <typename T> __device__ __forceinline__ T neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float((int)0xff800000u); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return __longlong_as_double((long long)0xfff0000000000000ull);
}

__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float d_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return tanh(x); }

// b if it is larger, else a (NaN never wins, as in the twins' np.where(b > a, b, a))
template <typename T> __device__ __forceinline__ T larger(T a, T b) { return b > a ? b : a; }

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = larger(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// (m, s): a running max and sum of exp(z - m); merges (m2, s2) into it
template <typename T> __device__ __forceinline__ void combine(T& m, T& s, T m2, T s2) {
    T big = larger(m, m2);
    if (big == neg_inf<T>()) return;  // both empty: keep (-inf, 0)
    s = s * d_exp(m - big) + s2 * d_exp(m2 - big);
    m = big;
}

template <typename T> __device__ __forceinline__ void warp_combine(T& m, T& s) {
    for (int o = 16; o > 0; o >>= 1) {
        T m2 = __shfl_xor_sync(FULL_MASK, m, o);
        T s2 = __shfl_xor_sync(FULL_MASK, s, o);
        combine(m, s, m2, s2);
    }
}

// LayerNorm of row `row` of x, by one warp, from `s`: each lane's sum of its elements of the row. x is
// not __restrict__: residual_layernorm_forward has just written it (no read through the read-only cache)
template <typename T>
__device__ __forceinline__ void layernorm_row(const T* x, T s, const T* __restrict__ w,
                                              const T* __restrict__ b, int has_bias, T* __restrict__ out,
                                              T* __restrict__ xhat, T* __restrict__ rstd, long long row, int C,
                                              T eps, int lane) {
    const T* xr = x + row * C;
    T mean = warp_sum(s) / T(C);
    T ss = T(0);
    for (int c = lane; c < C; c += 32) {
        T d = xr[c] - mean;
        ss += d * d;
    }
    T r = T(1) / d_sqrt(warp_sum(ss) / T(C) + eps);
    T* outr = out + row * C;
    T* xhr = xhat + row * C;
    for (int c = lane; c < C; c += 32) {
        T h = (xr[c] - mean) * r;
        xhr[c] = h;
        T o = h * w[c];
        outr[c] = has_bias ? o + b[c] : o;
    }
    if (lane == 0) rstd[row] = r;
}

// out, xhat (n_rows, C); rstd (n_rows,). One warp per row.
template <typename T>
__global__ void layernorm_forward(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                  int has_bias, T* __restrict__ out, T* __restrict__ xhat, T* __restrict__ rstd,
                                  long long n_rows, int C, T eps) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n_rows) return;  // the whole warp leaves together
    const T* xr = x + row * C;
    T s = T(0);
    for (int c = lane; c < C; c += 32) s += xr[c];
    layernorm_row(x, s, w, b, has_bias, out, xhat, rstd, row, C, eps, lane);
}

// x += h + hb (hb (C,), or x += h), in place, then layernorm_forward of the new x. One warp per row.
template <typename T>
__global__ void residual_layernorm_forward(T* __restrict__ x, const T* __restrict__ h, const T* __restrict__ hb,
                                           int has_hb, const T* __restrict__ w, const T* __restrict__ b,
                                           int has_bias, T* __restrict__ out, T* __restrict__ xhat,
                                           T* __restrict__ rstd, long long n_rows, int C, T eps) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n_rows) return;
    T* xr = x + row * C;
    const T* hr = h + row * C;
    T s = T(0);
    for (int c = lane; c < C; c += 32) {
        T v = xr[c] + (has_hb ? hr[c] + hb[c] : hr[c]);
        xr[c] = v;  // the lane reads back only what it wrote
        s += v;
    }
    layernorm_row(x, s, w, b, has_bias, out, xhat, rstd, row, C, eps, lane);
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w; with `add`, dx += that instead.
// One warp per row.
template <typename T>
__global__ void layernorm_backward(const T* __restrict__ dout, const T* __restrict__ xhat,
                                   const T* __restrict__ rstd, const T* __restrict__ w, T* __restrict__ dx, int add,
                                   long long n_rows, int C) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n_rows) return;
    const T* dr = dout + row * C;
    const T* hr = xhat + row * C;
    T sg = T(0), sgx = T(0);
    for (int c = lane; c < C; c += 32) {
        T g = dr[c] * w[c];
        sg += g;
        sgx += g * hr[c];
    }
    T mean_g = warp_sum(sg) / T(C);
    T mean_gx = warp_sum(sgx) / T(C);
    T r = rstd[row];
    T* dxr = dx + row * C;
    for (int c = lane; c < C; c += 32) {
        T g = dr[c] * w[c];
        T v = (g - mean_g - hr[c] * mean_gx) * r;
        dxr[c] = add ? dxr[c] + v : v;
    }
}

// out (gridDim.y, C): out[chunk, c] = sum over the chunk's rows, in order, of a[r, c] * b[r, c] (or a[r, c])
template <typename T>
__global__ void column_sums(const T* __restrict__ a, const T* __restrict__ b, int has_b, T* __restrict__ out,
                            long long n_rows, long long C, long long rows_per_chunk) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    long long r0 = (long long)blockIdx.y * rows_per_chunk;
    long long r1 = r0 + rows_per_chunk < n_rows ? r0 + rows_per_chunk : n_rows;
    T acc = T(0);
    for (long long r = r0; r < r1; ++r) acc += has_b ? a[r * C + c] * b[r * C + c] : a[r * C + c];
    out[(long long)blockIdx.y * C + c] = acc;
}

// out (gridDim.y, 2, C): out[chunk, 0, c] = sum over the chunk's rows, in order, of a[r, c] * b[r, c], and
// out[chunk, 1, c] of a[r, c] (column_sums' two sums in one read of a)
template <typename T>
__global__ void column_sums_pair(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                 long long n_rows, long long C, long long rows_per_chunk) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    long long r0 = (long long)blockIdx.y * rows_per_chunk;
    long long r1 = r0 + rows_per_chunk < n_rows ? r0 + rows_per_chunk : n_rows;
    T ab = T(0), sa = T(0);
    for (long long r = r0; r < r1; ++r) {
        T av = a[r * C + c];
        ab += av * b[r * C + c];
        sa += av;
    }
    out[2 * (long long)blockIdx.y * C + c] = ab;
    out[(2 * (long long)blockIdx.y + 1) * C + c] = sa;
}

// prod = a * b (n_rows, C), and out (gridDim.y, C) as column_sums of prod
template <typename T>
__global__ void product_column_sums(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ prod,
                                    T* __restrict__ out, long long n_rows, long long C, long long rows_per_chunk) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    long long r0 = (long long)blockIdx.y * rows_per_chunk;
    long long r1 = r0 + rows_per_chunk < n_rows ? r0 + rows_per_chunk : n_rows;
    T acc = T(0);
    for (long long r = r0; r < r1; ++r) {
        T p = a[r * C + c] * b[r * C + c];
        prod[r * C + c] = p;
        acc += p;
    }
    out[(long long)blockIdx.y * C + c] = acc;
}

// Rows of C elements, a block per (tile of columns, group of rows): thread c of the tile takes rows
// blockIdx.y, + gridDim.y, ... of column c, so a column's bias is read once and no index is divided.

// x += h + b (or x += h), in place
template <typename T>
__global__ void bias_residual(T* __restrict__ x, const T* __restrict__ h, const T* __restrict__ b, int has_bias,
                              long long n_rows, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    T bc = has_bias ? b[c] : T(0);
    for (long long r = blockIdx.y; r < n_rows; r += gridDim.y) {
        long long i = r * C + c;
        x[i] = x[i] + (has_bias ? h[i] + bc : h[i]);
    }
}

// GPT-2's tanh GELU of v = x + b (or x): out = v h with h = 0.5 (1 + tanh((v^2 k_cube + k_lin) v));
// deriv = h + (1 - h) h (v^2 d_cube + d_lin) v (ops.gelu_forward's derivation)
template <typename T>
__global__ void gelu_forward(const T* __restrict__ x, const T* __restrict__ b, int has_bias, T* __restrict__ out,
                             T* __restrict__ deriv, int with_deriv, long long n_rows, int C, T k_cube, T k_lin,
                             T d_cube, T d_lin) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    T bc = has_bias ? b[c] : T(0);
    for (long long r = blockIdx.y; r < n_rows; r += gridDim.y) {
        long long i = r * C + c;
        T xv = has_bias ? x[i] + bc : x[i];
        T x2 = xv * xv;
        T h = d_tanh((x2 * k_cube + k_lin) * xv) * T(0.5) + T(0.5);
        if (with_deriv) {
            T s = (x2 * d_cube + d_lin) * xv;
            deriv[i] = (T(1) - h) * h * s + h;
        }
        out[i] = xv * h;
    }
}

// One block per row of V logits: an online max and sum of exponentials per thread, combined over
// the block; row_max, row_sum (n_rows,) for the backward, losses (n_rows,) in double.
template <typename T>
__global__ void xent_forward(const T* __restrict__ logits, const long long* __restrict__ targets,
                             T* __restrict__ row_max, T* __restrict__ row_sum, double* __restrict__ losses,
                             long long n_rows, int V) {
    __shared__ T shared_m[32];
    __shared__ T shared_s[32];
    long long row = blockIdx.x;
    const T* z = logits + row * V;
    T m = neg_inf<T>(), s = T(0);
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
        T zc = z[c];
        if (zc > m) {
            s = s * d_exp(m - zc) + T(1);
            m = zc;
        } else {
            s += d_exp(zc - m);
        }
    }
    warp_combine(m, s);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    if (lane == 0) {
        shared_m[warp] = m;
        shared_s[warp] = s;
    }
    __syncthreads();
    m = lane < n_warps ? shared_m[lane] : neg_inf<T>();
    s = lane < n_warps ? shared_s[lane] : T(0);
    warp_combine(m, s);
    if (threadIdx.x == 0) {
        row_max[row] = m;
        row_sum[row] = s;
        T picked = z[targets[row]] - m;
        losses[row] = log((double)s) - (double)picked;
    }
}

// dlogits = exp(z - max) / (sum * n_total) - onehot / n_total, over the logits in place; a block per row
template <typename T>
__global__ void xent_backward(T* __restrict__ logits, const long long* __restrict__ targets,
                              const T* __restrict__ row_max, const T* __restrict__ row_sum, long long n_rows, int V,
                              T n_total, T inv_n) {
    long long row = blockIdx.x;
    T* z = logits + row * V;
    T m = row_max[row];
    T k = T(1) / (row_sum[row] * n_total);
    long long t = targets[row];
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
        T d = d_exp(z[c] - m) * k;
        z[c] = c == t ? d - inv_n : d;
    }
}

// scores (n_rows = R * Tq, keys) -> softmax weights in place; with causal, query i of each (R) group
// sees keys 0 .. q_offset + i and the rest get weight 0. One warp per row.
template <typename T>
__global__ void attention_softmax(T* __restrict__ s, long long n_rows, int Tq, int keys, int q_offset, int causal) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n_rows) return;
    T* sr = s + row * keys;
    int seen = q_offset + (int)(row % Tq) + 1;
    int visible = causal && seen < keys ? seen : keys;
    T m = neg_inf<T>();
    for (int j = lane; j < visible; j += 32) m = larger(m, sr[j]);
    m = warp_max(m);
    T sum = T(0);
    for (int j = lane; j < visible; j += 32) {
        T e = d_exp(sr[j] - m);
        sr[j] = e;
        sum += e;
    }
    T inv = T(1) / warp_sum(sum);
    for (int j = lane; j < keys; j += 32) sr[j] = j < visible ? sr[j] * inv : T(0);
}

// ds = (dw - row_dot) * w in place, rows of `keys`; one warp per row
template <typename T>
__global__ void softmax_backward(T* __restrict__ ds, const T* __restrict__ w, const T* __restrict__ row_dot,
                                 long long n_rows, int keys) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n_rows) return;
    T rd = row_dot[row];
    for (int j = lane; j < keys; j += 32) {
        long long i = row * keys + j;
        ds[i] = (ds[i] - rd) * w[i];
    }
}

// dweight[id] += the rows of dout with that id, in their order: segment k of the stably sorted ids
// holds positions order[seg_start[k] .. seg_start[k + 1]) of id seg_id[k]. Block (k, column tile).
template <typename T>
__global__ void embedding_backward(const T* __restrict__ dout, const long long* __restrict__ order,
                                   const long long* __restrict__ seg_start, const long long* __restrict__ seg_id,
                                   T* __restrict__ dweight, int C) {
    long long seg = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    T* dst = dweight + seg_id[seg] * C + c;
    T acc = *dst;
    for (long long j = seg_start[seg]; j < seg_start[seg + 1]; ++j) acc += dout[order[j] * C + c];
    *dst = acc;
}

// ops.adamw_update of element i, in the same order
template <typename T>
__device__ __forceinline__ void adamw_element(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                                              T* __restrict__ v, long long i, T beta1, T beta2, T scale, T eps,
                                              T decay) {
    T pv = p[i];
    if (decay != T(1)) pv = pv * decay;
    T gv = g[i];
    T mv = m[i] * beta1 + gv;
    T vv = v[i] * beta2 + gv * gv;
    m[i] = mv;
    v[i] = vv;
    p[i] = pv - mv / (d_sqrt(vv) + eps) * scale;
}

// ops.adamw_update over one tensor
template <typename T>
__global__ void adamw(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v, long long n,
                      T beta1, T beta2, T scale, T eps, T decay) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        adamw_element(p, g, m, v, i, beta1, beta2, scale, eps, decay);
}

// ops.adamw_update over n_tensors tensors in one launch. Row k of `table` (n_tensors, 6) holds
// tensor k's p, g, m, v addresses, its size and whether it is decayed (else its decay is 1); its
// chunks of `chunk` elements are blocks first_block[k] .. first_block[k + 1] - 1.
template <typename T>
__global__ void adamw_multi(const long long* __restrict__ table, const long long* __restrict__ first_block,
                            int n_tensors, long long chunk, T beta1, T beta2, T scale, T eps, T decay) {
    long long b = blockIdx.x;
    int k = 0, hi = n_tensors - 1;  // the last k with first_block[k] <= b: never an empty tensor
    while (k < hi) {
        int mid = (k + hi + 1) / 2;
        if (first_block[mid] <= b) k = mid;
        else hi = mid - 1;
    }
    const long long* row = table + 6 * (long long)k;
    T* p = (T*)row[0];
    const T* g = (const T*)row[1];
    T* m = (T*)row[2];
    T* v = (T*)row[3];
    long long start = (b - first_block[k]) * chunk;
    long long end = start + chunk < row[4] ? start + chunk : row[4];
    T d = row[5] ? decay : T(1);
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x)
        adamw_element(p, g, m, v, i, beta1, beta2, scale, eps, d);
}

// partial (n_chunks, R, N): chunk c's share of x (R, K) w (K, N), k in c SKINNY_CHUNK .. (c + 1) SKINNY_CHUNK - 1,
// for R <= SKINNY_ROWS: a generation step's linear layers, which cuBLAS would run too, but not inside a
// CUDA graph that CuPy captures. Splitting k over blocks keeps enough loads in flight to stream the
// weights: block (column tile, chunk) is 32 columns (a lane each, reading w's rows coalesced) x
// SKINNY_WARPS warps; warp g adds k = k0 + g, k0 + g + SKINNY_WARPS, ... in order, then the warps'
// sums add in warp order (the same bits on every run). skinny_matmul_sum adds the chunks.
template <typename T>
__global__ void skinny_matmul(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ partial, int R,
                              int K, int N) {
    __shared__ T sums[SKINNY_WARPS][SKINNY_ROWS][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int j = blockIdx.x * 32 + lane;
    const int k0 = blockIdx.y * SKINNY_CHUNK;
    T acc[SKINNY_ROWS];
#pragma unroll
    for (int r = 0; r < SKINNY_ROWS; ++r) acc[r] = T(0);
    if (j < N) {
#pragma unroll
        for (int i = warp; i < SKINNY_CHUNK; i += SKINNY_WARPS) {
            const int k = k0 + i;
            if (k < K) {
                const T wk = w[(long long)k * N + j];
#pragma unroll
                for (int r = 0; r < SKINNY_ROWS; ++r)
                    if (r < R) acc[r] += x[(long long)r * K + k] * wk;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < SKINNY_ROWS; ++r) sums[warp][r][lane] = acc[r];
    __syncthreads();
    for (int e = threadIdx.x; e < R * 32; e += blockDim.x) {
        const int r = e / 32, c = e % 32, col = blockIdx.x * 32 + c;
        if (col >= N) continue;
        T s = sums[0][r][c];
        for (int g = 1; g < SKINNY_WARPS; ++g) s += sums[g][r][c];
        partial[((long long)blockIdx.y * R + r) * N + col] = s;
    }
}

// out (R, N) = the sum over chunks, in order, of partial (n_chunks, R, N), plus b (N,) if has_bias
template <typename T>
__global__ void skinny_matmul_sum(const T* __restrict__ partial, const T* __restrict__ b, int has_bias,
                                  T* __restrict__ out, int n_chunks, long long RN, int N) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < RN; i += stride) {
        T s = partial[i];
        for (int c = 1; c < n_chunks; ++c) s += partial[(long long)c * RN + i];
        out[i] = has_bias ? s + b[i % N] : s;
    }
}

// out (R, V) = x (R, C) w (V, C)^T for R <= SKINNY_ROWS: the logits of a generation step. A warp per
// row of w: lane l adds c = l, l + 32, ... in order, then the lanes by the xor butterfly.
template <typename T>
__global__ void skinny_matmul_nt(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out, int R,
                                 int C, long long V) {
    const long long v = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (v >= V) return;  // the whole warp leaves together
    const T* wv = w + v * C;
    T acc[SKINNY_ROWS];
#pragma unroll
    for (int r = 0; r < SKINNY_ROWS; ++r) acc[r] = T(0);
#pragma unroll 4
    for (int c = lane; c < C; c += 32) {
        const T wc = wv[c];
#pragma unroll
        for (int r = 0; r < SKINNY_ROWS; ++r)
            if (r < R) acc[r] += x[(long long)r * C + c] * wc;
    }
#pragma unroll
    for (int r = 0; r < SKINNY_ROWS; ++r) {
        const T total = warp_sum(acc[r]);
        if (r < R && lane == 0) out[(long long)r * V + v] = total;
    }
}
"""
)
