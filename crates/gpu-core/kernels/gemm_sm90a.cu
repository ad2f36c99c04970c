// Warp-specialised persistent GEMM with the activation in its epilogue, on Hopper (sm_90a: wgmma, bulk
// tensor copies, mbarrier, setmaxnreg): y = act(x·Wᵀ + bias) in bf16 with f32 accumulation and one bf16
// rounding, or the gated y = act(gate)·up of W's interleaved gate|up rows. Why: cuBLASLt has no quick_gelu,
// SwiGLU or GEGLU epilogue, so an MLP would otherwise write the GEMM output, read it back and write it again
// in a separate activation pass (25–37 % of its time). H200 (docs/PERF.md v0.12): 1.07–1.15× of cuBLASLt + that
// pass on step3p7's fc1, 1.19–1.39× on the gate|up shapes; gpu-core uses the gated entries, which beat the
// two-step path in the towers, while fc1 fused only ties it there (gpu_core::fuses).
//
// x [M, K] and W [N, K] row-major (W = PyTorch `Linear.weight`, both K-major for wgmma); y [M, N] (gated:
// [M, N/2]). Block = 1 producer warpgroup + 2 consumer warpgroups (384 threads), one block per SM, tiles of
// 128×256 outputs (of W's rows) taken round-robin by a persistent grid.
// - Producer (warpgroup 0, 24 registers): one thread issues the bulk tensor copies of each tile's k-blocks
//   (64 columns of x's 128 rows and of W's 256 rows, 48 KB) into an ST-stage ring; stage s has a "full"
//   mbarrier (transaction bytes) and an "empty" one the 8 consumer warps arrive on.
// - Consumers: warpgroup c computes rows 64c..64c+63 of the tile (m64n256k16, 128 f32 accumulators per
//   thread), then the epilogue: bias, clamps, the activation or the gate with the SFU's approximate exp2 /
//   reciprocal / tanh (the result is rounded to bf16 right after), one rounding, into the warpgroup's
//   staging area in shared memory; one thread hands the area to bulk tensor stores (full 128-byte lines,
//   rows and columns past y's extent not written) and the warpgroup goes on to the next tile's products
//   while the copy engine writes y. The area is reused once the stores have read it (a tile later).
// - GATED: W's rows come in groups of 16, gates 8g..8g+7 then their ups (gpu-core's `interleave_gate_up`
//   arranges them once, at upload), so a thread's accumulator columns j and j+1 hold the gate and the up of
//   the same two output columns: y[:, i] = act(gate_i)·up_i.
// Operands through 2-D tensor maps {K, rows} (box {64, 128} for x, {64, 256} for W, 128-byte swizzle): rows
// past M or N and columns past K read as zeros, so any M, K ≡ 0 (mod 8) and N ≡ 0 (mod 8; gated mod 16) work;
// y through a map {columns, M} with box {64, 64}.
// Shared memory: the ring (ST × 48 KB), the two staging areas (plain 2 × 32 KB with ST = 3; gated 2 × 16 KB
// with ST = 4), the barriers. kernels/dev/ has the variants this design was chosen over and their numbers.
#include "common.cuh"
#include "act_math.cuh"
#include "sm90a.cuh"
#include "wgmma_ops.cuh"

namespace gemm_ws {
using namespace sm90;

// The epilogue's clamps (±inf = none), gpu_core::Gate's: gated y = clamp_o(act(clamp_g(min(g, glim)))·clamp_u(u));
// plain y = clamp_o(act(clamp_g(a))) (glim, u unused).
struct GemmClamps {
    float glim, g_lo, g_hi, u_lo, u_hi, o_lo, o_hi;
};

// The bias as the epilogue sees it, fixed at compile time: the entry points take the type as a run-time
// flag and pick one of three epilogue instances once per tile (a uniform branch), so the unrolled epilogue's
// loads carry no branch of their own and can be issued ahead of the math. With the flag tested inside every
// load (BIAS_RUNTIME, kernels/dev/ only) nvcc 13.0 put each in its own convergence region (20 BSSY, 104
// ISETP against 4 and 61 for gated SiLU's three instances together), which kept the v0.11 kernel at 0.90–1.11×
// of cuBLASLt + the pass; this way 1.07–1.39×, within 3 % of a fixed type (docs/PERF.md v0.12).
enum BiasKind : int { BIAS_RUNTIME = -1, BIAS_NONE = 0, BIAS_F32 = 1, BIAS_BF16 = 2 };

// bias[c], bias[c + 1] of kind BK into b0, b1 (left as they are for BIAS_NONE), c even; BIAS_RUNTIME reads
// the kind from `bias` (null = none) and `bf` (bf16 when non-zero) at each call.
template <int BK>
__device__ __forceinline__ void bias_pair(const void* bias, int bf, int c, float& b0, float& b1) {
    if constexpr (BK == BIAS_RUNTIME) {
        if (bias == nullptr) return;
        if (bf) bias_pair<BIAS_BF16>(bias, bf, c, b0, b1);
        else bias_pair<BIAS_F32>(bias, bf, c, b0, b1);
    } else if constexpr (BK == BIAS_BF16) {
        const uint32_t u = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const bf16*>(bias) + c);
        b0 = bf16_lo_f32(u);
        b1 = bf16_hi_f32(u);
    } else if constexpr (BK == BIAS_F32) {
        const float2 f = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(bias) + c);
        b0 = f.x;
        b1 = f.y;
    }
}

