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


def test_replace_outside_a_targets_patch_is_refused():
    """A context replaces module and class attributes only while its target's patch() runs;
    later changes go through set_on, add_hook and on_undo, which undo with the target."""
    ctx = engine.Context("idle")
    with pytest.raises(RuntimeError, match="only be called while the target's patch"):
        ctx.replace(types.ModuleType("m"), "x", 1)
    with pytest.raises(RuntimeError, match="only be called while the target's patch"):
        ctx.wrap(types.ModuleType("m"), "x", lambda *a: None)


def test_register_rejects_unknown_option_conflicting_target_and_a_target_without_its_class():
    with pytest.raises(ValueError, match="unknown option"):
        engine.register(engine.Registration("x", "turbo", "torch", "x:X"))
    with pytest.raises(ValueError, match="is not 'package\\.module:Class'"):
        engine.register(engine.Registration("x", "vision", "torch", "a_module_only"))
    engine.register(engine.Registration("dup", "vision", "nonexistent_module_xyz", "dup:Dup"))
    try:
        with pytest.raises(ValueError, match="different target"):
            engine.register(engine.Registration("dup", "training", "nonexistent_module_xyz", "dup:Dup"))
    finally:
        engine.unregister("dup")


def test_a_target_class_gets_defaults_and_a_registration_names_its_instance():
    class Plain(engine.Target):
        def patch(self, ctx):
            pass

    class Telling(Plain):
        def describe(self):
            return {"did": "something"}

        def self_checks(self):
            return [{"check": "x", "agrees": True}]

    plain = Plain("plain")
    assert plain.name == "plain" and plain.supported == {} and plain.describe() is None and plain.self_checks() == []
    assert plain.unpatch(engine.Context("plain")) is None
    assert not Plain.describes() and not Plain.checks_itself() and Telling.describes() and Telling.checks_itself()
    with pytest.raises(NotImplementedError):
        engine.Target("bare").patch(engine.Context("bare"))
    module = types.ModuleType("demo_registration_code")
    module.Telling, module.NotATarget = Telling, object
    import sys

    sys.modules[module.__name__] = module
    try:
        made = engine.Registration("told", "vision", "torch", f"{module.__name__}:Telling").load()
        assert type(made) is Telling and made.name == "told"
        with pytest.raises(TypeError, match="is not a nanopatch\\.engine\\.Target subclass"):
            engine.Registration("no", "vision", "torch", f"{module.__name__}:NotATarget").load()
    finally:
        del sys.modules[module.__name__]


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
    extra = engine.Registration("late", "vision", "torchvision", "demo_late_target:Late")
    import sys

    late = types.ModuleType("demo_late_target")

    class Late(engine.Target):
        def patch(self, ctx):
            import torchvision

            ctx.replace(torchvision, "LATE", ctx.config.bf16)

    late.Late = Late
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
