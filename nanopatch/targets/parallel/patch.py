"""Data-parallel training for unmodified scripts: the ``distributed`` patch target.

It is on in the processes ``python -m nanopatch --nproc N`` starts (the runner initialises
the process group before the script runs, through :func:`start`), and does, for a script
that knows nothing of ``torch.distributed``:

* **the model**: when the training hooks pair a model with its optimizer (after IPEX, before
  the first step), :func:`attach` wraps it in ``DistributedDataParallel``. The script keeps
  calling its own model object: the accelerated forward runs DDP's forward bookkeeping
  around the model's own forward (in training mode with grad on), so gradients are averaged
  across processes during ``backward`` and ``model.state_dict()`` keeps its keys;
* **the data**: a training ``DataLoader`` built without a sampler gets a
  ``DistributedSampler`` over its dataset (shuffled when the loader shuffled, with one seed
  shared by all processes, and a new epoch on each new iteration). A shuffling loader is a
  training loader; a sequential one is sharded when it is first iterated while a model is
  being trained (grad on and the model in training mode), so validation loaders keep the
  whole data set on every process;
* **the learning rate**: each optimizer step runs at ``world_size`` times the learning rate
  the script set (the linear scaling rule for the ``world_size`` times larger global batch),
  reached by a linear warm-up over the first epoch (or 100 steps when the length of an
  epoch is unknown). The script's ``param_groups`` keep its own values, so its schedulers
  and checkpoints see what they would see without nanopatch. ``auto_lr=False`` turns it off;
* **anything else**: gradients of an optimizer's parameters that no DDP wrapper covers (a
  model that runs stock) are averaged across processes before each step, and its
  parameters are broadcast from rank 0 at the first step, so every process stays in step.

A script that does its own distributed training (calls ``init_process_group``, builds a
``DistributedDataParallel`` or a ``DistributedSampler``) is left alone from that point on:
its ``init_process_group`` returns the group already there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import importlib.util
import logging
import sys
import threading
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.utils import data as tud

from nanopatch import engine
from nanopatch.engine import versions
from nanopatch.foundation.log import log_once

from ..training import ipex
from ..training import patch as training
from ..training.optim import around_step
from ..training.plan import local as training_local
from ..training.plan import register_data_parallel

logger = logging.getLogger("nanopatch")

#: warm-up length when no training loader tells how long an epoch is
DEFAULT_WARMUP_STEPS = 100


@dataclasses.dataclass
class _State:
    started: bool = False  # the process group is nanopatch's
    backend: str | None = None
    self_managed: str | None = None  # why the script is left alone, once it is
    warmup_steps: int | None = None  # the first sharded training loader's batches per epoch


_state = _State()
_context: engine.Context | None = None  # the target's while it is applied (its options, its journal)
_local = threading.local()
_ddps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # user's model -> DDP wrapper
_pending: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # user's model -> True: DDP to come
_candidates: weakref.WeakSet = weakref.WeakSet()  # sequential loaders, decided at iteration
_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> steps taken
_saved_lrs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> lrs to restore
_instance_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> its own step


@contextlib.contextmanager
def _internal():
    """Distributed objects nanopatch builds itself are not signs of a self-managed script."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _is_internal() -> bool:
    """Inside nanopatch's own work: here, or training's (its self-check probes, IPEX's setup)."""
    return getattr(_local, "depth", 0) > 0 or getattr(training_local, "busy", 0) > 0


# --- the process group ----------------------------------------------------------------


def backend_name() -> str:
    """oneCCL when its PyTorch bindings are installed (importing them registers ``ccl``),
    else gloo."""
    for module in ("oneccl_bindings_for_pytorch", "torch_ccl"):
        if importlib.util.find_spec(module) is not None:
            try:
                importlib.import_module(module)
                return "ccl"
            except Exception as exc:  # a broken or mismatched build: gloo
                log_once("ccl-import", "%s cannot be imported (%s); using gloo", module, exc)
    return "gloo"


def start() -> None:
    """Initialise the default process group from torchrun's environment (``env://``)."""
    if dist.is_initialized():
        return
    backend = backend_name()
    with _internal():
        dist.init_process_group(backend=backend)
    _state.started = True
    _state.backend = backend
    logger.info("process group: %s, rank %d of %d", backend, dist.get_rank(), dist.get_world_size())


