"""CUDA: rows as PyTorch tensors. Marked `gpu` (see conftest.py: skipped only where no CUDA device
is present; `--gpu` or VT_GPU_TESTS=1 makes a missing device a failure). Run on a GPU machine:

    python3 -m pytest bindings/python/tests -m gpu --gpu -v

What must hold: `torch.from_dlpack` on a non-default stream, with no synchronize anywhere, reads
rows bitwise equal to the library's own download of them (`ImageRows.to_bytes`, the Rust device
path); the tensor's `data_ptr` is the library's buffer (zero copy); rows outlive the
`ImageRows`; an out-of-memory raises OutOfMemoryError and the next call works; `out=` writes a
caller's tensor on the caller's stream; `encode_prepared` from PyTorch CPU tensors equals
`encode` from bytes.

Every tier that `GPU_CORE_FORCE_TIER` forces (`8.0`, `7.5`; unset: the card's own) runs them all:
the default precision is the tier's (`gpu_tier`: f16 on 7.5, which refuses bf16, else bf16), and
every CUDA model is checked to run that tier.
"""

import gc
import math
import threading

import pytest

import vision_towers as vt
from vt_testutil import SafeTensors, bf16s, f16s, f32s, fixtures_dir, gpu_tier, image_bytes, rel_l2

pytestmark = pytest.mark.gpu

IMAGES = ["coffee_144x96.jpg", "tiny_20x15.png", "logo_rgba_112x84.png", "chelsea_168x112.webp"]
MODELS = ["gemma4", "glm5_next", "glm_ocr", "step3p7"]
_OPEN = {}


@pytest.fixture(scope="module")
def torch():
    import torch as t  # a GPU run needs PyTorch: without it these tests fail, never skip

    assert t.cuda.is_available(), "PyTorch sees no CUDA device"
    return t


def trim_default_memory_pool(ordinal):
    """cuMemPoolTrimTo(default pool of the device, 0) through the driver API."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    dev, pool = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    assert cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev) == 0
    assert cuda.cuMemPoolTrimTo(pool, ctypes.c_size_t(0)) == 0


def cuda_model(name, **kw):
    key = (name, tuple(sorted(kw.items())))
    if key not in _OPEN:
        _OPEN[key] = vt.Model(fixtures_dir() / "models" / name, device="cuda:0", **kw)
        gpu_tier(_OPEN[key])
    return _OPEN[key]


def images():
    return [image_bytes(i) for i in IMAGES]


def as_bytes(torch, t):
    """A tensor's bytes (bfloat16 viewed as int16: NumPy has no bfloat16)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.cpu().numpy().tobytes()


@pytest.mark.parametrize("name", MODELS)
def test_from_dlpack_on_a_side_stream_is_bitwise_the_rust_rows(torch, name):
    m = cuda_model(name)
    tier = gpu_tier()
    assert (m.device, m.precision) == ("cuda:0", tier.precision)
    side = torch.cuda.Stream()
    for round in range(5):
        with torch.cuda.stream(side):
            rows = m.encode(images())
            # from_dlpack passes side's handle: side waits for the rows on the device.
            ts = [torch.from_dlpack(r) for r in rows]
            # Work queued on side right away reads the rows (a missing wait races here).
            copies = [t.clone() for t in ts]
        for r, t, c in zip(rows, ts, copies):
            assert t.device.type == "cuda" and t.dtype == tier.torch_dtype
            assert tuple(t.shape) == r.shape and r.device == "cuda:0"
            assert t.data_ptr() == r.data_ptr  # zero copy
            with torch.cuda.stream(side):
                got = as_bytes(torch, c)
            assert got == r.to_bytes(), f"{name} round {round}"
        # One buffer for the request, image after image.
        for a, b in zip(rows, rows[1:]):
            assert b.data_ptr == a.data_ptr + a.nbytes


