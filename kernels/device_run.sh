#!/usr/bin/env bash
# One GPU-machine session: (1) build the PTX with nvcc, (2) report whether it differs from the committed
# crates/gpu-core/kernels/ptx, (3) run the GPU tests against the fresh PTX, (4) time the kernels, table last.
# Needs .device/ (from `cargo xtask gpu-test --prepare`) carried. Writes logs + fresh PTX under $OUT.
# Usage: bash kernels/device_run.sh [tests|bench|all]   (BENCH_ONLY=attn,gemm,mem,floor narrows the bench)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/gpu-core-out}"
WHAT="${1:-all}"
mkdir -p "$OUT"
KERNELS="$ROOT/crates/gpu-core/kernels"  # the committed PTX and SASS gpu-core embeds
FRESH=/tmp/gpu-core-ptx
rm -rf "$FRESH"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
bash "$ROOT/kernels/build_ptx.sh" "$FRESH" || { echo "PTX BUILD FAILED"; exit 1; }
changed=0
for f in "$FRESH"/*.ptx; do
    # .file lines carry the toolkit's install path; compare the code only
    if ! cmp -s <(grep -v '^\s*\.file' "$f") <(grep -v '^\s*\.file' "$KERNELS/ptx/$(basename "$f")"); then echo "PTX CHANGED: $(basename "$f")"; changed=1; fi
done
cmp -s "$FRESH/MANIFEST.json" "$KERNELS/ptx/MANIFEST.json" || { echo "MANIFEST CHANGED"; changed=1; }
tar -C "$FRESH" -czf "$OUT/ptx.tar.gz" .
cp "$FRESH/RESOURCES.txt" "$OUT/RESOURCES.txt" || true  # ptxas registers / spills of this build
if [ $changed -eq 0 ]; then
    # The committed kernels are this tree's: test what a user loads, the embedded SASS; and check
    # that kernels/build_sass.sh still gives the committed fatbins from the committed PTX.
    echo "PTX identical to the committed crates/gpu-core/kernels/ptx: testing the embedded SASS"
    bash "$ROOT/kernels/build_sass.sh" /tmp/gpu-core-sass >/dev/null || echo "SASS BUILD FAILED"
    for f in "$KERNELS"/sass/*.fatbin; do
        cmp -s "$f" "/tmp/gpu-core-sass/$(basename "$f")" || { echo "SASS CHANGED: $(basename "$f") (commit crates/gpu-core/kernels/sass from /tmp/gpu-core-sass)"; changed=1; }
    done
    tar -C /tmp/gpu-core-sass -czf "$OUT/sass.tar.gz" . 2>/dev/null || true
else
    # Fresh kernels: test them as PTX (commit crates/gpu-core/kernels/ptx, then run kernels/build_sass.sh).
    export GPU_CORE_PTX_DIR="$FRESH"
fi
rc=0
if [ "$WHAT" != bench ]; then
    "$ROOT/.device/gpu_core_tests" --ignored --test-threads=1 --nocapture 2>&1 | tee "$OUT/tests.log"
    rc=${PIPESTATUS[0]}
    PASSED=$(grep -o "test result: [a-zA-Z]*\. [0-9]* passed" "$OUT/tests.log" | awk '{s += $4} END {print s + 0}')
    echo "GPU tests passed: $PASSED" | tee -a "$OUT/tests.log"
    [ "$PASSED" -gt 0 ] || { echo "NO GPU TEST RAN" | tee -a "$OUT/tests.log"; rc=1; }
    grep -E "^PARITY|panicked|test result|^GPU tests passed|^NO GPU TEST" "$OUT/tests.log" > "$OUT/parity.txt" || true
fi
if [ "$WHAT" != tests ]; then
    "$ROOT/.device/xtask" kernel-bench 2>&1 | tee "$OUT/bench.log"
fi
echo "=== summary ==="
[ -f "$OUT/parity.txt" ] && cat "$OUT/parity.txt"
[ -f "$OUT/bench.log" ] && sed -n '/^| case/,$p' "$OUT/bench.log"
exit $rc
