"""What keeps a model's own code running where nanopatch's changes would make it fail.

Two of nanopatch's changes can make code that runs stock raise:

* **channels-last**: a convolution's output has channels-last strides, and ``Tensor.view``
  cannot flatten its channels with its rows (``x.view(-1, 16 * 5 * 5)`` after a convolution,
  the classic LeNet; torchvision's Keypoint R-CNN loss). ``reshape`` can: it copies;
* **bf16 autocast**: code that mixes dtypes by hand (``out.index_add_(0, idx, expert(x) * w)``
  into an fp32 ``out``, ``out[idx] = bf16_values``) meets a bf16 result where stock has fp32;
  code that hands an intermediate to numpy (``scores.detach().numpy()``) meets a dtype numpy
  does not have.

:class:`Rescue` is a function mode around one call of the model: an op that raises for one of
those reasons runs again the way that works (the view as a ``reshape``; the op with its bf16
tensors in fp32, or an in-place op's other tensors in its own tensor's dtype), and the mode
notes why. The call then completes; nanopatch turns the change off for that model from then on
(:mod:`.forward`: bf16 at once, channels-last at the next optimizer step, where the weights,
their gradients and the optimizer's state are laid out again together). Any other error, and
one the second try does not cure, is the model's own: raised as it was.

It is entered around a model's first training call (the one the search accelerates from its
hooks, where a failed call cannot be made again) and around any later call that raised under
nanopatch's changes (made again under it); in no other call (a function mode costs time on
every op).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import amp

#: the view ops that channels-last strides make fail, and what does them by copying
_VIEWS = {torch.Tensor.view: torch.Tensor.reshape}
_VIEW_ERROR = "view size is not compatible with input tensor's size and stride"
#: how ``Tensor.numpy()`` (and numpy's ``np.asarray(tensor)``) says numpy has no bf16
_NUMPY_ERROR = "unsupported ScalarType BFloat16"
#: how torch's kernels say two tensors' dtypes differ
_DTYPE_ERROR = re.compile(r"dtype|scalar type|same type|BFloat16|bfloat16|Half|cast", re.IGNORECASE)


class Rescue(TorchFunctionMode):
    """While entered, an op that fails for channels-last strides or for a bf16 tensor where
    fp32 was expected runs again the way that works; ``view_failed`` and ``dtype_failed`` say
    why (the first such error of each kind), None where nothing failed."""

    def __init__(self) -> None:
        super().__init__()
        self.view_failed: str | None = None
        self.dtype_failed: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except (RuntimeError, TypeError) as exc:
            if func in _VIEWS and view_error(exc):
                result = _VIEWS[func](*args, **kwargs)
                self.view_failed = self.view_failed or f"Tensor.{func.__name__}"
                return result
            if dtype_error(exc) and _has_bf16((args, kwargs)):
                try:
                    result = _in_fp32(func, args, kwargs)
                except Exception:
                    raise exc from None
                self.dtype_failed = self.dtype_failed or _first_line(exc)
                return result
            raise


def view_error(exc: BaseException) -> bool:
    """Whether ``exc`` is how ``Tensor.view`` says strides (channels-last ones) do not allow it."""
    return isinstance(exc, RuntimeError) and _VIEW_ERROR in str(exc)


def dtype_error(exc: BaseException) -> bool:
    """Whether ``exc`` is how torch's kernels say two tensors' dtypes differ (a RuntimeError),
    or how ``Tensor.numpy()`` says numpy has no bf16 (a TypeError)."""
    if isinstance(exc, TypeError):
        return _NUMPY_ERROR in str(exc)
    return isinstance(exc, RuntimeError) and bool(_DTYPE_ERROR.search(str(exc)))


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _has_bf16(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.bfloat16
    if isinstance(value, (list, tuple)):
        return any(_has_bf16(v) for v in value)
    if isinstance(value, dict):
        return any(_has_bf16(v) for v in value.values())
    return False


def _in_fp32(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func`` again with its bf16 tensors in fp32, outside autocast; an in-place op (its name
    ends in ``_``, or ``__setitem__``) keeps its own tensor and gets the others in its dtype."""
    name = getattr(func, "__name__", "")
    in_place = (name.endswith("_") and not name.endswith("__")) or name == "__setitem__"
    with torch.autocast("cpu", enabled=False):
        if in_place and args and isinstance(args[0], torch.Tensor):
            target = args[0]
            rest = [_to(v, target.dtype) for v in args[1:]]
            return func(target, *rest, **{k: _to(v, target.dtype) for k, v in kwargs.items()})
        return func(*amp.to_fp32(args), **amp.to_fp32(kwargs))  # (Uncastable: the first error stands)


def _to(value: Any, dtype: torch.dtype) -> Any:
    """A floating tensor (in lists and tuples too) in ``dtype``; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to(v, dtype) for v in value)
    return value
