#!/usr/bin/env bash
# Assemble the committed PTX (crates/gpu-core/kernels/ptx/*.ptx) into SASS for the GPUs gpu-core ships
# compiled code for: one compressed fatbin per module in crates/gpu-core/kernels/sass/, and its
# MANIFEST.json (ptxas and
# fatbinary versions, the architectures, the sha256 of every PTX it was assembled from and of every
# fatbin). gpu-core embeds the fatbins and loads the one that matches the device (no JIT); the PTX stays
# the fallback for any other device. A gpu-core test fails when a PTX no longer matches the manifest.
#
# Architectures: the PTX targets sm_90 (`.target sm_90`), which ptxas assembles for sm_90 and for the
# later families that accept sm_90 PTX; `*_sm90a.ptx` (wgmma) targets sm_90a, which exists for
# compute capability 9.0 alone. The older tiers (gpu_core::tier) get fatbins of their own, from the PTX
# kernels/build_ptx.sh writes into ptx/sm80/ and ptx/sm75/ (not committed: the fatbins carry it,
# compressed): sass/sm80/<module>.fatbin holds SASS for sm_80, sm_86 and sm_89 and the compute_80 PTX
# (the driver JIT-compiles it on any other Ampere/Ada part, and on a newer card forced to that tier),
# sass/sm75/<module>.fatbin SASS for sm_75 and the compute_75 PTX.
# Usage: kernels/build_sass.sh [OUT_DIR]   (default: crates/gpu-core/kernels/sass, the committed SASS)
# Environment: PTXAS, FATBINARY (default: on PATH). All ptxas flags live here and nowhere else.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$HERE/../crates/gpu-core/kernels"  # the shipped kernels, inside gpu-core's package
OUT="${1:-$SRC/sass}"
PTXAS="${PTXAS:-ptxas}"
FATBINARY="${FATBINARY:-fatbinary}"
read -r -a ARCHS <<< "${SASS_ARCHS:-90 100 120}"  # SASS_ARCHS narrows the list (e.g. an older toolkit)
ARCHS_90A=(90a)
# tier directory -> the SASS architectures its fatbins hold (the PTX is the tier's lowest, the number in
# the directory's name)
declare -A TIER_ARCHS=([sm80]="80 86 89" [sm75]="75")
PTXAS_FLAGS=(-O3)
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"  # absolute: the fatbinary step runs inside $TMP
cd "$SRC/ptx"
for ptx in $(ls *.ptx | sort); do
    name="${ptx%.ptx}"
    archs=("${ARCHS[@]}")
    case "$name" in *_sm90a) archs=("${ARCHS_90A[@]}") ;; esac
    images=()
    # ptxas writes each `.file`'s timestamp and size into the cubin's line table, and where the
    # PTX gives none it stats the named source on this machine: its mtime (any checkout's time)
    # would make every build differ. Assemble a copy whose `.file` lines say 0, 0 (the paths and
    # the line info stay).
    sed -E 's/^([[:space:]]*\.file[[:space:]]+[0-9]+[[:space:]]+"[^"]*")[[:space:]]*$/\1, 1, 0/' "$ptx" > "$TMP/$ptx"
    for a in "${archs[@]}"; do
        "$PTXAS" "${PTXAS_FLAGS[@]}" -arch="sm_$a" "$TMP/$ptx" -o "$TMP/$name.sm_$a.cubin"
        # A relative name: fatbinary records each image's file name, and a temporary directory's
        # random path in it would make every build differ from the committed fatbins.
        images+=("--image3=kind=elf,sm=$a,file=$name.sm_$a.cubin")
    done
    (cd "$TMP" && "$FATBINARY" --create="$OUT/$name.fatbin" --compress-all "${images[@]}")
    echo "$name: sm_${archs[*]// /, sm_} -> $(stat -c %s "$OUT/$name.fatbin") bytes"
done
# the older tiers: SASS for each of the tier's architectures plus the tier's PTX itself
for tier in $(printf '%s\n' "${!TIER_ARCHS[@]}" | sort); do
    ptx_arch="${tier#sm}"
    mkdir -p "$OUT/$tier" "$TMP/$tier"
    [ -d "$tier" ] || { echo "ptx/$tier missing: run kernels/build_ptx.sh first" >&2; exit 1; }
    for ptx in $(cd "$tier" && ls *.ptx | sort); do
        name="${ptx%.ptx}"
        sed -E 's/^([[:space:]]*\.file[[:space:]]+[0-9]+[[:space:]]+"[^"]*")[[:space:]]*$/\1, 1, 0/' "$tier/$ptx" > "$TMP/$tier/$ptx"
        images=()
        for a in ${TIER_ARCHS[$tier]}; do
            "$PTXAS" "${PTXAS_FLAGS[@]}" -arch="sm_$a" "$TMP/$tier/$ptx" -o "$TMP/$tier/$name.sm_$a.cubin"
            images+=("--image3=kind=elf,sm=$a,file=$name.sm_$a.cubin")
        done
        images+=("--image3=kind=ptx,sm=$ptx_arch,file=$ptx")
        (cd "$TMP/$tier" && "$FATBINARY" --create="$OUT/$tier/$name.fatbin" --compress-all "${images[@]}")
        echo "$tier/$name: sm_${TIER_ARCHS[$tier]// /, sm_} + compute_$ptx_arch PTX -> $(stat -c %s "$OUT/$tier/$name.fatbin") bytes"
    done
done
{
    echo "{"
    echo "  \"ptxas\": \"$("$PTXAS" --version | tail -n 2 | head -n 1)\","
    echo "  \"fatbinary\": \"$("$FATBINARY" --version | tail -n 2 | head -n 1)\","
    echo "  \"ptxas_flags\": \"${PTXAS_FLAGS[*]}\","
    echo "  \"archs\": \"${ARCHS[*]}\","
    echo "  \"archs_sm90a\": \"${ARCHS_90A[*]}\","
    echo "  \"ptx\": {"
    first=1
    for f in $(ls *.ptx | sort); do
        [ $first -eq 1 ] || echo ","
        printf '    "%s": "%s"' "$f" "$(sha256sum "$f" | cut -d' ' -f1)"
        first=0
    done
    echo ""
    echo "  },"
    echo "  \"fatbin\": {"
    first=1
    for f in $(cd "$OUT" && ls *.fatbin sm*/*.fatbin | sort); do
        [ $first -eq 1 ] || echo ","
        printf '    "%s": "%s"' "$f" "$(sha256sum "$OUT/$f" | cut -d' ' -f1)"
        first=0
    done
    echo ""
    echo "  },"
    # the tiers' PTX is not committed: the sources it was compiled from are (ptx/MANIFEST.json)
    echo "  \"ptx_manifest\": \"$(sha256sum MANIFEST.json | cut -d' ' -f1)\","
    echo "  \"tiers\": {"
    first=1
    for tier in $(printf '%s\n' "${!TIER_ARCHS[@]}" | sort); do
        [ $first -eq 1 ] || echo ","
        printf '    "%s": "%s"' "$tier" "${TIER_ARCHS[$tier]}"
        first=0
    done
    echo ""
    echo "  }"
    echo "}"
} > "$OUT/MANIFEST.json"
echo "wrote $(ls "$OUT"/*.fatbin "$OUT"/sm*/*.fatbin | wc -l) fatbins and MANIFEST.json to $OUT"
