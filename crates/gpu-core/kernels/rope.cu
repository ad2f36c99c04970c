// Per-head RMS norm (q, k, weightless v) fused with 2-D rope, in place on the fused qkv GEMM output.
// Entry points: qk_norm_rope_staged_{f32,bf16,f16} (the fast path) and qk_norm_rope_{f32,bf16,f16} (the
// general fallback), suffix = the qkv buffer's dtype; math in f32. See kernels/README.md for the three pair layouts.
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
QK_NORM_ROPE_ENTRY(f16, qk_norm_rope_f16)

// ---- Staged kernel: one (token, part) unit per threadIdx.y, 16-byte chunks, one read and one write ----
// Block (TX, TY), grid (ceil(n / TY), number of active parts); blockIdx.y picks the part (q, k or v) among
// those with work (`active`, bit w = part w: norm, rope or a clamp), so an untouched part is never read.
// A unit is the `width = heads·hd` elements of one part of one token, in VW-element chunks (16 bytes:
// VW = 8 bf16 / f16 or 4 f32; hd % VW == 0, so a chunk never straddles heads; cph = hd / VW chunks per head).
// TX = hpr·cph: thread x owns chunk jc = x mod cph of heads x / cph + u·hpr (u < QKR_MAXC), so its
// position inside the head (j0 = jc·VW) is the same in every pass; its chunks stay in registers from the
// load to the store:
//   1. load + clamp the chunks; per-chunk sums of squares -> psum; if the pairs cross chunks (layouts
//      0 and 1), the values -> vals (per head hd + hd/8 + 1 floats, one pad per 8 against bank
//      conflicts); the unit's cos/sin per pair p < hd/2 (sincosf once per token and frequency, shared
//      by all heads).
//   2. per head: inv = rsqrt(mean of squares + eps); per element j < hd (the same for every head):
//      A[j] = w[j]·cos, B[j] = ±w[partner]·sin, P[j] = padded partner index (rope), or A[j] = w[j].
//   3. out = (x·A + x_partner·B)·inv  (rope; partner from vals or, interleaved, the same chunk)
//      or (x·inv)·A (norm only) or x (clamp only); one 16-byte store per chunk.
// Shared memory per unit, in floats (ops.rs qkr_unit_floats must agree):
//   A[hd] B[hd] P[hd] cs[hd/2] sn[hd/2] inv[heads] psum[heads·cph] vals[heads·(hd + hd/8 + 1)],
//   rounded up to a multiple of 4.
#define QKR_MAXC 4

__device__ __forceinline__ int qkr_part(int active, int k) {  // the k-th set bit of active (3 bits)
#pragma unroll
    for (int w = 0; w < 3; ++w) {
        if ((active >> w) & 1) {
            if (k == 0) return w;
            --k;
        }
    }
    return 2;
}
__device__ __forceinline__ int qkr_pad(int j) { return j + (j >> 3); }

// Pair structure of element j < hd: partner element, pair index p < hd/2, and whether j is the
// pair's first element (out = a·cos − b·sin) or its second (out = b·cos + a·sin).
__device__ __forceinline__ void qkr_pair(int layout, int j, int half, int q4, int& partner, int& p, bool& first) {
    if (layout == ROPE_NEOX_FULL) {
        first = j < half;
        partner = first ? j + half : j - half;
        p = first ? j : j - half;
    } else if (layout == ROPE_GEMMA_HALVES) {
        const int a = j < half ? 0 : 1;
        const int d = j - a * half;
        first = d < q4;
        partner = first ? j + q4 : j - q4;
        p = a * q4 + (first ? d : d - q4);
    } else {
        first = (j & 1) == 0;
        partner = j ^ 1;
        p = j >> 1;
    }
}

