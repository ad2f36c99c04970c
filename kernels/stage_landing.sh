#!/usr/bin/env bash
# Stages what kernels/landing_device.sh needs carried, on a machine with cargo (no GPU needed):
# .device/all.tar.xz (the release GPU test binaries, xtask and vtower of `cargo xtask gpu-test
# --prepare`, stripped, the C ABI's, and the manylinux wheel unpacked as wheelx/), .device/pyw/
# (pytest's wheels for Python 3.12) and .whl/ (transformers 5.23.0, slimmed by
# xtask/bench/slim_wheel.py). The unpacked binaries go to $RAW (default /tmp/landing-raw), out of the
# carry. Then: `bash kernels/carry_slim.sh slim …` to fit 64 MiB, and on the GPU machine
# `bash kernels/landing_device.sh` with carry [".device", ".whl"].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RAW=${RAW:-/tmp/landing-raw}
command -v nasm > /dev/null || echo "warning: no nasm: the wheel's libjpeg-turbo has no SIMD (the build refuses it)" >&2
cargo xtask gpu-test --prepare
# the wheel that ships, built as `cargo xtask test` builds it (pinned maturin and zig, manylinux audit)
cargo xtask wheel
rm -rf "$RAW" && mkdir -p "$RAW"
mv .device/gpu_core_tests .device/xtask .device/facade .device/capi "$RAW/"
strip "$RAW"/gpu_core_tests "$RAW"/xtask "$RAW"/facade/* "$RAW"/capi/* 2> /dev/null || true
mkdir -p "$RAW/wheelx"
(cd "$RAW/wheelx" && python3 -m zipfile -e "$ROOT"/target/wheels-ship/vision_towers-*.whl .)
# one xz stream with a dictionary the size of the tar: the binaries embed the same kernels
(cd "$RAW" && tar -cf - gpu_core_tests xtask facade capi wheelx | xz -T1 --lzma2=preset=9,dict=256MiB > "$ROOT/.device/all.tar.xz")
mkdir -p .device/pyw .whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --implementation cp pytest==9.2.0 -d .device/pyw
if ! ls .whl/transformers-5.23.0-*.whl > /dev/null 2>&1; then
    python3 -m pip download -q --no-deps transformers==5.23.0 -d target/landing-full
    python3 xtask/bench/slim_wheel.py target/landing-full/transformers-5.23.0-py3-none-any.whl .whl
fi
du -sh .device .whl
