"""The call-order matrix: every way imports, patching and unpatching can be ordered, each in a
fresh interpreter, on real torchvision and torch objects (tests/helpers/demo_targets.py).

After every unpatch, every attribute the targets touched ``is`` its original again.
"""

from __future__ import annotations

import pytest

from conftest import run_python

PREAMBLE = """
import sys
import nanopatch
from helpers import demo_targets
from helpers import demo_training
from nanopatch import engine
demo_targets.register()
"""

CASES = {
    "import-then-patch": """
        import torch, torchvision.transforms as T
        before = demo_targets.snapshot()
        demo_targets.assert_stock()
        nanopatch.patch_torch()
        demo_targets.assert_patched()
        assert nanopatch.status()["targets"]["demo-vision"]["state"] == "patched"
        nanopatch.unpatch_torch()
        demo_targets.assert_same(before)
        demo_targets.assert_stock()
        assert engine.JOURNAL.records() == []
    """,
    "patch-then-import": """
        nanopatch.patch_torch()
        assert "torch" not in sys.modules and "torchvision" not in sys.modules
        states = {n: t["state"] for n, t in nanopatch.status()["targets"].items()}
        off = {"cuda_to_cpu": "disabled", "cuda_extensions": "disabled", "breakdown": "disabled"}  # unless asked for
        assert states == {**off, "vision": "pending", "demo-vision": "pending", "demo-training": "pending"}, states
        import torchvision.transforms as T  # imports torch too: both hooks fire
        demo_targets.assert_patched()
        from torchvision.transforms import RandomErasing
        assert RandomErasing.demo and RandomErasing is T.RandomErasing
        nanopatch.unpatch_torch()
        demo_targets.assert_stock()
        stock = demo_targets.snapshot()
        nanopatch.patch_torch()
        demo_targets.assert_patched()
        nanopatch.unpatch_torch()
        demo_targets.assert_same(stock)
    """,
    "patch-unpatch-patch": """
        import torchvision.transforms as T
        before = demo_targets.snapshot()
        nanopatch.patch_torch()
        first = T.RandomErasing
        nanopatch.unpatch_torch()
        demo_targets.assert_same(before)
        nanopatch.patch_torch()
        demo_targets.assert_patched()
        assert T.RandomErasing is first  # the same replacement object each time
        nanopatch.unpatch_torch()
        demo_targets.assert_same(before)
    """,
    "unpatch-before-import": """
        nanopatch.patch_torch()
        nanopatch.unpatch_torch()
        import torchvision.transforms as T  # the pending hook fires, but must do nothing
        demo_targets.assert_stock()
        assert engine.JOURNAL.records() == []
        nanopatch.patch_torch()
        demo_targets.assert_patched()
    """,
    "double-patch": """
        import torch, torchvision.transforms as T
        before = demo_targets.snapshot()
        nanopatch.patch_torch()
        after_one = demo_targets.snapshot()
        records = len(engine.JOURNAL.records())
        nanopatch.patch_torch()
        nanopatch.patch_torch(vision=True)  # same resolved options: still a no-op
        assert demo_targets.snapshot() == after_one
        assert len(engine.JOURNAL.records()) == records
        demo_targets.assert_patched()  # also checks Optimizer.__init__ is wrapped once
        model = torch.nn.Linear(2, 2)
        torch.optim.SGD(model.parameters(), lr=0.1)
        assert demo_training.CALLS["optimizer_init"] == 1
        nanopatch.unpatch_torch()
        demo_targets.assert_same(before)
    """,
    "double-unpatch": """
        import torchvision.transforms as T
        before = demo_targets.snapshot()
        nanopatch.unpatch_torch()  # nothing patched yet: no-op
        nanopatch.patch_torch()
        nanopatch.unpatch_torch()
        nanopatch.unpatch_torch()
        demo_targets.assert_same(before)
        assert not nanopatch.is_patched()
    """,
    "patched-inside-unpatched": """
        import torchvision.transforms as T
        before = demo_targets.snapshot()
        nanopatch.patch_torch()
        with nanopatch.unpatched():
            demo_targets.assert_same(before)
            with nanopatch.patched():
                demo_targets.assert_patched()
            demo_targets.assert_same(before)
        demo_targets.assert_patched()
        nanopatch.unpatch_torch()
        demo_targets.assert_same(before)
    """,
    "unpatched-inside-patched": """
        import torchvision.transforms as T
        before = demo_targets.snapshot()
        with nanopatch.patched():
            demo_targets.assert_patched()
            with nanopatch.unpatched():
                demo_targets.assert_same(before)
            demo_targets.assert_patched()
            with nanopatch.patched(training=False):  # other options inside: re-applied...
                demo_targets.assert_patched(training=False)
            demo_targets.assert_patched()  # ...and the outer options restored after
        demo_targets.assert_same(before)
        try:
            with nanopatch.patched():
                raise KeyError("inside")
        except KeyError:
            pass
        demo_targets.assert_same(before)  # restored on an exception too
    """,
    "decorators": """
        import torchvision.transforms as T
        before = demo_targets.snapshot()

        @nanopatch.patched
        def bare():
            demo_targets.assert_patched()
            return "bare"

        @nanopatch.patched(training=False)
        def with_options():
            demo_targets.assert_patched(training=False)
            return "options"

        @nanopatch.unpatched
        def stock():
            demo_targets.assert_same(before)
            return "stock"

        @nanopatch.patched()
        def recursive(n):
            demo_targets.assert_patched()
            return 0 if n == 0 else 1 + recursive(n - 1)

        assert bare() == "bare" and with_options() == "options"
        demo_targets.assert_same(before)
        nanopatch.patch_torch()
        assert stock() == "stock"
        demo_targets.assert_patched()
        nanopatch.unpatch_torch()
        assert recursive(3) == 3
        demo_targets.assert_same(before)
        assert bare.__name__ == "bare"  # functools.wraps keeps the function's identity
    """,
    "from-import-before-patch": """
        from torchvision.transforms import RandomErasing
        import torchvision.transforms as T
        stock_erasing = RandomErasing
        nanopatch.patch_torch()
        assert RandomErasing is stock_erasing and not getattr(RandomErasing, "demo", False)  # bound early: stays stock
        assert T.RandomErasing.demo  # looked up after: patched
        warnings = nanopatch.status()["warnings"]
        assert any("__main__.RandomErasing" in w and "torchvision.transforms" in w for w in warnings), warnings
        nanopatch.unpatch_torch()
        assert T.RandomErasing is stock_erasing and nanopatch.status()["warnings"] == []
    """,
    "from-import-after-patch": """
        nanopatch.patch_torch()
        from torchvision.transforms import RandomErasing
        from torchvision.transforms.v2 import RandomErasing as ErasingV2
        import torchvision.transforms as T
        assert RandomErasing.demo and ErasingV2.demo and RandomErasing is T.RandomErasing
        import torch
        assert RandomErasing(p=1.0, value=7)(torch.zeros(3, 20, 40)).eq(7).any()  # a real, working subclass
        nanopatch.unpatch_torch()
        demo_targets.assert_stock()
    """,
    "options-select-targets": """
        import torch, torchvision.transforms as T
        before = demo_targets.snapshot()
        nanopatch.patch_torch(vision=False)
        targets = nanopatch.status()["targets"]
        assert targets["demo-vision"]["state"] == "disabled"
        assert targets["demo-training"]["state"] == "patched"
        assert not getattr(T.RandomErasing, "demo", False)
        nanopatch.patch_torch(vision=True)  # new options: re-applied
        demo_targets.assert_patched()
        nanopatch.unpatch_torch()
        demo_targets.assert_same(before)
    """,
}


