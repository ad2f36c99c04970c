// Non-causal variable-length flash attention (FlashAttention-2 scheme) on mma.sync tensor cores, f32
// accumulation and online softmax; no n x n matrix is ever stored.
// Entry points (m = 16-row m-tiles per warp; 4 warps per block):
//   flash_attn_hd{64,72,96}_m{1,2}_{bf16,f16}: mma.sync m16n8k16 (bf16 or f16 inputs), ldmatrix, cp.async
//     double buffering (sm_80+); 64-key tiles, but 128 at head dim 64 with m = 2 (the table at the entries);
//   flash_attn_sm75_hd{64,72,96}_m1_f16: the Turing kernel (sm_75+): f16 mma.sync m16n8k8 (each k16 step
//     is two of them, same fragments), ldmatrix, plain 16-byte global loads prefetched into registers one
//     key tile ahead, one K/V buffer, within Turing's 64 KB of shared memory per block;
//   flash_attn_f32: the exact f32 path on CUDA cores (any head_dim <= 128), at the end of this file.
// head_dim 72 runs padded to 80 inside shared memory (the pad columns are zero).
#include "common.cuh"

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16-byte async copy global->shared; when !ok the 16 destination bytes are zero-filled and nothing is read.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
    int sz = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(sz));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// One m16n8k16 step as two m16n8k8 (sm_75): the k16 A fragment's registers {0, 1} hold k 0..7 and {2, 3}
// k 8..15 in exactly the k8 A layout, and b0 / b1 are the k8 B fragments of those halves (PTX ISA,
// "Matrix Fragments for mma.m16n8k8" and "...m16n8k16", .f16).
__device__ __forceinline__ void mma_f16_k8x2(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
}

