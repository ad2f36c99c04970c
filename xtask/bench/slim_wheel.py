"""Writes a slim copy of the transformers 5.23.0 wheel for the GPU machine's 64 MiB carry limit.

Keeps every top-level package and only the model packages the bench and the full-size oracles import
(gemma4, glm5_next, glm_ocr, glm46v, step3p7, auto) plus what their modeling/configuration files import
(found by scanning `from ..X` / `from transformers.models.X`, modular_* and convert_* files excluded);
drops the rest from the archive and from RECORD. 13.3 MB → 2.4 MB (2026-12-01).
Usage: python3 xtask/bench/slim_wheel.py FULL.whl OUT_DIR   (OUT_DIR/<same file name> is written)
"""
import os
import re
import sys
import zipfile

KEEP = {"gemma4", "glm5_next", "glm_ocr", "glm46v", "step3p7"}
PREFIX = "transformers/models/"


def main():
    full, out_dir = sys.argv[1], sys.argv[2]
    zin = zipfile.ZipFile(full)
    names = zin.namelist()
    files = {}
    for n in names:
        if n.startswith(PREFIX) and n.count("/") >= 3 and n.endswith(".py"):
            files.setdefault(n.split("/")[2], []).append(n)
    need, todo = set(KEEP), list(KEEP)
    while todo:
        for n in files.get(todo.pop(), []):
            base = os.path.basename(n)
            if base.startswith(("modular_", "convert_")):
                continue
            src = zin.read(n).decode("utf-8", "replace")
            for m in re.findall(r"from \.\.(\w+)", src) + re.findall(r"from transformers\.models\.(\w+)", src):
                if m not in need and m in files:
                    need.add(m)
                    todo.append(m)
    need.add("auto")

    def kept(n):
        return not (n.startswith(PREFIX) and n.count("/") >= 3) or n.split("/")[2] in need

    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, os.path.basename(full))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for n in names:
            if not kept(n):
                continue
            data = zin.read(n)
            if n.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(l for l in lines if kept(l.split(",")[0])).encode()
            zout.writestr(n, data)
    print(f"{out}: model packages kept {sorted(need)}; {os.path.getsize(out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
