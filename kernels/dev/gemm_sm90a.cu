// Development kernel (kernels/dev: built by gemm_ws_bench.cu only, not into gpu-core — it does not beat
// cuBLASLt + the separate activation pass yet; docs/PERF.md v0.10; the gpu-core op and tower wiring that
// use it are on branch perf/fused-gemm).
// Warp-specialised persistent GEMM on Hopper (sm_90a: wgmma, TMA multicast in clusters of two blocks,
// mbarrier, setmaxnreg) with the activation fused into its epilogue: y = act(x·Wᵀ + bias), bf16 operands,
// f32 accumulation, one bf16 rounding at the end. Why: cuBLASLt has no quick_gelu, SwiGLU or GEGLU
// epilogue, so a tower would otherwise write the GEMM output, read it back and write it again in a
// separate activation pass (25–37 % of the GEMM's own time on the towers' shapes, H200).
//
// x [M, K] and W [N, K] are row-major (W = PyTorch `Linear.weight`), both K-major for wgmma; y [M, N or
// N/2] row-major with stride ldy. Block = 1 producer warpgroup + 2 consumer warpgroups, one block per SM;
// tiles of 128×256 outputs, a cluster of CL blocks taking CL vertically adjacent tiles of the same W
// columns; the grid is persistent (clusters loop over tile groups).
// - Producer (24 registers): one thread issues the bulk tensor copies of each tile's k-blocks (64 columns
//   of x, and its 256/CL rows of W, multicast to the cluster) into an ST-stage ring; stage s has a "full"
//   mbarrier (transaction bytes) and an "empty" one the consumer warps of every block of the cluster
//   arrive on (a stage is refilled in all blocks at once).
// - Consumers: warpgroup c computes rows 64c..64c+63 of the tile (m64n256k16), then the epilogue (bias,
//   clamps, activation or gate with the approximate SFU functions, one rounding, stores straight from the
//   accumulator registers) while the producer already loads the next tile's first stages.
// - GATED: W's rows come in groups of 16, gates 8g..8g+7 then their ups (interleaved once, when the
//   weights are uploaded), so a thread's accumulators j and j+1 hold the gate and the up of the same two
//   output columns; y[:, i] = act(gate_i)·up_i (N/2 output columns).
// Operands come through two 2-D tensor maps {K, rows} (box {64, 128}, 128-byte swizzle): rows past M or N
// and columns past K read as zeros, so any M, N ≡ 0 (mod 8; gated: mod 16) and K ≡ 0 (mod 8) work.
// kernels/dev/gemm_pp_sm90a.cuh has the first ("ping-pong") design and why it lost.
#include "../common.cuh"
#include "../act_math.cuh"
#include "../sm90a.cuh"
#include "../wgmma_ops.cuh"

namespace gemm_ws {
using namespace sm90;

// The epilogue's clamps (±inf = none), gpu_core::Gate's: gated y = clamp_o(act(clamp_g(min(g, glim)))·clamp_u(u));
// plain y = clamp_o(act(clamp_g(a))) (glim, u unused).
struct GemmClamps {
    float glim, g_lo, g_hi, u_lo, u_hi, o_lo, o_hi;
};

// bias[c], bias[c + 1] (f32 or bf16; null = none), c even.
__device__ __forceinline__ void load_bias2(const void* bias, int bf, int c, float& b0, float& b1) {
    if (bias == nullptr) return;
    if (bf) {
        const uint32_t u = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const bf16*>(bias) + c);
        b0 = bf16_lo_f32(u);
        b1 = bf16_hi_f32(u);
    } else {
        const float2 f = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(bias) + c);
        b0 = f.x;
        b1 = f.y;
    }
}

template <int N> struct Mma;
template <> struct Mma<256> {
    static __device__ __forceinline__ void run(float (&d)[128], uint64_t a, uint64_t b) { wgmma_ss_n256(d, a, b, 1); }
};

// The epilogue of one 64-row slice of output (BN columns held in `acc`, the wgmma m64nBNk16 layout), at
// rows m0 + warp·16 + lane/4 (+8), W rows (columns) n0 + j·8 + 2·(lane%4) (+1).
template <int BN, int ACT, bool GATED, bool FAST>
__device__ __forceinline__ void epilogue(const float (&acc)[BN / 2], int m0, int n0, int warp, int lane, bf16* __restrict__ y,
                                         long long ldy, const void* __restrict__ bias, int bias_bf16, int M, int N,
                                         const GemmClamps& ep) {
    const int q = lane & 3;
    const int r0 = m0 + warp * 16 + (lane >> 2);
    auto act = [](float x) { return FAST ? act_apply_fast(ACT, x) : act_apply(ACT, x); };
#pragma unroll
    for (int j = 0; j < BN / 8; j += (GATED ? 2 : 1)) {
        const int c = n0 + j * 8 + 2 * q;
        const bool cin = c < N;
        float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (cin) {
            load_bias2(bias, bias_bf16, c, b[0], b[1]);
            if (GATED) load_bias2(bias, bias_bf16, c + 8, b[2], b[3]);
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = r0 + 8 * hr;
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float a = acc[j * 4 + 2 * hr + e] + b[e];
                if (!GATED) {
                    v[e] = clampf(act(clampf(a, ep.g_lo, ep.g_hi)), ep.o_lo, ep.o_hi);
                } else {
                    const float u = clampf(acc[(j + 1) * 4 + 2 * hr + e] + b[2 + e], ep.u_lo, ep.u_hi);
                    const float g = clampf(fminf(a, ep.glim), ep.g_lo, ep.g_hi);
                    v[e] = clampf(act(g) * u, ep.o_lo, ep.o_hi);
                }
            }
            const int oc = GATED ? (n0 >> 1) + (j >> 1) * 8 + 2 * q : c;
            if (cin && r < M) *reinterpret_cast<uint32_t*>(y + (long long)r * ldy + oc) = pack_bf16(v[0], v[1]);
        }
    }
}

