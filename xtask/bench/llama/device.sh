#!/usr/bin/env bash
# One GPU-machine call for the llama.cpp peer (issue 22): build llama.cpp's clip with CUDA, run
# `xtask bench` (ours, eager and torch.compile) on the cases, then llama.cpp on exactly the same
# weights and inputs; print one table. Run from the repository root.
#
# Needs, carried: .device/llama (llama-src.tar.xz from xtask/bench/llama/fetch_trim.sh); for the
# "bench" step also what bench_device.sh needs (.device/bench/xtask, .whl/transformers-5.23.0-*.whl).
#
# Environment (all optional):
#   STEPS    default "build bench llama":
#              build  xtask/bench/llama/build.sh (CUDA, sm_90, all cores); skipped when $WORK already
#                     holds the harness built from the same archive (a warm machine's second call)
#              bench  bench_device.sh with $CASES: torch_anchor.py writes weights, inputs, torch rows
#                     and the f32 reference into $ANCHOR, and `xtask bench` times ours there
#              anchor instead of "bench" when no xtask is carried: torch_anchor.py --no-compile
#                     alone (weights, inputs, eager timings, f32 rows; no ours, no torch.compile)
#              llama  GGUFs from $ANCHOR's weights, the cases through llama_clip_bench, the report
#   CASES    cases or families (default gemma4; glm5_next and step3p7 run in llama.cpp too)
#   ANCHOR   the anchor directory (default /tmp/vt-bench, where bench_device.sh puts it)
#   WORK     llama.cpp's source, build, GGUFs and images (default /tmp/vt-llama)
#   ITERS    timed runs per llama.cpp case (default 20, as the bench), WARMUP (default 3)
#   VARIANTS llama.cpp variants (default per family, llama_peer.py RUN_VARIANTS)
#   LIMIT    seconds for the whole call (default 570): a step that cannot start in time is skipped
#   MODE     cuda (default) or cpu: with cpu, a plumbing test on a machine without a GPU
#            (torch_anchor --tiny on the CPU, llama.cpp's CPU backend)
#
# Writes under $OUT: llama_log.txt (everything), llama.jsonl (one line per llama.cpp run),
# llama_report.md (the tables for docs/PERF.md), and what bench_device.sh writes (bench_report.md,
# anchor.json, ours.json). Prints the tables last.
set -u
OUT=${OUT:-/tmp/llama_out}
mkdir -p "$OUT"
T0=$(date +%s)
STEPS=${STEPS:-build bench llama}
CASES=${CASES:-gemma4}
ANCHOR=${ANCHOR:-/tmp/vt-bench}
export WORK=${WORK:-/tmp/vt-llama}
MODE=${MODE:-cuda}
LIMIT=${LIMIT:-570}
export PYTHONUNBUFFERED=1
LOG=$OUT/llama_log.txt
: > "$LOG"
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
# The tensors every side reads (seeded by torch_anchor.py, so equal across calls): their hashes.
fingerprints() {
    for f in "$ANCHOR"/*/weights/*.safetensors "$ANCHOR"/*/*.inputs.safetensors; do
        [ -e "$f" ] && say "sha256 $(sha256sum "$f" | cut -c1-16) ${f#$ANCHOR/}"
    done
}

