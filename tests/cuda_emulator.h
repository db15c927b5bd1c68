// CUDA on one CPU thread, for tests: what a CUDA C++ kernel source needs to compile with g++ and
// run as on a GPU. tests/cuda_emulator.py compiles a kernel source with this header in front of
// it (-include) and launches the kernels through tk_emu::launch.
//
// Every thread of a block is a fiber (ucontext) with its own small stack; the block's fibers run
// in turn in one OS thread, each until it reaches a barrier or returns, so a run is deterministic.
// Blocks run one after another in grid order (x fastest), so `__shared__` can be `static`: a
// block's fibers share the kernel's function-local statics, and no two blocks run at once.
// __syncthreads waits for every thread of the block, a warp operation for the 32 lanes of the
// warp (shuffles and votes with the full mask only); a thread that returns while others wait at
// a barrier, lanes at different warp operations, or a warp operation in a partial warp stop the
// launch with a message instead of hanging. Tensor cores: tk_to_tf32 and tk_mma_tf32, the two
// helpers the kernel source defines with inline PTX when TK_CPU_EMULATION is not defined.
//
// What this does not emulate: timing, occupancy, shared-memory limits, memory ordering beyond the
// block's barriers (atomics are plain read-modify-writes: one thread runs at a time), races
// (threads between two barriers run one after another, so a race gives one of its answers),
// dynamic shared memory, or the GPU's last bits of exp, log, tanh and rsqrt (the host's libm's).
#pragma once

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3() = default;
    constexpr dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

// CUDA's vector types, aligned as on the GPU (a float4 load needs 16-byte aligned addresses there)
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// The running fiber's index, and its block's; set by the scheduler before each fiber resumes.
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
constexpr int warpSize = 32;

