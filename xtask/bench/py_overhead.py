#!/usr/bin/env python3
"""The Python binding's own cost per call, against the Rust API on the same model and bytes
(docs/PERF.md): rounds that alternate `xtask api-bench` (Rust: `Model::encode_device` +
synchronize) and the Python loop (`Model.encode` + `torch.from_dlpack` on the current stream +
that stream synchronised), so drift between processes shows as spread between rounds instead of
as overhead. Two images: the 1920x1080 JPEG (the end-to-end case) and a 20x15 PNG, where the call
is almost all fixed cost, so the difference of the two sides there is the binding's absolute
overhead per call.

usage: python3 py_overhead.py --work DIR [--family gemma4] [--rounds 3] [--iters 40]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import py_e2e  # noqa: E402


def rust(xtask, d, img, iters):
    r = subprocess.run([xtask, "api-bench", "--model", d, "--image", img, "--batch", "1",
                        "--iters", str(iters), "--warmup", "10"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-400:])
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")][0]


def python(run, blob, iters):
    for _ in range(10):
        run([blob])
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run([blob])
        t.append((time.perf_counter() - t0) * 1e3)
    t.sort()
    return {"median_ms": t[len(t) // 2], "min_ms": t[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--family", default="gemma4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--xtask", default=os.path.join(py_e2e.ROOT, ".device", "bench", "xtask"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    d, _fam = py_e2e.build(a.family, a.work, False, "cuda")
    images = {"1920x1080 JPEG": py_e2e.jpeg_1920x1080()}
    with open(os.path.join(py_e2e.FIXTURES, "images", "tiny_20x15.png"), "rb") as f:
        images["20x15 PNG"] = f.read()
    _m, run = py_e2e.ours_runner(d, "cuda")
    rows = []
    for name, blob in images.items():
        path = os.path.join(a.work, name.replace(" ", "_"))
        with open(path, "wb") as f:
            f.write(blob)
        for k in range(a.rounds):
            r = rust(a.xtask, d, path, a.iters)
            p = python(run, blob, a.iters)
            row = {"image": name, "round": k, "rust_median_ms": r["median_ms"], "rust_min_ms": r["min_ms"],
                   "rust_held_median_ms": r.get("held_median_ms"), "rust_held_min_ms": r.get("held_min_ms"),
                   "python_median_ms": p["median_ms"], "python_min_ms": p["min_ms"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| image | round | Rust API ms median (min) | Python ms median (min) | difference of medians (of minima) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['image']} | {r['round']} | {r['rust_median_ms']:.3f} ({r['rust_min_ms']:.3f}) "
              f"| {r['python_median_ms']:.3f} ({r['python_min_ms']:.3f}) "
              f"| {r['python_median_ms'] - r['rust_median_ms']:+.3f} ({r['python_min_ms'] - r['rust_min_ms']:+.3f}) |")


if __name__ == "__main__":
    main()
