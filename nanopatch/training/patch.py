"""The ``training`` patch target: find the model a script trains and accelerate it.

Two hooks find models and optimizers without edits to the script:

* ``torch.optim.Optimizer.__init__`` (every optimizer, including other libraries' subclasses,
  reaches it through ``super().__init__``) records each new optimizer as *pending*;
* ``torch.nn.Module.train`` (outermost call only, not the recursion into children) pairs the
  module with every pending optimizer whose parameters it holds. A script that builds its
  optimizer after ``model.train()``, or never calls ``.train()``, is caught by a global
  forward pre-hook that lives only while an optimizer is pending: the first module called
  in grad mode that holds the optimizer's parameters is paired, and that very call already
  runs accelerated. An optimizer's first ``step()`` ends the search for it.

A paired model gets, in this order: channels-last (if it has 2-D/3-D convolutions), IPEX
``optimize`` together with its optimizer (when IPEX is installed, matches torch, and can fuse
that optimizer) or else torch's fused/foreach optimizer step, and an instance-level
``forward`` (:class:`AcceleratedForward`) that converts 4-D inputs to channels-last, runs the
model's own forward under bf16 autocast (optionally ``torch.compile``-d) and casts the
floating outputs back to fp32. Everything but IPEX is undone by :func:`unpatch`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading
import weakref
from typing import Any

import torch
from torch import nn

from .. import _patching, distributed
from .._log import log_once, warn_once
from . import amp, ipex, optim
from . import memory_format as mf

logger = logging.getLogger("nanopatch")

#: torch versions this target is written against (module hooks with always_call, autocast on CPU).
SUPPORTED = {"torch": ">=2.1"}

_lock = threading.RLock()
_local = threading.local()

_config: Any = None  # the active nanopatch Config while patched
_optimizers: weakref.WeakSet = weakref.WeakSet()  # every optimizer seen, kept across unpatch
_pending: dict[int, _Pending] = {}  # id(optimizer) -> what is still unpaired of it
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> Plan
_discovery: list[Any] = []  # handles of the global forward hooks while searching
_scanned = False


def _tls(name: str, default: Any) -> Any:
    if not hasattr(_local, name):
        setattr(_local, name, default)
    return getattr(_local, name)


@contextlib.contextmanager
def _busy():
    """Optimizers and ``.train()`` calls made by nanopatch itself (IPEX builds some) are not
    the user's: they are ignored while this is held."""
    _local.busy = _tls("busy", 0) + 1
    try:
        yield
    finally:
        _local.busy -= 1


# --- per-model state ------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Plan:
    """What nanopatch did to one model, and how its forward runs."""

    name: str
    amp_dtype: torch.dtype | None = None  # bf16 autocast dtype, None = off
    amp_eval: bool = True
    rank: int | None = None  # channels-last rank (4 or 5) applied, None = untouched
    ipex: bool = False  # IPEX-optimized (cannot be undone)
    compile_mode: str | bool = False
    compiled: Any = None
    optimizers: list[str] = dataclasses.field(default_factory=list)
    fast_steps: list[Any] = dataclasses.field(default_factory=list)  # weakrefs to optimizers we switched
    stock: str | None = None  # why this model runs stock, if it does
    notes: list[str] = dataclasses.field(default_factory=list)
    installed: bool = False
    previous_forward: Any = _patching.NOTSET
    ddp: Any = None  # the DistributedDataParallel wrapper its training steps go through

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "optimizers": list(self.optimizers),
            "bf16": self.amp_dtype is not None,
            "bf16_eval": self.amp_dtype is not None and self.amp_eval,
            "channels_last": {None: False, 4: "channels_last", 5: "channels_last_3d"}[self.rank],
            "ipex": self.ipex,
            "compile": self.compile_mode,
            "data_parallel": self.ddp is not None,
            "stock": self.stock,
            "notes": list(self.notes),
        }


