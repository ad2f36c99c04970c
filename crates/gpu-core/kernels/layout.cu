// Layout ops around the towers' stems and heads. All f32 unless the name says bf16 or f16.
// Entry points: pos_add_xy_f32, bilinear_resize_f32, avg_pool_f32, block_gather_2x2_{bf16,f16},
// im2col_3x3s2_{bf16,f16}.
#include "common.cuh"

#define GRID_STRIDE(i, total) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (total); i += (long long)gridDim.x * blockDim.x)

// gemma4 factored position table: x[r, c] += T[0, px, c] + T[1, py, c] for pos[r] = (px, py);
// a padding row (px < 0 or py < 0) or an out-of-table position gets nothing. table is [2, t_rows, h].
extern "C" __global__ void pos_add_xy_f32(float* __restrict__ x, const float* __restrict__ table,
                                          const int* __restrict__ pos, long long n, int h, long long t_rows) {
    GRID_STRIDE(i, n * h) {
        long long r = i / h;
        int c = (int)(i - r * h);
        int px = pos[2 * r], py = pos[2 * r + 1];
        if (px < 0 || py < 0 || px >= t_rows || py >= t_rows) continue;
        x[i] += table[(long long)px * h + c] + table[(t_rows + py) * h + c];
    }
}

// torch F.interpolate(mode='bilinear', align_corners=False, antialias=False) of a [ih, iw, h] table
// (row-major grid, channels last) to [oh, ow, h], index math in f32 as torch does.
__device__ __forceinline__ void src_index(int dst, int in_size, int out_size, int& i0, int& i1, float& l1) {
    float scale = (float)in_size / (float)out_size;
    float s = fmaxf(scale * ((float)dst + 0.5f) - 0.5f, 0.0f);
    i0 = (int)s;
    i1 = i0 + (i0 < in_size - 1 ? 1 : 0);
    l1 = s - (float)i0;
}
extern "C" __global__ void bilinear_resize_f32(float* __restrict__ out, const float* __restrict__ in, int ih,
                                               int iw, int oh, int ow, int h) {
    GRID_STRIDE(i, (long long)oh * ow * h) {
        long long p = i / h;
        int c = (int)(i - p * h);
        int oy = (int)(p / ow), ox = (int)(p - (long long)oy * ow);
        int y0, y1, x0, x1;
        float ly, lx;
        src_index(oy, ih, oh, y0, y1, ly);
        src_index(ox, iw, ow, x0, x1, lx);
        const float* b = in + c;
        float v00 = b[((long long)y0 * iw + x0) * h], v01 = b[((long long)y0 * iw + x1) * h];
        float v10 = b[((long long)y1 * iw + x0) * h], v11 = b[((long long)y1 * iw + x1) * h];
        out[i] = (1.0f - ly) * ((1.0f - lx) * v00 + lx * v01) + ly * ((1.0f - lx) * v10 + lx * v11);
    }
}

// k x k average pool of a [gh, gw, h] grid (rows raster, y outer) to [gh/k, gw/k, h], times `scale`
// (gemma4: sqrt(H)). gh, gw multiples of k.
extern "C" __global__ void avg_pool_f32(float* __restrict__ out, const float* __restrict__ in, int gh, int gw,
                                        int k, int h, float scale) {
    int pw = gw / k, ph = gh / k;
    GRID_STRIDE(i, (long long)ph * pw * h) {
        long long p = i / h;
        int c = (int)(i - p * h);
        int py = (int)(p / pw), px = (int)(p - (long long)py * pw);
        float s = 0.0f;
        for (int dy = 0; dy < k; dy++)
            for (int dx = 0; dx < k; dx++) s += in[((long long)(py * k + dy) * gw + px * k + dx) * h + c];
        out[i] = s / (float)(k * k) * scale;
    }
}

// 2x2 merge gather: out[b, c*4 + ky*2 + kx] = in[token(b, ky, kx), c], i.e. rows in the (c, ky, kx) order of a
// Conv2d [O, C, 2, 2] weight. gw == 0: tokens are block-major (token = 4b + 2ky + kx, glm);
// gw > 0: raster grid of width gw (token = (2*by + ky)*gw + 2*bx + kx with b = by*(gw/2) + bx).
template <typename T>
__device__ __forceinline__ void block_gather_2x2_impl(T* __restrict__ out, const T* __restrict__ in,
                                                      long long nblocks, int h, int gw) {
    GRID_STRIDE(i, nblocks * h * 4) {
        long long b = i / (4LL * h);
        int j = (int)(i - b * 4LL * h);
        int c = j >> 2, ky = (j >> 1) & 1, kx = j & 1;
        long long tok;
        if (gw == 0) tok = 4 * b + 2 * ky + kx;
        else {
            long long bw = gw / 2;
            long long by = b / bw, bx = b - by * bw;
            tok = (2 * by + ky) * gw + 2 * bx + kx;
        }
        out[i] = in[tok * h + c];
    }
}
#define BLOCK_GATHER_ENTRY(T, NAME)                                                                          \
    extern "C" __global__ void NAME(T* __restrict__ out, const T* __restrict__ in, long long nblocks, int h, \
                                    int gw) {                                                                \
        block_gather_2x2_impl<T>(out, in, nblocks, h, gw);                                                   \
    }
BLOCK_GATHER_ENTRY(bf16, block_gather_2x2_bf16)
BLOCK_GATHER_ENTRY(f16, block_gather_2x2_f16)

// 3x3, stride 2, pad 1 im2col of `batch` [gh, gw, c] grids (tokens raster, channels last) into
// [batch * oh * ow, c*9] rows in the (c, ky, kx) order of a Conv2d [O, C, 3, 3] weight; oh = (gh-1)/2+1.
template <typename T>
__device__ __forceinline__ void im2col_3x3s2_impl(T* __restrict__ out, const T* __restrict__ in, int batch, int gh,
                                                  int gw, int c) {
    int oh = (gh - 1) / 2 + 1, ow = (gw - 1) / 2 + 1;
    long long cols = (long long)c * 9;
    GRID_STRIDE(i, (long long)batch * oh * ow * cols) {
        long long r = i / cols;
        int j = (int)(i - r * cols);
        int ch = j / 9, ky = (j % 9) / 3, kx = j % 3;
        int b = (int)(r / ((long long)oh * ow));
        int p = (int)(r - (long long)b * oh * ow);
        int oy = p / ow, ox = p - oy * ow;
        int y = 2 * oy - 1 + ky, x = 2 * ox - 1 + kx;
        T v = from_f32<T>(0.0f);
        if (y >= 0 && y < gh && x >= 0 && x < gw) v = in[(((long long)b * gh + y) * gw + x) * c + ch];
        out[i] = v;
    }
}
#define IM2COL_ENTRY(T, NAME)                                                                                \
    extern "C" __global__ void NAME(T* __restrict__ out, const T* __restrict__ in, int batch, int gh, int gw, \
                                    int c) {                                                                 \
        im2col_3x3s2_impl<T>(out, in, batch, gh, gw, c);                                                     \
    }
IM2COL_ENTRY(bf16, im2col_3x3s2_bf16)
IM2COL_ENTRY(f16, im2col_3x3s2_f16)
