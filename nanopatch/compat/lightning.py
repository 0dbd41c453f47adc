"""BigDL-Nano's ``Trainer`` on Lightning: ``from nanopatch.lightning import Trainer``.

A subclass of Lightning's own ``Trainer`` that also takes BigDL-Nano's switches, with their
meaning and defaults:

* ``num_processes=1``: train on N processes of this machine with Lightning's DDP over gloo,
  forked (:mod:`nanopatch.runtime.processes`: the script's code runs once, without a main guard; where fork
  is unsafe, Lightning runs the script again for each other rank). Each process is pinned to
  its share of the physical cores (the runner's split, or ``cpu_for_each_process``) with as
  many threads as it has cores.
* ``cpu_for_each_process=None``: a list of N CPU lists, one per process.
* ``use_ipex=False``: ``ipex.optimize`` on the LightningModule and its optimizers before
  training (with N processes, in each before DDP wraps it); with ``precision='bf16'`` IPEX's
  bf16 weights under Lightning's ``bf16-mixed`` autocast.
* ``precision``: Lightning's values, and ``'bf16'`` (Lightning's ``'bf16-mixed'``).
* ``channels_last=False``: channels-last weights and inputs (nanopatch's training engine).
* ``auto_lr=True``: with N processes, the learning rate each optimizer step uses is warmed up
  linearly to N times the configured one over the first epoch, and stays N times it
  after; schedulers keep seeing (and setting) the configured one.

Which Lightning: ``lightning.pytorch`` when it is importable, else ``pytorch_lightning``; when
a script has imported ``pytorch_lightning`` and not ``lightning``, that one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from nanopatch import engine
from nanopatch.foundation import cpu
from nanopatch.foundation.log import warn_once
from nanopatch.runtime import launch, processes
from nanopatch.runtime import tuning as runtime

logger = logging.getLogger("nanopatch")


def lightning_package() -> str:
    """``"lightning.pytorch"`` or ``"pytorch_lightning"``: the one the script uses."""
    if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules:
        return "pytorch_lightning"
    try:
        importlib.import_module("lightning.pytorch")
        return "lightning.pytorch"
    except ImportError:
        pass
    try:
        importlib.import_module("pytorch_lightning")
        return "pytorch_lightning"
    except ImportError:
        raise ImportError(
            "nanopatch.lightning needs Lightning: pip install lightning (or nanopatch[lightning])"
        ) from None


# --- the switches ------------------------------------------------------------------------------


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, not {value!r}")
    return value


def check_switches(
    num_processes: Any,
    cpu_for_each_process: Any,
    use_ipex: Any,
    channels_last: Any,
    auto_lr: Any,
    facts: cpu.CpuFacts | None = None,
) -> list[tuple[int, ...]] | None:
    """Validate BigDL-Nano's switches (``ValueError`` naming the keyword); returns the CPU set of
    each process when there are several."""
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a whole number >= 1, not {num_processes!r}")
    for name, value in (("use_ipex", use_ipex), ("channels_last", channels_last), ("auto_lr", auto_lr)):
        _flag(name, value)
    facts = cpu.host_facts() if facts is None else facts
    if cpu_for_each_process is None:
        if num_processes == 1:
            return None
        try:
            return runtime.process_cpus(facts, num_processes)
        except ValueError as exc:
            raise ValueError(f"num_processes={num_processes}: {exc}") from None
    if isinstance(cpu_for_each_process, (str, bytes)) or not isinstance(cpu_for_each_process, Sequence):
        raise ValueError(f"cpu_for_each_process must be a list of CPU lists, not {cpu_for_each_process!r}")
    groups = []
    for group in cpu_for_each_process:
        if (
            isinstance(group, (str, bytes))
            or not isinstance(group, Sequence)
            or not group
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in group)
        ):
            raise ValueError(f"cpu_for_each_process: {group!r} is not a non-empty list of CPU numbers")
        groups.append(tuple(group))
    if len(groups) != num_processes:
        raise ValueError(f"cpu_for_each_process gives {len(groups)} CPU list(s) but num_processes is {num_processes}")
    text = ";".join(runtime.cpu_list_text(g) for g in groups)
    try:
        runtime.process_cpus(facts, num_processes, cpus=text)
    except ValueError as exc:
        raise ValueError(f"cpu_for_each_process: {str(exc).removeprefix('--cpus: ')}") from None
    return groups


def native_bf16_or_warn(precision: Any, key: str, fallback: str = "") -> bool:
    """Whether this CPU computes bf16 natively; if not, one warning that ``precision`` falls
    back to fp32 (BigDL-Nano's behaviour)."""
    facts = cpu.host_facts()
    if not facts.native_bf16:
        warn_once(key, f"precision={precision!r}: {facts.bf16_reason}; training runs in fp32{fallback}")
    return facts.native_bf16


def lightning_precision(precision: Any, use_ipex: bool) -> tuple[Any, bool]:
    """(the precision Lightning gets, whether nanopatch's engine computes in bf16)."""
    if precision not in ("bf16", "bf16-mixed"):
        return precision, False
    if not native_bf16_or_warn(precision, "trainer-bf16", " (BigDL-Nano's fallback)"):
        return "32-true", False
    # with IPEX: ipex.optimize(dtype=bf16) too; Lightning's autocast covers every step (validation
    # and prediction included), which IPEX's bf16 weights need
    return "bf16-mixed", bool(use_ipex)


def _ipex_usable() -> bool:
    from nanopatch.engine.config import ipex_compatibility

    return ipex_compatibility()[0]


def ipex_before_training(model: Any, optimizers: Sequence[Any], bf16: bool, who: str) -> bool:
    """``ipex.optimize`` the model with each optimizer before training starts, where the
    engine's search would find the model too late (inside ``optimizer.step(closure)``) or
    already wrapped (by Fabric). A missing or mismatched IPEX was warned about when the option
    was resolved. Returns whether IPEX optimized the model."""
    if not _ipex_usable():
        return False
    from nanopatch.targets.training.discovery import ipex_ahead

    applied = False
    for optimizer in optimizers:
        why = ipex_ahead(model, optimizer, bf16)
        if why is not None:
            logger.info("%s: IPEX not applied before training (%s)", who, why)
        applied = applied or why is None
    return applied


def engine_options(bf16: bool, channels_last: bool, ipex: bool, force: bool = False) -> dict[str, Any] | None:
    """The options of nanopatch's training engine for these switches (None: nothing to do,
    unless ``force``). Only training: the script's data pipeline is left as it is."""
    if not (bf16 or channels_last or ipex or force):
        return None
    return {
        "training": True,
        "vision": False,
        "bf16": bf16,
        "channels_last": channels_last,
        "ipex": ipex,
        "compile": False,
        "data_parallel": False,
        "auto_lr": False,
    }


def warn_if_ipex_unused(where: str, applied_ahead: bool) -> None:
    """After a run with ``use_ipex=True`` (still patched): one warning when a usable IPEX
    optimized no model, neither before training (``applied_ahead``) nor through the engine's
    search (with its reasons: the model was found inside ``optimizer.step(closure)``, or
    already wrapped in DDP). A missing or mismatched IPEX was warned about when the option was
    resolved."""
    from nanopatch.targets.training import plan as training_plan

    if applied_ahead or not _ipex_usable():
        return  # applied; or said already, when the option was resolved
    with training_plan.lock:
        plans = list(training_plan.plans.values())
    if any(p.ipex for p in plans):
        return
    reasons = sorted({note.removeprefix("IPEX not used: ") for p in plans for note in p.notes if "IPEX" in note})
    why = "; ".join(reasons) or "no model was paired with an optimizer, or IPEX could not be loaded"
    warn_once(
        f"ipex-unused-{where}", f"{where}: use_ipex=True, but IPEX optimized no model ({why}); trained without it"
    )


# --- per-process pinning ------------------------------------------------------------------------


class _Pinning:
    """Pin this process (every thread) to its CPU set and set its threads; undo on ``release``."""

    def __init__(self, cpus: Sequence[int], saved: tuple[set[int], int] | None = None) -> None:
        self.cpus = tuple(cpus)
        self._saved = saved

    def apply(self) -> None:
        import torch

        from nanopatch.runtime.launch import pin_every_thread

        if self._saved is None:
            self._saved = (os.sched_getaffinity(0), torch.get_num_threads())
        pin_every_thread(set(self.cpus))
        facts = cpu.host_facts()
        cores = {core for core in facts.cores if set(core) & set(self.cpus)} or {(c,) for c in self.cpus}
        torch.set_num_threads(len(cores))
        logger.info("rank %s: CPUs %s, %d thread(s)", os.environ.get("LOCAL_RANK", "0"), self.cpus, len(cores))

    def release(self) -> None:
        if self._saved is None:
            return
        import torch

        from nanopatch.runtime.launch import pin_every_thread

        affinity, threads = self._saved
        self._saved = None
        pin_every_thread(affinity)
        torch.set_num_threads(threads)


# --- the learning-rate warm-up ---------------------------------------------------------------------


class LrWarmup:
    """Each optimizer step of the first epoch uses ``lr x f`` with ``f`` rising linearly to ``n``
    over the epoch's steps (as ``--nproc``'s auto_lr does), and ``lr x n`` after; the group's ``lr`` is put back after
    the step, so schedulers see and set the configured value."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.steps_per_epoch = 1
        self.step = 0
        self._handles: list[Any] = []
        self._covered: list[tuple[Any, Any, Any]] = []  # (optimizer, its own step, the step covering it)
        self._saved: dict[int, list[float]] = {}

    def factor(self) -> float:
        from nanopatch.targets.parallel.patch import lr_factor  # the same warm-up as --nproc's auto_lr

        return lr_factor(self.step, self.n, self.steps_per_epoch)

    def attach(self, optimizers: Sequence[Any], steps_per_epoch: int) -> None:
        self.steps_per_epoch = max(1, steps_per_epoch)
        for optimizer in optimizers:
            own = optimizer.__dict__.get("step")
            if own is None:
                self._handles.append(optimizer.register_step_pre_hook(self._pre))
                self._handles.append(optimizer.register_step_post_hook(self._post))
            else:  # IPEX's fused step, an instance attribute: torch's step hooks never see it
                from nanopatch.targets.training.optim import around_step

                step = optimizer.step = around_step(optimizer, own, self._pre, self._post)
                self._covered.append((optimizer, own, step))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for optimizer, own, step in self._covered:
            if optimizer.__dict__.get("step") is step:
                optimizer.step = own
        self._covered.clear()

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        f = self.factor()
        self._saved[id(optimizer)] = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * f

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        saved = self._saved.pop(id(optimizer), None)
        if saved is not None:
            for group, lr in zip(optimizer.param_groups, saved, strict=False):
                group["lr"] = lr
        self.step += 1


# --- the Trainer --------------------------------------------------------------------------------
#
# Lightning can only be imported lazily, and a script may use either package, so each class below
# holds its methods only: _build mixes it with the package's Lightning base class, once per package.

_classes: dict[str, type] = {}


def trainer_class(package: str | None = None) -> type:
    """nanopatch's Trainer for ``package`` (default: :func:`lightning_package`)."""
    package = lightning_package() if package is None else package
    if package not in _classes:
        _classes[package] = _build(package)
    return _classes[package]


def _build(package: str) -> type:
    """The Trainer of ``package`` (a subclass of its ``Trainer``), with its strategy and callbacks:
    the mixins below over their Lightning base classes."""
    pl = importlib.import_module(package)
    strategies = importlib.import_module(f"{package}.strategies")
    strategy = _combine(
        "PinnedDDPStrategy", _PinnedDDPStrategyMixin, strategies.DDPStrategy, _module_class=pl.LightningModule
    )
    trainer = _combine(
        "Trainer",
        _TrainerMixin,
        pl.Trainer,
        doc=__doc__,
        _lightning=pl,
        _strategy_class=strategy,
        _warmup_class=_combine("WarmupCallback", _WarmupCallbackMixin, pl.Callback),
        _ipex_ahead_class=_combine("IpexAhead", _IpexAheadMixin, pl.Callback),
    )
    for name in ("fit", "validate", "test", "predict"):
        setattr(trainer, name, _accelerating(getattr(pl.Trainer, name)))
    return trainer


def _combine(
    name: str, mixin: type, base: type, doc: str | None = None, qualname: str | None = None, **attributes: Any
) -> type:
    """The class ``name`` of this module: ``mixin``'s methods over Lightning's ``base``, with the
    class ``attributes`` given (the Lightning classes and values its methods use) and ``mixin``'s
    docstring unless ``doc``."""
    namespace = {"__module__": __name__, "__qualname__": qualname or name, "__doc__": doc or mixin.__doc__}
    return type(name, (mixin, base), {**namespace, **attributes})


class _PinnedDDPStrategyMixin:
    """Lightning's DDP over gloo, each process pinned to its CPU set before it trains (the
    methods of ``PinnedDDPStrategy``, over the package's ``DDPStrategy``)."""

    _module_class: type  # the package's LightningModule

    def __init__(self, groups: Sequence[Sequence[int]], ipex_bf16: bool | None = None, **kwargs: Any) -> None:
        super().__init__(process_group_backend="gloo", **kwargs)
        self._groups = [tuple(g) for g in groups]
        self._pinning: _Pinning | None = None
        self._ipex_bf16 = ipex_bf16  # None: no IPEX; else IPEX before DDP wraps the module, in bf16 or not
        self._optimizers_built = False
        self.before_fit: tuple[set[int], int] | None = None  # set by the Trainer as a run starts

    def setup_environment(self) -> None:
        if self._start_method == "fork":
            processes.end_with_parent()
        self._pinning = _Pinning(self._groups[self.local_rank % len(self._groups)], self.before_fit)
        self._pinning.apply()
        super().setup_environment()
        _destroy_group_at_exit()

    def _setup_model(self, model: Any) -> Any:
        """IPEX replaces the module's weights, so it goes before DDP registers its hooks on
        them; its optimizers must exist for that, so Lightning builds them here, once."""
        if self._ipex_bf16 is not None and isinstance(model, self._module_class):
            super().setup_optimizers(model.trainer)
            self._optimizers_built = True
            if ipex_before_training(model, _plain_optimizers(self.optimizers), self._ipex_bf16, "Trainer"):
                model.trainer.ipex_applied = True
        return super()._setup_model(model)

    def setup_optimizers(self, trainer: Any) -> None:
        if self._optimizers_built:  # built before DDP wrapped the module (IPEX)
            self._optimizers_built = False
            return
        super().setup_optimizers(trainer)

    def teardown(self) -> None:
        trainer = getattr(self.lightning_module, "_trainer", None)
        if self._start_method == "fork" and isinstance(trainer, _TrainerMixin) and trainer.state.fn == "fit":
            if trainer._engine is not None and trainer._engine["ipex"]:
                warn_if_ipex_unused("Trainer", trainer.ipex_applied)  # in the forked rank that trained
        super().teardown()
        if self._pinning is not None:
            self._pinning.release()  # the script's own process gets its CPUs back


class _WarmupCallbackMixin:
    """``auto_lr`` with N processes: the :class:`LrWarmup` of the optimizers while Lightning
    trains (the methods of ``WarmupCallback``, over the package's ``Callback``)."""

    def __init__(self, n: int) -> None:
        self.warmup = LrWarmup(n)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.warmup.attach(_plain_optimizers(trainer.optimizers), _steps_per_epoch(trainer))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.warmup.detach()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.warmup.detach()


class _IpexAheadMixin:
    """``use_ipex`` in one process: IPEX on the LightningModule and its optimizers once they
    exist, before Lightning runs the first forward inside ``optimizer.step(closure)`` (the
    methods of ``IpexAhead``, over the package's ``Callback``)."""

    def __init__(self, bf16: bool) -> None:
        self.bf16 = bf16

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if ipex_before_training(pl_module, _plain_optimizers(trainer.optimizers), self.bf16, "Trainer"):
            trainer.ipex_applied = True


class _TrainerMixin:
    """The methods of nanopatch's ``Trainer`` (the module's docstring), over the package's ``Trainer``;
    :func:`_build` also wraps its ``fit``/``validate``/``test``/``predict`` in :meth:`_accelerated`."""

    _lightning: Any  # the package's module, and its classes that this Trainer uses:
    _strategy_class: type  # PinnedDDPStrategy
    _warmup_class: type  # WarmupCallback
    _ipex_ahead_class: type  # IpexAhead

    def __init__(
        self,
        *args: Any,
        num_processes: int = 1,
        cpu_for_each_process: Sequence[Sequence[int]] | None = None,
        use_ipex: bool = False,
        channels_last: bool = False,
        auto_lr: bool = True,
        **kwargs: Any,
    ) -> None:
        groups = check_switches(num_processes, cpu_for_each_process, use_ipex, channels_last, auto_lr)
        precision, engine_bf16 = lightning_precision(kwargs.pop("precision", "32-true"), use_ipex)
        kwargs["precision"] = precision
        if groups is not None:
            _choose_processes(type(self), kwargs, num_processes, groups, use_ipex, engine_bf16, auto_lr)
        self.nano = {
            "num_processes": num_processes,
            "cpu_for_each_process": groups,
            "use_ipex": use_ipex,
            "channels_last": channels_last,
            "auto_lr": auto_lr,
        }
        self._engine = engine_options(engine_bf16, channels_last, use_ipex)
        self.ipex_applied = False  # whether IPEX optimized the module before training
        if use_ipex and groups is None and _ipex_usable():
            kwargs["callbacks"] = [*_as_list(kwargs.get("callbacks")), self._ipex_ahead_class(engine_bf16)]
        super().__init__(*args, **kwargs)

    @contextlib.contextmanager
    def _accelerated(self) -> Iterator[None]:
        if isinstance(self.strategy, _PinnedDDPStrategyMixin):
            import torch

            # what the script's process goes back to (Lightning's launcher sets threads before we pin)
            self.strategy.before_fit = (os.sched_getaffinity(0), torch.get_num_threads())
        forked = isinstance(self.strategy, _PinnedDDPStrategyMixin) and self.strategy._start_method == "fork"
        with contextlib.ExitStack() as stack:
            if forked:
                stack.enter_context(processes.launching())
            if self._engine is None:
                yield
                return
            stack.enter_context(engine.patched(**self._engine))
            yield
            if self._engine["ipex"] and self.state.fn == "fit" and not forked:  # forked: each rank says it
                warn_if_ipex_unused("Trainer", self.ipex_applied)

    @classmethod
    def compile(cls, model: Any, loss: Any = None, optimizer: Any = None, scheduler: Any = None) -> Any:
        """A ``LightningModule`` that trains ``model`` with ``loss`` and ``optimizer`` (an
        optimizer, or a function of the parameters that builds one) and an optional
        ``scheduler`` (a scheduler, a function of the optimizer that builds one, or
        Lightning's scheduler dict); see :func:`compiled_module`."""
        return compiled_module(cls._lightning, model, loss, optimizer, scheduler)


def _choose_processes(
    trainer_class: Any,
    kwargs: dict[str, Any],
    num_processes: int,
    groups: Sequence[Sequence[int]],
    use_ipex: bool,
    engine_bf16: bool,
    auto_lr: bool,
) -> None:
    """``num_processes`` > 1: into the Trainer's ``kwargs`` (which must not choose a layout of
    their own), Lightning's DDP on the CPU over that many processes, pinned to ``groups``, with
    IPEX (in bf16 or not) before DDP wraps the module when it is usable, and with ``auto_lr`` the
    learning-rate warm-up."""
    for name in ("strategy", "devices", "num_nodes"):
        if name in kwargs:
            raise ValueError(f"num_processes={num_processes} chooses {name}; leave {name} out")
    accelerator = kwargs.setdefault("accelerator", "cpu")
    if accelerator != "cpu":
        raise ValueError(f"num_processes={num_processes} trains on the CPU, not accelerator={accelerator!r}")
    ipex_ok = use_ipex and _ipex_usable()
    # forked (Lightning's ddp_fork), so the script's top-level code runs once; where
    # fork is unsafe, Lightning's default: the script is run again for each other rank
    start = {} if processes.why_not_fork() else {"start_method": "fork"}
    kwargs["strategy"] = trainer_class._strategy_class(groups, ipex_bf16=engine_bf16 if ipex_ok else None, **start)
    kwargs["devices"] = num_processes
    if auto_lr:
        kwargs["callbacks"] = [*_as_list(kwargs.get("callbacks")), trainer_class._warmup_class(num_processes)]


def _plain_optimizers(optimizers: Sequence[Any]) -> list[Any]:
    """Lightning's optimizers, each out of its ``LightningOptimizer`` wrapper."""
    return [getattr(o, "_optimizer", o) for o in optimizers]


def _steps_per_epoch(trainer: Any) -> int:
    """The optimizer steps of one training epoch (1 when Lightning does not know its batches)."""
    batches = trainer.num_training_batches
    accumulate = max(1, getattr(trainer, "accumulate_grad_batches", 1))
    return -(-int(batches) // accumulate) if batches not in (None, float("inf")) else 1


# --- Trainer.compile ------------------------------------------------------------------------------


def split_batch(batch: Any) -> tuple[tuple[Any, ...], Any]:
    """``(x, y)`` or ``(x1, x2, ..., y)``: the inputs and the target."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise ValueError(
            "Trainer.compile: a batch must be (x, y) or (x1, ..., xn, y), not "
            f"{type(batch).__name__}{f' of {len(batch)}' if isinstance(batch, (tuple, list)) else ''}"
        )
    return tuple(batch[:-1]), batch[-1]


def compiled_module(pl: Any, model: Any, loss: Any, optimizer: Any, scheduler: Any) -> Any:
    """``Trainer.compile``: ``model`` (a plain ``nn.Module``) trained with ``loss(model(*x), y)``
    on batches ``(x, y)`` or ``(x1, ..., xn, y)``; validation and test log ``val_loss`` /
    ``test_loss``; ``predict`` returns ``model(*x)`` (a batch that is a tensor alone is ``x``).
    Its ``state_dict`` (and so every checkpoint's) is the plain module's, with its own keys. A
    ``LightningModule`` is returned as it is, when nothing else is given."""
    if isinstance(model, pl.LightningModule):
        if loss is not None or optimizer is not None or scheduler is not None:
            raise ValueError("Trainer.compile: a LightningModule brings its own loss, optimizer and scheduler")
        return model
    _check_compile_arguments(model, loss, optimizer, scheduler)
    qualname = f"Compiled{type(model).__name__}"
    given = (model, loss, optimizer, scheduler)
    return _combine("CompiledModule", _CompiledModuleMixin, pl.LightningModule, qualname=qualname, _given=given)()


def _check_compile_arguments(model: Any, loss: Any, optimizer: Any, scheduler: Any) -> None:
    """``ValueError`` for what ``Trainer.compile`` cannot train: ``model`` not a plain module, a
    ``loss`` not callable, an ``optimizer`` neither an optimizer nor a function, or a ``scheduler``
    without an optimizer."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"Trainer.compile: model must be a torch.nn.Module, not {type(model).__name__}")
    if loss is not None and not callable(loss):
        raise ValueError(f"Trainer.compile: loss must be callable (an nn.Module or a function), not {loss!r}")
    if optimizer is not None and not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
        raise ValueError(
            f"Trainer.compile: optimizer must be an optimizer or a function of the parameters, not {optimizer!r}"
        )
    if scheduler is not None and optimizer is None:
        raise ValueError("Trainer.compile: a scheduler needs an optimizer")


class _CompiledModuleMixin:
    """The ``LightningModule`` of ``Trainer.compile`` (see :func:`compiled_module`): the methods of
    one ``CompiledModule`` class per call, over the package's ``LightningModule``, whose ``_given``
    is the call's ``(model, loss, optimizer, scheduler)``."""

    _given: tuple[Any, Any, Any, Any]

    def __init__(self) -> None:
        super().__init__()
        self.model = self._given[0]
        self._loss = self._given[1]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def _loss_of(self, batch: Any, name: str) -> Any:
        if self._loss is None:
            raise ValueError(f"Trainer.compile got no loss: give loss=... to {name}")
        inputs, target = split_batch(batch)
        return self._loss(self.model(*inputs), target)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        value = self._loss_of(batch, "train")
        self.log("train_loss", value, prog_bar=True)
        return value

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        value = self._loss_of(batch, "validate")
        self.log("val_loss", value, prog_bar=True, sync_dist=True)
        return value

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        value = self._loss_of(batch, "test")
        self.log("test_loss", value, sync_dist=True)
        return value

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        import torch

        if isinstance(batch, torch.Tensor):
            return self.model(batch)
        inputs, _ = split_batch(batch) if len(batch) > 1 else ((batch[0],), None)
        return self.model(*inputs)

    def configure_optimizers(self) -> Any:
        return _configured_optimizers(self.model, self._given[2], self._given[3])

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)


def _configured_optimizers(model: Any, optimizer: Any, scheduler: Any) -> Any:
    """``configure_optimizers`` of a compiled ``model``: the optimizer (built from the model's
    parameters when a function), alone or with its scheduler (built from the optimizer when a
    function) in Lightning's dict."""
    import torch

    if optimizer is None:
        raise ValueError("Trainer.compile got no optimizer: give optimizer=... to train")
    opt = optimizer if isinstance(optimizer, torch.optim.Optimizer) else optimizer(model.parameters())
    if scheduler is None:
        return opt
    if isinstance(scheduler, dict):
        return {"optimizer": opt, "lr_scheduler": scheduler}
    sched = scheduler if hasattr(scheduler, "step") and hasattr(scheduler, "optimizer") else scheduler(opt)
    return {"optimizer": opt, "lr_scheduler": sched}


def _accelerating(run: Any) -> Any:
    """Lightning's ``fit``/``validate``/``test``/``predict``, run with the Trainer's acceleration on."""

    @functools.wraps(run)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._accelerated():
            return run(self, *args, **kwargs)

    return method


_at_exit_registered = False


def _destroy_group_at_exit() -> None:
    """Destroy the process group when the script ends, before the interpreter shuts down: a
    process that exits with gloo's threads still running sometimes aborts ("terminate called
    without an active exception"). Not at teardown: Lightning keeps the group for a
    ``validate``/``test`` after ``fit``, and setting it up again races between the ranks."""
    global _at_exit_registered
    if not _at_exit_registered:
        _at_exit_registered = True
        atexit.register(_destroy_group)


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    launch.settle_gloo()  # the group's threads live on while Lightning's DDP wrapper holds it


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        return trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
