#!/usr/bin/env python3
"""Writes the seed corpora of every fuzz target under target/fuzz/seeds/<target>/ (or OUT_DIR/<target>/),
deterministically from fixtures/ (the same files on every run). `cargo xtask fuzz` runs it before
every run and reads them beside the committed fuzz/corpus/<target>/ (what the fuzzers found beyond them).

jpeg_own: 1 selector byte (the entropy decode's ways, mod 8, plus 1) + each fixtures/prep/jpeg
        file and the fixture JPEGs of at most 64 KiB.
prep:   1 selector byte (bits 0-1 law, bit 2 data: URI) + a fixture image (fixtures/images, the
        decode cases of fixtures/prep/decode, the libjpeg-turbo cases of fixtures/prep/jpeg,
        small bicubic outputs of fixtures/prep/resize).
inputs: the processor tensors of fixtures/outputs/*/{tiny_20x15,batch2,video_t2}.safetensors with
        the reference activations dropped, shrunk variants (fewer patches / a smaller grid), and
        fixtures/outputs/*/proc_*.safetensors (these lack pixel_values: the missing-tensor path).
configs, model_dir: 1 selector byte (bits 0-1 family, bits 2-4 the file, mod 5: config.json,
        preprocessor_config.json, processor_config.json, tokenizer_config.json, tokenizer.json) +
        that file of the fixture model (processor_config.json and tokenizer.json built from the
        other two), and every JSON replacement of fixtures/adversarial/weights.
index:  fixtures/models/step3p7_sharded/model.safetensors.index.json and the adversarial indexes.
uri:    the adversarial data-uri cases and small fixture images as data URIs of several shapes.
tower_st: 1 selector byte (the directory, mod 6) + the fixture model.safetensors, and the
        adversarial safetensors cases that edit it (their edits applied as the test applies them).
tower_gguf, gguf: the mmproj GGUF fixtures and the adversarial gguf cases applied; gguf also the
        reader fixtures. safetensors: the reader fixtures and the single-file fixture models.
Stdlib only; run from anywhere: python3 fuzz/seeds.py [OUT_DIR]
"""
import base64, glob, json, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "fixtures")
OUT = os.path.join(ROOT, "target", "fuzz", "seeds")


def prep():
    out = os.path.join(OUT, "prep")
    os.makedirs(out, exist_ok=True)
    full = sorted(glob.glob(f"{FIX}/images/*")) + sorted(
        f for f in glob.glob(f"{FIX}/prep/decode/*") if not f.endswith((".expected.png", ".json"))) + sorted(
        glob.glob(f"{FIX}/prep/jpeg/*.jpg"))
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


def jpeg_own():
    out = os.path.join(OUT, "jpeg_own")
    os.makedirs(out, exist_ok=True)
    files = sorted(glob.glob(f"{FIX}/prep/jpeg/*.jpg")) + sorted(
        f for f in glob.glob(f"{FIX}/images/*.jpg") if os.path.getsize(f) <= 65536)
    for i, f in enumerate(files):
        with open(f"{out}/{i % 8}_{os.path.basename(f)}", "wb") as w:
            w.write(bytes([i % 8]) + open(f, "rb").read())
    return len(files)


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


FAMILIES = ["gemma4", "glm5_next", "glm_ocr", "step3p7"]
CONFIG_FILES = ["config.json", "preprocessor_config.json", "processor_config.json",
                "tokenizer_config.json", "tokenizer.json"]
ST_DIRS = ["gemma4", "gemma4_clipped", "glm5_next", "glm_ocr", "step3p7", "step3p7_hf"]
ADV = os.path.join(FIX, "adversarial")


def put(target, name, data):
    out = os.path.join(OUT, target)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "wb") as w:
        w.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def configs():
    """Same seeds for `configs` and `model_dir` (one input format)."""
    seeds = {}
    for fi, fam in enumerate(FAMILIES):
        d = f"{FIX}/models/{fam}"
        files = {n: read(f"{d}/{n}") for n in CONFIG_FILES if os.path.exists(f"{d}/{n}")}
        if "preprocessor_config.json" in files:
            files.setdefault("processor_config.json", json.dumps(
                {"image_processor": json.loads(files["preprocessor_config.json"])}, indent=2).encode())
        tok = json.loads(files.get("tokenizer_config.json", b"{}")).get("added_tokens_decoder")
        if tok:
            files.setdefault("tokenizer.json", json.dumps({"added_tokens": [
                dict(v, id=int(k)) for k, v in sorted(tok.items(), key=lambda kv: int(kv[0]))]}, indent=2).encode())
        for si, name in enumerate(CONFIG_FILES):
            if name in files:
                seeds[f"{fam}_{name}"] = bytes([fi | si << 2]) + files[name]
    for f in sorted(glob.glob(f"{ADV}/weights/*.json")):
        base = os.path.basename(f)
        fam = next((x for x in FAMILIES if base.startswith(x + "_")), None)
        slot = next((i for i, n in enumerate(CONFIG_FILES) if base.endswith("." + n)), None)
        if fam is not None and slot is not None:
            seeds[f"adv_{base}"] = bytes([FAMILIES.index(fam) | slot << 2]) + read(f)
    for name, data in seeds.items():
        put("configs", name, data)
        put("model_dir", name, data)
    return len(seeds)


