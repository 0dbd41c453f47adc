"""Native fused/foreach optimizer steps for the optimizers torch has them for.

On CPU, torch's optimizers default to one Python loop over the parameters. Where torch ships
a fused CPU kernel (``SGD``, ``Adam``, ``AdamW``, ``Adagrad`` on recent torch) nanopatch turns
it on, else the multi-tensor ``foreach`` path, but only for groups where the user left both
flags unset. The flags are taken out of ``optimizer.state_dict()`` again (and put back after
``load_state_dict``), so checkpoints are the ones stock would write.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from nanopatch.foundation.log import log_once

from . import memory_format as mf
from . import selfcheck
from .plan import context

_FUSABLE = ("SGD", "Adam", "AdamW", "Adagrad")
_FOREACH = ("SGD", "Adam", "AdamW", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Rprop", "ASGD", "Adadelta")
#: optimizer -> (flag, indices of the groups changed, the journal's entry)
_fast: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cpu_fused_supported() -> bool:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return False
    return "cpu" in _get_fused_kernels_supported_devices()


def _dense_cpu_float(group: dict) -> bool:
    return all(
        isinstance(p, torch.Tensor) and p.device.type == "cpu" and p.is_floating_point() and not p.is_sparse
        for p in group["params"]
    )


def choose_flag(optimizer: torch.optim.Optimizer) -> str | None:
    """ "fused" or "foreach" for an optimizer torch has that path for, else None."""
    cls = type(optimizer)
    if cls.__module__.split(".")[:2] != ["torch", "optim"]:
        return None  # a subclass or third-party optimizer: its step may not read the flags
    if not hasattr(optimizer, "register_state_dict_post_hook"):
        return None  # torch < 2.3: no way to keep checkpoints stock
    if cls.__name__ in _FUSABLE and _cpu_fused_supported():
        return "fused"
    if cls.__name__ in _FOREACH:
        return "foreach"
    return None


def _eligible(group: dict, flag: str) -> bool:
    return (
        flag in group
        and group.get("fused") is None
        and group.get("foreach") is None
        and not group.get("differentiable", False)
        and not group.get("capturable", False)
        and _dense_cpu_float(group)
    )


def use_fast_step(optimizer: torch.optim.Optimizer, on_sparse: Any = None) -> str | None:
    """Switch the optimizer's unset step flags to its fastest native path; returns the flag
    set ("fused"/"foreach") or None when nothing changed. The change (flags and the two
    state-dict hooks) is an entry of the patch engine's journal: undone at unpatch, or by
    :func:`restore_step`. A group whose parameters turn out to get sparse gradients goes back to
    torch's default step at its first step (:class:`_SparseGuard`), and ``on_sparse(left)`` is
    called, ``left`` the number of groups still on the fast path."""
    flag = choose_flag(optimizer)
    if flag is None or optimizer in _fast:
        return None
    changed = [i for i, g in enumerate(optimizer.param_groups) if _eligible(g, flag)]
    if not changed or not selfcheck.step_ok(optimizer, flag):
        return None
    for i in changed:
        optimizer.param_groups[i][flag] = True
    handles = [
        optimizer.register_state_dict_post_hook(_stock_flags),
        optimizer.register_load_state_dict_post_hook(_reapply),
    ]
    if flag == "fused":
        handles.append(optimizer.register_step_pre_hook(_LayoutGuard(changed)))
    handles.append(optimizer.register_step_pre_hook(_SparseGuard(optimizer, flag, changed, handles, on_sparse)))
    ref = weakref.ref(optimizer)

    def undo() -> None:
        for handle in handles:
            handle.remove()
        opt = ref()
        if opt is None:
            return
        _fast.pop(opt, None)
        for i in changed:
            if i < len(opt.param_groups):
                opt.param_groups[i][flag] = None

    where = f"{type(optimizer).__name__}(at {id(optimizer):#x}): {flag} step"
    entry = context().on_undo(undo, where, owner=optimizer)
    _fast[optimizer] = (flag, changed, entry)
    return flag


class _LayoutGuard:
    """A step pre-hook of a fused step: torch's fused CPU kernels walk a parameter, its gradient
    and its state (momentum, Adam's moments) as flat memory, so where their strides differ they
    add up the wrong elements, silently (torch's default step, which stock uses, does not).
    Stock's strides never differ; a script's can, under nanopatch's channels-last weights: a
    weight replaced through ``p.data = averaged.clone()`` (Lookahead, weight averaging,
    ``vector_to_parameters``) or a gradient set by hand (``p.grad = per_sample.mean(0)``) comes
    in contiguous beside channels-last state. Before each step, a gradient or state tensor laid
    out unlike its parameter is given the parameter's strides, the same values."""

    def __init__(self, changed: list[int]) -> None:
        self.changed = changed  # the groups on the fused step (the sparse guard may shrink it)

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        groups, state = optimizer.param_groups, optimizer.state
        for i in self.changed:
            if i >= len(groups):
                continue
            for p in groups[i]["params"]:
                if p.dim() < 2:
                    continue  # one stride: laid out alike (or not dense, which the kernel refuses)
                strides, grad = p.stride(), p.grad
                if grad is not None and grad.layout != torch.strided:
                    continue  # a sparse gradient: the sparse guard sends its group to torch's default step
                if grad is not None and grad.stride() != strides and not _alike(p, grad):
                    grad.data = mf.laid_like(p, grad)
                for key, value in state.get(p, {}).items():
                    if isinstance(value, torch.Tensor) and value.shape == p.shape and value.stride() != strides:
                        if not _alike(p, value):
                            state[p][key] = mf.laid_like(p, value)


def _alike(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (one shape) put each element at the same flat offset: their strides
    agree wherever a dimension has more than one element."""
    return all(n == 1 or x == y for n, x, y in zip(a.shape, a.stride(), b.stride(), strict=True))


class _SparseGuard:
    """A step pre-hook: a group whose parameters get sparse gradients (an
    ``Embedding(sparse=True)``, ``F.embedding(..., sparse=True)``) goes back to torch's default
    step before it runs, which takes them (a fused step raises on them). Each parameter is looked
    at once, at the first step it has a gradient; the hook removes itself once all have been."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, flag: str, changed: list[int], handles: list, on_sparse: Any
    ) -> None:
        self.flag, self.changed, self.handles, self.on_sparse = flag, changed, handles, on_sparse
        self.unseen = {id(p): i for i in changed for p in optimizer.param_groups[i]["params"]}

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for i in list(self.changed):
            if i >= len(optimizer.param_groups):
                continue
            group = optimizer.param_groups[i]
            for p in group["params"]:
                if id(p) not in self.unseen or p.grad is None:
                    continue
                del self.unseen[id(p)]
                if p.grad.layout != torch.strided:
                    group[self.flag] = None
                    self.changed.remove(i)
                    for q in group["params"]:
                        self.unseen.pop(id(q), None)
                    log_once(
                        "sparse-step",
                        "%s: a parameter group gets sparse gradients: torch's default step for it, not the %s one",
                        type(optimizer).__name__,
                        self.flag,
                        about=optimizer,
                    )
                    if self.on_sparse is not None:
                        self.on_sparse(len(self.changed))
                    break
        if not self.unseen:
            self.handles[-1].remove()


def restore_step(optimizer: torch.optim.Optimizer) -> None:
    """Undo :func:`use_fast_step`: the flags back to unset, the hooks removed."""
    state = _fast.get(optimizer)
    if state is not None:
        context().discard(state[2])


def _stock_flags(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    flag, changed, _ = _fast[optimizer]
    for i in changed:
        if i < len(state_dict["param_groups"]):
            state_dict["param_groups"][i][flag] = None
    return state_dict


def _reapply(optimizer: torch.optim.Optimizer) -> None:
    flag, changed, _ = _fast[optimizer]
    for i in changed:
        if i < len(optimizer.param_groups) and _eligible(optimizer.param_groups[i], flag):
            optimizer.param_groups[i][flag] = True


def around_step(optimizer: torch.optim.Optimizer, own: Any, pre: Any, post: Any) -> Any:
    """A ``step`` that runs ``pre`` and ``post`` around ``own``, an instance-level step (IPEX's
    fused one), which torch's step hooks never see. Torch's hook convention: both get
    ``(optimizer, args, kwargs)`` with the optimizer first in ``args``; ``pre`` may return new
    ``(args, kwargs)``. ``post`` runs even when the step raises."""

    def step(*args: Any, **kwargs: Any) -> Any:
        changed = pre(optimizer, (optimizer, *args), kwargs)
        if changed is not None:
            args, kwargs = tuple(changed[0][1:]), changed[1]
        try:
            return own(*args, **kwargs)
        finally:
            post(optimizer, (optimizer, *args), kwargs)

    return step
