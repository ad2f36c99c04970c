// Row norms and residual updates. The residual stream and all statistics are f32.
// Entry points: rms_norm_{f32,bf16}, layer_norm_{f32,bf16} (suffix = output dtype),
// residual_add_f32, residual_rms_add_f32. See kernels/README.md.
#include "common.cuh"

extern __shared__ float row[];  // dynamic: one cached row (h floats)

// One block per row; the row is cached in dynamic shared memory (h floats).
// y[r, :] = clamp(x[r, :] * rsqrt(mean(x^2) + eps) * (w ? w : 1), lo, hi)
template <typename OutT>
__device__ void rms_norm_impl(const float* __restrict__ x, const float* __restrict__ w, OutT* __restrict__ y,
                              int h, long long ldx, long long ldy, float eps, float lo, float hi) {
    __shared__ float red[32];
    const float* xr = x + (long long)blockIdx.x * ldx;
    OutT* yr = y + (long long)blockIdx.x * ldy;
    float s = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = xr[j];
        row[j] = v;
        s += v * v;
    }
    s = block_sum(s, red);
    float inv = rsqrtf(s / (float)h + eps);
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = row[j] * inv;
        if (w) v *= w[j];
        store_out(yr + j, clampf(v, lo, hi));
    }
}

extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y, int h, long long ldx,
                                        long long ldy, float eps, float lo, float hi) {
    rms_norm_impl<float>(x, w, y, h, ldx, ldy, eps, lo, hi);
}
extern "C" __global__ void rms_norm_bf16(const float* x, const float* w, bf16* y, int h, long long ldx,
                                         long long ldy, float eps, float lo, float hi) {
    rms_norm_impl<bf16>(x, w, y, h, ldx, ldy, eps, lo, hi);
}

// Two-pass LayerNorm: mean, then mean of squared deviations (biased), from the cached row.
template <typename OutT>
__device__ void layer_norm_impl(const float* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ b, OutT* __restrict__ y, int h, long long ldx,
                                long long ldy, float eps) {
    __shared__ float red[32];
    const float* xr = x + (long long)blockIdx.x * ldx;
    OutT* yr = y + (long long)blockIdx.x * ldy;
    float s = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = xr[j];
        row[j] = v;
        s += v;
    }
    float mean = block_sum(s, red) / (float)h;
    float q = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float d = row[j] - mean;
        q += d * d;
    }
    float inv = rsqrtf(block_sum(q, red) / (float)h + eps);
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = (row[j] - mean) * inv;
        if (w) v *= w[j];
        if (b) v += b[j];
        store_out(yr + j, v);
    }
}

extern "C" __global__ void layer_norm_f32(const float* x, const float* w, const float* b, float* y, int h,
                                          long long ldx, long long ldy, float eps) {
    layer_norm_impl<float>(x, w, b, y, h, ldx, ldy, eps);
}
extern "C" __global__ void layer_norm_bf16(const float* x, const float* w, const float* b, bf16* y, int h,
                                           long long ldx, long long ldy, float eps) {
    layer_norm_impl<bf16>(x, w, b, y, h, ldx, ldy, eps);
}

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
// next_out[r] = rms(x[r])·next_w (the following pre-norm, bf16, feeding the next GEMM).
extern "C" __global__ void residual_rms_add_f32(float* __restrict__ x, const float* __restrict__ y,
                                                const float* __restrict__ w_post, int h, long long ldy,
                                                float eps, float lo, float hi, const float* __restrict__ next_w,
                                                bf16* __restrict__ next_out, float next_eps) {
    __shared__ float red[32];
    float* xr = x + (long long)blockIdx.x * h;
    const float* yr = y + (long long)blockIdx.x * ldy;
    float s = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = clampf(yr[j], lo, hi);
        row[j] = v;
        s += v * v;
    }
    float inv = rsqrtf(block_sum(s, red) / (float)h + eps);
    float s2 = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = row[j] * inv;
        if (w_post) v *= w_post[j];
        float nx = xr[j] + v;
        xr[j] = nx;
        row[j] = nx;
        s2 += nx * nx;
    }
    if (next_out == nullptr) return;  // uniform across the block
    float inv2 = rsqrtf(block_sum(s2, red) / (float)h + next_eps);
    bf16* o = next_out + (long long)blockIdx.x * h;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = row[j] * inv2;
        if (next_w) v *= next_w[j];
        o[j] = __float2bfloat16_rn(v);
    }
}
