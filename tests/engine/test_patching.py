"""In-process tests of the patch engine: the journal, thread safety, logging once, status()."""

from __future__ import annotations

import logging
import threading
import types

import pytest

import nanopatch
from nanopatch import engine

from helpers import demo_targets, demo_training


@pytest.fixture
def demo():
    """The demo targets registered on real torch/torchvision; everything undone after."""
    import torch  # noqa: F401
    import torchvision.transforms  # noqa: F401

    before = demo_targets.snapshot()
    demo_targets.register()
    yield before
    nanopatch.unpatch_torch()
    demo_targets.unregister()
    demo_targets.assert_same(before)


# --- the journal ---------------------------------------------------------------------------


class Owner:
    @staticmethod
    def static():
        return "static"

    @classmethod
    def klass(cls):
        return "class"

    def method(self):
        return "method"


class Child(Owner):
    pass


def test_journal_restores_raw_descriptors_and_deletes_new_attributes():
    journal = engine.Journal()
    raw = dict(Owner.__dict__)
    journal.replace("t", Owner, "static", staticmethod(lambda: "new"))
    journal.replace("t", Owner, "klass", "plain value")
    journal.replace("t", Owner, "added", 1)
    journal.replace("t", Child, "method", lambda self: "child")  # inherited: absent in Child.__dict__
    assert Owner.static() == "new" and Child().method() == "child" and Owner.added == 1
    journal.undo()
    for name in ("static", "klass", "method"):
        assert Owner.__dict__[name] is raw[name]
    assert type(Owner.__dict__["static"]) is staticmethod
    assert "added" not in Owner.__dict__ and "method" not in Child.__dict__
    assert Child().method() == "method" and journal.records() == []


def test_journal_records_the_original_once_and_undoes_lifo():
    module = types.ModuleType("fake_owner")
    module.value = "original"
    journal = engine.Journal()
    journal.replace("a", module, "value", "first")
    journal.replace("a", module, "value", "second")  # same target: original kept, not "first"
    journal.replace("b", module, "value", "third")  # another target stacks on top
    assert len(journal.records()) == 2
    journal.undo("b")
    assert module.value == "second"
    journal.undo("a")
    assert module.value == "original"


def test_replace_outside_a_target_is_refused():
    with pytest.raises(RuntimeError, match="only be called from a target"):
        engine.replace(types.ModuleType("m"), "x", 1)


def test_register_rejects_unknown_option_and_conflicting_target():
    with pytest.raises(ValueError, match="unknown option"):
        engine.register(engine.Target("x", "turbo", "torch", "x"))
    engine.register(engine.Target("dup", "vision", "nonexistent_module_xyz", "dup"))
    try:
        with pytest.raises(ValueError, match="different target"):
            engine.register(engine.Target("dup", "training", "nonexistent_module_xyz", "dup"))
    finally:
        engine.unregister("dup")


# --- the public API in-process ---------------------------------------------------------------


def test_status_is_a_plain_dict_describing_targets_and_options(demo):
    status = nanopatch.status()
    assert status["patched"] is False
    assert status["targets"]["demo-vision"]["state"] == "unpatched"
    nanopatch.patch_torch(bf16=False)
    status = nanopatch.status()
    assert status["patched"] is True
    vision = status["targets"]["demo-vision"]
    assert vision["state"] == "patched" and vision["module"] == "torchvision" and vision["option"] == "vision"
    assert "torchvision.transforms.RandomErasing" in vision["attributes"]
    assert "torch.optim.optimizer.Optimizer.__init__" in status["targets"]["demo-training"]["attributes"]
    assert status["options"]["bf16"] == {"value": False, "source": "argument", "reason": "set by patch_torch(bf16=...)"}
    assert set(status["options"]) == {
        "vision",
        "training",
        "bf16",
        "bf16_eval",
        "channels_last",
        "ipex",
        "compile",
        "fast_decode",
        "data_parallel",
        "auto_lr",
        "fast_dropout",
        "malloc_reuse",
        "cuda_to_cpu",
        "breakdown",
    }
    assert status["breakdown"] is None  # the option is off
    import json

    json.dumps(status)  # plain data only


