#!/usr/bin/env bash
# One GPU-machine call for the fused-GEMM work (kernels/dev/gemm_sm90a.cu): build the harness, check and time
# every configuration on the towers' MLP shapes against cuBLASLt + act.cu's pass, then Nsight Compute on one
# shape (the cooperative kernel with and without a cluster, and cuBLASLt) with the warp-stall breakdown.
# Run from the repository root: OUT=$OUT bash kernels/dev/gemm_device.sh   (SHAPE=<case name part>, ITERS=<n>,
# KERNELS="<ncu kernel-name regexes, space-separated>")
set -uo pipefail
OUT=${OUT:-/tmp/gemm_out}
SHAPE=${SHAPE:-glm gate|up 72 b8}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -Xptxas -v kernels/dev/gemm_ws_bench.cu -lcuda -lcublasLt \
    -o /tmp/gws > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; grep error "$OUT/build.log" | head; exit 1; }
grep -E "C75|spill stores [1-9]" "$OUT/build.log" | head
echo "build: $(( $(date +%s) - T0 )) s"
timeout 60 /tmp/gws 5 odd > "$OUT/odd.log" 2>&1 || { echo "TAILS FAILED"; cut -c1-150 "$OUT/odd.log" | tail; exit 1; }
timeout 240 /tmp/gws "${ITERS:-10}" > "$OUT/gws.log" 2>&1; echo "harness rc=$? after $(( $(date +%s) - T0 )) s"
SEC=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --print-details all)
for k in ${KERNELS:-^gco$ ^gemm_(act|gate)_[a-z_]*_sm90a$ nvjet|xmma|sm90_}; do
    GWS_NO_PEAK=1 timeout 90 ncu --clock-control none "${SEC[@]}" -k "regex:$k" --launch-count 1 /tmp/gws 1 "$SHAPE" \
        > "$OUT/ncu_$(echo "$k" | tr -cd 'a-z0-9').txt" 2>&1
done
echo "=== harness ==="
cut -c1-150 "$OUT/gws.log"
echo "=== ncu ($SHAPE) ==="
for f in "$OUT"/ncu_*.txt; do
    echo "-- $f"
    grep -E "Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Warp Cycles Per Issued|Stall [A-Z]|No Eligible|Issued Warp" "$f" | cut -c1-130 | head -24
done
