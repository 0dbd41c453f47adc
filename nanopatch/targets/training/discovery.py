"""Finding the model an optimizer trains, wherever its training forward runs.

Every optimizer nanopatch knows of (built while patched: ``Optimizer.__init__`` is wrapped;
built before: found when patching starts) is *pending* until a module that holds its
parameters is called in grad mode. While any optimizer is pending, a global forward pre-hook
watches module calls; the first (so the outermost) module called in grad mode that holds
parameters of a pending optimizer is paired with it and accelerated, starting with that very
call. This finds the model in a plain loop, inside ``optimizer.step(closure)`` (Lightning,
LBFGS-style), through an outer module's method (a LightningModule's ``training_step`` calling
``self.model(x)``), in modules that are never ``.train()``-ed, and with optimizers wrapped by
a framework (their ``step`` ends in the real optimizer's).

An optimizer's search ends after its first ``step`` returns: if by then nanopatch
accelerated no model for it, it says so once with a :class:`~nanopatch.NanopatchWarning`
(and ``status()`` lists it). A paired model whose accelerated forward stops running in
training (the script calls it some other way) is reported the same way.

nanopatch's optimizer hooks are global ones registered once while patched, and they never
add or remove hooks while torch iterates over them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nanopatch.engine import config as config_mod
from nanopatch.foundation.log import log_once, warn_once

from . import amp, compile_choice, dropout, frozen, ipex, optim, rescue, selfcheck
from . import forward as fw
from . import memory_format as mf
from .plan import Plan, compiling, config, context, data_parallel, local, lock, plans, tls, trial_for

logger = logging.getLogger("nanopatch")

#: steps an optimizer may take without its paired model's forward running before nanopatch says so
SILENT_STEPS = 3


@dataclasses.dataclass(eq=False)
class _Pending:
    optimizer: weakref.ref
    params: set[int]  # ids of the optimizer's parameters no accelerated model holds yet


@dataclasses.dataclass(eq=False)
class _Watch:
    """A searched optimizer: its plans, and how their training calls moved between steps."""

    name: str
    plans: list[Any] = dataclasses.field(default_factory=list)  # weakrefs to Plan objects
    calls: int = 0
    silent_steps: int = 0


@dataclasses.dataclass(eq=False)
class Search:
    """The optimizer search's state: what is still unpaired, what was watched and found, and the
    global forward hooks it runs while an optimizer waits for its model. One object, so that one
    :func:`reset` forgets it (at unpatch) and a reader sees every piece of it here."""

    #: every optimizer seen, kept across unpatch
    optimizers: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet)
    #: id(optimizer) -> what is still unpaired of it
    pending: dict[int, _Pending] = dataclasses.field(default_factory=dict)
    #: optimizer -> _Watch
    watched: weakref.WeakKeyDictionary = dataclasses.field(default_factory=weakref.WeakKeyDictionary)
    #: optimizers whose search found nothing to accelerate
    unaccelerated: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: model made channels-last for DDP -> its journal entry
    converted: weakref.WeakKeyDictionary = dataclasses.field(default_factory=weakref.WeakKeyDictionary)
    #: optimizer -> (bf16, rank): IPEX applied before training
    ahead: weakref.WeakKeyDictionary = dataclasses.field(default_factory=weakref.WeakKeyDictionary)
    #: the journal's entries for the global forward hooks while searching
    hooks: list[Any] = dataclasses.field(default_factory=list)
    #: hook entries the journal let go of at unpatch, removed after the last call
    outlived: list[Any] = dataclasses.field(default_factory=list)
    #: optimizer -> id of the state dict whose layout was last matched to the weights
    states: weakref.WeakKeyDictionary = dataclasses.field(default_factory=weakref.WeakKeyDictionary)
    #: discovered calls running now, in every thread
    inflight: int = 0
    #: removals put off while torch iterates its hooks (see _discover_post)
    later: list[Any] = dataclasses.field(default_factory=list)


search = Search()


@contextlib.contextmanager
def busy():
    """Optimizers and module calls made by nanopatch itself (IPEX builds some) are not the
    user's: they are ignored while this is held."""
    local.busy = tls("busy", 0) + 1
    try:
        yield
    finally:
        local.busy -= 1


# --- what a pairing does --------------------------------------------------------------


def _name(module: nn.Module) -> str:
    return type(module).__name__


def inner(module: nn.Module) -> nn.Module:
    """The user's model inside a (Distributed)DataParallel wrapper."""
    if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return module.module
    return module


def _param_ids(module: nn.Module) -> set[int]:
    return {id(p) for p in module.parameters()}


