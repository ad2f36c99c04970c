// Development harness (not part of gpu-core): the row kernels of crates/gpu-core/kernels/norm.cu at the towers'
// shapes, the generic entries (12 chunks per lane, run-time vector flag, 2 rows per 64-thread block) against the
// one-warp entries (`_w9`, `_w12`: the vector path only, 9 or 12 chunks, one row per 32-thread block).
// Issue 43: gemma4's residual_rms_add at batch 1 (2 394 rows of 1 152) held 182 registers per thread in the generic
// entry (10 rows per SM: two waves); `_w9` holds 104 (19 rows per SM). The `rra_w9_*` entries are `_w9` under other
// register bounds (launch bounds, __maxnreg__), to measure where the bound belongs.
// Every entry's outputs must equal the generic entry's bitwise. Timed as 64 launches between two events (per-launch
// mean, median of 15 such runs): "cold" rotates over buffer sets of > 200 MB together (the H100's L2 is 50 MB),
// "hot" reuses one; beside them a copy moving the same bytes with no reduction (the floor).
// Build: nvcc -gencode=arch=compute_90,code=sm_90 -O3 -std=c++17 kernels/dev/norm_rows_bench.cu
#include "../../crates/gpu-core/kernels/norm.cu"
#include "dev_common.cuh"
#include <cstring>
#include <string>

// The floor: the same bytes (in: `nin` f32 rows read; out: one f32 row written if `wx`, one 16-bit row), no reduction.
__global__ void copy_floor(float* __restrict__ x, const float* __restrict__ y, bf16* __restrict__ o, long long n4,
                           int two_in) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 a = reinterpret_cast<const float4*>(y)[i];
        float v[4] = {a.x, a.y, a.z, a.w};
        if (two_in) {
            float4 b = reinterpret_cast<float4*>(x)[i];
            v[0] += b.x; v[1] += b.y; v[2] += b.z; v[3] += b.w;
            reinterpret_cast<float4*>(x)[i] = make_float4(v[0], v[1], v[2], v[3]);
        }
        store_vec4(o + i * 4, v);
    }
}

// Bound variants of residual_rms_add's one-warp 9-chunk entry (the production `_w9` is __maxnreg__(104), 32 threads).
#define RRA_W9_VARIANT(NAME, BOUNDS)                                                                               \
    extern "C" __global__ void BOUNDS NAME(float* __restrict__ x, const float* __restrict__ y,                     \
                                           const float* __restrict__ w_post, int rows, int h, long long ldy,       \
                                           float eps, float lo, float hi, const float* __restrict__ next_w,       \
                                           bf16* __restrict__ next_out, float next_eps, int rw, int vec) {         \
        residual_rms_add_rows<9, true, true, bf16>(x, y, w_post, rows, h, ldy, eps, lo, hi, next_w, next_out,      \
                                                   next_eps, 1, nullptr);                                          \
    }
RRA_W9_VARIANT(rra_w9_lb64_10, __launch_bounds__(64, 10))
RRA_W9_VARIANT(rra_w9_lb64, __launch_bounds__(64))
RRA_W9_VARIANT(rra_w9_r96, __maxnreg__(96))
RRA_W9_VARIANT(rra_w9_r112, __maxnreg__(112))

struct Set {
    float *x, *y;
    bf16* o;
};
enum Kind { RESID, LN, RMS };
typedef void (*ResidK)(float*, const float*, const float*, int, int, long long, float, float, float, const float*, bf16*,
                       float, int, int);
typedef void (*LnK)(const float*, const float*, const float*, bf16*, int, int, long long, long long, float, int, int);
typedef void (*RmsK)(const float*, const float*, bf16*, int, int, long long, long long, float, float, float, int, int);

