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

// The element-wise passes' functions on bf16 / f16 data (act.cu: every result is rounded to 16 bits right
// after): quick_gelu and SiLU with the SFU's exp and reciprocal (`__expf` = ex2.approx of x·log2(e),
// relative error about 2^-22 + |x|·2^-24, at most ~5e-6 where the result is not 0; `__fdividef`: 2 ulp,
// and 0 where the denominator passes 2^126, as the exact quotient's 16-bit rounding nearly is), far below
// f16's half-ulp of 2^-11. With expf and the IEEE division the pass is partly bound by its arithmetic:
// 2.8 TB/s on the H200 and 2.5 on the H100 for step3p7's fc1 output, where the norms move 2.6 (docs/PERF.md
// v0.23). NaN and +-inf go through
// as with the exact forms. The other modes stay exact here: tanh.approx's 2^-10.9 is an f16 half-ulp (the
// fused GEMM epilogue uses it, act_apply_fast above), and erff has no SFU form.
__device__ __forceinline__ float act_apply_half(int mode, float x) {
    switch (mode) {
        case ACT_QUICK_GELU: return __fdividef(x, 1.0f + __expf(-1.702f * x));
        case ACT_SILU: return __fdividef(x, 1.0f + __expf(-x));
        default: return act_apply(mode, x);
    }
}

// act_apply for f32 data (the exactness path), act_apply_half for bf16 / f16 data.
template <typename T>
__device__ __forceinline__ float act_apply_for(int mode, float x) {
    if constexpr (sizeof(T) == 2) {
        return act_apply_half(mode, x);
    } else {
        return act_apply(mode, x);
    }
}
