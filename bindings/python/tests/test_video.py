"""Video through the Python API (issue 24, docs/VIDEO.md): the upstream video tower cases
(``fixtures/outputs/glm5_next_video/fps1_odd7``, ``gemma4_video/g4_n2``: rows of upstream's
``get_video_features`` in float64) from raw RGB, a NumPy array and encoded frames, within the
host bound and bitwise equal to ``vtower encode --video-frames`` (the Rust API); the plan equal to
the fixture's; the metadata budgets refusing 10 000 frames and 10⁹ pixels before any frame is
read; a family without video refusing it; and (marked ``gpu``) the CUDA rows through
``torch.from_dlpack`` against the host rows, in the GPU tier's default precision (bf16, f16 on
7.5: ``gpu_tier``) and in f32.
"""

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

import vision_towers as vt
from vt_testutil import SafeTensors, bf16s, f16s, f32s, fixtures_dir, gpu_tier, model, rel_l2

HOST_BOUND = 1e-5

# (fixture, model, extra settings): the case's video processor config as call settings.
CASES = [
    ("glm5_next_video/fps1_odd7", "glm5_next", {}),
    ("gemma4_video/g4_n2", "gemma4", {"num_frames": 2}),
]


def video_cases():
    out = []
    for variant in ("glm5_next_video", "gemma4_video"):
        for f in sorted((fixtures_dir() / "outputs" / variant).glob("*.safetensors")):
            out.append(pytest.param(f"{variant}/{f.stem}", id=f"{variant}/{f.stem}"))
    return out


class Case:
    """A video tower fixture: raw frames, metadata, upstream's indices, grid, plan and rows."""

    def __init__(self, name):
        self.st = SafeTensors(fixtures_dir() / "outputs" / f"{name}.safetensors")
        self.meta = self.st.fixture()
        n, self.height, self.width, _ = self.st.shape("frames_u8")
        raw = self.st.raw("frames_u8")
        each = self.height * self.width * 3
        self.raw = raw
        self.frames = [raw[i * each : (i + 1) * each] for i in range(n)]
        self.fps = self.meta["video_metadata"]["fps"]
        self.indices = self.st.values("frames_indices")
        self.grid = self.st.values("video_grid_thw") if "video_grid_thw" in self.st.names() else None
        self.rows = self.st.values("f64/rows") if "f64/rows" in self.st.names() else None
        self.model = self.meta["model"].removeprefix("models/")
        self.settings = dict(self.meta["video_processor_config"])

    def bmps(self):
        return [bmp(f, self.width, self.height) for f in self.frames]


def bmp(rgb, w, h):
    """A 24-bit BMP of an RGB frame (bottom-up, BGR, rows padded to 4 bytes): lossless."""
    stride = (w * 3 + 3) // 4 * 4
    size = 54 + stride * h
    out = bytearray(b"BM" + struct.pack("<I", size) + b"\0" * 4 + struct.pack("<I", 54))
    out += struct.pack("<IiiHH", 40, w, h, 1, 24) + b"\0" * 24
    for y in range(h - 1, -1, -1):
        row = bytearray()
        for x in range(w):
            r, g, b = rgb[(y * w + x) * 3 : (y * w + x) * 3 + 3]
            row += bytes((b, g, r))
        out += row + b"\0" * (stride - len(row))
    return bytes(out)


def upstream_prompt(case):
    """The fixture's prompt as ``plan_video`` lists it: runs ``(id, count, embeds)``, text str."""
    embed_tokens = {"<|image|>", "<|video|>"}
    return [
        p["text"] if "text" in p else (p["id"], p["count"], p["token"] in embed_tokens)
        for p in case.meta["prompt_plan"]
    ]


def check_plan(plan, case, width):
    assert plan["frames_indices"] == case.indices
    assert plan["timestamps"] == pytest.approx(case.meta["timestamps"])
    if case.grid is not None:
        assert plan["video_grid_thw"] == case.grid
    assert plan["prompt"] == upstream_prompt(case)
    assert (plan["width"], plan["height"]) == (case.width, case.height)
    if case.rows is not None:
        assert plan["rows"] * width == len(case.rows)
    assert sum(plan["is_embed"]) == plan["rows"]
    assert len(plan["is_embed"]) == sum(c for _, c in plan["prompt_runs"])


