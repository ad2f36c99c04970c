// Development harness (not part of gpu-core): checks the wgmma kernels of flash_attn_sm90a.cu against an
// f32 reference on sampled rows and times them against the mma.sync kernels of flash_attn.cu on the tower
// shapes, without the Rust stack. Build and run on the GPU machine:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 kernels/dev/fa_bench.cu -o /tmp/fab && /tmp/fab
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../flash_attn.cu"
#include "../flash_attn_sm90a.cu"

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);      \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

typedef void (*KernOld)(const bf16*, const bf16*, const bf16*, bf16*, long long, long long, long long, long long,
                        const int*, float);

// f32 reference for sampled token rows: one block per (sample, head); scores of the row's segment in smem.
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

__global__ void gather_rows(const bf16* o, float* out, const int* rows, int nrows, int width) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)nrows * width) return;
    int r = i / width, c = i % width;
    out[i] = __bfloat162float(o[(long long)rows[r] * width + c]);
}

struct Shape {
    int hd, n, b;
};

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main() {
    const int heads = 16;
    Shape shapes[] = {{72, 2394, 1}, {72, 2394, 8}, {64, 5184, 1}, {64, 12288, 1},
                      {96, 2704, 1}, {96, 2704, 8}, {96, 1296, 6}};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    struct Row {
        char text[200];
    };
    std::vector<Row> table;
    for (const Shape& sh : shapes) {
        const int hd = sh.hd, n = sh.n, b = sh.b, tokens = n * b;
        const long long ld = 3LL * heads * hd;
        std::vector<bf16> hq((size_t)tokens * ld);
        unsigned long long st = 0x9E3779B97F4A7C15ULL ^ (hd * 131 + n);
        for (auto& x : hq) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            float u = ((st >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
            x = __float2bfloat16(u);
        }
        std::vector<int> cu(b + 1);
        for (int i = 0; i <= b; i++) cu[i] = i * n;
        std::vector<int> rows;
        for (int t = 0; t < tokens; t += 13) rows.push_back(t);
        rows.push_back(tokens - 1);
        const int nr = rows.size(), width = heads * hd;
        bf16 *dqkv, *dout;
        int *dcu, *drows;
        float *dref, *dgot;
        CK(cudaMalloc(&dqkv, hq.size() * 2));
        CK(cudaMalloc(&dout, (size_t)tokens * width * 2));
        CK(cudaMalloc(&dcu, cu.size() * 4));
        CK(cudaMalloc(&drows, rows.size() * 4));
        CK(cudaMalloc(&dref, (size_t)nr * width * 4));
        CK(cudaMalloc(&dgot, (size_t)nr * width * 4));
        CK(cudaMemcpy(dqkv, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(drows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
        const float scale = 1.0f / sqrtf((float)hd), scale_log2 = scale * 1.4426950408889634f;
        CK(cudaFuncSetAttribute(ref_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4));
        ref_attn<<<dim3(nr, heads), 128, n * 4>>>(dqkv, dref, dcu, b, drows, heads, hd, ld, scale);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> ref((size_t)nr * width), got((size_t)nr * width);
        CK(cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost));
        const bf16* qp = dqkv;
        const bf16* kp = dqkv + heads * hd;
        const bf16* vp = dqkv + 2 * heads * hd;
        const double flops = 4.0 * n * (double)n * hd * heads * b;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        auto check = [&](const char* name) -> double {
            gather_rows<<<(nr * width + 255) / 256, 256>>>(dout, dgot, drows, nr, width);
            CK(cudaGetLastError());
            CK(cudaMemcpy(got.data(), dgot, got.size() * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            bool nan = false;
            for (size_t i = 0; i < got.size(); i++) {
                double d = got[i] - ref[i];
                if (!std::isfinite(got[i])) nan = true;
                num += d * d;
                den += (double)ref[i] * ref[i];
            }
            double rel = nan ? INFINITY : std::sqrt(num / den);
            (void)name;
            return rel;
        };
        auto timeit = [&](auto launch) -> float {
            for (int i = 0; i < 3; i++) launch();
            CK(cudaDeviceSynchronize());
            std::vector<float> ts;
            for (int i = 0; i < 10; i++) {
                CK(cudaEventRecord(e0));
                launch();
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                ts.push_back(ms);
            }
            return median(ts);
        };
        // old mma.sync kernels
        {
            KernOld olds[2];
            const char* names[2] = {"mma m1", "mma m2"};
            if (hd == 64) { olds[0] = flash_attn_hd64_m1_bf16; olds[1] = flash_attn_hd64_m2_bf16; }
            if (hd == 72) { olds[0] = flash_attn_hd72_m1_bf16; olds[1] = flash_attn_hd72_m2_bf16; }
            if (hd == 96) { olds[0] = flash_attn_hd96_m1_bf16; olds[1] = flash_attn_hd96_m2_bf16; }
            for (int m = 0; m < 2; m++) {
                int br = 64 * (m + 1), hdp = (hd + 15) / 16 * 16;
                int smem = (br + 256) * (hdp + 8) * 2;
                CK(cudaFuncSetAttribute(olds[m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                dim3 grid((n + br - 1) / br, heads, b);
                auto launch = [&]() {
                    olds[m]<<<grid, 128, smem>>>(qp, kp, vp, dout, ld, ld, ld, width, dcu, scale_log2);
                };
                CK(cudaMemset(dout, 0xFF, (size_t)tokens * width * 2));
                launch();
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                double rel = check(names[m]);
                float ms = timeit(launch);
                Row r;
                snprintf(r.text, sizeof r.text, "hd %2d n %5d b%d | %-12s | rel %.2e | %8.3f ms | %6.1f TFLOP/s", hd, n, b,
                         names[m], rel, ms, flops / ms / 1e9);
                table.push_back(r);
            }
        }
        // wgmma kernels (128-byte swizzle layout, key tiles of 64)
        {
            struct V { const char* name; KernOld k; int nwg, smem; };
            const int hdp = (hd + 15) / 16 * 16, na = (hdp + 63) / 64;
            std::vector<V> vs;
#define SW(HD, NW) V{"wgmma w" #NW, flash_attn_sw_hd##HD##_w##NW##_bf16, NW, na * (NW * 64 + 4 * 64) * 128}
            if (hd == 64) vs = {SW(64, 2), SW(64, 3)};
            if (hd == 72) vs = {SW(72, 2), SW(72, 3)};
            if (hd == 96) vs = {SW(96, 2), SW(96, 3)};
            for (auto& vv : vs) {
                int br = 64 * vv.nwg;
                CK(cudaFuncSetAttribute(vv.k, cudaFuncAttributeMaxDynamicSharedMemorySize, vv.smem));
                dim3 grid((n + br - 1) / br, heads, b);
                auto launch = [&]() {
                    vv.k<<<grid, 128 * vv.nwg, vv.smem>>>(qp, kp, vp, dout, ld, ld, ld, width, dcu, scale_log2);
                };
                CK(cudaMemset(dout, 0xFF, (size_t)tokens * width * 2));
                launch();
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                double rel = check(vv.name);
                float ms = timeit(launch);
                Row r;
                snprintf(r.text, sizeof r.text, "hd %2d n %5d b%d | %-12s | rel %.2e | %8.3f ms | %6.1f TFLOP/s", hd, n, b,
                         vv.name, rel, ms, flops / ms / 1e9);
                table.push_back(r);
            }
        }
        CK(cudaFree(dqkv));
        CK(cudaFree(dout));
        CK(cudaFree(dcu));
        CK(cudaFree(drows));
        CK(cudaFree(dref));
        CK(cudaFree(dgot));
    }
    printf("=== flash attention: mma.sync vs wgmma (16 heads, TFLOP/s = 4 n^2 hd heads b / t) ===\n");
    for (auto& r : table) printf("%s\n", r.text);
    return 0;
}