// The element type's tensor-core step (one m16n8k16; PLAIN, the Turing kernel: two m16n8k8), packing and
// pair type, chosen by overload on a null T* (the kernels are templated on T = bf16 or f16).
template <bool PLAIN>
__device__ __forceinline__ void mma_k16(bf16*, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    static_assert(!PLAIN, "the plain (sm_75) kernel is f16 only: bf16 mma.sync needs sm_80");
    mma_bf16(c, a, b0, b1);
}
template <bool PLAIN>
__device__ __forceinline__ void mma_k16(f16*, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (PLAIN) mma_f16_k8x2(c, a, b0, b1);
    else mma_f16(c, a, b0, b1);
}
__device__ __forceinline__ uint32_t pack2(bf16*, float lo, float hi) { return pack_bf16(lo, hi); }
__device__ __forceinline__ uint32_t pack2(f16*, float lo, float hi) { return f16x2_bits(lo, hi); }
__device__ __forceinline__ __nv_bfloat162 pair2(bf16*, float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
__device__ __forceinline__ __half2 pair2(f16*, float lo, float hi) { return __floats2half2_rn(lo, hi); }

// Block: NW warps, each owning MT m-tiles of 16 query rows (BR = 16*NW*MT rows per block); key tiles of BC.
// QS: Q's A fragments are read again from shared memory for every key tile (FlashAttention-2's layout for
// 128-row blocks) instead of being held in registers across the key loop, which frees HDP/16·MT·4 registers
// per thread (48 at head_dim 96 with MT = 2, where the register-resident kernel spills).
// Shared memory: Q [BR][LDS], K [KB][BC][LDS], V [KB][BC][LDS] with LDS = HDP + 8 (row pitch an odd number
// of 16-byte units, so ldmatrix's 8 row addresses hit distinct bank groups); KB = 2 (cp.async double
// buffering) or, PLAIN, 1 (the next tile waits in registers).
// Grid: (ceil(max_seqlen / BR), heads, segments). Element (token t, head h, dim d) of Q is at
// q[t*q_ld + h*HD + d] (same for K, V, O); cu_seqlens[s]..cu_seqlens[s+1] are segment s's tokens.
template <typename T, int HD, int HDP, int NW, int MT, int BC, bool PLAIN, bool QS = false>
__device__ __forceinline__ void flash_attn_body(const T* __restrict__ q, const T* __restrict__ k,
                                                const T* __restrict__ v, T* __restrict__ o, long long q_ld,
                                                long long k_ld, long long v_ld, long long o_ld,
                                                const int* __restrict__ cu_seqlens, float scale_log2) {
    constexpr int BR = 16 * NW * MT;
    constexpr int LDS = HDP + 8;
    constexpr int CH = HDP / 8;   // 16-byte chunks per padded row
    constexpr int CHR = HD / 8;   // chunks holding real data
    constexpr int NT = NW * 32;
    constexpr int KB = PLAIN ? 1 : 2;           // K/V buffers
    constexpr int KV_IT = (BC * CHR + NT - 1) / NT;  // PLAIN: 16-byte chunks of K (and of V) per thread
    static_assert(HD % 8 == 0 && HDP % 16 == 0 && HDP >= HD && BC % 16 == 0, "tile shape");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sK = sQ + BR * LDS;
    T* sV = sK + KB * BC * LDS;

    const int seg = blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seg];
    const int len = cu_seqlens[seg + 1] - start;
    const int q0 = blockIdx.x * BR;
    if (q0 >= len) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    const T* qg = q + (long long)start * q_ld + (long long)head * HD;
    const T* kg = k + (long long)start * k_ld + (long long)head * HD;
    const T* vg = v + (long long)start * v_ld + (long long)head * HD;

    if (CH > CHR) {  // zero the pad chunks of every row of sQ, sK, sV once; the loads never touch them
        for (int r = tid; r < BR + 2 * KB * BC; r += NT)
#pragma unroll
            for (int c = CHR; c < CH; c++) *reinterpret_cast<uint4*>(sQ + r * LDS + c * 8) = make_uint4(0, 0, 0, 0);
    }
    for (int i = tid; i < BR * CHR; i += NT) {
        int r = i / CHR, c = i - (i / CHR) * CHR;
        int row = q0 + r;
        bool ok = row < len;
        if constexpr (PLAIN) {
            *reinterpret_cast<uint4*>(sQ + r * LDS + c * 8) =
                ok ? *reinterpret_cast<const uint4*>(qg + (long long)row * q_ld + c * 8) : make_uint4(0, 0, 0, 0);
        } else {
            cp_async16(sQ + r * LDS + c * 8, qg + (long long)(ok ? row : 0) * q_ld + c * 8, ok);
        }
    }
    auto load_kv = [&](int tile, int buf) {  // cp.async into buffer `buf`
        T* dk = sK + buf * BC * LDS;
        T* dv = sV + buf * BC * LDS;
        for (int i = tid; i < BC * CHR; i += NT) {
            int r = i / CHR, c = i - (i / CHR) * CHR;
            int row = tile * BC + r;
            bool ok = row < len;
            long long rr = ok ? row : 0;
            cp_async16(dk + r * LDS + c * 8, kg + rr * k_ld + c * 8, ok);
            cp_async16(dv + r * LDS + c * 8, vg + rr * v_ld + c * 8, ok);
        }
    };
    uint4 rk[PLAIN ? KV_IT : 1], rv[PLAIN ? KV_IT : 1];  // PLAIN: the next key tile, in flight
    auto fetch_kv = [&](int tile) {
#pragma unroll
        for (int it = 0; it < KV_IT; it++) {
            const int i = tid + it * NT;
            const int r = i / CHR, c = i - (i / CHR) * CHR;
            const int row = tile * BC + r;
            const bool ok = i < BC * CHR && row < len;
            rk[it] = ok ? *reinterpret_cast<const uint4*>(kg + (long long)row * k_ld + c * 8) : make_uint4(0, 0, 0, 0);
            rv[it] = ok ? *reinterpret_cast<const uint4*>(vg + (long long)row * v_ld + c * 8) : make_uint4(0, 0, 0, 0);
        }
    };
    auto store_kv = [&]() {
#pragma unroll
        for (int it = 0; it < KV_IT; it++) {
            const int i = tid + it * NT;
            const int r = i / CHR, c = i - (i / CHR) * CHR;
            if (i < BC * CHR) {
                *reinterpret_cast<uint4*>(sK + r * LDS + c * 8) = rk[it];
                *reinterpret_cast<uint4*>(sV + r * LDS + c * 8) = rv[it];
            }
        }
    };
    if constexpr (PLAIN) {
        fetch_kv(0);
    } else {
        load_kv(0, 0);
        cp_async_commit();
    }

    uint32_t qf[QS ? 1 : MT][QS ? 1 : HDP / 16][4];  // QS: read per key tile below
    float acc[MT][HDP / 8][4];
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int d = 0; d < HDP / 8; d++) acc[mt][d][0] = acc[mt][d][1] = acc[mt][d][2] = acc[mt][d][3] = 0.0f;
        mrow[mt][0] = mrow[mt][1] = -INFINITY;
        lrow[mt][0] = lrow[mt][1] = 0.0f;
    }

    const int ntiles = (len + BC - 1) / BC;
    for (int t = 0; t < ntiles; t++) {
        if constexpr (PLAIN) {
            __syncthreads();  // every warp is done with tile t-1's K and V
            store_kv();
            __syncthreads();  // tile t (and Q) visible to all
            if (t + 1 < ntiles) fetch_kv(t + 1);  // its loads fly under this tile's math
        } else {
            cp_async_wait_all();
            __syncthreads();  // tile t (and Q) visible to all; every warp is done with tile t-1's buffer
            if (t + 1 < ntiles) load_kv(t + 1, (t + 1) & 1);
            cp_async_commit();
        }
        if (!QS && t == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < HDP / 16; kk++)
                    ldsm_x4(qf[QS ? 0 : mt][QS ? 0 : kk],
                            sQ + (warp * MT * 16 + mt * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
        }
        const T* Kb = sK + (KB == 2 ? (t & 1) : 0) * BC * LDS;
        const T* Vb = sV + (KB == 2 ? (t & 1) : 0) * BC * LDS;

        float s[MT][BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < BC / 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HDP / 16; kk++) {
            uint32_t qa[QS ? MT : 1][4];
            if constexpr (QS) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldsm_x4(qa[mt], sQ + (warp * MT * 16 + mt * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
            }
#pragma unroll
            for (int nn = 0; nn < BC / 16; nn++) {
                uint32_t b[4];
                ldsm_x4(b, Kb + (nn * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const uint32_t(&a)[4] = QS ? qa[QS ? mt : 0] : qf[QS ? 0 : mt][QS ? 0 : kk];
                    mma_k16<PLAIN>((T*)nullptr, s[mt][2 * nn], a, b[0], b[1]);
                    mma_k16<PLAIN>((T*)nullptr, s[mt][2 * nn + 1], a, b[2], b[3]);
                }
            }
        }
        const int kbase = t * BC;
        if (kbase + BC > len) {  // mask keys past the segment end (only in the last tile)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < BC / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (kbase + j * 8 + 2 * (lane & 3) + (e & 1) >= len) s[mt][j][e] = -INFINITY;
        }
        // online softmax in the log2 domain; thread rows: lane/4 (e = 0,1) and lane/4 + 8 (e = 2,3)
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < BC / 8; j++) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hr], s[mt][j][2 * hr + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float mnew = fmaxf(mrow[mt][hr], mx * scale_log2);  // finite: every tile holds a valid key
                float corr = exp2f(mrow[mt][hr] - mnew);
                mrow[mt][hr] = mnew;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < BC / 8; j++) {
                    float p0 = exp2f(fmaf(s[mt][j][2 * hr], scale_log2, -mnew));
                    float p1 = exp2f(fmaf(s[mt][j][2 * hr + 1], scale_log2, -mnew));
                    s[mt][j][2 * hr] = p0;
                    s[mt][j][2 * hr + 1] = p1;
                    sum += p0 + p1;
                }
                lrow[mt][hr] = lrow[mt][hr] * corr + sum;
#pragma unroll
                for (int d = 0; d < HDP / 8; d++) {
                    acc[mt][d][2 * hr] *= corr;
                    acc[mt][d][2 * hr + 1] *= corr;
                }
            }
        }
        // O += P V: P (rounded to T) from the S accumulators as A fragments, V via transposed ldmatrix
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                a[mt][0] = pack2((T*)nullptr, s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack2((T*)nullptr, s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack2((T*)nullptr, s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack2((T*)nullptr, s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dn = 0; dn < HDP / 16; dn++) {
                uint32_t b[4];
                ldsm_x4_t(b, Vb + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDS + dn * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_k16<PLAIN>((T*)nullptr, acc[mt][2 * dn], a[mt], b[0], b[1]);
                    mma_k16<PLAIN>((T*)nullptr, acc[mt][2 * dn + 1], a[mt], b[2], b[3]);
                }
            }
        }
    }
    // normalise and store (pairs; pad dims and rows past the segment are skipped)
    T* og = o + (long long)start * o_ld + (long long)head * HD;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float l = lrow[mt][hr];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            float inv = 1.0f / l;
            int row = q0 + warp * MT * 16 + mt * 16 + (lane >> 2) + 8 * hr;
            if (row < len) {
#pragma unroll
                for (int d = 0; d < HD / 8; d++) {
                    auto val = pair2((T*)nullptr, acc[mt][d][2 * hr] * inv, acc[mt][d][2 * hr + 1] * inv);
                    *reinterpret_cast<decltype(val)*>(og + (long long)row * o_ld + d * 8 + 2 * (lane & 3)) = val;
                }
            }
        }
    }
}

