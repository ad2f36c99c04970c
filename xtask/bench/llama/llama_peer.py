#!/usr/bin/env python3
"""The Python side of the llama.cpp peer (issue 22): GGUF conversion, inputs, references, rel-L2.

Subcommands (each prints one JSON line per result):

  gguf FAMILY --weights DIR --out DIR [--llama DIR] [--variants LIST]
      An mmproj GGUF in llama.cpp's layout from the weights torch_anchor.py saved (the same bf16
      tensors every side uses). gemma4: our writer, fixtures/oracle/gguf_gemma4.py (gguf-py's name
      map, the renames llama.cpp's converter applies), variants bf16, f16 and bf16-gelu (the BF16
      file plus `clip.use_gelu`, which llama.cpp's converter does not write for gemma4: the
      activation's effect alone). glm5_next, step3p7: the pinned llama.cpp's own converter
      (`convert_hf_to_gguf.py --mmproj`, from --llama DIR), variants bf16 and f16.
  inputs FAMILY --inputs CASE.inputs.safetensors --out CASE.vtimg
      The case's exact inputs as images for clip (VTIMG, f32 HWC): gemma4 patches put back on
      their grid by position id; step3p7 the pixel planes transposed. glm5_next: its patches
      carry two temporal frames drawn independently, while llama.cpp's GLM graph applies both
      temporal kernels to one image (a still image's two frames are equal upstream too), so frame
      1 is set to frame 0 and the grid unpatchified; `glm-ref` gives the upstream f32 rows of
      exactly that input.
  glm-ref --weights DIR --inputs CASE.inputs.safetensors --out CASE.rows_f32_dup.safetensors
      Upstream f32 rows (torch_anchor's Glm5Next f32 copy, TF32 off) for the frame-duplicated
      glm5_next input that `inputs glm5_next` writes.
  rel --rows ROWS.f32 --ref REF.safetensors [--ref ...] [--key rows]
      rel-L2 = |rows - ref| / |ref| (float64) of the harness's raw f32 rows against each reference.
  fixture-check --bench BIN [--llama DIR] [--out DIR]
      CPU validation on the committed tiny fixtures: our gemma4 converter against
      fixtures/models/gemma4_gguf/*.gguf tensor for tensor, the pinned llama.cpp converter's file
      against ours, and the harness on the tiny mmproj against the fixture's upstream rows.
  run --anchor DIR --work DIR --bench BIN [--llama DIR] [--cases LIST] [--variants LIST] --results F.jsonl
      Every selected case of torch_anchor.py's output through llama.cpp (GGUFs once per family,
      inputs, the harness per variant, rel-L2); one JSON line per run (device.sh's llama step).
  report --anchor DIR --results F.jsonl [--out F.md]
      The tables for docs/PERF.md: ours and torch.compile (ours.json, anchor.json) beside llama.cpp.

VTIMG: b"VTIMG01\\n", int32 dtype (0 f32, 1 u8), n, h, w, then n*h*w*3 values HWC (llama_clip_bench.cpp).
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "fixtures", "oracle"))
sys.path.insert(0, os.path.dirname(HERE))


def emit(obj):
    print(json.dumps(obj), flush=True)


# ---------------------------------------------------------------------------------------------
# VTIMG and rows


def write_vtimg(path, images):
    """`images`: float32 or uint8 array [n, h, w, 3]."""
    a = np.ascontiguousarray(images)
    assert a.ndim == 4 and a.shape[3] == 3, a.shape
    dtype = {np.dtype(np.float32): 0, np.dtype(np.uint8): 1}[a.dtype]
    with open(path, "wb") as f:
        f.write(b"VTIMG01\n")
        f.write(struct.pack("<4i", dtype, a.shape[0], a.shape[1], a.shape[2]))
        f.write(a.tobytes())


def rel_l2(a, ref):
    a = np.asarray(a, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    if a.shape != ref.shape:
        raise ValueError(f"{a.size} values against a reference of {ref.size}")
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def load_st(path):
    from safetensors.torch import load_file

    return load_file(path)


# ---------------------------------------------------------------------------------------------
# gemma4


def gemma4_model(weights_dir):
    """What fixtures/oracle/gguf_gemma4.py reads of a model (`config.vision_config`,
    `config.text_config`, `state_dict()`), from a saved HF-layout directory."""
    with open(os.path.join(weights_dir, "config.json")) as f:
        cfg = json.load(f)
    sd = load_st(os.path.join(weights_dir, "model.safetensors"))
    config = SimpleNamespace(vision_config=SimpleNamespace(**cfg["vision_config"]),
                             text_config=SimpleNamespace(**cfg["text_config"]))
    return SimpleNamespace(config=config, state_dict=lambda: sd)


GEMMA4_VARIANTS = {"bf16": ("mmproj-BF16.gguf", "bf16", False),
                   "f16": ("mmproj-F16.gguf", "f16", False),
                   "bf16-gelu": ("mmproj-BF16-gelu.gguf", "bf16", True),
                   "f32": ("mmproj-F32.gguf", "f32", False),
                   "f32-gelu": ("mmproj-F32-gelu.gguf", "f32", True)}


def gguf_gemma4(weights, out, variants, fixture_layout=False):
    """`fixture_layout`: F16 files with an F32 patch_embd, as the committed fixtures have it;
    otherwise as llama.cpp's converter writes them (patch_embd F16)."""
    import gguf_gemma4

    os.makedirs(out, exist_ok=True)
    model = gemma4_model(weights)
    for v in variants:
        name, mat, gelu = GEMMA4_VARIANTS[v]
        t = time.time()
        path = os.path.join(out, name)
        gguf_gemma4.write(path, model, mat, use_gelu=gelu, f16_patch_embd=not fixture_layout)
        emit({"gguf": path, "family": "gemma4", "variant": v, "bytes": os.path.getsize(path),
              "seconds": round(time.time() - t, 1), "writer": "fixtures/oracle/gguf_gemma4.py"})


