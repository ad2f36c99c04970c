#!/usr/bin/env python3
"""transformers and vision_towers on the same image, in one process, as a user would compare them.

Upstream: the model's HF image processor (``AutoImageProcessor``) on the decoded image, then the
model's ``get_image_features`` (vision tower + projection into the LM width). Ours:
``vision_towers.Model.encode`` from the file's bytes, the rows taken with ``torch.from_dlpack``.
Both are timed end to end (bytes in, rows on the device, synchronised), warm, over ``--runs``
runs (median), and the rows compared: rel-L2 = ‖ours − upstream‖ / ‖upstream‖ over all rows.

    python3 compare_transformers.py --model DIR --image FILE [--batch 8] [--device cuda:0]
        [--dtype bfloat16|float32] [--compile] [--runs 20] [--keep-lm]

``DIR`` is a HF model directory (config.json, the image processor's config, safetensors). The
LM is cut to one layer before loading unless ``--keep-lm`` (only the vision tower and the
projection run; the other layers' weights are skipped). ``--compile`` times upstream's
``get_image_features`` under ``torch.compile`` (compiled before timing).
"""

import argparse
import io
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--batch", type=int, default=1, help="the image repeated this many times per call")
    ap.add_argument("--device", default="cuda:0" if _cuda() else "cpu")
    ap.add_argument("--dtype", default=None, help="bfloat16 or float32 (default: bf16 on CUDA, f32 on the CPU)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="upstream under torch.compile")
    ap.add_argument("--keep-lm", action="store_true", help="load the whole LM too")
    args = ap.parse_args()

    import torch
    from PIL import Image
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText

    import vision_towers as vt

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype_name = args.dtype or ("bfloat16" if cuda else "float32")
    dtype = getattr(torch, dtype_name)
    raw = open(args.image, "rb").read()
    batch = [raw] * args.batch

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    # ---- upstream ----------------------------------------------------------------------------
    config = AutoConfig.from_pretrained(args.model)
    text = getattr(config, "text_config", None)
    if not args.keep_lm and text is not None and hasattr(text, "num_hidden_layers"):
        text.num_hidden_layers = 1
        for key in ("layer_types", "mlp_layer_types"):
            if isinstance(getattr(text, key, None), list):
                setattr(text, key, getattr(text, key)[:1])
    t0 = time.perf_counter()
    hf = AutoModelForImageTextToText.from_pretrained(args.model, config=config, dtype=dtype).to(device).eval()
    processor = AutoImageProcessor.from_pretrained(args.model)
    hf_load = time.perf_counter() - t0
    feature_args = ("pixel_values", "image_position_ids", "image_grid_thw", "pixel_values_local", "num_local_patches")
    features = torch.compile(hf.get_image_features) if args.compile else hf.get_image_features

    def upstream():
        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in batch]
        inputs = processor(images=images, return_tensors="pt")
        kw = {k: v.to(device) for k, v in inputs.items() if k in feature_args}
        if "pixel_values" in kw:
            kw["pixel_values"] = kw["pixel_values"].to(dtype)
        if "pixel_values_local" in kw:
            kw["pixel_values_local"] = kw["pixel_values_local"].to(dtype)
        with torch.no_grad():
            out = features(**kw).pooler_output
        rows = list(out) if isinstance(out, (list, tuple)) else [out]
        sync()
        return rows

    # ---- ours ----------------------------------------------------------------------------------
    t0 = time.perf_counter()
    ours_model = vt.Model(args.model, device=args.device if cuda else "cpu",
                          precision=("bf16" if dtype == torch.bfloat16 else "f32") if cuda else None)
    ours_load = time.perf_counter() - t0

    def ours():
        if cuda:
            rows = [torch.from_dlpack(r) for r in ours_model.encode(batch, dtype=dtype)]
        else:
            rows = [torch.from_dlpack(r).to(dtype) for r in ours_model.encode(batch)]
        sync()
        return rows

    def timed(f):
        for _ in range(args.warmup):
            f()
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    theirs_rows, our_rows = upstream(), ours()
    t_theirs, t_ours = timed(upstream), timed(ours)
    a = torch.cat([r.float().reshape(-1, r.shape[-1]) for r in our_rows]).double()
    b = torch.cat([r.float().reshape(-1, r.shape[-1]) for r in theirs_rows]).double()
    print(f"model {args.model} ({ours_model.family}); image {args.image} × {args.batch}; "
          f"{device} {dtype_name}{' (upstream compiled)' if args.compile else ''}")
    print(f"load: transformers {hf_load:.2f} s, vision_towers {ours_load:.2f} s")
    print(f"rows: ours {tuple(a.shape)}, upstream {tuple(b.shape)}")
    if a.shape == b.shape:
        rel = ((a - b).norm() / b.norm()).item()
        print(f"rel-L2 ours vs upstream: {rel:.3e}")
    else:
        print("rel-L2: shapes differ (the processors planned different sizes)")
    print(f"time per call (median of {args.runs}): transformers {t_theirs * 1e3:.2f} ms, "
          f"vision_towers {t_ours * 1e3:.2f} ms, speed-up {t_theirs / t_ours:.2f}x")


def _cuda():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    main()