namespace tk_emu {

constexpr unsigned FULL = 0xffffffffu;
constexpr size_t STACK = 64 * 1024;  // per fiber, below a guard page: an overflow faults
constexpr int MAX_THREADS = 1024;

enum State : unsigned char { RUNNING, AT_SYNCTHREADS, AT_WARP_OP, RETURNED };
enum WarpOp : int { SYNCWARP, SHUFFLE, VOTE, MMA };
const char* const WARP_OP_NAMES[] = {"__syncwarp", "a shuffle", "a vote", "tk_mma_tf32"};

struct Fiber {
    ucontext_t context;
    uint3 index;
    State state;
};

// A warp's barrier and exchange buffers. Each exchange writes into buffer `generation & 1`, waits
// for the 32 lanes, then reads it: the next exchange writes the other buffer, and the one after
// can only start once every lane has passed the barrier in between, so one barrier per exchange.
struct Warp {
    int arrived;
    int op;
    unsigned generation;
    unsigned char slot[2][32][8];  // shuffles and votes: each lane's value, up to 8 bytes
    float fragment[2][32][6];      // tk_mma_tf32: each lane's A (4) and B (2) fragments
};

struct Runtime {
    Fiber* fibers = nullptr;
    Warp warps[MAX_THREADS / 32];
    int n_threads = 0, current = 0;
    int arrived = 0;  // at __syncthreads
    unsigned generation = 0;
    int votes[2] = {0, 0};  // __syncthreads_count's tallies, double-buffered as a warp's slots
    ucontext_t scheduler;
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    const char* kernel = "";
    char error[1024];
    bool failed = false;
};
inline Runtime rt;

// Stop the launch: the message goes to Python, the fibers are abandoned where they stand.
[[noreturn]] inline void fail(const char* format, ...) {
    int n = snprintf(rt.error, sizeof rt.error, "%s, block (%u, %u, %u), thread (%u, %u, %u): ", rt.kernel,
                     blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    va_list args;
    va_start(args, format);
    vsnprintf(rt.error + n, sizeof rt.error - n, format, args);
    va_end(args);
    rt.failed = true;
    setcontext(&rt.scheduler);
    abort();  // setcontext does not return
}

inline int lane() { return rt.current & 31; }

// The current fiber stops; the next runnable one after it (round robin) runs, or, with none
// left, the scheduler, which finds the block done or deadlocked.
inline void switch_away() {
    int self = rt.current;
    for (int k = 1; k <= rt.n_threads; ++k) {
        int next = (self + k) % rt.n_threads;
        if (rt.fibers[next].state != RUNNING) continue;
        rt.current = next;
        threadIdx = rt.fibers[next].index;
        swapcontext(&rt.fibers[self].context, &rt.fibers[next].context);
        return;  // resumed: whoever switched here set current and threadIdx back to ours
    }
    swapcontext(&rt.fibers[self].context, &rt.scheduler);
}

// __syncthreads with a vote: returns how many threads of the block passed a nonzero `predicate`
inline int syncthreads_count(int predicate) {
    unsigned buffer = rt.generation & 1;
    rt.votes[buffer] += predicate != 0;
    if (++rt.arrived == rt.n_threads) {
        rt.arrived = 0;
        ++rt.generation;
        rt.votes[buffer ^ 1] = 0;  // every thread has read it: it was the barrier before this one's
        for (int i = 0; i < rt.n_threads; ++i)
            if (rt.fibers[i].state == AT_SYNCTHREADS) rt.fibers[i].state = RUNNING;
    } else {
        rt.fibers[rt.current].state = AT_SYNCTHREADS;
        switch_away();
    }
    return rt.votes[buffer];
}

inline Warp& warp() {
    if (rt.n_threads % 32) fail("a warp operation in a block of %d threads, not a multiple of 32", rt.n_threads);
    return rt.warps[rt.current / 32];
}

inline void check_mask(unsigned mask) {
    if (mask != FULL) fail("a warp operation with mask 0x%08x: only the full mask is emulated", mask);
}

// Wait until the warp's 32 lanes have reached warp operation `op`; lanes at different ones fail.
inline void warp_barrier(Warp& w, int op) {
    if (w.arrived == 0) {
        w.op = op;
    } else if (w.op != op) {
        fail("lanes of warp %d reached different warp operations (%s, and %s at lane %d)", rt.current / 32,
             WARP_OP_NAMES[w.op], WARP_OP_NAMES[op], lane());
    }
    if (++w.arrived == 32) {
        w.arrived = 0;
        ++w.generation;
        int first = rt.current & ~31;
        for (int i = first; i < first + 32; ++i)
            if (rt.fibers[i].state == AT_WARP_OP) rt.fibers[i].state = RUNNING;
        return;
    }
    rt.fibers[rt.current].state = AT_WARP_OP;
    switch_away();
}

// Every lane puts `v` in the warp's buffer; returns the buffer, each lane's value in its slot.
template <typename T> const unsigned char (*exchange(unsigned mask, T v, int op))[8] {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "a warp exchange moves up to 8 bytes");
    check_mask(mask);
    Warp& w = warp();
    unsigned buffer = w.generation & 1;
    memcpy(w.slot[buffer][lane()], &v, sizeof v);
    warp_barrier(w, op);
    return w.slot[buffer];
}

template <typename T> T shuffle(unsigned mask, T v, int source, int width) {
    if (width != 32) fail("a shuffle of width %d: only width 32 is emulated", width);
    auto slots = exchange(mask, v, SHUFFLE);
    T out;
    memcpy(&out, slots[source & 31], sizeof out);
    return out;
}

// bit l set where lane l's predicate is nonzero
inline unsigned ballot(unsigned mask, int predicate) {
    auto slots = exchange(mask, (unsigned)(predicate != 0), VOTE);
    unsigned bits = 0;
    for (int i = 0; i < 32; ++i) {
        unsigned bit;
        memcpy(&bit, slots[i], sizeof bit);
        bits |= bit << i;
    }
    return bits;
}

template <typename To, typename From> To bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
    To out;
    memcpy(&out, &v, sizeof out);
    return out;
}

// ---------------------------------------------------------------------------------- the launch

inline char* stacks() {  // MAX_THREADS stacks, each above a guard page; mapped once per library
    static char* base = nullptr;
    if (!base) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE), stride = STACK + page;
        void* p = mmap(nullptr, stride * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (p == MAP_FAILED) return nullptr;
        base = (char*)p;
        for (int i = 0; i < MAX_THREADS; ++i) mprotect(base + i * stride, page, PROT_NONE);
    }
    return base;
}

