"""The Python API on the CPU: the model's properties, every image argument form, plans, rows as
DLPack arrays, dtypes, argument errors and the exception hierarchy."""

import base64
import gc
import json
import os
import pathlib
import subprocess
import sys

import pytest

import vision_towers as vt
from vt_testutil import SafeTensors, f32s, fixtures_dir, image_bytes, model


def test_import_pulls_in_no_python_package():
    code = (
        "import sys, vision_towers; "
        "bad = [m for m in ('numpy', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "name, family, width",
    [
        ("gemma4", "gemma4", 80),
        ("glm5_next", "glm5_next", 48),
        ("glm_ocr", "glm_ocr", 48),
        ("step3p7", "step3p7", 80),
        ("gemma4_gguf/mmproj-BF16.gguf", "gemma4", 80),
    ],
)
def test_model_properties(name, family, width):
    m = model(name)
    assert (m.family, m.width, m.device, m.precision) == (family, width, "cpu", "f32")
    assert m.lm_attention == "causal"
    assert m.path.name == name.split("/")[-1]
    assert family in repr(m)


def test_auto_runs_on_the_cpu_without_a_gpu():
    from conftest import cuda_device_count

    if cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    m = vt.Model(fixtures_dir() / "models" / "gemma4")
    assert (m.device, m.precision) == ("cpu", "f32")
    with pytest.raises(vt.NoDeviceError) as e:
        vt.Model(fixtures_dir() / "models" / "gemma4", device="cuda:0")
    assert e.value.kind == "no_device"
    assert "no usable CUDA device for cuda:0" in str(e.value)


def test_bad_arguments_raise_value_errors():
    path = fixtures_dir() / "models" / "gemma4"
    with pytest.raises(ValueError, match="unknown device"):
        vt.Model(path, device="tpu")
    with pytest.raises(ValueError, match="precision"):
        vt.Model(path, precision="f8")
    with pytest.raises(ValueError, match="max_megapixels"):
        vt.Model(path, max_megapixels=0)
    with pytest.raises(vt.UnsupportedError, match="bf16 runs on CUDA only"):
        vt.Model(path, device="cpu", precision="bf16")
    # f16 likewise (every spelling): the CPU path is the f32 reference
    for spelling in ("f16", "float16", "fp16", "half"):
        with pytest.raises(vt.UnsupportedError, match="f16 runs on CUDA only"):
            vt.Model(path, device="cpu", precision=spelling)
    # the caller's budget out of range: the caller's argument (the C ABI's VT_ERR_INVALID_ARGUMENT)
    with pytest.raises(ValueError, match="71"):
        vt.Model(path, max_soft_tokens=71)
    with pytest.raises(vt.BadModelError) as e:
        vt.Model(fixtures_dir() / "no-such-model")
    assert e.value.kind == "io" and e.value.index is None


def test_every_image_form_gives_the_same_rows(tmp_path):
    m = model("gemma4")
    raw = image_bytes("tiny_20x15.png")
    path = fixtures_dir() / "images" / "tiny_20x15.png"
    uri = "data:image/png;base64," + base64.b64encode(raw).decode()
    forms = [raw, bytearray(raw), memoryview(raw), str(path), path, pathlib.PurePath(path), uri]
    rows = m.encode(forms)
    assert len(rows) == len(forms)
    want = rows[0].to_bytes()
    for r in rows:
        assert r.to_bytes() == want
        assert r.shape == (63, 80) and r.dtype == "float32" and r.device == "cpu"
        assert r.plan == rows[0].plan
    plans = [m.plan(f) for f in forms]
    assert all(p == plans[0] for p in plans)


def test_image_argument_errors():
    m = model("gemma4")
    with pytest.raises(TypeError, match="list"):
        m.encode(image_bytes("tiny_20x15.png"))
    with pytest.raises(TypeError, match="image 1"):
        m.encode([image_bytes("tiny_20x15.png"), 42])
    assert m.encode([]) == []
    with pytest.raises(vt.BadImageError) as e:
        m.encode([image_bytes("tiny_20x15.png"), "https://example.com/cat.png"])
    assert (e.value.kind, e.value.index) == ("prep:SchemeRefused", 1)
    assert "URI scheme `https` refused" in str(e.value)
    with pytest.raises(vt.BadImageError) as e:
        m.encode([str(fixtures_dir() / "images" / "missing.png")])
    assert (e.value.kind, e.value.index) == ("io", 0)
    assert "missing.png" in str(e.value)
    with pytest.raises(vt.BadImageError) as e:
        m.encode([image_bytes("tiny_20x15.png"), b"not an image"])
    assert (e.value.kind, e.value.index) == ("prep:NotAnImage", 1)
    assert str(e.value).startswith("image 1: not an image")
    with pytest.raises(vt.BadImageError) as e:
        m.plan(str(fixtures_dir() / "images" / "README"))
    assert isinstance(e.value, vt.VisionTowersError)
    with pytest.raises(vt.BadImageError) as e:
        m.plan(b"\x89PNG\r\n\x1a\n")
    assert e.value.index is None and e.value.kind.startswith("prep:")


