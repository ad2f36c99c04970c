"""The adversarial corpus (fixtures/adversarial/manifest.json, see its README) through the Python
API: every hostile image and model raises the documented exception with the manifest's error
class as its `kind`, or succeeds where the manifest says so; nothing crashes.

- images and URIs (classes image-*, non-image, data-uri): `Model.plan` on the gemma4, glm5_next,
  glm_ocr and step3p7 fixture models, and `Model.encode` on the case's family (as
  crates/vision-towers/tests/adversarial.rs rotates them), with the manifest's `plan` and
  `prepare` classes; a refusal is a `BadImageError` whose `index` is the image's position;
- models (classes gguf, safetensors, config): `Model(path)` and, once open, `encode` of a small
  image, with the manifest's `open` and `encode` classes; a refusal at open is a `BadModelError`
  (`UnsupportedError` for a setting the device cannot give).
"""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

import vision_towers as vt
from vt_testutil import fixtures_dir, model

FAMILIES = ["gemma4", "glm5_next", "glm_ocr", "step3p7"]
IMAGE_CLASSES = {
    "image-bomb",
    "image-body-bomb",
    "image-zero",
    "non-image",
    "image-random",
    "image-truncation",
    "image-bitflip",
    "data-uri",
}
MODEL_CLASSES = {"gguf", "safetensors", "config"}


def corpus():
    return fixtures_dir() / "adversarial"


def manifest():
    return json.loads((corpus() / "manifest.json").read_text())["cases"]


def allowed(expect, got):
    return any(p == got or (p.endswith(":*") and got.startswith(p[:-1])) for p in expect)


