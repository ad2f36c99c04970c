// The activation functions of gpu_core::Activation, in f32: the element-wise kernels (act.cu) and the
// GEMM epilogue (gemm_sm90a.cu) compute them with this one definition. Mode numbers match the Rust enum.
#pragma once

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

// The same functions with the SFU's approximate exp2 / reciprocal / tanh (`ex2.approx`, `rcp.approx`,
// `tanh.approx`: relative error ≤ 2⁻¹⁰·⁹), for epilogues whose result is rounded to bf16 (2⁻⁹) right after.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float act_apply_fast(int mode, float x) {
    switch (mode) {
        case ACT_GELU_TANH: {
            float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            return 0.5f * x * (1.0f + tanh_approx(u));
        }
        case ACT_QUICK_GELU: return __fdividef(x, 1.0f + __expf(-1.702f * x));
        case ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        case ACT_SILU: return __fdividef(x, 1.0f + __expf(-x));
        default: return x;
    }
}
