// Development variants of the fused-activation GEMM (crates/gpu-core/kernels/gemm_sm90a.cu, the one gpu-core loads), built
// by gemm_ws_bench.cu only, kept for their measurements (docs/PERF.md v0.10–v0.11):
// - gemm_coop: the same cooperative mainloop with the epilogue stored straight from the accumulator registers
//   (16-byte pieces of rows; 0.74–0.93× of cuBLASLt + the separate activation pass), optionally in clusters of
//   two blocks sharing W by TMA multicast (slower on every shape), or without any epilogue (GEMM_NO_EPILOGUE:
//   the mainloop's share of a tile's time);
// - gemm_epi: the epilogue on three warps of the producer warpgroup fed through a shared staging tile
//   (the activation math on three warps cannot keep up: 0.42–0.97×);
// - gemm_pp_sm90a.cuh: the first ("ping-pong") design;
// - gemm_act_sb: the production body with a branch-free epilogue (bias staged in shared memory): 0–13 % behind
//   production's per-tile choice of the bias kind (PERF v0.12), whose 256-thread barrier per tile it does not need.
// The production kernel's bulk-store epilogue beat all of them (1.07–1.39×).
#include "../../crates/gpu-core/kernels/gemm_sm90a.cu"

namespace gemm_ws {
using namespace sm90;

// The epilogue of one 64-row slice of output stored straight from the registers to y, at rows
// m0 + warp·16 + lane/4 (+8).
template <int BN, int ACT, bool GATED, bool FAST>
__device__ __forceinline__ void epilogue(const float (&acc)[BN / 2], int m0, int n0, int warp, int lane, bf16* __restrict__ y,
                                         long long ldy, const void* __restrict__ bias, int bias_bf16, int M, int N,
                                         const GemmClamps& ep) {
    const int r0 = m0 + warp * 16 + (lane >> 2);
    bf16* yt = y + (GATED ? (n0 >> 1) : n0);
    epilogue_values<BN, ACT, GATED, FAST>(acc, n0, lane, bias, bias_bf16, N, ep, [&](int hr, int oc, bool in, uint32_t v) {
        const int r = r0 + 8 * hr;
        if (in && r < M) *reinterpret_cast<uint32_t*>(yt + (long long)r * ldy + oc) = v;
    });
}

// ACT value of a timing-only instantiation of gemm_coop: the mainloop without the epilogue (the harness
// attributes a tile's time to products and epilogue with it).
#define GEMM_NO_EPILOGUE (-1)

// Cooperative variant: one 128×256 tile per block at a time, each consumer warpgroup 64 rows × 256 columns
// (m64n256k16), so a block loads 48 KB per k-block for 4.2 MFLOP (twice the ping-pong tile's reuse). With
// CL = 2 the two blocks of a cluster take vertically adjacent tiles of the same W columns and each loads
// half of the W k-block, multicast into both (a block reads 32 KB from L2 per k-block). A stage is free
// for the producer once the consumers of every block that receives it have released it (the empty
// barriers count 8 warps per block of the cluster; consumers arrive on every block's barrier).
// Epilogue not overlapped with products, stored straight from the registers (the tensor cores idle while a
// tile is written).
template <int ST, int CL, int ACT, bool GATED, bool FAST>
__device__ __forceinline__ void gemm_coop(const TmaDesc* mx, const TmaDesc* mw, bf16* __restrict__ y, long long ldy,
                                          const void* __restrict__ bias, int bias_bf16, int M, int N, int K,
                                          const GemmClamps ep) {
    using L = CoopSmem<ST>;
    constexpr int BM = 128, BN = 256;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    const uint32_t s0 = smem_u32(smem);
    const uint32_t full = s0 + L::BAR, empty = full + 8 * ST;
    const int mt = (M + BM - 1) / BM, nt = (N + BN - 1) / BN;
    const int mg = (mt + CL - 1) / CL;  // groups of CL vertically adjacent tiles
    const int ctiles = mg * nt, KB = (K + 63) / 64;
    const uint32_t rank = CL > 1 ? cluster_rank() : 0;
    const int cid = blockIdx.x / CL, ncl = gridDim.x / CL;
    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 8 * CL);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (CL > 1) cluster_sync();
    else __syncthreads();

    if (wg == 0) {  // producer
        reg_dealloc<24>();
        if (tid == 0) coop_produce<ST, CL>(mx, mw, s0, full, empty, rank, cid, ncl, ctiles, nt, KB);
        return;
    }