def finish() -> None:
    """Tear the group down at the end of the script, if it is still nanopatch's: first the
    DDP wrappers that hold it (so that nothing of it is left for the interpreter's shutdown
    to destroy in whatever order), then, once every rank got here, the group."""
    if _state.started and dist.is_initialized():
        training.release_data_parallel()
        _detach_all()
        gc.collect()
        with contextlib.suppress(Exception):
            dist.barrier()
            dist.destroy_process_group()
    _state.started = False


def active() -> bool:
    """Whether nanopatch runs data-parallel for this script now."""
    return _context is not None and _state.started and _state.self_managed is None and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _detach_all() -> None:
    """Training forwards stop going through the DDP wrappers nanopatch made (a model whose
    plan still holds one checks the flag), and nanopatch forgets them."""
    for ddp in list(_ddps.values()):
        ddp.nanopatch_detached = True
    _ddps.clear()
    _pending.clear()


def _self_managed(why: str) -> None:
    if _state.self_managed is not None or not _state.started:
        return
    _state.self_managed = why
    _detach_all()
    _candidates.clear()
    log_once("self-managed", "the script %s: nanopatch leaves its data-parallel set-up to it", why)


# --- the model ------------------------------------------------------------------------


def attach(module: torch.nn.Module, inner: torch.nn.Module, optimizer: Any) -> Any:
    """Wrap the user's paired model in DDP; returns the wrapper, or None."""
    if not active() or inner is not module:  # already in a (D)DP wrapper: the script's own
        return None
    _cover_instance_step(optimizer)
    ddp = _ddps.get(module)
    if ddp is None:
        from torch.nn.parallel import DistributedDataParallel

        with _internal():
            # static_graph: DDP learns in the first step which parameters the model uses (a
            # model may leave some unused: an auxiliary head, a frozen branch), without the
            # per-step graph search find_unused_parameters costs.
            ddp = DistributedDataParallel(module, static_graph=True)
        ddp.nanopatch_detached = False
        _ddps[module] = ddp
        logger.info("%s: DistributedDataParallel over %d processes", type(module).__name__, world_size())
    return ddp


def defers(module: torch.nn.Module, inner: torch.nn.Module) -> bool:
    """Whether :func:`attach` would wrap this model; the training target may put that off
    (:func:`defer`) while it measures the model's layout: DDP lays its gradient buckets out for
    the strides the weights have when it wraps them."""
    return active() and inner is module


def defer(module: torch.nn.Module) -> None:
    """Until :func:`attach` wraps ``module``, its gradients are averaged across processes before
    each step, one all-reduce a parameter (as any parameter no DDP wrapper covers), and its
    parameters are broadcast from rank 0 at the first step; said in its plan's notes, not in a
    log line of its own."""
    _pending[module] = True


def routes(ddp: Any, module: torch.nn.Module) -> bool:
    """Whether this call of the model goes through its DDP wrapper: a training step."""
    return not ddp.nanopatch_detached and module.training and torch.is_grad_enabled()


def through(ddp: Any, forward: Any) -> Any:
    """``forward`` with DDP's bookkeeping around it, as ``DistributedDataParallel.forward``
    does around its module (without calling the module's ``__call__`` and hooks twice)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        inside = getattr(ddp, "_inside_ddp_forward", None)
        with inside() if inside is not None else contextlib.nullcontext():
            args, kwargs = ddp._pre_forward(*args, **kwargs)
            out = forward(*args, **kwargs)
        return ddp._post_forward(out)

    return run


def pre_forward(ddp: Any) -> None:
    ddp._pre_forward()


def post_forward(ddp: Any, out: Any) -> Any:
    return ddp._post_forward(out)


def _covered_params() -> set[int]:
    return {id(p) for model in list(_ddps) for p in model.parameters()}


def _pending_params() -> set[int]:
    return {id(p) for model in list(_pending) if model not in _ddps for p in model.parameters()}


# --- the data -------------------------------------------------------------------------


class EpochDistributedSampler(tud.DistributedSampler):
    """A ``DistributedSampler`` that starts a new epoch (a new shuffle) on each iteration,
    as the loader's own ``RandomSampler`` would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_epoch = 0

    def __iter__(self):
        self.set_epoch(self._next_epoch)
        self._next_epoch += 1
        return super().__iter__()


def _plain_sampling(loader: tud.DataLoader) -> str | None:
    """Whether a loader built without a sampler of its own shuffles ("shuffle") or reads in
    order ("sequential"); None for any other loader."""
    if isinstance(loader.dataset, tud.IterableDataset) or loader.batch_sampler is None:
        return None
    if type(loader.batch_sampler) is not tud.BatchSampler or loader.batch_sampler.sampler is not loader.sampler:
        return None
    sampler = loader.sampler
    if type(sampler) is tud.RandomSampler and not sampler.replacement and sampler._num_samples is None:
        return "shuffle"
    if type(sampler) is tud.SequentialSampler:
        return "sequential"
    return None