inline void fiber_main() {
    rt.body(rt.body_arg);
    rt.fibers[rt.current].state = RETURNED;
    switch_away();
}

// Why the block's fibers all stopped without all returning.
inline void report_deadlock() {
    int counts[4] = {0, 0, 0, 0}, first[4] = {-1, -1, -1, -1};
    for (int i = 0; i < rt.n_threads; ++i) {
        int s = rt.fibers[i].state;
        counts[s] += 1;
        if (first[s] < 0) first[s] = i;
    }
    snprintf(rt.error, sizeof rt.error,
             "%s, block (%u, %u, %u): deadlock: %d threads wait at __syncthreads (first: %d), %d at a warp "
             "operation (first: %d), %d returned (first: %d); every thread of a block must reach each "
             "__syncthreads, and every lane of a warp each warp operation",
             rt.kernel, blockIdx.x, blockIdx.y, blockIdx.z, counts[AT_SYNCTHREADS], first[AT_SYNCTHREADS],
             counts[AT_WARP_OP], first[AT_WARP_OP], counts[RETURNED], first[RETURNED]);
}

// A fault in a kernel (a wild pointer, a fiber's stack overflowing into its guard page, an integer
// division by zero) fails the launch instead of killing the process; it runs on its own stack.
inline void on_fault(int signal, siginfo_t* info, void*) {
    fail("%s at address %p: an access far out of bounds, a stack overflow, or a division by zero",
         signal == SIGFPE ? "arithmetic exception" : "memory fault", info->si_addr);
}

// While alive, faults go to on_fault; the handlers and stack that were there come back after.
struct FaultHandlers {
    static constexpr int SIGNALS[3] = {SIGSEGV, SIGBUS, SIGFPE};
    struct sigaction saved[3];
    stack_t saved_stack;
    FaultHandlers() {
        static char stack[64 * 1024];
        stack_t ss{};
        ss.ss_sp = stack;
        ss.ss_size = sizeof stack;
        sigaltstack(&ss, &saved_stack);
        struct sigaction sa{};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        for (int i = 0; i < 3; ++i) sigaction(SIGNALS[i], &sa, &saved[i]);
    }
    ~FaultHandlers() {
        for (int i = 0; i < 3; ++i) sigaction(SIGNALS[i], &saved[i], nullptr);
        sigaltstack(&saved_stack, nullptr);
    }
};

// Run `body(arg)` as every thread of every block of the grid; 0, or 1 with the message in `error`.
inline int run_grid(const char* kernel, const unsigned* grid, const unsigned* block, void (*body)(void*), void* arg,
                    char* error, size_t error_size) {
    FaultHandlers handlers;
    static Fiber fibers[MAX_THREADS];
    char* stack = stacks();
    size_t stride = STACK + (size_t)sysconf(_SC_PAGESIZE);
    if (!stack) {
        snprintf(error, error_size, "%s: could not map the fibers' stacks", kernel);
        return 1;
    }
    rt.fibers = fibers;
    rt.kernel = kernel;
    rt.body = body;
    rt.body_arg = arg;
    rt.failed = false;
    gridDim = dim3(grid[0], grid[1], grid[2]);
    blockDim = dim3(block[0], block[1], block[2]);
    rt.n_threads = (int)(block[0] * block[1] * block[2]);
    for (unsigned z = 0; z < grid[2]; ++z)
        for (unsigned y = 0; y < grid[1]; ++y)
            for (unsigned x = 0; x < grid[0]; ++x) {
                blockIdx = dim3(x, y, z);
                rt.arrived = 0;
                rt.votes[0] = rt.votes[1] = 0;
                for (Warp& w : rt.warps) w.arrived = 0, w.generation = 0;
                for (int i = 0; i < rt.n_threads; ++i) {
                    Fiber& f = fibers[i];
                    getcontext(&f.context);
                    f.context.uc_stack.ss_sp = stack + i * stride + (stride - STACK);
                    f.context.uc_stack.ss_size = STACK;
                    f.context.uc_link = &rt.scheduler;
                    makecontext(&f.context, fiber_main, 0);
                    f.index = dim3(i % block[0], i / block[0] % block[1], i / (block[0] * block[1]));
                    f.state = RUNNING;
                }
                rt.current = 0;
                threadIdx = fibers[0].index;
                swapcontext(&rt.scheduler, &fibers[0].context);
                if (!rt.failed) {
                    for (int i = 0; i < rt.n_threads && !rt.failed; ++i)
                        if (fibers[i].state != RETURNED) {
                            report_deadlock();
                            rt.failed = true;
                        }
                }
                if (rt.failed) {
                    snprintf(error, error_size, "%s", rt.error);
                    return 1;
                }
            }
    return 0;
}