def test_float32_rows_equal_the_host_reference_within_the_cuda_bound(torch):
    for name in MODELS:
        m = cuda_model(name, precision="f32")
        host = vt.Model(fixtures_dir() / "models" / name, device="cpu")
        got = m.encode(images(), dtype=torch.float32)
        want = host.encode(images())
        for g, w in zip(got, want):
            assert g.dtype == "float32"
            t = torch.from_dlpack(g)
            assert rel_l2(f32s(as_bytes(torch, t)), f32s(w.to_bytes())) <= 1e-4, name


def test_f16_rows_through_dlpack_are_finite_and_within_the_16_bit_bound(torch):
    """precision="f16" on every tier (Turing's precision): float16 rows through DLPack as
    torch.float16, finite, within bf16's bound (2e-2) of the host reference, and each element
    the model's own float32 rows rounded once (2^-11 relative); bfloat16 rows are refused."""
    for name in MODELS:
        m = cuda_model(name, precision="f16")
        assert m.precision == "f16"
        host = vt.Model(fixtures_dir() / "models" / name, device="cpu")
        got = m.encode(images())
        r32 = m.encode(images(), dtype="float32")
        want = host.encode(images())
        for g, a, w in zip(got, r32, want):
            assert g.dtype == "float16"
            t = torch.from_dlpack(g)
            assert t.dtype == torch.float16 and t.device.type == "cuda"
            x = f16s(t.cpu().numpy().tobytes())
            assert all(math.isfinite(v) for v in x), name
            assert rel_l2(x, f32s(w.to_bytes())) <= 2e-2, name
            y = f32s(a.to_bytes())
            # half an f16 ulp (2^-11 relative; 2^-25 absolute among the subnormals), with margin
            assert all(abs(p - q) <= abs(q) / 1024 + 6e-8 for p, q in zip(x, y)), name
        with pytest.raises(vt.UnsupportedError, match="bf16 tower"):
            m.encode(images(), dtype=torch.bfloat16)


def test_dtypes_and_capsules(torch):
    """float32 rows and the tier's 16-bit rows (bfloat16, float16 on 7.5) of one model: the 16-bit
    rows the float32 ones rounded once (a bf16 step, 2^-8 relative; half an f16 ulp, 2^-11
    relative and 2^-25 absolute among the subnormals, with margin); their DLPack capsules."""
    tier = gpu_tier()
    widen, rel, tiny = {
        "bfloat16": (bf16s, 1 / 256, 1e-38),
        "float16": (f16s, 1 / 1024, 6e-8),
    }[tier.dtype]
    m = cuda_model("glm5_next")
    r32 = m.encode(images(), dtype="float32")
    r16 = m.encode(images(), dtype=tier.torch_dtype)
    for a, b in zip(r32, r16):
        assert (a.dtype, b.dtype) == ("float32", tier.dtype)
        x, y = f32s(a.to_bytes()), widen(b.to_bytes())
        assert all(abs(p - q) <= abs(p) * rel + tiny for p, q in zip(x, y))
    r = r16[0]
    assert r.__dlpack_device__() == (2, 0)
    s = torch.cuda.Stream()
    legacy = r.__dlpack__(stream=s.cuda_stream)
    assert "dltensor" in repr(legacy)
    t = torch.utils.dlpack.from_dlpack(legacy)
    assert t.data_ptr() == r.data_ptr
    assert "dltensor_versioned" in repr(r.__dlpack__(stream=-1, max_version=(1, 0)))
    for bad in (0, -7):
        with pytest.raises(ValueError, match="stream"):
            r.__dlpack__(stream=bad)
    with pytest.raises(BufferError):
        r.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        r.__dlpack__(dl_device=(1, 0))
    t2 = torch.from_dlpack(r)  # the current (default) stream: legacy default
    assert as_bytes(torch, t2) == r.to_bytes()
    with pytest.raises(vt.UnsupportedError):
        cuda_model("glm5_next", precision="f32").encode(images(), dtype="bfloat16")


