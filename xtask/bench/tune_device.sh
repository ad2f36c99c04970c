#!/usr/bin/env bash
# One GPU-machine call comparing GEMM algorithm choice end to end: gpu-core's GEMM GPU tests (tuning keeps an
# accumulating GEMM exact), then `xtask bench --no-compile` three times in a row with
# --gemm-tuning measured / heuristic / measured (the repeat shows the run-to-run spread).
# Needs, carried: .device/gpu_core_tests and .device/bench/xtask (xz allowed) and .whl (see bench_device.sh).
# Reports land in $OUT/r1..r3; the speed columns print after each run.
for f in $(find .device -name '*.xz'); do xz -d -f "$f" && chmod +x "${f%.xz}"; done
timeout 90 ./.device/gpu_core_tests --ignored --test-threads=1 --nocapture gemm 2>&1 | grep -E "PARITY|GEMM-TUNED|test result|panicked" | cut -c1-300
i=0
for m in measured heuristic measured; do
  i=$((i+1))
  OUT=/tmp/b_$i BENCH_ARGS="--no-compile --gemm-tuning $m" LIMIT=200 bash xtask/bench/bench_device.sh > /tmp/b_$i.txt 2>&1
  echo "== run $i $m rc=$?"; mkdir -p "$OUT/r$i"; cp /tmp/b_$i/bench_report.md /tmp/b_$i.txt "$OUT/r$i/" 2>/dev/null
  sed -n '/^| case | ours ms/,/^$/p' /tmp/b_$i/bench_report.md | cut -d'|' -f2-4,8-9
done
