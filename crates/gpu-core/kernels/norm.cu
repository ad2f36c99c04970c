// Row norms and residual updates. The residual stream and all statistics are f32.
// Entry points: rms_norm_{f32,bf16,f16}, layer_norm_{f32,bf16,f16} (suffix = output dtype),
// residual_add_f32, residual_rms_add_f32 (next pre-norm in bf16) and residual_rms_add_f32_f16 (in f16);
// each row kernel also as `<name>_w9` and `<name>_w12` (one warp per row, the vector path, 9 or 12 chunks per
// lane: the registers a row needs and no more). See kernels/README.md.
#include "common.cuh"

// Row kernels (rms_norm, layer_norm, residual_rms_add): a row is owned by a group of `rw` warps
// (rw in {1, 2, 4, 8}, chosen by the host from h); a block of blockDim.x <= 256 threads (the host
// launches max(64, 32·rw)) holds blockDim.x / (32·rw) rows. The row
// lives in registers: thread t of the group (T = 32·rw threads) holds the 4-column chunks starting at
// columns (i·T + t)·4 for i < NORM_NV, so one pass reads the row once, reductions are shuffles (+ one
// shared-memory step when rw > 1), and the output is written once. Capacity: 32·rw·NORM_NV·4 columns
// (1536 per warp; 12288 = MAX_NORM_WIDTH with rw = 8).
// One-warp entries (`_w9`, `_w12`; the host picks them where rw = 1 and VEC holds): NV = 9 or 12 chunks per lane
// (h <= 1152 or 1536), VEC fixed at compile time, no shared-memory step, idle rows leave at once. The registers
// follow NV: gemma4's 1152-wide residual_rms_add drops from 182 to 104 per thread, 24 -> 19 us per launch at
// batch 1 and 135 -> 107 us at batch 8 on an H100 (docs/PERF.md v0.24).
// VEC (host-chosen): 16-byte loads of x / y and 16-byte (f32) or 8-byte (bf16, f16) stores; needs h, the
// strides and the offsets multiple of 4 elements and aligned base pointers. Otherwise the same chunks
// are read and written one element at a time (any width, stride and offset).
#define NORM_NV 12
#define NORM_THREADS 256
// Block size of the one-warp entries: one row per block, so the registers alone bound the rows per SM.
#define NORM_ONE_WARP_THREADS 32
// residual_rms_add's 9-chunk entry in at most 104 registers (105-118 unbounded, no spill at 104): 19 rows per SM
// of 65 536 registers. Measured on an H100 (docs/PERF.md v0.24), the fastest bound without spills at batch 1 and 8;
// 96 (spilling) is 2 us faster at 2 394 rows and 7 us slower at 19 152.
#define RESIDUAL_W9_MAX_REGS 104

// Sum over the row group. All threads of the block call it (rw is uniform); red holds one float per
// warp of the block (at most 8).
__device__ __forceinline__ float group_sum(float v, float* red, int rw) {
    v = warp_sum(v);
    if (rw == 1) return v;
    const int w = threadIdx.x >> 5;
    __syncthreads();  // red may still be read by the previous call
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    const int g0 = w & ~(rw - 1);
    float s = 0.0f;
    for (int i = 0; i < rw; ++i) s += red[g0 + i];
    return s;
}