def test_the_exception_hierarchy():
    for cls in (
        vt.BadImageError,
        vt.BadModelError,
        vt.BadInputError,
        vt.NoDeviceError,
        vt.OutOfMemoryError,
        vt.UnsupportedError,
        vt.DeviceError,
    ):
        assert issubclass(cls, vt.VisionTowersError)
        assert cls.__module__ == "vision_towers"
    assert issubclass(vt.VisionTowersError, Exception)


def test_plan_dict():
    m = model("gemma4")
    p = m.plan(image_bytes("tiny_20x15.png"))
    assert p["family"] == "gemma4" and p["processor"] == "Gemma4ImageProcessor"
    assert (p["width"], p["height"]) == (20, 15)
    assert p["rows"] == 63
    assert p["prompt_runs"] == [(255999, 1), (258880, 63), (258882, 1)]
    assert len(p["prompt_tokens"]) == 3
    assert isinstance(p["target"], tuple) and len(p["grid"]) == 2
    mask = p["is_embed"]
    assert len(mask) == 65 and sum(mask) == 63
    assert mask[0] is False and mask[-1] is False and all(mask[1:-1])
    s = model("step3p7").plan(image_bytes("astronaut_336x224.jpg"))
    assert sum(s["is_embed"]) == s["rows"]
    at = 0
    for (tid, count), text in zip(s["prompt_runs"], s["prompt_tokens"]):
        assert all(e == (text == "<im_patch>") for e in s["is_embed"][at : at + count])
        at += count


def test_max_rows_per_image():
    # Upstream's rows (transformers 5.23) at the size that reaches the most
    # (fixtures/prep/max_rows.json, fixtures/oracle/prep_max_rows.py).
    oracle = json.loads((fixtures_dir() / "prep" / "max_rows.json").read_text())["configs"]
    for name in ("gemma4", "glm5_next", "glm_ocr", "step3p7"):
        cfg = oracle[f"models/{name}"]
        upstream = {(w, h): r for w, h, r in cfg["rows"]}
        w, h = cfg["witness"][0]
        assert model(name).max_rows_per_image() == upstream[(w, h)], name
    assert model("gemma4").max_rows_per_image() == 70  # the fixture's max_soft_tokens
    for name in ("glm5_next", "glm_ocr", "step3p7"):
        m = model(name)
        top = m.max_rows_per_image()
        for img in (fixtures_dir() / "images").iterdir():
            assert m.plan(img)["rows"] <= top, (name, img.name)
    assert model("gemma4", max_soft_tokens=140).max_rows_per_image() == 140


def test_rows_export_dlpack_capsules():
    r = model("glm5_next").encode([image_bytes("logo_rgba_112x84.png")])[0]
    assert r.__dlpack_device__() == (1, 0)
    assert "dltensor" in repr(r.__dlpack__()) and "versioned" not in repr(r.__dlpack__())
    assert "dltensor_versioned" in repr(r.__dlpack__(max_version=(1, 0)))
    assert "dltensor" in repr(r.__dlpack__(max_version=(0, 8)))
    assert "dltensor_versioned" in repr(r.__dlpack__(max_version=(1, 3), copy=True))
    r.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError):
        r.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="stream"):
        r.__dlpack__(stream=1)
    assert len(r) == r.shape[0] and r.nbytes == r.shape[0] * r.shape[1] * 4
    assert r.data_ptr != 0
    # Capsules never consumed free their tensors when they die (the leak test counts it).
    for _ in range(100):
        r.__dlpack__()
        r.__dlpack__(max_version=(1, 0))


def test_numpy_reads_host_rows_without_a_copy():
    np = pytest.importorskip("numpy")
    m = model("glm_ocr")
    rows = m.encode([image_bytes("tiny_20x15.png"), image_bytes("camera_gray_96x96.png")])
    for r in rows:
        a = np.from_dlpack(r)
        assert a.dtype == np.float32 and a.shape == r.shape
        assert a.ctypes.data == r.data_ptr
        assert a.tobytes() == r.to_bytes()
    # The array keeps the rows alive after the ImageRows is gone.
    a = np.from_dlpack(rows[1])
    want = rows[1].to_bytes()
    del rows
    gc.collect()
    m.encode([image_bytes("logo_rgba_112x84.png")] * 3)
    assert a.tobytes() == want
    if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 1):
        r = m.encode([image_bytes("tiny_20x15.png")])[0]
        c = np.from_dlpack(r, copy=True)
        assert c.ctypes.data != r.data_ptr and c.tobytes() == r.to_bytes()


