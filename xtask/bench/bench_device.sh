#!/usr/bin/env bash
# One GPU-machine call for `cargo xtask bench`: our towers against upstream PyTorch (eager SDPA and
# torch.compile) on the anchors' shapes, with the ceilings measured in the same run.
# Needs, carried: .device/bench/xtask (cargo build --release -p xtask, stripped) and
# .whl/transformers-5.23.0-*.whl. Run from the repository root.
#
# Environment (all optional):
#   CASES      cases or families for --cases (default: all eight)
#   DEADLINE   seconds after which the PyTorch side starts no new torch.compile case (default 400)
#   LIMIT      wall-clock limit for the whole bench in seconds (default 560)
#   BENCH_ARGS more arguments for `xtask bench` (e.g. --no-compile, --iters 30)
#
# Writes under $OUT: bench_log.txt (everything), bench_report.md (the block for docs/PERF.md),
# anchor.json (PyTorch side), ours.json (our side), warm_logs.txt (the compile workers' logs);
# prints the tables last.
set -u
OUT=${OUT:-/tmp/bench_out}
mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/transformers-5.23.0-*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit,memory.used --format=csv
echo "setup: $(( $(date +%s) - T0 )) s; $(nproc) cores"
WORK=/tmp/vt-bench
rm -rf "$WORK"
set -o pipefail
timeout "${LIMIT:-560}" ./.device/bench/xtask bench --torch-out "$WORK" --rerun-torch \
    --cases "${CASES:-all}" --deadline "${DEADLINE:-400}" --report "$OUT/bench_report.md" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_log.txt" > /dev/null
RC=$?
echo "xtask bench rc=$RC after $(( $(date +%s) - T0 )) s"
cp "$WORK/anchor.json" "$OUT/" 2>/dev/null
cp "$WORK/ours.json" "$OUT/" 2>/dev/null
for f in "$WORK"/logs/*.log; do [ -e "$f" ] && { echo "=== $f"; cat "$f"; }; done > "$OUT/warm_logs.txt" 2>/dev/null
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw,memory.used --format=csv,noheader
echo "=== progress (PyTorch side and ours) ==="
grep -E "^\[" "$OUT/bench_log.txt" | tail -60
if [ -s "$OUT/bench_report.md" ]; then
    echo "=== report ($OUT/bench_report.md) ==="
    cat "$OUT/bench_report.md"
else
    echo "=== no report: last lines of the log ==="
    tail -40 "$OUT/bench_log.txt"
fi
