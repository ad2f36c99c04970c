// Warp-specialised non-causal variable-length flash attention on Hopper (sm_90a: wgmma, TMA, mbarrier,
// setmaxnreg). bf16 in, f32 accumulation and online softmax, bf16 out; no n x n matrix is ever stored.
//
// Block = 1 producer warpgroup + C consumer warpgroups of 64 query rows each (BM = 64·C rows of one
// (segment, head)); grid (ceil(max_seqlen / BM), heads, segments), 128·(C + 1) threads, 1 block per SM.
// - Producer (warpgroup 0, 24 registers): one thread issues the bulk tensor copies (TMA) of the Q block
//   once and of every key tile (BN keys) of K and V into an ST-stage ring; each stage and operand has a
//   "full" mbarrier (transaction bytes) and an "empty" one the consumer warps arrive on (K once S = Q·Kᵀ
//   is done, V once P·V is).
// - Consumers: S = Q·Kᵀ by wgmma (both operands from shared memory), online softmax in registers (log2
//   domain, ex2.approx), P packed to bf16 A fragments, O += P·V by wgmma with A from registers. Within a
//   warpgroup the softmax of tile j overlaps the P·V product of tile j−1 (issued together with S_j); with
//   PP = 1 the consumer warpgroups also take turns issuing their products (named barriers), so one's
//   softmax runs under another's matrix work.
// Operands are read through three 3-D tensor maps {head_dim, heads, tokens} (q, k, v; box {64, 1, rows},
// 128-byte swizzle): columns past head_dim and tokens past the pass read as zeros, so head dim 72 gets its
// zero pad (Q·Kᵀ over 80 columns) and the last tile its zero rows from the copy engine itself. Keys past the
// segment end are masked to −∞ in the last tile; rows past it are computed and not stored.
// Shared layout (all 1024-byte aligned): Q [NA][BM][128 B], K and V [ST][NA][BN][128 B], barriers; chunk c
// (8 elements) of row r sits at r·128 + ((c ^ r%8)·16) inside an atom column of 64 elements (the TMA
// 128-byte swizzle), NA = ceil(HDP / 64) atom columns.
#include "common.cuh"
#include "sm90a.cuh"
#include "wgmma_ops.cuh"

namespace fa_ws {
using namespace sm90;

// Pins register values in program order around the asynchronous wgmma waits: the compiler may not move
// the arithmetic that reads or writes `r` across this point (otherwise it hoists the softmax above a wait, or
// sinks it below one, and the wgmma pipeline serialises).
// ptxas places a wgmma wait where its latency model expects the product to be done, which is right after
// the previous wait: the softmax would then run after the P·V product instead of under it. A shared store of
// the row sums' sum (which depends on every exponential of the tile) in front of the wait keeps the wait after
// the exponentials: the wait is not moved above a memory operation. Each lane stores to its own never-read slot
// (`scratch`), so the fence is no data race (compute-sanitizer racecheck, docs/RELIABILITY.md).
__device__ __forceinline__ void pin_before_wait(uint32_t scratch, const float (&l)[2]) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scratch), "f"(l[0] + l[1]) : "memory");
}
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
template <int N> struct SsN;
template <> struct SsN<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], uint64_t a, uint64_t b, int acc) { wgmma_ss_n64(d, a, b, acc); }
};
template <> struct SsN<96> {
    static __device__ __forceinline__ void mma(float (&d)[48], uint64_t a, uint64_t b, int acc) { wgmma_ss_n96(d, a, b, acc); }
};
template <> struct SsN<128> {
    static __device__ __forceinline__ void mma(float (&d)[64], uint64_t a, uint64_t b, int acc) { wgmma_ss_n128(d, a, b, acc); }
};
template <> struct SsN<192> {
    static __device__ __forceinline__ void mma(float (&d)[96], uint64_t a, uint64_t b, int acc) { wgmma_ss_n192(d, a, b, acc); }
};
template <int N> struct RsN;
template <> struct RsN<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n64(d, a, b); }
};
template <> struct RsN<72> {
    static __device__ __forceinline__ void mma(float (&d)[36], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n72(d, a, b); }
};
template <> struct RsN<96> {
    static __device__ __forceinline__ void mma(float (&d)[48], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n96(d, a, b); }
};

