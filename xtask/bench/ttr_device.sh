#!/usr/bin/env bash
# One GPU-machine call for issue 43 (time to rows at batch 1): where one image's time goes, from
# its bytes to rows on the device, for gemma4, glm5_next and step3p7 at full size.
#   1. `xtask prep-breakdown --save`: writes the two JPEGs (1920×1080 and 1304×896, quality 90,
#      the fixture photo upscaled) and times the host stages alone on this machine's cores
#      (admission, decode, resize, norm+patch, the tower's host conversion to bf16);
#   2. full-size random weights for the three families with the release processor configs
#      (xtask/bench/py_e2e.py `build`: torch_anchor.py's families, upstream's processor classes);
#   3. `xtask api-bench --batch 1` per family (gemma4 and glm5_next on the 1920×1080 JPEG,
#      step3p7 on the 1304×896 one: six 504 crops and the 728 global view): end to end through
#      Model::encode_device, then the per-request breakdown (admission, decode, prep, to bf16,
#      upload, tower, rows back), each stage timed alone.
# The tables print last.
#
# Build and stage here (a machine with cargo and nasm; no GPU needed), from the repository root:
#   CARGO_TARGET_DIR=/work/main/target bash xtask/bench/ttr_device.sh --stage
# which runs `VT_REQUIRE_JPEG_SIMD=1 cargo build --release --locked -p xtask` (refused where
# libjpeg-turbo was built without nasm's SIMD) and writes the binary, stripped and xz'd, to
# .device/ttr/xtask.xz; with OLD_BIN=<another xtask binary> also .device/ttr/xtask_old.xz, and the
# device run then times prep-breakdown with both and api-bench new, old, new on the same weights.
# Then on the device (no cargo there), from the repository root:
#   OUT=$OUT bash xtask/bench/ttr_device.sh
# carry [".device/ttr", ".whl"] (.whl/transformers-5.23.0-*.whl, as bench_device.sh; the tree
# itself travels: fixtures/, xtask/bench/).
#
# Environment (all optional): ITERS (timed calls per measurement, default 30), FAMILIES (default
# gemma4,glm5_next,step3p7), API_S (each api-bench's limit in seconds, default 150),
# THREADS (e.g. "8 12": api-bench of the new binary again with RAYON_NUM_THREADS at each),
# BENCH_CASES (e.g. gemma4_b1: then `xtask bench --cases BENCH_CASES` also runs, our towers against
# transformers' eager and torch.compile in the same run, limit BENCH_S, default 240 s),
# PIPE_IMAGES (e.g. 256: then `xtask pipeline --images PIPE_IMAGES`, the stream measure — end to
# end against the tower alone on step3p7 at the release's size — limit PIPE_S, default 300 s).
# Logs go to $OUT.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.device/ttr"

if [ "${1:-}" = "--stage" ]; then
    set -e
    cd "$ROOT"
    T="${CARGO_TARGET_DIR:-$ROOT/target}"
    # A libjpeg-turbo without SIMD decodes about 2x slower: the decode column would measure the
    # build, not the code (docs/PERF.md v0.16). Refuse it (vision-prep's build script).
    VT_REQUIRE_JPEG_SIMD=1 cargo build --release --locked -p xtask
    rm -rf "$D" && mkdir -p "$D"
    # stripped and xz'd: two binaries must fit the call's 64 MiB beside the slimmed tree
    strip --strip-debug -o "$D/xtask" "$T/release/xtask"
    xz -T0 -9 "$D/xtask"
    if [ -n "${OLD_BIN:-}" ]; then
        strip --strip-debug -o "$D/xtask_old" "$OLD_BIN"
        xz -T0 -9 "$D/xtask_old"
    fi
    ls -l "$D"
    exit 0
fi

OUT=${OUT:-/tmp/ttr_out}
WORK=/tmp/vt-ttr
ITERS=${ITERS:-30}
mkdir -p "$OUT" "$WORK"
cd "$ROOT"
for b in xtask xtask_old; do
    [ -f "$D/$b.xz" ] && xz -dc "$D/$b.xz" > "/tmp/$b" && chmod +x "/tmp/$b"
done
X=/tmp/xtask
export VT_FIXTURES="$ROOT/fixtures" RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/transformers-5.23.0-*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used --format=csv
echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; setup $(( $(date +%s) - T0 )) s"

"$X" prep-breakdown --iters "$ITERS" --save "$WORK/images" > "$OUT/prep_breakdown.txt" 2>&1
echo "prep-breakdown rc=$? ($(( $(date +%s) - T0 )) s)"
if [ -x /tmp/xtask_old ]; then
    /tmp/xtask_old prep-breakdown --iters "$ITERS" > "$OUT/prep_breakdown_old.txt" 2>&1
    echo "prep-breakdown (old) rc=$? ($(( $(date +%s) - T0 )) s)"
