#!/usr/bin/env bash
# Installs NVIDIA's nvcc 13.0.88 (the GPU machine's version) from PyPI wheels into a virtual environment, so
# kernels/build_ptx.sh and ptxas reports (registers, spills, wgmma serialisation warnings) work on a machine
# without the CUDA toolkit or a GPU; the PTX it writes is identical to the GPU machine's (checked 2026-12-01:
# every crates/gpu-core/kernels/ptx/*.ptx the same but for the toolkit path in `.file` lines). cuobjdump and nvdisasm come
# along for SASS listings (`cuobjdump -sass x.cubin`).
# Usage: source <(bash kernels/local_nvcc.sh)      # prints the `export PATH=...` line; NVCC_ENV overrides the venv
set -euo pipefail
ENV="${NVCC_ENV:-/tmp/nvccenv}"
if [ ! -x "$ENV/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc" ] && [ ! -x "$ENV/bin/nvcc-bin/nvcc" ]; then
    python3 -m venv "$ENV" >&2
    "$ENV/bin/pip" install -q --no-deps \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 \
        nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.5.37 >&2
fi
SITE="$(ls -d "$ENV"/lib/python3*/site-packages | head -n 1)"
BIN="$SITE/nvidia/cu13/bin"
# nvcc finds cicc through nvcc.profile (../nvvm/bin) and headers through ../include: the wheels unpack
# into one nvidia/cu13 tree, so both resolve.
"$BIN/nvcc" --version >&2
echo "export PATH=$BIN:\$PATH"