// ---------------------------------------------------------------------------------- kernels' types

template <typename T> const char* scalar_name() {
    using U = std::remove_cv_t<T>;
    if (std::is_same<U, float>::value) return "float";
    if (std::is_same<U, double>::value) return "double";
    if (std::is_same<U, bool>::value) return "bool";
    if (std::is_same<U, signed char>::value) return "signed char";
    if (std::is_same<U, unsigned char>::value) return "unsigned char";
    if (std::is_same<U, short>::value) return "short";
    if (std::is_same<U, unsigned short>::value) return "unsigned short";
    if (std::is_same<U, int>::value) return "int";
    if (std::is_same<U, unsigned>::value) return "unsigned";
    if (std::is_integral<U>::value && sizeof(U) == 8)  // long and long long alike: 8 bytes on a 64-bit host
        return std::is_signed<U>::value ? "long long" : "unsigned long long";
    return "?";
}

// A parameter's type as the Python side names its arguments: "float*" for float*, const float*
// and const float* __restrict__ alike; "long long" for long long or long.
template <typename T> void append_name(char* out, size_t size) {
    if constexpr (std::is_pointer<T>::value) {
        append_name<std::remove_cv_t<std::remove_pointer_t<T>>>(out, size);
        strncat(out, "*", size - strlen(out) - 1);
    } else {
        strncat(out, scalar_name<T>(), size - strlen(out) - 1);
    }
}

template <typename T> T argument(void* p) {
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}

// A kernel with its parameter types erased: what the generated table holds per name expression.
struct Entry {
    void (*kernel)();
    void (*call)(void (*kernel)(), void** args);
    const char* (*signature)();
};

struct Call {
    const Entry* entry;
    void** args;
};

template <typename... P, size_t... I> void call_with(void (*k)(P...), void** args, std::index_sequence<I...>) {
    k(argument<std::remove_cv_t<P>>(args[I])...);
}

template <typename... P> Entry entry(void (*k)(P...)) {
    return Entry{
        reinterpret_cast<void (*)()>(k),
        [](void (*f)(), void** args) {
            call_with(reinterpret_cast<void (*)(P...)>(f), args, std::index_sequence_for<P...>{});
        },
        []() -> const char* {
            static char names[1024];
            names[0] = 0;
            int i = 0;
            ((strncat(names, i++ ? "," : "", sizeof names - strlen(names) - 1), append_name<P>(names, sizeof names)),
             ...);
            return names;
        }};
}

inline int launch(const Entry& e, const char* name, const unsigned* grid, const unsigned* block, void** args,
                  char* error, size_t error_size) {
    Call call{&e, args};
    auto body = [](void* p) {
        Call* c = static_cast<Call*>(p);
        c->entry->call(c->entry->kernel, c->args);
    };
    return run_grid(name, grid, block, body, &call, error, error_size);
}

}  // namespace tk_emu

// ---------------------------------------------------------------------------------- CUDA's device API

