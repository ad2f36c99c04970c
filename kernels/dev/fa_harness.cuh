// Shared by the attention development harnesses (fa_ws_bench.cu, fa_mma_bench.cu; not part of gpu-core):
// an f32 reference over listed token rows of a fused [tokens, 3·heads·hd] bf16 q|k|v
// buffer (one block per (row, head)), random problems over segment lengths, and the rel-L2 check.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../../crates/gpu-core/kernels/common.cuh"
#include "dev_common.cuh"

// f32 reference for the listed token rows: one block per (row, head); scores of the row's segment in smem.
__global__ void ref_attn(const bf16* qkv, float* out, const int* cu, int segs, const int* rows, int heads, int hd,
                         long long ld, float scale) {
    extern __shared__ float sc[];
    __shared__ float red[32];
    int sidx = blockIdx.x, h = blockIdx.y;
    int t = rows[sidx];
    int s = 0;
    while (s + 1 < segs && cu[s + 1] <= t) s++;
    int st = cu[s], len = cu[s + 1] - st;
    const bf16* qr = qkv + (long long)t * ld + h * hd;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const bf16* kr = qkv + (long long)(st + j) * ld + heads * hd + h * hd;
        float a = 0.f;
        for (int d = 0; d < hd; d++) a += __bfloat162float(qr[d]) * __bfloat162float(kr[d]);
        sc[j] = a * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    for (int o2 = 16; o2 > 0; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    sum = warp_sum(sum);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
    __syncthreads();
    sum = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) sum += red[w];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int j = 0; j < len; j++)
            a += sc[j] * __bfloat162float(qkv[(long long)(st + j) * ld + 2 * heads * hd + h * hd + d]);
        out[((long long)sidx * heads + h) * hd + d] = a / sum;
    }
}

__global__ void gather_rows(const bf16* o, float* out, const int* rows, int nrows, int width, long long o_ld) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)nrows * width) return;
    int r = i / width, c = i % width;
    out[i] = __bfloat162float(o[(long long)rows[r] * o_ld + c]);
}

struct Problem {
    int hd, tokens, width;
    long long ld;
    std::vector<int> cu, rows;
    bf16 *dqkv, *dout;
    int *dcu, *drows;
    float *dref, *dgot;
    std::vector<float> ref;
};

