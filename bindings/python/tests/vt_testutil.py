"""Helpers shared by the tests: where the fixtures are, a tiny safetensors reader (stdlib only),
rel-L2, the fixture models, and the GPU tier a CUDA test runs."""

import json
import math
import os
import struct
from collections import namedtuple
from pathlib import Path

import vision_towers as vt


def fixtures_dir():
    """The repository's fixtures (``VT_FIXTURES`` names them elsewhere, e.g. on a GPU machine)."""
    env = os.environ.get("VT_FIXTURES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "fixtures"


_DTYPES = {
    "F64": ("d", 8),
    "F32": ("f", 4),
    "I64": ("q", 8),
    "I32": ("i", 4),
    "U8": ("B", 1),
    "BOOL": ("?", 1),
}


class SafeTensors:
    """A safetensors file: ``meta`` (its ``__metadata__``), ``names()``, ``shape(name)``,
    ``dtype(name)``, ``raw(name)`` (bytes) and ``values(name)`` (a flat list)."""

    def __init__(self, path):
        data = Path(path).read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        self.header = json.loads(data[8 : 8 + n])
        self.meta = self.header.pop("__metadata__", {})
        self.data = memoryview(data)[8 + n :]

    def names(self):
        return list(self.header)

    def shape(self, name):
        return list(self.header[name]["shape"])

    def dtype(self, name):
        return self.header[name]["dtype"]

    def raw(self, name):
        a, b = self.header[name]["data_offsets"]
        return bytes(self.data[a:b])

    def values(self, name):
        code, size = _DTYPES[self.dtype(name)]
        raw = self.raw(name)
        return list(struct.unpack(f"<{len(raw) // size}{code}", raw))

    def fixture(self):
        return json.loads(self.meta["fixture"])


def f32s(raw):
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def bf16s(raw):
    """bfloat16 bytes widened to floats (exact)."""
    halves = struct.unpack(f"<{len(raw) // 2}H", raw)
    return struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves)))


def f16s(raw):
    """float16 (IEEE half) bytes widened to floats (exact)."""
    return struct.unpack(f"<{len(raw) // 2}e", raw)


def rel_l2(got, want):
    """‖got − want‖ / ‖want‖ in float64."""
    assert len(got) == len(want), (len(got), len(want))
    num = math.fsum((g - w) ** 2 for g, w in zip(got, want))
    den = math.fsum(w * w for w in want)
    return math.sqrt(num / den)


_MODELS = {}


def model(name, **kw):
    """A fixture model on the CPU, opened once per set of arguments."""
    key = (name, tuple(sorted(kw.items())))
    if key not in _MODELS:
        _MODELS[key] = vt.Model(fixtures_dir() / "models" / name, device="cpu", **kw)
    return _MODELS[key]


GpuTier = namedtuple("GpuTier", "name precision dtype torch_dtype")


def gpu_tier(m=None):
    """The GPU tier this process runs and the precision a CUDA model opens in there by default.

    ``name``: ``"7.5"``, ``"8.0"``, ``"9.0"``, …: the tier ``GPU_CORE_FORCE_TIER`` forces
    (``8.0``, ``sm80``, ``sm_80`` or ``80``; unset or empty: none), else cuda:0's compute
    capability (the card's own tier). ``precision``: ``"f16"`` on 7.5, which has no bf16 tensor
    cores and refuses bf16, else ``"bf16"``. ``dtype`` and ``torch_dtype``: its rows' dtype
    (``ImageRows.dtype``: ``"float16"`` or ``"bfloat16"``) and the torch dtype of that name. With
    a CUDA model ``m``, asserts that ``m.gpu_tier`` is this tier, forced where the variable is set.
    """
    import torch

    forced = os.environ.get("GPU_CORE_FORCE_TIER", "").strip()
    if forced:
        digits = forced.removeprefix("sm_").removeprefix("sm")
        major, minor = digits.split(".") if "." in digits else divmod(int(digits), 10)
        name = f"{int(major)}.{int(minor)}"
    else:
        name = "{}.{}".format(*torch.cuda.get_device_capability(0))
    if m is not None:
        assert m.gpu_tier.split()[0] == name, (m.gpu_tier, name)
        assert ("forced on" in m.gpu_tier) == bool(forced), (m.gpu_tier, forced)
    precision, dtype = ("f16", "float16") if name == "7.5" else ("bf16", "bfloat16")
    return GpuTier(name, precision, dtype, getattr(torch, dtype))


def image_bytes(name):
    return (fixtures_dir() / "images" / name).read_bytes()


def rss_bytes():
    """Resident set size of this process (Linux /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE")