template <int N> struct Mma;
template <> struct Mma<256> {
    static __device__ __forceinline__ void run(float (&d)[128], uint64_t a, uint64_t b) { wgmma_ss_n256(d, a, b, 1); }
};

// The epilogue's values for one 64-row slice of output (BN columns held in `acc`, the wgmma m64nBNk16
// layout): bias, clamps, activation or gate, one bf16 rounding; `sink(hr, oc, in, v)` receives the two
// packed outputs of rows warp·16 + lane/4 + 8·hr, tile-local output columns oc, oc + 1 (W rows
// n0 + j·8 + 2·(lane%4) (+1); gated: half as many output columns), `in` = false past N.
template <int BN, int ACT, bool GATED, bool FAST, int BK = BIAS_RUNTIME, typename Sink>
__device__ __forceinline__ void epilogue_values(const float (&acc)[BN / 2], int n0, int lane, const void* __restrict__ bias,
                                                int bias_bf16, int N, const GemmClamps& ep, Sink&& sink) {
    const int q = lane & 3;
    auto act = [](float x) { return FAST ? act_apply_fast(ACT, x) : act_apply(ACT, x); };
#pragma unroll
    for (int j = 0; j < BN / 8; j += (GATED ? 2 : 1)) {
        const int c = n0 + j * 8 + 2 * q;
        const bool cin = c < N;
        float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (cin) {
            bias_pair<BK>(bias, bias_bf16, c, b[0], b[1]);
            if (GATED) bias_pair<BK>(bias, bias_bf16, c + 8, b[2], b[3]);
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float a = acc[j * 4 + 2 * hr + e] + b[e];
                if (!GATED) {
                    v[e] = clampf(act(clampf(a, ep.g_lo, ep.g_hi)), ep.o_lo, ep.o_hi);
                } else {
                    const float u = clampf(acc[(j + 1) * 4 + 2 * hr + e] + b[2 + e], ep.u_lo, ep.u_hi);
                    const float g = clampf(min_keep_nan(a, ep.glim), ep.g_lo, ep.g_hi);
                    v[e] = clampf(act(g) * u, ep.o_lo, ep.o_hi);
                }
            }
            sink(hr, GATED ? (j >> 1) * 8 + 2 * q : j * 8 + 2 * q, cin, pack_bf16(v[0], v[1]));
        }
    }
}

// One consumer warpgroup's staging area: its 64 rows of the tile's output as boxes of 64 rows × 64 columns
// (8 KB, 128-byte swizzle: the y tensor map's box), 4 boxes plain, 2 gated.
template <bool GATED>
struct Staging {
    static constexpr int BOXES = GATED ? 2 : 4;
    static constexpr int BOX = 64 * 128;
    static constexpr int WG = BOXES * BOX;
};

// The epilogue into this warpgroup's staging area (`stg`, shared address): output (rl, oc) at box oc/64, row
// rl, 16-byte chunk (oc/8)%8 XOR rl%8 (the 128-byte swizzle). A warp's 4-byte writes (8 rows × 4 column
// pairs) fall in 32 distinct banks.
template <int BN, int ACT, bool GATED, bool FAST, int BK>
__device__ __forceinline__ void epilogue_staged(const float (&acc)[BN / 2], int n0, int warp, int lane, uint32_t stg,
                                                const void* __restrict__ bias, int N, const GemmClamps& ep) {
    const int rb = warp * 16 + (lane >> 2);
    auto sink = [&](int hr, int oc, bool, uint32_t v) {
        const int rl = rb + 8 * hr;
        st_shared_u32(stg + (oc >> 6) * Staging<GATED>::BOX + rl * 128 + ((((oc >> 3) & 7) ^ (rl & 7)) << 4) + (oc & 7) * 2, v);
    };
    epilogue_values<BN, ACT, GATED, FAST, BK>(acc, n0, lane, bias, 0, N, ep, sink);
}

