#!/usr/bin/env python3
"""Bytes in, rows on the GPU out, end to end, as an engine would call each side (docs/PERF.md):

- ours: the `vision_towers` Python package, `Model.encode(jpeg_bytes * b)` then
  `torch.from_dlpack` of every image's rows on torch's current stream, then that stream
  synchronised;
- upstream: transformers 5.23, the family's image processor (`AutoImageProcessor`, on the decoded
  PIL image, as the model card does) and the model's `get_image_features` path with its vision
  tower under `torch.compile` (default mode, over SDPA: the anchor), inputs moved to the GPU in
  bf16, then synchronised;
- the Rust API on the same model and bytes (`xtask api-bench`: `Model::encode_device` +
  synchronize), so the Python binding's own overhead is the difference.

Same full-size random weights on both sides (built by xtask/bench/torch_anchor.py's families and
saved in the layouts our loaders read, plus the release processor configs written by the upstream
processor classes), the same 1920x1080 JPEG, batch 1 and 8, median of --iters after warm-up.

usage: python3 py_e2e.py --work DIR [--families gemma4,glm5_next,step3p7] [--iters 20]
       [--xtask PATH] [--tiny]   (--tiny: CPU-sized configs, to test the plumbing without a GPU)
Prints one JSON line per measurement and a table last.
"""
import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import torch_anchor  # noqa: E402  (the families: full-size configs, randomisation, save layouts)
from safetensors.torch import save_file  # noqa: E402

# torch_anchor binds these when run as a script; as a module it needs them here.
torch_anchor.torch = torch
torch_anchor.save_file = save_file

FIXTURES = os.environ.get("VT_FIXTURES", os.path.join(ROOT, "fixtures"))


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def jpeg_1920x1080():
    """A photo-like 1920x1080 JPEG: the fixture photo, upscaled (bicubic), quality 90."""
    from PIL import Image

    src = Image.open(os.path.join(FIXTURES, "images", "chelsea_660x300.jpg")).convert("RGB")
    buf = io.BytesIO()
    src.resize((1920, 1080), Image.BICUBIC).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def processor_for(family, tiny):
    """The release processor of the family, as upstream writes its config."""
    if family == "gemma4":
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

        return Gemma4ImageProcessor(max_soft_tokens=70 if tiny else 280)
    if family == "glm5_next":
        from transformers.models.glm5_next.image_processing_glm5_next import Glm5NextImageProcessor

        return Glm5NextImageProcessor()
    if family == "step3p7":
        from transformers.models.step3p7.image_processing_step3p7 import Step3p7ImageProcessor

        if tiny:
            return Step3p7ImageProcessor(size={"height": 168, "width": 168}, patch_size=112)
        return Step3p7ImageProcessor()
    raise ValueError(family)


FIXTURE_MODEL = {"gemma4": "gemma4", "glm5_next": "glm5_next", "step3p7": "step3p7"}


def build(family, work, tiny, dev):
    """Full-size random weights saved for both sides; returns (dir, the family object)."""
    fam = torch_anchor.BUILDERS[family](tiny, dev)
    g = torch.Generator(device=dev).manual_seed(0)
    fam.randomize(g)
    d = os.path.join(work, family)
    if os.path.exists(d):
        shutil.rmtree(d)
    fam.save(d)
    processor_for(family, tiny).save_pretrained(d)
    # The token ids and tokenizer files the plan needs, as the release ships them.
    fx = os.path.join(FIXTURES, "models", FIXTURE_MODEL[family])
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(fx, "config.json")) as f:
        fcfg = json.load(f)
    for k, v in fcfg.items():
        if k.endswith("token_id") or k.endswith("token_index"):
            cfg.setdefault(k, v)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    for extra in ("tokenizer_config.json",):
        if os.path.exists(os.path.join(fx, extra)):
            shutil.copy(os.path.join(fx, extra), os.path.join(d, extra))
    return d, fam


