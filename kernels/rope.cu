// Per-head RMS norm (q, k, weightless v) fused with 2-D rope, in place on the fused qkv GEMM output.
// Entry points: qk_norm_rope_{f32,bf16} (the qkv buffer's dtype; math in f32). See kernels/README.md
// for the three pair layouts.
#include "common.cuh"

#define ROPE_NEOX_FULL 0     // pairs (p, p + hd/2), p < hd/2                    (glm, step3p7 HF)
#define ROPE_GEMMA_HALVES 1  // pairs (a*hd/2 + d, a*hd/2 + d + hd/4), d < hd/4   (gemma4)
#define ROPE_INTERLEAVED 2   // pairs (2p, 2p + 1), p < hd/2                     (step3p7 vendor)

#define F_NORM_Q 1
#define F_NORM_K 2
#define F_NORM_V 4
#define F_ROPE 8

// One warp per (token, head, which) with which in {q, k, v}; 8 warps per block; hd <= 256, hd % 4 == 0.
// Pair p < hd/2 rotates by angle pos[axis(p)] * inv_freq[p % (hd/4)], axis(p) = p < hd/4 ? 0 : 1;
// pos_axis0 = first_axis == 0 ? x : y. pos is [n, 2] int32 (x = column, y = row).
template <typename T>
__device__ __forceinline__ void qk_norm_rope_impl(
    T* __restrict__ qkv, long long n, int heads, int hd, long long ld, long long q_off, long long k_off,
    long long v_off, const int* __restrict__ pos, const float* __restrict__ inv_freq, int layout,
    int first_axis, int flags, const float* __restrict__ q_w, const float* __restrict__ k_w, float eps,
    float q_lo, float q_hi, float k_lo, float k_hi, float v_lo, float v_hi) {
    __shared__ float buf[8][256];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long long item = (long long)blockIdx.x * 8 + warp;
    long long total = n * heads * 3;
    if (item >= total) return;
    int which = (int)(item % 3);
    long long th = item / 3;
    int head = (int)(th % heads);
    long long tok = th / heads;
    long long off = which == 0 ? q_off : (which == 1 ? k_off : v_off);
    T* p = qkv + tok * ld + off + (long long)head * hd;
    float lo = which == 0 ? q_lo : (which == 1 ? k_lo : v_lo);
    float hi = which == 0 ? q_hi : (which == 1 ? k_hi : v_hi);
    bool norm = (flags & (which == 0 ? F_NORM_Q : (which == 1 ? F_NORM_K : F_NORM_V))) != 0;
    bool rope = (flags & F_ROPE) != 0 && which < 2;
    if (!norm && !rope && lo == -INFINITY && hi == INFINITY) return;
    float* b = buf[warp];
    float s = 0.0f;
    for (int j = lane; j < hd; j += 32) {
        float v = clampf(load_in(p + j), lo, hi);
        b[j] = v;
        s += v * v;
    }
    s = warp_sum(s);
    if (norm) {
        float inv = rsqrtf(s / (float)hd + eps);
        const float* w = which == 0 ? q_w : (which == 1 ? k_w : nullptr);
        for (int j = lane; j < hd; j += 32) b[j] = b[j] * inv * (w ? w[j] : 1.0f);
    }
    __syncwarp();
    if (!rope) {
        for (int j = lane; j < hd; j += 32) store_out(p + j, b[j]);
        return;
    }
    int q4 = hd / 4, half = hd / 2;
    int px = pos[tok * 2], py = pos[tok * 2 + 1];
    int pa = first_axis == 0 ? px : py, pb = first_axis == 0 ? py : px;
    for (int pr = lane; pr < half; pr += 32) {
        int axis = pr < q4 ? 0 : 1;
        int f = pr - axis * q4;
        float ang = (float)(axis == 0 ? pa : pb) * inv_freq[f];
        float sn, cs;
        sincosf(ang, &sn, &cs);
        int i0, i1;
        if (layout == ROPE_NEOX_FULL) { i0 = pr; i1 = pr + half; }
        else if (layout == ROPE_GEMMA_HALVES) { i0 = axis * half + f; i1 = i0 + q4; }
        else { i0 = 2 * pr; i1 = 2 * pr + 1; }
        float a = b[i0], c = b[i1];
        store_out(p + i0, a * cs - c * sn);
        store_out(p + i1, c * cs + a * sn);
    }
}

#define QK_NORM_ROPE_ENTRY(T, NAME)                                                                           \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                  \
        T* qkv, long long n, int heads, int hd, long long ld, long long q_off, long long k_off, long long v_off, \
        const int* pos, const float* inv_freq, int layout, int first_axis, int flags, const float* q_w,         \
        const float* k_w, float eps, float q_lo, float q_hi, float k_lo, float k_hi, float v_lo, float v_hi) {   \
        qk_norm_rope_impl<T>(qkv, n, heads, hd, ld, q_off, k_off, v_off, pos, inv_freq, layout, first_axis,     \
                             flags, q_w, k_w, eps, q_lo, q_hi, k_lo, k_hi, v_lo, v_hi);                         \
    }

QK_NORM_ROPE_ENTRY(float, qk_norm_rope_f32)
QK_NORM_ROPE_ENTRY(bf16, qk_norm_rope_bf16)
