// What a kernel boundary costs inside a CUDA graph, with and without programmatic dependent launch
// (PDL: the next kernel is launched while the previous one runs and waits in griddepcontrol.wait).
// Graphs of LAUNCHES kernels back to back, each a grid of `blocks` blocks that copies `mb` MB
// (0: does nothing but the wait), replayed REPS times; prints µs per kernel for each setting.
// Build: nvcc -O3 -arch=sm_90a pdl_bench.cu -o /tmp/pdl && /tmp/pdl
#include <cstdio>
#include <cuda_runtime.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void step(const float4* __restrict__ src, float4* __restrict__ dst, long long n4, int pdl, int early) {
    if (pdl && early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 v = src[i];
        v.x += 1.0f;
        dst[i] = v;
    }
}

int main() {
    const int LAUNCHES = 200, REPS = 20;
    float4 *a, *b;
    const size_t MAXB = 64ull << 20;
    CK(cudaMalloc(&a, MAXB));
    CK(cudaMalloc(&b, MAXB));
    CK(cudaMemset(a, 0, MAXB));
    CK(cudaMemset(b, 0, MAXB));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("| blocks | MB per kernel | plain µs/kernel | PDL (trigger at exit) | PDL (trigger at start) |\n|---|---|---|---|---|\n");
    int cfgs[][2] = {{132, 0}, {1, 0}, {528, 0}, {264, 1}, {1056, 4}, {1056, 16}, {2112, 38}};
    for (auto& c : cfgs) {
        const int blocks = c[0];
        const double mb = c[1];
        long long n4 = (long long)(mb * (1 << 20) / 2 / 16);  // read + write = mb
        float res[3];
        for (int mode = 0; mode < 3; ++mode) {
            const int pdl = mode > 0, early = mode == 2;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < LAUNCHES; ++i) {
                cudaLaunchConfig_t lc = {};
                lc.gridDim = dim3(blocks);
                lc.blockDim = dim3(256);
                lc.stream = s;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                lc.attrs = at;
                lc.numAttrs = pdl ? 1 : 0;
                const float4* src = (i & 1) ? b : a;
                float4* dst = (i & 1) ? a : b;
                CK(cudaLaunchKernelEx(&lc, step, src, dst, n4, pdl, early));
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, s));
            std::vector<float> t;
            for (int r = 0; r < REPS; ++r) {
                CK(cudaEventRecord(e0, s));
                CK(cudaGraphLaunch(ge, s));
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms);
            }
            std::sort(t.begin(), t.end());
            res[mode] = t[t.size() / 2] * 1e3f / LAUNCHES;
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
        printf("| %d | %.0f | %.2f | %.2f | %.2f |\n", blocks, mb, res[0], res[1], res[2]);
    }
    return 0;
}
