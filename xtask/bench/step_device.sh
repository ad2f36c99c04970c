#!/usr/bin/env bash
# One GPU-machine call for the Step-3.7 CUDA tower: tower-step's GPU test (a regrouped batch with a
# non-square grid, both precisions, against the host reference), parity on the fixtures (carried
# xtask binary; every row, step3p7 CUDA rows condensed at the end), the full-size upstream oracle
# (step_fullsize.py, transformers 5.23 in float32), then `xtask step-check` (rel-L2 against it + timings).
# Needs, carried: .device/step/{xtask,step_cuda_tests} (release builds, stripped) and
# .whl/transformers-5.23.0-*.whl. Writes full logs under $OUT; prints a short table last.
# TEST_S / PARITY_S / ORACLE_S / CHECK_S bound the steps (defaults fit a 600 s call).
set -u
OUT=${OUT:-/tmp/step_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/transformers-5.23.0-*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used --format=csv
T0=$(date +%s)
VT_FIXTURES=$PWD/fixtures timeout "${TEST_S:-60}" ./.device/step/step_cuda_tests --ignored --nocapture --test-threads=1 > "$OUT/test.txt" 2>&1
echo "tower-step GPU test rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "test result|panicked|rel-L2" "$OUT/test.txt" | head -8
T0=$(date +%s)
VT_FIXTURES=$PWD/fixtures timeout "${PARITY_S:-130}" ./.device/step/xtask parity > "$OUT/parity.txt" 2>&1
echo "parity rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "^step3p7" "$OUT/parity.txt" | grep cuda | awk '{printf "%s %s %s %s %s %s %s\n", $1,$2,$3,$4,$5,$6,$8}' > "$OUT/parity_step_cuda.txt"
grep -E "cuda.*(FAIL|not run)" "$OUT/parity.txt" | cut -c1-220 | head -20
tail -1 "$OUT/parity.txt"
T1=$(date +%s)
timeout "${ORACLE_S:-220}" python3 xtask/bench/step_fullsize.py /tmp/s37repo /tmp/s37case > "$OUT/oracle.txt" 2>&1
echo "oracle rc=$? ($(( $(date +%s) - T1 )) s)"; grep -vE "Loading weights|Writing model" "$OUT/oracle.txt" | tail -5
T2=$(date +%s)
timeout "${CHECK_S:-160}" ./.device/step/xtask step-check /tmp/s37repo /tmp/s37case > "$OUT/check.txt" 2>&1
echo "step-check rc=$? ($(( $(date +%s) - T2 )) s)"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "=== tower-step GPU test (stage rel-L2 vs host) ==="
grep -E "^step3p7" "$OUT/test.txt" | awk '{printf "%s ", $0} END {print ""}' | cut -c1-1500
echo "=== step3p7 cuda parity, worst stage per (source case precision); all rows in $OUT/parity_step_cuda.txt ==="
awk '{k=$2" "$3" "$5; n[k]++; if ($7=="PASS") p[k]++; if (!(k in w) || $6+0 > w[k]+0 || $6=="-") {w[k]=$6; s[k]=$4}}
     END {for (k in n) printf "%s  worst %s (%s)  %d/%d PASS\n", k, w[k], s[k], p[k], n[k]}' "$OUT/parity_step_cuda.txt" | sort
echo "=== step-check ==="
cat "$OUT/check.txt"