if [ -n "$(ls .whl/transformers-5.23.0-*.whl 2>/dev/null)" ] && [ ! -d /tmp/site/transformers ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/transformers-5.23.0-*.whl >> "$LOG" 2>&1 || say "transformers wheel install failed"
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
[ "$MODE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used --format=csv,noheader | tee -a "$LOG"
say "steps: $STEPS; cases: $CASES; $(nproc) cores; mode $MODE"

BIN=$WORK/build-$MODE/llama_clip_bench
STAMP=$WORK/build-$MODE/.archive-sha256
SHA=$(sha256sum .device/llama/llama-src.tar.xz 2>/dev/null | cut -d' ' -f1)
if has build; then
    if [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$SHA" ]; then
        say "build: $BIN already built from this archive, kept"
    else
        say "build: start"
        MODE=$MODE bash xtask/bench/llama/build.sh 2>&1 | tee -a "$LOG" | grep -E "^llama.cpp peer build|error|Error|nvcc|cmake version|Using CMAKE_CUDA" 
        [ -x "$BIN" ] && echo "$SHA" > "$STAMP"
    fi
    [ -x "$BIN" ] || { say "build failed: see $LOG"; tail -30 "$LOG"; exit 1; }
fi

if has bench; then
    # gemma4's bench takes ~4 min (weights, compile workers, both sides) and llama.cpp ~1.5 min after it
    if [ "$(left)" -lt 330 ]; then
        say "bench: skipped, $(left) s left (a second call on the warm machine: the build is kept)"
    elif [ ! -x .device/bench/xtask ]; then
        say "bench: no .device/bench/xtask carried; use STEPS with 'anchor' instead"
    else
        say "bench: bench_device.sh CASES=$CASES (ours + torch eager + torch.compile), limit $(( $(left) - 120 )) s"
        OUT=$OUT CASES=$CASES LIMIT=$(( $(left) - 120 )) DEADLINE=$(( $(left) - 200 )) \
            bash xtask/bench/bench_device.sh >> "$LOG" 2>&1
        say "bench: done"
        fingerprints
    fi
fi
if has anchor; then
    TINY=(); [ "$MODE" = cpu ] && TINY=(--tiny)
    say "anchor: torch_anchor.py --no-compile --cases $CASES"
    python3 xtask/bench/torch_anchor.py --out "$ANCHOR" --cases "$CASES" --no-compile "${TINY[@]}" >> "$LOG" 2>&1 \
        || say "anchor: torch_anchor.py failed"
    fingerprints
fi

if has llama; then
    [ -f "$ANCHOR/anchor.json" ] || { say "llama: no $ANCHOR/anchor.json (run the bench or anchor step)"; exit 1; }
    [ -x "$BIN" ] || { say "llama: no harness at $BIN (run the build step)"; exit 1; }
    [ -d "$WORK/llama.cpp/gguf-py" ] || tar -C "$WORK" -xJf .device/llama/llama-src.tar.xz
    export PYTHONPATH=$WORK/llama.cpp/gguf-py${PYTHONPATH:+:$PYTHONPATH}
    CPUFLAG=(); [ "$MODE" = cpu ] && CPUFLAG=(--cpu)
    VFLAG=(); [ -n "${VARIANTS:-}" ] && VFLAG=(--variants "$VARIANTS")
    rm -f "$OUT/llama.jsonl"
    say "llama: cases $CASES"
    L=$(left); [ "$L" -lt 30 ] && L=30
    timeout "$L" python3 xtask/bench/llama/llama_peer.py run --anchor "$ANCHOR" --work "$WORK/run" \
        --bench "$BIN" --llama "$WORK/llama.cpp" --cases "$CASES" --iters "${ITERS:-20}" --warmup "${WARMUP:-3}" \
        --results "$OUT/llama.jsonl" "${CPUFLAG[@]}" "${VFLAG[@]}" >> "$LOG" 2>&1 \
        || say "llama: run stopped (rc $?): see llama_log.txt"
    cp "$ANCHOR/anchor.json" "$OUT/" 2>/dev/null
    cp "$ANCHOR/ours.json" "$OUT/" 2>/dev/null
    say "llama: done"
    [ "$MODE" = cuda ] && nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw,memory.used --format=csv,noheader
    echo "=== progress ==="
    grep -E '^\[|"converted"|"error"|^llama.cpp peer build' "$LOG" | cut -c1-240 | tail -40
    if [ -s "$OUT/bench_report.md" ]; then echo "=== xtask bench report ==="; cat "$OUT/bench_report.md"; fi
    [ -s "$OUT/llama.jsonl" ] && python3 xtask/bench/llama/llama_peer.py report --anchor "$ANCHOR" \
        --results "$OUT/llama.jsonl" --out "$OUT/llama_report.md"
fi
say "device.sh done"