fi

FAMILIES=${FAMILIES:-gemma4,glm5_next,step3p7}
python3 - "$WORK" "$FAMILIES" > "$OUT/weights_log.txt" 2>&1 <<'EOF'
import sys, time
sys.path.insert(0, "xtask/bench")
import py_e2e
import torch
work, families = sys.argv[1], sys.argv[2].split(",")
for family in families:
    t0 = time.time()
    d, fam = py_e2e.build(family, work, False, "cuda")
    del fam
    torch.cuda.empty_cache()
    print(f"{family}: full-size random weights and release processor config in {d} ({time.time() - t0:.1f} s)")
EOF
echo "weights rc=$? ($(( $(date +%s) - T0 )) s)"
cat "$OUT/weights_log.txt" | grep -v Warning | tail -5

# With an old binary staged: new, old, new again on the same weights and image (A/B/A)
RUNS="new"
[ -x /tmp/xtask_old ] && RUNS="new old new2"
for n in ${THREADS:-}; do RUNS="$RUNS t$n"; done
for family in ${FAMILIES//,/ }; do
    image="$WORK/images/photo_1920x1080.jpg"
    [ "$family" = step3p7 ] && image="$WORK/images/photo_1304x896.jpg"
    for r in $RUNS; do
        x=$X
        [ "$r" = old ] && x=/tmp/xtask_old
        sfx=""
        [ "$r" = new ] || sfx="_$r"
        threads=""
        [ "${r#t}" != "$r" ] && threads="${r#t}"
        RAYON_NUM_THREADS="$threads" timeout "${API_S:-150}" "$x" api-bench --model "$WORK/$family" --image "$image" \
            --batch 1 --iters "$ITERS" --warmup 5 > "$OUT/api_bench_$family$sfx.txt" 2>&1
        echo "api-bench $family ($r) rc=$? ($(( $(date +%s) - T0 )) s)"
    done
done

if [ -n "${BENCH_CASES:-}" ]; then
    timeout "${BENCH_S:-240}" "$X" bench --torch-out "$WORK/bench" --rerun-torch --cases "$BENCH_CASES" \
        --deadline $(( ${BENCH_S:-240} - 60 )) --report "$OUT/bench_report.md" > "$OUT/bench_log.txt" 2>&1
    echo "xtask bench $BENCH_CASES rc=$? ($(( $(date +%s) - T0 )) s)"
fi
if [ -n "${PIPE_IMAGES:-}" ]; then
    timeout "${PIPE_S:-300}" "$X" pipeline --work "$WORK/pipeline" --images "$PIPE_IMAGES" \
        --deadline $(( ${PIPE_S:-300} - 60 )) --report "$OUT/pipeline_report.md" > "$OUT/pipeline_log.txt" 2>&1
    echo "xtask pipeline rc=$? ($(( $(date +%s) - T0 )) s)"
fi

echo
echo "=== host stages alone, this machine (xtask prep-breakdown) ==="
sed -n '/^prep breakdown/,$p' "$OUT/prep_breakdown.txt"
if [ -f "$OUT/prep_breakdown_old.txt" ]; then
    echo "=== the same, old binary ==="
    sed -n '/^prep breakdown/,$p' "$OUT/prep_breakdown_old.txt"
fi
for family in ${FAMILIES//,/ }; do
    for r in $RUNS; do
        sfx=""
        [ "$r" = new ] || sfx="_$r"
        f="$OUT/api_bench_$family$sfx.txt"
        echo
        echo "=== $family b1 ($r): api-bench ==="
        grep -E '^\{"batch|^\{"family' "$f" | cut -c1-400
        sed -n '/own stages/,$p' "$f"
        grep -iE 'error|panicked' "$f" | head -5
    done
done
if [ -s "$OUT/bench_report.md" ]; then
    echo "=== xtask bench ($BENCH_CASES) ==="
    grep -E '^\| |^#|TFLOP|J/image' "$OUT/bench_report.md" | cut -c1-300 | head -40
elif [ -n "${BENCH_CASES:-}" ]; then
    tail -15 "$OUT/bench_log.txt"
fi
if [ -s "$OUT/pipeline_report.md" ]; then
    echo "=== xtask pipeline (the stream measure) ==="
    cat "$OUT/pipeline_report.md"
elif [ -n "${PIPE_IMAGES:-}" ]; then
    tail -15 "$OUT/pipeline_log.txt"
fi
echo "total $(( $(date +%s) - T0 )) s"
