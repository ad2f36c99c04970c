#!/usr/bin/env bash
# One GPU-machine call for the GPU tiers (docs/TIERS.md): gpu-core's GPU tests and
# `xtask parity --require-cuda` on the card's own tier and on each tier forced on it
# (GPU_CORE_FORCE_TIER), then the staged facade and C-ABI GPU tests on the tiers named in
# FACADE_TIERS. A forced tier is a test of code paths and limits, not of speed. Prints a table last.
# Needs, carried: .device/ from `cargo xtask gpu-test --prepare` (binaries may be xz-compressed:
# `*.xz` is unpacked first). Environment: TIERS (default "native 8.0 7.5 12.0"), FACADE_TIERS
# (default "native 8.0").
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/tiers-out}"
mkdir -p "$OUT"
cd "$ROOT"
find .device -name '*.xz' -exec xz -d -f {} \;
chmod +x .device/gpu_core_tests .device/xtask .device/facade/* .device/capi/* 2>/dev/null
export VT_FIXTURES="$ROOT/fixtures"
# the committed kernels are this tree's (device-built): test the embedded code, no PTX rebuild
export NVCC=/nonexistent-nvcc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
summary=()
run_tier() {  # tier label, then the command's log name and command
    local tier="$1" name="$2"; shift 2
    local log="$OUT/${name}_${tier}.log" t0=$(date +%s)
    if [ "$tier" = native ]; then unset GPU_CORE_FORCE_TIER; else export GPU_CORE_FORCE_TIER="$tier"; fi
    "$@" > "$log" 2>&1
    local rc=$?
    local counted passed failed
    # counted up to the suite's own summary (the facade and C-ABI run.sh print their result lines
    # again under "=== ... summary ===")
    counted=$(sed '/^=== .* summary ===$/q' "$log")
    passed=$(grep -o "test result: [a-zA-Z]*\. [0-9]* passed" <<< "$counted" | awk '{s += $4} END {print s + 0}')
    failed=$(grep -o "[0-9]* failed;" <<< "$counted" | awk '{s += $1} END {print s + 0}')
    local parity
    parity=$(grep -E "^[0-9]+ pass, [0-9]+ fail" "$log" | tail -1)
    summary+=("| $tier | $name | rc $rc | ${parity:-$passed passed, $failed failed} | $(( $(date +%s) - t0 )) s |")
    grep -E "^GPU tier:|panicked|FAILED|^test .* FAILED" "$log" | head -8
}
for tier in ${TIERS:-native 8.0 7.5 12.0}; do
    echo "=== tier $tier"
    run_tier "$tier" gpu_core .device/gpu_core_tests --ignored --test-threads=1
    run_tier "$tier" parity .device/xtask parity --require-cuda
done
for tier in ${FACADE_TIERS:-native 8.0}; do
    echo "=== facade, C ABI: tier $tier"
    [ -x .device/facade/run.sh ] || [ -f .device/facade/run.sh ] && run_tier "$tier" facade bash .device/facade/run.sh
    [ -f .device/capi/run.sh ] && run_tier "$tier" capi bash .device/capi/run.sh
done
unset GPU_CORE_FORCE_TIER
echo "=== summary (a forced tier tests code paths and limits on this card, not that card's speed)"
echo "| tier | suite | exit | result | time |"
echo "|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