def index():
    files = [f"{FIX}/models/step3p7_sharded/model.safetensors.index.json"] + sorted(
        glob.glob(f"{ADV}/weights/sharded_*.index.json"))
    for f in files:
        put("index", os.path.basename(f), read(f))
    return len(files)


def uri():
    manifest = json.loads(read(f"{ADV}/manifest.json"))
    n = 0
    for c in manifest["cases"]:
        u = (c.get("source") or {}).get("uri")
        if c["class"] == "data-uri" and u is not None:
            put("uri", c["id"].replace("/", "_"), u.encode()); n += 1
    for f in [f"{FIX}/images/tiny_20x15.png", f"{FIX}/images/camera_gray_96x96.png",
              f"{FIX}/prep/jpeg/astronaut_16x16_420_q95.jpg"]:
        b64 = base64.b64encode(read(f)).decode()
        name = os.path.basename(f)
        for i, u in enumerate([
                "data:image/png;base64," + b64,
                "DATA:;BASE64," + b64,
                "  data:image/jpeg;charset=utf-8;base64," + b64,
                "data:image/png;base64," + "\r\n".join(b64[j:j + 76] for j in range(0, len(b64), 76)),
                "data:image/png;base64," + b64.rstrip("="),
                "data:image/png; base64 ," + b64.replace("+", "-").replace("/", "_")]):
            put("uri", f"{name}_{i}", u.encode()); n += 1
    return n


def apply_edits(base_bytes, edits, file):
    """fixtures/adversarial edits on one file, as crates/vision-towers/tests/adversarial.rs applies them."""
    b = bytearray(base_bytes)
    for e in edits:
        if e.get("file", file) != file:
            return None
        op = e["op"]
        if op == "patch":
            h = bytes.fromhex(e["hex"]); b[e["at"]:e["at"] + len(h)] = h
        elif op == "truncate":
            del b[e["len"]:]
        elif op == "splice_head":
            b = bytearray(read(f"{ADV}/{e['head']}")) + b[e["keep_from"]:]
        else:
            return None
    return bytes(b)


def weights():
    manifest = json.loads(read(f"{ADV}/manifest.json"))
    n = 0
    ggufs = sorted(glob.glob(f"{FIX}/models/gemma4_gguf/*.gguf"))
    for f in ggufs:
        for t in ("tower_gguf", "gguf"):
            put(t, os.path.basename(f), read(f))
        n += 1
    for f in sorted(glob.glob(f"{FIX}/readers/gguf/*.gguf")):
        put("gguf", os.path.basename(f), read(f)); n += 1
    for f in sorted(glob.glob(f"{FIX}/readers/safetensors/**/*.safetensors", recursive=True)):
        put("safetensors", f[len(FIX) + 1:].replace("/", "_"), read(f)); n += 1
    for i, d in enumerate(ST_DIRS):
        b = read(f"{FIX}/models/{d}/model.safetensors")
        put("tower_st", f"{d}.safetensors", bytes([i]) + b)
        put("safetensors", f"{d}.safetensors", b); n += 1
    for c in manifest["cases"]:
        m = c.get("model") or {}
        base = m.get("base", "")
        name = c["id"].replace("/", "_")
        if base.endswith(".gguf"):
            b = apply_edits(read(f"{FIX}/{base}"), m["edits"], None)
            if b is not None:
                put("tower_gguf", name, b); put("gguf", name, b); n += 1
        elif base.startswith("models/") and base[len("models/"):] in ST_DIRS:
            d = base[len("models/"):]
            b = apply_edits(read(f"{FIX}/{base}/model.safetensors"), m["edits"], "model.safetensors")
            if b is not None:
                put("tower_st", name, bytes([ST_DIRS.index(d)]) + b); n += 1
    return n


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 1:
        OUT = os.path.abspath(sys.argv[1])
    print("prep seeds:", prep())
    print("jpeg_own seeds:", jpeg_own())
    print("inputs seeds:", inputs())
    print("configs / model_dir seeds:", configs())
    print("index seeds:", index())
    print("uri seeds:", uri())
    print("weights seeds (tower_st, tower_gguf, gguf, safetensors):", weights())