// The mma.sync m16n8k16 kernels need sm_80 (bf16 / f16 m16n8k16 mma, cp.async): the compute_75 build (the
// Turing tier) keeps their entry points so every tier's module has the same names, with a trapping body, and
// gpu-core never launches them there. The PLAIN kernels need sm_75 alone.
template <typename T, int HD, int HDP, int NW, int MT, int BC, bool PLAIN, bool QS = false>
__device__ __forceinline__ void flash_attn_impl(const T* __restrict__ q, const T* __restrict__ k,
                                                const T* __restrict__ v, T* __restrict__ o, long long q_ld,
                                                long long k_ld, long long v_ld, long long o_ld,
                                                const int* __restrict__ cu_seqlens, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    if constexpr (!PLAIN) __trap();
    else
#endif
        flash_attn_body<T, HD, HDP, NW, MT, BC, PLAIN, QS>(q, k, v, o, q_ld, k_ld, v_ld, o_ld, cu_seqlens, scale_log2);
}

#define FLASH_ENTRY_T(T, SUFFIX, HD, HDP, MT, BC, QS)                                                        \
    extern "C" __global__ void __launch_bounds__(128) flash_attn_hd##HD##_m##MT##_##SUFFIX(                  \
        const T* q, const T* k, const T* v, T* o, long long q_ld, long long k_ld, long long v_ld,             \
        long long o_ld, const int* cu_seqlens, float scale_log2) {                                          \
        flash_attn_impl<T, HD, HDP, 4, MT, BC, false, QS>(q, k, v, o, q_ld, k_ld, v_ld, o_ld, cu_seqlens,     \
                                                          scale_log2);                                      \
    }
