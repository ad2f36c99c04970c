#!/usr/bin/env python3
"""Writes the seed corpora of the `prep` and `inputs` fuzz targets under fuzz/corpus/ (ignored by git).

prep:   1 selector byte (bits 0-1 law, bit 2 data: URI) + a fixture image (fixtures/images, the
        decode cases of fixtures/prep/decode, small bicubic outputs of fixtures/prep/resize).
inputs: the processor tensors of fixtures/outputs/*/{tiny_20x15,batch2,video_t2}.safetensors with
        the reference activations dropped, shrunk variants (fewer patches / a smaller grid), and
        fixtures/outputs/*/proc_*.safetensors (these lack pixel_values: the missing-tensor path).
Stdlib only; run from anywhere: python3 fuzz/seeds.py
"""
import glob, json, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "fixtures")
OUT = os.path.join(ROOT, "fuzz", "corpus")


def prep():
    out = os.path.join(OUT, "prep")
    os.makedirs(out, exist_ok=True)
    full = sorted(glob.glob(f"{FIX}/images/*")) + sorted(
        f for f in glob.glob(f"{FIX}/prep/decode/*") if not f.endswith((".expected.png", ".json")))
    n = 0
    def put(sel, f):
        nonlocal n
        with open(f"{out}/{sel}_{os.path.basename(f)}", "wb") as w:
            w.write(bytes([sel]) + open(f, "rb").read())
        n += 1
    for f in full:
        size = os.path.getsize(f)
        if size > 65535:
            continue
        for sel in range(8):
            if sel < 4 or size <= 16384:
                put(sel, f)
    small = sorted(f for f in glob.glob(f"{FIX}/prep/resize/*bicubic.png") if os.path.getsize(f) <= 8192)
    for i, f in enumerate(small):
        put(i % 8, f)
    return n


def read_st(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def write_st(path, tensors):
    header, data = {}, b""
    for k, (dtype, shape, raw) in tensors.items():
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as w:
        w.write(struct.pack("<Q", len(h)) + h + data)


def i64(values, shape):
    return ("I64", shape, struct.pack(f"<{len(values)}q", *values))


def inputs():
    out = os.path.join(OUT, "inputs")
    os.makedirs(out, exist_ok=True)
    n = 0
    for f in sorted(glob.glob(f"{FIX}/outputs/*/*.safetensors")):
        fam, name = f.split("/")[-2], os.path.basename(f)[:-len(".safetensors")]
        t = {k: v for k, v in read_st(f).items() if "/" not in k}
        if name.startswith("proc_"):
            if os.path.getsize(f) <= 600_000:
                write_st(f"{out}/{fam}_{name}.safetensors", t); n += 1
            continue
        if "pixel_values" not in t:
            continue
        if fam == "gemma4" and name == "tiny_20x15":
            # First k patches of image 0, with their positions.
            _, (b, p, d), pv = t["pixel_values"]
            pos = t["image_position_ids"][2]
            # A 3×3 and a 6×3 patch grid (x fastest), pooled 3×3 into 1 and 2 soft tokens.
            for gw, gh in ((3, 3), (6, 3)):
                k = gw * gh
                write_st(f"{out}/gemma4_{gw}x{gh}patches.safetensors", {
                    "pixel_values": ("F32", [1, k, d], pv[:k * d * 4]),
                    "image_position_ids": i64([c for y in range(gh) for x in range(gw) for c in (x, y)], [1, k, 2]),
                    "num_soft_tokens_per_image": i64([k // 9], [1])}); n += 1
            continue
        if fam == "gemma4":
            continue  # 1.9 MB and more: over max_len
        if fam in ("glm5_next", "glm_ocr") and name == "tiny_20x15":
            _, (rows, d), pv = t["pixel_values"]
            write_st(f"{out}/{fam}_grid1x2x2.safetensors", {
                "pixel_values": ("F32", [4, d], pv[:4 * d * 4]), "image_grid_thw": i64([1, 2, 2], [1, 3])}); n += 1
        if fam == "step3p7" and name == "tiny_20x15":
            # The top-left 56×56 of the 168×168 global view.
            _, _, pv = t["pixel_values"]
            crop = b"".join(pv[(c * 168 + y) * 168 * 4:(c * 168 + y) * 168 * 4 + 56 * 4] for c in range(3) for y in range(56))
            write_st(f"{out}/step3p7_side56.safetensors", {
                "pixel_values": ("F32", [1, 3, 56, 56], crop), "num_local_patches": i64([0], [1])}); n += 1
        # Whole inputs only where one run stays under ~1 s (the host towers run under ASan).
        if sum(len(v[2]) for v in t.values()) <= 350_000 and name != "batch2":
            write_st(f"{out}/{fam}_{name}.safetensors", t); n += 1
    return n


if __name__ == "__main__":
    print("prep seeds:", prep())
    print("inputs seeds:", inputs())