// Shared-memory bytes of one configuration (the launcher passes the same number; see `attn_ws`).
template <int HDP, int C, int BN, int ST>
struct WsSmem {
    static constexpr int NA = (HDP + 63) / 64;
    static constexpr int BM = 64 * C;
    static constexpr int QB = NA * BM * 128, TB = NA * BN * 128;
    static constexpr int BAR = QB + 2 * ST * TB;  // barriers after the tiles
    // barriers: Q, fullK[ST], fullV[ST], emptyK[ST], emptyV[ST]
    // pin_before_wait's slots: 4 bytes per lane of every consumer warp (128 bytes a warp), so no two
    // lanes store to one address (racecheck reported one shared slot per warp as write-after-write
    // hazards); 8 bytes a lane would put hd 72 with two consumers 104 bytes over the 227 KB a block
    // may have
    static constexpr int SCRATCH = BAR + 8 * (1 + 4 * ST);
    static constexpr int BYTES = SCRATCH + 128 * 4 * C + 1024;  // + alignment slack for the 1024-byte base
};

template <int HD, int HDP, int C, int BN, int ST, int PP>
__device__ __forceinline__ void attn_ws(const TmaDesc* mq, const TmaDesc* mk, const TmaDesc* mv, bf16* __restrict__ o,
                                        long long o_ld, const int* __restrict__ cu_seqlens, float scale_log2) {
    using L = WsSmem<HDP, C, BN, ST>;
    constexpr int NA = L::NA, BM = L::BM, QB = L::QB, TB = L::TB;
    constexpr int NS = BN / 2, NO = HD / 2;
    static_assert(HD % 8 == 0 && HDP % 16 == 0 && HDP >= HD && HDP <= 128 && BN % 16 == 0, "tile shape");
    constexpr int NAV = (HD + 63) / 64;  // atom columns P·V reads (N = HD)
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    const uint32_t sQ = smem_u32(smem), sK = sQ + QB, sV = sK + ST * TB;
    const uint32_t barQ = sQ + L::BAR;
    const uint32_t fullK = barQ + 8, fullV = fullK + 8 * ST, emptyK = fullV + 8 * ST, emptyV = emptyK + 8 * ST;
    const int seg = blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seg];
    const int len = cu_seqlens[seg + 1] - start;
    const int q0 = blockIdx.x * BM;
    if (q0 >= len) return;
    const int ntiles = (len + BN - 1) / BN;
    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        mbar_init(barQ, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(fullK + 8 * s, 1);
            mbar_init(fullV + 8 * s, 1);
            mbar_init(emptyK + 8 * s, 4 * C);
            mbar_init(emptyV + 8 * s, 4 * C);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // producer
        reg_dealloc<24>();
        if (tid == 0) {
            tma_prefetch_desc(mq);
            tma_prefetch_desc(mk);
            tma_prefetch_desc(mv);
            mbar_expect_tx(barQ, QB);
#pragma unroll
            for (int c = 0; c < C; c++)
#pragma unroll
                for (int a = 0; a < NA; a++) tma_load(sQ + a * BM * 128 + c * 64 * 128, mq, a * 64, head, start + q0 + c * 64, barQ);
            for (int t = 0; t < ntiles; t++) {
                const int s = t % ST;
                const uint32_t ph = (t / ST) & 1;
                const uint32_t fk = fullK + 8 * s, fv = fullV + 8 * s;
                mbar_wait(emptyK + 8 * s, ph ^ 1);
                mbar_expect_tx(fk, TB);
#pragma unroll
                for (int a = 0; a < NA; a++) tma_load(sK + s * TB + a * BN * 128, mk, a * 64, head, start + t * BN, fk);
                mbar_wait(emptyV + 8 * s, ph ^ 1);
                mbar_expect_tx(fv, NAV * BN * 128);
#pragma unroll
                for (int a = 0; a < NAV; a++) tma_load(sV + s * TB + a * BN * 128, mv, a * 64, head, start + t * BN, fv);
            }
        }
        return;
    }

    // consumers
    reg_alloc<(C == 2 ? 240 : 160)>();
    const int cw = wg - 1;  // consumer warpgroup 0..C-1
    const int warp = (tid >> 5) & 3, lane = tid & 31;
    const int kcol = 2 * (lane & 3);
    float acc[NO];
