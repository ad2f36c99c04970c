// The first fused-GEMM design, kept for the harness's comparison (kernels/dev/gemm_ws_bench.cu; not built
// into gpu-core): "ping-pong" — two consumer warpgroups each computing a whole BM×BN tile, taking turns on
// the tensor cores (named barriers 1 and 2) so one's epilogue runs under the other's products. Measured
// 0.61–0.88× of cuBLASLt + the activation pass on the H200 (docs/PERF.md v0.10): 128×128 tiles read
// 32 KB per k-block for 2.1 MFLOP, about twice the cooperative 128×256 tile's L2 traffic per FLOP.
// Include after crates/gpu-core/kernels/gemm_sm90a.cu.
namespace gemm_ws {

template <> struct Mma<128> {
    static __device__ __forceinline__ void run(float (&d)[64], uint64_t a, uint64_t b) { wgmma_ss_n128(d, a, b, 1); }
};

// Shared-memory bytes of one configuration (the launcher passes the same number).
template <int BM, int BN, int ST>
struct GemmSmem {
    static constexpr int AB = BM * 128, BB = BN * 128;  // bytes of one k-block (64 bf16 columns) of x, W
    static constexpr int STAGE = AB + BB;
    static constexpr int BAR = ST * STAGE;             // full[ST], empty[ST] after the ring
    static constexpr int BYTES = BAR + 16 * ST + 1024;  // + alignment slack for the 1024-byte base
};

template <int BM, int BN, int ST, int ACT, bool GATED>
__device__ __forceinline__ void gemm_pp(const TmaDesc* mx, const TmaDesc* mw, bf16* __restrict__ y, long long ldy,
                                        const void* __restrict__ bias, int bias_bf16, int M, int N, int K,
                                        const GemmClamps ep) {
    using L = GemmSmem<BM, BN, ST>;
    constexpr int MI = BM / 64, NACC = BN / 2;
    static_assert(BM % 64 == 0 && (BN == 128 || BN == 256), "tile shape");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    const uint32_t s0 = smem_u32(smem);
    const uint32_t full = s0 + L::BAR, empty = full + 8 * ST;
    const int mt = (M + BM - 1) / BM, nt = (N + BN - 1) / BN;
    const int tiles = mt * nt, KB = (K + 63) / 64;
    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // producer
        reg_dealloc<24>();
        if (tid == 0) {
            tma_prefetch_desc(mx);
            tma_prefetch_desc(mw);
            long long p = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                const int m0 = (t / nt) * BM, n0 = (t % nt) * BN;
                for (int kb = 0; kb < KB; kb++, p++) {
                    const int s = (int)(p % ST);
                    const uint32_t ph = (uint32_t)((p / ST) & 1);
                    const uint32_t a = s0 + s * L::STAGE;
                    mbar_wait(empty + 8 * s, ph ^ 1);
                    mbar_expect_tx(full + 8 * s, L::STAGE);
                    tma_load_2d(a, mx, kb * 64, m0, full + 8 * s);
                    tma_load_2d(a + L::AB, mw, kb * 64, n0, full + 8 * s);
                }
            }
        }
        return;
    }

    reg_alloc<240>();
    const int cw = wg - 1;
    const int warp = (tid >> 5) & 3, lane = tid & 31;
    const int local = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;  // this block's tiles
    float acc[MI][NACC];
    for (int i = cw; i < local; i += 2) {
        const int t = blockIdx.x + i * gridDim.x;
        // The mainloops take turns (named barrier 1 + c: consumer c may start): a consumer waits on the full
        // barriers of its tile only once the other has waited on all of the previous tile's, so no wait is
        // ever two phases ahead of its barrier (a parity wait cannot tell phase k from phase k + 2).
        if (i > 0) named_sync(1 + cw, 256);
        const int m0 = (t / nt) * BM, n0 = (t % nt) * BN;
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int e = 0; e < NACC; e++) acc[mi][e] = 0.0f;
        const long long base = (long long)i * KB;
        for (int kb = 0; kb < KB; kb++) {
            const long long p = base + kb;
            const int s = (int)(p % ST);
            const uint32_t a = s0 + s * L::STAGE, b = a + L::AB;
            mbar_wait(full + 8 * s, (uint32_t)((p / ST) & 1));
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
                    Mma<BN>::run(acc[mi], desc_sw128(a + mi * 64 * 128 + kk * 32, 16, 1024), desc_sw128(b + kk * 32, 16, 1024));
            wgmma_commit();
            wgmma_wait<1>();
            if (kb > 0 && lane == 0) mbar_arrive(empty + 8 * (int)((p - 1) % ST));
        }
        if (i + 1 < local) named_arrive(2 - cw, 256);  // the other consumer's tile i + 1 may start
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(empty + 8 * (int)((base + KB - 1) % ST));

        // epilogue (the cooperative kernel's, per 64-row slice; accurate activations)
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
            epilogue<BN, ACT, GATED, false>(acc[mi], m0 + mi * 64, n0, warp, lane, y, ldy, bias, bias_bf16, M, N, ep);
    }
}

}  // namespace gemm_ws
