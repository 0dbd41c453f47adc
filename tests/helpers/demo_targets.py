"""Real patch targets for testing the engine on real torchvision and torch objects.

``register()`` adds two targets to nanopatch's registry:

* ``demo-vision`` (option ``vision``, applied when torchvision is imported) replaces
  ``torchvision.transforms.RandomErasing`` and ``torchvision.transforms.v2.RandomErasing`` (classes
  nanopatch itself leaves stock) with real
  subclasses everywhere they are exported, swaps the raw ``staticmethod``
  ``RandomResizedCrop.get_params`` and adds an attribute that did not exist before;
* ``demo-training`` (option ``training``, applied when torch is imported) wraps
  ``torch.optim.Optimizer.__init__`` and ``torch.nn.Module.train`` with wrapt wrappers that
  count calls.

This module imports neither torch nor torchvision at import time, so tests can check that
patching before the import works.
"""

from __future__ import annotations

from typing import Any

from nanopatch import engine

VISION = engine.Registration(
    name="demo-vision", option="vision", module="torchvision", target="helpers.demo_targets:DemoVision"
)
TRAINING = engine.Registration(
    name="demo-training", option="training", module="torch", target="helpers.demo_training:DemoTraining"
)

CALLS = {"get_params": 0}
_subclasses: dict[Any, type] = {}  # stock class -> its demo subclass, made once (stable identity)


_set_aside: dict[str, engine.Registration] = {}


def register() -> None:
    """Add the demo targets. nanopatch's real ``training`` target wraps the same two torch
    attributes as ``demo-training``, so it is set aside meanwhile (it has its own tests in
    test_training.py), with ``safetensors``, which serves it, and so is ``distributed``, which builds on it
    (tests in test_launcher.py), with the Lightning targets that build on that; :func:`unregister` puts
    them back."""
    for name in ("training", "safetensors", "distributed", "lightning", "pytorch_lightning"):
        real = next((t for t in engine.targets() if t.name == name), None)
        if real is not None:
            _set_aside[name] = real
            engine.unregister(name)
    engine.register(VISION)
    engine.register(TRAINING)


def unregister() -> None:
    engine.unregister(VISION.name)
    engine.unregister(TRAINING.name)
    for name in ("training", "safetensors", "distributed", "lightning", "pytorch_lightning"):
        if name in _set_aside:
            engine.register(_set_aside.pop(name))


def demo_subclass(stock: type) -> type:
    if stock not in _subclasses:
        _subclasses[stock] = type(
            stock.__name__, (stock,), {"__module__": __name__, "__qualname__": f"Demo{stock.__name__}", "demo": True}
        )
    return _subclasses[stock]


def stock_crop_class() -> type:
    """torchvision's own RandomResizedCrop (nanopatch's vision target subclasses it)."""
    from torchvision.transforms import transforms

    crop = transforms.RandomResizedCrop
    return crop.__dict__.get("_nanopatch_stock", crop)


def _demo_get_params(img, scale, ratio):
    CALLS["get_params"] += 1
    return engine.raw_attribute(stock_crop_class(), "_stock_get_params").__func__(img, scale, ratio)


DEMO_GET_PARAMS = staticmethod(_demo_get_params)


class DemoVision(engine.Target):
    supported = {"torchvision": ">=0.15", "torch": ">=2.0"}

    def patch(self, ctx: engine.Context) -> None:
        import torchvision.transforms as T
        import torchvision.transforms.v2 as v2

        stock_erasing = T.transforms.RandomErasing
        ctx.replace_everywhere(stock_erasing, demo_subclass(stock_erasing), "torchvision")
        stock_v2_erasing = v2.RandomErasing
        ctx.replace_everywhere(stock_v2_erasing, demo_subclass(stock_v2_erasing), "torchvision")
        crop = stock_crop_class()
        ctx.replace(crop, "_stock_get_params", crop.__dict__["get_params"])
        ctx.replace(crop, "get_params", DEMO_GET_PARAMS)
        ctx.replace(T.transforms, "DEMO_PATCHED", True)
        # everything demo-vision does is in the journal: no unpatch of its own


