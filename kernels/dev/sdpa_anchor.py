"""PyTorch SDPA per backend on the attention shapes of kernels/dev/fa_ws_bench.cu, in the same device call.

16 heads, non-causal, bf16, [b, heads, n, hd] contiguous; CUDA events, 5 warm-ups, median of 15.
TFLOP/s = 4·n²·hd·heads·b / t. Usage: python3 kernels/dev/sdpa_anchor.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(72, 2394, 1), (72, 2394, 8), (64, 5184, 1), (64, 12288, 1), (64, 5184, 8),
          (96, 2704, 1), (96, 2704, 8), (96, 1296, 6)]
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]


def median_ms(fn, warm=5, iters=15):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for hd, n, b in SHAPES:
        q, k, v = (torch.rand(b, 16, n, hd, device="cuda", dtype=torch.bfloat16) * 4 - 2 for _ in range(3))
        flops = 4.0 * n * n * hd * 16 * b
        cells = []
        for be in BACKENDS:
            name = be.name.split("_")[0].lower()
            try:
                with sdpa_kernel([be]):
                    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v))
                cells.append(f"{name} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s")
            except RuntimeError as e:
                cells.append(f"{name} n/a ({str(e).splitlines()[0][:60]})")
        print(f"SDPA hd {hd:2d} n {n:5d} b{b} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