def image_input(src):
    if "file" in src:
        return (corpus() / src["file"]).read_bytes()
    if "derive" in src:
        d = src["derive"]
        b = bytearray((fixtures_dir() / d["base"]).read_bytes())
        if "truncate" in d:
            del b[d["truncate"] :]
        if "flip" in d:
            pos, bit = d["flip"]
            b[pos] ^= 1 << bit
        return bytes(b)
    if "uri" in src:
        return src["uri"]
    g = src["uri_gen"]
    repeats = -(-(g["len"] - len(g["prefix"])) // len(g["fill"]))  # ceil, as the Rust test
    return g["prefix"] + g["fill"] * repeats


def outcome(call, image_index):
    """`ok`, or the error's kind after checking its class and index (None where the tower
    refused an image its own processor prepared)."""
    try:
        call()
    except vt.BadImageError as e:
        assert e.index == image_index or e.kind.startswith("tower:"), (e.index, image_index, str(e))
        assert str(e), "empty message"
        return e.kind
    except vt.VisionTowersError as e:
        return f"{type(e).__name__}:{e.kind}: {e}"
    return "ok"


_BASE = {}


def base_outcome(base, m):
    key = (base, m.family)
    if key not in _BASE:
        _BASE[key] = outcome(lambda: m.encode([(fixtures_dir() / base).read_bytes()]), 0)
    return _BASE[key]


def test_hostile_images_raise_bad_image_errors():
    cases = manifest()
    models = [model(f) for f in FAMILIES]
    strict = {f: model(f, max_megapixels=10) for f in FAMILIES}
    failures, seen = [], Counter()
    for i, case in enumerate(cases):
        if case["class"] not in IMAGE_CLASSES:
            continue
        seen[case["class"]] += 1
        img = image_input(case["source"])
        fam = FAMILIES.index(case["family"]) if "family" in case else i % len(FAMILIES)
        exp = case["expect"]
        for f, m in enumerate(models):
            got = outcome(lambda: m.plan(img), None)
            if not allowed(exp["plan"], got):
                failures.append(f"{case['id']}: plan ({FAMILIES[f]}) gave {got}, allowed {exp['plan']}")
        committed = "derive" not in case["source"] and "uri_gen" not in case["source"]
        if case.get("lib_encode", True):
            got = outcome(lambda: models[fam].encode([img]), 0)
            allow = list(exp["prepare"])
            if "derive" in case["source"]:
                # A damaged copy that still decodes may give what the intact image gives on this
                # tiny model (e.g. a grid past its position table: tower:Input).
                allow.append(base_outcome(case["source"]["derive"]["base"], models[fam]))
            if not allowed(allow, got):
                failures.append(f"{case['id']}: encode gave {got}, allowed {allow}")
        # The command line's extra runs: `--max-megapixels 10` is the model's max_megapixels.
        for cli in case.get("cli", []):
            if cli.get("args") == ["--max-megapixels", "10"] and committed:
                op = {
                    "plan": lambda: strict[FAMILIES[fam]].plan(img),
                    "prep": lambda: strict[FAMILIES[fam]].encode([img]),
                }[cli["cmd"]]
                got = outcome(op, None if cli["cmd"] == "plan" else 0)
                if not allowed(cli["expect"], got):
                    failures.append(f"{case['id']}: {cli['cmd']} at 10 MP gave {got}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    assert set(seen) == IMAGE_CLASSES, seen
    print(dict(seen))


def hexbytes(s):
    return bytes.fromhex(s)


def materialize_model(spec, dest: Path) -> Path:
    """The case's base model (a file or a directory) in `dest` with its edits applied: files no
    edit touches are symlinks to the fixture, edited ones copies."""
    base = fixtures_dir() / spec["base"]
    dest.mkdir(parents=True)
    edits = spec.get("edits", [])

    def edited(name):
        return any((e["file"] == name) if "file" in e else not base.is_dir() for e in edits)

    def place(src, dst):
        if edited(dst.name):
            shutil.copyfile(src, dst)
        else:
            dst.symlink_to(src)

    if base.is_dir():
        for e in base.iterdir():
            place(e, dest / e.name)
        target = dest
    else:
        target = dest / base.name
        place(base, target)
    for e in edits:
        file = dest / e["file"] if "file" in e else target
        op = e["op"]
        if op == "patch":
            b = bytearray(file.read_bytes())
            patch = hexbytes(e["hex"])
            b[e["at"] : e["at"] + len(patch)] = patch
            file.write_bytes(bytes(b))
        elif op == "truncate":
            file.write_bytes(file.read_bytes()[: e["len"]])
        elif op == "splice_head":
            head = (corpus() / e["head"]).read_bytes()
            file.write_bytes(head + file.read_bytes()[e["keep_from"] :])
        elif op == "replace":
            file.unlink(missing_ok=True)
            shutil.copyfile(corpus() / e["with"], file)
        elif op == "delete":
            file.unlink()
        else:
            raise AssertionError(f"unknown edit op {op}")
    return target


def test_hostile_models_raise_bad_model_errors(tmp_path):
    tiny = (fixtures_dir() / "images" / "tiny_20x15.png").read_bytes()
    failures, seen, kinds = [], Counter(), Counter()
    for i, case in enumerate(manifest()):
        if case["class"] not in MODEL_CLASSES:
            continue
        seen[case["class"]] += 1
        path = materialize_model(case["model"], tmp_path / f"c{i}")
        kw = {"max_soft_tokens": 70} if path.suffix == ".gguf" else {}
        exp = case["expect"]
        try:
            m = vt.Model(path, device="cpu", **kw)
            opened = "ok"
        except vt.BadModelError as e:
            opened = e.kind
            assert e.index is None and str(e)
        except vt.VisionTowersError as e:
            opened = f"{type(e).__name__}:{e.kind}: {e}"
        kinds[opened] += 1
        if not allowed(exp["open"], opened):
            failures.append(f"{case['id']}: open gave {opened}, allowed {exp['open']}")
            continue
        if opened != "ok":
            continue
        try:
            m.encode([tiny])
            encoded = "ok"
        except vt.VisionTowersError as e:
            encoded = e.kind
        if not allowed(exp["encode"], encoded):
            failures.append(f"{case['id']}: encode gave {encoded}, allowed {exp['encode']}")
        del m
        shutil.rmtree(tmp_path / f"c{i}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    assert set(seen) == MODEL_CLASSES, seen
    print(dict(seen), dict(kinds))
