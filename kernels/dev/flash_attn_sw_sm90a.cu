// Development baseline (not built into gpu-core since v0.3; crates/gpu-core/kernels/flash_attn_sm90a.cu replaced it): the v0.2
// non-causal variable-length flash attention on Hopper warpgroup MMAs (wgmma, sm_90a only: gpu-core
// loads this module when the device runs it and falls back to flash_attn.cu's mma.sync kernels otherwise).
// bf16 in, f32 accumulation and online softmax; no n x n matrix is ever stored.
// Entry points: flash_attn_sw_hd{64,72,96}_w{2,3}_bf16 — w consumer warpgroups of 64 query rows each
// (BR = 64·w rows per block, 128·w threads), key tiles of 64 double-buffered with cp.async. Same
// arguments and element addressing as flash_attn.cu's bf16 kernels.
// Per key tile: S = Q·Kᵀ by HDP/16 wgmma m64n64k16 (Q and K from shared memory); online softmax on the S
// registers (log2 domain, keys past the segment end set to −∞ in the last tile); P packed to bf16 A fragments
// (the S accumulator layout is the A-fragment layout); O += P·V by 4 wgmma m64nHDk16 (V from shared
// memory, N-major). head_dim 72: Q·Kᵀ runs over 80 columns (the pad chunk zeroed), P·V with N = 72.
// kernels/dev/fa_bench.cu is the harness that checked and timed the variants (docs/notes/gpu-core.md).
#include "../../crates/gpu-core/kernels/common.cuh"
#include "../../crates/gpu-core/kernels/wgmma_ops.cuh"

namespace fa_wg {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16_zf(void* dst, const void* src, bool ok) {
    int sz = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(sz));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Writes made through the generic proxy (cp.async, st.shared) become visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
// Shared-memory matrix descriptor: start address, leading and stride byte offsets (swizzle bits 62-63 = 0).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32);
}

template <int N> struct Ss;
template <> struct Ss<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], uint64_t a, uint64_t b, int acc) { wgmma_ss_n64(d, a, b, acc); }
};
template <int N> struct Rs;
template <> struct Rs<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n64(d, a, b); }
};
template <> struct Rs<72> {
    static __device__ __forceinline__ void mma(float (&d)[36], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n72(d, a, b); }
};
template <> struct Rs<96> {
    static __device__ __forceinline__ void mma(float (&d)[48], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n96(d, a, b); }
};

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// All three tiles in the 128-byte-swizzle layout, loaded row-major (each 8 threads fetch one 128-byte
// line and write 8 distinct bank groups). A tile of R rows × HDP columns is NA = ceil(HDP / 64) atom
// columns of R × 128 bytes; chunk c (8 elements) of row r in atom column a sits at
// a·R·128 + r·128 + ((c ^ (r % 8))·16). Q and K are K-major (SBO 1024 between 8-row groups, a k-step
// of 16 elements is +32 bytes inside an atom); V is the N-major B operand (LBO R·128 between atom
// columns, SBO 1024 between 8-key groups).
template <int R, int HD, int NT>
__device__ __forceinline__ void load_sw(unsigned char* dst, const bf16* g, long long ld, int row0, int len, int tid) {
    constexpr int CHR = HD / 8;
    for (int i = tid; i < R * CHR; i += NT) {
        int r = i / CHR, j = i - (i / CHR) * CHR;
        int row = row0 + r;
        bool ok = row < len;
        cp_async16_zf(dst + (j >> 3) * R * 128 + r * 128 + (((j & 7) ^ (r & 7)) << 4), g + (long long)(ok ? row : 0) * ld + j * 8, ok);
    }
}
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return make_desc(addr, lbo, sbo) | (1ull << 62);
}

template <int HD, int HDP, int NWG, int BC>
__device__ __forceinline__ void attn_sw(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                        bf16* __restrict__ o, long long q_ld, long long k_ld, long long v_ld, long long o_ld,
                                        const int* __restrict__ cu_seqlens, float scale_log2) {
    constexpr int BR = 64 * NWG, NT = 128 * NWG;
    constexpr int NA = (HDP + 63) / 64;
    constexpr int QB = NA * BR * 128, TB = NA * BC * 128;
    constexpr int NS = BC / 2, NO = HD / 2;
    static_assert(HD % 8 == 0 && HDP % 16 == 0 && HDP >= HD && BC % 16 == 0, "tile shape");
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* sQ = smem;
    unsigned char* sK = smem + QB;
    unsigned char* sV = sK + 2 * TB;
    const int seg = blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seg];
    const int len = cu_seqlens[seg + 1] - start;
    const int q0 = blockIdx.x * BR;
    if (q0 >= len) return;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const bf16* qg = q + (long long)start * q_ld + (long long)head * HD;
    const bf16* kg = k + (long long)start * k_ld + (long long)head * HD;
    const bf16* vg = v + (long long)start * v_ld + (long long)head * HD;
    if (HDP > HD) {  // the zero chunks Q·Kᵀ reads past HD (head dim 72: chunk 1 of atom column 1)
        constexpr int C0 = HD / 8, C1 = HDP / 8;
        for (int r = tid; r < BR + 2 * BC; r += NT) {
            unsigned char* base = r < BR ? sQ + r * 128 : sK + (r - BR) / BC * TB + ((r - BR) % BC) * 128;
            const int rr = r < BR ? BR : BC;
#pragma unroll
            for (int j = C0; j < C1; j++)
                *reinterpret_cast<uint4*>(base + (j >> 3) * rr * 128 + (((j & 7) ^ (r & 7)) << 4)) = make_uint4(0, 0, 0, 0);
        }
    }
    load_sw<BR, HD, NT>(sQ, qg, q_ld, q0, len, tid);
    load_sw<BC, HD, NT>(sK, kg, k_ld, 0, len, tid);
    load_sw<BC, HD, NT>(sV, vg, v_ld, 0, len, tid);
    cp_async_commit();
    float acc[NO];