#define FLASH_ENTRY(HD, HDP, MT, BC, QS) \
    FLASH_ENTRY_T(bf16, bf16, HD, HDP, MT, BC, QS) FLASH_ENTRY_T(f16, f16, HD, HDP, MT, BC, QS)

// (head dim, padded, m-tiles per warp, key tile, Q from shared memory). The 128-row kernels' key tile and
// Q placement per head dim are the fastest of kernels/dev/fa_mma_bench.cu's block shapes on the tower
// shapes (H100, compute_80 PTX, 2026-12-07; docs/PERF.md v0.20): FlashAttention-2's 128 × 128 tile at head
// dim 64 (+8–15 % over 128 × 64 with Q in registers), Q from shared memory at head dim 96 (+7–9 %: the
// register-resident Q spilled), head dim 72 unchanged (either change was slower there). gpu-core's launcher
// (ops/flash_attn.rs, `mma_shape`) holds the same table.
FLASH_ENTRY(64, 64, 1, 64, false)
FLASH_ENTRY(64, 64, 2, 128, true)
FLASH_ENTRY(72, 80, 1, 64, false)
FLASH_ENTRY(72, 80, 2, 64, false)
FLASH_ENTRY(96, 96, 1, 64, false)
FLASH_ENTRY(96, 96, 2, 64, true)

// The Turing kernel: f16, k8 mma steps, plain loads, one K/V buffer of SM75_BC keys.
#define SM75_BC 32
#define FLASH_SM75_ENTRY(HD, HDP, MT)                                                                        \
    extern "C" __global__ void __launch_bounds__(128) flash_attn_sm75_hd##HD##_m##MT##_f16(                  \
        const f16* q, const f16* k, const f16* v, f16* o, long long q_ld, long long k_ld, long long v_ld,     \
        long long o_ld, const int* cu_seqlens, float scale_log2) {                                          \
        flash_attn_impl<f16, HD, HDP, 4, MT, SM75_BC, true>(q, k, v, o, q_ld, k_ld, v_ld, o_ld, cu_seqlens,   \
                                                            scale_log2);                                    \
    }

FLASH_SM75_ENTRY(64, 64, 1)
FLASH_SM75_ENTRY(72, 80, 1)
FLASH_SM75_ENTRY(96, 96, 1)