@pytest.mark.parametrize("name", video_cases())
def test_video_plans_equal_upstream(name):
    """Every video fixture (processor and tower cases): sampled indices, timestamps, grid and
    prompt from ``plan_video``, raw frames and encoded ones alike."""
    case = Case(name)
    m = model(case.model)
    plan = m.plan_video(
        case.raw, width=case.width, height=case.height, fps=case.fps,
        duration=case.meta["video_metadata"]["duration"], **case.settings
    )
    check_plan(plan, case, m.width)
    encoded = m.plan_video(
        case.bmps(), fps=case.fps, duration=case.meta["video_metadata"]["duration"],
        **case.settings
    )
    assert encoded == plan


@pytest.mark.parametrize("name, layout, kw", CASES, ids=[c[0] for c in CASES])
def test_video_rows_equal_upstream_and_the_plan_the_fixture(name, layout, kw):
    case = Case(name)
    m = model(layout)
    plan = m.plan_video(case.raw, width=case.width, height=case.height, fps=case.fps, **kw)
    check_plan(plan, case, m.width)
    got = {}
    got["raw bytes"] = m.encode_video(
        case.raw, width=case.width, height=case.height, fps=case.fps, **kw
    )
    got["encoded"] = m.encode_video(case.bmps(), fps=case.fps, **kw)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is in the test tools
        np = None
    if np is not None:
        arr = np.frombuffer(case.raw, dtype=np.uint8).reshape(
            len(case.frames), case.height, case.width, 3
        )
        got["numpy"] = m.encode_video(arr, fps=case.fps, **kw)
    first = None
    for how, rows in got.items():
        assert rows.shape == (plan["rows"], m.width), how
        assert rows.device == "cpu" and rows.dtype == "float32"
        assert rows.plan == plan, how
        b = rows.to_bytes()
        err = rel_l2(f32s(b), case.rows)
        assert err <= HOST_BOUND, f"{how}: rel-L2 {err:.3e} over {HOST_BOUND}"
        first = first or b
        assert b == first, f"{how}: rows differ from the raw frames' rows"
    if np is not None:
        assert np.from_dlpack(got["numpy"]).tobytes() == first


def vtower():
    """The `vtower` binary of this checkout's cargo build (built by `cargo test --workspace`)."""
    root = Path(__file__).resolve().parents[3]
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    for profile in ("debug", "release"):
        p = target / profile / "vtower"
        if p.exists():
            return p
    return None


@pytest.mark.parametrize("name, layout, kw", CASES, ids=[c[0] for c in CASES])
def test_video_rows_equal_the_cli(name, layout, kw, tmp_path):
    exe = vtower()
    if exe is None:
        pytest.skip("no vtower binary in target/ (cargo build --bin vtower)")
    case = Case(name)
    files = []
    for i, b in enumerate(case.bmps()):
        p = tmp_path / f"{i:04}.bmp"
        p.write_bytes(b)
        files.append(p)
    out = tmp_path / "rows.safetensors"
    args = [str(exe), "encode", "--device", "cpu", "--model", str(fixtures_dir() / "models" / layout)]
    args += ["--video-frames", *map(str, files), "--fps", repr(float(case.fps)), "--out", str(out)]
    if "num_frames" in kw:
        args += ["--num-frames", str(kw["num_frames"])]
    subprocess.run(args, check=True, capture_output=True)
    st = SafeTensors(out)
    rows = model(layout).encode_video(files, fps=case.fps, **kw)
    assert rows.to_bytes() == st.raw("embeddings")
    assert json.loads(st.meta["video_plan"])["frames_indices"] == rows.plan["frames_indices"]


def test_ten_thousand_frames_are_refused_from_the_metadata(tmp_path):
    m = model("glm5_next")
    # Paths that do not exist: reading any of them would be an I/O error, not the budget.
    missing = [tmp_path / f"missing{i}.png" for i in range(10_000)]
    for call in (m.plan_video, m.encode_video):
        with pytest.raises(vt.BadImageError) as e:
            call(missing, fps=30.0)
        assert e.value.kind == "prep:VideoOverBudget"
        assert "10000 frames" in str(e.value)
        # raw frames: none handed in at all
        with pytest.raises(vt.BadImageError) as e:
            call(b"", width=1920, height=1080, total_num_frames=10_000, fps=30.0)
        assert e.value.kind == "prep:VideoOverBudget"