class AcceleratedForward:
    """The ``forward`` nanopatch installs on a paired model instance.

    It calls the model's own forward (the class's, or an instance-level one that was there
    before) and is transparent to ``inspect.signature`` (``__wrapped__``). It holds the model
    itself, so ``copy.deepcopy`` and pickling give a copy whose forward calls the copy."""

    def __init__(self, module: nn.Module, plan: Plan) -> None:
        self.module = module
        self.plan = plan

    def __getstate__(self) -> dict[str, Any]:
        plan = dataclasses.replace(self.plan, compiled=None, fast_steps=[], ddp=None)
        return {"module": self.module, "plan": plan}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A deep copy or an unpickled model: accelerated like the original while patched,
        # and undone with the rest; a plain pass-through forward otherwise.
        self.module = state["module"]
        self.plan = state["plan"]
        with _lock:
            if _config is not None and self.plan.stock is None:
                _plans[self.module] = self.plan
            elif not self.plan.ipex:
                self.plan.stock = "restored while nanopatch was not patched"

    @property
    def __wrapped__(self) -> Any:
        return self.original()

    def original(self) -> Any:
        previous = self.plan.previous_forward
        if previous is not _patching.NOTSET:
            return previous
        return type(self.module).forward.__get__(self.module)

    def __repr__(self) -> str:
        return f"<nanopatch accelerated forward of {self.original()!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plan = self.plan
        forward = self.original()
        if plan.stock is not None:
            return forward(*args, **kwargs)
        if plan.rank is not None:
            args, kwargs = mf.convert_inputs(args, kwargs, plan.rank)
        dtype = _amp_dtype(self.module, plan)
        if plan.compile_mode and _config is not None:
            forward = _compiled(self.module, plan, forward)
        if plan.ddp is not None and distributed.routes(plan.ddp, self.module):
            forward = distributed.through(plan.ddp, forward)
        if dtype is None:
            return forward(*args, **kwargs)
        with amp.autocast(dtype):
            out = forward(*args, **kwargs)
        return _finish(self.module, plan, out, dtype)


def _amp_dtype(module: nn.Module, plan: Plan) -> torch.dtype | None:
    """The autocast dtype for this call, or None: off, eval mode without ``bf16_eval``, or
    an autocast already on (the user's own, or an outer model of ours)."""
    if plan.amp_dtype is None or amp.autocast_enabled():
        return None
    if not module.training and not plan.amp_eval and not plan.ipex:
        return None  # an IPEX bf16 model has bf16 weights: it needs autocast in eval too
    return plan.amp_dtype


def _finish(module: nn.Module, plan: Plan, out: Any, dtype: torch.dtype) -> Any:
    try:
        return amp.to_fp32(out, dtype)
    except amp.Uncastable as exc:
        if not plan.ipex:
            plan.amp_dtype = None
            plan.notes.append(f"bf16 autocast off: its forward returns {exc}, which nanopatch cannot cast to fp32")
        log_once(
            f"uncastable-{id(module)}",
            "%s returns %s, which nanopatch cannot cast back to fp32; %s",
            plan.name,
            exc,
            "bf16 autocast is off for it from now on"
            if not plan.ipex
            else "its outputs may hold bf16 tensors (IPEX bf16 needs autocast)",
            level=logging.WARNING,
        )
        return out


def _compiled(module: nn.Module, plan: Plan, forward: Any) -> Any:
    """``forward`` compiled with the plan's mode, falling back to eager (said once) when
    compiling fails."""
    if plan.compiled is None:
        try:
            plan.compiled = torch.compile(forward, mode=None if plan.compile_mode == "default" else plan.compile_mode)
        except Exception as exc:
            _compile_failed(module, plan, exc)
            return forward
    compiled = plan.compiled

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled(*args, **kwargs)
        except Exception as exc:
            try:
                result = forward(*args, **kwargs)
            except Exception:
                raise exc from None  # the model's own error: raised as eager raises it
            _compile_failed(module, plan, exc)
            return result

    return run


def _compile_failed(module: nn.Module, plan: Plan, exc: BaseException) -> None:
    plan.compile_mode = False
    plan.compiled = None
    plan.notes.append(f"torch.compile failed ({type(exc).__name__}); eager")
    warn_once(
        f"compile-{id(module)}",
        f"torch.compile of {plan.name} failed ({type(exc).__name__}: {exc}); it runs eagerly",
        stacklevel=3,
    )


# --- pairing --------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Pending:
    optimizer: weakref.ref
    params: set[int]  # ids of the optimizer's parameters no paired model holds yet
    step_hook: Any = None


def _name(module: nn.Module) -> str:
    return type(module).__name__


def _inner(module: nn.Module) -> nn.Module:
    """The user's model inside a (Distributed)DataParallel wrapper."""
    if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return module.module
    return module


def _param_ids(module: nn.Module) -> set[int]:
    return {id(p) for p in module.parameters()}


