#!/usr/bin/env bash
# The GPU machine's `run` carries the whole working tree (tracked and untracked-not-ignored files)
# plus the `carry` paths, 64 MiB at most; the tree alone is ~60 MiB, so a call that carries test
# binaries (each embeds every tier's fatbins and PTX: 7–10 MB xz'd) must leave what it does not
# need behind. `slim` takes the named folders out of git's index and ignores them (their files stay
# on disk, nothing is committed); `restore` puts them back. Never commit between the two; the
# ignore list (.git/info/exclude) is shared with every worktree of the repository, so restore
# right after the call.
# Usage: kernels/carry_slim.sh slim DIR… | restore | size
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
MARK="# carry_slim"
size() {
    (git ls-files; git ls-files --others --exclude-standard) | sort -u | while read -r f; do
        [ -f "$f" ] && stat -c %s "$f"
    done | awk '{s += $1} END {printf "what travels: %.1f MiB of 64\n", s / 1048576}'
}
case "${1:-}" in
    slim)
        shift
        mkdir -p "$(dirname "$EXCLUDE")"
        for d in "$@"; do
            git rm -r -q --cached --ignore-unmatch -- "$d"
            echo "/${d%/}/ $MARK" >> "$EXCLUDE"
        done
        # git reads "/dir/ # comment" as a pattern with trailing text: keep the pattern alone and
        # the mark on the line above instead
        python3 - "$EXCLUDE" "$MARK" <<'PY'
import sys
path, mark = sys.argv[1], sys.argv[2]
out = []
for line in open(path).read().splitlines():
    if line.endswith(" " + mark):
        out += [mark, line[: -len(mark) - 1]]
    else:
        out.append(line)
open(path, "w").write("\n".join(out) + "\n")
PY
        size ;;
    restore)
        git reset -q
        python3 - "$EXCLUDE" "$MARK" <<'PY'
import sys, os
path, mark = sys.argv[1], sys.argv[2]
if os.path.exists(path):
    lines = open(path).read().splitlines()
    out, skip = [], False
    for line in lines:
        if line == mark:
            skip = True
            continue
        if skip:
            skip = False
            continue
        out.append(line)
    open(path, "w").write("\n".join(out) + ("\n" if out else ""))
PY
        size ;;
    size) size ;;
    *) echo "usage: kernels/carry_slim.sh slim DIR… | restore | size" >&2; exit 2 ;;
esac
