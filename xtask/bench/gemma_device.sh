#!/usr/bin/env bash
# One GPU-machine call for the Gemma-4 CUDA tower: parity on the fixtures (carried xtask binary),
# the full-size upstream oracle, then `xtask gemma-check` (rel-L2 + timings). Needs, carried:
# .device/gemma/xtask (cargo build --release -p xtask, stripped) and .whl/transformers-5.23.0.
# Writes full logs under $OUT; prints a short table last.
set -u
OUT=${OUT:-/tmp/gemma_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/transformers-5.23.0-*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used --format=csv
T0=$(date +%s)
VT_FIXTURES=$PWD/fixtures ./.device/gemma/xtask parity > "$OUT/parity.txt" 2>&1
echo "parity rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "^gemma4" "$OUT/parity.txt" | grep cuda | awk '{printf "%s %s %s %s %s %s %s\n", $1,$2,$3,$4,$5,$6,$8}' > "$OUT/parity_gemma_cuda.txt"
grep -E "^gemma4.*cuda.*(FAIL|not)" "$OUT/parity.txt" | head -20
tail -1 "$OUT/parity.txt"
T1=$(date +%s)
python3 xtask/bench/gemma_fullsize.py /tmp/g4repo /tmp/g4case > "$OUT/oracle.txt" 2>&1
echo "oracle rc=$? ($(( $(date +%s) - T1 )) s)"; tail -4 "$OUT/oracle.txt"
T2=$(date +%s)
./.device/gemma/xtask gemma-check /tmp/g4repo /tmp/g4case > "$OUT/check.txt" 2>&1
echo "gemma-check rc=$? ($(( $(date +%s) - T2 )) s)"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "=== gemma cuda parity (variant source case stage precision rel-L2 verdict) ==="
cat "$OUT/parity_gemma_cuda.txt"
echo "=== gemma-check ==="
cat "$OUT/check.txt"
