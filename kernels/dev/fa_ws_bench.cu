// Development harness (not part of gpu-core): checks the warp-specialised TMA kernels of
// crates/gpu-core/kernels/flash_attn_sm90a.cu against an f32 reference — every row of ragged segment sets and sampled rows of the
// tower shapes — and times every configuration against the previous wgmma kernel (dev/flash_attn_sw_sm90a.cu,
// "sw w2") on the tower shapes, without the Rust stack. Build and run on the GPU machine:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 kernels/dev/fa_ws_bench.cu -lcuda -o /tmp/faws && /tmp/faws
// Output: one line per (shape, kernel) with rel-L2 against the reference and TFLOP/s = 4·n²·hd·heads·b / t;
// a kernel whose error is over 1e-2 or not finite prints FAIL.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "flash_attn_sw_sm90a.cu"
#define FLASH_WS_NO_ENTRIES
#include "../../crates/gpu-core/kernels/flash_attn_sm90a.cu"

#include "fa_harness.cuh"

// The configurations under test: (HD, HDP, C, BN, ST, PP); the first of each head dim are gpu-core's. The hd-72
// ones with 64-key tiles and 2 stages (issue 43: gemma4 b1's 208 blocks of 192 rows are 1.58 waves of 132 SMs) fit
// two blocks per SM by shared memory but not by registers (sm_90a, nvcc 13.0.88: c3 512 threads × 128, c2 384 × 168,
// c1 256 × 160): they measure the smaller key tile and, for c1, 64-row blocks (608 at gemma4 b1, 4.6 waves).
#define CFGS(X)                \
    X(64, 64, 3, 128, 3, 1)    \
    X(64, 64, 2, 192, 3, 1)    \
    X(64, 64, 3, 128, 2, 1)    \
    X(72, 80, 3, 96, 3, 1)     \
    X(72, 80, 2, 128, 3, 1)    \
    X(72, 80, 3, 128, 2, 1)    \
    X(72, 80, 3, 64, 2, 1)     \
    X(72, 80, 2, 64, 2, 1)     \
    X(72, 80, 1, 64, 2, 1)     \
    X(96, 96, 3, 96, 3, 1)     \
    X(96, 96, 2, 128, 3, 1)    \
    X(96, 96, 3, 96, 3, 0)

#define DECL(HD, HDP, C, BN, ST, PP) FLASH_WS_ENTRY(HD, HDP, C, BN, ST, PP)
CFGS(DECL)

typedef void (*KernWs)(const TmaDesc, const TmaDesc, const TmaDesc, bf16*, long long, const int*, float);
typedef void (*KernOld)(const bf16*, const bf16*, const bf16*, bf16*, long long, long long, long long, long long,
                        const int*, float);
