#!/usr/bin/env bash
# One GPU-machine call for a change to the portable tiers' kernels (issue 39), A/B in one call:
# (1) gpu-core's GPU tests and `xtask parity --require-cuda` with the new binaries on the card's own tier
# and on the forced tier (kernels/tiers_device.sh), (2) `xtask bench` with that tier forced and PyTorch's
# SDPA forced to FlashAttention-2 (eager and torch.compile in the same run: the anchor), (3) the
# previous binary's xtask with the same tier forced on the same saved inputs and PyTorch results, (4) both
# binaries' f16 towers on the card's own tier (F16_CASES) while time is left.
# A forced tier is a test of code paths on this card, not the other card's speed. Prints one table last.
# Needs, carried: .device/ab.tar.xz (a tar of gpu_core_tests, xtask and xtask_old, stripped, xz),
# .whl/transformers-5.23.0-*.whl. Environment: TIER (default 8.0), CASES (bench cases), BENCH_S (seconds
# for step 2, default 330), ITERS (timed runs per case, default 10), TOTAL (every step ends by this many seconds,
# default 560: set it under the call's limit, so the table is printed).
set -u
OUT=${OUT:-/tmp/tier-ab-out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
tar -xJf .device/ab.tar.xz -C .device || exit 1
chmod +x .device/gpu_core_tests .device/xtask .device/xtask_old
export VT_FIXTURES=$PWD/fixtures NVCC=/nonexistent-nvcc PYTHONUNBUFFERED=1
TIER=${TIER:-8.0}
TOTAL=${TOTAL:-560}
left() { echo $(( TOTAL - $(el) )); }
TIERS="native $TIER" FACADE_TIERS=" " OUT="$OUT/tiers" timeout 120 bash kernels/tiers_device.sh > "$OUT/tiers.log" 2>&1
echo "tiers rc=$? at $(el) s"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/transformers-5.23.0-*.whl
C=${CASES:-glm5_96x128_b1,glm5_72_b8,step_728_b1,step_504_b6,step_728_b8}
VT_SDPA_BACKEND=flash GPU_CORE_FORCE_TIER=$TIER PYTHONPATH=/tmp/site timeout $(( $(left) - 60 < ${BENCH_S:-330} ? $(left) - 60 : ${BENCH_S:-330} )) .device/xtask bench \
    --torch-out /tmp/vt-ab --rerun-torch --iters "${ITERS:-10}" --cases "$C" --report "$OUT/bench_new.md" > "$OUT/bench_new.log" 2>&1
echo "bench new rc=$? at $(el) s"
VT_SDPA_BACKEND=flash GPU_CORE_FORCE_TIER=$TIER PYTHONPATH=/tmp/site timeout "$(left)" .device/xtask_old bench \
    --torch-out /tmp/vt-ab --iters "${ITERS:-10}" --cases "$C" --report "$OUT/bench_old.md" > "$OUT/bench_old.log" 2>&1
echo "bench old rc=$? at $(el) s"
# (4) while time is left: the f16 towers on the card's own tier (the same m16n8k16 kernels), new then old
for b in new old; do
    x=.device/xtask; [ $b = old ] && x=.device/xtask_old
    [ "$(left)" -gt 40 ] || { echo "f16 $b skipped at $(el) s"; continue; }
    PYTHONPATH=/tmp/site timeout "$(left)" $x bench --torch-out /tmp/vt-ab --iters "${ITERS:-10}" \
        --cases "${F16_CASES:-glm5_96x128_b1,step_728_b1}" --precision f16 --report "$OUT/f16_$b.md" > "$OUT/f16_$b.log" 2>&1
    echo "f16 $b rc=$? at $(el) s"
done
echo "=== tiers"
sed -n '/=== summary/,$p' "$OUT/tiers.log"
grep -E "panicked|FAILED" "$OUT/tiers.log" | head -8
for b in f16_new f16_old; do
    echo "=== $b (native tier)"
    [ -f "$OUT/$b.md" ] && grep -E "^\|" "$OUT/$b.md" | head -5
done
for b in new old; do
    echo "=== bench $b (tier $TIER forced, PyTorch SDPA forced to flash)"
    [ -f "$OUT/bench_$b.md" ] && grep -E "^\|" "$OUT/bench_$b.md" | head -8
    [ -f "$OUT/bench_$b.md" ] || tail -5 "$OUT/bench_$b.log"
done
