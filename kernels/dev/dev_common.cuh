// Shared by the development harnesses in kernels/dev/ (not part of gpu-core): the CUDA error check and
// the event timing they all report (the median of `iters` launches, each between two events on one stream).
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);      \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Median milliseconds of `iters` launches of `f` on `stream`, each timed alone between two events.
static float event_median_ms(const std::function<void()>& f, int iters, cudaStream_t stream = 0) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(e0, stream));
        f();
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ts.push_back(ms);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return median(ts);
}
