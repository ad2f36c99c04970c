// Development harness (not part of gpu-core): qk_norm_rope at the towers' shapes, the production staged entry
// (crates/gpu-core/kernels/rope.cu, launched as crates/gpu-core/src/ops/rope.rs does) against a per-head variant.
// Issue 43: in gemma4's tower at batch 1 the staged entry moves 33 MB in 21 µs per layer (1.6 TB/s; docs/PERF.md
// v0.24), where the row kernels move 2–2.9 TB/s.
//   staged    the production entry: a (token, part) unit per threadIdx.y, 16-byte chunks, values staged through
//             shared memory for the rope partners, three phases with block barriers
//   per-head  one thread per (token, part, head): the head's hd values in registers from one contiguous 16-byte
//             load sequence to the stores; norm, clamp and rope pairs inside the thread; only the token's cos/sin
//             table in shared memory (one barrier). The same arithmetic in the same order as the staged entry.
//   packed    per-head with the head kept as packed bf16 words (half the registers), unpacked where used
//   lanes16   16 lanes per head, one 16-byte chunk each (coalesced as the staged entry), partners and chunk sums
//             by shuffles instead of shared memory, one block per token
// Every variant's output must equal the staged entry's bitwise (in place on a fresh copy of the same qkv).
// Timed as 64 launches between two events (per-launch mean, median of 15 runs), "cold" rotating over buffer
// sets of > 200 MB together, "hot" on one set; beside them a copy of the same bytes (read and write the parts).
// Build: nvcc -gencode=arch=compute_90,code=sm_90 -O3 -std=c++17 kernels/dev/rope_rows_bench.cu
#include "../../crates/gpu-core/kernels/rope.cu"
#include "dev_common.cuh"
#include <cstring>
#include <string>

// The token's cos / sin per pair p < half into cs / sn, by threads tid, tid + stride, … (the staged entry's angles).
__device__ __forceinline__ void qkr_token_angles(const int* __restrict__ pos, const float* __restrict__ inv_freq,
                                                 long long tok, int first_axis, int half, int q4, int tid, int stride,
                                                 float* cs, float* sn) {
    const int px = pos[tok * 2], py = pos[tok * 2 + 1];
    const int pa = first_axis == 0 ? px : py, pb = first_axis == 0 ? py : px;
    for (int p = tid; p < half; p += stride) {
        const int axis = p < q4 ? 0 : 1;
        const int f = p - axis * q4;
        const float ang = (float)(axis == 0 ? pa : pb) * inv_freq[f];
        float s_, c_;
        sincosf(ang, &s_, &c_);
        cs[p] = c_;
        sn[p] = s_;
    }
}

// What the staged entry does to part `which` (q, k or v): norm and rope flags, clamp, norm weight, column offset.
struct QkrPart {
    bool norm, rope;
    float lo, hi;
    const float* w;
    long long off;
};
__device__ __forceinline__ QkrPart qkr_part_params(int which, int flags, long long q_off, long long k_off,
                                                   long long v_off, const float* q_w, const float* k_w, float q_lo,
                                                   float q_hi, float k_lo, float k_hi, float v_lo, float v_hi) {
    QkrPart pp;
    pp.norm = ((flags >> which) & 1) != 0;  // F_NORM_Q, F_NORM_K, F_NORM_V are bits 0, 1, 2
    pp.rope = (flags & F_ROPE) != 0 && which < 2;
    pp.lo = which == 0 ? q_lo : (which == 1 ? k_lo : v_lo);
    pp.hi = which == 0 ? q_hi : (which == 1 ? k_hi : v_hi);
    pp.w = pp.norm ? (which == 0 ? q_w : (which == 1 ? k_w : nullptr)) : nullptr;
    pp.off = which == 0 ? q_off : (which == 1 ? k_off : v_off);
    return pp;
}

