#!/usr/bin/env bash
# One GPU-machine call for issue 41: compute-sanitizer's racecheck and initcheck on `vtower encode`
# of each fixture family, with every reported hazard and uninitialised read attributed to the
# kernel it was found in (counted per kernel), on the card's own tier and on the tiers named in
# TIERS. Prints a table last. Needs, carried: .device/facade/vtower(.xz) from
# `cargo xtask gpu-test --prepare`; the tree's fixtures travel with it.
# Environment: TIERS (default "native"), FAMILIES (default "glm5_next step3p7 gemma4"), TOOLS
# (default "racecheck initcheck"), PRECISIONS (`vtower --precision`: default "auto", the tier's own;
# e.g. "bf16 f32 f16"), LIMIT (seconds per run, default 60). A precision the tier refuses (bf16 on
# 7.5) is reported as refused, not run.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/sanitize-out}"
mkdir -p "$OUT"
cd "$ROOT"
[ -f .device/facade/vtower.xz ] && xz -d -f .device/facade/vtower.xz
chmod +x .device/facade/vtower
export NVCC=/nonexistent-nvcc
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
[ -n "$CS" ] || { echo "no compute-sanitizer"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
IMG=fixtures/images/coffee_144x96.jpg
rows=()
for tier in ${TIERS:-native}; do
    if [ "$tier" = native ]; then unset GPU_CORE_FORCE_TIER; else export GPU_CORE_FORCE_TIER="$tier"; fi
    for fam in ${FAMILIES:-glm5_next step3p7 gemma4}; do
      for prec in ${PRECISIONS:-auto}; do
        if [ "$tier" = 7.5 ] && [ "$prec" = bf16 ]; then
            rows+=("| $tier | $fam | $prec | — | refused by the tier (no bf16 tensor cores) | — | — | — |")
            continue
        fi
        for tool in ${TOOLS:-racecheck initcheck}; do
            base="${tool}_${fam}_${prec}_${tier}"
            log="$OUT/$base.log"
            extra=() pflag=()
            [ "$prec" = auto ] || pflag=(--precision "$prec")
            [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
            t0=$(date +%s)
            timeout "${LIMIT:-60}" "$CS" --tool "$tool" "${extra[@]}" --print-limit 100000 \
                .device/facade/vtower encode --device cuda "${pflag[@]}" --model "fixtures/models/$fam" \
                --image "$IMG" --out "/tmp/sanitize_$fam.safetensors" > "$log" 2>&1
            rc=$?
            summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 | sed 's/=========//')
            # the kernel each report names: racecheck's "Thread (…) at <kernel>+0x…" lines (both
            # sides of a hazard), initcheck's outermost "Device Frame: <kernel>+0x…" (the kernel
            # entry) or, without device frames, its "at <function>+0x…" line
            python3 - "$log" > "$OUT/$base.kernels" <<'PY'
import collections, re, sys
text = open(sys.argv[1], errors="replace").read()
counts = collections.Counter()
for report in re.split(r"========= (?:Error: |Uninitialized )", text)[1:]:
    names = set(re.findall(r"Thread \([0-9,]+\) at ([A-Za-z_][A-Za-z0-9_]*)", report))
    if not names:
        frames = re.findall(r"Device Frame: ([A-Za-z_][A-Za-z0-9_]*)\+", report)
        at = re.findall(r"\bat (?:void )?([A-Za-z_][A-Za-z0-9_]*)", report)
        names = {frames[-1]} if frames else set(at[:1])
    for n in names:
        counts[n] += 1
for name, n in counts.most_common():
    print(n, name)
PY
            top=$(head -4 "$OUT/$base.kernels" | awk '{printf "%s %s; ", $2, $1}')
            rows+=("| $tier | $fam | $prec | $tool | rc $rc | ${summary:-no summary} | ${top:-none} | $(( $(date +%s) - t0 )) s |")
        done
      done
    done
done
unset GPU_CORE_FORCE_TIER
echo "| tier | family | precision | tool | exit | summary | kernels named (reports) | time |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