def _optimizer_params(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def _stock_reason(module: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why this model must run stock, or None."""
    if isinstance(optimizer, torch.optim.LBFGS):
        return "LBFGS re-evaluates the loss in its line search; bf16 would change it"
    first = next(module.parameters(), None)
    if first is not None and first.device.type != "cpu":
        return f"its parameters are on {first.device.type}"
    for sub in module.modules():
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.sparse:
            return f"{_name(sub)}(sparse=True) makes sparse gradients"
    return None


def _inside_paired(module: nn.Module) -> bool:
    for model, plan in list(_plans.items()):
        if plan.installed and model is not module and any(sub is module for sub in model.modules()):
            return True
    return False


def _pair(module: nn.Module, optimizer: torch.optim.Optimizer) -> Plan | None:
    """Accelerate ``module`` (trained by ``optimizer``); returns its plan, or None when the
    module is part of a model that already is."""
    plan = _plans.get(module)
    if plan is not None and plan.installed:
        if type(optimizer).__name__ not in plan.optimizers:
            plan.optimizers.append(type(optimizer).__name__)
        _fast_step(plan, optimizer)
        return plan
    if _inside_paired(module):
        return None
    config = _config
    if plan is None:
        plan = Plan(name=_name(module))
        _plans[module] = plan
    plan.optimizers.append(type(optimizer).__name__)
    reason = _stock_reason(module, optimizer)
    if reason is not None:
        plan.stock = reason
        log_once(f"stock-{id(module)}", "%s runs stock: %s", plan.name, reason)
        return plan
    inner = _inner(module)
    with _busy():
        try:
            _accelerate(module, inner, optimizer, plan, config)
        except Exception as exc:
            _uninstall(module, plan)
            plan.stock = f"nanopatch failed to set it up ({type(exc).__name__}: {exc})"
            log_once(f"stock-{id(module)}", "%s runs stock: %s", plan.name, plan.stock, level=logging.WARNING)
            return plan
    return plan


def _accelerate(module: nn.Module, inner: nn.Module, optimizer: Any, plan: Plan, config: Any) -> None:
    bf16 = bool(config.bf16)
    if config.channels_last and not plan.ipex:
        rank = mf.channels_last_rank(inner)
        if rank is not None and inner is not module:
            # DDP laid its gradient buckets out for the strides the parameters had when it
            # wrapped them; changing them now costs a copy per bucket and per step.
            plan.notes.append(f"channels-last not applied: the model was already wrapped in {_name(module)}")
            rank = None
        if rank is not None and not _already(inner, rank):
            mf.convert_model(inner, rank)
            plan.rank = rank
        elif rank is not None:
            plan.notes.append("already channels-last: left as it was")
    if config.ipex and not plan.ipex:
        _try_ipex(module, inner, optimizer, plan, bf16)
    if not plan.ipex:
        _fast_step(plan, optimizer)
    keep = plan.ipex and plan.amp_dtype is not None  # IPEX bf16 weights need autocast
    plan.amp_dtype = torch.bfloat16 if bf16 or keep else None
    plan.amp_eval = bool(config.bf16_eval)
    plan.compile_mode = config.compile
    plan.stock = None
    plan.ddp = distributed.attach(module, inner, optimizer)
    if plan.ddp is not None:
        plan.notes.append(f"data-parallel: DistributedDataParallel over {distributed.world_size()} processes")
    _install(module, plan)
    logger.info("accelerating %s: %s", plan.name, plan.describe())


def _already(model: nn.Module, rank: int) -> bool:
    """Whether the model's convolution weights already have the channels-last strides."""
    fmt = mf.memory_format(rank)
    for sub in model.modules():
        weight = getattr(sub, "weight", None)
        if isinstance(sub, (nn.Conv2d, nn.Conv3d)) and isinstance(weight, torch.Tensor) and weight.dim() == rank:
            return weight.is_contiguous(memory_format=fmt) and not weight.is_contiguous()
    return False


def _try_ipex(module: nn.Module, inner: nn.Module, optimizer: Any, plan: Plan, bf16: bool) -> None:
    lib = ipex.load()
    if lib is None:
        return
    if inner is not module:
        why = f"the model is already wrapped in {_name(module)}"
    else:
        why = ipex.why_not(inner, optimizer, lib)
    if why is not None:
        plan.notes.append(f"IPEX not used: {why}")
        log_once(f"ipex-skip-{id(module)}", "%s: IPEX not used (%s); native path", plan.name, why)
        return
    ipex.optimize(inner, optimizer, bf16)
    plan.ipex = True
    if bf16:
        plan.amp_dtype = torch.bfloat16


def _fast_step(plan: Plan, optimizer: Any) -> None:
    flag = optim.use_fast_step(optimizer)
    if flag is not None:
        plan.fast_steps.append(weakref.ref(optimizer))
        plan.notes.append(f"{type(optimizer).__name__}: {flag} step")


def _install(module: nn.Module, plan: Plan) -> None:
    if plan.installed:
        return
    current = module.__dict__.get("forward", _patching.NOTSET)
    if isinstance(current, AcceleratedForward):  # left on by unpatch (IPEX): reuse it
        current.plan = plan
        plan.previous_forward = current.plan.previous_forward
    else:
        plan.previous_forward = current
        object.__setattr__(module, "forward", AcceleratedForward(module, plan))
    plan.installed = True


def _uninstall(module: nn.Module, plan: Plan) -> None:
    """Undo everything but IPEX. An IPEX bf16 model keeps a forward with autocast: its
    weights are bf16 and a plain fp32 forward would fail."""
    for ref in plan.fast_steps:
        opt = ref()
        if opt is not None:
            optim.restore_step(opt)
    plan.fast_steps.clear()
    plan.compiled = None
    plan.ddp = None
    if plan.rank is not None and not plan.ipex:  # IPEX re-laid the weights out itself
        mf.restore_model(_inner(module))
        plan.rank = None
    if plan.ipex and plan.amp_dtype is not None:
        plan.compile_mode = False
        plan.installed = False
        warn_once(
            f"ipex-kept-{id(module)}",
            f"{plan.name} was optimized by IPEX in bf16, which cannot be undone: after unpatch it "
            "keeps running under bf16 autocast (outputs in fp32)",
        )
        return
    current = module.__dict__.get("forward", _patching.NOTSET)
    if isinstance(current, AcceleratedForward):
        if plan.previous_forward is _patching.NOTSET:
            del module.__dict__["forward"]
        else:
            object.__setattr__(module, "forward", plan.previous_forward)
    plan.installed = False


# --- the hooks ------------------------------------------------------------------------


def _call_counting_depth(counter: str, wrapped: Any, args: tuple, kwargs: dict) -> tuple[Any, int]:
    """Call ``wrapped``; returns its result and how deep this call was nested in calls of the
    same wrapper on this thread (0 for the outermost: ``.train()`` recurses into children,
    an optimizer subclass's ``__init__`` may build another)."""
    depth = _tls(counter, 0)
    setattr(_local, counter, depth + 1)
    try:
        return wrapped(*args, **kwargs), depth
    finally:
        setattr(_local, counter, depth)


def _optimizer_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result, depth = _call_counting_depth("opt_depth", wrapped, args, kwargs)
    if depth == 0 and not _tls("busy", 0) and isinstance(instance, torch.optim.Optimizer):
        try:
            with _lock:
                _track(instance)
        except Exception:  # never break the user's optimizer
            logger.exception("nanopatch could not track %s; it runs stock", type(instance).__name__)
    return result


def _module_train(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result, depth = _call_counting_depth("train_depth", wrapped, args, kwargs)
    mode = args[0] if args else kwargs.get("mode", True)
    if depth == 0 and mode and not _tls("busy", 0) and _pending:
        try:
            with _lock:
                _match(instance)
                if not _pending:
                    _stop_discovery()
        except Exception:
            logger.exception("nanopatch could not pair %s; it runs stock", type(instance).__name__)
    return result


def _track(optimizer: torch.optim.Optimizer) -> None:
    if _config is None or id(optimizer) in _pending:
        return
    _optimizers.add(optimizer)
    params = _optimizer_params(optimizer)
    for model, plan in list(_plans.items()):
        if plan.installed:
            params -= _param_ids(model)
    if not params:
        return
    entry = _Pending(weakref.ref(optimizer), params)
    try:
        entry.step_hook = optimizer.register_step_pre_hook(_first_step)
    except AttributeError:  # torch without per-optimizer hooks: discovery ends at unpatch
        entry.step_hook = None
    _pending[id(optimizer)] = entry
    _start_discovery()


def _match(module: nn.Module) -> Plan | None:
    """Pair ``module`` with every pending optimizer it holds parameters of."""
    if not _pending or _config is None:
        return None
    ids = None
    plan = None
    for key, entry in list(_pending.items()):
        optimizer = entry.optimizer()
        if optimizer is None:
            _drop(key)
            continue
        if ids is None:
            ids = _param_ids(module)
            if not ids:
                return None
        if entry.params & ids:
            plan = _pair(module, optimizer) or plan
            entry.params -= ids
            if not entry.params:
                _drop(key)
    return plan


def _drop(key: int) -> None:
    entry = _pending.pop(key, None)
    if entry is not None and entry.step_hook is not None:
        entry.step_hook.remove()


def _first_step(optimizer: Any, args: tuple, kwargs: dict) -> None:
    with _lock:
        entry = _pending.get(id(optimizer))
        if entry is None:
            return
        unpaired = _optimizer_params(optimizer) == entry.params
        _drop(id(optimizer))
        if unpaired:
            log_once(
                f"unpaired-{id(optimizer)}",
                "no model was found for %s (its model is never called through __call__ in grad mode "
                "before the first step); it runs stock",
                type(optimizer).__name__,
            )
        if not _pending:
            _stop_discovery()


def _start_discovery() -> None:
    if _discovery:
        return
    from torch.nn.modules import module as module_mod

    _discovery.append(module_mod.register_module_forward_pre_hook(_discover_pre))
    _discovery.append(module_mod.register_module_forward_hook(_discover_post, always_call=True))


def _stop_discovery() -> None:
    if _tls("calls", []):
        return  # a discovered call is still running: its forward hook stops it afterwards
    while _discovery:
        _discovery.pop().remove()


def _discover_pre(module: nn.Module, args: tuple) -> tuple | None:
    """Global forward pre-hook while an optimizer is pending: pair the first module called in
    grad mode that holds its parameters, and accelerate this very call."""
    if not _pending or _tls("busy", 0) or not torch.is_grad_enabled() or module in _plans:
        return None
    try:
        with _lock:
            plan = _match(module)
    except Exception:
        logger.exception("nanopatch could not pair %s; it runs stock", type(module).__name__)
        return None
    if plan is None or not plan.installed or plan.stock is not None or _plans.get(module) is not plan:
        return None
    # This call already fetched the class forward: run its hooks' part of the job here.
    if plan.rank is not None:
        args, _ = mf.convert_inputs(args, {}, plan.rank)
    dtype = _amp_dtype(module, plan)
    context = amp.autocast(dtype) if dtype is not None else None
    if context is not None:
        context.__enter__()
    ddp = plan.ddp if plan.ddp is not None and distributed.routes(plan.ddp, module) else None
    if ddp is not None:
        distributed.pre_forward(ddp)
    _tls("calls", []).append((module, context, dtype, plan, ddp))
    return args


def _discover_post(module: nn.Module, args: tuple, result: Any) -> Any:
    calls = _tls("calls", [])
    if not calls or calls[-1][0] is not module:
        return None
    _, context, dtype, plan, ddp = calls.pop()
    if context is not None:
        context.__exit__(None, None, None)
    if not calls and not _pending:
        _stop_discovery()
    if ddp is not None and result is not None:
        result = distributed.post_forward(ddp, result)
    if context is None or result is None:
        return result if ddp is not None else None
    return _finish(module, plan, result, dtype)


# --- patch / unpatch (called by the engine) -------------------------------------------


def patch(config: Any) -> None:
    global _config, _scanned
    _config = config
    _patching.wrap(torch.optim.Optimizer, "__init__", _optimizer_init)
    _patching.wrap(nn.Module, "train", _module_train)
    with _lock:
        if not _scanned:  # optimizers built before the first patch_torch()
            _scanned = True
            # (none can exist when torch is only now being imported; the scan costs ~50 ms)
            for obj in [] if _patching.applied_on_import() else gc.get_objects():
                if issubclass(type(obj), torch.optim.Optimizer):
                    _optimizers.add(obj)
        for plan in list(_plans.values()):
            if plan.ipex and not plan.installed:
                plan.installed = True  # its forward never left: it is accelerated again
        for optimizer in list(_optimizers):
            _track(optimizer)


def unpatch() -> None:
    global _config
    with _lock:
        _config = None
        for key in list(_pending):
            _drop(key)
        _local.calls = []
        _stop_discovery()
        for model, plan in list(_plans.items()):
            if plan.installed:
                _uninstall(model, plan)
            if not plan.ipex:
                del _plans[model]


def release_data_parallel() -> None:
    """Every model's plan lets go of its DDP wrapper (the process group is about to end)."""
    with _lock:
        for plan in list(_plans.values()):
            plan.ddp = None


def describe() -> list[dict[str, Any]]:
    """One entry per model nanopatch found, for ``nanopatch.status()``."""
    with _lock:
        return [plan.describe() for plan in list(_plans.values())]
