"""The ``training`` patch target: find the model a script trains and accelerate it.

* :mod:`.discovery` finds the model each optimizer trains, at its first call in grad mode,
  wherever that call happens, and says once when it found none;
* :mod:`.plan` holds what was done to each model and what its forward really ran in;
* :mod:`.forward` is the accelerated forward (channels-last inputs, bf16 autocast, outputs
  back in fp32, output activations in fp32).

A paired model gets, in this order: channels-last (if it has 2-D/3-D convolutions), IPEX
``optimize`` together with its optimizer (when IPEX is installed, matches torch, and can fuse
that optimizer) or else torch's fused/foreach optimizer step, and the accelerated forward.
Everything but IPEX is undone at unpatch: every change (the instance forwards, the hooks, the
optimizers' step flags) is an entry of the patch engine's journal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from nanopatch import engine
from nanopatch.engine import versions
from nanopatch.foundation.log import log_once
from nanopatch.runtime import malloc
from nanopatch.runtime import tuning as runtime

from . import attention, backward, discovery, dropout, loss, replay, rescue, selfcheck
from . import forward as fw
from .plan import lock, plans, state

__all__ = [
    "Training",
    "describe",
    "explain",
    "hint",
    "plans",
    "release_data_parallel",
    "self_checks",
    "summary",
    "training_now",
]


class Training(engine.Target):
    """The model an optimizer trains, found and accelerated (bf16, channels-last, IPEX, fused
    steps, compile), and left stock where that does not learn as stock."""

    #: torch versions this target is written against (module hooks with always_call, autocast on CPU)
    supported = versions.supported("torch")

    def patch(self, ctx: engine.Context) -> None:
        _patch(ctx)

    def unpatch(self, ctx: engine.Context) -> None:
        _unpatch()

    def describe(self) -> list[dict[str, Any]]:
        return describe()

    def self_checks(self) -> list[dict[str, Any]]:
        return self_checks()


def _patch(ctx: engine.Context) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim import optimizer as optimizer_mod

    config = ctx.config
    assert config is not None
    state.ctx, state.config = ctx, config
    ctx.wrap(torch.optim.Optimizer, "__init__", discovery.optimizer_init)
    ctx.wrap(nn.Module, "__getstate__", fw.module_getstate)
    ctx.wrap(DistributedDataParallel, "__init__", discovery.ddp_init)
    if callable(getattr(torch.jit._trace, "_check_trace", None)):
        # torch.jit.trace's check runs the model again, untraced: as the trace, stock's forward
        ctx.wrap(torch.jit._trace, "_check_trace", fw.checking_trace)
    _install_excepthook(ctx)
    # a custom autograd Function's backward that fails on the bf16 its forward computed
    ctx.wrap(torch.autograd.function.BackwardCFunction, "apply", backward.apply)
    if hasattr(F, "_in_projection_packed"):
        ctx.wrap(F, "_in_projection_packed", attention.in_projection_packed)
    if runtime.run_cpus() is not None:
        # under the runner the main thread is pinned to one CPU: torch's warning about too many
        # DataLoader workers must count the run's CPUs, as it does without the runner
        from torch.utils.data import dataloader

        ctx.wrap(dataloader.DataLoader, "check_worker_number_rationality", runtime.with_run_cpus)
    if runtime.tuned_names(os.environ):
        # a process the script starts through subprocess: the run's CPUs, not the main thread's
        # one, and for any program but a bootstrapped Python none of the runner's OpenMP variables
        ctx.wrap(subprocess.Popen, "__init__", runtime.start_process_as_the_run)
    if config.malloc_reuse:
        _keep_freed_memory(ctx)
    loss.install()
    missing = replay.install(ctx)
    if config.fast_dropout:
        if missing:
            # a replayed forward would draw stock masks where its forward drew fast ones
            log_once(
                "fast-dropout-replay",
                "fast dropout masks off: activation checkpointing cannot be hooked on torch %s (%s)",
                torch.__version__,
                ", ".join(missing),
            )
        elif dropout.install():
            attention.install()
    for handle in (
        optimizer_mod.register_optimizer_step_pre_hook(discovery.step_pre),
        optimizer_mod.register_optimizer_step_post_hook(discovery.step_post),
    ):
        ctx.add_hook(handle, "torch.optim.optimizer: global step hook (model search)")
    with lock:
        for plan in list(plans.values()):
            if plan.ipex and not plan.installed:
                plan.installed = True  # its forward never left: it is accelerated again
        if not ctx.applied_on_import:  # torch only now imported: no optimizer exists yet
            discovery.scan()


def _keep_freed_memory(ctx: engine.Context) -> None:
    done, what = malloc.keep_freed_memory()
    if done:
        ctx.on_undo(malloc.restore_defaults, what)
        state.malloc = what
    log_once("malloc-reuse", "%s" if done else "malloc left as it is: %s", what)


def _unpatch() -> None:
    with lock:
        state.config = None
        state.malloc = None
        for model, plan in list(plans.items()):
            if plan.installed:
                discovery.uninstall(model, plan)
            if not plan.ipex:
                del plans[model]
        discovery.reset()
        backward.forget()


def release_data_parallel() -> None:
    """Every model's plan lets go of its DDP wrapper (the process group is about to end)."""
    with lock:
        for plan in list(plans.values()):
            plan.ddp = None


