#!/usr/bin/env bash
# One GPU-machine call for a change to a gpu-core kernel (docs/PERF.md v0.24: the row kernels; v0.25: qk_norm_rope):
# (1) its development harness (kernels/dev/*_bench.cu, built on the development VM with nvcc 13.0.88 and carried
# xz'd: HARNESS, default .device/normb.xz), bitwise checks and per-launch times; (2) gpu-core's GPU
# tests and `xtask parity --require-cuda` with the new binaries on the card's own tier and the forced 8.0 and
# 7.5 tiers (kernels/tiers_device.sh); (3) `xtask bench` new, old, new on the same PyTorch results (A/B/A):
# gemma4 b1 with torch.compile timed in the same run, then CASES without it. Prints one table last.
# HARNESS may also be a .cu file (built on the card with its nvcc and HARNESS_NVCC_FLAGS, default sm_90a, linked
# with the driver API), and HARNESS_GREP picks the harness lines the summary prints (default: table rows).
# Needs, carried: the harness, AB (default .device/ab.tar.xz: gpu_core_tests, xtask and xtask_old, stripped, xz),
# .whl/transformers-5.23.0-*.whl. Environment: HARNESS, AB, CASES (default gemma4_b8,step_728_b1,glm5_72_b1),
# ITERS (default 20), TOTAL (every step ends by this many seconds, default 540).
set -u
OUT=${OUT:-/tmp/norm-ab-out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
TOTAL=${TOTAL:-540}
left() { echo $(( TOTAL - $(el) )); }
H=${HARNESS:-.device/normb.xz}
case "$H" in
*.cu)  # a harness that links the driver API (the attention's tensor maps): built here, with the card's nvcc
    PATH=/usr/local/cuda/bin:$PATH nvcc ${HARNESS_NVCC_FLAGS:--gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17} \
        "$H" -lcuda -o /tmp/harness > "$OUT/harness_build.log" 2>&1 || { echo "harness build failed"; tail -5 "$OUT/harness_build.log"; } ;;
*) xz -dc "$H" > /tmp/harness && chmod +x /tmp/harness ;;
esac
timeout 90 /tmp/harness > "$OUT/harness.log" 2>&1
echo "harness rc=$? at $(el) s"
tar -xJf "${AB:-.device/ab.tar.xz}" -C .device || exit 1
chmod +x .device/gpu_core_tests .device/xtask .device/xtask_old
export VT_FIXTURES=$PWD/fixtures NVCC=/nonexistent-nvcc PYTHONUNBUFFERED=1
TIERS="native 8.0 7.5" FACADE_TIERS=" " OUT="$OUT/tiers" timeout 150 bash kernels/tiers_device.sh > "$OUT/tiers.log" 2>&1
echo "tiers rc=$? at $(el) s"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/transformers-5.23.0-*.whl
I=${ITERS:-20}
b() {  # b NAME BINARY TORCH_DIR CASES EXTRA...
    local n=$1 x=$2 t=$3 c=$4; shift 4
    [ "$(left)" -gt 30 ] || { echo "$n skipped at $(el) s"; return; }
    PYTHONPATH=/tmp/site timeout "$(left)" "$x" bench --torch-out "$t" --iters "$I" --cases "$c" "$@" \
        --report "$OUT/$n.md" > "$OUT/$n.log" 2>&1
    echo "$n rc=$? at $(el) s"
}
b g1_new .device/xtask /tmp/vt-g1 gemma4_b1 --rerun-torch
b g1_old .device/xtask_old /tmp/vt-g1 gemma4_b1
b g1_new2 .device/xtask /tmp/vt-g1 gemma4_b1
C=${CASES:-gemma4_b8,step_728_b1,glm5_72_b1}
b rest_new .device/xtask /tmp/vt-rest "$C" --no-compile --rerun-torch
b rest_old .device/xtask_old /tmp/vt-rest "$C" --no-compile
b rest_new2 .device/xtask /tmp/vt-rest "$C" --no-compile
# keep what comes back small: the per-suite logs only where a suite failed, the bench logs only without a report
grep -q "FAILED\|panicked" "$OUT"/tiers/*.log 2>/dev/null || rm -rf "$OUT/tiers"
for n in g1_new g1_old g1_new2 rest_new rest_old rest_new2; do [ -f "$OUT/$n.md" ] && rm -f "$OUT/$n.log"; done
echo "=== harness"
grep -E "${HARNESS_GREP:-^\\||device}" "$OUT/harness.log"
echo "=== tiers"
sed -n '/=== summary/,$p' "$OUT/tiers.log"
grep -E "panicked|FAILED" "$OUT/tiers.log" | head -8
NC=$(echo "$C" | tr ',' '\n' | wc -l)
for n in g1_new g1_old g1_new2 rest_new rest_old rest_new2; do
    echo "=== $n (the bench's first table)"
    m=1; [ "${n#rest}" != "$n" ] && m=$NC
    [ -f "$OUT/$n.md" ] && grep -m "$m" -E "^\| (gemma|glm|step)[^|]*\| [0-9.]+ \| [0-9.]+ \|" "$OUT/$n.md"
    [ -f "$OUT/$n.md" ] || tail -3 "$OUT/$n.log"
done
