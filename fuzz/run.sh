#!/usr/bin/env bash
# Runs one fuzz target the way docs/RELIABILITY.md records its runs:
#   fuzz/run.sh TARGET SECONDS [more libFuzzer flags]
# ASan and debug assertions (`-a`) in the Rust code; where clang-19 is installed, the vendored C
# of libjpeg-turbo (mozjpeg-sys, built by the cc crate) gets ASan and libFuzzer's coverage too
# (with gcc it builds uninstrumented: its bugs would go unseen). Nice 19, one job, 2 GiB RSS cap,
# seeds from fuzz/seeds.py when the corpus is missing, a -max_len that takes the largest seed
# whole (libFuzzer's default is the largest seed, capped at 1 MiB). Extra flags go after the
# defaults, so they win (libFuzzer keeps the last value of a flag).
set -euo pipefail
target=$1 secs=$2
shift 2
cd "$(dirname "$0")/.."
[ -d "fuzz/corpus/$target" ] || python3 fuzz/seeds.py
if command -v clang-19 >/dev/null; then
    export CC_x86_64_unknown_linux_gnu=clang-19
    export CFLAGS_x86_64_unknown_linux_gnu="-fsanitize=address -fsanitize-coverage=inline-8bit-counters,pc-table,trace-cmp"
else
    echo "fuzz/run.sh: no clang-19: libjpeg-turbo's C is built without ASan or coverage" >&2
fi
case $target in
    prep) max_len=65536 ;;          # the selector byte + images up to 64 KiB
    inputs) max_len=400000 ;;       # prepared inputs up to 350 KB
    tower_st) max_len=1100000 ;;    # the 1.08 MB step3p7 model.safetensors
    *) max_len=0 ;;                 # 0: libFuzzer's default
esac
exec nice -n 19 cargo +nightly fuzz run -a "$target" -- \
    -rss_limit_mb=2048 -max_total_time="$secs" -print_final_stats=1 -max_len="$max_len" "$@"
