#!/usr/bin/env bash
# One GPU-machine call for the portable tiers' attention (issue 39): build kernels/dev/fa_mma_bench.cu for
# compute_80 (the 8.0 tier's PTX, JIT-compiled by the driver as the forced tier runs it), check and time
# every block shape, then PyTorch SDPA (FlashAttention-2, cuDNN) on the same shapes. Prints one table last.
# Run from the repository root: OUT=$OUT bash kernels/dev/fa_mma_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/fa_mma_out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
T0=$(date +%s)
nvcc -gencode=arch=compute_80,code=[sm_80,compute_80] -O3 -std=c++17 -Xptxas -v kernels/dev/fa_mma_bench.cu \
    -o /tmp/famma > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - T0 )) s"
timeout 240 /tmp/famma > "$OUT/famma.log" 2>&1
echo "harness rc=$? after $(( $(date +%s) - T0 )) s"
grep -E "FAIL|error" "$OUT/famma.log" | head -20
timeout 120 python3 kernels/dev/sdpa_anchor.py > "$OUT/sdpa.log" 2>&1
echo "sdpa rc=$? after $(( $(date +%s) - T0 )) s"
echo "=== fa_mma summary ==="
grep -E "regs" "$OUT/famma.log"
sed -n "/^=== flash/,\$p" "$OUT/famma.log"
grep -E "^SDPA|^torch" "$OUT/sdpa.log"