// One thread per (token, part, head); block (heads·parts, TY): threadIdx.x = head + heads·k for the k-th active
// part, threadIdx.y = token in the block. HD and LAYOUT at compile time (the pairs are then fixed register pairs).
template <typename T, int HD, int LAYOUT>
__global__ void __launch_bounds__(256) qkr_per_head(T* __restrict__ qkv, long long n, int heads, long long ld,
                                                    long long q_off, long long k_off, long long v_off,
                                                    const int* __restrict__ pos, const float* __restrict__ inv_freq,
                                                    int first_axis, int flags, const float* __restrict__ q_w,
                                                    const float* __restrict__ k_w, float eps, float q_lo, float q_hi,
                                                    float k_lo, float k_hi, float v_lo, float v_hi, int active) {
    constexpr int VW = Vec16<T>::N, CPH = HD / VW, HALF = HD / 2, Q4 = HD / 4;
    __shared__ float cs_s[8][HALF], sn_s[8][HALF];
    const int ty = threadIdx.y;
    const long long tok = (long long)blockIdx.x * blockDim.y + ty;
    const bool tok_ok = tok < n;
    const bool rope_any = (flags & F_ROPE) != 0;
    if (rope_any) {  // the token's cos / sin per pair, shared by every head and by q and k
        if (tok_ok) qkr_token_angles(pos, inv_freq, tok, first_axis, HALF, Q4, threadIdx.x, blockDim.x, cs_s[ty], sn_s[ty]);
        __syncthreads();
    }
    const int head = threadIdx.x % heads;
    const int which = qkr_part(active, threadIdx.x / heads);
    if (!tok_ok) return;
    const QkrPart pp = qkr_part_params(which, flags, q_off, k_off, v_off, q_w, k_w, q_lo, q_hi, k_lo, k_hi, v_lo, v_hi);
    const bool norm = pp.norm, rope = pp.rope;
    const float lo = pp.lo, hi = pp.hi;
    const float* w = pp.w;
    const long long off = pp.off;
    T* base = qkv + tok * ld + off + (long long)head * HD;
    float r[HD];
#pragma unroll
    for (int c = 0; c < CPH; ++c) {
        float v[VW];
        load_vec16(base + c * VW, v);
#pragma unroll
        for (int e = 0; e < VW; ++e) r[c * VW + e] = v[e];
    }
    // clamp; sums of squares per 16-byte chunk, then over the chunks in order (the staged entry's order)
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CPH; ++c) {
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < VW; ++e) {
            const float v = clampf(r[c * VW + e], lo, hi);
            r[c * VW + e] = v;
            ss += v * v;
        }
        s += ss;
    }
    const float inv = norm ? rsqrtf(s / (float)HD + eps) : 1.0f;
    if (rope) {
#pragma unroll
        for (int j = 0; j < HD; ++j) {
            int jp, p;
            bool first;
            qkr_pair(LAYOUT, j, HALF, Q4, jp, p, first);
            if (!first) continue;  // each pair once, from its first element
            const float c_ = cs_s[ty][p], s_ = sn_s[ty][p];
            const float wj = w ? w[j] : 1.0f, wp = w ? w[jp] : 1.0f;
            const float a0 = wj * c_, b0 = -(wp * s_);  // element j:  A[j] = w[j]·cos, B[j] = −w[jp]·sin
            const float a1 = wp * c_, b1 = wj * s_;     // element jp: A[jp] = w[jp]·cos, B[jp] = w[j]·sin
            const float x0 = r[j], x1 = r[jp];
            const float t0 = x0 * a0 + x1 * b0, t1 = x1 * a1 + x0 * b1;
            r[j] = norm ? t0 * inv : t0;
            r[jp] = norm ? t1 * inv : t1;
        }
    } else if (norm) {
#pragma unroll
        for (int j = 0; j < HD; ++j) r[j] = r[j] * inv * (w ? w[j] : 1.0f);
    }
