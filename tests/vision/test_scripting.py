"""``torch.jit.script`` on nanopatch's transforms, v1 and v2: whatever stock scripts, ours scripts
and the compiled module computes stock's result; what stock refuses, ours refuses with the same
exception type.

A v1 transform scripts as a copy of itself of the stock class (``__prepare_scriptable__``). A v2
transform scripts as the v1 class its class records in ``_v1_transform_cls``, which torchvision
evaluates from ``torchvision.transforms`` when v2 is first imported; the vision patch imports v2
before it replaces any v1 class, so every stock v2 class records stock's v1 class in either import
order, while patched and after ``unpatch_torch()`` (patching before v2's first import would
otherwise leave every stock v2 class pointing at nanopatch's v1 class for good, and scripting a v2
transform would compile nanopatch's ``forward(*args)``). This process imports v2 before it
patches; the other orders run in fresh interpreters.
"""

from __future__ import annotations

import json

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2  # noqa: F401 - imported before any patch: the v2-first order

import nanopatch

from conftest import run_python
from helpers import vision_examples as ex

CASES = [(version, name) for version, names in ex.SCRIPTING.items() for name in names]


@pytest.fixture
def patched():
    with nanopatch.patched(training=False):
        yield


@pytest.mark.parametrize(("version", "name"), CASES)
def test_scripts_as_stock(version, name, patched):
    stock, ours = ex.build(version, name, stock=True), ex.build(version, name, stock=False)
    problem = ex.scripting_problem(stock, ours, ex.sample_tensor(name))
    assert problem is None, problem
    assert type(ours).__module__ == ex.MODULE[version]  # scripting left the object alone


def test_every_v2_class_records_stocks_v1_class_while_patched_and_after():
    before = ex.v1_classes_of_v2()
    assert not ex.v1_link_problems(before)
    assert sum(v1 is not None for v1 in before.values()) >= 20  # the premise: v2 records v1 classes
    for _ in range(2):  # patch, unpatch, patch again
        with nanopatch.patched(training=False):
            assert T.Resize.__module__ == "nanopatch.targets.vision.transforms"
            links = ex.v1_classes_of_v2()
            assert not ex.v1_link_problems(links)
            assert all(links[name] is before[name] for name in before)
        after = ex.v1_classes_of_v2()
        assert all(after[name] is before[name] for name in before)


def test_common_transforms_script_and_match_eager(patched):
    """A scripted nanopatch transform computes what the eager one does on a tensor."""
    for ours in [T.Resize([32]), T.CenterCrop(20), T.Normalize([0.5] * 3, [0.2] * 3), T.RandomHorizontalFlip()]:
        assert type(ours).__module__ == "nanopatch.targets.vision.transforms"
        scripted, error = ex.script(ours)
        assert error is None, error
        x = torch.rand(3, 40, 44)
        torch.manual_seed(0)
        got = scripted(x)
        torch.manual_seed(0)
        assert torch.equal(got, ours(x))


# --- import orders (fresh interpreters) ----------------------------------------------------------

ORDER_SCRIPT = """
import json
import sys

import nanopatch

order = sys.argv[1]
if order == "v2-first":
    import torchvision.transforms.v2
elif order == "torchvision-first":
    import torchvision
assert ("torchvision" in sys.modules) == (order != "patch-first")
nanopatch.patch_torch(training=False)
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from helpers import vision_examples as ex

assert T.Resize.__module__ == "nanopatch.targets.vision.transforms"
assert v2.Resize.__module__ == "nanopatch.targets.vision.transforms_v2"
links = ex.v1_classes_of_v2()
report = {"patched": ex.v1_link_problems(links), "scripting": {}}
for version, names in ex.SCRIPTING.items():
    for name in names:
        stock, ours = ex.build(version, name, stock=True), ex.build(version, name, stock=False)
        report["scripting"][f"{version} {name}"] = ex.scripting_problem(stock, ours, ex.sample_tensor(name))
nanopatch.unpatch_torch()
after = ex.v1_classes_of_v2()
report["unpatched"] = ex.v1_link_problems(after) + [
    f"v2.{name}._v1_transform_cls changed at unpatch" for name in links if after[name] is not links[name]
]
report["stock v2 Resize scripts after unpatch"] = ex.script(v2.Resize([40]))[1] is None
print(json.dumps(report))
"""


@pytest.mark.parametrize("order", ["patch-first", "torchvision-first", "v2-first"])
def test_scripting_in_every_import_order(order):
    """patch-first: ``patch_torch()`` before torchvision is imported (the post-import hook
    patches it); torchvision-first: torchvision imported, v2 not yet; v2-first: v2 imported
    before the patch. In each, every replaced class scripts as stock's, every stock v2 class
    records stock's v1 class while patched, and the same one after ``unpatch_torch()``."""
    proc = run_python(["-c", ORDER_SCRIPT, order], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["patched"] == [], report["patched"]
    assert report["unpatched"] == [], report["unpatched"]
    differ = {name: problem for name, problem in report["scripting"].items() if problem}
    assert len(report["scripting"]) == len(CASES)
    assert not differ, "\n".join(f"{name}: {problem}" for name, problem in differ.items())
    assert report["stock v2 Resize scripts after unpatch"]
