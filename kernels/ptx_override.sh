#!/usr/bin/env bash
# For the GPU test scripts: builds this tree's PTX into OUT_DIR and prints OUT_DIR when it differs
# from the committed crates/gpu-core/kernels/ptx (then the tests must load it: export GPU_CORE_PTX_DIR), or prints
# nothing when it is the same (then the tests load what a user loads: the embedded SASS).
# Usage: kernels/ptx_override.sh OUT_DIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COMMITTED="$HERE/../crates/gpu-core/kernels/ptx"
OUT="$1"
bash "$HERE/build_ptx.sh" "$OUT" >/dev/null
for f in "$OUT"/*.ptx; do
    # .file lines carry the toolkit's install path; compare the code only
    if ! cmp -s <(grep -v '^\s*\.file' "$f") <(grep -v '^\s*\.file' "$COMMITTED/$(basename "$f")"); then
        echo "$OUT"
        exit 0
    fi
done