// ACT value of a timing-only instantiation of gemm_coop: the mainloop without the epilogue (the harness
// attributes a tile's time to products and epilogue with it).
#define GEMM_NO_EPILOGUE (-1)

// Shared-memory bytes of the cooperative configuration: ST stages of x [128 rows] + W [256 rows] k-blocks.
template <int ST>
struct CoopSmem {
    static constexpr int AB = 128 * 128, BB = 256 * 128;
    static constexpr int STAGE = AB + BB;
    static constexpr int BAR = ST * STAGE;
    static constexpr int BYTES = BAR + 16 * ST + 1024;
};

// The cooperative kernels' producer (one thread): every tile group's k-blocks into the ST-stage ring at s0
// (CoopSmem layout; with CL > 1 W's k-block split over the cluster and multicast), then it stays until every
// stage's last use is released by every block's consumers (their arrivals land on this block's barriers,
// which must outlive them).
template <int ST, int CL>
__device__ __forceinline__ void coop_produce(const TmaDesc* mx, const TmaDesc* mw, uint32_t s0, uint32_t full,
                                             uint32_t empty, uint32_t rank, int cid, int ncl, int ctiles, int nt,
                                             int KB) {
    using L = CoopSmem<ST>;
    constexpr int BM = 128, BN = 256;
    tma_prefetch_desc(mx);
    tma_prefetch_desc(mw);
    long long p = 0;
    for (int ct = cid; ct < ctiles; ct += ncl) {
        const int m0 = ((ct / nt) * CL + (int)rank) * BM, n0 = (ct % nt) * BN;
        for (int kb = 0; kb < KB; kb++, p++) {
            const int s = (int)(p % ST);
            const uint32_t ph = (uint32_t)((p / ST) & 1);
            const uint32_t a = s0 + s * L::STAGE, b = a + L::AB;
            mbar_wait(empty + 8 * s, ph ^ 1);
            mbar_expect_tx(full + 8 * s, L::STAGE);
            tma_load_2d(a, mx, kb * 64, m0, full + 8 * s);
            if (CL == 1) {
                tma_load_2d(b, mw, kb * 64, n0, full + 8 * s);
            } else {
                constexpr int part = BN / CL;  // W rows this block loads for the cluster
                tma_load_2d_multicast(b + rank * part * 128, mw, kb * 64, n0 + (int)rank * part, full + 8 * s,
                                      (uint16_t)((1u << CL) - 1));
            }
        }
    }
    for (int i = 0; i < ST; i++, p++) mbar_wait(empty + 8 * (int)(p % ST), (uint32_t)(((p / ST) & 1) ^ 1));
}

// One consumer warpgroup's products for one tile: its 64 rows (cw) × 256 columns into `acc`, k-blocks from
// ring position p on (p advances by KB), each stage released on every block of the cluster once read.
template <int ST, int CL>
__device__ __forceinline__ void coop_products(float (&acc)[128], uint32_t s0, uint32_t full, uint32_t empty,
                                              long long& p, int KB, int cw, int lane) {
    using L = CoopSmem<ST>;
    auto release = [&](long long q) {
        if (lane == 0) {
            const uint32_t e = empty + 8 * (int)(q % ST);
            if (CL == 1) mbar_arrive(e);
            else
#pragma unroll
                for (int r = 0; r < CL; r++) mbar_arrive_cluster(map_to_rank(e, r));
        }
    };
#pragma unroll
    for (int e = 0; e < 128; e++) acc[e] = 0.0f;
    for (int kb = 0; kb < KB; kb++, p++) {
        const int s = (int)(p % ST);
        const uint32_t a = s0 + s * L::STAGE + cw * 64 * 128, b = s0 + s * L::STAGE + L::AB;
        mbar_wait(full + 8 * s, (uint32_t)((p / ST) & 1));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            Mma<256>::run(acc, desc_sw128(a + kk * 32, 16, 1024), desc_sw128(b + kk * 32, 16, 1024));
        wgmma_commit();
        wgmma_wait<1>();
        if (kb > 0) release(p - 1);
    }
    wgmma_wait<0>();
    release(p - 1);
}

// Cooperative variant: one 128×256 tile per block at a time, each consumer warpgroup 64 rows × 256 columns
// (m64n256k16), so a block loads 48 KB per k-block for 4.2 MFLOP (twice the ping-pong tile's reuse). With
// CL = 2 the two blocks of a cluster take vertically adjacent tiles of the same W columns and each loads
// half of the W k-block, multicast into both (a block reads 32 KB from L2 per k-block). A stage is free
// for the producer once the consumers of every block that receives it have released it (the empty
// barriers count 8 warps per block of the cluster; consumers arrive on every block's barrier).
// Epilogue not overlapped with products (the tensor cores idle while a tile is written).
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
            if (c < N) load_bias2(bias, bias_bf16, c, b0, b1);
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
}  // namespace gemm_ws
