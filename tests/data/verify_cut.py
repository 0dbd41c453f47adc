"""A deliberately broken fast path, for tests/runner/test_verify.py: imported from a ``sitecustomize``
that the test puts on ``PYTHONPATH``, it detaches the output of every ``Stem`` module (the
first block of tests/data/verify_loop.py's model) while CPU autocast is on, as nanopatch's bf16
forward turns it on. The parameters before the cut then get no gradient in the patched run
only; stock (no autocast) is untouched."""

from __future__ import annotations

import torch


def _autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def _cut(module, args, output):
    if type(module).__name__ == "Stem" and _autocast_on():
        return output.detach()
    return None


torch.nn.modules.module.register_module_forward_hook(_cut)
