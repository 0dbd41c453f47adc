"""The ``cuda_to_cpu`` patch target: a script written for a CUDA GPU runs on the CPU, unedited.

Off by default; ``python -m nanopatch --cuda-to-cpu``, ``patch_torch(cuda_to_cpu=True)`` or
``NANOPATCH_CUDA_TO_CPU=1`` turn it on. Every change is an entry of the engine's journal, so
``unpatch_torch()`` puts each attribute back (``is`` the original).

* **Where tensors go.** ``Tensor.cuda()``, ``Module.cuda()``, storages' ``cuda()``, ``.to(...)``
  of tensors and modules, the ``new_*`` tensor methods, torch's factory functions
  (``torch.zeros(..., device="cuda")``, ``torch.tensor``, ``arange``, the ``*_like`` ones, the
  list torch keeps for its own default-device mode), ``torch.set_default_device("cuda")`` /
  ``with torch.device("cuda"):`` and ``torch.load(map_location=...)`` put on the CPU whatever
  names a CUDA device (``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 0)``, a bare index).
  ``torch.device("cuda")`` itself stays a CUDA *name* (``device.type == "cuda"``, so scripts
  that branch on it take their GPU path); everything that receives it places on the CPU.
  Each of these is a thin Python function around torch's own: a few hundred nanoseconds on
  calls that name a device, nothing on the operations of a training step.
* **Mixed precision.** ``torch.autocast("cuda", ...)`` / ``torch.cuda.amp.autocast()`` become
  ``torch.autocast("cpu", dtype=torch.bfloat16)`` when the ``bf16`` option is on (by default:
  the CPU has native bf16), else a disabled autocast. A CUDA ``GradScaler`` passes the loss and
  the step through unscaled (bf16 needs no loss scaling) and keeps its API: ``state_dict()``
  has the layout a GPU run saves (the scale it was configured with, never changed here).
* **Queries.** ``torch.cuda.is_available()`` is True and ``device_count()`` the number of local
  ranks (1 outside ``--nproc``) for the script and the libraries it calls, so a script takes the
  GPU path its author wrote, which now runs here; torch's own code (its optimizers' graph-capture
  checks, the DataLoader's pinning, ``fork_rng``, ``DataParallel``) keeps the machine's answer,
  so torch never starts down a path that needs a driver. Memory queries answer the process's
  resident memory (peak: its high-water mark).
* **Distributed.** ``backend="nccl"`` becomes gloo; ``DistributedDataParallel(device_ids=...)``
  wraps the CPU model without device lists.
* **No CPU meaning.** CUDA graphs, stream priorities and custom CUDA kernels raise
  :class:`~.standins.NoCpuEquivalent`, naming the call. Plain streams, ``torch.cuda.stream(s)``
  and events are harmless stand-ins (one stream, in program order; events time on the clock).
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

from nanopatch import engine
from nanopatch.engine import versions
from nanopatch.foundation import cpu
from nanopatch.foundation.log import log_once

from . import standins
from .standins import NoCpuEquivalent

__all__ = ["EXTENSIONS", "CudaToCpu", "is_cuda"]

logger = logging.getLogger("nanopatch")

#: the registered name of this target's part on ``torch.utils.cpp_extension``
EXTENSIONS = "cuda_extensions"

CPU = torch.device("cpu")

#: the option in force, the device index the script chose, and the main part's context (the
#: journal's records of torch.cuda's stock functions)
_state: dict[str, Any] = {"bf16": False, "device": 0, "ctx": None}
#: CUDA GradScalers made while patched -> the state their API reports (they never scale)
_scalers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_cuda(device: Any) -> bool:
    """Whether ``device`` names a CUDA device: "cuda", "cuda:1", ``torch.device("cuda")`` or a
    bare index (which torch reads as a CUDA device)."""
    kind = type(device)
    if kind is str:
        return device.startswith("cuda")
    if kind is torch.device:
        return device.type == "cuda"
    return kind is int


def _names_cuda(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(is_cuda(v) for v in value)
    return is_cuda(value)


def _factory(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.zeros(..., device="cuda")`` and every other factory; ``t.new_zeros(...)``."""
    device = kwargs.get("device")
    if device is not None and is_cuda(device):
        kwargs["device"] = CPU
    return wrapped(*args, **kwargs)