    reg_alloc<240>();
    const int cw = wg - 1;
    const int warp = (tid >> 5) & 3, lane = tid & 31;
    float acc[BN / 2];
    long long p = 0;
    for (int ct = cid; ct < ctiles; ct += ncl) {
        const int m0 = ((ct / nt) * CL + (int)rank) * BM, n0 = (ct % nt) * BN;
        coop_products<ST, CL>(acc, s0, full, empty, p, KB, cw, lane);
        if constexpr (ACT == GEMM_NO_EPILOGUE) {
            // timing only: the products without the epilogue (a sum the compiler cannot drop, almost never stored)
            float sum = 0.0f;
#pragma unroll
            for (int e = 0; e < BN / 2; e++) sum += acc[e];
            if (sum == 1234.5f) y[0] = __float2bfloat16_rn(sum);
        } else {
            epilogue<BN, ACT, GATED, FAST>(acc, m0 + cw * 64, n0, warp, lane, y, ldy, bias, bias_bf16, M, N, ep);
        }
    }
}

// Shared-memory bytes of the epilogue-warpgroup variant: ST ring stages, the 128×256 bf16 staging tile,
// barriers (ring full/empty, staging full/empty).
template <int ST>
struct EpiSmem {
    static constexpr int STAGE = CoopSmem<ST>::STAGE;
    static constexpr int STG = ST * STAGE;             // staging tile, 128 rows × 512 bytes
    static constexpr int BAR = STG + 128 * 512;
    static constexpr int BYTES = BAR + 16 * ST + 16 + 1024;
};

// Staging-tile byte offset of 16-byte chunk `c` (8 columns) of row `r`: chunks XOR-swizzled by r mod 8, so
// the consumers' 4-byte writes (8 rows × 4 column pairs per warp instruction) and the epilogue warps'
// 16-byte reads (one row per warp) both spread over the banks.
__device__ __forceinline__ uint32_t stg_off(int r, int c) { return (uint32_t)(r * 512 + ((c ^ (r & 7)) << 4)); }

