#!/usr/bin/env bash
# Builds the llama.cpp peer: ggml (CPU backend, and CUDA for sm_90 unless MODE=cpu), the clip
# library from the pinned llama.cpp's tools/mtmd, and our harness llama_clip_bench; prints the
# build time. Runs on the GPU machine (MODE=cuda, the default: 16 cores) and, as a check of this
# script and the harness, on a machine without a GPU (MODE=cpu).
#
# Needs: cmake >= 3.18 (the GPU machine's image has it; here `pip install cmake` into a venv),
# a C++17 compiler, for MODE=cuda nvcc (CUDA 12.x/13.x), and the trimmed source archive made by
# fetch_trim.sh (.device/llama/llama-src.tar.xz, carried with the call).
#
# Environment (all optional):
#   MODE       cuda (default) or cpu
#   JOBS       parallel compile jobs (default: nproc)
#   ARCHIVE    the trimmed source archive (default .device/llama/llama-src.tar.xz)
#   WORK       where it unpacks and builds (default /tmp/vt-llama); the harness ends up at
#              $WORK/build-$MODE/llama_clip_bench
#   CUDA_ARCH  CMAKE_CUDA_ARCHITECTURES (default 90-real: the H200's sm_90 machine code only)
#
# Options chosen to keep the CUDA build inside one GPU-machine call: one architecture, no
# libllama / common / tools / tests / examples, FlashAttention kernels for F16/BF16 K and V only
# (GGML_CUDA_FA_QUANTS=f16-f16: clip casts K and V to F16), no NCCL (one GPU).
set -euo pipefail
MODE=${MODE:-cuda}
JOBS=${JOBS:-$(nproc)}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
ARCHIVE=${ARCHIVE:-$ROOT/.device/llama/llama-src.tar.xz}
WORK=${WORK:-/tmp/vt-llama}
CUDA_ARCH=${CUDA_ARCH:-90-real}
T0=$(date +%s.%N)

[ -f "$ARCHIVE" ] || { echo "build.sh: no source archive at $ARCHIVE (run xtask/bench/llama/fetch_trim.sh where the network is, carry .device/llama)" >&2; exit 1; }
mkdir -p "$WORK"
if [ ! -f "$WORK/llama.cpp/.unpacked-$(sha256sum "$ARCHIVE" | cut -c1-16)" ]; then
    rm -rf "$WORK/llama.cpp"
    tar -C "$WORK" -xJf "$ARCHIVE"
    touch "$WORK/llama.cpp/.unpacked-$(sha256sum "$ARCHIVE" | cut -c1-16)"
fi
cat "$WORK/llama.cpp/VT_PIN.txt"

ARGS=(-DLLAMA_SRC="$WORK/llama.cpp" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
      -DGGML_NATIVE=ON -DGGML_OPENMP=ON)
case "$MODE" in
    cuda)
        command -v nvcc > /dev/null || export PATH=$PATH:/usr/local/cuda/bin
        nvcc --version | tail -2
        ARGS+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DGGML_CUDA_FA=ON
               -DGGML_CUDA_FA_QUANTS=f16-f16 -DGGML_CUDA_NCCL=OFF) ;;
    cpu) ARGS+=(-DGGML_CUDA=OFF) ;;
    *) echo "build.sh: MODE must be cuda or cpu, not $MODE" >&2; exit 1 ;;
esac
GEN=()
command -v ninja > /dev/null && GEN=(-G Ninja)
B=$WORK/build-$MODE
cmake --version | head -1
cmake -S "$HERE" -B "$B" "${GEN[@]}" "${ARGS[@]}" > "$WORK/cmake-$MODE.log" 2>&1 \
    || { tail -40 "$WORK/cmake-$MODE.log"; exit 1; }
grep -E "CUDA Toolkit found|Using CMAKE_CUDA_ARCHITECTURES|Including .* backend|CUDA compiler" "$WORK/cmake-$MODE.log" || true
T1=$(date +%s.%N)
cmake --build "$B" --target llama_clip_bench -j "$JOBS" > "$WORK/build-$MODE.log" 2>&1 \
    || { grep -E "error|Error" "$WORK/build-$MODE.log" | head -30; tail -20 "$WORK/build-$MODE.log"; exit 1; }
T2=$(date +%s.%N)
ls -l "$B/llama_clip_bench"
awk -v m="$MODE" -v j="$JOBS" -v a="$T0" -v b="$T1" -v c="$T2" 'BEGIN {
    printf "llama.cpp peer build (%s, %s jobs): configure %.1f s, compile + link %.1f s, total %.1f s\n", m, j, b - a, c - b, c - a }'
