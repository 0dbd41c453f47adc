"""The ``demo-training`` test target (see demo_targets.py): wrapt wrappers on
``torch.optim.Optimizer.__init__`` and ``torch.nn.Module.train`` that count calls."""

from __future__ import annotations

from nanopatch import engine

SUPPORTED = {"torch": ">=2.0"}
CALLS = {"optimizer_init": 0, "module_train": 0}


def _count(key):
    def wrapper(wrapped, instance, args, kwargs):
        CALLS[key] += 1
        return wrapped(*args, **kwargs)

    return wrapper


def patch(config) -> None:
    import torch

    engine.wrap(torch.optim.Optimizer, "__init__", _count("optimizer_init"))
    engine.wrap(torch.nn.Module, "train", _count("module_train"))


def unpatch() -> None:
    pass  # everything is in the journal