#pragma unroll
    for (int c = 0; c < CPH; ++c) {
        float o[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) o[e] = r[c * VW + e];
        store_vec16(base + c * VW, o);
    }
}

// The per-head variant with the head kept as its packed bf16 words (HD/2 32-bit registers instead of HD floats):
// each value is unpacked (and clamped) where it is used, each pair's two outputs packed back in place.
__device__ __forceinline__ float bf_get(const uint32_t* w, int j) {
    return (j & 1) ? bf16_hi_f32(w[j >> 1]) : bf16_lo_f32(w[j >> 1]);
}
__device__ __forceinline__ void bf_set(uint32_t* w, int j, float v) {
    const uint32_t b = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v));
    w[j >> 1] = (j & 1) ? ((w[j >> 1] & 0x0000ffffu) | (b << 16)) : ((w[j >> 1] & 0xffff0000u) | b);
}
template <int HD, int LAYOUT>
__global__ void __launch_bounds__(256) qkr_per_head_packed(bf16* __restrict__ qkv, long long n, int heads, long long ld,
                                                           long long q_off, long long k_off, long long v_off,
                                                           const int* __restrict__ pos, const float* __restrict__ inv_freq,
                                                           int first_axis, int flags, const float* __restrict__ q_w,
                                                           const float* __restrict__ k_w, float eps, float q_lo,
                                                           float q_hi, float k_lo, float k_hi, float v_lo, float v_hi,
                                                           int active) {
    constexpr int VW = 8, CPH = HD / VW, HALF = HD / 2, Q4 = HD / 4;
    __shared__ float cs_s[8][HALF], sn_s[8][HALF];
    const int ty = threadIdx.y;
    const long long tok = (long long)blockIdx.x * blockDim.y + ty;
    const bool tok_ok = tok < n;
    const bool rope_any = (flags & F_ROPE) != 0;
    if (rope_any) {  // the token's cos / sin per pair, shared by every head and by q and k
        if (tok_ok) qkr_token_angles(pos, inv_freq, tok, first_axis, HALF, Q4, threadIdx.x, blockDim.x, cs_s[ty], sn_s[ty]);
        __syncthreads();
    }
    const int head = threadIdx.x % heads;
    const int which = qkr_part(active, threadIdx.x / heads);
    if (!tok_ok) return;
    const QkrPart pp = qkr_part_params(which, flags, q_off, k_off, v_off, q_w, k_w, q_lo, q_hi, k_lo, k_hi, v_lo, v_hi);
    const bool norm = pp.norm, rope = pp.rope;
    const float lo = pp.lo, hi = pp.hi;
    const float* w = pp.w;
    const long long off = pp.off;
    uint4* base = reinterpret_cast<uint4*>(qkv + tok * ld + off + (long long)head * HD);
    uint32_t q[HD / 2];
#pragma unroll
    for (int c = 0; c < CPH; ++c) {
        const uint4 a = base[c];
        q[c * 4] = a.x; q[c * 4 + 1] = a.y; q[c * 4 + 2] = a.z; q[c * 4 + 3] = a.w;
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CPH; ++c) {
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < VW; ++e) {
            const float v = clampf(bf_get(q, c * VW + e), lo, hi);
            ss += v * v;
        }
        s += ss;
    }
    const float inv = norm ? rsqrtf(s / (float)HD + eps) : 1.0f;
    if (rope) {
#pragma unroll
        for (int j = 0; j < HD; ++j) {
            int jp, p;
            bool first;
            qkr_pair(LAYOUT, j, HALF, Q4, jp, p, first);
            if (!first) continue;
            const float c_ = cs_s[ty][p], s_ = sn_s[ty][p];
            const float wj = w ? w[j] : 1.0f, wp = w ? w[jp] : 1.0f;
            const float a0 = wj * c_, b0 = -(wp * s_);
            const float a1 = wp * c_, b1 = wj * s_;
            const float x0 = clampf(bf_get(q, j), lo, hi), x1 = clampf(bf_get(q, jp), lo, hi);
            const float t0 = x0 * a0 + x1 * b0, t1 = x1 * a1 + x0 * b1;
            bf_set(q, j, norm ? t0 * inv : t0);
            bf_set(q, jp, norm ? t1 * inv : t1);
        }
    } else {
#pragma unroll
        for (int j = 0; j < HD; ++j) {
            const float v = clampf(bf_get(q, j), lo, hi);
            bf_set(q, j, norm ? v * inv * (w ? w[j] : 1.0f) : v);
        }
    }