def optimizer_params(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def _stock_reason(module: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why this model must run stock, or None."""
    if isinstance(optimizer, torch.optim.LBFGS):
        return "LBFGS re-evaluates the loss in its line search; bf16 would change it"
    first = next(module.parameters(), None)
    if first is not None and first.device.type != "cpu":
        return f"its parameters are on {first.device.type}"
    return None


def _inside_paired(module: nn.Module) -> bool:
    for model, plan in list(plans.items()):
        if plan.installed and model is not module and any(sub is module for sub in model.modules()):
            return True
    return False


def pair(module: nn.Module, optimizer: torch.optim.Optimizer) -> Plan | None:
    """Pair ``module`` with ``optimizer`` (lock held); returns its plan, or None when the
    module is part of a model that already is. A newly paired model is accelerated by
    :func:`set_up`, which its caller runs once the lock is released."""
    plan = plans.get(module)
    _watch(optimizer)
    if plan is not None and (plan.installed or plan.setup):
        if type(optimizer).__name__ not in plan.optimizers:
            plan.optimizers.append(type(optimizer).__name__)
        if plan.installed:
            _fast_step(plan, optimizer)
        else:
            plan.setup.append(optimizer)
        _watch(optimizer, plan)
        return plan
    if _inside_paired(module):
        return None
    if plan is None:
        plan = Plan(name=_name(module))
        plans[module] = plan
    plan.optimizers.append(type(optimizer).__name__)
    _watch(optimizer, plan)
    reason = _stock_reason(module, optimizer)
    if reason is not None:
        plan.stock = reason
        log_once("stock", "%s runs stock: %s", plan.name, reason, about=module)
        return plan
    plan.setup.append(optimizer)
    return plan


def set_up(module: nn.Module, plan: Plan) -> None:
    """Accelerate a newly paired model, without the lock: ``ipex.optimize`` takes time, and
    wrapping the model in DDP is a collective that waits for every process. A concurrent
    unpatch wins: what was set up is undone."""
    with lock:
        optimizers, plan.setup = plan.setup, []
        cfg = config()
    if not optimizers or cfg is None:
        return
    with busy():
        try:
            _accelerate(module, inner(module), optimizers[0], plan, cfg)
            with lock:
                for optimizer in optimizers[1:]:
                    _fast_step(plan, optimizer)
                if config() is None:  # unpatched meanwhile
                    uninstall(module, plan)
        except Exception as exc:
            with lock:
                uninstall(module, plan)
                plan.stock = f"nanopatch failed to set it up ({type(exc).__name__}: {exc})"
            log_once("stock", "%s runs stock: %s", plan.name, plan.stock, level=logging.WARNING, about=module)


def ipex_ahead(model: nn.Module, optimizer: Any, bf16: bool) -> str | None:
    """``ipex.optimize`` a model (a whole LightningModule, say) and its optimizer before
    training starts, for a framework that will run the forward inside ``optimizer.step(closure)``
    where the search cannot apply IPEX. The model the search pairs with the optimizer later is
    then taken as IPEX's. Returns why IPEX was not applied, or None."""
    lib = ipex.load()
    if lib is None:
        return "IPEX cannot be loaded"
    why = ipex.why_not(model, optimizer, lib, bf16)
    if why is not None:
        return why
    if not selfcheck.ipex_ok(optimizer, bf16):
        return "IPEX failed nanopatch's self-check on this torch"
    rank = mf.channels_last_rank(model)  # before IPEX swaps its convolutions for its own modules
    ipex.optimize(model, optimizer, bf16)
    with lock:
        search.ahead[optimizer] = (bf16, rank)
    return None


def _accelerate(module: nn.Module, model: nn.Module, optimizer: Any, plan: Plan, cfg: Any) -> None:
    # (IPEX's bf16 weights, where it was applied ahead, are not the script's)
    bf16 = bool(cfg.bf16) and (optimizer in search.ahead or not _chosen_dtypes(module, model, plan))
    planned_rank = mf.channels_last_rank(model) if cfg.channels_last else None
    if not selfcheck.forward_ok(torch.bfloat16 if bf16 else None, planned_rank):
        plan.stock = f"nanopatch's accelerated forward failed its self-check on torch {torch.__version__}"
        log_once("stock", "%s runs stock: %s", plan.name, plan.stock, level=logging.WARNING, about=module)
        return
    if optimizer in search.ahead:  # IPEX applied before training (the weights are IPEX's, bf16 ones included)
        ahead_bf16, rank = search.ahead[optimizer]
        plan.ipex = True
        plan.amp_dtype = torch.bfloat16 if ahead_bf16 else None
        if cfg.channels_last:  # IPEX laid the weights out; the inputs follow
            plan.rank = rank
    if cfg.channels_last and not plan.ipex:
        _channels_last(module, model, plan, cfg)
    if cfg.ipex and not plan.ipex:
        _try_ipex(module, model, optimizer, plan, bf16)
    if not plan.ipex:
        _fast_step(plan, optimizer)
    keep = plan.ipex and plan.amp_dtype is not None  # IPEX bf16 weights need autocast
    plan.amp_dtype = torch.bfloat16 if bf16 or keep else None
    plan.amp_eval = bool(cfg.bf16_eval)
    if plan.amp_dtype is not None and not plan.ipex:
        first = next((p for p in model.parameters() if p.dtype == torch.float32), None)
        plan.weight = weakref.ref(first) if first is not None else None
    plan.compile_mode = cfg.compile
    if cfg.compile == config_mod.COMPILE_AUTO:
        compile_choice.start(plan, model)
    plan.frozen = frozen.Copies(model) if plan.amp_dtype is not None and not plan.ipex else None
    plan.masks = bool(cfg.fast_dropout) and dropout.installed()  # compiled graphs too: compiled_masks
    if plan.masks:
        plan.masks = selfcheck.fast_dropout_ok(plan.amp_dtype)
    plan.stock = None
    layout = _data_parallel(module, model, optimizer, plan, plan.layout is not None and layout_measured(cfg, plan))
    wrapper = module if isinstance(module, nn.parallel.DistributedDataParallel) else None
    plan.trial = trial_for(
        model,
        bf16=plan.amp_dtype is not None and measured(cfg) and not plan.ipex,
        layout=_relayout(model, plan.rank, wrapper) if layout else None,
    )
    if plan.trial is not None and plan.trial.relayout is not None and wrapper is not None:
        plan.trial.between = functools.partial(mf.record_order, wrapper)
    agree = _ranks_max(plan.ddp if plan.ddp is not None else module, whole_group=plan.ddp_later is not None)
    if plan.trial is not None and agree is not None:
        plan.trial.agree = _slowest(agree)
    if cfg.compile == config_mod.COMPILE_AUTO and agree is not None:
        compile_choice.agree_ranks(plan, agree)
    fw.install(module, plan)
    logger.info("accelerating %s: %s", plan.name, plan.describe())


def _channels_last(module: nn.Module, model: nn.Module, plan: Plan, cfg: Any) -> None:
    """Channels-last weights for a model with convolutions: nanopatch's own (``plan.layout``,
    which the trial may measure), given here or just before a DDP wrapper of the script's
    wrapped it; the user's own stay theirs."""
    rank = mf.channels_last_rank(model)
    ddp = isinstance(module, nn.parallel.DistributedDataParallel)
    if rank is not None and ddp and not _already(model, rank):
        # DDP laid its gradient buckets out for the strides the parameters had when it
        # wrapped them; where they differ, torch misplaces the averaged gradients' elements
        plan.notes.append(f"channels-last not applied: the model was already wrapped in {_name(module)}")
        rank = None
    if rank is None:
        return
    if not _already(model, rank):  # the user's own channels-last weights stay theirs
        plan.layout = mf.convert_model(model, rank, _holding)
    elif ddp and model in search.converted:  # nanopatch's, given just before the wrap
        stays = mf.buckets_stay(module)
        if stays is None:  # measured as its own, the buckets following
            plan.layout = search.converted.pop(model)
        elif cfg.sources.get("channels_last") == "auto":
            plan.notes.append(f"channels-last given before {_name(module)} wrapped it, not measured: {stays}")
    plan.rank = rank


def _data_parallel(module: nn.Module, model: nn.Module, optimizer: Any, plan: Plan, layout: bool) -> bool:
    """nanopatch's own DDP (``--nproc``) for the model, now, or once its layout is measured
    (``layout``: whether it is to be); returns whether it is."""
    parallel = data_parallel()
    if parallel is None:
        return layout
    if layout and parallel.defers(module, model):
        # it waits for the layout's decision: DDP lays its gradient buckets out for the strides
        # the weights have when it wraps them
        parallel.defer(model)
        plan.ddp_later = (weakref.ref(model), weakref.ref(optimizer))
        plan.notes.append(
            f"data-parallel over {parallel.world_size()} processes: gradients averaged before each step "
            "until channels-last is measured, then DistributedDataParallel"
        )
        return True
    _attach(plan, parallel, module, model, optimizer)
    return layout and plan.ddp is None


def _attach(plan: Plan, parallel: Any, module: nn.Module, model: nn.Module, optimizer: Any) -> None:
    """nanopatch's DDP wraps the model, as nanopatch's own doing (its ``DistributedDataParallel``
    hook must not give the weights channels-last again: their layout is decided already)."""
    with busy():
        plan.ddp = parallel.attach(module, model, optimizer)
    if plan.ddp is not None:
        plan.notes.append(f"data-parallel: DistributedDataParallel over {parallel.world_size()} processes")


def measured(cfg: Any) -> bool:
    """Whether bf16 is measured against fp32 on a model's first steps: when nanopatch chose bf16
    itself (an explicit ``bf16=True`` / ``NANOPATCH_BF16=1`` is honoured as asked), and not under
    ``compile=`` (flipping autocast would recompile the graph; ``compile="auto"`` measures bf16
    first, eagerly, and compile after)."""
    return cfg.sources.get("bf16") == "auto" and (not cfg.compile or cfg.compile == config_mod.COMPILE_AUTO)


def layout_measured(cfg: Any, plan: Plan) -> bool:
    """Whether channels-last is measured against stock's layout on a model's first steps (after
    the bf16 trial): where nanopatch chose it itself (``channels_last=True`` is honoured as
    asked) and gave the model its channels-last weights; not under ``compile=`` (new strides
    would recompile the graph; ``compile="auto"`` measures eagerly first), nor once nanopatch's
    own DDP (``--nproc``) wraps it (that waits for the decision instead). In a script's or
    Lightning's DDP wrapper the trial lays its gradient buckets out again at each switch."""
    compiles = cfg.compile and cfg.compile != config_mod.COMPILE_AUTO
    return cfg.sources.get("channels_last") == "auto" and not compiles and plan.ddp is None and not plan.ipex


def _ranks_max(module: Any, whole_group: bool = False) -> Callable[[list[float]], list[float]] | None:
    """For a model trained through ``DistributedDataParallel`` (nanopatch's own under
    ``--nproc``, the script's, Lightning's) over two processes or more: figures -> each one's
    largest over its ranks (an all-reduce over the wrapper's group), for the trials to decide
    the same on every rank from the slowest rank's step times. DDP's own all-reduces in every
    backward keep the ranks' steps in lock-step, so every rank calls it at the same steps.
    ``whole_group``: a model whose gradients nanopatch averages over the default group itself
    until its DDP wraps it. None for any other model."""
    if not whole_group and not isinstance(module, nn.parallel.DistributedDataParallel):
        return None
    import torch.distributed as dist

    group = None if whole_group else getattr(module, "process_group", None)
    try:
        if not dist.is_initialized() or dist.get_world_size(group) < 2:
            return None
    except Exception:  # a group this process is not in: nothing to agree on
        return None

    def largest(values: list[float]) -> list[float]:
        figures = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=group)
        return figures.tolist()

    return largest


def _slowest(agree: Callable[[list[float]], list[float]]) -> Callable[[float], float]:
    """A step time -> the slowest rank's (:func:`_ranks_max`), as :class:`.plan.Trial` asks."""

    def slowest(seconds: float) -> float:
        return agree([seconds])[0]

    return slowest


def _relayout(model: nn.Module, rank: int, wrapper: Any = None) -> Callable[[bool], None]:
    """The trial's switch between channels-last and stock's layout for ``model``: its weights,
    their gradients and the state of every optimizer holding them (nothing once it is gone),
    and the gradient buckets of the ``DistributedDataParallel`` (``wrapper``) it trains in
    (:func:`.memory_format.rebucket`; where they cannot follow, the weights go back and it
    raises: the trial measures no more layouts)."""
    ref = weakref.ref(model)
    wrapped = weakref.ref(wrapper) if wrapper is not None else None

    def switch(on: bool) -> None:
        model = ref()
        if model is None:
            return
        mf.relayout(model, rank, on, _holding(model))
        ddp = wrapped() if wrapped is not None else None
        if ddp is not None:
            try:
                mf.rebucket(ddp)
            except Exception:
                mf.relayout(model, rank, not on, _holding(model))  # the strides its buckets have
                raise

    return switch


def _holding(model: nn.Module) -> list[Any]:
    """The optimizers nanopatch has seen that hold any of ``model``'s parameters: their state
    follows the weights' layout."""
    params = {id(p) for p in model.parameters()}
    return [
        opt
        for opt in list(search.optimizers)
        if any(id(p) in params for group in getattr(opt, "param_groups", []) for p in group.get("params", []))
    ]


def _already(model: nn.Module, rank: int) -> bool:
    """Whether the model's convolution weights already have the channels-last strides."""
    fmt = mf.memory_format(rank)
    for sub in model.modules():
        weight = getattr(sub, "weight", None)
        if isinstance(sub, (nn.Conv2d, nn.Conv3d)) and isinstance(weight, torch.Tensor) and weight.dim() == rank:
            return weight.is_contiguous(memory_format=fmt) and not weight.is_contiguous()
    return False


def _chosen_dtypes(module: nn.Module, model: nn.Module, plan: Plan) -> bool:
    """Whether the script gave the model weights other than fp32 itself (bf16, fp16, fp64): it
    computes in them, without nanopatch's autocast (its notes and the log say so)."""
    why = amp.chosen_weight_dtypes(model)
    if why is None:
        return False
    plan.bf16_measured = f"off: {why}"
    plan.notes.append(f"bf16 autocast off: {why}; it computes in them")
    log_once("chosen-dtypes", "%s: %s", plan.name, plan.notes[-1], about=module)
    return True


def _try_ipex(module: nn.Module, model: nn.Module, optimizer: Any, plan: Plan, bf16: bool) -> None:
    lib = ipex.load()
    if lib is None:
        return
    if model is not module:
        why = f"the model is already wrapped in {_name(module)}"
    elif tls("stepping", 0):
        why = "the model was found inside optimizer.step(closure), where IPEX cannot replace the step"
    else:
        why = ipex.why_not(model, optimizer, lib, bf16)
        if why is None and not selfcheck.ipex_ok(optimizer, bf16):
            why = f"it failed nanopatch's self-check on torch {torch.__version__}"
    if why is not None:
        plan.notes.append(f"IPEX not used: {why}")
        log_once("ipex-skip", "%s: IPEX not used (%s); native path", plan.name, why, about=module)
        return
    ipex.optimize(model, optimizer, bf16)
    plan.ipex = True
    if bf16:
        plan.amp_dtype = torch.bfloat16


def _fast_step(plan: Plan, optimizer: Any) -> None:
    name, said = type(optimizer).__name__, {}

    def on_sparse(left: int) -> None:  # a group got sparse gradients: torch's default step for it
        with lock:
            old = said.get("note")
            now = f"{name}: {flag} step but for its groups with sparse gradients" if left else None
            plan.notes[:] = [now if n == old else n for n in plan.notes if n != old or now is not None]
            said["note"] = now

    flag = optim.use_fast_step(optimizer, on_sparse)
    if flag is not None:
        said["note"] = f"{name}: {flag} step"
        plan.fast_steps.append(weakref.ref(optimizer))
        plan.notes.append(said["note"])


def uninstall(module: nn.Module, plan: Plan) -> None:
    """Undo everything but IPEX. An IPEX bf16 model keeps a forward with autocast: its
    weights are bf16 and a plain fp32 forward would fail."""
    for ref in plan.fast_steps:
        opt = ref()
        if opt is not None:
            optim.restore_step(opt)
    plan.fast_steps.clear()
    plan.compiled = None
    plan.compile_trial = None
    plan.ddp = None
    plan.ddp_later = None
    plan.frozen = None  # the bf16 copies of its frozen weights go with it
    if plan.rank is not None and not plan.ipex:  # IPEX re-laid the weights out itself
        if isinstance(module, nn.parallel.DistributedDataParallel) and plan.layout is not None:
            # given at the wrap: undone at unpatch, on every rank (its buckets are laid out again)
            search.converted[inner(module)] = plan.layout
        elif plan.layout is not None:
            context().discard(plan.layout)
        plan.layout = None
        plan.rank = None
    if plan.ipex and plan.amp_dtype is not None:
        plan.compile_mode = False
        plan.installed = False
        fw.uninstall_submodules(plan)
        fw.keep(module)
        warn_once(
            "ipex-kept",
            f"{plan.name} was optimized by IPEX in bf16, which cannot be undone: after unpatch it "
            "keeps running under bf16 autocast (outputs in fp32)",
            about=module,
        )
        return
    fw.uninstall(module, plan)


# --- the search -----------------------------------------------------------------------


def optimizer_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``Optimizer.__init__``: the outermost call (an optimizer may build another) tracks it."""
    depth = tls("opt_depth", 0)
    local.opt_depth = depth + 1
    try:
        result = wrapped(*args, **kwargs)
    finally:
        local.opt_depth = depth
    if depth == 0 and not tls("busy", 0) and isinstance(instance, torch.optim.Optimizer):
        try:
            with lock:
                track(instance)
        except Exception:  # never break the user's optimizer
            logger.exception("nanopatch could not track %s; it runs stock", type(instance).__name__)
    return result


def ddp_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``DistributedDataParallel.__init__``: a model about to be wrapped for training gets
    channels-last first, because DDP lays its gradient buckets out for the strides the
    parameters have now (where they change later, DDP warns in every process and hands the
    averaged gradients back with their elements in the wrong places: whatever re-lays the
    weights out, the trial or the unpatch, lays the buckets out again,
    :func:`.memory_format.rebucket`)."""
    module = args[0] if args else kwargs.get("module")
    cfg = config()
    if cfg is not None and cfg.channels_last and not tls("busy", 0) and isinstance(module, nn.Module):
        try:
            with lock:
                rank = mf.channels_last_rank(module)
                trains = any(p.requires_grad for p in module.parameters())
                if rank is not None and trains and not _already(module, rank) and not _is_ipex(module):
                    search.converted[module] = mf.convert_model(module, rank, _holding, instance)
                    logger.info("%s: channels-last before DistributedDataParallel wraps it", _name(module))
        except Exception:
            logger.exception("nanopatch could not make %s channels-last; it keeps its layout", _name(module))
    return wrapped(*args, **kwargs)


def _is_ipex(module: nn.Module) -> bool:
    return any(plan.ipex for model, plan in list(plans.items()) if model is module or model is inner(module))


def track(optimizer: torch.optim.Optimizer) -> None:
    """Start searching for the model ``optimizer`` trains."""
    if config() is None or id(optimizer) in search.pending:
        return
    search.optimizers.add(optimizer)
    params = optimizer_params(optimizer)
    for model, plan in list(plans.items()):
        if plan.installed:
            covered = _param_ids(model) & params
            if covered:
                params -= covered
                pair(model, optimizer)
    if not params:
        return
    search.pending[id(optimizer)] = _Pending(weakref.ref(optimizer), params)
    _start()


def _match(module: nn.Module) -> Plan | None:
    """Pair ``module`` with every pending optimizer it holds parameters of."""
    ids = None
    plan = None
    for key, entry in list(search.pending.items()):
        optimizer = entry.optimizer()
        if optimizer is None:
            search.pending.pop(key, None)
            continue
        if ids is None:
            ids = _param_ids(module)
            if not ids:
                return None
        if entry.params & ids:
            plan = pair(module, optimizer) or plan
            entry.params -= ids
            if not entry.params:
                search.pending.pop(key, None)
    return plan


def _start() -> None:
    if search.hooks:
        return
    from torch.nn.modules import module as module_mod

    for handle in (
        module_mod.register_module_forward_pre_hook(_discover_pre),
        module_mod.register_module_forward_hook(_discover_post, always_call=True),
    ):
        search.hooks.append(context().add_hook(handle, "torch.nn.modules.module: global forward hook (model search)"))


def stop() -> None:
    """Remove the search's forward hooks (torch copies its hook dicts before iterating them,
    so this is safe even from inside a module call). While a discovered call runs, in any
    thread, its forward hook must still run after it (it leaves the autocast the pre-hook
    entered): the hooks go when the last such call ends. If unpatch comes first, the journal
    lets go of them (it would remove them now) and that call's hook removes them."""
    with lock:
        if search.inflight:
            if config() is None:
                for entry in search.hooks:
                    context().discard(entry, undo=False)
                search.outlived.extend(search.hooks)
                search.hooks.clear()
            return
        entries, search.hooks[:] = list(search.hooks), []
        outlived, search.outlived[:] = list(search.outlived), []
    for entry in entries:
        context().discard(entry)
    for entry in outlived:
        entry.undo()


def _discover_pre(module: nn.Module, args: tuple) -> tuple | None:
    """Global forward pre-hook while an optimizer is pending: pair the first module called in
    grad mode that holds its parameters, and accelerate this very call. Nothing while
    torch.compile traces a module's call (the hook would be traced into its graph)."""
    if compiling():
        return None
    _run_later()
    if not search.pending or tls("busy", 0) or tls("calls", []) or not torch.is_grad_enabled() or module in plans:
        return None
    try:
        with lock:
            plan = _match(module)
        if plan is not None and plan.setup and plans.get(module) is plan:
            set_up(module, plan)
    except Exception:
        logger.exception("nanopatch could not pair %s; it runs stock", type(module).__name__)
        return None
    if plan is None or not plan.installed or plan.stock is not None or plans.get(module) is not plan:
        return None
    # This call already fetched the class forward: run its hooks' part of the job here.
    rank = plan.layout_now()
    if rank is not None:
        args, _ = mf.convert_inputs(args, {}, rank)
        _convert_call_kwargs(rank)
    dtype = fw.amp_dtype(module, plan)
    context = fw.ours(dtype) if dtype is not None else None
    if context is not None:
        context.__enter__()
    parallel = data_parallel()
    ddp = plan.ddp if plan.ddp is not None and parallel.routes(plan.ddp, module) else None
    if ddp is not None:
        parallel.pre_forward(ddp)
    probe = fw.Probe().__enter__()
    # this call cannot be made again: ops that fail for nanopatch's changes are cured as they run
    guard = rescue.Rescue().__enter__() if (dtype is not None or rank is not None) and not plan.ipex else None
    tls("calls", []).append((module, context, dtype, plan, ddp, probe, guard))
    with lock:
        search.inflight += 1
    return args


def _convert_call_kwargs(rank: int) -> None:
    """Global pre-hooks see only the positional arguments; the keyword ones of this call are
    the ``kwargs`` dict of ``Module._call_impl`` (which calls this hook), converted in place."""
    try:
        frame = sys._getframe(2)  # the hook's caller: _call_impl, or a closure inside it
        if frame.f_code.co_filename != nn.modules.module.__file__:
            return
        kwargs = frame.f_locals.get("kwargs") if frame is not None else None
        if isinstance(kwargs, dict) and kwargs:
            kwargs.update(mf.convert_inputs((), kwargs, rank)[1])
    except Exception:  # only this first call's layout is at stake
        logger.debug("nanopatch could not convert this call's keyword inputs", exc_info=True)


def _forward_raised() -> bool:
    """Whether :func:`_discover_post` runs in torch's exception path: called by
    ``Module._call_impl`` itself (the normal path calls hooks from its ``inner`` closure) while
    an exception is handled. An exception some outer frame of the user's handles (a training
    call inside an ``except`` block) is not this call's."""
    try:
        code = sys._getframe(2).f_code  # 0: here, 1: _discover_post, 2: its caller
    except ValueError:
        return False
    return (
        code.co_name == "_call_impl"
        and code.co_filename == nn.modules.module.__file__
        and sys.exc_info()[0] is not None
    )


def _discover_post(module: nn.Module, args: tuple, result: Any) -> Any:
    if compiling():
        return None
    calls = tls("calls", [])
    if not calls or calls[-1][0] is not module:
        return None
    _, context, dtype, plan, ddp, probe, guard = calls.pop()
    if guard is not None:
        guard.__exit__(None, None, None)
    # When the forward raised, torch runs this hook while iterating its global hook dict itself
    # (its normal path iterates a copy): removing a hook now would replace the user's exception
    # with "OrderedDict mutated during iteration". The removals wait for the next safe point.
    handling = _forward_raised()
    if handling:
        search.later.append(lambda: probe.__exit__(None, None, None))
    else:
        probe.__exit__(None, None, None)
    if context is not None:
        context.__exit__(None, None, None)
    with lock:
        search.inflight -= 1
        last = not search.inflight and (not search.pending or config() is None)
    if last:
        if handling:
            search.later.append(stop)
        else:
            stop()
    if ddp is not None and result is not None:
        result = data_parallel().post_forward(ddp, result)
    if module.training and torch.is_grad_enabled() and not handling:  # a call that raised is not observed
        fw.observe(plan, probe, dtype)
    if guard is not None and not handling:
        fw.rescued(module, plan, guard)
    if context is None or result is None:
        return result if ddp is not None else None
    return fw.finish(module, plan, result, dtype)


# --- the optimizer's steps ------------------------------------------------------------


def _watch(optimizer: Any, plan: Plan | None = None) -> None:
    watch = search.watched.get(optimizer)
    if watch is None:
        watch = search.watched[optimizer] = _Watch(type(optimizer).__name__)
    if plan is not None and not any(ref() is plan for ref in watch.plans):
        watch.plans.append(weakref.ref(plan))


def step_pre(optimizer: Any, args: tuple, kwargs: dict) -> None:
    local.stepping = tls("stepping", 0) + 1
    _run_later()
    _state_follows_weights(optimizer)


def _state_follows_weights(optimizer: Any) -> None:
    """Before the first step of a watched optimizer, and the first after each
    ``load_state_dict`` (which puts a new ``state`` dict in place: one identity check a step),
    its state tensors get their weights' strides (:func:`.memory_format.match_state_layout`): a
    checkpoint's state laid out as another run's weights were would be misread by a fused step."""
    state = getattr(optimizer, "state", None)
    watch = search.watched.get(optimizer)
    if state is None or watch is None or search.states.get(optimizer) == id(state):
        return
    try:
        search.states[optimizer] = id(state)  # a new state dict exists before the old one goes: ids differ
        if not any(plan is not None and plan.ipex for plan in (ref() for ref in watch.plans)):
            mf.match_state_layout(optimizer)  # IPEX lays its own weights and state out
    except Exception:  # never break the user's step
        logger.exception("nanopatch could not check %s's state", type(optimizer).__name__)


def _run_later() -> None:
    """The hook removals put off by :func:`_discover_post` (torch copies its hooks before it
    iterates them here)."""
    while search.later:
        search.later.pop(0)()


def step_post(optimizer: Any, args: tuple, kwargs: dict) -> None:
    local.stepping = max(0, tls("stepping", 0) - 1)
    if config() is None or tls("busy", 0):
        return
    try:
        with lock:
            if id(optimizer) in search.pending:
                _conclude(optimizer)
            watch = search.watched.get(optimizer)
            if watch is not None and watch.plans:
                _check_running(optimizer, watch)
                for plan in (ref() for ref in watch.plans):
                    if plan is not None and plan.layout_unsafe is not None and plan.rank is not None:
                        _layout_off_unsafe(plan)
                    if plan is not None and plan.trial is not None:
                        plan.trial.on_step(plan)
                        if plan.trial is None and plan.ddp_later is not None:
                            _wrap_now(plan)
                    elif plan is not None and plan.compile_trial is not None:
                        plan.compile_trial.on_step(plan)  # after the bf16 trial: it measures eager steps
                    if plan is not None:
                        plan.odd_step = False  # read by the trial of this step, if any
    except Exception:  # never break the user's step
        logger.exception("nanopatch could not check %s's step", type(optimizer).__name__)


def _layout_off_unsafe(plan: Plan) -> None:
    """Channels-last off for a model whose forward failed in it (:mod:`.rescue`): its weights,
    their gradients and the optimizer's state in stock's layout again, its DDP buckets with
    them; a layout trial measures bf16 alone from here. Where the switch fails, the calls keep
    going through the rescue."""
    module = next((m for m, p in list(plans.items()) if p is plan), None)
    if module is None:
        return
    wrapper = module if isinstance(module, nn.parallel.DistributedDataParallel) else plan.ddp
    try:
        _relayout(inner(module), plan.rank, wrapper)(False)
    except Exception as exc:
        logger.warning("%s: channels-last could not be switched off (%s); views keep copying", plan.name, exc)
        return  # the rescue stays on for its calls
    trial = plan.trial
    if trial is not None and trial.relayout is not None:
        trial.out.update(mode for mode in trial.modes if mode[1])
        trial.mode = (trial.mode[0], False)
        trial.relayout = None
    plan.layout_off()
    plan.layout_measured = f"off: {plan.layout_unsafe}"
    plan.notes.append(f"channels-last off: {plan.layout_unsafe}")
    logger.info("%s: %s", plan.name, plan.notes[-1])


def _wrap_now(plan: Plan) -> None:
    """The trial decided the layout: nanopatch's DDP wraps the model now, its buckets laid out
    for the weights' strides (every rank decides at the same step: a collective)."""
    model, optimizer = (ref() for ref in plan.ddp_later)
    plan.ddp_later = None
    parallel = data_parallel()
    if model is None or optimizer is None or parallel is None:
        return
    _attach(plan, parallel, model, model, optimizer)


def _conclude(optimizer: Any) -> None:
    """The optimizer took its first step: the search for its model ends here."""
    entry = search.pending.pop(id(optimizer), None)
    if not search.pending:
        stop()
    if entry is None:
        return
    watch = search.watched.get(optimizer)
    live = [plan for plan in (ref() for ref in (watch.plans if watch else [])) if plan is not None]
    accelerated = [plan for plan in live if plan.stock is None]
    if accelerated:
        if entry.params != optimizer_params(optimizer):
            log_once(
                "partly",
                "%s: %d of its parameters belong to no module called in grad mode; they train as they are",
                type(optimizer).__name__,
                len(entry.params),
                about=optimizer,
            )
        return
    if not _anything_to_do():
        return
    name = type(optimizer).__name__
    if live:
        why = f"its model {live[0].name} runs stock: {live[0].stock}"
        advice = "nothing to do if that is intended; otherwise see the reason"
    else:
        why = "no module holding its parameters was called (through model(...)) in grad mode before its first step"
        advice = (
            "call the model as model(inputs), not model.forward(inputs) or a functional call, "
            "or switch the patch off for this script (training=False)"
        )
    search.unaccelerated.append({"optimizer": name, "reason": why})
    warn_once("unaccelerated", f"nanopatch accelerated no model for {name}: {why}; {advice}", about=optimizer)


def _check_running(optimizer: Any, watch: _Watch) -> None:
    """Say once when the accelerated forwards of this optimizer's models stop running in
    training (the script calls its model some other way)."""
    live = [plan for plan in (ref() for ref in watch.plans) if plan is not None and plan.stock is None]
    if not live:
        return
    calls = sum(plan.seen.training_calls for plan in live)
    if calls != watch.calls:
        watch.calls = calls
        watch.silent_steps = 0
        return
    watch.silent_steps += 1
    if watch.silent_steps == SILENT_STEPS:
        names = ", ".join(plan.name for plan in live)
        why = f"the accelerated forward of {names} did not run in the last {SILENT_STEPS} steps of {watch.name}"
        search.unaccelerated.append({"optimizer": watch.name, "reason": why})
        warn_once(
            "silent",
            f"nanopatch: {why}; the model is trained through another path (e.g. model.forward(...) "
            "called directly, or a compiled copy), which runs stock",
            about=optimizer,
        )


def _anything_to_do() -> bool:
    cfg = config()
    return cfg is not None and bool(cfg.bf16 or cfg.channels_last or cfg.ipex or cfg.compile)


def scan() -> None:
    """Track the optimizers that exist already (built before patching, or before this
    ``patched()`` region)."""
    import gc

    classes, todo = {torch.optim.Optimizer}, [torch.optim.Optimizer]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in classes:
                classes.add(sub)
                todo.append(sub)
    # An instance of a class defined in Python refers to its class, so the collector's own walk
    # finds them (in C: several times faster than testing every object, on each patched()).
    for obj in gc.get_referrers(*classes):
        if type(obj) in classes:  # type(): no __class__ lookup on proxies
            search.optimizers.add(obj)
    for optimizer in list(search.optimizers):
        track(optimizer)


def reset() -> None:
    """Forget the search (at unpatch)."""
    search.pending.clear()
    _run_later()
    stop()
    search.watched.clear()
    search.states.clear()
    search.unaccelerated.clear()
    for change in list(search.converted.values()):
        context().discard(change)
    search.converted.clear()


def training_now() -> bool:
    """Whether a model is being trained at this moment: grad on, and a found model in
    training mode (or, before any is found, an optimizer waiting for its model)."""
    if not torch.is_grad_enabled():
        return False
    models = [m for m, plan in list(plans.items()) if plan.installed or plan.stock is not None]
    if models:
        return any(m.training for m in models)
    return bool(search.pending)