def test_tensors_outlive_their_image_rows_and_free_from_any_thread(torch):
    m = cuda_model("step3p7")
    rows = m.encode(images())
    want = [r.to_bytes() for r in rows]
    ts = [torch.from_dlpack(r) for r in rows]
    del rows
    gc.collect()
    for _ in range(3):
        m.encode(images())  # reuses freed memory if ours were released early
    torch.cuda.synchronize()
    assert [as_bytes(torch, t) for t in ts] == want
    # The last reference dies on another thread (the deleter runs there, without the GIL).
    worker = threading.Thread(target=lambda: ts.clear())
    worker.start()
    worker.join()
    assert m.encode(images())[0].to_bytes() == want[0]


def test_out_of_memory_raises_and_the_next_call_works(torch):
    m = cuda_model("glm5_next")
    small = images()
    before = [r.to_bytes() for r in m.encode(small)]
    # A request larger than any before: the workspace must grow, past what the ballast leaves.
    big = images() + [image_bytes("coffee_3100x500.jpg")] * 8
    # The library allocates from the device's default (stream-ordered) memory pool, which keeps
    # what earlier models of this process freed: give that back first, so the ballast takes
    # every byte the library's next allocation could use.
    torch.cuda.synchronize()
    trim_default_memory_pool(0)
    ballast, chunk = [], 4 << 30
    while chunk >= 1 << 20:
        try:
            while True:
                ballast.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            chunk //= 4
    try:
        with pytest.raises(vt.OutOfMemoryError) as e:
            m.encode(big)
        assert e.value.kind == "out_of_memory" and "out of memory" in str(e.value)
    finally:
        ballast.clear()
        torch.cuda.empty_cache()
    after = [r.to_bytes() for r in m.encode(small)]
    assert after == before
    assert len(m.encode(big)) == len(big)


def test_out_writes_a_callers_tensor_on_its_stream(torch):
    tier = gpu_tier()
    other = torch.float16 if tier.torch_dtype == torch.bfloat16 else torch.bfloat16
    for name in MODELS:
        m = cuda_model(name)
        rows = m.encode(images())
        total = sum(r.shape[0] for r in rows)
        want = b"".join(r.to_bytes() for r in rows)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            out = torch.full((total, m.width), float("nan"), dtype=tier.torch_dtype, device="cuda")
            counts = m.encode(images(), out=out, out_stream=torch.cuda.current_stream())
            got = out.clone()  # ordered after the write on s, no synchronize
        assert counts == [r.shape[0] for r in rows]
        with torch.cuda.stream(s):
            assert as_bytes(torch, got) == want, name
        # The raw handle works too, and float32 into a float32 tensor.
        out32 = torch.empty((total, m.width), dtype=torch.float32, device="cuda")
        m.encode(images(), out=out32, out_stream=torch.cuda.current_stream().cuda_stream)
        f32 = b"".join(r.to_bytes() for r in m.encode(images(), dtype="float32"))
        assert as_bytes(torch, out32) == f32
    m = cuda_model("gemma4")
    total = sum(m.plan(i)["rows"] for i in images())
    for bad, exc in (
        (torch.empty((total + 1, m.width), dtype=tier.torch_dtype, device="cuda"), ValueError),
        # the other 16-bit dtype: rows a tower of the tier's precision cannot write
        (torch.empty((total, m.width), dtype=other, device="cuda"), vt.UnsupportedError),
        (torch.empty((m.width, total), dtype=tier.torch_dtype, device="cuda").t(), ValueError),
        (torch.empty((total, m.width), dtype=tier.torch_dtype), vt.UnsupportedError),
    ):
        with pytest.raises(exc):
            m.encode(images(), out=bad)