def upstream_runner(family, fam, d, dev):
    """bytes list -> per-image rows on the GPU, through the upstream processor and model."""
    from PIL import Image
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(d)
    if family == "gemma4":
        tower = torch.compile(fam.tower)
        emb, k2 = fam.emb, fam.vc.pooling_kernel_size ** 2

        def feats(inp):
            pv = inp["pixel_values"].to(dev, torch.bfloat16, non_blocking=True)
            pos = inp["image_position_ids"].to(dev, non_blocking=True)
            h = tower(pixel_values=pv, pixel_position_ids=pos).last_hidden_state
            out = emb(inputs_embeds=h)
            sizes = ((pos != -1).all(dim=-1).sum(dim=-1) // k2).tolist()
            return torch.split(out, sizes)
    elif family == "glm5_next":
        tower = torch.compile(fam.tower)

        def feats(inp):
            pv = inp["pixel_values"].to(dev, torch.bfloat16, non_blocking=True)
            thw = inp["image_grid_thw"].to(dev)
            out = tower(hidden_states=pv, grid_thw=thw).pooler_output
            return torch.split(out, (thw.prod(-1) // 4).tolist())
    else:
        m = fam.model.model
        m.vision_model = torch.compile(m.vision_model)

        def feats(inp):
            pv = inp["pixel_values"].to(dev, torch.bfloat16, non_blocking=True)
            loc = inp.get("pixel_values_local")
            loc = loc.to(dev, torch.bfloat16, non_blocking=True) if loc is not None and loc.numel() else None
            n = inp.get("num_local_patches")
            n = n.tolist() if torch.is_tensor(n) else n
            return m.get_image_features(pixel_values=pv, pixel_values_local=loc,
                                        num_local_patches=n).pooler_output

    def run(blobs):
        with torch.no_grad():
            imgs = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
            inp = proc(images=imgs, return_tensors="pt")
            out = feats(inp)
            torch.cuda.current_stream().synchronize() if dev == "cuda" else None
            return out

    return run


def ours_runner(d, dev):
    import vision_towers

    m = vision_towers.Model(d, device="cuda:0" if dev == "cuda" else "cpu")

    def run(blobs):
        xs = m.encode(blobs)
        ts = [torch.from_dlpack(x) for x in xs]
        if dev == "cuda":
            torch.cuda.current_stream().synchronize()
        return ts

    return m, run


def time_ms(run, arg, warmup, iters):
    for _ in range(warmup):
        run(arg)
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run(arg)
        t.append((time.perf_counter() - t0) * 1e3)
    t.sort()
    return t[len(t) // 2], t[0]


def rel_l2(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())


def rust_api(xtask, d, jpg, iters):
    if not xtask or not os.path.exists(xtask):
        return {}
    r = subprocess.run([xtask, "api-bench", "--model", d, "--image", jpg, "--batch", "1,8",
                        "--iters", str(iters), "--warmup", "5"], capture_output=True, text=True)
    if r.returncode != 0:
        log(f"api-bench failed: {r.stderr.strip()[-400:]}")
        return {}
    return {j["batch"]: j for j in (json.loads(l) for l in r.stdout.splitlines() if l.startswith("{"))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--families", default="gemma4,glm5_next,step3p7")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--xtask", default=os.path.join(ROOT, ".device", "bench", "xtask"))
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    dev = "cpu" if a.tiny else "cuda"
    os.makedirs(a.work, exist_ok=True)
    blob = jpeg_1920x1080()
    jpg = os.path.join(a.work, "photo_1920x1080.jpg")
    with open(jpg, "wb") as f:
        f.write(blob)
    results = []
    for family in a.families.split(","):
        t0 = time.time()
        d, fam = build(family, a.work, a.tiny, dev)
        log(f"{family}: weights and processor saved in {time.time() - t0:.1f} s")
        m, ours = ours_runner(d, dev)
        up = upstream_runner(family, fam, d, dev)
        rust = rust_api(a.xtask, d, jpg, a.iters) if dev == "cuda" else {}
        measured = []
        for b in (1, 8):
            blobs = [blob] * b
            # rows of both sides on the same image (bf16 both), as a user would compare
            r_ours = ours(blobs[:1])[0]
            r_up = up(blobs[:1])[0]
            err = rel_l2(r_ours.float(), r_up.float()) if r_ours.shape == r_up.shape else float("nan")
            t_ours, t_ours_min = time_ms(ours, blobs, a.warmup, a.iters)
            t_up, t_up_min = time_ms(up, blobs, a.warmup, a.iters)
            measured.append((b, r_ours, r_up, err, t_ours, t_ours_min, t_up, t_up_min))
        # The Rust API again after the Python side, to bracket drift: the faster run counts.
        if dev == "cuda":
            for k, v in rust_api(a.xtask, d, jpg, a.iters).items():
                if k not in rust or v["median_ms"] < rust[k]["median_ms"]:
                    rust[k] = v
        for b, r_ours, r_up, err, t_ours, t_ours_min, t_up, t_up_min in measured:
            rs = rust.get(b, {})
            row = {"family": family, "batch": b, "rows_per_image": int(r_ours.shape[0]),
                   "width": int(r_ours.shape[1]), "ours_ms": t_ours, "ours_min_ms": t_ours_min,
                   "upstream_ms": t_up, "upstream_min_ms": t_up_min, "speedup": t_up / t_ours,
                   "rust_api_ms": rs.get("median_ms"), "rust_api_min_ms": rs.get("min_ms"),
                   "rust_prep_ms": rs.get("prep_median_ms"),
                   "python_overhead_pct": (t_ours / rs["median_ms"] - 1) * 100 if rs else None,
                   "python_overhead_min_pct": (t_ours_min / rs["min_ms"] - 1) * 100 if rs else None,
                   "rel_l2_ours_vs_upstream_bf16": err, "upstream_shape": list(r_up.shape)}
            print(json.dumps(row), flush=True)
            results.append(row)
        del m, ours, up, fam
        if dev == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(a.work, "py_e2e.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n| family | batch | rows/img | ours ms (min) | transformers+compile ms (min) | speed-up | Rust API ms (min) | of which prep | Python overhead, medians (mins) | rel-L2 ours vs upstream (bf16 both) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        has = r["rust_api_ms"] is not None
        ov = f"{r['python_overhead_pct']:+.1f} % ({r['python_overhead_min_pct']:+.1f} %)" if has else "—"
        ra = f"{r['rust_api_ms']:.2f} ({r['rust_api_min_ms']:.2f})" if has else "—"
        pp = f"{r['rust_prep_ms']:.2f}" if has else "—"
        print(f"| {r['family']} | {r['batch']} | {r['rows_per_image']} | {r['ours_ms']:.2f} ({r['ours_min_ms']:.2f}) "
              f"| {r['upstream_ms']:.2f} ({r['upstream_min_ms']:.2f}) | {r['speedup']:.2f}x | {ra} | {pp} | {ov} "
              f"| {r['rel_l2_ours_vs_upstream_bf16']:.2e} |")


if __name__ == "__main__":
    main()