// Cooperative mainloop as gemm_coop (no cluster), with the epilogue moved off the tensor cores' path: the
// consumers add the bias to their accumulators, round to bf16 (as cuBLASLt's bias epilogue does) into a
// shared staging tile and go on to the next tile's products at once; three epilogue warps apply the clamps
// and the activation (or the gate) from the staging tile and write y with 16-byte coalesced stores (y's row
// stride and column offset multiples of 8). The
// numerics are the unfused path's (GEMM + bias rounded to bf16, then the activation on bf16 values). The
// ring has 3 stages (the staging tile takes the fourth's shared memory). 384 threads: warp 0 of warpgroup 0 is
// the producer, its warps 1..3 the epilogue (a fourth warpgroup would cap every thread at 128 registers, and
// m64n256k16 needs its 128 accumulators plus operands).
template <int ST, int ACT, bool GATED, bool FAST>
__device__ __forceinline__ void gemm_epi(const TmaDesc* mx, const TmaDesc* mw, bf16* __restrict__ y, long long ldy,
                                         const void* __restrict__ bias, int bias_bf16, int M, int N, int K,
                                         const GemmClamps ep) {
    using L = EpiSmem<ST>;
    constexpr int BM = 128, BN = 256;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    const uint32_t s0 = smem_u32(smem), stg = s0 + L::STG;
    const uint32_t full = s0 + L::BAR, empty = full + 8 * ST, sfull = empty + 8 * ST, sempty = sfull + 8;
    const int mt = (M + BM - 1) / BM, nt = (N + BN - 1) / BN;
    const int tiles = mt * nt, KB = (K + 63) / 64;
    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 8);
        }
        mbar_init(sfull, 8);   // the consumers' 8 warps have written the staging tile
        mbar_init(sempty, 3);  // the epilogue's 3 warps have read it
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    const int warp = (tid >> 5) & 3, lane = tid & 31;
    if (wg == 0) reg_dealloc<56>();
    if (tid == 0) {  // producer
        coop_produce<ST, 1>(mx, mw, s0, full, empty, 0, blockIdx.x, gridDim.x, tiles, nt, KB);
        return;
    }
    if (wg == 0 && warp == 0) return;  // the producer warp's other lanes
    if (wg == 0) {  // epilogue warps 1..3: one row of the staging tile per warp at a time
        auto act = [](float x) { return FAST ? act_apply_fast(ACT, x) : act_apply(ACT, x); };
        int i = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, i++) {
            const int m0 = (t / nt) * BM, n0 = (t % nt) * BN;
            mbar_wait(sfull, (uint32_t)(i & 1));
            for (int r = warp - 1; r < BM; r += 3) {
                const int row = m0 + r;
                // plain: lane = chunk (8 columns); gated: lanes 0..15 = output chunks (gate chunk 2c, up 2c + 1)
                const int c = GATED ? 2 * lane : lane;
                float o[8];
                bool live = row < M && (!GATED || lane < 16) && n0 + c * 8 < N;
                if (live) {
                    float g[8], u[8];
                    const uint4 gv = *reinterpret_cast<const uint4*>(smem + (stg - s0) + stg_off(r, c));
                    const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        g[2 * e] = bf16_lo_f32(gw[e]);
                        g[2 * e + 1] = bf16_hi_f32(gw[e]);
                    }
                    if (GATED) {
                        const uint4 uv = *reinterpret_cast<const uint4*>(smem + (stg - s0) + stg_off(r, c + 1));
                        const uint32_t uw[4] = {uv.x, uv.y, uv.z, uv.w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            u[2 * e] = bf16_lo_f32(uw[e]);
                            u[2 * e + 1] = bf16_hi_f32(uw[e]);
                        }
                    }
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        if (!GATED) {
                            o[e] = clampf(act(clampf(g[e], ep.g_lo, ep.g_hi)), ep.o_lo, ep.o_hi);
                        } else {
                            const float gg = clampf(fminf(g[e], ep.glim), ep.g_lo, ep.g_hi);
                            o[e] = clampf(act(gg) * clampf(u[e], ep.u_lo, ep.u_hi), ep.o_lo, ep.o_hi);
                        }
                    }
                    const int oc = GATED ? (n0 >> 1) + lane * 8 : n0 + c * 8;
                    store_vec16(y + (long long)row * ldy + oc, o);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(sempty);
        }
        return;
    }

    reg_alloc<224>();
    const int cw = wg - 1;
    float acc[BN / 2];
    long long p = 0;
    int i = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x, i++) {
        const int n0 = (t % nt) * BN;  // the rows are the epilogue warps' business (staging rows are tile rows)
        coop_products<ST, 1>(acc, s0, full, empty, p, KB, cw, lane);
        // the epilogue warps must have read the previous tile out of the staging tile
        mbar_wait(sempty, (uint32_t)((i & 1) ^ 1));
        const int q = lane & 3, rl = cw * 64 + warp * 16 + (lane >> 2);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int c = n0 + j * 8 + 2 * q;
            float b0 = 0.0f, b1 = 0.0f;
            if (c < N) bias_pair<BIAS_RUNTIME>(bias, bias_bf16, c, b0, b1);
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = rl + 8 * hr;
                const uint32_t v = pack_bf16(acc[j * 4 + 2 * hr] + b0, acc[j * 4 + 2 * hr + 1] + b1);
                *reinterpret_cast<uint32_t*>(smem + (stg - s0) + stg_off(r, j) + 4 * q) = v;
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(sfull);
    }
}
// Tried as the fix for the production kernel's epilogue (PERF v0.11–v0.12, not kept: its run-time bias-type flag puts every
// bias load of the unrolled epilogue in its own branch): gemm_act with the tile's 256 bias values staged once
// per tile in shared memory as f32 (zeros past N or without a bias) by the first consumer warpgroup, so the
// epilogue reads them branch-free. The two consumer warpgroups work on the same tile; named barrier 3
// (256 threads) keeps the row from being rewritten while the other warpgroup still reads it. A copy of
// gemm_act / epilogue_values with that one change.
template <int BN, int ACT, bool GATED, typename Sink>
__device__ __forceinline__ void epilogue_values_sb(const float (&acc)[BN / 2], int lane, uint32_t sbias,
                                                   const GemmClamps& ep, Sink&& sink) {
    const int q = lane & 3;
#pragma unroll
    for (int j = 0; j < BN / 8; j += (GATED ? 2 : 1)) {
        const int cl = j * 8 + 2 * q;
        float b[4];
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(b[0]), "=f"(b[1]) : "r"(sbias + 4 * cl));
        if (GATED) asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(b[2]), "=f"(b[3]) : "r"(sbias + 4 * (cl + 8)));
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float a = acc[j * 4 + 2 * hr + e] + b[e];
                if (!GATED) {
                    v[e] = clampf(act_apply_fast(ACT, clampf(a, ep.g_lo, ep.g_hi)), ep.o_lo, ep.o_hi);
                } else {
                    const float u = clampf(acc[(j + 1) * 4 + 2 * hr + e] + b[2 + e], ep.u_lo, ep.u_hi);
                    const float g = clampf(fminf(a, ep.glim), ep.g_lo, ep.g_hi);
                    v[e] = clampf(act_apply_fast(ACT, g) * u, ep.o_lo, ep.o_hi);
                }
            }
            sink(hr, GATED ? (j >> 1) * 8 + 2 * q : j * 8 + 2 * q, true, pack_bf16(v[0], v[1]));
        }
    }
}