int main() {
    const int REPS = 64;
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("device %s, %d SMs\n", p.name, p.multiProcessorCount);
    struct Case {
        const char* what;
        Kind kind;
        int rows, h;
    };
    const Case cases[] = {
        {"gemma4 b1 residual_rms_add", RESID, 2394, 1152}, {"gemma4 b8 residual_rms_add", RESID, 19152, 1152},
        {"step3p7 728 b1 layer_norm", LN, 2704, 1536},     {"step3p7 728 b8 layer_norm", LN, 21632, 1536},
        {"glm5_next 72x72 b1 rms_norm", RMS, 5184, 1536},  {"glm5_next 96x128 b1 rms_norm", RMS, 12288, 1536},
        {"glm5_next b8 rms_norm", RMS, 41472, 1536},
    };
    printf("| case | kernel | block | cold us | cold TB/s | hot us | vs generic (cold) | bitwise |\n|---|---|---|---|---|---|---|---|\n");
    for (const Case& c : cases) {
        const int h = c.h, rows = c.rows;
        const size_t n = (size_t)rows * h;
        float *w1, *w2;
        CK(cudaMalloc(&w1, h * 4));
        CK(cudaMalloc(&w2, h * 4));
        std::vector<float> hw(h);
        for (int i = 0; i < h; i++) hw[i] = 1.0f + 0.001f * (i % 97);
        CK(cudaMemcpy(w1, hw.data(), h * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < h; i++) hw[i] = 0.01f * (i % 89) - 0.4f;
        CK(cudaMemcpy(w2, hw.data(), h * 4, cudaMemcpyHostToDevice));
        std::vector<float> hx(n), hy(n);
        uint32_t s = 12345;
        for (size_t i = 0; i < n; i++) {
            s = s * 1664525u + 1013904223u;
            hx[i] = ((s >> 8) / 16777216.0f - 0.5f) * 8.0f;
            s = s * 1664525u + 1013904223u;
            hy[i] = ((s >> 8) / 16777216.0f - 0.5f) * 2.0f + 0.3f;
        }
        const double set_bytes = (double)n * (c.kind == RESID ? 14 : 6);
        const int nset = std::max(1, std::min(8, (int)(200e6 / set_bytes) + 1));
        std::vector<Set> sets(nset);
        for (auto& st : sets) {
            CK(cudaMalloc(&st.x, n * 4));
            CK(cudaMalloc(&st.y, n * 4));
            CK(cudaMalloc(&st.o, n * 2));
            CK(cudaMemcpy(st.y, hy.data(), n * 4, cudaMemcpyHostToDevice));
        }
        auto reset = [&]() {
            for (auto& st : sets) CK(cudaMemcpy(st.x, hx.data(), n * 4, cudaMemcpyHostToDevice));
        };
        struct V {
            std::string name;
            int threads;
            std::function<void(const Set&, int)> f;
        };
        std::vector<V> vs;
        auto resid = [&](const char* nm, ResidK k, int thr) {
            vs.push_back({nm, thr, [=](const Set& st, int t) {
                              k<<<(rows + t / 32 - 1) / (t / 32), t>>>(st.x, st.y, w1, rows, h, h, 1e-6f, -3e38f, 3e38f, w2,
                                                                      st.o, 1e-6f, 1, 1);
                          }});
        };
        auto ln = [&](const char* nm, LnK k, int thr) {
            vs.push_back({nm, thr, [=](const Set& st, int t) {
                              k<<<(rows + t / 32 - 1) / (t / 32), t>>>(st.y, w1, w2, st.o, rows, h, h, h, 1e-6f, 1, 1);
                          }});
        };
        auto rms = [&](const char* nm, RmsK k, int thr) {
            vs.push_back({nm, thr, [=](const Set& st, int t) {
                              k<<<(rows + t / 32 - 1) / (t / 32), t>>>(st.y, w1, st.o, rows, h, h, h, 1e-6f, -3e38f, 3e38f,
                                                                      1, 1);
                          }});
        };
        if (c.kind == RESID) {
            resid("residual_rms_add_f32 (generic)", residual_rms_add_f32, 64);
            resid("residual_rms_add_f32_w9", residual_rms_add_f32_w9, 32);
            resid("residual_rms_add_f32_w12", residual_rms_add_f32_w12, 32);
            resid("w9 __launch_bounds__(64, 10)", rra_w9_lb64_10, 64);
            resid("w9 __launch_bounds__(64)", rra_w9_lb64, 64);
            resid("w9 __maxnreg__(96)", rra_w9_r96, 32);
            resid("w9 __maxnreg__(96), 64 threads", rra_w9_r96, 64);
            resid("w9 __maxnreg__(112)", rra_w9_r112, 32);
            resid("residual_rms_add_f32_w9, 64 threads", residual_rms_add_f32_w9, 64);
        } else if (c.kind == LN) {
            ln("layer_norm_bf16 (generic)", layer_norm_bf16, 64);
            ln("layer_norm_bf16_w12", layer_norm_bf16_w12, 32);
        } else {
            rms("rms_norm_bf16 (generic)", rms_norm_bf16, 64);
            rms("rms_norm_bf16_w12", rms_norm_bf16_w12, 32);
        }
        // every entry's outputs bitwise equal to the generic entry's, from the same inputs
        std::vector<float> rx(n), tx(n);
        std::vector<uint16_t> ro(n), to(n);
        std::vector<std::string> verdict(vs.size(), "(reference)");
        for (size_t k = 0; k < vs.size(); k++) {
            reset();
            vs[k].f(sets[0], vs[k].threads);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(k ? tx.data() : rx.data(), sets[0].x, n * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(k ? to.data() : ro.data(), sets[0].o, n * 2, cudaMemcpyDeviceToHost));
            if (k) {
                size_t bad = 0;
                for (size_t i = 0; i < n; i++) bad += (memcmp(&rx[i], &tx[i], 4) != 0) + (ro[i] != to[i]);
                verdict[k] = bad ? "FAIL " + std::to_string(bad) : "equal";
            }
        }
        auto timed = [&](const V& v, bool cold) {
            std::vector<float> ts;
            for (int r = 0; r < 15; r++) {
                reset();
                ts.push_back(event_median_ms(
                                 [&]() {
                                     for (int i = 0; i < REPS; i++) v.f(sets[cold ? i % nset : 0], v.threads);
                                 },
                                 1) *
                             1000.0f / REPS);
            }
            return median(ts);
        };
        const bool two = c.kind == RESID;
        vs.push_back({"copy, same bytes", 256, [=](const Set& st, int t) {
                          copy_floor<<<p.multiProcessorCount * 8, t>>>(st.x, st.y, st.o, n / 4, two);
                      }});
        verdict.push_back("-");
        float gen = 0;
        for (size_t k = 0; k < vs.size(); k++) {
            float cl = timed(vs[k], true), ht = timed(vs[k], false);
            if (k == 0) gen = cl;
            printf("| %s %dx%d | %s | %d | %.2f | %.2f | %.2f | %.2fx | %s |\n", c.what, rows, h, vs[k].name.c_str(),
                   vs[k].threads, cl, set_bytes / (cl * 1e-6) / 1e12, ht, gen / cl, verdict[k].c_str());
        }
        for (auto& st : sets) {
            CK(cudaFree(st.x));
            CK(cudaFree(st.y));
            CK(cudaFree(st.o));
        }
        CK(cudaFree(w1));
        CK(cudaFree(w2));
    }
    return 0;
}
