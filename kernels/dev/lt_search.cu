// How much faster than cuBLASLt's heuristic answers a wider search gets on the towers' GEMM shapes.
// For each shape: (1) the heuristic's first answer and the best of its (up to) 16 answers — what
// gpu-core's tuning times today; (2) the best of those answers with split-K 2..8 added (each
// reduction scheme the algorithm supports); (3) the best of every algorithm id × tile × stages ×
// split-K × swizzle × custom option cuBLASLt accepts (cublasLtMatmulAlgoCheck), capped per shape.
// y[M,N] = x[M,K]·W[N,K]ᵀ (+ y when +C), bf16 operands, f32 accumulation, y bf16 or f32, row-major
// (cuBLASLt, column-major: D = op(A)·B, A = W read as K×N (transa = T), B = x read as K×M, D = y read as N×M).
// Build: nvcc -O3 -arch=sm_90a lt_search.cu -lcublasLt -o /tmp/lts && /tmp/lts
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <vector>

#include "dev_common.cuh"
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("%s:%d cublasLt %d\n", __FILE__, __LINE__, (int)s_); exit(1); } } while (0)

struct Shape { const char* name; int m, n, k; bool f32out, addc; };

static const size_t WS = 64ull << 20;
static cublasLtHandle_t lt;
static cudaStream_t st;
static void* ws;

struct Ctx {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    void *W, *X, *Y;
    float alpha = 1.0f, beta;
};

static float time_algo(Ctx& c, const cublasLtMatmulAlgo_t& algo, int reps) {
    for (int i = 0; i < 2; ++i)
        if (cublasLtMatmul(lt, c.desc, &c.alpha, c.W, c.a, c.X, c.b, &c.beta, c.Y, c.c, c.Y, c.c, &algo, ws, WS, st) != CUBLAS_STATUS_SUCCESS)
            return 1e9f;
    return event_median_ms(
        [&]() { cublasLtMatmul(lt, c.desc, &c.alpha, c.W, c.a, c.X, c.b, &c.beta, c.Y, c.c, c.Y, c.c, &algo, ws, WS, st); },
        reps, st);
}

static bool check(Ctx& c, const cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulHeuristicResult_t r;
    if (cublasLtMatmulAlgoCheck(lt, c.desc, c.a, c.b, c.c, c.c, &algo, &r) != CUBLAS_STATUS_SUCCESS) return false;
    return r.workspaceSize <= WS;
}

template <typename T>
static void cfg(cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t at, T v) {
    cublasLtMatmulAlgoConfigSetAttribute(&a, at, &v, sizeof(v));
}