def fixture_tensors(torch, case):
    st = SafeTensors(fixtures_dir() / "outputs" / f"{case}.safetensors")
    kinds = {"F32": torch.float32, "I64": torch.int64, "BOOL": torch.bool, "U8": torch.uint8}
    out = {}
    for name in st.names():
        if "/" not in name:
            raw = bytearray(st.raw(name))
            out[name] = torch.frombuffer(raw, dtype=kinds[st.dtype(name)]).reshape(st.shape(name)).clone()
    return out, st.fixture()["images"]


@pytest.mark.parametrize(
    "name, case",
    [("gemma4", "gemma4/batch2"), ("glm5_next", "glm5_next/batch2"), ("glm_ocr", "glm_ocr/batch2"), ("step3p7", "step3p7/batch2")],
)
def test_encode_prepared_from_torch_cpu_tensors_equals_encode(torch, name, case):
    m = cuda_model(name)
    tensors, names = fixture_tensors(torch, case)
    from_tensors = m.encode_prepared(tensors, dtype=torch.float32)
    from_bytes = m.encode([image_bytes(i) for i in names], dtype=torch.float32)
    assert [a.to_bytes() for a in from_tensors] == [b.to_bytes() for b in from_bytes]
    total = sum(r.shape[0] for r in from_bytes)
    out = torch.empty((total, m.width), dtype=torch.float32, device="cuda")
    counts = m.encode_prepared(tensors, out=out, out_stream=torch.cuda.current_stream())
    assert counts == [r.shape[0] for r in from_bytes]
    assert as_bytes(torch, out) == b"".join(b.to_bytes() for b in from_bytes)


def test_eight_threads_on_one_cuda_model(torch):
    m = cuda_model("gemma4")
    want = [r.to_bytes() for r in m.encode(images())]
    errors, results = [], [None] * 8
    barrier = threading.Barrier(8)

    def work(k):
        try:
            barrier.wait()
            s = torch.cuda.Stream()
            got = []
            for _ in range(4):
                with torch.cuda.stream(s):
                    ts = [torch.from_dlpack(r) for r in m.encode(images())]
                    got.append([as_bytes(torch, t) for t in ts])
            results[k] = got
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(r == want for got in results for r in got)


def test_auto_takes_the_gpu():
    m = vt.Model(fixtures_dir() / "models" / "gemma4")
    assert (m.device, m.precision) == ("cuda:0", gpu_tier(m).precision)


def test_bf16_runs_where_the_tier_has_bf16_tensor_cores():
    """precision="bf16" on CUDA: a bf16 tower from 8.0 on; on 7.5 (no bf16 tensor cores) the open
    raises UnsupportedError advising f16, for every fixture model."""
    tier = gpu_tier()
    for name in MODELS:
        if tier.precision == "bf16":
            assert cuda_model(name, precision="bf16").precision == "bf16"
        else:
            with pytest.raises(vt.UnsupportedError, match="use f16") as e:
                cuda_model(name, precision="bf16")
            assert e.value.kind == "unsupported", e.value.kind
            assert "bf16 tensor cores" in str(e.value), str(e.value)


def test_one_cublaslt_in_a_process_that_loaded_torch_first(torch):
    """PyTorch maps its pip wheel's cuBLASLt at import; the library must use that copy, not map
    the CUDA toolkit's beside it (issue 39: cudarc's loader asked for `libcublasLt.so` first,
    the toolkit's development link, and a PyTorch process held two copies). A fresh process,
    so torch is surely loaded first."""
    import json
    import subprocess
    import sys

    script = f"""
import torch
a = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
import vision_towers as vt
m = vt.Model({str(fixtures_dir() / "models" / "gemma4")!r}, device="cuda:0")
m.encode([open({str(fixtures_dir() / "images" / IMAGES[0])!r}, "rb").read()])
paths = set()
for line in open("/proc/self/maps"):
    parts = line.split()
    if len(parts) >= 6 and parts[5].rsplit("/", 1)[-1].startswith("libcublasLt.so"):
        paths.add(parts[5])
import json
print(json.dumps(sorted(paths)))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    paths = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(paths) == 1, f"cuBLASLt copies mapped: {paths}"
