#!/usr/bin/env bash
# One GPU-machine call for issue 41: compute-sanitizer (TOOLS) over gpu-core's kernel tests (TESTS)
# and `vtower encode` of each fixture family (FAMILIES × PRECISIONS), on the card's own tier and on
# the tiers named in TIERS, with every report (memory error, hazard, uninitialised read, barrier
# error) attributed to the kernel it was found in, ours or NVIDIA's library's. Prints a table last;
# exits 1 when any report is in a kernel of ours. Needs, carried: .device/facade/vtower and
# .device/gpu_core_tests from `cargo xtask gpu-test --prepare` (xz-compressed is fine); the tree's
# fixtures travel with it.
# Environment: TIERS (default "native"), FAMILIES (default "glm5_next step3p7 gemma4"; "" for none),
# PRECISIONS (`vtower --precision`; default "auto", the tier's own; e.g. "bf16 f32 f16"; bf16 on
# 7.5 is reported as refused, not run), TOOLS (default "racecheck initcheck"), TESTS (libtest filters
# of gpu_core_tests, e.g. "gpu_tests_attn gpu_tests_f16"; default none), GRAPH_TESTS (libtest
# filters of the facade's `vision_towers_graphs`: eager, captured and replayed passes of each family
# in bf16 and f16, e.g. "gemma_graph glm_graph step_graph"; default none), FACADE_TESTS (other
# staged facade tests, "binary:filter" each, e.g. "vision_towers_cuda:cuda_encode_of_every"), LIMIT (seconds per run,
# default 60; a run past it is reported as not finished), GPU_CORE_POISON_ALLOC (1: every device
# buffer starts as 0xff bytes, NaN; initcheck then counts only reads of memory no command wrote, and
# a read of such memory shows as NaN in the rows; rows are labelled "+poison"), SKIP_LIBRARY (1: NVIDIA's
# library kernels — cuBLASLt's nvjet, cutlass, … — run uninstrumented, so a run checks our kernels
# only and finishes sooner; their rows then say 0 library reports by construction, and are labelled
# "+nolib"; memcheck, initcheck and synccheck only: racecheck with the exclusion fails inside the tool,
# "failed to handle a hardware exception", CUDA 13.0, docs/RELIABILITY.md session 24; so does the
# inclusion, `--kernel-name`, session 25), GPU_CORE_GEMM_TUNING (gpu-core's: `heuristic` runs one
# cuBLASLt algorithm per GEMM shape instead of timing up to 16, so the tool instruments up to 16 times
# fewer NVIDIA kernels; rows are labelled "+heuristic"). racecheck of gemma4's encodes (bf16, f16) does not complete:
# instrumenting cuBLASLt's nvjet GEMM kernels on its shapes takes the process to the machine's 128 GB of
# host memory and the OOM killer ends it (its row then says "killed"; docs/RELIABILITY.md session 25).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/sanitize-out}"
mkdir -p "$OUT"
cd "$ROOT"
for f in .device/facade/vtower .device/facade/vision_towers_graphs .device/facade/vision_towers_cuda .device/gpu_core_tests; do
    [ -f "$f.xz" ] && xz -d -f "$f.xz"
    [ -f "$f" ] && chmod +x "$f"
