"""The real ``vision`` target undone exactly, in either import order (fresh interpreters).

After ``unpatch_torch()`` every attribute of every loaded torchvision module, and of every class
those modules define, ``is`` what it was before the patch (import first), or what the engine's
journal recorded as its original (patch first); nothing of nanopatch's is left anywhere in
torchvision, and a second patch/unpatch round ends in the very same state.
"""

from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor

from conftest import run_python

HELPERS = """
import sys
import nanopatch
from nanopatch import engine

def namespaces():
    '''(label, namespace dict) of every loaded torchvision module and every class it defines.'''
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torchvision" or name.startswith("torchvision.")):
            continue
        found[name] = module.__dict__
        for value in list(module.__dict__.values()):
            if isinstance(value, type) and getattr(value, "__module__", "") == name:
                found[f"{name}.{value.__qualname__}"] = value.__dict__
    return found

def snapshot():
    return {label: dict(ns) for label, ns in namespaces().items()}

def assert_same(before):
    now = snapshot()
    for label, values in before.items():
        assert set(now[label]) == set(values), (label, set(now[label]) ^ set(values))
        for key, value in values.items():
            assert now[label][key] is value, (label, key, now[label][key], value)

def assert_nothing_of_nanopatch():
    for label, ns in namespaces().items():
        for key, value in list(ns.items()):
            module = getattr(value, "__module__", None)
            assert not (isinstance(module, str) and module.startswith("nanopatch")), (label, key, value)

def vision_records():
    records = engine.JOURNAL.records("vision")
    where = {r.where for r in records}
    for expected in (
        "torchvision.transforms.Resize",
        "torchvision.transforms.v2.Resize",
        "torchvision.transforms.autoaugment.RandAugment",
        "torchvision.datasets.folder.pil_loader",
        "torchvision.datasets.folder.DatasetFolder.__getitem__",
        "torchvision.datasets.cifar.CIFAR10.__getitem__",
    ):
        assert expected in where, (expected, sorted(where)[:20])
    return [(r.owner, r.name, r.original) for r in records]
"""

IMPORT_FIRST = """
import torchvision, torchvision.transforms, torchvision.transforms.v2, torchvision.datasets
before = snapshot()
nanopatch.patch_torch(training=False)
records = vision_records()
assert all(engine.raw_attribute(owner, name) is not original for owner, name, original in records)
nanopatch.unpatch_torch()
assert_same(before)
assert_nothing_of_nanopatch()
nanopatch.patch_torch(training=False)
nanopatch.unpatch_torch()
assert_same(before)
print("import-first ok")
"""

PATCH_FIRST = """
nanopatch.patch_torch(training=False)
assert "torchvision" not in sys.modules
import torchvision, torchvision.transforms, torchvision.transforms.v2, torchvision.datasets
records = vision_records()
nanopatch.unpatch_torch()
for owner, name, original in records:
    assert engine.raw_attribute(owner, name) is original, (owner, name)
assert_nothing_of_nanopatch()
after = snapshot()
nanopatch.patch_torch(training=False)
nanopatch.unpatch_torch()
assert_same(after)
print("patch-first ok")
"""


def test_vision_unpatch_restores_every_attribute_in_either_import_order():
    codes = [textwrap.dedent(HELPERS) + textwrap.dedent(body) for body in (IMPORT_FIRST, PATCH_FIRST)]
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(run_python, codes))
    for proc, expected in zip(procs, ["import-first ok", "patch-first ok"], strict=True):
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected, proc.stdout