def training_now() -> bool:
    """Whether a model is being trained at this moment (a loader iterated now feeds it)."""
    with lock:
        return discovery.training_now()


def measuring() -> bool:
    """Whether nanopatch is still measuring something for a model it trains (bf16 against
    fp32, channels-last against stock's layout, or compile="auto"'s eager and compiled steps):
    its steps are not yet the ones it chose."""
    with lock:
        return any(plan.trial is not None or plan.compile_trial is not None for plan in plans.values())


def describe() -> list[dict[str, Any]]:
    """One entry per model nanopatch found, and one per optimizer it accelerated nothing for,
    for ``nanopatch.status()``."""
    timings = attention.timings() or None
    with lock:
        current = list(plans.values())
        found = [plan.describe() for plan in current]
        for model, plan in zip(found, current, strict=True):
            # the shapes of attention without dropout timed in this process, where it ran in bf16
            model["attention_timings"] = timings if plan.amp_dtype is not None else None
        for entry in discovery.search.unaccelerated:
            found.append({"model": None, "optimizers": [entry["optimizer"]], "stock": entry["reason"]})
        return found


def self_checks() -> list[dict[str, Any]]:
    """The self-check probes run in this process (:mod:`.selfcheck`): which fast path, whether
    it agreed with stock, and why not."""
    return selfcheck.results()


def malloc_reuse() -> str | None:
    """What glibc's malloc was told to keep freed memory for reuse, while patched (None: left
    alone: another allocator, the user's own tuning, or the option off)."""
    return state.malloc


def hint(exc: BaseException) -> str | None:
    """What to tell a user whose script failed outside a model's forward on what nanopatch
    changed in it (the forward's own failures are rescued), or None: ``Tensor.view`` cannot
    flatten the channels-last weights nanopatch gave a model, or their gradients
    (``p.grad.view(-1)``, ``parameters_to_vector``); numpy has no bf16, and activations a hook
    kept from a model computing in bf16 are bf16 (``act.numpy()`` for a histogram)."""
    flat = rescue.view_error(exc)
    numpy = isinstance(exc, TypeError) and rescue.dtype_error(exc)
    if not (flat or numpy):
        return None
    with lock:
        current = [plan for plan in plans.values() if plan.stock is None]
        names = sorted({p.name for p in current if (p.rank is not None if flat else p.amp_dtype is not None)})
    if not names:
        return None
    if flat:
        return (
            f"nanopatch: {', '.join(names)} trains with channels-last weights and gradients (faster "
            "convolutions), and Tensor.view cannot flatten them: .reshape(-1) and .contiguous() work on "
            "both layouts, or turn channels-last off to keep stock's strides (--no-channels-last, "
            "patch_torch(channels_last=False) or NANOPATCH_CHANNELS_LAST=0)"
        )
    return (
        f"nanopatch: {', '.join(names)} computes in bf16 (bf16 autocast, as torch.autocast would), so "
        "the activations a hook keeps are bf16, which numpy lacks: .float().numpy() works on both, or "
        "turn bf16 off to compute in fp32 (--no-bf16, patch_torch(bf16=False) or NANOPATCH_BF16=0)"
    )


def explain(exc: BaseException) -> str | None:
    """:func:`hint` for ``exc``, added to it as a note shown under its traceback (Python >= 3.11;
    once), or None; never raises (the script's own error is what counts)."""
    try:
        note = hint(exc)
        if note is not None and hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        return note
    except Exception:
        return None


def _install_excepthook(ctx: engine.Context) -> None:
    """A script that dies on what nanopatch changed (outside the forward) is told so. Undone
    only where the hook is still ours: one the script or a library (rich's tracebacks) set
    meanwhile stays."""
    previous = sys.excepthook
    ours = _excepthook_over(previous)
    sys.excepthook = ours

    def undo() -> None:
        if sys.excepthook is ours:
            sys.excepthook = previous

    ctx.on_undo(undo, "sys.excepthook: nanopatch's line under an error it caused")


def _excepthook_over(previous: Any) -> Any:
    """``sys.excepthook`` while patched: a script that calls ``patch_torch()`` itself and dies on
    what nanopatch changed gets :func:`hint`'s line under its traceback, as under the runner."""

    def excepthook(kind: type, value: BaseException, traceback: Any) -> None:
        note = explain(value)
        previous(kind, value, traceback)
        if note is not None and not hasattr(value, "add_note"):  # Python 3.10: no notes
            print(note, file=sys.stderr)

    return excepthook


def summary() -> list[str]:
    """What training ran with, one line per model or unaccelerated optimizer."""
    with lock:
        lines = [plan.summary() for plan in list(plans.values())]
        lines.extend(f"{e['optimizer']}: no model accelerated ({e['reason']})" for e in discovery.search.unaccelerated)
        return lines
