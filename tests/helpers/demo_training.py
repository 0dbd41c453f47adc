"""The ``demo-training`` test target (see demo_targets.py): wrapt wrappers on
``torch.optim.Optimizer.__init__`` and ``torch.nn.Module.train`` that count calls."""

from __future__ import annotations

from nanopatch import engine

CALLS = {"optimizer_init": 0, "module_train": 0}


def _count(key):
    def wrapper(wrapped, instance, args, kwargs):
        CALLS[key] += 1
        return wrapped(*args, **kwargs)

    return wrapper


class DemoTraining(engine.Target):
    supported = {"torch": ">=2.0"}

    def patch(self, ctx: engine.Context) -> None:
        import torch

        ctx.wrap(torch.optim.Optimizer, "__init__", _count("optimizer_init"))
        ctx.wrap(torch.nn.Module, "train", _count("module_train"))
        # everything is in the journal: no unpatch of its own
