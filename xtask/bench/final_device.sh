#!/usr/bin/env bash
# One GPU-machine call for a change to a kernel the towers share, with a fallback: gpu-core's GPU tests and
# kernel timings first (all_device.sh step "tests"); if any of them failed, the bench and the
# pipeline run the previous build's xtask (.device/old/xtask, carried) so the call still measures something;
# then parity, the towers (`xtask bench`, BENCH_ARGS, default --no-compile) and `xtask pipeline` (PIPE_ARGS,
# default --images 128). Needs what all_device.sh needs. Logs: $OUT/tests_logs.tar.gz, $OUT/logs.tar.gz.
set -u
OUT=${OUT:-/tmp/final_out}
mkdir -p "$OUT"
STEPS="tests" OUT=$OUT bash xtask/bench/all_device.sh
tar -C /tmp/all_logs -czf "$OUT/tests_logs.tar.gz" .
if grep -q "^test result: ok" /tmp/all_logs/core/tests.log && ! grep -qE "FAILED|panicked" /tmp/all_logs/core/tests.log; then
    echo "gpu-core GPU tests passed: this build throughout"
elif [ -x .device/old/xtask ]; then
    echo "FALLBACK: a gpu-core GPU test failed; parity, bench and pipeline run .device/old/xtask"
    grep -E "FAILED|panicked" /tmp/all_logs/core/tests.log | head -8
    cp .device/old/xtask .device/bench/xtask
fi
STEPS="parity bench pipeline" BENCH_ARGS=${BENCH_ARGS:---no-compile} LIMIT=${LIMIT:-200} \
    PIPE_ARGS=${PIPE_ARGS:---images 128} PIPE_S=${PIPE_S:-200} OUT=$OUT bash xtask/bench/all_device.sh