template <int N>
__device__ __forceinline__ void lds_vec(const float* p, float (&v)[N]) {  // p 16-byte aligned
#pragma unroll
    for (int e = 0; e < N; e += 4) {
        const float4 a = *reinterpret_cast<const float4*>(p + e);
        v[e] = a.x; v[e + 1] = a.y; v[e + 2] = a.z; v[e + 3] = a.w;
    }
}
template <int N>
__device__ __forceinline__ void lds_vec(const int* p, int (&v)[N]) {
#pragma unroll
    for (int e = 0; e < N; e += 4) {
        const int4 a = *reinterpret_cast<const int4*>(p + e);
        v[e] = a.x; v[e + 1] = a.y; v[e + 2] = a.z; v[e + 3] = a.w;
    }
}

template <typename T>
__device__ __forceinline__ void qk_norm_rope_staged_impl(
    T* __restrict__ qkv, long long n, int heads, int hd, long long ld, long long q_off, long long k_off,
    long long v_off, const int* __restrict__ pos, const float* __restrict__ inv_freq, int layout,
    int first_axis, int flags, const float* __restrict__ q_w, const float* __restrict__ k_w, float eps,
    float q_lo, float q_hi, float k_lo, float k_hi, float v_lo, float v_hi, int active, int unit_floats) {
    constexpr int VW = Vec16<T>::N;
    extern __shared__ float4 qkr_smem4[];
    const int which = qkr_part(active, blockIdx.y);
    const int TX = blockDim.x, tx = threadIdx.x;
    const int cph = hd / VW, hpr = TX / cph, half = hd / 2, q4 = hd / 4;
    const int hs = hd + (hd >> 3) + 1;  // vals floats per head
    const int h0 = tx / cph, jc = tx - h0 * cph, j0 = jc * VW, pj0 = qkr_pad(j0);
    const long long tok = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool tok_ok = tok < n;
    const bool norm = ((flags >> which) & 1) != 0;  // F_NORM_Q, F_NORM_K, F_NORM_V are bits 0, 1, 2
    const bool rope = (flags & F_ROPE) != 0 && which < 2;
    const bool stage = rope && layout != ROPE_INTERLEAVED;
    const float lo = which == 0 ? q_lo : (which == 1 ? k_lo : v_lo);
    const float hi = which == 0 ? q_hi : (which == 1 ? k_hi : v_hi);
    const float* w = norm ? (which == 0 ? q_w : (which == 1 ? k_w : nullptr)) : nullptr;
    const long long off = which == 0 ? q_off : (which == 1 ? k_off : v_off);
    T* base = qkv + (tok_ok ? tok * ld + off : 0);

    float* sA = reinterpret_cast<float*>(qkr_smem4) + threadIdx.y * unit_floats;
    float* sB = sA + hd;
    int* sP = reinterpret_cast<int*>(sB + hd);
    float* cs = reinterpret_cast<float*>(sP + hd);
    float* sn = cs + half;
    float* invs = sn + half;
    float* psum = invs + heads;
    float* vals = psum + heads * cph;

    // 1. loads first (all of this thread's chunks in flight), then the rope table, then staging
    float r[QKR_MAXC][VW];
#pragma unroll
    for (int u = 0; u < QKR_MAXC; ++u) {
        const int hh = h0 + u * hpr;
        if (tok_ok && hh < heads) {
            load_vec16(base + (long long)(hh * cph + jc) * VW, r[u]);
        } else {
#pragma unroll
            for (int e = 0; e < VW; ++e) r[u][e] = 0.0f;
        }
    }
    if (rope && tok_ok) {
        const int px = pos[tok * 2], py = pos[tok * 2 + 1];
        const int pa = first_axis == 0 ? px : py, pb = first_axis == 0 ? py : px;
        for (int p = tx; p < half; p += TX) {
            const int axis = p < q4 ? 0 : 1;
            const int f = p - axis * q4;
            const float ang = (float)(axis == 0 ? pa : pb) * inv_freq[f];
            float s_, c_;
            sincosf(ang, &s_, &c_);
            cs[p] = c_;
            sn[p] = s_;
        }
    }
#pragma unroll
    for (int u = 0; u < QKR_MAXC; ++u) {
        const int hh = h0 + u * hpr;
        if (tok_ok && hh < heads) {
            float ss = 0.0f;
#pragma unroll
            for (int e = 0; e < VW; ++e) {
                const float v = clampf(r[u][e], lo, hi);
                r[u][e] = v;
                ss += v * v;
            }
            if (norm) psum[hh * cph + jc] = ss;
            if (stage) {
                float* vp = vals + hh * hs + pj0;  // pad(j0 + e) = pad(j0) + e for e < VW
#pragma unroll
                for (int e = 0; e < VW; ++e) vp[e] = r[u][e];
            }
        }
    }
    __syncthreads();

    // 2. per-head scales and per-element coefficients
    if (tok_ok) {
        if (norm) {
            for (int hh = tx; hh < heads; hh += TX) {
                float s = 0.0f;
                for (int i = 0; i < cph; ++i) s += psum[hh * cph + i];
                invs[hh] = rsqrtf(s / (float)hd + eps);
            }
        }
        if (rope) {
            for (int j = tx; j < hd; j += TX) {
                int jp, p;
                bool first;
                qkr_pair(layout, j, half, q4, jp, p, first);
                const float wj = w ? w[j] : 1.0f, wp = w ? w[jp] : 1.0f;
                sA[j] = wj * cs[p];
                sB[j] = first ? -(wp * sn[p]) : wp * sn[p];
                sP[j] = qkr_pad(jp);
            }
        } else if (norm) {
            for (int j = tx; j < hd; j += TX) sA[j] = w ? w[j] : 1.0f;
        }
    }
    __syncthreads();

    // 3. outputs, one 16-byte store per chunk
    if (!tok_ok) return;
    float a[VW], b[VW];
    int pp[VW];
    if (rope) {
        lds_vec<VW>(sA + j0, a);
        lds_vec<VW>(sB + j0, b);
        if (stage) lds_vec<VW>(sP + j0, pp);
    } else if (norm) {
        lds_vec<VW>(sA + j0, a);
    }
#pragma unroll
    for (int u = 0; u < QKR_MAXC; ++u) {
        const int hh = h0 + u * hpr;
        if (hh < heads) {
            float o[VW];
            if (rope) {
                const float inv = norm ? invs[hh] : 1.0f;
                const float* vh = vals + hh * hs;
#pragma unroll
                for (int e = 0; e < VW; ++e) {
                    const float xp = stage ? vh[pp[e]] : r[u][e ^ 1];
                    const float t = r[u][e] * a[e] + xp * b[e];
                    o[e] = norm ? t * inv : t;
                }
            } else if (norm) {
                const float inv = invs[hh];
#pragma unroll
                for (int e = 0; e < VW; ++e) o[e] = r[u][e] * inv * a[e];
            } else {
#pragma unroll
                for (int e = 0; e < VW; ++e) o[e] = r[u][e];
            }
            store_vec16(base + (long long)(hh * cph + jc) * VW, o);
        }
    }
}

#define QK_NORM_ROPE_STAGED_ENTRY(T, NAME)                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 3) NAME(                                                 \
        T* qkv, long long n, int heads, int hd, long long ld, long long q_off, long long k_off, long long v_off, \
        const int* pos, const float* inv_freq, int layout, int first_axis, int flags, const float* q_w,         \
        const float* k_w, float eps, float q_lo, float q_hi, float k_lo, float k_hi, float v_lo, float v_hi,    \
        int active, int unit_floats) {                                                                         \
        qk_norm_rope_staged_impl<T>(qkv, n, heads, hd, ld, q_off, k_off, v_off, pos, inv_freq, layout,          \
                                    first_axis, flags, q_w, k_w, eps, q_lo, q_hi, k_lo, k_hi, v_lo, v_hi,       \
                                    active, unit_floats);                                                      \
    }

QK_NORM_ROPE_STAGED_ENTRY(float, qk_norm_rope_staged_f32)
QK_NORM_ROPE_STAGED_ENTRY(bf16, qk_norm_rope_staged_bf16)
QK_NORM_ROPE_STAGED_ENTRY(f16, qk_norm_rope_staged_f16)