// Shared-memory bytes of the cooperative configuration: ST stages of x [128 rows] + W [256 rows] k-blocks,
// then STG bytes of output staging (the bulk-store epilogue's two warpgroup areas), then the barriers.
template <int ST, int STG = 0>
struct CoopSmem {
    static constexpr int AB = 128 * 128, BB = 256 * 128;
    static constexpr int STAGE = AB + BB;
    static constexpr int BAR = ST * STAGE + STG;
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
                for (int r = 0; r < CL; r++) mbar_arrive_remote(map_to_rank(e, r));
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

// The production kernel's body (see the top of this file): ST-stage ring, no cluster, bulk-store epilogue.
template <int ST, int ACT, bool GATED>
__device__ __forceinline__ void gemm_act(const TmaDesc* mx, const TmaDesc* mw, const TmaDesc* my, const void* __restrict__ bias,
                                         int bias_bf16, int M, int N, int K, const GemmClamps ep) {
    using S = Staging<GATED>;
    using L = CoopSmem<ST, 2 * S::WG>;
    constexpr int BM = 128, BN = 256;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    const uint32_t s0 = smem_u32(smem);
    const uint32_t full = s0 + L::BAR, empty = full + 8 * ST;
    const int nt = (N + BN - 1) / BN, tiles = ((M + BM - 1) / BM) * nt, KB = (K + 63) / 64;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int bk = bias == nullptr ? BIAS_NONE : bias_bf16 ? BIAS_BF16 : BIAS_F32;  // uniform over the grid
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // producer
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
        if (lead) bulk_wait_read<0>();  // the previous tile's stores have read the staging area
        named_sync(1 + cw, 128);
        if (bk == BIAS_BF16) epilogue_staged<BN, ACT, GATED, true, BIAS_BF16>(acc, n0, warp, lane, stg, bias, N, ep);
        else if (bk == BIAS_F32) epilogue_staged<BN, ACT, GATED, true, BIAS_F32>(acc, n0, warp, lane, stg, bias, N, ep);
        else epilogue_staged<BN, ACT, GATED, true, BIAS_NONE>(acc, n0, warp, lane, stg, bias, N, ep);
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
    if (lead) bulk_wait<0>();  // y written before the block's shared memory goes away
}

// Ring depth per kind: plain tiles stage 64 KB of output, so 3 stages fit the 227 KB; gated 32 KB, 4 stages.
template <bool GATED>
struct ActCfg {
    static constexpr int ST = GATED ? 4 : 3;
    static constexpr int BYTES = CoopSmem<ST, 2 * Staging<GATED>::WG>::BYTES;
};

}  // namespace gemm_ws

// One kernel per activation and kind, each a single template instance (no run-time switch over the
// activations).
// Plain, `gemm_act_<act>_sm90a`: y = clamp(act(clamp(x·Wᵀ + bias, g_lo, g_hi)), o_lo, o_hi), bias f32 or bf16
// (bias_bf16) or null; grid min(tiles, SMs) blocks of 384 threads, gemm_ws::ActCfg<false>::BYTES of dynamic
// shared memory. Gated, `gemm_gate_<act>_sm90a`: y = clamp(act(clamp(min(g, glim), g_lo, g_hi)) ·
// clamp(u, u_lo, u_hi), o_lo, o_hi) over W's interleaved gate|up rows (N = 2 · y's columns);
// gemm_ws::ActCfg<true>::BYTES.
#define GEMM_ACT_ENTRIES(NAME, MODE)                                                                                  \
    extern "C" __global__ void __launch_bounds__(384, 1) gemm_act_##NAME##_sm90a(                                    \
        const __grid_constant__ TmaDesc mx, const __grid_constant__ TmaDesc mw, const __grid_constant__ TmaDesc my, \
        const void* bias, int bias_bf16, int M, int N, int K, float g_lo, float g_hi, float o_lo, float o_hi) {      \
        const gemm_ws::GemmClamps ep = {INFINITY, g_lo, g_hi, -INFINITY, INFINITY, o_lo, o_hi};                    \
        gemm_ws::gemm_act<gemm_ws::ActCfg<false>::ST, MODE, false>(&mx, &mw, &my, bias, bias_bf16, M, N, K, ep);    \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(384, 1) gemm_gate_##NAME##_sm90a(                                   \
        const __grid_constant__ TmaDesc mx, const __grid_constant__ TmaDesc mw, const __grid_constant__ TmaDesc my, \
        const void* bias, int bias_bf16, int M, int N, int K, float glim, float g_lo, float g_hi, float u_lo,       \
        float u_hi, float o_lo, float o_hi) {                                                                         \
        const gemm_ws::GemmClamps ep = {glim, g_lo, g_hi, u_lo, u_hi, o_lo, o_hi};                                  \
        gemm_ws::gemm_act<gemm_ws::ActCfg<true>::ST, MODE, true>(&mx, &mw, &my, bias, bias_bf16, M, N, K, ep);      \
    }

// The towers' three activations (gpu_core::Activation; the others run as cuBLASLt + act.cu's pass).
GEMM_ACT_ENTRIES(gelu_tanh, ACT_GELU_TANH)
GEMM_ACT_ENTRIES(quick_gelu, ACT_QUICK_GELU)
GEMM_ACT_ENTRIES(silu, ACT_SILU)