done
export NVCC=/nonexistent-nvcc
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
[ -n "$CS" ] || { echo "no compute-sanitizer"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
IMG=fixtures/images/coffee_144x96.jpg
rows=()
found_ours=0
# one sanitizer run: tier, target label, precision, tool, then the command; appends a table row
sanitize() {
    local tier="$1" label="$2" prec="$3" tool="$4"; shift 4
    # buffers start as NaN under GPU_CORE_POISON_ALLOC=1 (gpu-core's POISON_ALLOC_ENV): say so
    [ "${GPU_CORE_POISON_ALLOC:-}" = 1 ] && prec="$prec+poison"
    # NVIDIA's kernels left out (SKIP_LIBRARY=1, below): say so
    [ "${SKIP_LIBRARY:-0}" = 1 ] && prec="$prec+nolib"
    # cuBLASLt's first heuristic answer per GEMM shape instead of up to 16 timed candidates
    # (gpu-core's GEMM_TUNING_ENV): one NVIDIA kernel per shape for the tool to instrument
    [ "${GPU_CORE_GEMM_TUNING:-}" = heuristic ] && prec="$prec+heuristic"
    local base="${tool}_${label// /_}_${prec}_${tier}" extra=() t0 rc summary top ours
    [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
    # NVIDIA's library kernels (the names the attribution below calls "library") left
    # uninstrumented: their reports are not ours to fix, and instrumenting them is most of a run's
    # time (not for racecheck, which fails inside the tool with the exclusion: see the header)
    [ "${SKIP_LIBRARY:-0}" = 1 ] && extra+=(--kernel-name-exclude "regex=^(nvjet_|sm[0-9]+_|cutlass|ampere_|turing_|volta_|gemv|gemmk|splitKreduce|cublas|_Z)")
    t0=$(date +%s)
    # the host memory the run peaked at (the tool runs inside the application's process): racecheck of
    # gemma4's encode grows it to the machine's 128 GB and the kernel's OOM killer ends it (session 25)
    local tm=()
    [ -x /usr/bin/time ] && tm=(/usr/bin/time -f "%M" -o "$OUT/$base.rss")
    "${tm[@]}" timeout "${LIMIT:-60}" "$CS" --tool "$tool" "${extra[@]}" --print-limit 100000 "$@" > "$OUT/$base.log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$base.log" | tail -1 | sed 's/=========//')
    [ $rc -eq 124 ] && summary="did not finish in ${LIMIT:-60} s"
    # compute-sanitizer answers 9 when the application was killed by SIGKILL (137 through a shell)
    if [ $rc -eq 9 ] || [ $rc -eq 137 ]; then
        local kb
        kb=$(tail -1 "$OUT/$base.rss" 2> /dev/null | tr -cd 0-9)
        [ -n "$kb" ] && kb=$(awk -v k="$kb" 'BEGIN { printf "%.1f GiB resident, ", k / 1048576 }')
        summary="killed (SIGKILL: out of host memory?) at ${kb}after: ${summary:-no summary}"
    fi
    # the kernel each report names: racecheck's "Thread (…) at <kernel>+0x…" lines (both sides of a
    # hazard), initcheck's and memcheck's outermost "Device Frame: <kernel>+0x…" (the kernel entry)
    # or, without device frames, the "at <function>+0x…" line
    python3 - "$OUT/$base.log" > "$OUT/$base.kernels" <<'PY'
import collections, re, sys
text = open(sys.argv[1], errors="replace").read()
counts = collections.Counter()
# one report per unindented "========= X…" line (memcheck's "Invalid __global__ read", racecheck's
# "Error: … hazard", initcheck's "Uninitialized …", synccheck's "Barrier error …"), but the summaries
reports = re.split(r"(?m)^========= (?=[A-Z])(?!ERROR SUMMARY|RACECHECK SUMMARY|COMPUTE-SANITIZER|LEAK SUMMARY)", text)
for report in reports[1:]:
    if report.startswith("Program hit"):  # an API error the host made (gpu-core's negative tests)
        counts["api-error"] += 1
        continue
    names = set(re.findall(r"Thread \([0-9,]+\) at ([A-Za-z_][A-Za-z0-9_]*)", report))
    if not names:
        frames = re.findall(r"Device Frame: ([A-Za-z_][A-Za-z0-9_]*)\+", report)
        at = re.findall(r"\bat (?:void )?([A-Za-z_][A-Za-z0-9_]*)", report)
        names = {frames[-1]} if frames else set(at[:1])
    for n in names:
        counts[n] += 1
# NVIDIA's kernels (cuBLASLt's nvjet / xmma / cutlass GEMMs and helpers) apart from ours
lib = re.compile(r"^(nvjet_|sm\d+_|cutlass|ampere_|turing_|volta_|gemv|gemmk|splitKreduce|cublas|_Z)")
for name, n in counts.most_common():
    print(n, name, "api" if name == "api-error" else "library" if lib.match(name) else "ours")
PY
    top=$(head -4 "$OUT/$base.kernels" | awk '{printf "%s %s (%s); ", $2, $1, $3}')
    ours=$(awk '$3 == "ours" {s += $1} END {print s + 0}' "$OUT/$base.kernels")
    found_ours=$((found_ours + ours))
    rows+=("| $tier | $label | $prec | $tool | rc $rc | ${summary:-no summary} | $ours | ${top:-none} | $(( $(date +%s) - t0 )) s |")
}
for tier in ${TIERS:-native}; do
    if [ "$tier" = native ]; then unset GPU_CORE_FORCE_TIER; else export GPU_CORE_FORCE_TIER="$tier"; fi
    # gpu-core's kernel tests (small shapes), a libtest filter each: TESTS="gpu_tests_attn gpu_tests_f16"
    for t in ${TESTS:-}; do
        for tool in ${TOOLS:-racecheck initcheck}; do
            sanitize "$tier" "gpu_core_tests $t" "test's" "$tool" .device/gpu_core_tests --ignored --test-threads=1 "$t"
        done
    done
    # the graph tests: each family's forward eager, captured and replayed from a CUDA graph
    for t in ${GRAPH_TESTS:-}; do
        for tool in ${TOOLS:-racecheck initcheck}; do
            sanitize "$tier" "graphs $t" "bf16+f16" "$tool" .device/facade/vision_towers_graphs --ignored --test-threads=1 "$t"
        done
    done
    # any other staged facade test: "binary:filter" (e.g. vision_towers_cuda:cuda_encode_of_every)
    for bt in ${FACADE_TESTS:-}; do
        for tool in ${TOOLS:-racecheck initcheck}; do
            sanitize "$tier" "${bt%%:*} ${bt#*:}" "auto+f32" "$tool" ".device/facade/${bt%%:*}" --ignored --test-threads=1 "${bt#*:}"
        done
    done
    for fam in ${FAMILIES-glm5_next step3p7 gemma4}; do
        for prec in ${PRECISIONS:-auto}; do
            if [ "$tier" = 7.5 ] && [ "$prec" = bf16 ]; then
                rows+=("| $tier | $fam | $prec | — | — | refused by the tier (no bf16 tensor cores) | — | — | — |")
                continue
            fi
            pflag=()
            [ "$prec" = auto ] || pflag=(--precision "$prec")
            for tool in ${TOOLS:-racecheck initcheck}; do
                sanitize "$tier" "$fam" "$prec" "$tool" .device/facade/vtower encode --device cuda "${pflag[@]}" \
                    --model "fixtures/models/$fam" --image "$IMG" --out "/tmp/sanitize_$fam.safetensors"
            done
        done
    done
done
unset GPU_CORE_FORCE_TIER
echo "| tier | target | precision | tool | exit | summary | reports in our kernels | kernels named (reports, whose) | time |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
# a report in a kernel of ours fails the run (NVIDIA's own kernels are listed, not failed: see
# docs/RELIABILITY.md for what the tools cannot follow there)
if [ "$found_ours" -gt 0 ]; then echo "FAILED: $found_ours reports in our kernels"; exit 1; fi