# --- checks the tests share -----------------------------------------------------------------


def places() -> list[tuple[Any, str]]:
    """Every (owner, attribute) the demo targets touch (imports torch and torchvision)."""
    import torch
    import torchvision.datasets as datasets
    import torchvision.datasets.folder as folder
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    import torchvision.transforms.v2._augment as v2_augment

    return [
        # nanopatch's own vision target
        (folder, "pil_loader"),
        (folder, "default_loader"),
        (folder.DatasetFolder, "__getitem__"),
        (datasets.CIFAR10, "__getitem__"),
        (datasets.CIFAR100, "__getitem__"),
        (datasets.MNIST, "__getitem__"),
        (datasets.FashionMNIST, "__getitem__"),
        (datasets.QMNIST, "__getitem__"),
        (datasets.SVHN, "__getitem__"),
        (datasets.STL10, "__getitem__"),
        # the demo targets
        (T, "RandomErasing"),
        (T.transforms, "RandomErasing"),
        (v2, "RandomErasing"),
        (v2_augment, "RandomErasing"),
        (stock_crop_class(), "get_params"),
        (stock_crop_class(), "_stock_get_params"),
        (T.transforms, "DEMO_PATCHED"),
        (torch.optim.Optimizer, "__init__"),
        (torch.nn.Module, "train"),
    ]


def snapshot() -> dict[tuple[int, str], Any]:
    """The raw value of every place (NOTSET where absent), keyed by (id(owner), name)."""
    return {(id(owner), name): engine.raw_attribute(owner, name) for owner, name in places()}


def assert_same(before: dict[tuple[int, str], Any]) -> None:
    """Every place holds exactly (``is``) what ``before`` recorded."""
    now = snapshot()
    for key, value in before.items():
        assert now[key] is value, f"{key[1]} is {now[key]!r}, expected {value!r}"


def assert_stock() -> None:
    """Structural check that nothing of the demo targets is in place."""
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    assert T.RandomErasing is T.transforms.RandomErasing and not getattr(T.RandomErasing, "demo", False)
    assert T.RandomErasing.__module__ == "torchvision.transforms.transforms"
    assert not getattr(v2.RandomErasing, "demo", False)
    assert type(T.RandomResizedCrop.__dict__["get_params"]) is staticmethod
    assert T.RandomResizedCrop.__dict__["get_params"] is not DEMO_GET_PARAMS
    assert "_stock_get_params" not in vars(T.RandomResizedCrop)
    assert "DEMO_PATCHED" not in vars(T.transforms)
    assert not hasattr(torch.optim.Optimizer.__dict__["__init__"], "__wrapped__")
    assert not hasattr(torch.nn.Module.__dict__["train"], "__wrapped__")
    import torchvision.datasets.folder as folder

    assert folder.pil_loader.__module__ == "torchvision.datasets.folder"
    assert folder.DatasetFolder.__dict__["__getitem__"].__module__ == "torchvision.datasets.folder"


def assert_patched(training: bool = True) -> None:
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    assert T.RandomErasing.demo and T.transforms.RandomErasing is T.RandomErasing and v2.RandomErasing.demo
    assert stock_crop_class().__dict__["get_params"] is DEMO_GET_PARAMS
    assert T.transforms.DEMO_PATCHED is True
    import torchvision.datasets.folder as folder

    assert folder.pil_loader.__module__ == "nanopatch.targets.vision.datasets"  # the real vision target too
    wrapped = hasattr(torch.optim.Optimizer.__dict__["__init__"], "__wrapped__")
    assert wrapped is training
    if training:  # wrapped once, not twice
        assert not hasattr(torch.optim.Optimizer.__dict__["__init__"].__wrapped__, "__wrapped__")