static Problem make_problem(int hd, const std::vector<int>& lens, bool all_rows, unsigned long long seed, int heads) {
    Problem p;
    p.hd = hd;
    p.cu.push_back(0);
    for (int l : lens) p.cu.push_back(p.cu.back() + l);
    p.tokens = p.cu.back();
    p.ld = 3LL * heads * hd;
    p.width = heads * hd;
    std::vector<bf16> hq((size_t)p.tokens * p.ld);
    unsigned long long st = seed;
    for (auto& x : hq) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        float u = ((st >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
        x = __float2bfloat16(u * 2.0f);
    }
    if (all_rows)
        for (int t = 0; t < p.tokens; t++) p.rows.push_back(t);
    else {
        for (int t = 0; t < p.tokens; t += 13) p.rows.push_back(t);
        p.rows.push_back(p.tokens - 1);
    }
    const int nr = p.rows.size();
    CK(cudaMalloc(&p.dqkv, hq.size() * 2));
    CK(cudaMalloc(&p.dout, (size_t)p.tokens * p.width * 2));
    CK(cudaMalloc(&p.dcu, p.cu.size() * 4));
    CK(cudaMalloc(&p.drows, nr * 4));
    CK(cudaMalloc(&p.dref, (size_t)nr * p.width * 4));
    CK(cudaMalloc(&p.dgot, (size_t)nr * p.width * 4));
    CK(cudaMemcpy(p.dqkv, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.dcu, p.cu.data(), p.cu.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.drows, p.rows.data(), nr * 4, cudaMemcpyHostToDevice));
    int maxlen = *std::max_element(lens.begin(), lens.end());
    const float scale = 1.0f / sqrtf((float)hd);
    CK(cudaFuncSetAttribute(ref_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, maxlen * 4));
    ref_attn<<<dim3(nr, heads), 128, maxlen * 4>>>(p.dqkv, p.dref, p.dcu, (int)lens.size(), p.drows, heads, hd, p.ld, scale);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    p.ref.resize((size_t)nr * p.width);
    CK(cudaMemcpy(p.ref.data(), p.dref, p.ref.size() * 4, cudaMemcpyDeviceToHost));
    return p;
}
static void free_problem(Problem& p) {
    CK(cudaFree(p.dqkv));
    CK(cudaFree(p.dout));
    CK(cudaFree(p.dcu));
    CK(cudaFree(p.drows));
    CK(cudaFree(p.dref));
    CK(cudaFree(p.dgot));
}
static double check(Problem& p) {
    const int nr = p.rows.size();
    gather_rows<<<(nr * p.width + 255) / 256, 256>>>(p.dout, p.dgot, p.drows, nr, p.width, p.width);
    CK(cudaGetLastError());
    std::vector<float> got((size_t)nr * p.width);
    CK(cudaMemcpy(got.data(), p.dgot, got.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        double d = got[i] - p.ref[i];
        num += d * d;
        den += (double)p.ref[i] * p.ref[i];
    }
    return std::sqrt(num / den);
}

// One checked launch: the output poisoned to NaN first, `launch` run and waited for, the rows' rel-L2 against
// the reference returned (infinite when any is not finite).
static double run_checked(Problem& p, const std::function<void()>& launch) {
    CK(cudaMemset(p.dout, 0xFF, (size_t)p.tokens * p.width * 2));
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    return check(p);
}

// The attention timing both harnesses report: 3 warm-up launches, then the median of 15.
static float time_attention(const std::function<void()>& launch) {
    for (int i = 0; i < 3; i++) launch();
    CK(cudaDeviceSynchronize());
    return event_median_ms(launch, 15);
}

// Every row of each segment set in `sets` (tiles partly past the segment end, one-key segments, segments
// shorter than a key tile and than a query block), at head dims 64, 72 and 96, for each configuration of that
// head dim (`cfgs`: `.hd`, `.name`) run by `launch(cfg, problem)`: one line each, the failures returned.
template <class Cfg, class Launch>
static int check_ragged(const std::vector<std::vector<int>>& sets, const std::vector<Cfg>& cfgs, int heads,
                        int name_width, Launch launch) {
    int fails = 0;
    for (int hd : {64, 72, 96}) {
        for (size_t si = 0; si < sets.size(); si++) {
            Problem p = make_problem(hd, sets[si], true, 0x1234567ULL + hd * 7 + si, heads);
            for (auto& c : cfgs) {
                if (c.hd != hd) continue;
                double rel = run_checked(p, [&]() { launch(c, p); });
                bool ok = rel < 1e-2;
                if (!ok) fails++;
                printf("ragged set %zu hd %d | %-*s | rel %.3e %s\n", si, hd, name_width, c.name.c_str(), rel,
                       ok ? "ok" : "FAIL");
            }
            free_problem(p);
        }
    }
    return fails;
}

// The tower shapes (kernels/dev/sdpa_anchor.py's): head dim, tokens per image, images.
struct TowerShape {
    int hd, n, b;
};
static const TowerShape TOWER_SHAPES[] = {{72, 2394, 1}, {72, 2394, 8}, {64, 5184, 1}, {64, 12288, 1},
                                          {64, 5184, 8}, {96, 2704, 1}, {96, 2704, 8}, {96, 1296, 6}};

// A tower shape's problem: `b` segments of `n` tokens, sampled rows checked.
static Problem tower_problem(const TowerShape& sh, int heads) {
    return make_problem(sh.hd, std::vector<int>(sh.b, sh.n), false, 0x9E3779B97F4A7C15ULL ^ (sh.hd * 131 + sh.n),
                        heads);
}

// 4·n²·hd·heads·b, the FLOPs the TFLOP/s columns count.
static double tower_flops(const TowerShape& sh, int heads) { return 4.0 * sh.n * (double)sh.n * sh.hd * heads * sh.b; }

// One checked, timed row of a tower shape's table (" FAIL" past the 1e-2 bound).
static std::string tower_row(const TowerShape& sh, int heads, int name_width, const char* name, double rel, float ms) {
    char buf[256];
    snprintf(buf, sizeof buf, "hd %2d n %5d b%d | %-*s | rel %.2e%s | %8.3f ms | %6.1f TFLOP/s", sh.hd, sh.n, sh.b,
             name_width, name, rel, rel < 1e-2 ? "" : " FAIL", ms, tower_flops(sh, heads) / ms / 1e9);
    return buf;
}
