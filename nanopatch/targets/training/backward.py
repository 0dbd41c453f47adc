"""A custom ``torch.autograd.Function`` whose backward fails on the bf16 its forward computed.

A Function's forward runs under nanopatch's autocast like the rest of the model, so what it
saves and the gradient it gets back can be bf16 where stock has fp32. PyTorch asks a Function
that runs under autocast to say how its backward should run (``torch.amp.custom_bwd``); one
that does not, and mixes dtypes by hand in its backward (``grad @ weight.T`` with an fp32
weight saved beside a bf16 gradient), raises under a by-hand ``torch.autocast`` and so would
under nanopatch. Stock runs it.

:func:`apply` wraps ``BackwardCFunction.apply``, what the autograd engine calls to run every
custom Function's backward. While no model computes in bf16 it only calls through. Otherwise a
backward that raises a dtype error runs again under :class:`.rescue.Rescue`, each op that fails
for a bf16 tensor in fp32 (the engine casts each gradient to its input's dtype, as always), and
that Function's later backwards run under it from the start. The models in bf16 note it; the
log says it once. (A Function with ``boxed_grads_call``, whose backward may free the gradients
it was given as it goes, is run by the engine through ``apply_boxed``, which is not wrapped:
it could not be run a second time.)
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from nanopatch.foundation.log import log_once

from . import rescue
from .plan import lock, plans

#: the Function classes whose backward failed on bf16 and now runs under Rescue from the start
mixing: weakref.WeakSet = weakref.WeakSet()


def apply(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``BackwardCFunction.apply``: the Function's backward, made again under
    :class:`.rescue.Rescue` where it fails on a bf16 tensor nanopatch's autocast gave it."""
    if not _bf16_now():
        return wrapped(*args, **kwargs)
    function = getattr(instance, "_forward_cls", None)
    if function is not None and function in mixing:
        with rescue.Rescue():
            return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    except (RuntimeError, TypeError) as exc:
        if not rescue.dtype_error(exc):
            raise
        guard = rescue.Rescue()
        try:
            with guard:
                result = wrapped(*args, **kwargs)
        except Exception:
            raise exc from None  # not bf16's doing: the backward's own error, as it was
        if guard.dtype_failed is not None and function is not None:
            _note(function, guard.dtype_failed)
        return result


def _bf16_now() -> bool:
    """Whether some model nanopatch found computes in bf16 now."""
    return any(plan.amp_dtype is not None and plan.stock is None for plan in list(plans.values()))


def _note(function: type, why: str) -> None:
    mixing.add(function)
    name = getattr(function, "__qualname__", getattr(function, "__name__", repr(function)))
    note = (
        f"custom autograd Function {name}: its backward mixes the bf16 it was given with fp32 "
        f"tensors ({why}) and has no torch.amp.custom_bwd; the ops that fail run in fp32"
    )
    with lock:
        for plan in list(plans.values()):
            if plan.amp_dtype is not None and note not in plan.notes:
                plan.notes.append(note)
    log_once("rescue-backward", "%s", note, level=logging.WARNING, about=function)


def forget() -> None:
    """At unpatch: no Function is known to mix dtypes any more."""
    mixing.clear()
