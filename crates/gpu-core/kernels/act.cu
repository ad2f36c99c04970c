// Activations, gated and plain, on GEMM outputs (f32, bf16 or f16, in = out dtype); math in f32, exact for
// f32 data, quick_gelu and SiLU through the SFU for bf16 / f16 data (act_math.cuh, act_apply_for).
// Entry points: gated_act_{f32,bf16,f16}, act_{f32,bf16,f16}, cast_f32_{bf16,f16}. Mode numbers match
// gpu_core::Activation.
#include "common.cuh"
#include "act_math.cuh"

// Vector path (host-chosen: columns, strides and offsets multiples of 16 bytes / sizeof(T), aligned
// bases, fewer than 2^31 chunks): each thread handles ACT_UNROLL 16-byte chunks (8 bf16 / f16 or 4 f32 columns
// of one row), all loads issued before any math; the chunk index is split into (row, column) with one
// 32-bit division. Scalar path: the element grid-stride loop (any layout). Math is identical.
#define ACT_THREADS 256
#define ACT_UNROLL 2

template <typename T, int MODE>
__device__ __forceinline__ float act_fixed(float x) {
    return act_apply_for<T>(MODE, x);  // MODE is a constant: the switch folds away
}

// out[r, c] = clamp(act(clamp(min(g, glim), g_lo, g_hi)) * clamp(u, u_lo, u_hi), o_lo, o_hi)
// with g = gate[r*ldg + c], u = up[r*ldu + c]. glm's clamped SwiGLU is mode SILU with
// glim = L, u_lo = -L, u_hi = L. Unused clamps are +-inf.
template <typename T, int MODE>
__device__ __forceinline__ void gated_act_vec(T* __restrict__ out, const T* __restrict__ gate,
                                              const T* __restrict__ up, long long rows, int cols, long long ldo,
                                              long long ldg, long long ldu, float glim, float g_lo, float g_hi,
                                              float u_lo, float u_hi, float o_lo, float o_hi) {
    constexpr int N = Vec16<T>::N;
    const unsigned cpr = (unsigned)(cols / N);  // chunks per row
    const unsigned total = (unsigned)rows * cpr;  // < 2^31 (host)
    const unsigned first = blockIdx.x * (ACT_THREADS * ACT_UNROLL) + threadIdx.x;
    float g[ACT_UNROLL][N], u[ACT_UNROLL][N];
    long long ro[ACT_UNROLL];
    int co[ACT_UNROLL];
#pragma unroll
    for (int k = 0; k < ACT_UNROLL; ++k) {
        const unsigned i = first + k * ACT_THREADS;
        const unsigned r = i / cpr;
        ro[k] = r;
        co[k] = (int)(i - r * cpr) * N;
        if (i < total) {
            load_vec16(gate + ro[k] * ldg + co[k], g[k]);
            load_vec16(up + ro[k] * ldu + co[k], u[k]);
        }
    }
#pragma unroll
    for (int k = 0; k < ACT_UNROLL; ++k) {
        if (first + k * ACT_THREADS < total) {
            float o[N];
#pragma unroll
            for (int e = 0; e < N; ++e) {
                const float a = clampf(min_keep_nan(g[k][e], glim), g_lo, g_hi);
                const float b = clampf(u[k][e], u_lo, u_hi);
                o[e] = clampf(act_fixed<T, MODE>(a) * b, o_lo, o_hi);
            }
            store_vec16(out + ro[k] * ldo + co[k], o);
        }
    }
}

template <typename T>
__device__ __forceinline__ void gated_act_scalar(T* __restrict__ out, const T* __restrict__ gate,
                                                 const T* __restrict__ up, long long rows, int cols, long long ldo,
                                                 long long ldg, long long ldu, int mode, float glim, float g_lo,
                                                 float g_hi, float u_lo, float u_hi, float o_lo, float o_hi) {
    long long total = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / cols;
        long long c = i - r * cols;
        float g = clampf(min_keep_nan(load_in(gate + r * ldg + c), glim), g_lo, g_hi);
        float u = clampf(load_in(up + r * ldu + c), u_lo, u_hi);
        store_out(out + r * ldo + c, clampf(act_apply_for<T>(mode, g) * u, o_lo, o_hi));
    }
}

#define GATED_ACT_VEC_CASE(T, M)                                                                              \
    case M:                                                                                                   \
        gated_act_vec<T, M>(out, gate, up, rows, cols, ldo, ldg, ldu, glim, g_lo, g_hi, u_lo, u_hi, o_lo, o_hi); \
        break;