def test_register_while_patched_applies_at_once(demo):
    nanopatch.patch_torch()
    extra = engine.Target("late", "vision", "torchvision", "demo_late_target")
    import sys

    late = types.ModuleType("demo_late_target")
    late.SUPPORTED = {}

    def patch(config):
        import torchvision

        engine.replace(torchvision, "LATE", config.bf16)

    late.patch = patch
    late.unpatch = lambda: None
    sys.modules["demo_late_target"] = late
    try:
        engine.register(extra)
        import torchvision

        assert torchvision.LATE == nanopatch.status()["options"]["bf16"]["value"]
        engine.unregister("late")
        assert not hasattr(torchvision, "LATE")
    finally:
        sys.modules.pop("demo_late_target")


def test_concurrent_patch_and_unpatch_end_consistent(demo):
    errors = []

    def churn(i):
        try:
            for _ in range(20):
                if i % 2:
                    nanopatch.patch_torch()
                    with nanopatch.unpatched():
                        pass
                else:
                    with nanopatch.patched():
                        pass
                    nanopatch.unpatch_torch()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    nanopatch.patch_torch()
    demo_targets.assert_patched()
    demo_records = [r for r in engine.JOURNAL.records() if r.target.startswith("demo-")]
    assert len(demo_records) == 9  # each attribute recorded once, no leftovers
    nanopatch.unpatch_torch()
    demo_targets.assert_same(demo)
    assert engine.JOURNAL.records() == []


def test_training_wrappers_pass_through(demo):
    import torch

    nanopatch.patch_torch()
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert model.train() is model and model.training
    assert model.eval() is model and not model.training  # eval() calls train(False)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["lr"] == 1e-3
    assert demo_training.CALLS["optimizer_init"] >= 1 and demo_training.CALLS["module_train"] >= 2


def test_fallbacks_are_logged_once_per_process(demo, caplog, fresh_log_once, monkeypatch):
    from nanopatch.engine import config

    monkeypatch.setattr(config, "distribution_version", lambda name: None if name.startswith("intel") else "2.13.0")
    caplog.set_level(logging.INFO, logger="nanopatch")
    for _ in range(3):
        nanopatch.patch_torch()
        nanopatch.unpatch_torch()
        nanopatch.status()
    messages = [r.getMessage() for r in caplog.records if "IPEX off" in r.getMessage()]
    assert messages == ["IPEX off: intel-extension-for-pytorch is not installed"]


def test_messages_about_an_object_are_said_once_per_object_and_forgotten_with_it(caplog, fresh_log_once):
    """A message about a model or optimizer is said once for that object: a new object (which
    may get a dead one's id) hears it again, and the record dies with the object."""
    import gc

    import torch

    from nanopatch.foundation import log

    caplog.set_level(logging.INFO, logger="nanopatch")
    said = []
    for _ in range(3):
        model = torch.nn.Linear(1, 1)
        said.append(log.log_once("stock", "model runs stock", about=model))
        said.append(log.log_once("stock", "model runs stock", about=model))
        del model
        gc.collect()
    assert said == [True, False] * 3
    assert len(caplog.records) == 3 and len(log._said_about) == 0


def test_scope_validates_options_up_front():
    with pytest.raises(ValueError, match="'compile'"):
        nanopatch.patched(compile="fastest")
    with pytest.raises(TypeError, match="unknown nanopatch option"):
        nanopatch.patched(turbo=True)
    with pytest.raises(TypeError):
        nanopatch.patched("not callable")
    assert repr(nanopatch.patched(bf16=False)) == "nanopatch.patched(bf16=False)"
    assert repr(nanopatch.unpatched()) == "nanopatch.unpatched()"


def test_status_reports_bad_environment_instead_of_raising(monkeypatch):
    monkeypatch.setenv("NANOPATCH_BF16", "maybe")
    status = nanopatch.status()
    assert status["patched"] is False
    assert any("'bf16'" in w and "maybe" in w for w in status["warnings"])
    with pytest.raises(ValueError, match="NANOPATCH_BF16"):
        nanopatch.patch_torch()
