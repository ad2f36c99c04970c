#!/usr/bin/env bash
# One GPU-machine call for issue 43's stream measure: `xtask pipeline --images 256` (step3p7 at
# the release's size, 256 mixed PNG and JPEG images through `encode_stream`, end to end against
# the tower alone on the same passes) with the new binary, then the old one on the same weights
# and images (A/B in one call, on one card). The reports print last.
#
# Carried: .device/all.tar.xz (`cargo xtask gpu-test --prepare`, stripped, tar | xz, as
# kernels/stage_landing.sh makes it: its xtask is the new binary) and .device/ttr/xtask_old.xz
# (the old xtask, stripped and xz'd). No transformers needed.
# Environment (optional): IMAGES (default 256), NEW_S / OLD_S (each run's limit in seconds, default
# 200 / 150; the old run skips the staged measurement, which only the new changes).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT=${OUT:-/tmp/stream_out}
WORK=/tmp/vt-stream
mkdir -p "$OUT" "$WORK"
cd "$ROOT"
T0=$(date +%s)
if [ -f .device/all.tar.xz ]; then
    tar -xJf .device/all.tar.xz -C .device && rm .device/all.tar.xz
fi
[ -f .device/ttr/xtask_old.xz ] && xz -dc .device/ttr/xtask_old.xz > /tmp/xtask_old && chmod +x /tmp/xtask_old
chmod +x .device/xtask
export VT_FIXTURES="$ROOT/fixtures" RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "$(nproc) cores; setup $(( $(date +%s) - T0 )) s"
NEW_S=${NEW_S:-200}
timeout "$NEW_S" .device/xtask pipeline --work "$WORK" --images "${IMAGES:-256}" \
    --deadline $(( NEW_S - 40 )) --report "$OUT/pipeline_new.md" > "$OUT/pipeline_new_log.txt" 2>&1
echo "pipeline (new) rc=$? ($(( $(date +%s) - T0 )) s)"
if [ -x /tmp/xtask_old ]; then
    # the weights the new run wrote; the staged measurement skipped (deadline 0)
    timeout "${OLD_S:-150}" /tmp/xtask_old pipeline --model "$WORK/step3p7-random" --work "$WORK" \
        --images "${IMAGES:-256}" --deadline 0 --report "$OUT/pipeline_old.md" \
        > "$OUT/pipeline_old_log.txt" 2>&1
    echo "pipeline (old) rc=$? ($(( $(date +%s) - T0 )) s)"
fi
for r in new old; do
    echo "=== $r"
    if [ -s "$OUT/pipeline_$r.md" ]; then
        grep -E '^\| (tower|end|CPU)|^End to end|Rows:|passes' "$OUT/pipeline_$r.md" | cut -c1-420
    elif [ -f "$OUT/pipeline_${r}_log.txt" ]; then
        tail -8 "$OUT/pipeline_${r}_log.txt"
    fi
done
echo "total $(( $(date +%s) - T0 )) s"