#define GATED_ACT_ENTRY(T, NAME)                                                                             \
    extern "C" __global__ void __launch_bounds__(ACT_THREADS)                                                \
        NAME(T* __restrict__ out, const T* __restrict__ gate, const T* __restrict__ up, long long rows,         \
             int cols, long long ldo, long long ldg, long long ldu, int mode, float glim, float g_lo,          \
             float g_hi, float u_lo, float u_hi, float o_lo, float o_hi, int vec) {                             \
        if (!vec) {                                                                                           \
            gated_act_scalar<T>(out, gate, up, rows, cols, ldo, ldg, ldu, mode, glim, g_lo, g_hi, u_lo, u_hi,  \
                                o_lo, o_hi);                                                                  \
            return;                                                                                           \
        }                                                                                                     \
        switch (mode) {                                                                                       \
            GATED_ACT_VEC_CASE(T, ACT_GELU_TANH)                                                              \
            GATED_ACT_VEC_CASE(T, ACT_QUICK_GELU)                                                             \
            GATED_ACT_VEC_CASE(T, ACT_GELU_ERF)                                                               \
            GATED_ACT_VEC_CASE(T, ACT_SILU)                                                                   \
            default: GATED_ACT_VEC_CASE(T, ACT_IDENTITY)                                                      \
        }                                                                                                     \
    }
GATED_ACT_ENTRY(float, gated_act_f32)
GATED_ACT_ENTRY(bf16, gated_act_bf16)
GATED_ACT_ENTRY(f16, gated_act_f16)

// out[r, c] = clamp(act(clamp(x[r, c], i_lo, i_hi)), o_lo, o_hi); in place allowed (out == x, same ld):
// every element is read and written by the same thread, so no __restrict__ here.
template <typename T, int MODE>
__device__ __forceinline__ void act_vec(T* out, const T* x, long long rows, int cols, long long ldo,
                                        long long ldx, float i_lo, float i_hi, float o_lo, float o_hi) {
    constexpr int N = Vec16<T>::N;
    const unsigned cpr = (unsigned)(cols / N);
    const unsigned total = (unsigned)rows * cpr;
    const unsigned first = blockIdx.x * (ACT_THREADS * ACT_UNROLL) + threadIdx.x;
    float v[ACT_UNROLL][N];
    long long ro[ACT_UNROLL];
    int co[ACT_UNROLL];
#pragma unroll
    for (int k = 0; k < ACT_UNROLL; ++k) {
        const unsigned i = first + k * ACT_THREADS;
        const unsigned r = i / cpr;
        ro[k] = r;
        co[k] = (int)(i - r * cpr) * N;
        if (i < total) load_vec16(x + ro[k] * ldx + co[k], v[k]);
    }
#pragma unroll
    for (int k = 0; k < ACT_UNROLL; ++k) {
        if (first + k * ACT_THREADS < total) {
            float o[N];
#pragma unroll
            for (int e = 0; e < N; ++e) o[e] = clampf(act_fixed<T, MODE>(clampf(v[k][e], i_lo, i_hi)), o_lo, o_hi);
            store_vec16(out + ro[k] * ldo + co[k], o);
        }
    }
}

template <typename T>
__device__ __forceinline__ void act_scalar(T* out, const T* x, long long rows, int cols, long long ldo,
                                           long long ldx, int mode, float i_lo, float i_hi, float o_lo,
                                           float o_hi) {
    long long total = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / cols;
        long long c = i - r * cols;
        float v = clampf(load_in(x + r * ldx + c), i_lo, i_hi);
        store_out(out + r * ldo + c, clampf(act_apply_for<T>(mode, v), o_lo, o_hi));
    }
}

#define ACT_VEC_CASE(T, M)                                                          \
    case M:                                                                         \
        act_vec<T, M>(out, x, rows, cols, ldo, ldx, i_lo, i_hi, o_lo, o_hi);        \
        break;
#define ACT_ENTRY(T, NAME)                                                                                    \
    extern "C" __global__ void __launch_bounds__(ACT_THREADS)                                                 \
        NAME(T* out, const T* x, long long rows, int cols, long long ldo, long long ldx, int mode, float i_lo,   \
             float i_hi, float o_lo, float o_hi, int vec) {                                                    \
        if (!vec) {                                                                                           \
            act_scalar<T>(out, x, rows, cols, ldo, ldx, mode, i_lo, i_hi, o_lo, o_hi);                        \
            return;                                                                                           \
        }                                                                                                     \
        switch (mode) {                                                                                       \
            ACT_VEC_CASE(T, ACT_GELU_TANH)                                                                    \
            ACT_VEC_CASE(T, ACT_QUICK_GELU)                                                                   \
            ACT_VEC_CASE(T, ACT_GELU_ERF)                                                                     \
            ACT_VEC_CASE(T, ACT_SILU)                                                                         \
            default: ACT_VEC_CASE(T, ACT_IDENTITY)                                                            \
        }                                                                                                     \
    }
ACT_ENTRY(float, act_f32)
ACT_ENTRY(bf16, act_bf16)
ACT_ENTRY(f16, act_f16)

// f32 -> bf16 / f16 (round to nearest even), dense.
#define CAST_F32_ENTRY(OutT, NAME)                                                                        \
    extern "C" __global__ void NAME(OutT* __restrict__ out, const float* __restrict__ x, long long n) {   \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;                       \
             i += (long long)gridDim.x * blockDim.x)                                                      \
            out[i] = from_f32<OutT>(x[i]);                                                                \
    }
CAST_F32_ENTRY(bf16, cast_f32_bf16)
CAST_F32_ENTRY(f16, cast_f32_f16)
