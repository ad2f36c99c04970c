// Activations, gated and plain, on GEMM outputs (f32 or bf16, in = out dtype); math in f32.
// Entry points: gated_act_{f32,bf16}, act_{f32,bf16}, cast_f32_bf16. Mode numbers match gpu_core::Activation.
#include "common.cuh"

#define ACT_GELU_TANH 0
#define ACT_QUICK_GELU 1
#define ACT_GELU_ERF 2
#define ACT_SILU 3
#define ACT_IDENTITY 4

__device__ __forceinline__ float act_apply(int mode, float x) {
    switch (mode) {
        case ACT_GELU_TANH: {
            // 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))), torch gelu(approximate='tanh')
            float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            return 0.5f * x * (1.0f + tanhf(u));
        }
        case ACT_QUICK_GELU: return x / (1.0f + expf(-1.702f * x));
        case ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        case ACT_SILU: return x / (1.0f + expf(-x));
        default: return x;
    }
}

// out[r, c] = clamp(act(clamp(min(g, glim), g_lo, g_hi)) * clamp(u, u_lo, u_hi), o_lo, o_hi)
// with g = gate[r*ldg + c], u = up[r*ldu + c]. glm's clamped SwiGLU is mode SILU with
// glim = L, u_lo = -L, u_hi = L. Unused clamps are +-inf.
template <typename T>
__device__ __forceinline__ void gated_act_impl(T* __restrict__ out, const T* __restrict__ gate,
                                               const T* __restrict__ up, long long rows, int cols, long long ldo,
                                               long long ldg, long long ldu, int mode, float glim, float g_lo,
                                               float g_hi, float u_lo, float u_hi, float o_lo, float o_hi) {
    long long total = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / cols;
        long long c = i - r * cols;
        float g = clampf(fminf(load_in(gate + r * ldg + c), glim), g_lo, g_hi);
        float u = clampf(load_in(up + r * ldu + c), u_lo, u_hi);
        store_out(out + r * ldo + c, clampf(act_apply(mode, g) * u, o_lo, o_hi));
    }
}

#define GATED_ACT_ENTRY(T, NAME)                                                                             \
    extern "C" __global__ void NAME(T* __restrict__ out, const T* __restrict__ gate, const T* __restrict__ up, \
                                    long long rows, int cols, long long ldo, long long ldg, long long ldu,     \
                                    int mode, float glim, float g_lo, float g_hi, float u_lo, float u_hi,      \
                                    float o_lo, float o_hi) {                                                  \
        gated_act_impl<T>(out, gate, up, rows, cols, ldo, ldg, ldu, mode, glim, g_lo, g_hi, u_lo, u_hi, o_lo,  \
                          o_hi);                                                                               \
    }
GATED_ACT_ENTRY(float, gated_act_f32)
GATED_ACT_ENTRY(bf16, gated_act_bf16)

// out[r, c] = clamp(act(clamp(x[r, c], i_lo, i_hi)), o_lo, o_hi); in place allowed (out == x, same ld).
template <typename T>
__device__ __forceinline__ void act_impl(T* out, const T* x, long long rows, int cols, long long ldo,
                                         long long ldx, int mode, float i_lo, float i_hi, float o_lo,
                                         float o_hi) {
    long long total = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / cols;
        long long c = i - r * cols;
        float v = clampf(load_in(x + r * ldx + c), i_lo, i_hi);
        store_out(out + r * ldo + c, clampf(act_apply(mode, v), o_lo, o_hi));
    }
}

#define ACT_ENTRY(T, NAME)                                                                                    \
    extern "C" __global__ void NAME(T* out, const T* x, long long rows, int cols, long long ldo, long long ldx, \
                                    int mode, float i_lo, float i_hi, float o_lo, float o_hi) {                \
        act_impl<T>(out, x, rows, cols, ldo, ldx, mode, i_lo, i_hi, o_lo, o_hi);                               \
    }
ACT_ENTRY(float, act_f32)
ACT_ENTRY(bf16, act_bf16)

// f32 -> bf16 (round to nearest even), dense.
extern "C" __global__ void cast_f32_bf16(bf16* __restrict__ out, const float* __restrict__ x, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(x[i]);
}
