"""Nothing silent: where a CUDA device exists but cannot run the tower, ``device="auto"`` runs on
the CPU, issues a RuntimeWarning and keeps the reason (``Model.cpu_reason``); a named ``cuda:0``
raises with the same reason. gpu-core's ``GPU_CORE_FAKE_DEVICE`` stands in for a compute
capability 7.0 card (read when a model opens, so monkeypatch scopes it to one test)."""

import pytest

import vision_towers as vt
from vt_testutil import fixtures_dir


def test_auto_on_a_device_that_cannot_run_the_tower_warns_and_keeps_why(monkeypatch):
    monkeypatch.setenv("GPU_CORE_FAKE_DEVICE", "7.0")
    path = fixtures_dir() / "models" / "gemma4"
    with pytest.warns(RuntimeWarning, match=r"running on the CPU: .*7\.0.*Volta"):
        m = vt.Model(path, device="auto")
    assert m.device == "cpu"
    assert "Volta" in m.cpu_reason
    assert m.gpu_tier is None
    rows = m.encode([(fixtures_dir() / "images" / "coffee_144x96.jpg").read_bytes()])
    assert rows[0].shape[1] == m.width

    with pytest.raises(vt.NoDeviceError, match=r"Volta"):
        vt.Model(path, device="cuda:0")


def test_nothing_to_report_on_an_explicit_cpu_or_without_a_device(monkeypatch):
    monkeypatch.delenv("GPU_CORE_FAKE_DEVICE", raising=False)
    m = vt.Model(fixtures_dir() / "models" / "gemma4", device="cpu")
    assert m.cpu_reason is None
    assert m.gpu_tier is None


def test_a_forced_tier_name_is_checked(monkeypatch):
    monkeypatch.setenv("GPU_CORE_FAKE_DEVICE", "8.0")
    path = fixtures_dir() / "models" / "gemma4"
    with pytest.raises(ValueError, match=r"not a tier"):
        vt.Model(path, device="auto", gpu_tier="ampere")
    # Hopper's tier on an 8.0 card: auto runs on the CPU and says why
    with pytest.warns(RuntimeWarning, match=r"sm_90a"):
        m = vt.Model(path, device="auto", gpu_tier="9.0")
    assert "9.0" in m.cpu_reason