def test_a_billion_pixels_are_refused_from_the_metadata(tmp_path):
    m = model("glm5_next")
    # 4000 frames of 500x500 at the target rate: 2048 sampled, 5.1e8 pixels (10⁹ handed in).
    for call in (m.plan_video, m.encode_video):
        with pytest.raises(vt.BadImageError) as e:
            call(b"", width=500, height=500, total_num_frames=4000, fps=2.0)
        assert e.value.kind == "prep:VideoOverBudget"
    # 64 frames of 4000x4000 (10⁹ pixels), none handed in: refused by the plan's budgets.
    with pytest.raises(vt.BadImageError) as e:
        m.plan_video(b"", width=4000, height=4000, total_num_frames=64, fps=2.0)
    assert e.value.kind == "prep:VideoOverBudget"


def test_a_family_without_video_refuses_it(tmp_path):
    m = model("step3p7")
    missing = [tmp_path / "a.png", tmp_path / "b.png"]
    for call in (m.plan_video, m.encode_video):
        with pytest.raises(vt.UnsupportedError) as e:
            call(missing, fps=2.0)
        assert e.value.kind == "prep:NoVideoPath"


def test_bad_video_arguments():
    m = model("glm5_next")
    case = Case("glm5_next_video/fps1_odd7")
    with pytest.raises(ValueError):
        m.encode_video(case.raw, fps=case.fps)  # raw bytes without width/height
    with pytest.raises(ValueError):
        m.encode_video(case.raw + b"x", width=case.width, height=case.height, fps=case.fps)
    with pytest.raises(TypeError):
        m.encode_video("frames/", fps=1.0)
    with pytest.raises(ValueError):
        model("gemma4").encode_video(case.raw, width=case.width, height=case.height, fps=1.0,
                                     max_soft_tokens=99)
    # glm5_next needs the video's frame rate
    with pytest.raises(vt.BadImageError) as e:
        m.encode_video(case.raw, width=case.width, height=case.height)
    assert e.value.kind == "prep:BadVideo"
    # fewer bytes than the metadata's frames: a short frame, after the budgets
    with pytest.raises(vt.BadImageError) as e:
        m.encode_video(case.raw, width=case.width, height=case.height, fps=case.fps,
                       total_num_frames=len(case.frames) + 1)
    assert e.value.kind == "prep:BadVideo"


@pytest.mark.gpu
@pytest.mark.parametrize("name, layout, kw", CASES, ids=[c[0] for c in CASES])
def test_video_rows_on_cuda(name, layout, kw):
    import torch

    assert torch.cuda.is_available(), "PyTorch sees no CUDA device"
    case = Case(name)
    host = model(layout).encode_video(
        case.raw, width=case.width, height=case.height, fps=case.fps, **kw
    )
    want = f32s(host.to_bytes())
    for precision, bound in ((gpu_tier().precision, 2e-2), ("f32", 1e-4)):
        m = vt.Model(fixtures_dir() / "models" / layout, device="cuda:0", precision=precision)
        gpu_tier(m)
        rows = m.encode_video(case.raw, width=case.width, height=case.height, fps=case.fps, **kw)
        assert rows.device == "cuda:0"
        assert rows.plan == host.plan
        t = torch.from_dlpack(rows)
        assert t.is_cuda and tuple(t.shape) == host.shape
        assert t.data_ptr() == rows.data_ptr  # zero copy
        got = t.float().cpu().flatten().tolist()
        assert all(v == v for v in got), "NaN"
        # torch's read equals the library's own download of the rows
        dl = rows.to_bytes()
        lib = {"bfloat16": bf16s, "float16": f16s, "float32": f32s}[rows.dtype](dl)
        assert got == list(lib)
        for what, ref in (("host rows", want), ("upstream f64", case.rows)):
            err = rel_l2(got, ref)
            assert err <= bound, f"{precision}: rel-L2 {err:.3e} vs {what} over {bound}"
