"""BigDL-Nano's custom-loop APIs: :class:`TorchNano` and :func:`nano`.

``TorchNano``: subclass it, write ``train(self, ...)``, call ``self.setup(model, optimizer,
*dataloaders)`` and ``self.backward(loss)`` inside; ``MyNano(num_processes=2, ...).train(...)``
runs it. ``@nano(...)`` decorates a function that takes model, optimizer(s) and dataloader(s).

Both run on Lightning Fabric (the maintained successor of the LightningLite that BigDL-Nano's
TorchNano was built on) when Lightning is installed: ``num_processes=N`` starts N processes,
each pinned to its share of the physical cores, with Fabric's DDP over gloo, sharded loaders
and averaged gradients; the return value is rank 0's. The processes are forked
(:mod:`nanopatch.runtime.processes`): called at a script's top level, without a main guard, with closures and
lambdas in reach, the script's code runs once. ``precision='bf16'`` is Fabric's bf16 autocast;
``channels_last`` and ``use_ipex`` (and bf16 with IPEX) are nanopatch's training engine, on
while ``train`` runs. Without Lightning, the same runs on nanopatch's own engine: N pinned
processes in a gloo group, its data-parallel patch (DDP at the model's first training call,
averaged gradients, the LR warm-up), and ``setup`` sharding the loaders it is given.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from nanopatch import engine
from nanopatch.foundation.log import log_once
from nanopatch.runtime import launch, loopback, processes

from .lightning import (
    LrWarmup,
    check_switches,
    engine_options,
    ipex_before_training,
    native_bf16_or_warn,
    warn_if_ipex_unused,
)

logger = logging.getLogger("nanopatch")

#: the precisions TorchNano and @nano take (BigDL-Nano's, and Lightning's names for them)
PRECISIONS = ("32", "32-true", "bf16", "bf16-mixed")


def fabric_available() -> bool:
    return (
        importlib.util.find_spec("lightning") is not None and importlib.util.find_spec("lightning.fabric") is not None
    )


def _precision(precision: Any, use_ipex: bool, fabric_autocast: bool = True) -> tuple[str, bool]:
    """(Fabric's precision, whether nanopatch's engine computes in bf16). Without
    ``fabric_autocast`` (``@nano``, whose function calls ``loss.backward()`` itself, which
    Fabric's mixed precision refuses) bf16 is the engine's autocast."""
    text = str(precision)
    if text not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))} (or 32), not {precision!r}")
    if text not in ("bf16", "bf16-mixed"):
        return "32-true", False
    if not native_bf16_or_warn(precision, "nano-bf16"):
        return "32-true", False
    if use_ipex or not fabric_autocast or not fabric_available():
        return "32-true", True  # nanopatch's autocast (with IPEX: its bf16 path)
    return "bf16-mixed", False


class TorchNano:
    """Subclass, write ``train(self, ...)``, and call ``MyNano(...).train(...)``."""

    _fabric_autocast = True  # bf16 by Fabric's precision (train() calls self.backward)

    def __init__(
        self,
        num_processes: int = 1,
        use_ipex: bool = False,
        precision: Any = "32",
        channels_last: bool = False,
        cpu_for_each_process: Sequence[Sequence[int]] | None = None,
        auto_lr: bool = True,
    ) -> None:
        groups = check_switches(num_processes, cpu_for_each_process, use_ipex, channels_last, auto_lr)
        fabric_precision, engine_bf16 = _precision(precision, use_ipex, self._fabric_autocast)
        self.num_processes = num_processes
        self.auto_lr = auto_lr
        self._groups = groups
        self._fabric_precision = fabric_precision
        self._engine = engine_options(engine_bf16, channels_last, use_ipex)
        self._fabric: Any = None
        self._ipex_applied = False  # whether IPEX optimized the model in setup
        self._warmups: list[LrWarmup] = []

    # --- what train() calls ---

    def setup(self, model: Any, optimizer: Any = None, *dataloaders: Any) -> Any:
        """``(model, optimizer, *dataloaders)`` ready for this process: wrapped for DDP and
        autocast, loaders sharded (with Fabric); as they are otherwise. ``setup(model)`` alone
        returns the model."""
        optimizers = () if optimizer is None else (optimizer,)
        model, optimizers, loaders = self._set_up(model, optimizers, dataloaders)
        if optimizer is None and not dataloaders:
            return model
        return (model, *optimizers, *loaders)

    def _set_up(self, model: Any, optimizers: Sequence[Any], loaders: Sequence[Any]) -> tuple[Any, list, list]:
        if self._engine is not None and self._engine["ipex"] and optimizers:
            # before anything wraps the model (IPEX replaces its weights, which DDP hooks)
            if ipex_before_training(model, optimizers, self._engine["bf16"], "TorchNano.setup"):
                self._ipex_applied = True
        fabric = self._fabric
        if fabric is None:  # one process, or nanopatch's own processes: its engine wraps the model in DDP
            if self.num_processes > 1:
                from nanopatch.targets.parallel import patch as distributed

                for loader in loaders:
                    if not distributed.shard(loader):
                        log_once(
                            "nano-unsharded",
                            "TorchNano.setup: a DataLoader with a sampler of its own is not sharded; "
                            "every process reads all of it",
                        )
            return model, list(optimizers), list(loaders)
        if optimizers:
            model, *optimizers = fabric.setup(model, *optimizers)
        else:
            model = fabric.setup(model)
        if loaders:
            ready = fabric.setup_dataloaders(*loaders)
            loaders = list(ready) if len(loaders) > 1 else [ready]
        if optimizers and self.auto_lr and fabric.world_size > 1:
            warmup = LrWarmup(fabric.world_size)
            steps = len(loaders[0]) if loaders and hasattr(loaders[0], "__len__") else 1
            warmup.attach([getattr(o, "optimizer", o) for o in optimizers], steps)
            self._warmups.append(warmup)
        return model, list(optimizers), list(loaders)

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        if self._fabric is None:
            loss.backward(*args, **kwargs)
        else:
            self._fabric.backward(loss, *args, **kwargs)

    @property
    def global_rank(self) -> int:
        if self._fabric is not None:
            return self._fabric.global_rank
        return _group_value("get_rank", 0)

    @property
    def world_size(self) -> int:
        if self._fabric is not None:
            return self._fabric.world_size
        return _group_value("get_world_size", 1)

    # --- running ---

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        user = cls.__dict__.get("train")
        if user is not None and not getattr(user, "_nanopatch_launcher", False):
            cls._user_train = user
            cls.train = _launching(user)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("subclass TorchNano and write train(self, ...)")

    def _launch(self, args: tuple, kwargs: dict) -> Any:
        if self.num_processes == 1:
            if fabric_available():
                return _make_fabric(self).launch(_run, self, args, kwargs)
            return _run(None, self, args, kwargs)
        # rank 0's result comes back through a file: through a pipe, a result larger than the
        # pipe's buffer would block rank 0 until the caller reads, and the caller reads once all ended
        with tempfile.TemporaryDirectory(prefix="nanopatch-") as folder:
            result = os.path.join(folder, "rank0.pickle")
            method = processes.fork_or_spawn(type(self).__name__)
            with processes.launching():
                if fabric_available():
                    _make_fabric(self, method).launch(_run, self, args, kwargs, result)
                else:
                    _spawn(self, method, args, kwargs, result)
            with open(result, "rb") as f:
                return pickle.load(f)

    @contextlib.contextmanager
    def _accelerated(self) -> Iterator[None]:
        options = self._engine
        if self._fabric is None and self.num_processes > 1:  # nanopatch's own processes: its data-parallel engine
            base = options or engine_options(False, False, False, force=True)
            options = {**base, "data_parallel": True, "auto_lr": self.auto_lr}
        if options is None:
            yield
            return
        with engine.patched(**options):
            yield
            if options["ipex"]:
                warn_if_ipex_unused(type(self).__name__, self._ipex_applied)


def _group_value(name: str, alone: int) -> int:
    """The process group's rank or size (nanopatch's own processes), or ``alone`` without one."""
    import torch.distributed as dist

    return getattr(dist, name)() if dist.is_available() and dist.is_initialized() else alone


def _launching(user: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(user)
    def train(self: TorchNano, *args: Any, **kwargs: Any) -> Any:
        if self._fabric is not None or getattr(self, "_running", False):  # already in a process that trains
            return user(self, *args, **kwargs)
        return self._launch(args, kwargs)

    train._nanopatch_launcher = True  # type: ignore[attr-defined]
    return train


def _make_fabric(nano: TorchNano, start_method: str = "fork") -> Any:
    from lightning.fabric import Fabric

    if nano.num_processes > 1:
        from ._fabric import PinnedFabricDDP

        strategy = PinnedFabricDDP(nano._groups or [], start_method)
        return Fabric(
            accelerator="cpu", devices=nano.num_processes, strategy=strategy, precision=nano._fabric_precision
        )
    return Fabric(accelerator="cpu", devices=1, precision=nano._fabric_precision)


def _run(fabric: Any, nano: TorchNano, args: tuple, kwargs: dict, result_file: str | None = None) -> Any:
    """In each process (``fabric`` None without Lightning): ``train`` with the engine on. The
    user's ``train`` is looked up on the class here, not pickled: its name is the launching
    wrapper's. With ``result_file``, rank 0 writes its result there and every rank returns None."""
    nano._fabric = fabric
    nano._running = True
    if nano.num_processes > 1:
        _own_copies(nano.__dict__, args, kwargs)
    try:
        with nano._accelerated():
            result = type(nano)._user_train(nano, *args, **kwargs)
        if result_file is not None and nano.global_rank == 0:
            with open(result_file + ".part", "wb") as f:
                pickle.dump(result, f)
            os.replace(result_file + ".part", result_file)
        if fabric is not None and nano.num_processes > 1:
            # not after a failure: the other ranks may be inside a collective, never at the
            # barrier; the launcher ends them
            _end_group()
        return None if result_file is not None else result
    finally:
        for warmup in nano._warmups:
            warmup.detach()
        nano._warmups.clear()
        nano._fabric = None
        nano._running = False