// Loads the 4-column chunk at column j (columns >= hv read as 0). CL: clamp the loaded values (only
// those, so the padding stays 0 and does not enter the statistics).
template <bool VEC, bool CL>
__device__ __forceinline__ void load_chunk4(const float* __restrict__ r, int j, int hv, float lo, float hi,
                                            float (&v)[4]) {
    if (VEC) {
        if (j < hv) {
            float4 a = *reinterpret_cast<const float4*>(r + j);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        } else {
            v[0] = v[1] = v[2] = v[3] = 0.0f;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = j + e < hv ? r[j + e] : 0.0f;
    }
    if (CL) {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = (VEC ? j < hv : j + e < hv) ? clampf(v[e], lo, hi) : 0.0f;
    }
}

// Sum of squares (SQ) or plain sum of the thread's chunks; four interleaved accumulators keep the f32
// rounding of a 1536-column row near that of a tree.
template <bool SQ, int NV>
__device__ __forceinline__ float chunk_sum(const float (&v)[NV][4]) {
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] += SQ ? v[i][e] * v[i][e] : v[i][e];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

// Optional per-column vector (weight / bias) at columns j..j+3 (j < h); `dflt` where absent.
template <bool VEC>
__device__ __forceinline__ void load_param4(const float* __restrict__ p, int j, int h, float dflt, float (&v)[4]) {
    if (p == nullptr) {
        v[0] = v[1] = v[2] = v[3] = dflt;
    } else if (VEC) {
        float4 a = *reinterpret_cast<const float4*>(p + j);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = j + e < h ? p[j + e] : dflt;
    }
}

template <bool VEC, typename OutT>
__device__ __forceinline__ void store_chunk4(OutT* __restrict__ r, int j, int hv, const float (&v)[4]) {
    if (VEC) {
        store_vec4(r + j, v);  // caller: j < hv
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (j + e < hv) store_out(r + j + e, v[e]);
    }
}

struct RowSlot {
    long long row;
    int t, T;  // thread index in the row group, group size
    bool valid;
};
__device__ __forceinline__ RowSlot row_slot(int rows, int rw) {
    RowSlot s;
    const int w = threadIdx.x >> 5;
    s.T = 32 * rw;
    s.t = (w % rw) * 32 + (threadIdx.x & 31);
    s.row = (long long)blockIdx.x * ((int)blockDim.x / 32 / rw) + w / rw;
    s.valid = s.row < rows;
    return s;
}

// y[r, :] = clamp(x[r, :] * rsqrt(mean(x^2) + eps) * (w ? w : 1), lo, hi)
template <int NV, bool VEC, bool ONE, typename OutT>
__device__ __forceinline__ void rms_norm_rows(const float* __restrict__ x, const float* __restrict__ w,
                                              OutT* __restrict__ y, int rows, int h, long long ldx, long long ldy,
                                              float eps, float lo, float hi, int rw, float* red) {
    const RowSlot rs = row_slot(rows, ONE ? 1 : rw);
    if (ONE && !rs.valid) return;  // one warp per row: no barrier to join
    const int hv = rs.valid ? h : 0;  // an idle slot loads and stores nothing but joins the barriers
    const float* xr = x + (rs.valid ? rs.row * ldx : 0);
    OutT* yr = y + (rs.valid ? rs.row * ldy : 0);
    float v[NV][4];
#pragma unroll
    for (int i = 0; i < NV; ++i) load_chunk4<VEC, false>(xr, (i * rs.T + rs.t) * 4, hv, 0.0f, 0.0f, v[i]);
    const float inv = rsqrtf(group_sum(chunk_sum<true>(v), red, ONE ? 1 : rw) / (float)h + eps);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int j = (i * rs.T + rs.t) * 4;
        if (j < hv) {
            float wv[4], o[4];
            load_param4<VEC>(w, j, h, 1.0f, wv);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float a = v[i][e] * inv;
                if (w) a *= wv[e];
                o[e] = clampf(a, lo, hi);
            }
            store_chunk4<VEC>(yr, j, hv, o);
        }
    }
}

#define RMS_NORM_ENTRY(OutT, NAME)                                                                              \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                                  \
        NAME(const float* __restrict__ x, const float* __restrict__ w, OutT* __restrict__ y, int rows, int h,   \
             long long ldx, long long ldy, float eps, float lo, float hi, int rw, int vec) {                    \
        __shared__ float red[NORM_THREADS / 32];                                                                \
        if (vec) rms_norm_rows<NORM_NV, true, false, OutT>(x, w, y, rows, h, ldx, ldy, eps, lo, hi, rw, red);   \
        else rms_norm_rows<NORM_NV, false, false, OutT>(x, w, y, rows, h, ldx, ldy, eps, lo, hi, rw, red);      \
    }                                                                                                           \
    RMS_NORM_ONE_WARP(OutT, NAME##_w9, 9)                                                                       \
    RMS_NORM_ONE_WARP(OutT, NAME##_w12, 12)
#define RMS_NORM_ONE_WARP(OutT, NAME, NV)                                                                       \
    extern "C" __global__ void __launch_bounds__(NORM_ONE_WARP_THREADS)                                         \
        NAME(const float* __restrict__ x, const float* __restrict__ w, OutT* __restrict__ y, int rows, int h,   \
             long long ldx, long long ldy, float eps, float lo, float hi, int rw, int vec) {                    \
        rms_norm_rows<NV, true, true, OutT>(x, w, y, rows, h, ldx, ldy, eps, lo, hi, 1, nullptr);               \
    }
RMS_NORM_ENTRY(float, rms_norm_f32)
RMS_NORM_ENTRY(bf16, rms_norm_bf16)
RMS_NORM_ENTRY(f16, rms_norm_f16)

// Two-pass LayerNorm from registers: mean, then mean of squared deviations (biased).
template <int NV, bool VEC, bool ONE, typename OutT>
__device__ __forceinline__ void layer_norm_rows(const float* __restrict__ x, const float* __restrict__ w,
                                                const float* __restrict__ b, OutT* __restrict__ y, int rows, int h,
                                                long long ldx, long long ldy, float eps, int rw, float* red) {
    const RowSlot rs = row_slot(rows, ONE ? 1 : rw);
    if (ONE && !rs.valid) return;  // one warp per row: no barrier to join
    const int hv = rs.valid ? h : 0;
    const float* xr = x + (rs.valid ? rs.row * ldx : 0);
    OutT* yr = y + (rs.valid ? rs.row * ldy : 0);
    float v[NV][4];
#pragma unroll
    for (int i = 0; i < NV; ++i) load_chunk4<VEC, false>(xr, (i * rs.T + rs.t) * 4, hv, 0.0f, 0.0f, v[i]);
    const float mean = group_sum(chunk_sum<false>(v), red, ONE ? 1 : rw) / (float)h;
    float d[NV][4];  // deviations; padding columns are not part of the row
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int j = (i * rs.T + rs.t) * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) d[i][e] = j + e < hv ? v[i][e] - mean : 0.0f;
    }
    const float inv = rsqrtf(group_sum(chunk_sum<true>(d), red, ONE ? 1 : rw) / (float)h + eps);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int j = (i * rs.T + rs.t) * 4;
        if (j < hv) {
            float wv[4], bv[4], o[4];
            load_param4<VEC>(w, j, h, 1.0f, wv);
            load_param4<VEC>(b, j, h, 0.0f, bv);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float a = d[i][e] * inv;
                if (w) a *= wv[e];
                if (b) a += bv[e];
                o[e] = a;
            }
            store_chunk4<VEC>(yr, j, hv, o);
        }
    }
}