def _shared_seed(loader: tud.DataLoader) -> int:
    """A shuffle seed drawn as the loader's sampler would draw it, rank 0's for everyone."""
    generator = getattr(loader.sampler, "generator", None) or loader.generator
    seed = torch.empty((), dtype=torch.int64).random_(generator=generator).item()
    box = [int(seed)]
    with _internal():
        dist.broadcast_object_list(box, src=0)
    return box[0]


def _shard(loader: tud.DataLoader, shuffle: bool) -> None:
    seed = _shared_seed(loader) if shuffle else 0
    with _internal():
        sampler = EpochDistributedSampler(loader.dataset, shuffle=shuffle, seed=seed)
    batches = tud.BatchSampler(sampler, loader.batch_sampler.batch_size, loader.batch_sampler.drop_last)
    # DataLoader refuses these assignments after __init__ (the journal sets them past that, and
    # puts the loader's own back at unpatch); the loader has not iterated yet with them, and
    # its length follows the batch sampler.
    assert _context is not None
    _context.set_on(loader, "sampler", sampler)
    _context.set_on(loader, "batch_sampler", batches)
    if _state.warmup_steps is None:
        _state.warmup_steps = max(1, len(batches))
    logger.info(
        "DataLoader over %s: sharded across %d processes (%s), %d batches per process",
        type(loader.dataset).__name__,
        world_size(),
        "shuffled" if shuffle else "in order",
        len(batches),
    )


def shard(loader: tud.DataLoader) -> bool:
    """Shard ``loader`` across the processes now (a custom-loop API's ``setup`` asks for it, as
    Fabric's ``setup_dataloaders`` does): shuffled when it shuffles. False when it cannot be
    (a sampler of its own, an iterable dataset) and every process reads all of it; True when
    it is sharded, by this call or before."""
    if isinstance(loader.sampler, EpochDistributedSampler):
        return True
    kind = _plain_sampling(loader)
    if kind is None or not active():
        return False
    _candidates.discard(loader)
    _shard(loader, shuffle=kind == "shuffle")
    return True


def _training_now() -> bool:
    """Whether a model is being trained at this moment (a loader iterated now feeds it)."""
    return training.training_now()


def _loader_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    if active():
        try:
            kind = _plain_sampling(instance)
            if kind == "shuffle":
                _shard(instance, shuffle=True)
            elif kind == "sequential":
                _candidates.add(instance)
        except Exception:
            logger.exception("nanopatch could not shard this DataLoader; every process reads all of it")
    return result