@pytest.mark.py_only  # the engine's mechanics on demo targets: the real targets' orders run everywhere
@pytest.mark.parametrize("case", sorted(CASES))
def test_call_order(case):
    from textwrap import dedent

    code = PREAMBLE + dedent(CASES[case]) + "\nprint('CASE OK')\n"
    proc = run_python(code)
    assert proc.returncode == 0 and "CASE OK" in proc.stdout, proc.stderr


REAL_PREAMBLE = """
import sys
import nanopatch
from nanopatch import engine

OPTIONS = dict(vision=True, training=True, data_parallel=True, bf16=True, channels_last=True, ipex=False)


def places():
    # every replaced attribute with its first original (two targets may wrap the same one)
    first = {}
    for r in engine.JOURNAL.records():
        first.setdefault((id(r.owner), r.name), (r.owner, r.name, r.original))
    return list(first.values())


def assert_all_stock(places):
    for owner, name, original in places:
        assert engine.raw_attribute(owner, name) is original, (owner, name)
    assert engine.JOURNAL.records() == [] and engine.JOURNAL.changes() == []


def train_a_little():
    import torch
    import torchvision.transforms as T
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    model(torch.zeros(1, 3, 8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 3, 8, 8), torch.randint(0, 2, (8,))), batch_size=4, shuffle=True)
    T.Compose([T.ToTensor()])(__import__("PIL.Image").Image.new("RGB", (8, 8)))
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert "forward" in vars(model) and engine.JOURNAL.changes("training")
    return model, optimizer, loader
"""