#pragma unroll
    for (int i = 0; i < NO; i++) acc[i] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const int ntiles = (len + BC - 1) / BC;
    const int kcol = 2 * (lane & 3);
    for (int t = 0; t < ntiles; t++) {
        const int buf = t & 1;
        cp_async_wait_all();
        fence_async_smem();
        __syncthreads();
        if (t + 1 < ntiles) {
            load_sw<BC, HD, NT>(sK + (buf ^ 1) * TB, kg, k_ld, (t + 1) * BC, len, tid);
            load_sw<BC, HD, NT>(sV + (buf ^ 1) * TB, vg, v_ld, (t + 1) * BC, len, tid);
        }
        cp_async_commit();
        float s[NS];
        const uint32_t qa = smem_u32(sQ) + wg * 64 * 128, ka = smem_u32(sK + buf * TB);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HDP / 16; kk++) {
            const uint32_t off_q = (kk >> 2) * BR * 128 + (kk & 3) * 32, off_k = (kk >> 2) * BC * 128 + (kk & 3) * 32;
            Ss<BC>::mma(s, desc_sw128(qa + off_q, 16, 1024), desc_sw128(ka + off_k, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait0();
        const int lim = len - t * BC;  // valid keys in this tile (>= BC except in the last one)
        if (lim < BC) {  // mask the keys past the segment end (last tile only; S is not in flight)
#pragma unroll
            for (int j = 0; j < BC / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (j * 8 + kcol + (e & 1) >= lim) s[j * 4 + e] = -INFINITY;
        }
        float mnew[2], corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < BC / 8; j++) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * hr], s[j * 4 + 2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mnew[hr] = fmaxf(mrow[hr], mx * scale_log2);  // finite: every tile holds a valid key
            corr[hr] = ex2(mrow[hr] - mnew[hr]);
            mrow[hr] = mnew[hr];
        }
        uint32_t pa[BC / 16][4];
#pragma unroll
        for (int j = 0; j < BC / 8; j++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = ex2(fmaf(s[j * 4 + e], scale_log2, -mnew[e >> 1]));
                sum[e >> 1] += p[e];
            }
            pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(p[0], p[1]);
            pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            lrow[hr] = lrow[hr] * corr[hr] + sum[hr];
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                acc[j * 4 + 2 * hr] *= corr[hr];
                acc[j * 4 + 2 * hr + 1] *= corr[hr];
            }
        }
        const uint32_t va = smem_u32(sV + buf * TB);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) Rs<HD>::mma(acc, pa[kk], desc_sw128(va + kk * 2048, BC * 128, 1024));
        wgmma_commit();
        wgmma_wait0();
    }
    bf16* og = o + (long long)start * o_ld + (long long)head * HD;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float l = lrow[hr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = 1.0f / l;
        int row = q0 + wg * 64 + warp * 16 + (lane >> 2) + 8 * hr;
        if (row < len) {
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                __nv_bfloat162 val = __floats2bfloat162_rn(acc[j * 4 + 2 * hr] * inv, acc[j * 4 + 2 * hr + 1] * inv);
                *reinterpret_cast<__nv_bfloat162*>(og + (long long)row * o_ld + j * 8 + 2 * (lane & 3)) = val;
            }
        }
    }
}
}  // namespace fa_wg

#define FLASH_SW_ENTRY(HD, HDP, NWG)                                                                                \
    extern "C" __global__ void __launch_bounds__(128 * NWG, (NWG == 2 ? 2 : 1)) flash_attn_sw_hd##HD##_w##NWG##_bf16( \
        const bf16* q, const bf16* k, const bf16* v, bf16* o, long long q_ld, long long k_ld, long long v_ld,       \
        long long o_ld, const int* cu_seqlens, float scale_log2) {                                                \
        fa_wg::attn_sw<HD, HDP, NWG, 64>(q, k, v, o, q_ld, k_ld, v_ld, o_ld, cu_seqlens, scale_log2);              \
    }

FLASH_SW_ENTRY(64, 64, 2)
FLASH_SW_ENTRY(64, 64, 3)
FLASH_SW_ENTRY(72, 80, 2)
FLASH_SW_ENTRY(72, 80, 3)
FLASH_SW_ENTRY(96, 96, 2)
FLASH_SW_ENTRY(96, 96, 3)
