#!/usr/bin/env bash
# Fuzz one target the way docs/RELIABILITY.md records its runs:
#   fuzz/run.sh TARGET SECONDS [more libFuzzer flags, e.g. -fork=2]
# A thin wrapper over `cargo xtask fuzz` (xtask/src/fuzz.rs, fuzz/README.md): cargo-fuzz installed
# under target/fuzz-tools if missing, ASan and debug assertions (`-a`), libjpeg-turbo's C with
# clang-19's ASan and coverage where clang-19 is installed, a 2 GiB RSS cap, a 120 s per-input
# timeout, the target's -max_len, the committed corpus fuzz/corpus/TARGET read and new inputs
# written to target/fuzz/new/TARGET (`cargo xtask fuzz --merge` folds them in). Nice 19. Extra
# flags go after the defaults, so they win (libFuzzer keeps the last value of a flag).
set -euo pipefail
target=$1 secs=$2
shift 2
cd "$(dirname "$0")/.."
exec nice -n 19 cargo xtask fuzz --target "$target" --seconds "$secs" --jobs 1 -- "$@"
