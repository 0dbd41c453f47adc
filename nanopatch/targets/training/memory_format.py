"""Channels-last for models with convolutions, and for their 4-D (5-D) float inputs.

oneDNN's fastest CPU convolutions work on NHWC; a model converted with
``model.to(memory_format=torch.channels_last)`` keeps its parameters (the same ``Parameter``
objects, so an optimizer built before still holds them) and only changes their strides.
Models without 2-D/3-D convolutions are left alone.

Whether it pays depends on the model and the CPU: ResNet-18 at 224 px trains faster in it, a
small convolution on small images slower than stock (oneDNN reorders between layouts around
ops that have no channels-last kernel). Where nanopatch chose it itself, the trial of
:class:`.plan.Trial` measures it against stock's layout on the model's first steps, switching
with :func:`relayout`, and keeps it only where it was faster.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .plan import context

logger = logging.getLogger("nanopatch")

_CONV2D = (nn.Conv2d, nn.ConvTranspose2d)
_CONV3D = (nn.Conv3d, nn.ConvTranspose3d)


def channels_last_rank(model: nn.Module) -> int | None:
    """4 for a model with 2-D convolutions, 5 with 3-D ones (and no 2-D ones), else None."""
    has_3d = False
    for module in model.modules():
        if isinstance(module, _CONV2D):
            return 4
        if isinstance(module, _CONV3D):
            has_3d = True
    return 5 if has_3d else None


def memory_format(rank: int) -> torch.memory_format:
    return torch.channels_last if rank == 4 else torch.channels_last_3d


def convert_model(
    model: nn.Module, rank: int, optimizers: Callable[[nn.Module], list[Any]], wrapper: Any = None
) -> Any:
    """Make the model's weights channels-last, and the state ``optimizers(model)`` hold for them
    (see :func:`relayout`); the change is an entry of the patch engine's journal (undone at
    unpatch, or by ``Context.discard`` of what this returns: both back to contiguous strides),
    forgotten if the model is dropped (the entry holds no reference to it). ``wrapper``: the
    ``DistributedDataParallel`` about to wrap the model, whose gradient buckets the undo lays
    out again (:func:`rebucket`; a collective, as every rank unpatches at the same point); one
    whose buckets cannot follow keeps its weights channels-last, and says so."""
    relayout(model, rank, True, optimizers(model))
    ref = weakref.ref(model)
    wrapped = weakref.ref(wrapper) if wrapper is not None else None

    def undo() -> None:
        alive = ref()
        if alive is None:
            return
        ddp = wrapped() if wrapped is not None else None
        wraps = ddp is not None and getattr(ddp, "reducer", None) is not None  # built, and training through it
        why = buckets_stay(ddp) if wraps else None
        if why is not None:
            logger.warning(
                "%s keeps its channels-last weights: %s laid its gradient buckets out for them and they "
                "cannot be laid out again (%s), and torch misplaces the averaged gradients' elements where "
                "their strides differ",
                type(alive).__name__,
                type(ddp).__name__,
                why,
            )
            return
        relayout(alive, rank, False, optimizers(alive))
        if wraps:
            _rebucket_if_grouped(ddp)

    return context().on_undo(undo, f"{type(model).__name__}(at {id(model):#x}): channels-last weights", model)


def _convert(value: Any, rank: int, fmt: torch.memory_format) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == rank and value.is_floating_point():
        return value.contiguous(memory_format=fmt)
    return value


def convert_inputs(args: tuple, kwargs: dict, rank: int) -> tuple[tuple, dict]:
    """Float tensors of ``rank`` dimensions among the call's arguments (and one level into
    lists and tuples), made channels-last; everything else as given."""
    fmt = memory_format(rank)
    new_args = tuple(_convert_item(a, rank, fmt) for a in args)
    new_kwargs = {k: _convert_item(v, rank, fmt) for k, v in kwargs.items()} if kwargs else kwargs
    return new_args, new_kwargs


def _convert_item(value: Any, rank: int, fmt: torch.memory_format) -> Any:
    if type(value) in (list, tuple):
        return type(value)(_convert(v, rank, fmt) for v in value)
    return _convert(value, rank, fmt)


#: id -> weak reference of the weights :func:`relayout` made channels-last (and has not laid
#: back since); by id, as a tensor's ``==`` compares elements (a WeakSet would call it)
_relaid: dict[int, weakref.ref] = {}


def relayout(model: nn.Module, rank: int, on: bool, optimizers: list[Any]) -> None:
    """The model's weights (and their gradients) channels-last (``on``) or back to stock's
    contiguous strides, in place (the same ``Parameter`` objects), and the optimizers' state for
    them (momentum, Adam's moments) given the weights' new strides: torch's fused CPU steps read
    a weight, its gradient and its state as flat memory, and would mix up elements across
    layouts (:func:`match_state_layout`)."""
    model.to(memory_format=memory_format(rank) if on else torch.contiguous_format)
    for p in model.parameters():
        if on and p.dim() == rank:
            _relaid[id(p)] = weakref.ref(p, functools.partial(_forget, id(p)))
        else:
            _relaid.pop(id(p), None)
    params = {id(p) for p in model.parameters()}
    for optimizer in optimizers:
        match_state_layout(optimizer, params)


def _forget(key: int, ref: weakref.ref) -> None:
    if _relaid.get(key) is ref:  # (not a later weight that got the same id)
        del _relaid[key]


def in_stock_strides(tensors: Any) -> Any:
    """``tensors`` (a dict of name -> tensor, a state dict) with each tensor that is a weight
    :func:`relayout` laid out channels-last (the weight itself, or a ``detach()`` of it, as
    ``state_dict()`` gives) replaced by a contiguous copy; the same object where none is."""
    if not isinstance(tensors, dict):
        return tensors
    weights = [ref() for ref in list(_relaid.values())]
    ours = {(p.data_ptr(), p.stride()) for p in weights if p is not None and not p.is_contiguous()}
    if not ours:
        return tensors
    found = {
        name: value.contiguous()
        for name, value in tensors.items()
        if isinstance(value, torch.Tensor) and not value.is_contiguous() and (value.data_ptr(), value.stride()) in ours
    }
    return {**tensors, **found} if found else tensors


def laid_like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` (of ``param``'s shape) copied into ``param``'s strides, in its own dtype."""
    with torch.no_grad():
        return torch.empty_like(param, dtype=value.dtype, device=value.device).copy_(value)


def match_state_layout(optimizer: Any, params: set[int] | None = None) -> None:
    """Give each state tensor of ``optimizer`` (of the parameters whose ids are in ``params``,
    or all) that has its parameter's shape but other strides the parameter's strides, the same
    values. Torch's fused CPU steps (SGD, Adam, AdamW,
    Adagrad) walk a parameter, its gradient and its state as flat memory: a momentum buffer laid
    out contiguously beside a channels-last weight gets the wrong elements added, silently (a
    stock checkpoint's state loaded into a model nanopatch made channels-last, or weights re-laid
    out after the state was made)."""
    with torch.no_grad():
        for param, state in list(getattr(optimizer, "state", {}).items()):
            if not isinstance(param, torch.Tensor) or not isinstance(state, dict):
                continue
            if params is not None and id(param) not in params:
                continue
            for key, value in list(state.items()):
                if (
                    isinstance(value, torch.Tensor)
                    and value.shape == param.shape
                    and value.layout == torch.strided
                    and value.stride() != param.stride()
                ):
                    state[key] = laid_like(param, value)


# --- DistributedDataParallel's gradient buckets ---------------------------------------------
#
# DDP lays its gradient buckets out for the strides its parameters have when it wraps them.
# Where they change later, torch warns ("Grad strides do not match bucket view strides ... not
# an error") and hands the averaged gradients back with their elements in the wrong places
# (torch 2.8, 2.13 and 2.15: a channels-last weight under a DDP built on contiguous ones got
# the average's contiguous memory read with channels-last strides). So whatever re-lays a
# wrapped model's weights out lays the wrapper's buckets out again at once.


def buckets_stay(ddp: Any) -> str | None:
    """Why ``ddp``'s (a ``DistributedDataParallel``) gradient buckets cannot be laid out again
    for new strides, or None where they can: its reducer rebuilds them (torch does once, after
    the first backward) only where it is not looking for unused parameters, or knows the graph
    is static; and a communication hook of the script's may keep state per bucket (PowerSGD's
    error feedback: torch rebuilds before its hook starts, never after)."""
    reducer = getattr(ddp, "reducer", None)
    needed = ("_rebuild_buckets", "_reset_state", "_push_all_rebuilt_params")
    if reducer is None or not all(hasattr(reducer, name) for name in needed):
        return "this torch's DDP cannot rebuild its buckets"
    if getattr(ddp, "_comm_hooks", None):
        return "it has a communication hook of its own, which may keep state per bucket"
    if not getattr(ddp, "static_graph", False) and getattr(ddp, "find_unused_parameters", True):
        return "it looks for unused parameters (find_unused_parameters=True)"
    return None


def record_order(ddp: Any) -> None:
    """The next backward through ``ddp`` records the order its gradients come in (the reducer's
    own record for its rebuild), for :func:`rebucket`'s buckets to follow it. Between steps only."""
    ddp.reducer._reset_state()


def rebucket(ddp: Any) -> None:
    """Lay ``ddp``'s gradient buckets out again for its parameters' strides now (a collective:
    every rank at the same step), in the order the last backward's gradients came in where
    :func:`record_order` had it recorded, else in the parameters' order; the next backward
    records the order again and DDP's forward after it re-buckets in that order, as DDP does
    after its first backward."""
    reducer = ddp.reducer
    if not reducer._rebuild_buckets():
        reducer._reset_state()
        reducer._push_all_rebuilt_params()
        if not reducer._rebuild_buckets():
            raise RuntimeError(f"{type(ddp).__name__} did not lay its gradient buckets out again")
    reducer._reset_state()


def _rebucket_if_grouped(ddp: Any) -> None:
    """:func:`rebucket` at unpatch, where the wrapper's process group is still there to agree
    on the buckets (after ``destroy_process_group`` nothing trains through it any more)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            rebucket(ddp)
        except Exception:
            logger.warning("%s could not lay its gradient buckets out again", type(ddp).__name__, exc_info=True)
