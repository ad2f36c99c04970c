"""One model shared by 8 threads gives every thread the same rows, bitwise, and releases the GIL
while it works."""

import threading
import time

import vision_towers as vt
from vt_testutil import image_bytes, model

IMAGES = ["coffee_144x96.jpg", "tiny_20x15.png", "logo_rgba_112x84.png", "chelsea_168x112.webp"]


def run_threads(n, target):
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def body(k):
        try:
            barrier.wait()
            results[k] = target(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_eight_threads_share_one_model_and_agree_bitwise():
    for name in ("gemma4", "glm5_next", "step3p7"):
        m = model(name)
        imgs = [image_bytes(i) for i in IMAGES]
        want = [r.to_bytes() for r in m.encode(imgs)]

        def work(k):
            # Each thread its own order, with a plan after.
            order = imgs[k % 4 :] + imgs[: k % 4]
            rows = m.encode(order)
            m.plan(order[0])
            return k % 4, [[r.to_bytes() for r in rows]]

        for shift, runs in run_threads(8, work):
            for rows in runs:
                assert rows == want[shift:] + want[:shift], name


def test_the_gil_is_released_while_encoding():
    m = model("glm_ocr")
    imgs = [image_bytes("chelsea_168x112.webp")] * 32
    m.encode(imgs[:1])
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    start = time.perf_counter()
    m.encode(imgs)
    end = time.perf_counter()
    done.set()
    t.join()
    # Holding the GIL for the call would freeze the ticker for all of it.
    during = [x for x in ticks if start < x < end]
    assert len(during) >= 3, (len(during), end - start)