#pragma unroll
    for (int c = 0; c < CPH; ++c) base[c] = make_uint4(q[c * 4], q[c * 4 + 1], q[c * 4 + 2], q[c * 4 + 3]);
}

// Sixteen lanes per (token, part, head), lane c owning the head's 16-byte chunk c (c < hd/8; the rest idle): loads
// and stores coalesced as in the staged entry, but the chunk sums and the rope partners travel by shuffles within
// the 16 lanes instead of through shared memory, and the chunk sums are added in chunk order (the staged entry's
// order). One block per token (parts·heads·16 threads): its cos / sin table in shared memory behind one barrier.
template <int HD, int LAYOUT>
__global__ void __launch_bounds__(1024) qkr_lanes16(bf16* __restrict__ qkv, long long n, int heads, long long ld,
                                                    long long q_off, long long k_off, long long v_off,
                                                    const int* __restrict__ pos, const float* __restrict__ inv_freq,
                                                    int first_axis, int flags, const float* __restrict__ q_w,
                                                    const float* __restrict__ k_w, float eps, float q_lo, float q_hi,
                                                    float k_lo, float k_hi, float v_lo, float v_hi, int active) {
    constexpr int VW = 8, CPH = HD / VW, HALF = HD / 2, Q4 = HD / 4;
    constexpr int D = LAYOUT == ROPE_GEMMA_HALVES ? Q4 : HALF;  // partner distance (first -> second)
    constexpr int DC = D / VW, DE = D % VW;
    static_assert(CPH <= 16, "one chunk per lane of 16");
    __shared__ float cs_s[HALF], sn_s[HALF];
    const long long tok = blockIdx.x;
    const bool rope_any = (flags & F_ROPE) != 0;
    if (rope_any) {
        qkr_token_angles(pos, inv_freq, tok, first_axis, HALF, Q4, threadIdx.x, blockDim.x, cs_s, sn_s);
        __syncthreads();
    }
    const int unit = threadIdx.x >> 4, c = threadIdx.x & 15;
    const int head = unit % heads;
    const int which = qkr_part(active, unit / heads);
    const QkrPart pp = qkr_part_params(which, flags, q_off, k_off, v_off, q_w, k_w, q_lo, q_hi, k_lo, k_hi, v_lo, v_hi);
    const bool norm = pp.norm, rope = pp.rope;
    const float lo = pp.lo, hi = pp.hi;
    const float* w = pp.w;
    const long long off = pp.off;
    bf16* hb = qkv + tok * ld + off + (long long)head * HD;
    const bool mine = c < CPH;
    float r[VW];
    if (mine) {
        load_vec16(hb + c * VW, r);
    } else {
#pragma unroll
        for (int e = 0; e < VW; ++e) r[e] = 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < VW; ++e) {
        r[e] = clampf(r[e], lo, hi);
        ss += r[e] * r[e];
    }
    // the head's sum in chunk order, as the staged entry adds its per-chunk sums
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CPH; ++k) s += __shfl_sync(0xffffffffu, ss, k, 16);
    const float inv = norm ? rsqrtf(s / (float)HD + eps) : 1.0f;
    float o[VW];
    if (rope) {
        float up[VW], dn[VW];  // the values D elements after and before each of this lane's elements
#pragma unroll
        for (int e = 0; e < VW; ++e) {
            up[e] = e + DE < VW ? __shfl_down_sync(0xffffffffu, r[(e + DE) % VW], DC, 16)
                                : __shfl_down_sync(0xffffffffu, r[(e + DE) % VW], DC + 1, 16);
            dn[e] = e >= DE ? __shfl_up_sync(0xffffffffu, r[(e - DE + VW) % VW], DC, 16)
                            : __shfl_up_sync(0xffffffffu, r[(e - DE + VW) % VW], DC + 1, 16);
        }
#pragma unroll
        for (int e = 0; e < VW; ++e) {
            const int j = c * VW + e;
            int jp, p;
            bool first;
            qkr_pair(LAYOUT, mine ? j : 0, HALF, Q4, jp, p, first);
            const float c_ = cs_s[p], s_ = sn_s[p];
            const float wj = w && mine ? w[j] : 1.0f, wp = w && mine ? w[jp] : 1.0f;
            const float a = wj * c_, b = first ? -(wp * s_) : wp * s_;
            const float xp = first ? up[e] : dn[e];
            const float t = r[e] * a + xp * b;
            o[e] = norm ? t * inv : t;
        }
    } else if (norm) {
#pragma unroll
        for (int e = 0; e < VW; ++e) o[e] = r[e] * inv * (w && mine ? w[c * VW + e] : 1.0f);
    } else {
#pragma unroll
        for (int e = 0; e < VW; ++e) o[e] = r[e];
    }
    if (mine) store_vec16(hb + c * VW, o);
}

