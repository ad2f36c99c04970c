#!/usr/bin/env bash
# One GPU-machine call for everything a kernel change must pass: gpu-core's GPU tests and kernel timings
# (kernels/device_run.sh, fresh PTX built there and compared with the committed one), `xtask parity` on every
# CUDA row with that PTX, the facade's GPU tests, and `xtask bench` (our towers against upstream
# transformers in the same process run). Logs go into one archive, $OUT/logs.tar.gz; tables print last.
# Needs, carried: .device (from `cargo xtask gpu-test --prepare`, plus .device/bench/xtask, a stripped
# release `cargo build -p xtask`) and .whl/transformers-5.23.0-*.whl. To stay under the 64 MiB a call carries:
# `xz` the binaries (this script unpacks every .device/**/*.xz) and slim the wheel with
# `python3 xtask/bench/slim_wheel.py FULL.whl .whl` (2.4 MB; ran the bench's PyTorch side on 2026-12-01).
# Environment: STEPS (default "tests parity facade bench"; "fa" adds kernels/dev/fa_device.sh, "pipeline" the
# 256-image `xtask pipeline` run of throughput_device.sh, PIPE_S/PIPE_ARGS as there), BENCH_ARGS (e.g. --no-compile), LIMIT (bench s).
set -u
OUT=${OUT:-/tmp/all_out}
LOGS=/tmp/all_logs
rm -rf "$LOGS"; mkdir -p "$LOGS" "$OUT"
STEPS=${STEPS:-tests parity facade bench}
# binaries travel xz-compressed (the tree's 64 MiB limit)
for f in $(find .device -name '*.xz'); do xz -d -f "$f" && chmod +x "${f%.xz}"; done
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
for step in $STEPS; do
    case $step in
    fa)
        OUT=$LOGS/fa bash kernels/dev/fa_device.sh > "$LOGS/fa.txt" 2>&1
        stamp "attention harness rc=$?"
        sed -n '/^=== summary/,$p' "$LOGS/fa.txt" ;;
    tests)
        OUT=$LOGS/core bash kernels/device_run.sh all > "$LOGS/core.txt" 2>&1
        stamp "gpu-core tests + kernel bench rc=$?"
        grep -E "PTX (CHANGED|identical)|MANIFEST|test result|FAILED|panicked" "$LOGS/core.txt" | head -12 ;;
    parity)
        VT_FIXTURES=$PWD/fixtures GPU_CORE_PTX_DIR=/tmp/gpu-core-ptx timeout 300 ./.device/bench/xtask parity > "$LOGS/parity.txt" 2>&1
        stamp "parity rc=$?"
        grep -E "cuda.*(FAIL|not run|not impl)" "$LOGS/parity.txt" | cut -c1-200 | head -12
        tail -1 "$LOGS/parity.txt" ;;
    facade)
        OUT=$LOGS/facade GPU_CORE_PTX_DIR=/tmp/gpu-core-ptx bash .device/facade/run.sh > "$LOGS/facade.txt" 2>&1
        stamp "facade GPU tests rc=$?"
        grep -E "test result|FAILED|panicked" "$LOGS/facade.txt" | head -8 ;;
    pipeline)
        VT_FIXTURES=$PWD/fixtures timeout "${PIPE_S:-330}" ./.device/bench/xtask pipeline --work /tmp/vt-pipeline \
            --report "$LOGS/pipeline_report.md" ${PIPE_ARGS:-} > "$LOGS/pipeline.txt" 2>&1
        stamp "xtask pipeline rc=$?"
        grep -E "^\[" "$LOGS/pipeline.txt" | cut -c1-300 | tail -8 ;;
    bench)
        OUT=$LOGS/bench GPU_CORE_PTX_DIR=/tmp/gpu-core-ptx LIMIT=${LIMIT:-560} bash xtask/bench/bench_device.sh > "$LOGS/bench.txt" 2>&1
        stamp "bench done" ;;
    esac
done
tar -C "$LOGS" -czf "$OUT/logs.tar.gz" .
echo "=== kernel timings (xtask kernel-bench) ==="
sed -n '/^| case/,$p' "$LOGS/core/bench.log" 2>/dev/null | grep -E "attn|case|---" | head -40
[ -s "$LOGS/pipeline_report.md" ] && { echo "=== pipeline ==="; cat "$LOGS/pipeline_report.md"; }
[ -f "$LOGS/bench.txt" ] && { echo "=== towers ==="; sed -n '/^=== report/,$p' "$LOGS/bench.txt" | head -60; }
