"""pytest configuration: fixture paths and the GPU gate.

GPU tests carry the ``gpu`` marker. Where no CUDA device is present (the driver does not load or
reports no device) they are skipped, unless ``--gpu`` or ``VT_GPU_TESTS=1`` is given: then a
missing GPU fails them. Where a device is present they always run (and need PyTorch).
"""

import ctypes
import os

import pytest

from vt_testutil import fixtures_dir


def pytest_addoption(parser):
    parser.addoption(
        "--gpu",
        action="store_true",
        default=False,
        help="run the GPU tests and fail them when no CUDA device is present",
    )


def cuda_device_count():
    """CUDA devices the driver reports (0 when the driver does not load)."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.cuInit(0) != 0:
            return 0
        n = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return 0
        return n.value
    return 0


def gpu_required(config):
    return config.getoption("--gpu") or os.environ.get("VT_GPU_TESTS") == "1"


def pytest_collection_modifyitems(config, items):
    if cuda_device_count() > 0 or gpu_required(config):
        return
    skip = pytest.mark.skip(reason="no CUDA device (pass --gpu to make this a failure)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    return (
        f"vision_towers fixtures: {fixtures_dir()}; CUDA devices: {cuda_device_count()}; "
        f"GPU tests {'required' if gpu_required(config) else 'run where CUDA is present'}"
    )


@pytest.fixture(scope="session")
def fixtures():
    return fixtures_dir()