def _loader_iter(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if instance in _candidates and active():
        try:
            if _training_now() and _plain_sampling(instance) == "sequential":
                _candidates.discard(instance)
                _shard(instance, shuffle=False)
        except Exception:
            _candidates.discard(instance)
            logger.exception("nanopatch could not shard this DataLoader; every process reads all of it")
    return wrapped(*args, **kwargs)


# --- the optimizer step ---------------------------------------------------------------


def lr_factor(step: int, world: int, warmup: int) -> float:
    """Learning-rate multiplier for the ``step``-th step (from 0): linear from just above 1
    to ``world`` over ``warmup`` steps."""
    if world <= 1:
        return 1.0
    if step + 1 >= warmup:
        return float(world)
    return 1.0 + (world - 1) * (step + 1) / warmup


def _cover_instance_step(optimizer: Any) -> None:
    """IPEX gives the optimizer an instance-level fused ``step``, which torch's optimizer
    hooks never see: wrap that one instead."""
    own = optimizer.__dict__.get("step")
    if own is None or optimizer in _instance_steps:
        return
    _instance_steps[optimizer] = own
    step = around_step(optimizer, own, functools.partial(_pre_step, instance=True), _post_step)
    assert _context is not None
    _context.set_on(optimizer, "step", step)


def _ipex_step(optimizer: Any) -> None:
    """Covered as soon as IPEX gives it (before a target applied after this one wraps it too)."""
    if active() and not _is_internal():
        _cover_instance_step(optimizer)


def _pre_step(optimizer: Any, args: tuple, kwargs: dict, instance: bool = False) -> tuple | None:
    if not active() or _is_internal() or (optimizer in _instance_steps and not instance):
        return None
    step = _steps.get(optimizer, 0)
    _steps[optimizer] = step + 1
    if _context is not None and _context.config is not None and _context.config.auto_lr:
        warmup = _state.warmup_steps or DEFAULT_WARMUP_STEPS
        factor = lr_factor(step, world_size(), warmup)
        if factor != 1.0:
            _saved_lrs[optimizer] = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor
    closure, args, kwargs = _closure_of(args, kwargs)
    if closure is None:
        _average_uncovered(optimizer, first=step == 0)
        return None

    # The gradients exist only once the closure has run inside the step: average them then.
    def averaged() -> Any:
        loss = closure()
        _average_uncovered(optimizer, first=step == 0)
        return loss

    kwargs["closure"] = averaged
    return args, kwargs


def _closure_of(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """The ``closure`` of a ``step(closure)`` call (``args`` holds the optimizer first), and
    the arguments without it."""
    kwargs = dict(kwargs)
    if "closure" in kwargs:
        return kwargs.pop("closure"), args, kwargs
    if len(args) > 1 and callable(args[1]):
        return args[1], (args[0], *args[2:]), kwargs
    return None, args, kwargs


def _post_step(optimizer: Any, args: tuple, kwargs: dict) -> None:
    saved = _saved_lrs.pop(optimizer, None)
    if saved is not None:
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr


def _average_uncovered(optimizer: Any, first: bool) -> None:
    covered = _covered_params()
    params = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in covered]
    if not params:
        return
    if first and not {id(p) for p in params} <= _pending_params():
        log_once(
            "uncovered",
            "%s: %d parameter(s) outside a model nanopatch wrapped in DistributedDataParallel; "
            "their gradients are averaged across processes before each step",
            type(optimizer).__name__,
            len(params),
            about=optimizer,
        )
    if first:
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)
    world = world_size()
    for p in params:
        if p.grad is not None:  # sparse ones too (an Embedding(sparse=True)): gloo sums them in place
            dist.all_reduce(p.grad)
            p.grad.div_(world)


# --- detecting a script's own distributed set-up --------------------------------------


def _init_process_group(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _is_internal() or not _state.started or not dist.is_initialized():
        return wrapped(*args, **kwargs)
    _self_managed("initialises its own process group")
    logger.info("init_process_group: the group nanopatch initialised is kept (%s)", _state.backend)
    return None


def _ddp_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not _is_internal():
        _self_managed("wraps its model in DistributedDataParallel")
    return wrapped(*args, **kwargs)


def _sampler_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not _is_internal():
        _self_managed("builds its own DistributedSampler")
    return wrapped(*args, **kwargs)


# --- patch / unpatch (called by the engine) -------------------------------------------


class DataParallel(engine.Target):
    """Data-parallel training over nanopatch's processes (``--nproc``): the process group, the
    loaders sharded, the learning rate scaled."""

    supported = versions.supported("torch")

    def patch(self, ctx: engine.Context) -> None:
        global _context
        from torch.distributed import distributed_c10d
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim import optimizer as optimizer_mod

        _context = ctx
        init = engine.raw_attribute(distributed_c10d, "init_process_group")
        wrapper = ctx.wrap(distributed_c10d, "init_process_group", _init_process_group)
        if getattr(dist, "init_process_group", None) is init:
            ctx.replace(dist, "init_process_group", wrapper)
        ctx.wrap(DistributedDataParallel, "__init__", _ddp_init)
        ctx.wrap(tud.DistributedSampler, "__init__", _sampler_init)
        ctx.wrap(tud.DataLoader, "__init__", _loader_init)
        ctx.wrap(tud.DataLoader, "__iter__", _loader_iter)
        for handle in (
            optimizer_mod.register_optimizer_step_pre_hook(_pre_step),
            optimizer_mod.register_optimizer_step_post_hook(_post_step),
        ):
            ctx.add_hook(handle, "torch.optim.optimizer: global step hook (data-parallel)")
        ipex.on_instance_step(ctx, _ipex_step)

    def unpatch(self, ctx: engine.Context) -> None:
        global _context
        _context = None
        _instance_steps.clear()
        _detach_all()
        _candidates.clear()

    def describe(self) -> dict[str, Any]:
        return describe()


def describe() -> dict[str, Any]:
    return {
        "process_group": _state.backend if _state.started else None,
        "rank": dist.get_rank() if dist.is_initialized() else None,
        "world_size": world_size(),
        "self_managed": _state.self_managed,
        "models": len(_ddps),
        "warmup_steps": _state.warmup_steps,
    }


register_data_parallel(sys.modules[__name__])
