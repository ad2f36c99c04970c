#!/usr/bin/env bash
# One GPU-machine call for the GLM CUDA tower: glm-check (full-size glm5_next timings on random
# bf16 weights) first, then parity on the fixtures (carried xtask binary; glm CUDA rows kept).
# Needs, carried: .device/glm/xtask (cargo build --release -p xtask, stripped).
# Writes full logs under $OUT; prints a short table last. PARITY_S bounds the parity step.
set -u
OUT=${OUT:-/tmp/glm_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used --format=csv
T0=$(date +%s)
timeout 120 ./.device/glm/xtask glm-check 10 > "$OUT/check.txt" 2>&1
echo "glm-check rc=$? ($(( $(date +%s) - T0 )) s)"
T1=$(date +%s)
VT_FIXTURES=$PWD/fixtures timeout "${PARITY_S:-200}" ./.device/glm/xtask parity > "$OUT/parity.txt" 2>&1
echo "parity rc=$? ($(( $(date +%s) - T1 )) s)"
grep -E "^glm" "$OUT/parity.txt" | grep cuda > "$OUT/parity_glm_cuda.txt"
tail -2 "$OUT/parity.txt"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "=== glm cuda parity rows ==="
cat "$OUT/parity_glm_cuda.txt" | cut -c1-150
echo "=== glm-check ==="
cat "$OUT/check.txt"