def test_torch_reads_host_rows_without_a_copy():
    torch = pytest.importorskip("torch")
    r = model("gemma4").encode([image_bytes("coffee_144x96.jpg")])[0]
    t = torch.from_dlpack(r)
    assert t.dtype == torch.float32 and tuple(t.shape) == r.shape
    assert t.data_ptr() == r.data_ptr
    assert t.numpy().tobytes() == r.to_bytes()


def test_dtypes_on_the_cpu():
    m = model("gemma4")
    img = [image_bytes("tiny_20x15.png")]
    for d in (None, "float32", "f32", "torch.float32"):
        assert m.encode(img, dtype=d)[0].dtype == "float32"
    for d in ("bfloat16", "float16", "half"):
        with pytest.raises(vt.UnsupportedError, match="CPU"):
            m.encode(img, dtype=d)
    with pytest.raises(ValueError, match="dtype"):
        m.encode(img, dtype="float8")


def test_out_needs_a_cuda_model():
    np = pytest.importorskip("numpy")
    m = model("gemma4")
    out = np.zeros((63, 80), dtype=np.float32)
    with pytest.raises(vt.UnsupportedError):
        m.encode([image_bytes("tiny_20x15.png")], out=out)
    with pytest.raises(TypeError, match="out"):
        m.encode([image_bytes("tiny_20x15.png")], out=object())


def test_encode_prepared_refuses_bad_tensors():
    np = pytest.importorskip("numpy")
    m = model("gemma4")
    st = SafeTensors(fixtures_dir() / "outputs" / "gemma4" / "tiny_20x15.safetensors")
    pv = np.frombuffer(st.raw("pixel_values"), dtype=np.float32).reshape(st.shape("pixel_values"))
    pos = np.frombuffer(st.raw("image_position_ids"), dtype=np.int64).reshape(
        st.shape("image_position_ids")
    )
    good = m.encode_prepared({"pixel_values": pv, "image_position_ids": pos})
    assert good[0].shape == (63, 80) and good[0].plan is None
    assert good[0].to_bytes() == m.encode([image_bytes("tiny_20x15.png")])[0].to_bytes()
    # Non-contiguous and other dtypes are read by value.
    pv_f64 = np.asfortranarray(pv.astype(np.float64))
    again = m.encode_prepared({"pixel_values": pv_f64, "image_position_ids": pos.astype(np.int32)})
    assert again[0].to_bytes() == good[0].to_bytes()
    with pytest.raises(vt.BadInputError, match="image_position_ids") as e:
        m.encode_prepared({"pixel_values": pv})
    assert e.value.kind == "inputs"
    with pytest.raises(vt.BadInputError, match="shape"):
        m.encode_prepared({"pixel_values": pv[0], "image_position_ids": pos})
    with pytest.raises(vt.BadInputError):
        m.encode_prepared({"pixel_values": pv, "image_position_ids": pos[:, :10]})
    with pytest.raises(TypeError, match="__dlpack__"):
        m.encode_prepared({"pixel_values": [1.0, 2.0], "image_position_ids": pos})
    with pytest.raises(TypeError, match="mapping"):
        m.encode_prepared([pv, pos])


def test_rows_survive_the_model():
    m = vt.Model(fixtures_dir() / "models" / "glm_ocr", device="cpu")
    r = m.encode([image_bytes("tiny_20x15.png")])[0]
    want = r.to_bytes()
    del m
    gc.collect()
    assert r.to_bytes() == want and len(f32s(want)) == r.shape[0] * r.shape[1]


def test_path_like_model_and_environment():
    m = vt.Model(os.fspath(fixtures_dir() / "models" / "gemma4"), device="cpu", graphs=False)
    assert m.family == "gemma4"
    assert vt.__version__


def test_encode_prepared_takes_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    m = model("glm5_next")
    st = SafeTensors(fixtures_dir() / "outputs" / "glm5_next" / "batch2.safetensors")
    kinds = {"F32": torch.float32, "I64": torch.int64}
    tensors = {
        n: torch.frombuffer(bytearray(st.raw(n)), dtype=kinds[st.dtype(n)]).reshape(st.shape(n))
        for n in ("pixel_values", "image_grid_thw")
    }
    got = m.encode_prepared(tensors)
    want = m.encode([image_bytes(i) for i in st.fixture()["images"]])
    assert [r.to_bytes() for r in got] == [r.to_bytes() for r in want]
