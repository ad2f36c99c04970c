#!/usr/bin/env bash
# One GPU-machine call for the throughput work of issue #9 (CUDA graphs, pipelined encode, weight
# upload straight from the memory map):
#   1. gpu-core's GPU tests of graphs, staged uploads and the stager (`gpu_tests_graph::*`);
#   2. the facade's GPU tests (tests/graphs.rs): graph replay rows bitwise equal to eager rows for
#      every tower on two layouts and on new values, a changed layout captured anew, staged
#      batches, f32 never captured, a CUDA stream bitwise equal to encode of the same passes;
#   3. `xtask pipeline` on the step3p7 tower at the release's size (random weights, written on the
#      machine): load + upload seconds and resident MiB, graphs on/off on the anchors' three step
#      shapes, then 256 real-size images of mixed sizes (PNG/JPEG, in memory) end to end through
#      Model::encode_stream against the tower alone on the same passes (goal: ratio ≥ 0.85).
# The torch comparison (and graphs on/off for gemma4 and glm5_next) is `bench_device.sh`, a call
# of its own: `cargo xtask bench` now prints the graph table too.
#
# Build and stage here (a machine with cargo; no GPU needed), from the repository root:
#   CARGO_TARGET_DIR=/work/target-tp bash xtask/bench/throughput_device.sh --stage
# which runs exactly:
#   cargo build --release --locked -p xtask
#   cargo test --release --locked -p gpu-core --lib --no-run          # its "Executable" path
#   cargo test --release --locked -p vision-towers --test graphs --no-run
#   cp <xtask> .device/tp/xtask; cp <gpu-core test exe> .device/tp/gpu_core_tests
#   cp <graphs test exe> .device/tp/vision_towers_graphs; strip --strip-debug .device/tp/*
#   xz -9 the three when they exceed 60 MiB together (this script unpacks them on the device)
# Then on the device (no cargo there): run tool command
#   OUT=$OUT bash xtask/bench/throughput_device.sh
# carry [".device/tp"] (the tree itself travels: fixtures/, xtask/bench/).
#
# Environment on the device (all optional): TEST_S (each test binary's limit, default 90),
# PIPE_S (the pipeline's limit, default 330; past 240 s it skips its staged measurement), PIPE_ARGS
# (more `xtask pipeline` arguments, e.g. --images 128 or --max-images 4). Worst case ≈ 8.8 min.
# Logs and pipeline_report.md go to $OUT; tables print last.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.device/tp"

if [ "${1:-}" = "--stage" ]; then
    set -e
    cd "$ROOT"
    T="${CARGO_TARGET_DIR:-$ROOT/target}"
    exe() { cargo test --release --locked "$@" --no-run 2>&1 | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -1; }
    cargo build --release --locked -p xtask
    G="$(exe -p gpu-core --lib)"
    V="$(exe -p vision-towers --test graphs)"
    [ -x "$G" ] && [ -x "$V" ] || { echo "test executables not found ($G, $V)"; exit 1; }
    rm -rf "$D" && mkdir -p "$D"
    cp "$T/release/xtask" "$D/xtask"
    cp "$G" "$D/gpu_core_tests"
    cp "$V" "$D/vision_towers_graphs"
    strip --strip-debug "$D"/* 2>/dev/null || true
    if [ "$(du -cm "$D"/* | tail -1 | cut -f1)" -gt 60 ]; then xz -9 -T0 "$D"/*; fi
    ls -l "$D"
    du -sh "$D"
    exit 0
fi

OUT=${OUT:-/tmp/throughput_out}
mkdir -p "$OUT"
cd "$ROOT"
for f in "$D"/*.xz; do [ -e "$f" ] && xz -dkf "$f"; done
chmod +x "$D/xtask" "$D/gpu_core_tests" "$D/vision_towers_graphs" 2>/dev/null
export VT_FIXTURES="$ROOT/fixtures" RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used --format=csv
echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
T0=$(date +%s)
timeout "${TEST_S:-90}" "$D/gpu_core_tests" --ignored --test-threads=1 --nocapture gpu_tests_graph > "$OUT/gpu_core_graph_tests.txt" 2>&1
echo "gpu-core graph/staging GPU tests rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "^(GRAPH|STAGING|STAGER)|panicked|test result" "$OUT/gpu_core_graph_tests.txt" | head -20
T1=$(date +%s)
timeout "${TEST_S:-90}" "$D/vision_towers_graphs" --ignored --test-threads=1 --nocapture > "$OUT/graphs_tests.txt" 2>&1
echo "facade graph/stream GPU tests rc=$? ($(( $(date +%s) - T1 )) s)"
grep -E "^(GRAPHS|STREAM-CUDA)|panicked|^test |test result" "$OUT/graphs_tests.txt" | cut -c1-400 | head -30
T2=$(date +%s)
timeout "${PIPE_S:-330}" "$D/xtask" pipeline --work /tmp/vt-pipeline --report "$OUT/pipeline_report.md" ${PIPE_ARGS:-} > "$OUT/pipeline_log.txt" 2>&1
echo "xtask pipeline rc=$? ($(( $(date +%s) - T2 )) s)"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw,memory.used --format=csv,noheader
echo "=== pipeline progress ==="
grep -E "^\[" "$OUT/pipeline_log.txt" | cut -c1-300 | tail -25
if [ -s "$OUT/pipeline_report.md" ]; then
    echo "=== report ($OUT/pipeline_report.md) ==="
    cat "$OUT/pipeline_report.md"
else
    echo "=== no report: last lines of the log ==="
    tail -30 "$OUT/pipeline_log.txt"
fi
echo "total $(( $(date +%s) - T0 )) s"
