"""GELU written out as element-wise operators, computed by torch's one GELU kernel instead.

Hugging Face's GPT-2 (and GPT-Neo, GPT-J, CodeGen, Phi-1/2, T5 v1.1: every config with
``activation_function="gelu_new"``) takes its activation from
``transformers.activations.NewGELUActivation``, the tanh approximation written as eight
element-wise operators: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``. On the
feed-forward's widest activation each operator is a pass over memory and autograd keeps its
inputs for a backward of as many passes again. ``F.gelu(x, approximate="tanh")`` is the same
function in one kernel each way (for a bf16 input it computes in fp32 and rounds once, where the
chain rounds every intermediate to bf16).

While a model is accelerated, each such module in it whose class forward is one of
:data:`KNOWN` gets an instance ``forward`` (:class:`.forward.GeluForward`, an entry of the patch
engine's journal, restored at unpatch) that calls ``F.gelu`` with the same approximation. Only
where the module's own forward was checked to compute that function on this process's
versions: once per class, on fp32 values from -10 to 10 (:func:`same_function`). A module with
an instance ``forward`` of its own, a subclass of those classes, or a call with anything but one
floating tensor keeps its own forward.
"""

from __future__ import annotations

import inspect
import threading

import torch
from torch import nn
from torch.nn import functional as F

#: classes (module, name) whose forward is GELU written out, and F.gelu's ``approximate`` for it;
#: GELUActivation and GELUTanh only when built with their Python formula (their ``act``)
KNOWN = {
    ("transformers.activations", "NewGELUActivation"): "tanh",
    ("transformers.activations", "FastGELUActivation"): "tanh",
    ("transformers.activations", "AccurateGELUActivation"): "tanh",
    ("transformers.activations", "GELUTanh"): "tanh",
    ("transformers.activations", "GELUActivation"): "none",
}
#: the probe's values, and how close the module's forward must come to F.gelu on them (fp32)
PROBE = (-10.0, 10.0, 4097)
RTOL, ATOL = 1e-5, 1e-6

_checked: dict[tuple[type, str], bool] = {}
_lock = threading.Lock()


def approximation(module: nn.Module) -> str | None:
    """F.gelu's ``approximate`` for a module whose forward is GELU written out, or None."""
    cls = type(module)
    approximate = KNOWN.get((cls.__module__, cls.__name__))
    if approximate is None or "forward" in module.__dict__:
        return None
    if cls.__name__ in ("GELUActivation", "GELUTanh") and not inspect.ismethod(getattr(module, "act", None)):
        return None  # built on F.gelu already (a partial of it, or the function)
    return approximate if same_function(module, approximate) else None


def same_function(module: nn.Module, approximate: str) -> bool:
    """Whether the module's class forward computes ``F.gelu(x, approximate=...)`` within
    :data:`RTOL` / :data:`ATOL` on fp32 values from -10 to 10 (once per class and approximation)."""
    key = (type(module), approximate)
    found = _checked.get(key)
    if found is None:
        with _lock:
            found = _checked.get(key)
            if found is None:
                found = _checked[key] = _check(module, approximate)
    return found


def _check(module: nn.Module, approximate: str) -> bool:
    probe = torch.linspace(*PROBE)
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            out = type(module).forward(module, probe)
    except Exception:
        return False
    return (
        type(out) is torch.Tensor
        and out.shape == probe.shape
        and out.dtype == probe.dtype
        and torch.allclose(out, F.gelu(probe, approximate=approximate), rtol=RTOL, atol=ATOL)
    )


def candidates(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """The model's modules whose forward is GELU written out, with F.gelu's approximation."""
    found = []
    for sub in model.modules():
        approximate = approximation(sub)
        if approximate is not None:
            found.append((sub, approximate))
    return found
