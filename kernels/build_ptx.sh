#!/usr/bin/env bash
# Compile gpu-core's kernels (crates/gpu-core/kernels/*.cu) to PTX (sm_90; `*_sm90a.cu` for sm_90a, the
# wgmma kernels) and write the manifest the gpu-core tests check. The portable modules (every `.cu` but `*_sm90a.cu`) are also compiled for the
# lowest compute capability of each older tier (gpu_core::tier): compute_80 (Ampere, Ada) into sm80/ and
# compute_75 (Turing) into sm75/; kernels/build_sass.sh packs those into the tiers' fatbins.
# Usage: kernels/build_ptx.sh [OUT_DIR]   (default: crates/gpu-core/kernels/ptx, the committed PTX)
# Environment: NVCC (default: nvcc on PATH). All nvcc flags live here and nowhere else.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# the shipped kernels live inside gpu-core's package (a .crate holds only files under its crate)
SRC="$HERE/../crates/gpu-core/kernels"
OUT="${1:-$SRC/ptx}"
NVCC="${NVCC:-nvcc}"
FLAGS=(-arch=sm_90 -O3 -std=c++17 --ptx -lineinfo)
REPORT_FLAGS=(-arch=sm_90 -O3 -std=c++17 -cubin -Xptxas -v)
# wgmma needs the arch-specific target; PTX for compute_90a carries `.target sm_90a`
FLAGS_90A=(-arch=compute_90a -O3 -std=c++17 --ptx -lineinfo)
REPORT_FLAGS_90A=(-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -cubin -Xptxas -v)
# the older tiers' PTX: the same flags but the architecture (gpu_core::tier's table names these two)
TIERS=(80 75)
mkdir -p "$OUT"
VERSION="$("$NVCC" --version | tail -n 2 | head -n 1)"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"  # absolute: nvcc runs inside $SRC
cd "$SRC"
sources=$(ls *.cu | sort)
: > "$OUT/RESOURCES.txt"
for src in $sources; do
    name="${src%.cu}"
    flags=("${FLAGS[@]}"); report=("${REPORT_FLAGS[@]}")
    case "$src" in *_sm90a.cu) flags=("${FLAGS_90A[@]}"); report=("${REPORT_FLAGS_90A[@]}") ;; esac
    "$NVCC" "${flags[@]}" "$src" -o "$OUT/$name.ptx"
    # resource report (registers, spills, smem) for docs; not loaded by gpu-core
    "$NVCC" "${report[@]}" "$src" -o "/tmp/gpu-core-$name.cubin" 2>&1 \
        | grep -E "Compiling entry|registers|spill" >> "$OUT/RESOURCES.txt" || true
done
for t in "${TIERS[@]}"; do
    mkdir -p "$OUT/sm$t"
    for src in $sources; do
        case "$src" in *_sm90a.cu) continue ;; esac
        "$NVCC" -arch="compute_$t" "${FLAGS[@]:1}" "$src" -o "$OUT/sm$t/${src%.cu}.ptx"
        "$NVCC" -arch="sm_$t" "${REPORT_FLAGS[@]:1}" "$src" -o "/tmp/gpu-core-sm$t-${src%.cu}.cubin" 2>&1 \
            | grep -E "Compiling entry|registers|spill" | sed "s/^/sm_$t: /" >> "$OUT/RESOURCES.txt" || true
    done
done
{
    echo "{"
    echo "  \"nvcc\": \"$VERSION\","
    echo "  \"flags\": \"${FLAGS[*]}\","
    echo "  \"flags_sm90a\": \"${FLAGS_90A[*]}\","
    echo "  \"tiers\": \"${TIERS[*]}\","
    echo "  \"sources\": {"
    first=1
    for f in $(ls *.cu *.cuh | sort); do
        h=$(sha256sum "$f" | cut -d' ' -f1)
        [ $first -eq 1 ] || echo ","
        printf '    "%s": "%s"' "$f" "$h"
        first=0
    done
    echo ""
    echo "  }"
    echo "}"
} > "$OUT/MANIFEST.json"
echo "wrote $(ls "$OUT"/*.ptx "$OUT"/sm*/*.ptx | wc -l) PTX files and MANIFEST.json to $OUT ($VERSION)"
