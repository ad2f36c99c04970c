// Development harness (not part of gpu-core) for the portable tiers' attention (issue 39: the 8.0 tier's
// goal of 1.1× torch.compile with FlashAttention-2): the mma.sync body of crates/gpu-core/kernels/flash_attn.cu
// instantiated over block shapes — warps per block (NW), 16-row m-tiles per warp (MT), key tile (BC), and Q's
// fragments held in registers or read from shared memory per key tile (QS) — checked against an f32
// reference (every row of ragged segment sets, sampled rows of the tower shapes) and timed on the tower
// shapes. Build for the 8.0 tier as the forced tier runs it on a Hopper card (compute_80 PTX through the
// driver's JIT; the sm_80 SASS only gives ptxas's register report):
//   nvcc -gencode=arch=compute_80,code=[sm_80,compute_80] -O3 -std=c++17 -Xptxas -v kernels/dev/fa_mma_bench.cu -o /tmp/famma
// Output: one line per (shape, configuration) with rel-L2 and TFLOP/s = 4·n²·hd·heads·b / t; over 1e-2 or not
// finite prints FAIL. kernels/dev/sdpa_anchor.py times PyTorch's FlashAttention-2 on the same shapes.
#include <functional>
#include <string>

#include "../../crates/gpu-core/kernels/flash_attn.cu"
#include "fa_harness.cuh"

template <int HD, int HDP, int NW, int MT, int BC, bool QS>
__global__ void __launch_bounds__(NW * 32) fa_var(const bf16* q, const bf16* k, const bf16* v, bf16* o, long long q_ld,
                                                  long long k_ld, long long v_ld, long long o_ld,
                                                  const int* cu_seqlens, float scale_log2) {
    flash_attn_body<bf16, HD, HDP, NW, MT, BC, false, QS>(q, k, v, o, q_ld, k_ld, v_ld, o_ld, cu_seqlens, scale_log2);
}
typedef void (*Kern)(const bf16*, const bf16*, const bf16*, bf16*, long long, long long, long long, long long, const int*,
                     float);

// (HD, HDP, NW, MT, BC, QS); per head dim the first two are gpu-core's M1 and M2.
#define CFGS_HD(X, HD, HDP)        \
    X(HD, HDP, 4, 1, 64, false)    \
    X(HD, HDP, 4, 2, 64, false)    \
    X(HD, HDP, 4, 2, 64, true)     \
    X(HD, HDP, 4, 2, 128, true)    \
    X(HD, HDP, 4, 2, 128, false)   \
    X(HD, HDP, 8, 1, 64, false)    \
    X(HD, HDP, 8, 1, 128, false)   \
    X(HD, HDP, 8, 2, 64, true)
#define CFGS(X) CFGS_HD(X, 64, 64) CFGS_HD(X, 72, 80) CFGS_HD(X, 96, 96)

struct Cfg {
    int hd, nw, mt, bc, smem;
    Kern k;
    std::string name;
    int rows() const { return 16 * nw * mt; }
};
static std::vector<Cfg> all_cfgs() {
    std::vector<Cfg> v;
#define LIST(HD, HDP, NW, MT, BC, QS)                                                                                \
    v.push_back(Cfg{HD, NW, MT, BC, (16 * NW * MT + 4 * BC) * (HDP + 8) * 2, fa_var<HD, HDP, NW, MT, BC, QS>,       \
                    std::string("w") + #NW + " m" + #MT + " k" + #BC + (QS ? " qs" : "")});
    CFGS(LIST)
    return v;
}

int main() {
    const int heads = 16;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, smem/block optin %zu\n", prop.name, prop.multiProcessorCount, prop.sharedMemPerBlockOptin);
    std::vector<Cfg> cfgs = all_cfgs();
    for (auto& c : cfgs) {
        CK(cudaFuncSetAttribute(c.k, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem));
        cudaFuncAttributes a;
        CK(cudaFuncGetAttributes(&a, c.k));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, c.k, c.nw * 32, c.smem));
        printf("hd %d %-12s | %3d regs | %6d B smem | %d blocks/SM | local %zu B\n", c.hd, c.name.c_str(), a.numRegs,
               c.smem, per_sm, a.localSizeBytes);
    }
    auto launch = [&](const Cfg& c, Problem& p, cudaStream_t s) {
        int maxlen = 0;
        for (size_t i = 0; i + 1 < p.cu.size(); i++) maxlen = std::max(maxlen, p.cu[i + 1] - p.cu[i]);
        dim3 grid((maxlen + c.rows() - 1) / c.rows(), heads, (int)p.cu.size() - 1);
        const float scale_log2 = 1.4426950408889634f / sqrtf((float)p.hd);
        c.k<<<grid, c.nw * 32, c.smem, s>>>(p.dqkv, p.dqkv + heads * p.hd, p.dqkv + 2 * heads * p.hd, p.dout, p.ld, p.ld,
                                            p.ld, p.width, p.dcu, scale_log2);
    };
    int fails = 0;
    // 1. Every row of ragged segment sets.
    fails += check_ragged({{1, 37, 64, 65, 127, 128, 129, 191, 192, 193, 250, 500, 1000}, {3, 1300, 7}}, cfgs, heads, 12,
                          [&](const Cfg& c, Problem& p) { launch(c, p, 0); });
    // 2. The tower shapes: sampled rows checked, then timed.
    std::vector<std::string> table;
    for (const TowerShape& sh : TOWER_SHAPES) {
        Problem p = tower_problem(sh, heads);
        std::string best;
        float best_ms = 1e30f;
        for (auto& c : cfgs) {
            if (c.hd != sh.hd) continue;
            auto run = [&]() { launch(c, p, 0); };
            const double rel = run_checked(p, run);
            const float ms = time_attention(run);
            const bool ok = rel < 1e-2;
            if (!ok) fails++;
            table.push_back(tower_row(sh, heads, 12, c.name.c_str(), rel, ms));
            printf("%s\n", table.back().c_str());
            fflush(stdout);
            if (ok && ms < best_ms) best_ms = ms, best = c.name;
        }
        char buf[160];
        snprintf(buf, sizeof buf, "hd %2d n %5d b%d | best: %s (%.1f TFLOP/s)", sh.hd, sh.n, sh.b, best.c_str(),
                 tower_flops(sh, heads) / best_ms / 1e9);
        table.push_back(buf);
        free_problem(p);
    }
    printf("=== flash attention: mma.sync block shapes (16 heads, bf16) ===\n");
    for (auto& r : table) printf("%s\n", r.c_str());
    printf("failures: %d\n", fails);
    return fails ? 1 : 0;
}
