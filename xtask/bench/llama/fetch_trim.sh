#!/usr/bin/env bash
# Runs on a machine with the network (the development VM), never on the GPU machine.
#
# Fetches the pinned llama-cpp-python sdist from the Python registry, checks its sha256, and
# writes a trimmed copy of the llama.cpp it vendors — only what the clip encoder needs (ggml core,
# the CPU and CUDA backends, tools/mtmd's clip + model graphs + image preprocessing, include/llama.h
# that mtmd.h includes) plus the pinned converter (convert_hf_to_gguf.py, conversion/, gguf-py) —
# to .device/llama/llama-src.tar.xz (git-ignored; carried to the GPU machine by the lead's call).
# Nothing of llama.cpp is committed to this repository.
#
# usage: bash xtask/bench/llama/fetch_trim.sh [SDIST_DIR]
#   SDIST_DIR: an already unpacked llama_cpp_python-0.3.36 (default: download into $TMPDIR).
set -euo pipefail

PIN_VERSION=0.3.36
PIN_URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz
PIN_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# The llama.cpp commit the sdist vendors: its CHANGELOG's entry for 0.3.36
# ("update llama.cpp to ggml-org/llama.cpp@0c1e57098"); the sdist carries no .git.
PIN_LLAMA_COMMIT=0c1e57098

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
DEST=$ROOT/.device/llama
mkdir -p "$DEST"
TMP=${TMPDIR:-/tmp}/vt-llama-trim.$$
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP"

if [ $# -ge 1 ]; then
    SDIST=$(cd "$1" && pwd)
else
    TGZ=$TMP/llama_cpp_python-$PIN_VERSION.tar.gz
    echo "fetch: $PIN_URL"
    python3 - "$PIN_URL" "$TGZ" <<'PY'
import sys, urllib.request
urllib.request.urlretrieve(sys.argv[1], sys.argv[2])
PY
    echo "$PIN_SHA256  $TGZ" | sha256sum -c -
    tar -C "$TMP" -xzf "$TGZ"
    SDIST=$TMP/llama_cpp_python-$PIN_VERSION
fi

grep -q "^Version: $PIN_VERSION\$" "$SDIST/PKG-INFO" || { echo "not llama-cpp-python $PIN_VERSION: $SDIST" >&2; exit 1; }
COMMIT=$(awk "/^## \\[$PIN_VERSION\\]/{f=1;next} /^## /{f=0} f && /ggml-org\\/llama.cpp@/{sub(/.*llama.cpp@/,\"\"); print; exit}" "$SDIST/CHANGELOG.md")
[ "$COMMIT" = "$PIN_LLAMA_COMMIT" ] || { echo "CHANGELOG names llama.cpp@$COMMIT, pinned $PIN_LLAMA_COMMIT" >&2; exit 1; }
SRC=$SDIST/vendor/llama.cpp

# What the clip encoder, our CMake project (xtask/bench/llama/CMakeLists.txt) and the pinned
# converter need; everything else (libllama, common, the other backends, tests, models, docs) stays out.
STAGE=$TMP/llama.cpp
mkdir -p "$STAGE"
(
    cd "$SRC"
    {
        echo LICENSE
        find ggml/CMakeLists.txt ggml/cmake ggml/include -type f
        find ggml/src -maxdepth 1 -type f
        find ggml/src/ggml-cpu ggml/src/ggml-cuda -type f \
            ! -path 'ggml/src/ggml-cpu/spacemit/*' ! -path 'ggml/src/ggml-cpu/kleidiai/*' \
            ! -path 'ggml/src/ggml-cpu/arch/loongarch/*' ! -path 'ggml/src/ggml-cpu/arch/powerpc/*' \
            ! -path 'ggml/src/ggml-cpu/arch/riscv/*' ! -path 'ggml/src/ggml-cpu/arch/s390/*' \
            ! -path 'ggml/src/ggml-cpu/arch/wasm/*'
        echo include/llama.h
        for f in clip.cpp clip.h clip-impl.h clip-model.h clip-graph.h mtmd.h mtmd-image.cpp mtmd-image.h; do
            echo tools/mtmd/$f
        done
        find tools/mtmd/models -type f
        echo convert_hf_to_gguf.py
        find conversion gguf-py/gguf -type f -name '*.py'
        echo gguf-py/pyproject.toml
        echo gguf-py/LICENSE
    } | sort -u > "$TMP/files.txt"
    while read -r f; do [ -e "$f" ] || { echo "missing in the sdist: $f" >&2; exit 1; }; done < "$TMP/files.txt"
    tar -cf - -T "$TMP/files.txt" | tar -C "$STAGE" -xf -
)
cat > "$STAGE/VT_PIN.txt" <<PIN
llama-cpp-python $PIN_VERSION sdist ($PIN_URL, sha256 $PIN_SHA256)
vendors ggml-org/llama.cpp@$PIN_LLAMA_COMMIT (its CHANGELOG); trimmed by xtask/bench/llama/fetch_trim.sh:
$(wc -l < "$TMP/files.txt") files of vendor/llama.cpp, unchanged.
PIN
OUTF=$DEST/llama-src.tar.xz
# Reproducible: sorted names, fixed owner and mtime.
tar -C "$TMP" --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-01-01 00:00:00' -cf - llama.cpp \
    | xz -9e -T1 > "$OUTF.tmp"
mv "$OUTF.tmp" "$OUTF"
echo "llama.cpp commit: $PIN_LLAMA_COMMIT (llama-cpp-python $PIN_VERSION)"
echo "files: $(wc -l < "$TMP/files.txt"), unpacked $(du -sh "$STAGE" | cut -f1)"
echo "archive: $OUTF $(stat -c %s "$OUTF") bytes ($(du -h "$OUTF" | cut -f1)), sha256 $(sha256sum "$OUTF" | cut -d' ' -f1)"