int main(int argc, char** argv) {
    const int CAP = argc > 1 ? atoi(argv[1]) : 600;  // exhaustive candidates timed per shape
    Shape shapes[] = {
        {"gemma qkv b1", 2394, 3456, 1152, false, false},
        {"gemma o b1", 2394, 1152, 1152, true, false},
        {"gemma down b1", 2394, 1152, 4304, true, false},
        {"gemma embed b1", 2394, 1152, 768, true, false},
        {"gemma o b8", 19152, 1152, 1152, true, false},
        {"glm qkv 5184", 5184, 3072, 1024, false, false},
        {"glm o 5184 +C", 5184, 1024, 1024, true, true},
        {"glm fc2 5184 +C", 5184, 1024, 4096, true, true},
        {"glm o 12288 +C", 12288, 1024, 1024, true, true},
        {"glm o b8 +C", 41472, 1024, 1024, true, true},
        {"glm merger 1296", 1296, 4096, 4096, false, false},
        {"step o 728 +C", 2704, 1536, 1536, true, true},
        {"step qkv 728", 2704, 4608, 1536, false, false},
        {"step o tiles +C", 7776, 1536, 1536, true, true},
        {"step o b8 +C", 21632, 1536, 1536, true, true},
        {"step proj 169", 169, 6144, 27648, false, false},
    };
    LK(cublasLtCreate(&lt));
    CK(cudaStreamCreate(&st));
    CK(cudaMalloc(&ws, WS));
    printf("| shape | m×n×k | heur. first ms | best of heuristic (n) | + split-K | exhaustive (timed/accepted) | best vs heuristic best | TFLOP/s best |\n|---|---|---|---|---|---|---|---|\n");
    for (auto& s : shapes) {
        Ctx c;
        c.beta = s.addc ? 1.0f : 0.0f;
        CK(cudaMalloc(&c.W, (size_t)s.n * s.k * 2));
        CK(cudaMalloc(&c.X, (size_t)s.m * s.k * 2));
        CK(cudaMalloc(&c.Y, (size_t)s.m * s.n * 4));
        {
            std::vector<__nv_bfloat16> h((size_t)std::max(s.n, s.m) * s.k);
            for (size_t i = 0; i < h.size(); ++i) h[i] = __float2bfloat16(((int)(i * 2654435761u % 2001) - 1000) * 1e-3f);
            CK(cudaMemcpy(c.W, h.data(), (size_t)s.n * s.k * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(c.X, h.data(), (size_t)s.m * s.k * 2, cudaMemcpyHostToDevice));
            CK(cudaMemset(c.Y, 0, (size_t)s.m * s.n * 4));
        }
        cudaDataType_t yt = s.f32out ? CUDA_R_32F : CUDA_R_16BF;
        LK(cublasLtMatmulDescCreate(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        LK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        LK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        LK(cublasLtMatrixLayoutCreate(&c.a, CUDA_R_16BF, s.k, s.n, s.k));
        LK(cublasLtMatrixLayoutCreate(&c.b, CUDA_R_16BF, s.k, s.m, s.k));
        LK(cublasLtMatrixLayoutCreate(&c.c, yt, s.n, s.m, s.n));
        // (1) heuristic
        cublasLtMatmulPreference_t pref;
        LK(cublasLtMatmulPreferenceCreate(&pref));
        size_t wsb = WS;
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
        cublasLtMatmulHeuristicResult_t hr[16];
        int found = 0;
        LK(cublasLtMatmulAlgoGetHeuristic(lt, c.desc, c.a, c.b, c.c, c.c, pref, 16, hr, &found));
        float first = 1e9f, hbest = 1e9f;
        std::vector<cublasLtMatmulAlgo_t> heur;
        for (int i = 0; i < found; ++i) {
            if (hr[i].state != CUBLAS_STATUS_SUCCESS) continue;
            heur.push_back(hr[i].algo);
            float t = time_algo(c, hr[i].algo, 15);
            if (i == 0) first = t;
            hbest = std::min(hbest, t);
        }
        // (2) split-K variants of the heuristic answers
        float sbest = hbest;
        for (auto a0 : heur) {
            for (int sk = 2; sk <= 8; ++sk) {
                for (uint32_t red : {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}) {
                    cublasLtMatmulAlgo_t a = a0;
                    cfg(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, (int32_t)sk);
                    cfg(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, (uint32_t)red);
                    if (!check(c, a)) continue;
                    sbest = std::min(sbest, time_algo(c, a, 9));
                }
            }
        }
        // (3) exhaustive
        int ids[256], nids = 0;
        LK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, yt, yt, 256, ids, &nids));
        float ebest = 1e9f;
        int timed = 0, accepted = 0;
        for (int ii = 0; ii < nids && timed < CAP; ++ii) {
            cublasLtMatmulAlgo_t base;
            if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, yt, yt, ids[ii], &base) != CUBLAS_STATUS_SUCCESS) continue;
            size_t w = 0;
            uint32_t tiles[128], stages[128];
            int nt = 0, ns = 0, splitk = 0, swz = 0, copt = 0;
            uint32_t redmask = 0;
            if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof(tiles), &w) == CUBLAS_STATUS_SUCCESS) nt = (int)(w / 4);
            if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof(stages), &w) == CUBLAS_STATUS_SUCCESS) ns = (int)(w / 4);
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk, sizeof(splitk), &w);
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &redmask, sizeof(redmask), &w);
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz, sizeof(swz), &w);
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &copt, sizeof(copt), &w);
            if (nt == 0) { tiles[0] = CUBLASLT_MATMUL_TILE_UNDEFINED; nt = 1; }
            if (ns == 0) { stages[0] = CUBLASLT_MATMUL_STAGES_UNDEFINED; ns = 1; }
            for (int ti = 0; ti < nt && timed < CAP; ++ti)
                for (int si = 0; si < ns && timed < CAP; ++si)
                    for (int co = 0; co <= std::min(copt, 3) && timed < CAP; ++co)
                        for (int sw = 0; sw <= (swz ? 1 : 0) && timed < CAP; ++sw)
                            for (int sk : {1, 2, 3, 4}) {
                                if (sk > 1 && !splitk) break;
                                if (timed >= CAP) break;
                                cublasLtMatmulAlgo_t a = base;
                                cfg(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tiles[ti]);
                                cfg(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages[si]);
                                cfg(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, (uint32_t)co);
                                cfg(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, (uint32_t)sw);
                                cfg(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, (int32_t)sk);
                                uint32_t red = sk > 1 ? ((redmask & CUBLASLT_REDUCTION_SCHEME_INPLACE) ? CUBLASLT_REDUCTION_SCHEME_INPLACE : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) : CUBLASLT_REDUCTION_SCHEME_NONE;
                                cfg(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, red);
                                if (!check(c, a)) continue;
                                ++accepted;
                                ++timed;
                                ebest = std::min(ebest, time_algo(c, a, 5));
                            }
        }
        const float best = std::min(std::min(hbest, sbest), ebest);
        const double fl = 2.0 * s.m * s.n * (double)s.k;
        printf("| %s | %d×%d×%d%s%s | %.4f | %.4f (%zu) | %.4f | %.4f (%d/%d) | %.3f× | %.0f |\n", s.name, s.m, s.n, s.k,
               s.f32out ? " f32" : "", s.addc ? " +C" : "", first, hbest, heur.size(), sbest, ebest, timed, accepted,
               hbest / best, fl / best / 1e9);
        fflush(stdout);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(c.a);
        cublasLtMatrixLayoutDestroy(c.b);
        cublasLtMatrixLayoutDestroy(c.c);
        cublasLtMatmulDescDestroy(c.desc);
        CK(cudaFree(c.W));
        CK(cudaFree(c.X));
        CK(cudaFree(c.Y));
    }
    return 0;
}