def _own_copies(*roots: Any) -> None:
    """Give this spawned process its own copy of the weights it was handed.

    Forked processes have their own copy already; ``torch.multiprocessing`` pickles every
    tensor it sends to a spawned process into shared
    memory: a model (or optimizer) built before the launch would have the same weights in
    every process, and each process's optimizer step would apply to all of them (an update
    per process and step, and processes that read each other's half-written weights).
    Parameters and buffers of the modules and the state of the optimizers found in
    ``roots`` (and in the lists, tuples and dicts inside them) are copied into this
    process's memory, as Lightning's launcher does for modules; data tensors stay shared.
    """
    import torch

    seen: set[int] = set()

    def own(tensor: Any) -> Any:
        return tensor.clone() if isinstance(tensor, torch.Tensor) and tensor.is_shared() else tensor

    def walk(value: Any) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, torch.nn.Module):
            with torch.no_grad():
                for tensor in (*value.parameters(), *value.buffers()):
                    tensor.data = own(tensor.data)
        elif isinstance(value, torch.optim.Optimizer):
            for state in value.state.values():
                for key, item in state.items():
                    state[key] = own(item)
        elif isinstance(value, dict):
            for item in list(value.values()):
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for root in roots:
        walk(root)


def _end_group() -> None:
    """Destroy the process group once every rank got here: a process that exits with gloo's
    threads still running sometimes aborts at interpreter shutdown ("terminate called without
    an active exception"), which fails the whole launch."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()
        dist.destroy_process_group()
    launch.settle_gloo()  # a DDP wrapper still holding the group keeps its threads


def _spawn(nano: TorchNano, start_method: str, args: tuple, kwargs: dict, result_file: str) -> None:
    """Without Lightning: N processes on nanopatch's own data-parallel engine (a gloo process
    group, DDP at the model's first training call, sharded loaders, averaged gradients, the LR
    warm-up); rank 0 writes its result to ``result_file``. A worker's exception reaches the
    caller with the worker's traceback (torch's ``ProcessRaisedException``)."""
    import torch.multiprocessing as mp

    # this process hosts the group's store, on loopback only, for as long as the ranks run; they
    # connect to it as torchrun's ranks to their agent's (no free port looked up, then raced for)
    store = loopback.host_store(nano.num_processes)
    try:
        mp.start_processes(
            _spawned_rank,
            args=(nano, args, kwargs, store.port, result_file),
            nprocs=nano.num_processes,
            start_method=start_method,
        )
    finally:
        del store


def _spawned_rank(rank: int, nano: TorchNano, args: tuple, kwargs: dict, port: int, result_file: str) -> None:
    from nanopatch.targets.parallel import patch as distributed

    from .lightning import _Pinning

    processes.end_with_parent()
    world = str(nano.num_processes)
    os.environ.update(
        MASTER_ADDR=loopback.LOOPBACK,
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=world,
        LOCAL_WORLD_SIZE=world,
    )
    os.environ[loopback.AGENT_STORE_VARIABLE] = "True"  # the caller hosts the store (_spawn)
    os.environ.setdefault("TORCHELASTIC_RESTART_COUNT", "0")  # what some torch versions read with it
    loopback.gloo_on_loopback()
    if nano._groups:
        _Pinning(nano._groups[rank % len(nano._groups)]).apply()
    distributed.start()
    _run(None, nano, args, kwargs, result_file)
    distributed.finish()  # not after a failure: the other ranks may be inside a collective, never at its barrier


# --- @nano -------------------------------------------------------------------------------------------


class _FunctionNano(TorchNano):
    """What ``@nano`` runs: the function, with its model, optimizers and loaders set up.
    ``decorated`` is the decorated function (what pickles by name); it runs the original."""

    _fabric_autocast = False  # the function calls loss.backward(): bf16 is the engine's

    def __init__(self, decorated: Callable[..., Any], **switches: Any) -> None:
        super().__init__(**switches)
        self.decorated = decorated

    def train(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        args = list(args)
        where = _model_index(args)
        optimizers = [i for i, a in enumerate(args) if isinstance(a, torch.optim.Optimizer)]
        loaders = [i for i, a in enumerate(args) if isinstance(a, torch.utils.data.DataLoader)]
        model = args[where]
        ready_model, ready_optimizers, ready_loaders = self._set_up(
            model, [args[i] for i in optimizers], [args[i] for i in loaders]
        )
        args[where] = ready_model
        for i, value in [*zip(optimizers, ready_optimizers, strict=True), *zip(loaders, ready_loaders, strict=True)]:
            args[i] = value
        result = self.decorated.__wrapped__(*args, **kwargs)
        if self.num_processes > 1:
            return result, (_to_bytes(model.state_dict()) if self.global_rank == 0 else None)
        return result


def _model_index(args: Sequence[Any]) -> int:
    """Where the model is among ``@nano``'s positional arguments: the one ``nn.Module`` with
    parameters that is not a loss (BigDL-Nano's guide passes ``nn.CrossEntropyLoss()`` beside
    the model)."""
    import torch

    modules = [
        i
        for i, a in enumerate(args)
        if isinstance(a, torch.nn.Module)
        and not isinstance(a, torch.nn.modules.loss._Loss)
        and any(True for _ in a.parameters())
    ]
    if len(modules) != 1:
        raise ValueError(
            "@nano: the function must take exactly one model (an nn.Module with parameters, "
            f"not a loss) as a positional argument; it got {len(modules)}"
        )
    return modules[0]


def _to_bytes(state: Any) -> bytes:
    """Rank 0's weights as bytes: tensors sent through a queue would be shared memory that the
    process, which ends right after, has to keep alive until the caller opens it."""
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def nano(**switches: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@nano(num_processes=1, use_ipex=False, precision="32", channels_last=False,
    cpu_for_each_process=None, auto_lr=True)``, :class:`TorchNano`'s switches: decorate a
    training function that takes its model, optimizer(s) and dataloader(s) as arguments. With
    ``num_processes > 1`` it runs in N processes and returns rank 0's result; the caller's
    model ends with the trained weights either way."""
    TorchNano(**switches)  # bad switches fail at decoration

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            import torch

            model = args[_model_index(args)]  # a bad call fails here, not in every process
            out = _FunctionNano(run, **switches).train(*args, **kwargs)
            if switches.get("num_processes", 1) == 1:
                return out
            result, state = out
            model.load_state_dict(torch.load(io.BytesIO(state), weights_only=True))
            return result

        return run

    return decorate