#: the call-order cases on nanopatch's real targets (vision, training, distributed): after unpatch,
#: every attribute they replaced ``is`` its original, and nothing else of theirs is left
REAL_CASES = {
    "patch-then-import": """
        nanopatch.patch_torch(**OPTIONS)
        assert "torch" not in sys.modules
        import torch, torchvision.transforms, torchvision.transforms.v2
        targets = {r.target for r in engine.JOURNAL.records()}
        assert {"vision", "training", "distributed"} <= targets, targets
        replaced = places()
        model, optimizer, loader = train_a_little()
        nanopatch.unpatch_torch()
        assert_all_stock(replaced)
        assert "forward" not in vars(model)
    """,
    "import-then-patch-twice": """
        import torch, torchvision.transforms, torchvision.transforms.v2
        nanopatch.patch_torch(**OPTIONS)
        replaced = places()
        model, optimizer, loader = train_a_little()
        nanopatch.unpatch_torch()
        assert_all_stock(replaced)
        with nanopatch.patched(**OPTIONS):
            assert {(id(o), n) for o, n, _ in places()} == {(id(o), n) for o, n, _ in replaced}
            train_a_little()
            with nanopatch.unpatched():
                assert_all_stock(replaced)
        assert_all_stock(replaced)
    """,
}


@pytest.mark.parametrize("case", sorted(REAL_CASES))
def test_call_order_on_the_real_targets(case):
    from textwrap import dedent

    pytest.importorskip("torchvision")
    code = REAL_PREAMBLE + dedent(REAL_CASES[case]) + "\nprint('CASE OK')\n"
    proc = run_python(code)
    assert proc.returncode == 0 and "CASE OK" in proc.stdout, proc.stderr


@pytest.mark.py_only  # the engine's mechanics on demo targets: the real targets' orders run everywhere
def test_failing_target_is_rolled_back_and_does_not_break_import(tmp_path):
    """A target that fails half-way leaves everything stock, logs once, and the user's import
    of torchvision (which fires the hook) still succeeds."""
    (tmp_path / "broken_target.py").write_text(
        "from nanopatch import engine\n"
        "class Broken(engine.Target):\n"
        "    def patch(self, ctx):\n"
        "        import torchvision.transforms as T\n"
        "        ctx.replace(T, 'RandomErasing', object())\n"
        "        raise RuntimeError('half-way')\n"
    )
    code = """
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
        import nanopatch
        from nanopatch import engine
        engine.register(engine.Registration("broken", "vision", "torchvision", "broken_target:Broken"))
        nanopatch.patch_torch()
        import torchvision.transforms as T
        assert T.RandomErasing is T.transforms.RandomErasing
        target = nanopatch.status()["targets"]["broken"]
        assert target["state"] == "failed" and "half-way" in target["detail"], target
        assert target["attributes"] == []
        nanopatch.unpatch_torch(); nanopatch.patch_torch()  # retried, fails again, logged once only
        print("CASE OK")
    """
    import os

    from conftest import child_env

    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    proc = run_python(code, env=env)
    assert proc.returncode == 0 and "CASE OK" in proc.stdout, proc.stderr
    assert proc.stdout.count("broken patches failed (RuntimeError: half-way)") == 1, proc.stdout


@pytest.mark.py_only  # the engine's mechanics on demo targets: the real targets' orders run everywhere
def test_unsupported_version_is_left_stock(tmp_path):
    (tmp_path / "future_target.py").write_text(
        "from nanopatch import engine\n"
        "class Future(engine.Target):\n"
        "    supported = {'torchvision': '>=99'}\n"
        "    def patch(self, ctx):\n"
        "        raise AssertionError('must not run')\n"
    )
    code = """
        import nanopatch, torchvision.transforms as T
        from nanopatch import engine
        engine.register(engine.Registration("future", "vision", "torchvision", "future_target:Future"))
        nanopatch.patch_torch()
        target = nanopatch.status()["targets"]["future"]
        assert target["state"] == "unsupported" and "outside the supported range >=99" in target["detail"], target
        print("CASE OK")
    """
    import os

    from conftest import child_env

    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    proc = run_python(code, env=env)
    assert proc.returncode == 0 and "CASE OK" in proc.stdout, proc.stderr


def test_import_cost_nothing_heavy_imported():
    """`import nanopatch` and `patch_torch()` import neither torch, torchvision nor cv2."""
    proc = run_python(
        """
        import sys, nanopatch
        nanopatch.patch_torch()
        nanopatch.status()
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision", "cv2", "numpy", "PIL"))
        print(heavy)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