struct Cfg {
    int hd, hdp, c, bn, st, pp, smem;
    KernWs k;
    std::string name;
};
static std::vector<Cfg> all_cfgs() {
    std::vector<Cfg> v;
#define LIST(HD, HDP, C, BN, ST, PP)                                                                                      \
    v.push_back(Cfg{HD, HDP, C, BN, ST, PP, fa_ws::WsSmem<HDP, C, BN, ST>::BYTES,                                      \
                    flash_attn_ws_hd##HD##_c##C##_n##BN##_s##ST##_p##PP##_bf16,                                            \
                    "ws c" #C " n" #BN " s" #ST " p" #PP});
    CFGS(LIST)
    return v;
}

// 3-D tensor map {head_dim, heads, tokens} over one operand of the fused [tokens, ld] buffer.
static TmaDesc make_map(const bf16* base, int hd, int heads, int tokens, long long ld, int box_rows) {
    CUtensorMap m;
    cuuint64_t dims[3] = {(cuuint64_t)hd, (cuuint64_t)heads, (cuuint64_t)tokens};
    cuuint64_t strides[2] = {(cuuint64_t)hd * 2, (cuuint64_t)ld * 2};
    cuuint32_t box[3] = {64, 1, (cuuint32_t)box_rows};
    cuuint32_t es[3] = {1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void*)base, dims, strides, box, es,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        printf("cuTensorMapEncodeTiled failed: %d\n", (int)r);
        exit(1);
    }
    TmaDesc d;
    memcpy(&d, &m, sizeof d);
    return d;
}

int main() {
    const int heads = 16;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, smem/block optin %zu\n", prop.name, prop.multiProcessorCount, prop.sharedMemPerBlockOptin);
    std::vector<Cfg> cfgs = all_cfgs();
    for (auto& c : cfgs) CK(cudaFuncSetAttribute(c.k, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem));
    auto launch_ws = [&](const Cfg& c, Problem& p, cudaStream_t s) {
        const int bm = 64 * c.c;
        const int maxlen = [&] {
            int m = 0;
            for (size_t i = 0; i + 1 < p.cu.size(); i++) m = std::max(m, p.cu[i + 1] - p.cu[i]);
            return m;
        }();
        TmaDesc mq = make_map(p.dqkv, p.hd, heads, p.tokens, p.ld, 64);
        TmaDesc mk = make_map(p.dqkv + heads * p.hd, p.hd, heads, p.tokens, p.ld, c.bn);
        TmaDesc mv = make_map(p.dqkv + 2 * heads * p.hd, p.hd, heads, p.tokens, p.ld, c.bn);
        dim3 grid((maxlen + bm - 1) / bm, heads, (int)p.cu.size() - 1);
        const float scale_log2 = 1.4426950408889634f / sqrtf((float)p.hd);
        c.k<<<grid, 128 * (c.c + 1), c.smem, s>>>(mq, mk, mv, p.dout, p.width, p.dcu, scale_log2);
    };
    int fails = 0;
    // 1. Correctness on ragged segment sets, every row.
    fails += check_ragged({{1, 37, 64, 65, 127, 128, 129, 191, 192, 193, 250, 500, 1000}, {2394}, {3, 1300, 7}}, cfgs,
                          heads, 16, [&](const Cfg& c, Problem& p) { launch_ws(c, p, 0); });
    // 2. The tower shapes: sampled rows checked, then timed.
    std::vector<std::string> table;
    for (const TowerShape& sh : TOWER_SHAPES) {
        Problem p = tower_problem(sh, heads);
        auto row = [&](const char* name, double rel, float ms) {
            if (!(rel < 1e-2)) fails++;
            table.push_back(tower_row(sh, heads, 16, name, rel, ms));
            printf("%s\n", table.back().c_str());
            fflush(stdout);
        };
        {  // previous wgmma kernel (sw, 2 warpgroups)
            KernOld k = sh.hd == 64 ? flash_attn_sw_hd64_w2_bf16 : sh.hd == 72 ? flash_attn_sw_hd72_w2_bf16 : flash_attn_sw_hd96_w2_bf16;
            const int hdp = (sh.hd + 15) / 16 * 16, na = (hdp + 63) / 64, smem = na * (128 + 4 * 64) * 128;
            CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            dim3 grid((sh.n + 127) / 128, heads, sh.b);
            const float scale_log2 = 1.4426950408889634f / sqrtf((float)sh.hd);
            auto launch = [&]() {
                k<<<grid, 256, smem>>>(p.dqkv, p.dqkv + heads * sh.hd, p.dqkv + 2 * heads * sh.hd, p.dout, p.ld, p.ld, p.ld,
                                       p.width, p.dcu, scale_log2);
            };
            double rel = run_checked(p, launch);
            row("sw w2 (v0.2)", rel, time_attention(launch));
        }
        for (auto& c : cfgs) {
            if (c.hd != sh.hd) continue;
            auto launch = [&]() { launch_ws(c, p, 0); };
            double rel = run_checked(p, launch);
            row(c.name.c_str(), rel, time_attention(launch));
        }
        free_problem(p);
    }
    printf("=== flash attention: warp-specialised TMA kernels vs the v0.2 wgmma kernel (16 heads) ===\n");
    for (auto& r : table) printf("%s\n", r.c_str());
    printf("failures: %d\n", fails);
    return fails ? 1 : 0;
}