#pragma unroll
    for (int i = 0; i < NO; i++) acc[i] = 0.0f;
    float s[NS];
    uint32_t pa[BN / 16][4];
    float mrow[2], lrow[2];
    const uint32_t qa = sQ + cw * 64 * 128;
    const uint32_t scratch = sQ + L::SCRATCH + 128 * ((tid - 128) >> 5) + 4 * (tid & 31);

    auto issue_s = [&](int t) {
        const uint32_t ka = sK + (t % ST) * TB;
#pragma unroll
        for (int kk = 0; kk < HDP / 16; kk++) {
            const uint32_t off_q = (kk >> 2) * BM * 128 + (kk & 3) * 32, off_k = (kk >> 2) * BN * 128 + (kk & 3) * 32;
            SsN<BN>::mma(s, desc_sw128(qa + off_q, 16, 1024), desc_sw128(ka + off_k, 16, 1024), kk > 0);
        }
    };
    auto issue_pv = [&](int t) {
        const uint32_t va = sV + (t % ST) * TB;
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) RsN<HD>::mma(acc, pa[kk], desc_sw128(va + kk * 2048, BN * 128, 1024));
    };
    auto mask = [&](int t) {
        const int lim = len - t * BN;  // valid keys in this tile (>= BN except in the last one)
        if (lim < BN) {
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (j * 8 + kcol + (e & 1) >= lim) s[j * 4 + e] = -INFINITY;
        }
    };
    // Row maxima of this tile (scaled, log2 domain) merged into mrow; returns the correction factors.
    auto softmax = [&](bool first, float (&corr)[2]) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * hr], s[j * 4 + 2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = first ? mx * scale_log2 : fmaxf(mrow[hr], mx * scale_log2);  // finite: a valid key per tile
            corr[hr] = first ? 1.0f : ex2(mrow[hr] - mnew);
            mrow[hr] = mnew;
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j * 4 + e] = ex2(fmaf(s[j * 4 + e], scale_log2, -mrow[e >> 1]));
                sum[e >> 1] += s[j * 4 + e];
            }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) lrow[hr] = first ? sum[hr] : lrow[hr] * corr[hr] + sum[hr];
    };
    auto pack = [&]() {
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(s[j * 4 + 0], s[j * 4 + 1]);
            pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(s[j * 4 + 2], s[j * 4 + 3]);
        }
    };
    auto rescale = [&](const float (&corr)[2]) {
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            acc[j * 4 + 0] *= corr[0];
            acc[j * 4 + 1] *= corr[0];
            acc[j * 4 + 2] *= corr[1];
            acc[j * 4 + 3] *= corr[1];
        }
    };
    auto release = [&](uint32_t empty, int t) {
        if (lane == 0) mbar_arrive(empty + 8 * (t % ST));
    };
    // Ping-pong: consumer cw issues its products after barrier 1 + cw, then lets the next one go.
    auto turn_begin = [&]() {
        if (PP) named_sync(1 + cw, 256);
    };
    auto turn_end = [&](bool last) {
        if (PP && !(last && cw == C - 1)) named_arrive(1 + (cw + 1) % C, 256);
    };
    if (PP && cw == C - 1) named_arrive(1, 256);  // consumer 0 goes first

    mbar_wait(barQ, 0);
    mbar_wait(fullK, 0);
    turn_begin();
    wgmma_fence();
    issue_s(0);
    wgmma_commit();
    turn_end(false);
    wgmma_wait0();
    reg_fence(s);
    release(emptyK, 0);
    mask(0);
    {
        float corr[2];
        softmax(true, corr);
    }
    pack();
    for (int t = 1; t < ntiles; t++) {
        mbar_wait(fullK + 8 * (t % ST), (t / ST) & 1);
        mbar_wait(fullV + 8 * ((t - 1) % ST), ((t - 1) / ST) & 1);
        turn_begin();
        wgmma_fence();
        issue_s(t);
        wgmma_commit();
        issue_pv(t - 1);
        wgmma_commit();
        turn_end(false);
        wgmma_wait<1>();
        reg_fence(s);
        release(emptyK, t);
        mask(t);
        float corr[2];
        softmax(false, corr);
        pin_before_wait(scratch, lrow);
        wgmma_wait<0>();
        reg_fence(acc);
        reg_fence(s);
        release(emptyV, t - 1);
        rescale(corr);
        pack();
    }
    mbar_wait(fullV + 8 * ((ntiles - 1) % ST), ((ntiles - 1) / ST) & 1);
    turn_begin();
    wgmma_fence();
    issue_pv(ntiles - 1);
    wgmma_commit();
    turn_end(true);
    wgmma_wait<0>();
    reg_fence(acc);
    release(emptyV, ntiles - 1);

    bf16* og = o + (long long)start * o_ld + (long long)head * HD;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float l = lrow[hr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = 1.0f / l;
        const int row = q0 + cw * 64 + warp * 16 + (lane >> 2) + 8 * hr;
        if (row < len) {
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                __nv_bfloat162 val = __floats2bfloat162_rn(acc[j * 4 + 2 * hr] * inv, acc[j * 4 + 2 * hr + 1] * inv);
                *reinterpret_cast<__nv_bfloat162*>(og + (long long)row * o_ld + j * 8 + kcol) = val;
            }
        }
    }
}
}  // namespace fa_ws