// The floor: read and write the active parts' bytes once, no arithmetic.
__global__ void copy_parts(bf16* __restrict__ qkv, long long n16, long long row16, long long part16, int parts) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) {
        const long long tok = i / (part16 * parts), k = i - tok * part16 * parts;
        uint4* p = reinterpret_cast<uint4*>(qkv) + tok * row16 + k;
        uint4 v = *p;
        v.x ^= 0x00010001u;
        *p = v;
    }
}

struct Case {
    const char* what;
    long long n;
    int heads, hd, layout, flags;
};

int main() {
    const int REPS = 64;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    // gemma4: q, k and v normed (v weightless), halves rope; glm5_next: q, k normed, full NeoX rope; step3p7
    // (HF weights): rope only, full NeoX
    const Case cases[] = {
        {"gemma4 b1 (2394 tokens, 16 x 72)", 2394, 16, 72, ROPE_GEMMA_HALVES, F_NORM_Q | F_NORM_K | F_NORM_V | F_ROPE},
        {"gemma4 b8", 19152, 16, 72, ROPE_GEMMA_HALVES, F_NORM_Q | F_NORM_K | F_NORM_V | F_ROPE},
        {"glm5_next 72x72 b1 (5184, 24 x 64)", 5184, 24, 64, ROPE_NEOX_FULL, F_NORM_Q | F_NORM_K | F_ROPE},
        {"step3p7 728 b1 (2704, 16 x 96)", 2704, 16, 96, ROPE_NEOX_FULL, F_ROPE},
    };
    printf("| case | kernel | block | cold us | cold TB/s | hot us | vs staged (cold) | bitwise |\n"
           "|---|---|---|---|---|---|---|---|\n");
    for (const Case& c : cases) {
        const int heads = c.heads, hd = c.hd, width = heads * hd;
        const long long ld = 3LL * width, n = c.n;
        const size_t elems = (size_t)n * ld;
        // active parts: those with a norm, rope (q, k) or a clamp (none here)
        int active = 0;
        for (int w = 0; w < 3; ++w)
            if (((c.flags >> w) & 1) || ((c.flags & F_ROPE) && w < 2)) active |= 1 << w;
        const int parts = __builtin_popcount(active);
        const double bytes = 2.0 * (double)n * parts * width * 2;  // read + write, bf16
        std::vector<uint16_t> h(elems);
        uint32_t s = 777;
        for (size_t i = 0; i < elems; i++) {
            s = s * 1664525u + 1013904223u;
            const float v = ((s >> 8) / 16777216.0f - 0.5f) * 6.0f;
            uint32_t u;
            memcpy(&u, &v, 4);
            h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
        }
        std::vector<int> hp(n * 2);
        const int gw = (int)sqrt((double)n) + 1;
        for (long long t = 0; t < n; t++) {
            hp[t * 2] = (int)(t % gw);
            hp[t * 2 + 1] = (int)(t / gw);
        }
        std::vector<float> hf(hd / 4), hw(hd);
        for (int i = 0; i < hd / 4; i++) hf[i] = powf(100.0f, -(float)i / (hd / 4));
        int *pos;
        float *freq, *qw, *kw;
        CK(cudaMalloc(&pos, n * 2 * 4));
        CK(cudaMalloc(&freq, hd));
        CK(cudaMalloc(&qw, hd * 4));
        CK(cudaMalloc(&kw, hd * 4));
        CK(cudaMemcpy(pos, hp.data(), n * 2 * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(freq, hf.data(), hd, cudaMemcpyHostToDevice));
        for (int i = 0; i < hd; i++) hw[i] = 1.0f + 0.01f * (i % 13);
        CK(cudaMemcpy(qw, hw.data(), hd * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < hd; i++) hw[i] = 0.8f + 0.02f * (i % 7);
        CK(cudaMemcpy(kw, hw.data(), hd * 4, cudaMemcpyHostToDevice));
        const int nset = std::max(1, std::min(8, (int)(200e6 / (elems * 2.0)) + 1));
        std::vector<bf16*> sets(nset);
        for (auto& b : sets) CK(cudaMalloc(&b, elems * 2));
        auto reset = [&]() {
            for (auto& b : sets) CK(cudaMemcpy(b, h.data(), elems * 2, cudaMemcpyHostToDevice));
        };
        const float INF = INFINITY;
        const long long qo = 0, ko = width, vo = 2LL * width;
        // the staged entry's launch, as ops/rope.rs computes it
        const int vw = 8, tx = (heads + QKR_MAXC - 1) / QKR_MAXC * (hd / vw);
        const int unit = ((3 * hd + hd + heads + heads * (hd / vw) + heads * (hd + hd / 8 + 1)) + 3) / 4 * 4;
        const int tyy = std::min(256 / tx, 48 * 1024 / (unit * 4));
        const int sblocks = (int)((n + tyy - 1) / tyy);
        struct V {
            std::string name, block;
            std::function<void(bf16*)> f;
        };
        std::vector<V> vs;
        vs.push_back({"qk_norm_rope_staged_bf16", std::to_string(tx) + "x" + std::to_string(tyy), [=](bf16* q) {
                          qk_norm_rope_staged_bf16<<<dim3(sblocks, parts), dim3(tx, tyy), tyy * unit * 4>>>(
                              q, n, heads, hd, ld, qo, ko, vo, pos, freq, c.layout, 0, c.flags, qw, kw, 1e-6f, -INF, INF,
                              -INF, INF, -INF, INF, active, unit);
                      }});
        const int px = heads * parts, pty = std::min(8, 256 / px);
        const int pblocks = (int)((n + pty - 1) / pty);
        auto per_head = [&](auto kern, const char* name) {
            vs.push_back({name, std::to_string(px) + "x" + std::to_string(pty), [=](bf16* q) {
                              kern<<<pblocks, dim3(px, pty)>>>(q, n, heads, ld, qo, ko, vo, pos, freq, 0, c.flags, qw, kw,
                                                               1e-6f, -INF, INF, -INF, INF, -INF, INF, active);
                          }});
        };
        if (hd == 72 && c.layout == ROPE_GEMMA_HALVES) per_head(qkr_per_head<bf16, 72, ROPE_GEMMA_HALVES>, "per-head thread");
        if (hd == 64 && c.layout == ROPE_NEOX_FULL) per_head(qkr_per_head<bf16, 64, ROPE_NEOX_FULL>, "per-head thread");
        if (hd == 96 && c.layout == ROPE_NEOX_FULL) per_head(qkr_per_head<bf16, 96, ROPE_NEOX_FULL>, "per-head thread");
        if (hd == 72 && c.layout == ROPE_GEMMA_HALVES) per_head(qkr_per_head_packed<72, ROPE_GEMMA_HALVES>, "per-head, packed");
        if (hd == 64 && c.layout == ROPE_NEOX_FULL) per_head(qkr_per_head_packed<64, ROPE_NEOX_FULL>, "per-head, packed");
        if (hd == 96 && c.layout == ROPE_NEOX_FULL) per_head(qkr_per_head_packed<96, ROPE_NEOX_FULL>, "per-head, packed");
        {
            const int lt = heads * parts * 16;
            auto lanes = [&](auto kern) {
                vs.push_back({"16 lanes per head", std::to_string(lt), [=](bf16* q) {
                                  kern<<<(unsigned)n, lt>>>(q, n, heads, ld, qo, ko, vo, pos, freq, 0, c.flags, qw, kw,
                                                            1e-6f, -INF, INF, -INF, INF, -INF, INF, active);
                              }});
            };
            if (lt <= 1024 && hd == 72 && c.layout == ROPE_GEMMA_HALVES) lanes(qkr_lanes16<72, ROPE_GEMMA_HALVES>);
            if (lt <= 1024 && hd == 64 && c.layout == ROPE_NEOX_FULL) lanes(qkr_lanes16<64, ROPE_NEOX_FULL>);
            if (lt <= 1024 && hd == 96 && c.layout == ROPE_NEOX_FULL) lanes(qkr_lanes16<96, ROPE_NEOX_FULL>);
        }
        std::vector<uint16_t> ref(elems), got(elems);
        std::vector<std::string> verdict(vs.size(), "(reference)");
        for (size_t k = 0; k < vs.size(); k++) {
            reset();
            vs[k].f(sets[0]);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(k ? got.data() : ref.data(), sets[0], elems * 2, cudaMemcpyDeviceToHost));
            if (k) {
                size_t bad = 0;
                for (size_t i = 0; i < elems; i++) bad += ref[i] != got[i];
                verdict[k] = bad ? "FAIL " + std::to_string(bad) : "equal";
            }
        }
        const long long part16 = width / 8, row16 = ld / 8;
        vs.push_back({"copy, same bytes", "256", [=](bf16* q) {
                          copy_parts<<<prop.multiProcessorCount * 8, 256>>>(q, n * part16 * parts, row16, part16, parts);
                      }});
        verdict.push_back("-");
        auto timed = [&](const V& v, bool cold) {
            std::vector<float> ts;
            for (int r = 0; r < 15; r++) {
                ts.push_back(event_median_ms(
                                 [&]() {
                                     for (int i = 0; i < REPS; i++) v.f(sets[cold ? i % nset : 0]);
                                 },
                                 1) *
                             1000.0f / REPS);
            }
            return median(ts);
        };
        float ref_t = 0;
        for (size_t k = 0; k < vs.size(); k++) {
            reset();  // bounded values again (repeated in-place norms stay finite, rope is a rotation)
            const float cl = timed(vs[k], true), ht = timed(vs[k], false);
            if (k == 0) ref_t = cl;
            printf("| %s | %s | %s | %.2f | %.2f | %.2f | %.2fx | %s |\n", c.what, vs[k].name.c_str(), vs[k].block.c_str(),
                   cl, bytes / (cl * 1e-6) / 1e12, ht, ref_t / cl, verdict[k].c_str());
        }
        for (auto& b : sets) CK(cudaFree(b));
        CK(cudaFree(pos));
        CK(cudaFree(freq));
        CK(cudaFree(qw));
        CK(cudaFree(kw));
    }
    return 0;
}
