// Shared helpers for the gpu-core kernels. Included by every kernels/*.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;
typedef __half f16;

// Output conversion: one overload per output dtype, so templated kernels write either.
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ float load_in(const float* p) { return *p; }
__device__ __forceinline__ float load_in(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_out(f16* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ float load_in(const f16* p) { return __half2float(*p); }
// A 16-bit element from f32 (round to nearest even), for the kernels templated on bf16 / f16.
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). `red` holds 32 floats.
// Every thread gets the result. Contains barriers: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return warp_sum(t);
}

// torch.clamp's law (the oracle's): a NaN stays NaN. fminf/fmaxf alone return the other operand, so
// a NaN (an f16 overflow's inf − inf upstream, say) would leave the clamp as its bound and pass any
// finiteness check downstream. The select costs one compare per value; ±inf bounds = no clamp.
__device__ __forceinline__ float clampf(float x, float lo, float hi) {
    const float c = fminf(fmaxf(x, lo), hi);
    return x != x ? x : c;
}
// min(x, hi) with torch's NaN law (`gate.clamp(max=limit)` upstream), for the gate limit.
__device__ __forceinline__ float min_keep_nan(float x, float hi) { return x != x ? x : fminf(x, hi); }

// ---- 16-byte vector access (8 bf16 / f16 or 4 f32 per access), values in f32 registers ----
// The caller guarantees 16-byte alignment (the host launchers check pointers, strides and offsets).
template <typename T> struct Vec16;
template <> struct Vec16<float> { static constexpr int N = 4; };
template <> struct Vec16<bf16> { static constexpr int N = 8; };
template <> struct Vec16<f16> { static constexpr int N = 8; };

__device__ __forceinline__ float bf16_lo_f32(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi_f32(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
// Two f32 to packed bf16x2 (round to nearest even, as __float2bfloat16_rn); `lo` is the lower address.
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Two f32 to packed f16x2 (round to nearest even, as __float2half_rn); `lo` is the lower address.
__device__ __forceinline__ uint32_t f16x2_bits(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ float2 f16x2_f32(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

__device__ __forceinline__ void load_vec16(const float* p, float (&v)[4]) {
    float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
}
__device__ __forceinline__ void load_vec16(const bf16* p, float (&v)[8]) {
    uint4 a = *reinterpret_cast<const uint4*>(p);
    v[0] = bf16_lo_f32(a.x); v[1] = bf16_hi_f32(a.x); v[2] = bf16_lo_f32(a.y); v[3] = bf16_hi_f32(a.y);
    v[4] = bf16_lo_f32(a.z); v[5] = bf16_hi_f32(a.z); v[6] = bf16_lo_f32(a.w); v[7] = bf16_hi_f32(a.w);
}
__device__ __forceinline__ void load_vec16(const f16* p, float (&v)[8]) {
    uint4 a = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = f16x2_f32(w[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void store_vec16(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store_vec16(bf16* p, const float (&v)[8]) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(bf16x2_bits(v[0], v[1]), bf16x2_bits(v[2], v[3]), bf16x2_bits(v[4], v[5]), bf16x2_bits(v[6], v[7]));
}
__device__ __forceinline__ void store_vec16(f16* p, const float (&v)[8]) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(f16x2_bits(v[0], v[1]), f16x2_bits(v[2], v[3]), f16x2_bits(v[4], v[5]), f16x2_bits(v[6], v[7]));
}
// Four consecutive outputs: one float4 (16-byte aligned) or four bf16 / f16 (8-byte aligned).
__device__ __forceinline__ void store_vec4(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store_vec4(bf16* p, const float (&v)[4]) {
    *reinterpret_cast<uint2*>(p) = make_uint2(bf16x2_bits(v[0], v[1]), bf16x2_bits(v[2], v[3]));
}
__device__ __forceinline__ void store_vec4(f16* p, const float (&v)[4]) {
    *reinterpret_cast<uint2*>(p) = make_uint2(f16x2_bits(v[0], v[1]), f16x2_bits(v[2], v[3]));
}