// Entry points: flash_attn_ws_hd{HD}_c{C}_n{BN}_s{ST}_p{PP}_bf16(q map, k map, v map, o, o_ld, cu_seqlens,
// scale_log2); dynamic shared memory fa_ws::WsSmem<HDP, C, BN, ST>::BYTES.
#define FLASH_WS_ENTRY(HD, HDP, C, BN, ST, PP)                                                                       \
    extern "C" __global__ void __launch_bounds__(128 * (C + 1), 1) flash_attn_ws_hd##HD##_c##C##_n##BN##_s##ST##_p##PP##_bf16( \
        const __grid_constant__ TmaDesc mq, const __grid_constant__ TmaDesc mk, const __grid_constant__ TmaDesc mv,  \
        bf16* o, long long o_ld, const int* cu_seqlens, float scale_log2) {                                          \
        fa_ws::attn_ws<HD, HDP, C, BN, ST, PP>(&mq, &mk, &mv, o, o_ld, cu_seqlens, scale_log2);                       \
    }

// The configurations gpu-core loads (kernels/dev/fa_ws_bench.cu measured these as the fastest on the H200;
// docs/notes/flash-attn-sm90a.md): 3 consumer warpgroups (192 query rows) for every head dim, and 2 (128 rows)
// for the grids whose 192-row blocks fill the last wave of SMs badly (chosen by gpu-core's wave model).
#ifndef FLASH_WS_NO_ENTRIES
FLASH_WS_ENTRY(64, 64, 3, 128, 3, 1)
FLASH_WS_ENTRY(64, 64, 2, 192, 3, 1)
FLASH_WS_ENTRY(72, 80, 3, 96, 3, 1)
FLASH_WS_ENTRY(72, 80, 2, 128, 3, 1)
FLASH_WS_ENTRY(96, 96, 3, 96, 3, 1)
FLASH_WS_ENTRY(96, 96, 2, 128, 3, 1)
#endif
