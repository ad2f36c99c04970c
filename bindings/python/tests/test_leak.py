"""No leak over 1 000 repeated failing calls (and 1 000 DLPack exports, consumed or not): the
resident set size after them stays within a small bound of its size before, in one of up to three
windows of calls (a leak grows it in every window)."""

import gc

import pytest

import vision_towers as vt
from vt_testutil import fixtures_dir, image_bytes, model, rss_bytes

CALLS = 1000
# Python's allocators keep some freed memory; a leak of one 1 KiB object per call would show as
# 1 MiB, a leaked image or row buffer as far more.
BOUND = 2 << 20


# A leak grows the resident set in every window of calls; a warm-up does not. On a many-core
# machine the first windows grow the allocator's per-thread arenas of prep's worker threads
# (measured with 16 rayon workers: 7 MiB in the first window of 1 000 failing encodes, then
# 0–0.4 MiB), so a call passes when one of up to WINDOWS windows stays within the bound.
WINDOWS = 3


def growth(call, calls=CALLS):
    """The smallest growth of the resident set over a window of `calls` calls, windows tried
    until one is within BOUND (at most WINDOWS)."""
    for _ in range(100):  # warm up: pools, caches, lazily built types
        call()
    least = None
    for _ in range(WINDOWS):
        gc.collect()
        before = rss_bytes()
        for _ in range(calls):
            call()
        gc.collect()
        grown = rss_bytes() - before
        least = grown if least is None else min(least, grown)
        if least <= BOUND:
            break
    return least


def raises(exc, f):
    def call():
        try:
            f()
        except exc:
            return
        raise AssertionError("no exception")

    return call


def test_failing_calls_do_not_leak():
    m = model("gemma4")
    big_bad = b"\x89PNG\r\n\x1a\n" + bytes(256 << 10)  # a 256 KiB body behind a PNG magic
    cases = {
        "encode not-an-image": raises(vt.BadImageError, lambda: m.encode([image_bytes("tiny_20x15.png"), b"junk"])),
        "encode corrupt png": raises(vt.BadImageError, lambda: m.encode([big_bad])),
        "plan bomb": raises(
            vt.BadImageError,
            lambda: m.plan((fixtures_dir() / "adversarial/images/bomb_png_100000x100000.png").read_bytes()),
        ),
        "plan refused scheme": raises(vt.BadImageError, lambda: m.plan("https://example.com/x.png")),
        "plan bad data URI": raises(vt.BadImageError, lambda: m.plan("data:image/png;base64,!!!!")),
        "open missing model": raises(vt.BadModelError, lambda: vt.Model(fixtures_dir() / "nothing-here")),
        "open bad precision": raises(vt.UnsupportedError, lambda: vt.Model(fixtures_dir() / "models/gemma4", device="cpu", precision="bf16")),
        "dtype refused": raises(vt.UnsupportedError, lambda: m.encode([image_bytes("tiny_20x15.png")], dtype="bfloat16")),
    }
    grown = {name: growth(call) for name, call in cases.items()}
    assert all(g <= BOUND for g in grown.values()), {k: f"{v / 1024:.0f} KiB" for k, v in grown.items()}


def test_dlpack_exports_do_not_leak():
    np = pytest.importorskip("numpy")
    m = model("glm5_next")
    rows = m.encode([image_bytes("chelsea_168x112.webp")])[0]

    def unconsumed():
        rows.__dlpack__()
        rows.__dlpack__(max_version=(1, 0))

    def consumed():
        a = np.from_dlpack(rows)
        assert a.shape == rows.shape

    def encoded():
        r = m.encode([image_bytes("tiny_20x15.png")])[0]
        np.from_dlpack(r)

    for name, call, calls in (
        ("unconsumed", unconsumed, CALLS),
        ("consumed", consumed, CALLS),
        ("encode", encoded, 300),
    ):
        g = growth(call, calls)
        assert g <= BOUND, f"{name}: {g / 1024:.0f} KiB"
