"""Rows and plans against upstream's fixtures (transformers 5.23), through the Python API.

- rows: every tower fixture's images encoded by every model layout of its variant, against the
  float64 reference rows: rel-L2 <= 1e-5 (the host bound), from image bytes and from the
  processor's own tensors (encode_prepared, which must also equal encode bitwise);
- plans: every processor fixture's prompt runs, and every row of fixtures/prep/plans.json
  (upstream's plan table) planned from a header-only PNG of that size.
"""

import json
import os
import struct
import zlib

import pytest

import vision_towers as vt
from vt_testutil import SafeTensors, f32s, fixtures_dir, image_bytes, model, rel_l2

HOST_BOUND = 1e-5

# The model layouts of each tower variant (README "Parity with upstream"); GGUF files carry no
# processor config, so they are opened with the HF fixture's soft-token budget.
LAYOUTS = {
    "gemma4": [
        ("gemma4", {}),
        ("gemma4_gguf/mmproj-BF16.gguf", {"max_soft_tokens": 70}),
        ("gemma4_gguf/mmproj-F16.gguf", {"max_soft_tokens": 70}),
    ],
    "gemma4_clipped": [
        ("gemma4_clipped", {}),
        ("gemma4_gguf/mmproj-clipped-BF16.gguf", {"max_soft_tokens": 70}),
    ],
    "glm5_next": [("glm5_next", {})],
    "glm_ocr": [("glm_ocr", {})],
    "step3p7": [("step3p7", {}), ("step3p7_sharded", {}), ("step3p7_hf", {})],
}


def tower_cases():
    out = []
    for variant in sorted(LAYOUTS):
        for f in sorted((fixtures_dir() / "outputs" / variant).glob("*.safetensors")):
            if f.name.startswith("proc_"):
                continue
            meta = SafeTensors(f).fixture()
            if not meta.get("prompt_plan"):
                continue  # crafted tower inputs (glm5_next video), no image
            for layout, kw in LAYOUTS[variant]:
                out.append(pytest.param(f, layout, kw, id=f"{variant}/{f.stem}/{layout}"))
    return out


@pytest.mark.parametrize("case, layout, kw", tower_cases())
def test_rows_equal_upstream_within_the_host_bound(case, layout, kw):
    st = SafeTensors(case)
    meta = st.fixture()
    m = model(layout, **kw)
    rows = m.encode([image_bytes(i) for i in meta["images"]])
    got = [v for r in rows for v in f32s(r.to_bytes())]
    want = st.values("f64/rows")
    assert st.shape("f64/rows")[1] == m.width
    err = rel_l2(got, want)
    assert err <= HOST_BOUND, f"rel-L2 {err:.3e} over {HOST_BOUND}"
    for r, plan in zip(rows, meta["prompt_plan"]):
        assert r.shape[0] == r.plan["rows"]
        if layout.endswith(".gguf"):
            # An mmproj GGUF carries no token ids: the counts must still agree.
            assert [c for _, c in ours_runs(r.plan)] == [c for _, c in upstream_runs(plan, r.plan)]
        else:
            assert ours_runs(r.plan) == upstream_runs(plan, r.plan)


def processor_tensors(st, np):
    """The upstream processor's tensors stored in a tower fixture, as NumPy arrays."""
    kinds = {"F32": np.float32, "I64": np.int64, "BOOL": np.bool_, "U8": np.uint8}
    out = {}
    for name in st.names():
        if "/" in name:
            continue  # activations f32/…, f64/…
        a = np.frombuffer(st.raw(name), dtype=kinds[st.dtype(name)])
        out[name] = a.reshape(st.shape(name))
    return out


@pytest.mark.parametrize(
    "variant, case",
    [
        ("gemma4", "batch2"),
        ("glm5_next", "batch2"),
        ("glm_ocr", "batch2"),
        ("step3p7", "batch2"),
        ("gemma4", "tiny_20x15"),
    ],
)
def test_encode_prepared_equals_encode_and_upstream(variant, case):
    np = pytest.importorskip("numpy")
    st = SafeTensors(fixtures_dir() / "outputs" / variant / f"{case}.safetensors")
    meta = st.fixture()
    m = model(variant)
    from_tensors = m.encode_prepared(processor_tensors(st, np))
    from_bytes = m.encode([image_bytes(i) for i in meta["images"]])
    assert [r.shape for r in from_tensors] == [r.shape for r in from_bytes]
    for a, b in zip(from_tensors, from_bytes):
        assert a.to_bytes() == b.to_bytes()
    got = np.concatenate([np.from_dlpack(r) for r in from_tensors]).astype(np.float64)
    want = np.frombuffer(st.raw("f64/rows"), dtype=np.float64)
    err = np.linalg.norm(got.ravel() - want) / np.linalg.norm(want)
    assert err <= HOST_BOUND


def ours_runs(plan):
    return [(i, c) for i, c in plan["prompt_runs"]]