def _to(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``Tensor.to``: a CUDA device, positional or ``device=``, is the CPU."""
    if args and is_cuda(args[0]):
        args = (CPU, *args[1:])
    device = kwargs.get("device")
    if device is not None and is_cuda(device):
        kwargs["device"] = CPU
    return wrapped(*args, **kwargs)


def _module_to(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``Module.to``: moving to a CUDA device alone leaves the module as it is (as ``cuda()``
    does: its tensors are on the CPU already, and a lazy module's uninitialised parameters
    cannot be moved); with a dtype too, the dtype is applied on the CPU."""
    if args and is_cuda(args[0]):
        if len(args) == 1 and set(kwargs) <= {"non_blocking"}:
            return instance
        args = (CPU, *args[1:])
    device = kwargs.get("device")
    if device is not None and is_cuda(device):
        if not args and set(kwargs) <= {"device", "non_blocking"}:
            return instance
        kwargs["device"] = CPU
    return wrapped(*args, **kwargs)


def _tensor_cuda(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``t.cuda(device=None, non_blocking=False, memory_format=...)``: the tensor, on the CPU."""
    kwargs = dict(kwargs)
    kwargs.pop("device", None)
    if len(args) > 1:
        kwargs.setdefault("non_blocking", args[1])
    if len(args) > 2:
        kwargs.setdefault("memory_format", args[2])
    return _original_to(instance, CPU, **kwargs)


def _original_to(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return torch._C.TensorBase.to(tensor, *args, **kwargs)


def _returns_instance(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``Module.cuda()``, storages' ``cuda()`` (already on the CPU), ``Tensor.pin_memory()``
    (no GPU to copy to: pinned and pageable memory are the same to the CPU)."""
    return instance


def _record_stream(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    stream = args[0] if args else kwargs.get("stream")
    if isinstance(stream, standins.Stream):
        return None
    return wrapped(*args, **kwargs)


def _device_context_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.set_default_device("cuda")`` and ``with torch.device("cuda"):``."""
    if args and is_cuda(args[0]):
        args = (CPU, *args[1:])
    if is_cuda(kwargs.get("device")):
        kwargs["device"] = CPU
    return wrapped(*args, **kwargs)


def _to_cpu_if_cuda(storage: Any, location: str) -> Any:
    """A ``map_location`` callable: storages saved on a CUDA device stay on the CPU; any other
    goes where torch would put it (None)."""
    return storage if location.startswith("cuda") else None


def map_location(given: Any) -> Any:
    """What ``torch.load`` gets for the ``map_location`` a script passed."""
    if given is None:
        return _to_cpu_if_cuda
    if is_cuda(given):
        return CPU
    if isinstance(given, dict):
        from torch.serialization import default_restore_location

        table = dict(given)

        def mapped(storage: Any, location: str) -> Any:
            where = table.get(location, location)
            if is_cuda(where) or (isinstance(where, str) and where.startswith("cuda")):
                return storage
            return default_restore_location(storage, str(where))

        return mapped
    if callable(given) and not isinstance(given, (str, torch.device)):

        def called(storage: Any, location: str) -> Any:
            result = given(storage, location)  # storages' cuda() returns them as they are
            return _to_cpu_if_cuda(storage, location) if result is None else result

        return called
    return given


def _load(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if len(args) > 1:
        args = (args[0], map_location(args[1]), *args[2:])
    else:
        kwargs["map_location"] = map_location(kwargs.get("map_location"))
    return wrapped(*args, **kwargs)


# --- mixed precision ------------------------------------------------------------------

_AUTOCAST_ARGS = ("device_type", "dtype", "enabled", "cache_enabled")


def _autocast_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    given = dict(zip(_AUTOCAST_ARGS, args, strict=False))
    given.update(kwargs)
    if given.get("device_type") != "cuda":
        return wrapped(*args, **kwargs)
    given["device_type"] = "cpu"
    given["dtype"] = torch.bfloat16
    given["enabled"] = bool(given.get("enabled", True)) and _state["bf16"]
    return wrapped(**given)


_SCALER_ARGS = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
_SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _scaler_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    given = dict(zip(_SCALER_ARGS, args, strict=False))
    given.update(kwargs)
    if not is_cuda(given.get("device", "cuda")):
        return wrapped(*args, **kwargs)
    result = wrapped(**{**given, "enabled": False})  # stock's pass-through: scale() returns the loss
    _scalers[instance] = {
        "enabled": bool(given.get("enabled", True)),
        "scale": float(given.get("init_scale", 2.0**16)),
        "growth_factor": float(given.get("growth_factor", 2.0)),
        "backoff_factor": float(given.get("backoff_factor", 0.5)),
        "growth_interval": int(given.get("growth_interval", 2000)),
        "_growth_tracker": 0,
    }
    return result


def _scaler_state(instance: Any) -> dict[str, Any] | None:
    try:
        return _scalers.get(instance)
    except TypeError:  # pragma: no cover - not weak-referenceable
        return None


def _scaler_state_dict(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _scaler_state(instance)
    if state is None:
        return wrapped(*args, **kwargs)
    return {key: state[key] for key in _SCALER_KEYS} if state["enabled"] else {}


def _scaler_load_state_dict(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _scaler_state(instance)
    if state is None:
        return wrapped(*args, **kwargs)
    if not state["enabled"]:
        return None
    source = args[0] if args else kwargs["state_dict"]
    if len(source) == 0:
        raise RuntimeError(
            "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
        )
    for key in _SCALER_KEYS:
        if key in source:
            value = source[key]
            state[key] = float(value) if key != "growth_interval" else int(value)
    state["_growth_tracker"] = int(state["_growth_tracker"])
    return None


def _scaler_is_enabled(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _scaler_state(instance)
    return wrapped(*args, **kwargs) if state is None else state["enabled"]


def _scaler_getter(key: str) -> Callable[..., Any]:
    def get(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = _scaler_state(instance)
        return wrapped(*args, **kwargs) if state is None else state[key]

    return get


def _scaler_setter(key: str) -> Callable[..., Any]:
    def set_(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = _scaler_state(instance)
        if state is None:
            return wrapped(*args, **kwargs)
        state[key] = args[0] if args else next(iter(kwargs.values()))
        return None

    return set_


# --- torch.cuda's functions -------------------------------------------------------------


def _torch_asks(depth: int = 2) -> bool:
    """Whether the caller of the function calling this is torch itself (a module of the torch
    package): torch's own branches on CUDA lead to CUDA kernels, streams and drivers, and must
    keep seeing the machine as it is."""
    try:
        name = sys._getframe(depth).f_globals.get("__name__") or ""
    except ValueError:  # pragma: no cover - no such frame
        return False
    return name == "torch" or name.startswith("torch.")


def _stock_cuda(name: str) -> Any:
    ctx = _state["ctx"]
    return ctx.original(torch.cuda, name) if ctx is not None else torch.cuda.__dict__[name]


def is_available() -> bool:
    """True for the script (and the libraries it calls), so that it takes the GPU path its
    author wrote, every form of which runs here; torch's own code gets the machine's answer."""
    if _torch_asks():
        return _stock_cuda("is_available")()
    return True


def device_count() -> int:
    """The local ranks of a ``--nproc`` run (each takes "its" device), else 1; torch's own code
    gets the machine's answer."""
    if _torch_asks():
        return _stock_cuda("device_count")()
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    except ValueError:
        return 1


def _index(device: Any) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.index is not None:
        return device.index
    return 0


def set_device(device: Any) -> None:
    _state["device"] = _index(device)


def current_device() -> int:
    return _state["device"]


def _model_name() -> str:
    try:
        return cpu.host_facts().model_name
    except Exception:  # pragma: no cover - a name is not worth failing for
        return ""


def get_device_name(device: Any = None) -> str:
    return standins.device_name(_model_name())


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return (0, 0)  # no CUDA architecture: scripts that need one (tensor cores, fp8) keep off it


def get_device_properties(device: Any = None) -> standins.CpuDeviceProperties:
    return standins.device_properties(_model_name())


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return _state["bf16"]


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    """The CPU generator's state: "CUDA" draws are the CPU generator's (set_rng_state does
    nothing, so saving and restoring it is harmless)."""
    return torch.get_rng_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [torch.get_rng_state() for _ in range(device_count())]


def default_stream(device: Any = None) -> standins.Stream:
    return standins.current_stream(device)


_NO_CPU_CALLS = {
    "CUDAGraph": "run the captured work eagerly instead",
    "graph": "run the captured code directly",
    "make_graphed_callables": "call the callables directly",
    "graph_pool_handle": "",
}


def _cuda_replacements() -> dict[str, Any]:
    return {
        "is_available": is_available,
        "device_count": device_count,
        "current_device": current_device,
        "set_device": set_device,
        "get_device_name": get_device_name,
        "get_device_capability": get_device_capability,
        "get_device_properties": get_device_properties,
        "is_bf16_supported": is_bf16_supported,
        "synchronize": standins.nothing,
        "empty_cache": standins.nothing,
        "ipc_collect": standins.nothing,
        "reset_peak_memory_stats": standins.reset_peak,
        "reset_max_memory_allocated": standins.reset_peak,
        "reset_max_memory_cached": standins.reset_peak,
        "reset_accumulated_memory_stats": standins.nothing,
        "memory_allocated": standins.memory_allocated,
        "max_memory_allocated": standins.max_memory_allocated,
        "memory_reserved": standins.memory_allocated,
        "max_memory_reserved": standins.max_memory_allocated,
        "memory_cached": standins.memory_allocated,
        "max_memory_cached": standins.max_memory_allocated,
        "mem_get_info": standins.mem_get_info,
        "memory_stats": standins.memory_stats,
        "memory_summary": standins.memory_summary,
        "manual_seed": standins.nothing,
        "manual_seed_all": standins.nothing,
        "seed": standins.nothing,
        "seed_all": standins.nothing,
        "initial_seed": torch.initial_seed,
        "get_rng_state": get_rng_state,
        "get_rng_state_all": get_rng_state_all,
        "set_rng_state": standins.nothing,
        "set_rng_state_all": standins.nothing,
        "Stream": standins.Stream,
        "Event": standins.Event,
        "stream": standins.stream,
        "current_stream": standins.current_stream,
        "default_stream": default_stream,
        "set_stream": standins.nothing,
        "device": standins.DeviceScope,
        "device_of": standins.DeviceOf,
        **{
            name: standins.refuse(f"torch.cuda.{name}", hint, isinstance(torch.cuda.__dict__.get(name), type))
            for name, hint in _NO_CPU_CALLS.items()
        },
    }


def _named(name: str, function: Any) -> Any:
    """A function of its own for ``torch.cuda.<name>`` (torch.compile's rules map each torch
    object to one name: two names must never share a function)."""
    if isinstance(function, type) or getattr(function, "__module__", None) == __name__:
        return function  # a class, or one of this module's own (each stands in for one name)

    def standin(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    standin.__name__ = name
    standin.__qualname__ = name
    standin.__doc__ = function.__doc__
    standin.__wrapped__ = function  # type: ignore[attr-defined]
    return standin


# --- distributed ------------------------------------------------------------------------


def _is_nccl(backend: Any) -> bool:
    return isinstance(backend, str) and "nccl" in backend.lower()


def _init_process_group(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if args and _is_nccl(args[0]):
        args = ("gloo", *args[1:])
    if _is_nccl(kwargs.get("backend")):
        kwargs["backend"] = "gloo"
    if is_cuda(kwargs.get("device_id")):
        del kwargs["device_id"]
    return wrapped(*args, **kwargs)


def _new_group(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if len(args) > 2 and _is_nccl(args[2]):
        args = (*args[:2], "gloo", *args[3:])
    if _is_nccl(kwargs.get("backend")):
        kwargs["backend"] = "gloo"
    return wrapped(*args, **kwargs)


def _barrier(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _names_cuda(kwargs.get("device_ids")):
        del kwargs["device_ids"]  # a GPU to synchronise on: gloo has none
    return wrapped(*args, **kwargs)


def _ddp_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    args = list(args)
    for position, name in ((1, "device_ids"), (2, "output_device")):
        if len(args) > position and _names_cuda(args[position]):
            args[position] = None
        elif _names_cuda(kwargs.get(name)):
            kwargs[name] = None
    return wrapped(*args, **kwargs)


# --- custom CUDA kernels ------------------------------------------------------------------


def _cuda_sources(sources: Any) -> bool:
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    return any(str(s).endswith((".cu", ".cuh")) for s in sources or ())


def _extension_load(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    sources = kwargs.get("sources", args[1] if len(args) > 1 else ())
    if kwargs.get("with_cuda") or _cuda_sources(sources):
        raise NoCpuEquivalent(
            "torch.utils.cpp_extension.load with CUDA sources", "a custom CUDA kernel needs a CPU implementation"
        )
    return wrapped(*args, **kwargs)


def _extension_load_inline(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    cuda_sources = kwargs.get("cuda_sources", args[2] if len(args) > 2 else None)
    if kwargs.get("with_cuda") or cuda_sources:
        raise NoCpuEquivalent(
            "torch.utils.cpp_extension.load_inline with cuda_sources", "a custom CUDA kernel needs a CPU implementation"
        )
    return wrapped(*args, **kwargs)


# --- patch / unpatch ----------------------------------------------------------------------

#: factory functions beyond torch's own default-device list
_LIKE = ("zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like")
_NEW = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided")


class CudaToCpu(engine.Target):
    """A script written for a GPU runs on the CPU (registered twice: on ``torch``, and as
    :data:`EXTENSIONS` on ``torch.utils.cpp_extension``)."""

    #: torch versions this target is written against (``torch.amp.GradScaler``, autocast's device_type)
    supported = versions.supported("torch")

    def patch(self, ctx: engine.Context) -> None:
        if ctx.name == EXTENSIONS:
            _patch_extensions(ctx)
        else:
            _patch(ctx)

    def unpatch(self, ctx: engine.Context) -> None:
        if ctx.name != EXTENSIONS:
            _scalers.clear()  # the scalers made while patched stay stock ones, disabled
            _state["device"] = 0

    def describe(self) -> dict[str, Any]:
        """For ``nanopatch.status()``: what the CUDA forms become here."""
        return {
            "cuda_autocast": "bf16 autocast on the CPU" if _state["bf16"] else "off (the bf16 option is off)",
            "is_available": True,
            "device_count": device_count(),
            "grad_scalers": len(_scalers),
        }


def _patch(ctx: engine.Context) -> None:
    assert ctx.config is not None
    _state["bf16"] = bool(ctx.config.bf16)
    _state["ctx"] = ctx
    try:
        # torch.compile's rules (what each torch function is) are built once, when dynamo is
        # imported, by looking torch's names up: they must see torch's own functions, not these
        # stand-ins (stock torch imports it at the first optimizer anyway)
        import torch._dynamo
    except Exception as exc:  # pragma: no cover - a torch without a working dynamo
        logger.debug("torch._dynamo not imported before --cuda-to-cpu: %s", exc)
    _place_on_cpu(ctx)
    _mixed_precision(ctx)
    for name, new in _cuda_replacements().items():
        original = torch.cuda.__dict__.get(name)
        if original is not None:
            ctx.replace_everywhere(original, _named(name, new), "torch.cuda")
    _distributed(ctx)
    log_once(
        "cuda-to-cpu",
        "--cuda-to-cpu: CUDA calls run on the CPU; CUDA autocast is %s",
        "bf16 autocast on the CPU" if _state["bf16"] else "off (the bf16 option is off)",
    )


def _place_on_cpu(ctx: engine.Context) -> None:
    from torch import nn
    from torch.storage import TypedStorage, _StorageBase
    from torch.utils import _device

    # torch caches its list of factories at first use; it must hold the stock functions (a
    # wrapt wrapper compares and hashes as the function it wraps, so the mode finds them)
    factories = list(_device._device_constructors())
    names = {getattr(f, "__name__", None) for f in factories} | set(_LIKE)
    for name in sorted(n for n in names if n):
        if callable(torch.__dict__.get(name)):
            ctx.wrap(torch, name, _factory)
    ctx.wrap(torch.Tensor, "to", _to)
    ctx.wrap(torch.Tensor, "cuda", _tensor_cuda)
    ctx.wrap(torch.Tensor, "pin_memory", _returns_instance)
    ctx.wrap(torch.Tensor, "record_stream", _record_stream)
    for name in _NEW:
        if hasattr(torch.Tensor, name):
            ctx.wrap(torch.Tensor, name, _factory)
    ctx.wrap(nn.Module, "to", _module_to)
    ctx.wrap(nn.Module, "cuda", _returns_instance)
    ctx.wrap(_StorageBase, "cuda", _returns_instance)
    ctx.wrap(TypedStorage, "cuda", _returns_instance)
    ctx.wrap(_device.DeviceContext, "__init__", _device_context_init)
    load = torch.serialization.__dict__["load"]
    wrapped = ctx.wrap(torch.serialization, "load", _load)
    if torch.__dict__.get("load") is load:
        ctx.replace(torch, "load", wrapped)


def _mixed_precision(ctx: engine.Context) -> None:
    from torch.amp import autocast_mode, grad_scaler

    ctx.wrap(autocast_mode.autocast, "__init__", _autocast_init)
    scaler = grad_scaler.GradScaler
    ctx.wrap(scaler, "__init__", _scaler_init)
    ctx.wrap(scaler, "state_dict", _scaler_state_dict)
    ctx.wrap(scaler, "load_state_dict", _scaler_load_state_dict)
    ctx.wrap(scaler, "is_enabled", _scaler_is_enabled)
    for key in ("growth_factor", "backoff_factor", "growth_interval"):
        ctx.wrap(scaler, f"get_{key}", _scaler_getter(key))
        ctx.wrap(scaler, f"set_{key}", _scaler_setter(key))


def _distributed(ctx: engine.Context) -> None:
    from torch.nn import parallel

    ctx.wrap(parallel.DistributedDataParallel, "__init__", _ddp_init)
    if not torch.distributed.is_available():
        return
    from torch.distributed import distributed_c10d

    for name, wrapper in (
        ("init_process_group", _init_process_group),
        ("new_group", _new_group),
        ("barrier", _barrier),
    ):
        original = distributed_c10d.__dict__.get(name)
        if original is None:
            continue
        new = ctx.wrap(distributed_c10d, name, wrapper)
        ctx.replace_everywhere(original, new, "torch.distributed")  # its re-exports


def _patch_extensions(ctx: engine.Context) -> None:
    from torch.utils import cpp_extension

    ctx.wrap(cpp_extension, "load", _extension_load)
    ctx.wrap(cpp_extension, "load_inline", _extension_load_inline)