// ---------------------------------------------------------------------------------------------------------
// flash_attn_f32: exact non-causal varlen attention in f32 on CUDA cores (correctness over speed).
// Block: 128 threads for ATT_BQ = 32 query rows of one (head, segment); thread t owns row t/4 and, within it,
// keys j = t%4 + 4i of each 32-key tile and output dims d = t%4 + 4i. Q, K, V tiles are f32 in dynamic
// shared memory with row pitch hd + 1 (odd: the 4 rows read at once fall in distinct banks):
// (ATT_BQ + 2·ATT_BK)·(hd + 1)·4 bytes. Online softmax in f32 (expf); S and P never leave registers
// (P goes from the key-owning to the dim-owning lanes by shuffles). Any ld / offset, 1 <= hd <= 128.
#define ATT_BQ 32
#define ATT_BK 32
#define ATT_T 128
#define ATT_MAXD 32  // output dims per thread: 128 / 4

extern "C" __global__ void __launch_bounds__(ATT_T) flash_attn_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
    long long q_ld, long long k_ld, long long v_ld, long long o_ld, const int* __restrict__ cu_seqlens, int hd,
    float scale) {
    extern __shared__ __align__(16) float att_smem[];
    float* sQ = att_smem;
    const int P = hd + 1;
    float* sK = sQ + ATT_BQ * P;
    float* sV = sK + ATT_BK * P;

    const int seg = blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seg];
    const int len = cu_seqlens[seg + 1] - start;
    const int q0 = blockIdx.x * ATT_BQ;
    if (q0 >= len) return;
    const int tid = threadIdx.x, lane = tid & 31;
    const int r = tid >> 2, sub = tid & 3;

    const float* qg = q + (long long)start * q_ld + (long long)head * hd;
    const float* kg = k + (long long)start * k_ld + (long long)head * hd;
    const float* vg = v + (long long)start * v_ld + (long long)head * hd;

    for (int i = tid; i < ATT_BQ * hd; i += ATT_T) {
        int rr = i / hd, c = i - rr * hd;
        int row = q0 + rr;
        sQ[rr * P + c] = row < len ? qg[(long long)row * q_ld + c] : 0.0f;
    }

    float acc[ATT_MAXD];
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const float* qr = sQ + r * P;

    for (int kb = 0; kb < len; kb += ATT_BK) {
        __syncthreads();  // the previous tile is consumed (and, the first time, nothing to wait for)
        for (int i = tid; i < ATT_BK * hd; i += ATT_T) {
            int rr = i / hd, c = i - rr * hd;
            int row = kb + rr;
            bool ok = row < len;
            sK[rr * P + c] = ok ? kg[(long long)row * k_ld + c] : 0.0f;
            sV[rr * P + c] = ok ? vg[(long long)row * v_ld + c] : 0.0f;
        }
        __syncthreads();
        float s[ATT_BK / 4];
#pragma unroll
        for (int jj = 0; jj < ATT_BK / 4; jj++) s[jj] = 0.0f;
        for (int d = 0; d < hd; d++) {
            float qd = qr[d];
#pragma unroll
            for (int jj = 0; jj < ATT_BK / 4; jj++) s[jj] = fmaf(qd, sK[(sub + 4 * jj) * P + d], s[jj]);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < ATT_BK / 4; jj++) {
            s[jj] = kb + sub + 4 * jj < len ? s[jj] * scale : -INFINITY;
            mx = fmaxf(mx, s[jj]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mnew = fmaxf(m, mx);  // finite: every tile holds a valid key
        float corr = expf(m - mnew);
        m = mnew;
        float sum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < ATT_BK / 4; jj++) {
            s[jj] = expf(s[jj] - mnew);
            sum += s[jj];
        }
        l = l * corr + sum;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) acc[i] *= corr;
#pragma unroll
        for (int j = 0; j < ATT_BK; j++) {
            float pj = __shfl_sync(0xffffffffu, s[j >> 2], (lane & ~3) | (j & 3));
            const float* vr = sV + j * P;
#pragma unroll
            for (int i = 0; i < ATT_MAXD; i++) {
                int d = sub + 4 * i;
                if (d < hd) acc[i] = fmaf(pj, vr[d], acc[i]);
            }
        }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    int row = q0 + r;
    if (row < len) {
        float inv = 1.0f / l;
        float* og = o + (long long)(start + row) * o_ld + (long long)head * hd;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            int d = sub + 4 * i;
            if (d < hd) og[d] = acc[i] * inv;
        }
    }
}
