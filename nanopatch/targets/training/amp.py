"""bf16 autocast around a model's forward, with the outputs handed back in fp32.

The user's loss then runs in fp32 exactly as in their stock script; only the model's own
operations run under ``torch.autocast("cpu", dtype=torch.bfloat16)``. Outputs are walked
through the containers models return (tensors, tuples and named tuples, lists, dicts and
``Mapping`` subclasses such as Hugging Face's ``ModelOutput``, dataclasses, plain objects
with a ``__dict__``); anything else that could hide a tensor makes :func:`to_fp32` report
failure, so the caller can give that model up and run it stock.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

#: Leaf types that can never hold a tensor.
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, range, slice)


class Uncastable(Exception):
    """An output nanopatch cannot look into, so it cannot promise it holds no bf16 tensor."""

    def __init__(self, kind: type) -> None:
        super().__init__(f"{kind.__module__}.{kind.__qualname__}")
        self.kind = kind


def autocast_enabled() -> bool:
    """Whether CPU autocast is on here already (the user's own ``torch.autocast``, or an outer
    model of ours): then a paired model neither enters it again nor casts its outputs."""
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def autocast(dtype: torch.dtype) -> torch.autocast:
    return torch.autocast("cpu", dtype=dtype)


def current_dtype() -> torch.dtype:
    """The dtype of the CPU autocast in force."""
    try:
        return torch.get_autocast_dtype("cpu")
    except AttributeError:  # torch < 2.4
        return torch.get_autocast_cpu_dtype()


def autocast_cast(value: Any, dtype: torch.dtype) -> Any:
    """What CPU autocast does to an operator's argument when it runs the operator in ``dtype``
    (bf16 for a lower-precision operator, fp32 for an fp32 one): a CPU floating tensor other
    than float64 is cast to it; anything else is left as it is."""
    if (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.device.type == "cpu"
        and value.dtype not in (dtype, torch.float64)
    ):
        return value.to(dtype)
    return value


def outside_autocast() -> Any:
    """A guard under which operators skip CPU autocast's dispatch key, as autocast's own kernels
    call the operator they wrap (for nanopatch's kernels at that key)."""
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


def chosen_weight_dtypes(model: torch.nn.Module) -> str | None:
    """Why bf16 autocast has no place in ``model``, or None: a model the script gave bf16, fp16
    or fp64 parameters (``model.to(torch.bfloat16)``, a language model loaded in bf16 with fp32
    adapters beside, ``torch.set_default_dtype(torch.float64)``) computes in the dtypes its
    script chose. Under autocast a bf16 model's outputs would come back fp32 where stock's are
    bf16, and autocast's fp32 operators (layer norms, softmax) would compute in fp32 where stock
    computes in bf16; autocast leaves fp64 as it is."""
    counts: dict[torch.dtype, int] = {}
    floating = 0
    for param in model.parameters():
        if param.is_floating_point():
            floating += 1
            if param.dtype != torch.float32:
                counts[param.dtype] = counts.get(param.dtype, 0) + 1
    if not counts:
        return None
    held = " and ".join(f"{n} in {str(dtype).removeprefix('torch.')}" for dtype, n in counts.items())
    return f"the script chose its weights' dtypes ({held} of its {floating} floating parameters)"


def first_float_dtype(value: Any, depth: int = 0) -> torch.dtype | None:
    """The dtype of the first floating tensor in ``value`` (a tensor, or the containers
    models return), or None."""
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() else None
    if depth > 4:
        return None
    if isinstance(value, (tuple, list)):
        items = value
    elif isinstance(value, Mapping):
        items = value.values()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    else:
        return None
    for item in items:
        found = first_float_dtype(item, depth + 1)
        if found is not None:
            return found
    return None


def to_fp32(value: Any, dtype: torch.dtype = torch.bfloat16) -> Any:
    """``value`` with every floating tensor of ``dtype`` in it cast to float32.

    Containers are rebuilt (never changed in place) as the same type. Raises
    :class:`Uncastable` for a value it cannot look into."""
    return _cast(value, dtype, 0)


def _cast(value: Any, dtype: torch.dtype, depth: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype == dtype else value
    if isinstance(value, _PLAIN):
        return value
    if depth > 32:
        raise Uncastable(type(value))
    depth += 1
    kind = type(value)
    if isinstance(value, tuple):
        items = [_cast(v, dtype, depth) for v in value]
        if hasattr(value, "_fields"):  # a named tuple
            return kind(*items)
        return tuple(items) if kind is tuple else kind(items)
    if isinstance(value, list):
        items = [_cast(v, dtype, depth) for v in value]
        return items if kind is list else _rebuilt_sequence(value, items)
    if isinstance(value, Mapping):
        return _cast_mapping(value, dtype, depth)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _cast_attributes(value, dtype, depth, [f.name for f in dataclasses.fields(value)])
    if hasattr(value, "__dict__") and not callable(value) and not isinstance(value, type):
        return _cast_attributes(value, dtype, depth, list(vars(value)))
    if kind.__module__.split(".")[0] == "numpy":
        return value  # numpy arrays and scalars hold no torch tensor
    raise Uncastable(kind)


def _rebuilt_sequence(value: list, items: list) -> list:
    new = copy.copy(value)
    new[:] = items
    return new


def _cast_mapping(value: Mapping, dtype: torch.dtype, depth: int) -> Mapping:
    cast = {k: _cast(v, dtype, depth) for k, v in value.items()}
    if type(value) is dict:
        return cast
    if all(cast[k] is value[k] for k in cast):
        return value  # nothing to change: keep the object itself
    try:
        new = copy.copy(value)
        for k, v in cast.items():
            new[k] = v  # ModelOutput's __setitem__ keeps its attributes in step
    except Exception as exc:
        raise Uncastable(type(value)) from exc
    return new


def _cast_attributes(value: Any, dtype: torch.dtype, depth: int, names: list[str]) -> Any:
    changed = {}
    for name in names:
        old = getattr(value, name)
        new = _cast(old, dtype, depth)
        if new is not old:
            changed[name] = new
    if not changed:
        return value
    try:
        new_value = copy.copy(value)
        for name, new in changed.items():
            object.__setattr__(new_value, name, new)  # frozen dataclasses too
    except Exception as exc:
        raise Uncastable(type(value)) from exc
    return new_value