def gemma4_images(pix, pos):
    """pixel_values [b, n, 3*p*p] (patch layout (ky, kx, c)) and position ids [b, n, 2] = (x, y),
    -1 for padding -> images [b, gh*p, gw*p, 3]; the grid must be whole and the same for all."""
    pix = np.asarray(pix, dtype=np.float32)
    pos = np.asarray(pos)
    b, n, pd = pix.shape
    p = int(round((pd // 3) ** 0.5))
    assert 3 * p * p == pd, pd
    out, grid = [], None
    for i in range(b):
        valid = (pos[i] >= 0).all(-1)
        xs, ys = pos[i, valid, 0], pos[i, valid, 1]
        gw, gh = int(xs.max()) + 1, int(ys.max()) + 1
        if grid is None:
            grid = (gh, gw)
        if (gh, gw) != grid:
            raise ValueError(f"image {i}: grid {gh}x{gw}, image 0's {grid[0]}x{grid[1]}: one batch needs one size")
        if valid.sum() != gh * gw or len(set(zip(xs.tolist(), ys.tolist()))) != gh * gw:
            raise ValueError(f"image {i}: {valid.sum()} valid patches do not tile a {gh}x{gw} grid")
        img = np.zeros((gh, gw, p, p, 3), np.float32)
        img[ys, xs] = pix[i, valid].reshape(-1, p, p, 3)
        out.append(img.transpose(0, 2, 1, 3, 4).reshape(gh * p, gw * p, 3))
    return np.stack(out)


# ---------------------------------------------------------------------------------------------
# step3p7 and glm5_next


def step_images(pix):
    """pixel_values [b, 3, s, s] (normalised) -> [b, s, s, 3]."""
    return np.ascontiguousarray(np.asarray(pix, dtype=np.float32).transpose(0, 2, 3, 1))


def glm_dup_frames(rows, tps=2, p=14):
    """Patch rows [N, 3*tps*p*p] laid out (c, t, py, px): frame t>0 set to frame 0."""
    r = np.asarray(rows, dtype=np.float32).reshape(rows.shape[0], 3, tps, p, p).copy()
    r[:, :, 1:] = r[:, :, :1]
    return r.reshape(rows.shape[0], -1)


def glm_images(rows, thw, tps=2, p=14, m=2):
    """Frame-0 pixels of patch rows ordered per image (bh, bw, mh, mw) (the Glm5Next processor's
    patchify) -> images [b, gh*p, gw*p, 3]."""
    rows = np.asarray(rows, dtype=np.float32)
    out, off = [], 0
    for t, gh, gw in np.asarray(thw).tolist():
        assert t == 1, "one frame per image"
        n = gh * gw
        r = rows[off:off + n].reshape(gh // m, gw // m, m, m, 3, tps, p, p)[:, :, :, :, :, 0]
        # (bh, bw, mh, mw, c, py, px) -> (bh, mh, py, bw, mw, px, c)
        out.append(r.transpose(0, 2, 5, 1, 3, 6, 4).reshape(gh * p, gw * p, 3))
        off += n
    shapes = {o.shape for o in out}
    if len(shapes) != 1:
        raise ValueError(f"images of several sizes {shapes}: one batch needs one size")
    return np.stack(out)


def glm_ref(weights, inputs, out):
    import torch
    import torch_anchor
    from safetensors.torch import save_file

    torch_anchor.torch = torch
    torch_anchor.save_file = save_file
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with open(os.path.join(weights, "config.json")) as f:
        vc = json.load(f)["vision_config"]
    tiny = vc["hidden_size"] != 1024
    fam = torch_anchor.Glm5Next(tiny, dev)
    sd = {k.removeprefix("model.visual."): v for k, v in load_st(os.path.join(weights, "model.safetensors")).items()}
    missing, unexpected = fam.tower.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    if missing or unexpected:
        raise ValueError(f"glm weights: missing {missing[:4]}, unexpected {unexpected[:4]}")
    inp = load_st(inputs)
    dup = torch.from_numpy(glm_dup_frames(inp["hidden_states"].float().numpy()))
    inp = {"hidden_states": dup.to(dev), "grid_thw": inp["grid_thw"].to(dev)}
    with torch_anchor.no_tf32():
        rows = fam.runner(inp, fam.f32_models())().reshape(-1, fam.width).float().cpu()
    save_file({"rows": rows.contiguous()}, out)
    emit({"glm_ref": out, "rows": list(rows.shape), "device": dev})


def gguf_llama_converter(family, weights, out, variants, llama):
    """The pinned llama.cpp's converter on a copy of the weights directory that adds the
    family's preprocessor_config.json (image mean/std, token budget), as a release ships it."""
    import py_e2e

    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for f in os.listdir(weights):
            os.symlink(os.path.abspath(os.path.join(weights, f)), os.path.join(d, f))
        if family == "step3p7":
            # Release config.json files carry the vendor key `understand_projector_stride` (2), and
            # the pinned converter asserts it; transformers' Step3p7Config does not write it (its
            # downsamplers' stride is fixed at 2), so save_pretrained's config lacks it.
            with open(os.path.join(weights, "config.json")) as f:
                cfg = json.load(f)
            cfg.setdefault("understand_projector_stride", 2)
            os.remove(os.path.join(d, "config.json"))
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
        if not os.path.exists(os.path.join(d, "preprocessor_config.json")):
            py_e2e.processor_for(family, False).save_pretrained(d)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.join(llama, "gguf-py")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        for v in variants:
            name = {"bf16": "mmproj-BF16.gguf", "f16": "mmproj-F16.gguf"}[v]
            path = os.path.join(out, name)
            t = time.time()
            r = subprocess.run([sys.executable, os.path.join(llama, "convert_hf_to_gguf.py"), d, "--mmproj",
                                "--outtype", v, "--outfile", path], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"convert_hf_to_gguf.py failed for {family} {v}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
            emit({"gguf": path, "family": family, "variant": v, "bytes": os.path.getsize(path),
                  "seconds": round(time.time() - t, 1), "writer": "llama.cpp convert_hf_to_gguf.py --mmproj"})


# ---------------------------------------------------------------------------------------------
# subcommands


def cmd_gguf(a):
    os.makedirs(a.out, exist_ok=True)
    if a.family == "gemma4":
        gguf_gemma4(a.weights, a.out, (a.variants or "bf16,f16,bf16-gelu").split(","))
    else:
        if not a.llama:
            sys.exit("--llama DIR (the unpacked llama.cpp) is needed for its converter")
        gguf_llama_converter(a.family, a.weights, a.out, (a.variants or "bf16,f16").split(","), a.llama)


def cmd_inputs(a):
    inp = load_st(a.inputs)
    if a.family == "gemma4":
        imgs = gemma4_images(inp["pixel_values"].float().numpy(), inp["pixel_position_ids"].numpy())
    elif a.family == "step3p7":
        imgs = step_images(inp["pixel_values"].float().numpy())
    elif a.family == "glm5_next":
        imgs = glm_images(inp["hidden_states"].float().numpy(), inp["grid_thw"].numpy())
    else:
        sys.exit(f"unknown family {a.family}")
    write_vtimg(a.out, imgs.astype(np.float32))
    emit({"vtimg": a.out, "family": a.family, "images": int(imgs.shape[0]), "hw": list(imgs.shape[1:3])})


def cmd_rel(a):
    rows = np.fromfile(a.rows, dtype="<f4")
    out = {"rows": a.rows}
    for r in a.ref:
        ref = load_st(r)[a.key].float().numpy()
        out[os.path.basename(r)] = rel_l2(rows, ref) if rows.size == ref.size else \
            f"size {rows.size} vs {ref.size} ({ref.shape})"
    emit(out)


def run_bench(bench, mmproj, vtimg, rows, *extra):
    r = subprocess.run([bench, "--mmproj", mmproj, "--input", vtimg, "--out", rows, "--cpu", *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{bench} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def cmd_fixture_check(a):
    """Our converter against the committed fixture GGUFs; llama.cpp's converter against ours; the
    CPU harness on the tiny mmproj against the fixture's upstream rows."""
    import gguf

    fx = os.path.join(ROOT, "fixtures")
    out = a.out or tempfile.mkdtemp(prefix="vt-llama-fx-")
    os.makedirs(out, exist_ok=True)
    gguf_gemma4(os.path.join(fx, "models", "gemma4"), os.path.join(out, "fixture_layout"), ["bf16", "f16"],
                fixture_layout=True)
    gguf_gemma4(os.path.join(fx, "models", "gemma4"), out, list(GEMMA4_VARIANTS))

    def tensors(path):
        r = gguf.GGUFReader(path)
        return r, {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), bytes(t.data.tobytes())) for t in r.tensors}

    def kv(r):
        return {k: (f.types[0].name if f.types else None, f.contents() if hasattr(f, "contents") else None)
                for k, f in r.fields.items()}

    for ours, theirs in (("mmproj-BF16.gguf", "mmproj-BF16.gguf"), ("mmproj-F16.gguf", "mmproj-F16.gguf")):
        ro, to = tensors(os.path.join(out, "fixture_layout", ours))
        rt, tt = tensors(os.path.join(fx, "models", "gemma4_gguf", theirs))
        same_bytes = open(os.path.join(out, "fixture_layout", ours), "rb").read() == open(os.path.join(fx, "models", "gemma4_gguf", theirs), "rb").read()
        diff = sorted(n for n in set(to) | set(tt) if to.get(n) != tt.get(n))
        kvd = sorted(k for k in set(kv(ro)) | set(kv(rt)) if kv(ro).get(k) != kv(rt).get(k))
        emit({"check": f"ours {ours} vs fixture {theirs}", "tensors": len(to), "tensors_differing": diff,
              "kv_differing": kvd, "identical_bytes": same_bytes})

    if a.llama:
        # The pinned llama.cpp converter on the same HF fixture: same names, shapes and values?
        gguf_llama_converter("gemma4", os.path.join(fx, "models", "gemma4"), os.path.join(out, "llamaconv"),
                             ["bf16", "f16"], a.llama)
        for v, name in (("bf16", "mmproj-BF16.gguf"), ("f16", "mmproj-F16.gguf")):
            rl, tl = tensors(os.path.join(out, "llamaconv", name))
            ro, to = tensors(os.path.join(out, name))
            same_vals = []
            for n in sorted(set(to) & set(tl)):
                x = np.asarray(next(t for t in ro.tensors if t.name == n).data)
                y = np.asarray(next(t for t in rl.tensors if t.name == n).data)
                if to[n][0] != tl[n][0]:  # different storage types: compare values
                    xf = x.view(np.uint16).astype(np.uint32) << 16 if to[n][0] == "BF16" else x.astype(np.float32)
                    yf = y.view(np.uint16).astype(np.uint32) << 16 if tl[n][0] == "BF16" else y.astype(np.float32)
                    xf = xf.view(np.float32) if xf.dtype == np.uint32 else xf
                    yf = yf.view(np.float32) if yf.dtype == np.uint32 else yf
                    same_vals.append((n, to[n][0], tl[n][0], bool(np.array_equal(xf.ravel(), yf.ravel()))))
            emit({"check": f"llama.cpp converter vs ours ({v})",
                  "names_only_ours": sorted(set(to) - set(tl)), "names_only_llama": sorted(set(tl) - set(to)),
                  "shape_differs": sorted(n for n in set(to) & set(tl) if to[n][1] != tl[n][1]),
                  "type_differs_values_equal": [s for s in same_vals],
                  "bytes_differ_same_type": sorted(n for n in set(to) & set(tl)
                                                   if to[n][0] == tl[n][0] and to[n][2] != tl[n][2]),
                  "kv_only_llama": sorted(set(kv(rl)) - set(kv(ro))), "kv_only_ours": sorted(set(kv(ro)) - set(kv(rl)))})

    if a.bench:
        # Same pixels: the fixture's processor pixel_values (upstream's resize) through clip.
        case = load_st(os.path.join(fx, "outputs", "gemma4", "tiny_20x15.safetensors"))
        imgs = gemma4_images(case["pixel_values"].numpy(), case["image_position_ids"].numpy())
        ref64 = case["f64/rows"].numpy()
        vt = os.path.join(out, "tiny_20x15.vtimg")
        write_vtimg(vt, imgs)
        runs = [(v, "auto") for v in ("bf16", "f16", "bf16-gelu", "f32", "f32-gelu")] + [("f32-gelu", "off")]
        for v, fa in runs:
            rows_path = os.path.join(out, f"tiny_20x15.{v}.fa-{fa}.f32")
            info, log = run_bench(a.bench, os.path.join(out, GEMMA4_VARIANTS[v][0]), vt, rows_path,
                                  "--iters", "3", "--warmup", "1", "--flash-attn", fa)
            rows = np.fromfile(rows_path, dtype="<f4")
            emit({"fixture": "gemma4 tiny_20x15", "input": "upstream processor pixels", "mmproj": v,
                  "flash_attn": fa, "rows": info["rows"], "ref_rows": int(ref64.shape[0]),
                  "rel_l2_vs_upstream_f64": rel_l2(rows, ref64) if rows.size == ref64.size else None,
                  "median_ms_cpu": info["median_ms"],
                  "log": [l.split(":", 1)[1].strip() for l in log.splitlines()
                          if "flash attention is" in l or "ffn_op" in l][:2]})
        # Own preprocessing: the decoded image through llama.cpp's gemma4v sizing law and bicubic
        # resize (mtmd_image_preprocessor_dyn_size). First at llama.cpp's own token budget
        # (gemma4v: 70..1120 tokens), then at the budget that lands on upstream's grid, so that
        # the rows compare and only the interpolation differs.
        from PIL import Image

        with open(os.path.join(fx, "models", "gemma4", "preprocessor_config.json")) as f:
            budget = json.load(f)["max_soft_tokens"]
        img = Image.open(os.path.join(fx, "images", "tiny_20x15.png")).convert("RGB")
        u8 = np.asarray(img)[None]
        vu = os.path.join(out, "tiny_20x15.u8.vtimg")
        write_vtimg(vu, u8)
        gh, gw = (int(case["image_position_ids"][0, :, k].max()) + 1 for k in (1, 0))
        align = 16 * 3
        want = (gw * 16, gh * 16)
        match = next((t for t in range(budget, 0, -1)
                      if llama_dyn_size(img.width, img.height, align, t * align * align, budget * align * align) == want),
                     None)
        for v, lo, hi in (("bf16", -1, -1), ("bf16", match, budget), ("bf16-gelu", match, budget),
                          ("f32-gelu", match, budget)):
            if lo is None:
                emit({"fixture": "gemma4 tiny_20x15", "input": "u8 image, llama.cpp preprocessing",
                      "note": f"no min-token budget <= {budget} lands on upstream's {want[0]}x{want[1]}"})
                break
            rows_path = os.path.join(out, f"tiny_20x15.own.{v}.{lo}.f32")
            info, log = run_bench(a.bench, os.path.join(out, GEMMA4_VARIANTS[v][0]), vu, rows_path,
                                  "--iters", "3", "--warmup", "1", "--min-tokens", str(lo), "--max-tokens", str(hi))
            rows = np.fromfile(rows_path, dtype="<f4")
            emit({"fixture": "gemma4 tiny_20x15", "input": "u8 image, llama.cpp preprocessing", "mmproj": v,
                  "token_budget": "llama.cpp default" if lo < 0 else [lo, hi],
                  "llama_resized_wh": info["entry_size"], "upstream_resized_wh": list(want),
                  "rows": info["rows"], "ref_rows": int(ref64.shape[0]),
                  "rel_l2_vs_upstream_f64": rel_l2(rows, ref64) if rows.size == ref64.size else None})


def llama_dyn_size(width, height, align, min_pixels, max_pixels):
    """img_tool::calc_size_preserved_ratio of the pinned mtmd-image.cpp (no longest edge):
    round to the alignment, then scale down to max_pixels or up to min_pixels keeping the ratio.
    llama.cpp computes in float32; float64 here, which decides the same on these sizes."""
    import math

    w_bar = max(align, round(width / align) * align)
    h_bar = max(align, round(height / align) * align)
    if max_pixels > 0 and w_bar * h_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(align, math.floor(height / beta / align) * align)
        w_bar = max(align, math.floor(width / beta / align) * align)
    elif min_pixels > 0 and w_bar * h_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / align) * align
        w_bar = math.ceil(width * beta / align) * align
    return (w_bar, h_bar)


# ---------------------------------------------------------------------------------------------
# run: every case of an anchor directory through llama.cpp, and the report

# Per family: the GGUF variants timed, in order; the first is the headline llama.cpp column.
# "f16+acc32" is the F16 file with GGML_CUDA_CUBLAS_COMPUTE_TYPE=f32 (cuBLAS accumulates F16
# GEMMs in f16 otherwise on this GPU): the effect of that accumulation alone.
RUN_VARIANTS = {"gemma4": ["bf16", "f16", "bf16-gelu", "f32-gelu", "f16+acc32"],
                "glm5_next": ["bf16", "f16", "f16+acc32"],
                "step3p7": ["bf16", "f16", "f16+acc32"]}
GGUF_NAME = {"bf16": "mmproj-BF16.gguf", "f16": "mmproj-F16.gguf", "bf16-gelu": "mmproj-BF16-gelu.gguf",
             "f32": "mmproj-F32.gguf", "f32-gelu": "mmproj-F32-gelu.gguf"}
WHAT = {"bf16": "as llama.cpp's converter writes it (BF16 matrices; gemma4: gelu_quick)",
        "f16": "F16 matrices (cuBLAS accumulates in f16)",
        "bf16-gelu": "BF16 + clip.use_gelu: upstream's tanh GELU instead of gelu_quick",
        "f32-gelu": "F32 matrices + tanh GELU: llama.cpp's graph with the least rounding",
        "f16+acc32": "F16 matrices, GGML_CUDA_CUBLAS_COMPUTE_TYPE=f32 (ggml widens them: cuBLAS SGEMM)"}


def cmd_run(a):
    """Every selected case of --anchor (torch_anchor.py's output): GGUFs once per family, the
    case's inputs as images, the harness per variant, rel-L2 against upstream's f32 (and bf16)
    rows; one JSON line per run, appended to --results."""
    with open(os.path.join(a.anchor, "anchor.json")) as f:
        anchor = json.load(f)
    sel = a.cases.split(",") if a.cases and a.cases != "all" else None
    gdir = os.path.join(a.work, "gguf")
    os.makedirs(a.work, exist_ok=True)
    done_fam, failed_fam = set(), set()
    for name, case in anchor["cases"].items():
        fam = case["family"]
        if sel and name not in sel and fam not in sel:
            continue
        if "inputs" not in case:
            continue
        variants = a.variants.split(",") if a.variants else RUN_VARIANTS[fam]
        files = sorted({GGUF_NAME[v.split("+")[0]] for v in variants})
        fdir = os.path.join(gdir, fam)
        if fam in failed_fam:
            continue
        if fam not in done_fam:
            weights = os.path.join(a.anchor, anchor["families"][fam]["weights"])
            need = [f for f in files if not os.path.exists(os.path.join(fdir, f))]
            try:
                if need:
                    vs = sorted({v.split("+")[0] for v in variants})
                    t = time.time()
                    if fam == "gemma4":
                        gguf_gemma4(weights, fdir, vs)
                    else:
                        gguf_llama_converter(fam, weights, fdir, vs, a.llama)
                    emit({"converted": fam, "seconds": round(time.time() - t, 1)})
            except Exception as e:  # noqa: BLE001 - recorded; the other families go on
                failed_fam.add(fam)
                res = {"case": name, "family": fam, "variant": "conversion", "error": repr(e)[-1500:]}
                emit(res)
                with open(a.results, "a") as f:
                    f.write(json.dumps(res) + "\n")
                continue
            done_fam.add(fam)
        inp = os.path.join(a.anchor, case["inputs"])
        vt = os.path.join(a.work, f"{name}.vtimg")
        refs = {}
        if fam == "glm5_next":
            ref = os.path.join(a.anchor, fam, f"{name}.rows_f32_dup.safetensors")
            try:
                if not os.path.exists(ref):
                    glm_ref(os.path.join(a.anchor, anchor["families"][fam]["weights"]), inp, ref)
                refs["f32"] = ref
            except Exception as e:  # noqa: BLE001 - the timing still runs, without its reference
                emit({"case": name, "glm_ref_error": repr(e)[-800:]})
        else:
            if case.get("rows_f32"):
                refs["f32"] = os.path.join(a.anchor, case["rows_f32"])
            if case.get("rows_bf16"):
                refs["torch_bf16"] = os.path.join(a.anchor, case["rows_bf16"])
        cmd_inputs(SimpleNamespace(family=fam, inputs=inp, out=vt))
        ref_rows = {k: load_st(v)["rows"].float().numpy() for k, v in refs.items()}
        for v in variants:
            base, _, opt = v.partition("+")
            env = dict(os.environ)
            if opt == "acc32":
                env["GGML_CUDA_CUBLAS_COMPUTE_TYPE"] = "f32"
            rows_path = os.path.join(a.work, f"{name}.{v}.f32")
            cmd = [a.bench, "--mmproj", os.path.join(fdir, GGUF_NAME[base]), "--input", vt, "--out", rows_path,
                   "--iters", str(a.iters), "--warmup", str(a.warmup)] + (["--cpu"] if a.cpu else [])
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            log = [l.split(":", 1)[-1].strip() for l in r.stderr.splitlines()
                   if any(k in l for k in ("flash attention is", "ffn_op", "graph splits", "unsupported",
                                           "compute buffer size", "CUDA0"))]
            if r.returncode != 0:
                res = {"case": name, "family": fam, "variant": v, "error": r.stderr[-1500:]}
            else:
                res = json.loads(r.stdout.strip().splitlines()[-1])
                res.update({"case": name, "family": fam, "variant": v, "what": WHAT.get(v, v),
                            "batch": case["batch"], "log": sorted(set(log))[:8]})
                rows = np.fromfile(rows_path, dtype="<f4")
                for k, ref in ref_rows.items():
                    res[f"rel_{k}"] = rel_l2(rows, ref) if rows.size == ref.size else \
                        f"size {rows.size} vs {ref.size}"
                os.remove(rows_path)
            emit(res)
            with open(a.results, "a") as f:
                f.write(json.dumps(res) + "\n")


def fmt_ms(v):
    return f"{v:.2f}" if isinstance(v, (int, float)) else "—"


def fmt_sci(v):
    return f"{v:.2e}" if isinstance(v, (int, float)) else ("—" if v is None else str(v))


def cmd_report(a):
    """The tables for docs/PERF.md from anchor.json, ours.json (when `xtask bench` ran) and the
    llama.cpp results."""
    with open(os.path.join(a.anchor, "anchor.json")) as f:
        anchor = json.load(f)
    ours = {}
    if os.path.exists(os.path.join(a.anchor, "ours.json")):
        with open(os.path.join(a.anchor, "ours.json")) as f:
            ours = json.load(f)
    res = {}
    with open(a.results) as f:
        for line in f:
            r = json.loads(line)
            res[(r["case"], r["variant"])] = r
    cases = [c for c in anchor["cases"] if any(k[0] == c for k in res)]
    v = anchor.get("versions", {})
    out = [f"llama.cpp peer — {v.get('date_utc', '?')}, {v.get('device', '?')}; torch {v.get('torch', '?')}, "
           f"transformers {v.get('transformers', '?')}; llama.cpp @0c1e57098 (llama-cpp-python 0.3.36), "
           f"clip API, CUDA sm_90; ours: `xtask bench` of the same call ({ours.get('date', 'not run')}).", ""]
    out.append("| case | ours ms | torch.compile ms | llama.cpp ms (BF16) | img/s ours / compile / llama.cpp "
               "| ours vs llama.cpp | rel-L2 vs upstream f32: ours / torch bf16 / llama.cpp BF16 / F16 |")
    out.append("|---|---|---|---|---|---|---|")
    for c in cases:
        ac, fam, b = anchor["cases"][c], anchor["cases"][c]["family"], anchor["cases"][c]["batch"]
        oc = ours.get("families", {}).get(fam, {}).get("cases", {}).get(c, {})
        lb, lf = res.get((c, "bf16"), {}), res.get((c, "f16"), {})
        om, cm, lm = oc.get("ms"), ac.get("compile_ms"), lb.get("median_ms")
        ips = " / ".join(f"{1e3 * b / m:.1f}" if isinstance(m, (int, float)) else "—" for m in (om, cm, lm))
        sp = f"{lm / om:.2f}×" if isinstance(om, (int, float)) and isinstance(lm, (int, float)) else "—"
        torch_rel = oc.get("torch_rel_f32")
        rels = " / ".join(fmt_sci(x) for x in (oc.get("rel_f32"), torch_rel, lb.get("rel_f32"), lf.get("rel_f32")))
        out.append(f"| {c} | {fmt_ms(om)} | {fmt_ms(cm)} | {fmt_ms(lm)} | {ips} | {sp} | {rels} |")
    out += ["", "| case | llama.cpp variant | ms | rel-L2 vs upstream f32 | vs torch bf16 | flash attention | batched |",
            "|---|---|---|---|---|---|---|"]
    for c in cases:
        for (cc, var), r in res.items():
            if cc != c:
                continue
            fa = next((l for l in r.get("log", []) if "flash attention is" in l), "?").replace("flash attention is ", "")
            out.append(f"| {c} | {var}: {r.get('what', '')} | {fmt_ms(r.get('median_ms'))} | "
                       f"{fmt_sci(r.get('rel_f32'))} | {fmt_sci(r.get('rel_torch_bf16'))} | {fa} | "
                       f"{r.get('batched', r.get('error', '?')[:60] if 'error' in r else '?')} |")
    notes = sorted({l for r in res.values() for l in r.get("log", []) if "splits" in l or "unsupported" in l})
    if notes:
        out += ["", "clip's log: " + "; ".join(notes[:6])]
    md = "\n".join(out) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    print(md)



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gguf")
    g.add_argument("family", choices=["gemma4", "glm5_next", "step3p7"])
    g.add_argument("--weights", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--llama", help="the unpacked trimmed llama.cpp (its converter, for glm5_next and step3p7)")
    g.add_argument("--variants")
    i = sub.add_parser("inputs")
    i.add_argument("family", choices=["gemma4", "glm5_next", "step3p7"])
    i.add_argument("--inputs", required=True)
    i.add_argument("--out", required=True)
    r = sub.add_parser("glm-ref")
    r.add_argument("--weights", required=True)
    r.add_argument("--inputs", required=True)
    r.add_argument("--out", required=True)
    e = sub.add_parser("rel")
    e.add_argument("--rows", required=True)
    e.add_argument("--ref", action="append", required=True)
    e.add_argument("--key", default="rows")
    f = sub.add_parser("fixture-check")
    f.add_argument("--bench", help="the llama_clip_bench binary (a CPU build is enough)")
    f.add_argument("--llama", help="the unpacked trimmed llama.cpp (to compare with its converter)")
    f.add_argument("--out")
    u = sub.add_parser("run")
    u.add_argument("--anchor", required=True, help="torch_anchor.py's --out (anchor.json, weights, inputs, rows)")
    u.add_argument("--work", required=True, help="GGUFs, images and rows go here")
    u.add_argument("--bench", required=True)
    u.add_argument("--llama", help="the unpacked trimmed llama.cpp (converter for glm5_next, step3p7)")
    u.add_argument("--cases", default="all")
    u.add_argument("--variants", help="comma list (default per family: RUN_VARIANTS)")
    u.add_argument("--iters", type=int, default=20)
    u.add_argument("--warmup", type=int, default=3)
    u.add_argument("--cpu", action="store_true")
    u.add_argument("--results", required=True, help="JSON lines, appended")
    o = sub.add_parser("report")
    o.add_argument("--anchor", required=True)
    o.add_argument("--results", required=True)
    o.add_argument("--out")
    a = ap.parse_args()
    {"gguf": cmd_gguf, "inputs": cmd_inputs, "glm-ref": lambda a: glm_ref(a.weights, a.inputs, a.out),
     "rel": cmd_rel, "fixture-check": cmd_fixture_check, "run": cmd_run, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