template <bool GATED>
struct SbCfg {
    static constexpr int ST = GATED ? 4 : 3;
    static constexpr int STG = 2 * Staging<GATED>::WG + 1024;  // staging areas + the f32 bias row
    static constexpr int BYTES = CoopSmem<ST, STG>::BYTES;
};

template <int ACT, bool GATED>
__device__ __forceinline__ void gemm_act_sb(const TmaDesc* mx, const TmaDesc* mw, const TmaDesc* my,
                                            const void* __restrict__ bias, int bias_bf16, int M, int N, int K,
                                            const GemmClamps ep) {
    using S = Staging<GATED>;
    constexpr int ST = SbCfg<GATED>::ST;
    using L = CoopSmem<ST, SbCfg<GATED>::STG>;
    constexpr int BM = 128, BN = 256;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    const uint32_t s0 = smem_u32(smem);
    const uint32_t full = s0 + L::BAR, empty = full + 8 * ST;
    const uint32_t sbias = s0 + ST * L::STAGE + 2 * S::WG;
    const int nt = (N + BN - 1) / BN, tiles = ((M + BM - 1) / BM) * nt, KB = (K + 63) / 64;
    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        reg_dealloc<24>();
        if (tid == 0) coop_produce<ST, 1>(mx, mw, s0, full, empty, 0, blockIdx.x, gridDim.x, tiles, nt, KB);
        return;
    }
    reg_alloc<240>();
    const int cw = wg - 1;
    const int warp = (tid >> 5) & 3, lane = tid & 31;
    const bool lead = warp == 0 && lane == 0;
    const uint32_t stg = s0 + ST * L::STAGE + cw * S::WG;
    float acc[BN / 2];
    long long p = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t / nt) * BM, n0 = (t % nt) * BN;
        coop_products<ST, 1>(acc, s0, full, empty, p, KB, cw, lane);
        named_sync(3, 256);  // both warpgroups are done with the previous tile's bias row
        if (cw == 0) {
            const int c = n0 + 2 * (tid & 127);
            float b0 = 0.0f, b1 = 0.0f;
            if (c < N) bias_pair<BIAS_RUNTIME>(bias, bias_bf16, c, b0, b1);
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sbias + 8 * (tid & 127)), "f"(b0), "f"(b1) : "memory");
        }
        if (lead) bulk_wait_read<0>();  // the previous tile's stores have read the staging area
        named_sync(3, 256);             // the bias row is written (and, per warpgroup, the staging area free)
        const int rb = warp * 16 + (lane >> 2);
        epilogue_values_sb<BN, ACT, GATED>(acc, lane, sbias, ep, [&](int hr, int oc, bool, uint32_t v) {
            const int rl = rb + 8 * hr;
            st_shared_u32(stg + (oc >> 6) * S::BOX + rl * 128 + ((((oc >> 3) & 7) ^ (rl & 7)) << 4) + (oc & 7) * 2, v);
        });
        fence_async_shared();
        named_sync(1 + cw, 128);
        const int r = m0 + cw * 64;
        if (lead && r < M) {
            const int oc0 = GATED ? (n0 >> 1) : n0;
#pragma unroll
            for (int b = 0; b < S::BOXES; b++) tma_store_2d(my, stg + b * S::BOX, oc0 + 64 * b, r);
            bulk_commit();
        }
    }
    if (lead) bulk_wait<0>();
}
}  // namespace gemm_ws