def upstream_runs(prompt_plan, ours):
    """Upstream's runs as (id, count), adjacent equal ids merged; glm's image wrappers come from
    the chat template, not the processor: keep only the image token."""
    want = []
    for run in prompt_plan:
        if want and want[-1][0] == run["id"]:
            want[-1] = (run["id"], want[-1][1] + run["count"])
        else:
            want.append((run["id"], run["count"]))
    if ours["family"].startswith("glm"):
        image_id = ours["prompt_runs"][0][0]
        want = [r for r in want if r[0] == image_id]
    return want


def real_size_step_repo(tmp, processor):
    """The step3p7 processor-only cases ran upstream's processor at the real sizes: a copy of the
    tiny repo whose preprocessor config carries those sizes."""
    src = fixtures_dir() / "models" / "step3p7"
    tmp.mkdir(exist_ok=True)
    for f in ("config.json", "tokenizer_config.json", "model.safetensors"):
        (tmp / f).symlink_to(src / f)
    pre = json.loads((src / "preprocessor_config.json").read_text())
    pre.update(processor)
    (tmp / "preprocessor_config.json").write_text(json.dumps(pre))
    return tmp


def test_plans_equal_upstream_for_every_processor_case(tmp_path):
    checked = 0
    for variant in sorted((fixtures_dir() / "outputs").iterdir()):
        for case in sorted(variant.glob("*.safetensors")):
            meta = SafeTensors(case).fixture()
            if not meta.get("prompt_plan") or "video_processor" in meta:
                continue  # video cases: test_video.py
            if meta["model"]:
                m = model(meta["model"].removeprefix("models/"))
            else:
                repo = real_size_step_repo(tmp_path / f"step-{case.stem}", meta["processor"])
                m = vt.Model(repo, device="cpu")
            for image, upstream in zip(meta["images"], meta["prompt_plan"]):
                plan = m.plan(fixtures_dir() / "images" / image)
                assert ours_runs(plan) == upstream_runs(upstream, plan), (case.name, image)
                assert sum(plan["is_embed"]) == plan["rows"]
                checked += 1
    assert checked >= 20, checked


def png_chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_header(width, height):
    """A PNG claiming width × height whose pixel data is an empty zlib stream: the header is
    whole (planning reads nothing else), the body would not decode."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b""))
        + png_chunk(b"IEND", b"")
    )


FAMILY_MODEL = {"gemma4": "gemma4", "glm5_next": "glm5_next", "glm_ocr": "glm_ocr", "step3p7": "step3p7"}


def table_model(tmp, cfg):
    """A fixture model of the config's family whose configs are the table's: the weights and the
    tower config of the fixture, the table's token ids and processor configs."""
    family = cfg["config"]["model_type"]
    src = fixtures_dir() / "models" / FAMILY_MODEL[family]
    tmp.mkdir()
    (tmp / "model.safetensors").symlink_to(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config.update(cfg["config"])
    (tmp / "config.json").write_text(json.dumps(config))
    for name in ("preprocessor_config", "processor_config", "tokenizer_config", "tokenizer_json"):
        if name in cfg:
            file = "tokenizer.json" if name == "tokenizer_json" else f"{name}.json"
            (tmp / file).write_text(json.dumps(cfg[name]))
    # The law is under test here, not the decode budget: lift it (as the Rust table test does).
    return vt.Model(tmp, device="cpu", max_megapixels=1 << 40)


def test_plans_equal_upstreams_table(tmp_path):
    table = json.loads((fixtures_dir() / "prep" / "plans.json").read_text())
    models = {name: table_model(tmp_path / name, cfg) for name, cfg in table["configs"].items()}
    failures = []
    for row in table["rows"]:
        m = models[row["variant"]]
        w, h = row["width"], row["height"]
        ctx = f"{row['variant']} {w}x{h}"
        if "error" in row:
            try:
                m.plan(png_header(w, h))
                failures.append(f"{ctx}: upstream raised {row['error']}, we planned")
            except vt.BadImageError:
                pass
            continue
        try:
            p = m.plan(png_header(w, h))
        except vt.BadImageError as e:
            failures.append(f"{ctx}: upstream planned, we raised {e}")
            continue
        for key in ("rows", "grid"):
            if p[key] != row[key]:
                failures.append(f"{ctx}: {key} ours {p[key]} upstream {row[key]}")
        if list(p["target"]) != row["target"]:
            failures.append(f"{ctx}: target ours {p['target']} upstream {row['target']}")
        if [list(r) for r in p["prompt_runs"]] != row["prompt_runs"]:
            failures.append(f"{ctx}: prompt_runs differ")
        if "content" in row and p["detail"]["content"] != row["content"]:
            failures.append(f"{ctx}: content differs")
        for key in ("crop", "window", "square_pad", "newline_mask"):
            if key in row and p["detail"][key] != row[key]:
                failures.append(f"{ctx}: {key} ours {p['detail'][key]} upstream {row[key]}")
        if sum(p["is_embed"]) != p["rows"]:
            failures.append(f"{ctx}: is_embed marks {sum(p['is_embed'])} of {p['rows']} rows")
    assert not failures, f"{len(failures)} mismatches, first: {failures[:10]}"
    assert len(table["rows"]) > 1000
