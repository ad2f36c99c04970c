"""The hand-written stubs (`_vision_towers.pyi`) name exactly the module's public API."""

import ast
from pathlib import Path

import vision_towers
from vision_towers import _vision_towers as ext


def stub():
    return ast.parse((Path(vision_towers.__file__).parent / "_vision_towers.pyi").read_text())


def public(names):
    return {n for n in names if not n.startswith("_") or n in ("__dlpack__", "__dlpack_device__", "__len__", "__init__")}


def test_stub_names_match_the_module():
    tree = stub()
    top = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    runtime = {n for n in dir(ext) if not n.startswith("_")}
    assert top == runtime, (top ^ runtime)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        obj = getattr(ext, cls.name)
        stubbed = {
            n.name if isinstance(n, ast.FunctionDef) else n.target.id
            for n in cls.body
            if isinstance(n, (ast.FunctionDef, ast.AnnAssign))
        }
        if issubclass(obj, BaseException):
            # `kind` and `index` are set on each instance.
            assert stubbed <= {"kind", "index"}, (cls.name, stubbed)
            continue
        have = public(set(vars(obj)))
        assert public(stubbed) - {"__init__"} == have - {"__init__", "__new__"} - {"__repr__"}, (
            cls.name,
            public(stubbed) ^ have,
        )
    assert (Path(vision_towers.__file__).parent / "py.typed").exists()
