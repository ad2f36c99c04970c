#!/usr/bin/env bash
# One GPU-machine call for the attention kernel work: build the harness with nvcc, check and time every
# warp-specialised configuration against the v0.2 kernel, then PyTorch SDPA (flash, cuDNN) on the same
# shapes in the same call. Run from the repository root: OUT=$OUT bash kernels/dev/fa_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
nvcc --version | tail -n 2 | head -n 1
T0=$(date +%s)
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Xptxas -v kernels/dev/fa_ws_bench.cu -lcuda -o /tmp/faws \
    > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
grep -E "C75|spill stores [1-9]" "$OUT/build.log" | head
echo "build: $(( $(date +%s) - T0 )) s"
timeout 240 /tmp/faws 2>&1 | tee "$OUT/faws.log" > /dev/null
echo "harness rc=${PIPESTATUS[0]} after $(( $(date +%s) - T0 )) s"
grep -E "FAIL|error" "$OUT/faws.log" | head -20
timeout 120 python3 kernels/dev/sdpa_anchor.py 2>&1 | tee "$OUT/sdpa.log" | grep -v "^SDPA" 
echo "=== summary ==="
sed -n '/^=== flash/,$p' "$OUT/faws.log"
grep "^SDPA" "$OUT/sdpa.log"