#define LAYER_NORM_ENTRY(OutT, NAME)                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                                 \
        NAME(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,            \
             OutT* __restrict__ y, int rows, int h, long long ldx, long long ldy, float eps, int rw, int vec) { \
        __shared__ float red[NORM_THREADS / 32];                                                               \
        if (vec) layer_norm_rows<NORM_NV, true, false, OutT>(x, w, b, y, rows, h, ldx, ldy, eps, rw, red);     \
        else layer_norm_rows<NORM_NV, false, false, OutT>(x, w, b, y, rows, h, ldx, ldy, eps, rw, red);        \
    }                                                                                                          \
    LAYER_NORM_ONE_WARP(OutT, NAME##_w9, 9)                                                                    \
    LAYER_NORM_ONE_WARP(OutT, NAME##_w12, 12)
#define LAYER_NORM_ONE_WARP(OutT, NAME, NV)                                                                    \
    extern "C" __global__ void __launch_bounds__(NORM_ONE_WARP_THREADS)                                        \
        NAME(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,            \
             OutT* __restrict__ y, int rows, int h, long long ldx, long long ldy, float eps, int rw, int vec) { \
        layer_norm_rows<NV, true, true, OutT>(x, w, b, y, rows, h, ldx, ldy, eps, 1, nullptr);                 \
    }
LAYER_NORM_ENTRY(float, layer_norm_f32)
LAYER_NORM_ENTRY(bf16, layer_norm_bf16)
LAYER_NORM_ENTRY(f16, layer_norm_f16)

// x[r, c] += (scale ? scale[c] : 1) * clamp(y[r, c], lo, hi); x is [rows, h] dense, y has row stride ldy.
// Grid-stride over rows*h/4 float4 groups (h % 4 == 0, checked by the host).
extern "C" __global__ void residual_add_f32(float* __restrict__ x, const float* __restrict__ y,
                                            const float* __restrict__ scale, long long rows, int h,
                                            long long ldy, float lo, float hi) {
    long long h4 = h / 4;
    long long total = rows * h4;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / h4;
        int c = (int)(i - r * h4) * 4;
        float4 xv = *reinterpret_cast<float4*>(x + r * h + c);
        const float* yp = y + r * ldy + c;
        float y0 = clampf(yp[0], lo, hi), y1 = clampf(yp[1], lo, hi), y2 = clampf(yp[2], lo, hi),
              y3 = clampf(yp[3], lo, hi);
        if (scale) {
            float4 s = *reinterpret_cast<const float4*>(scale + c);
            y0 *= s.x; y1 *= s.y; y2 *= s.z; y3 *= s.w;
        }
        xv.x += y0; xv.y += y1; xv.z += y2; xv.w += y3;
        *reinterpret_cast<float4*>(x + r * h + c) = xv;
    }
}

// Gemma sandwich: x[r] += rms(clamp(y[r]))·w_post; then, if next_out is non-null,
// next_out[r] = rms(x[r])·next_w (the following pre-norm in NextT, bf16 or f16, feeding the next GEMM).
// Row-group layout as above; x and next_out are dense [rows, h].
template <int NV, bool VEC, bool ONE, typename NextT>
__device__ __forceinline__ void residual_rms_add_rows(float* __restrict__ x, const float* __restrict__ y,
                                                      const float* __restrict__ w_post, int rows, int h,
                                                      long long ldy, float eps, float lo, float hi,
                                                      const float* __restrict__ next_w, NextT* __restrict__ next_out,
                                                      float next_eps, int rw, float* red) {
    const RowSlot rs = row_slot(rows, ONE ? 1 : rw);
    if (ONE && !rs.valid) return;  // one warp per row: no barrier to join
    const int hv = rs.valid ? h : 0;
    const float* yr = y + (rs.valid ? rs.row * ldy : 0);
    float* xr = x + (rs.valid ? rs.row * h : 0);
    float yv[NV][4], xv[NV][4];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int j = (i * rs.T + rs.t) * 4;
        load_chunk4<VEC, true>(yr, j, hv, lo, hi, yv[i]);
        load_chunk4<VEC, false>(xr, j, hv, 0.0f, 0.0f, xv[i]);
    }
    const float inv = rsqrtf(group_sum(chunk_sum<true>(yv), red, ONE ? 1 : rw) / (float)h + eps);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int j = (i * rs.T + rs.t) * 4;
        if (j < hv) {
            float wv[4];
            load_param4<VEC>(w_post, j, h, 1.0f, wv);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float a = yv[i][e] * inv;
                if (w_post) a *= wv[e];
                xv[i][e] += a;  // padding columns (scalar path) stay 0: y and x padding are 0
            }
            store_chunk4<VEC>(xr, j, hv, xv[i]);
        }
    }
    if (next_out == nullptr) return;  // uniform across the block
    const float inv2 = rsqrtf(group_sum(chunk_sum<true>(xv), red, ONE ? 1 : rw) / (float)h + next_eps);
    NextT* o = next_out + (rs.valid ? rs.row * h : 0);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int j = (i * rs.T + rs.t) * 4;
        if (j < hv) {
            float wv[4], ov[4];
            load_param4<VEC>(next_w, j, h, 1.0f, wv);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float a = xv[i][e] * inv2;
                if (next_w) a *= wv[e];
                ov[e] = a;
            }
            store_chunk4<VEC>(o, j, hv, ov);
        }
    }
}