inline void __syncthreads() { tk_emu::syncthreads_count(0); }
inline int __syncthreads_count(int predicate) { return tk_emu::syncthreads_count(predicate); }
inline int __syncthreads_or(int predicate) { return tk_emu::syncthreads_count(predicate) > 0; }
inline int __syncthreads_and(int predicate) { return tk_emu::syncthreads_count(predicate) == tk_emu::rt.n_threads; }
inline void __syncwarp(unsigned mask = tk_emu::FULL) {
    tk_emu::check_mask(mask);
    tk_emu::warp_barrier(tk_emu::warp(), tk_emu::SYNCWARP);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T> T __shfl_sync(unsigned mask, T v, int source, int width = 32) {
    return tk_emu::shuffle(mask, v, source, width);
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return tk_emu::shuffle(mask, v, tk_emu::lane() ^ lane_mask, width);
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int source = tk_emu::lane() + (int)delta;
    return tk_emu::shuffle(mask, v, source < 32 ? source : tk_emu::lane(), width);
}
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int source = tk_emu::lane() - (int)delta;
    return tk_emu::shuffle(mask, v, source >= 0 ? source : tk_emu::lane(), width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) { return tk_emu::ballot(mask, predicate); }
inline int __any_sync(unsigned mask, int predicate) { return tk_emu::ballot(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return tk_emu::ballot(mask, predicate) == tk_emu::FULL; }

inline float __int_as_float(int v) { return tk_emu::bits<float>(v); }
inline int __float_as_int(float v) { return tk_emu::bits<int>(v); }
inline float __uint_as_float(unsigned v) { return tk_emu::bits<float>(v); }
inline unsigned __float_as_uint(float v) { return tk_emu::bits<unsigned>(v); }
inline double __longlong_as_double(long long v) { return tk_emu::bits<double>(v); }
inline long long __double_as_longlong(double v) { return tk_emu::bits<long long>(v); }

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
template <typename T> T __ldg(const T* p) { return *p; }

// CUDA's min and max over mixed arithmetic types: the common type; fmin and fmax for floating point
template <typename A, typename B> std::common_type_t<A, B> min(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point<C>::value) return std::fmin((C)a, (C)b);
    else return (C)b < (C)a ? (C)b : (C)a;
}
template <typename A, typename B> std::common_type_t<A, B> max(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point<C>::value) return std::fmax((C)a, (C)b);
    else return (C)a < (C)b ? (C)b : (C)a;
}

// One thread runs at a time, so an atomic is a plain read-modify-write returning the old value.
template <typename T> T atomicAdd(T* address, T v) {
    T old = *address;
    *address = old + v;
    return old;
}
template <typename T> T atomicCAS(T* address, T compare, T v) {
    T old = *address;
    if (old == compare) *address = v;
    return old;
}

// ---------------------------------------------------------------------------------- tensor cores

// cvt.rna.tf32.f32: x to TF32's 10 mantissa bits, to nearest with ties away from zero (adding half
// of the dropped 13 bits' range to the magnitude); infinities and NaN as they are.
__device__ __forceinline__ unsigned tk_to_tf32(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;
    return (u + 0x1000u) & 0xffffe000u;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 over the warp: d += A (16x8) B (8x8), with
// lane = g * 4 + t holding a = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]; b = B[t][g], B[t+4][g];
// d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]. Operands keep their top 19 bits (TF32) as the
// tensor cores read them; each output is d plus its 8 exact products, summed in double, rounded once.
__device__ __forceinline__ void tk_mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    tk_emu::Warp& w = tk_emu::warp();
    unsigned buffer = w.generation & 1;
    float* mine = w.fragment[buffer][tk_emu::lane()];
    for (int i = 0; i < 4; ++i) mine[i] = __uint_as_float(a[i] & 0xffffe000u);
    for (int i = 0; i < 2; ++i) mine[4 + i] = __uint_as_float(b[i] & 0xffffe000u);
    tk_emu::warp_barrier(w, tk_emu::MMA);
    const float(*f)[6] = w.fragment[buffer];
    int g = tk_emu::lane() >> 2, t = tk_emu::lane() & 3;
    for (int i = 0; i < 4; ++i) {
        int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        double sum = d[i];
        for (int k = 0; k < 8; ++k) {
            float a_rk = f[(row & 7) * 4 + (k & 3)][(row >> 3) + 2 * (k >> 2)];
            float b_kc = f[col * 4 + (k & 3)][4 + (k >> 2)];
            sum += (double)a_rk * (double)b_kc;
        }
        d[i] = (float)sum;
    }
}