#define RESIDUAL_RMS_ADD_ENTRY(NextT, NAME)                                                                       \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                                    \
        NAME(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w_post, int rows, int h, \
             long long ldy, float eps, float lo, float hi, const float* __restrict__ next_w,                      \
             NextT* __restrict__ next_out, float next_eps, int rw, int vec) {                                      \
        __shared__ float red[NORM_THREADS / 32];                                                                  \
        if (vec)                                                                                                  \
            residual_rms_add_rows<NORM_NV, true, false, NextT>(x, y, w_post, rows, h, ldy, eps, lo, hi, next_w,  \
                                                               next_out, next_eps, rw, red);                      \
        else                                                                                                      \
            residual_rms_add_rows<NORM_NV, false, false, NextT>(x, y, w_post, rows, h, ldy, eps, lo, hi, next_w, \
                                                                next_out, next_eps, rw, red);                     \
    }                                                                                                             \
    RESIDUAL_RMS_ADD_ONE_WARP(NextT, NAME##_w9, 9, __maxnreg__(RESIDUAL_W9_MAX_REGS))                             \
    RESIDUAL_RMS_ADD_ONE_WARP(NextT, NAME##_w12, 12, __launch_bounds__(NORM_ONE_WARP_THREADS))
#define RESIDUAL_RMS_ADD_ONE_WARP(NextT, NAME, NV, BOUNDS)                                                        \
    extern "C" __global__ void BOUNDS                                                                             \
        NAME(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w_post, int rows, int h, \
             long long ldy, float eps, float lo, float hi, const float* __restrict__ next_w,                      \
             NextT* __restrict__ next_out, float next_eps, int rw, int vec) {                                      \
        residual_rms_add_rows<NV, true, true, NextT>(x, y, w_post, rows, h, ldy, eps, lo, hi, next_w, next_out,   \
                                                     next_eps, 1, nullptr);                                       \
    }
RESIDUAL_RMS_ADD_ENTRY(bf16, residual_rms_add_f32)
RESIDUAL_RMS_ADD_ENTRY(f16, residual_rms_add_f32_f16)
