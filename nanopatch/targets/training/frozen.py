"""Frozen weights cast to bf16 once, not in every forward.

CPU autocast casts a weight to bf16 each time a matrix product or a convolution uses it, and
caches the cast (within one autocast region) only for leaves that require grad. A parameter
that never gets a gradient (a LoRA base, a frozen backbone, a frozen embedding used as an output
layer) is cast again in every forward: for GPT-2 small under LoRA that is 124M fp32 values read
and 124M bf16 values written per step, to compute what the previous step computed.

While an accelerated model's forward runs under nanopatch's bf16 autocast and the model has
frozen fp32 parameters, a :class:`torch.overrides.TorchFunctionMode` hands the operators that
autocast runs in bf16 (:data:`PRODUCTS`) a bf16 copy of each frozen parameter among their
arguments instead of the parameter: the very tensor autocast's cast would make (``.to(bf16)``,
the same rounding and strides), made once and kept while the parameter is unchanged. Autocast
then finds that argument in bf16 already and casts the others as it always does; the result is
bit for bit stock autocast's.

A copy is made again when its parameter changed: its version counter moves with every in-place
update torch sees (``load_state_dict``, ``copy_`` or ``lerp_`` under ``no_grad``, an optimizer
step once it is unfrozen), its storage with ``param.data = ...`` and ``.to()``. A copy is used
only while the parameter does not require grad, is fp32 on the CPU and autocast's dtype is bf16
at that call (a ``torch.autocast(enabled=False)`` section inside the forward gets the fp32
parameter). The parameters themselves, ``state_dict``, ``.dtype`` and checkpoints are untouched;
the copies (half the frozen weights' fp32 size) are dropped when the model's acceleration ends.
Not seen: an in-place edit through ``param.data`` (``.data`` has a version counter of its own),
which torch documents as invisible to autograd too.

The mode is not free: every torch call inside the forward passes through it (a few microseconds
each). So the first forward under it decides, by measurement, whether it stays: it times the
casts it made (what autocast pays in every forward) and counts the calls it saw, and the mode
stays only where those casts took more than :data:`MARGIN` times the calls' cost in the mode
(measured once per process, :func:`call_cost`). A model with a few small frozen weights keeps
autocast's casts, and its plan says so.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from . import amp

#: the operators CPU autocast runs in bf16 that take weights (every torch this package supports
#: lists them in autocast's lower-precision set on the CPU)
PRODUCTS = frozenset(
    {
        F.linear,
        torch.addmm,
        torch.mm,
        torch.matmul,
        torch.bmm,
        torch.baddbmm,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        torch.Tensor.__rmatmul__,
        torch.Tensor.mm,
        torch.Tensor.addmm,
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.conv_transpose3d,
    }
)


#: the casts a forward saves must cost more than this many times the mode's own overhead
MARGIN = 2.0


class Copies:
    """One model's bf16 copies of its frozen fp32 parameters, made on first use, and whether
    making them pays (:meth:`decide`, after the first forward that used them)."""

    def __init__(self, model: nn.Module) -> None:
        self._params = {id(p): p for p in model.parameters() if p.dtype == torch.float32}
        self._copies: dict[int, tuple[int, int, torch.Tensor]] = {}  # id -> (version, data_ptr, copy)
        self._lock = threading.Lock()
        self.made = 0  # copies made (a parameter changed: made again)
        self.cast_seconds = 0.0  # what making them took
        self.calls = 0  # torch calls the mode saw in its forwards, while deciding
        self.kept: bool | None = None  # whether the copies pay; None while undecided
        self.figures = ""  # what the decision measured

    def any_frozen(self) -> bool:
        return any(not p.requires_grad for p in self._params.values())

    def bytes(self) -> int:
        return sum(copy.numel() * copy.element_size() for _, _, copy in self._copies.values())

    def count(self) -> int:
        return len(self._copies)

    def clear(self) -> None:
        with self._lock:
            self._copies.clear()

    def swap(self, value: Any) -> Any:
        """``value``'s bf16 copy where it is one of the model's frozen fp32 parameters on the CPU,
        else ``value``."""
        if type(value) is not nn.Parameter:
            return value
        key = id(value)
        param = self._params.get(key)
        if param is not value or value.requires_grad or value.dtype != torch.float32 or value.device.type != "cpu":
            return value
        version, pointer = value._version, value.data_ptr()
        entry = self._copies.get(key)
        if entry is not None and entry[0] == version and entry[1] == pointer and entry[2].shape == value.shape:
            return entry[2]
        started = time.perf_counter()
        with torch.no_grad():
            copy = value.to(torch.bfloat16)  # what autocast's cast makes: same rounding, same strides
        self.cast_seconds += time.perf_counter() - started
        with self._lock:
            self._copies[key] = (version, pointer, copy)
            self.made += 1
        return copy

    @property
    def on(self) -> bool:
        return self.kept is not False

    @property
    def verdict(self) -> str | None:
        """ "kept: <figures>" or "off: <figures>", or None while undecided."""
        return None if self.kept is None else f"{'kept' if self.kept else 'off'}: {self.figures}"

    def decide(self) -> None:
        """After the first forward under the mode: keep it where the casts it saves (timed as it
        made the copies) cost more than :data:`MARGIN` times the calls it saw."""
        if self.kept is not None or not self.calls:
            return
        overhead = self.calls * call_cost()
        self.figures = (
            f"the casts {self.cast_seconds * 1e3:.2f} ms a forward, the mode {overhead * 1e3:.2f} ms "
            f"({self.calls} calls)"
        )
        self.kept = bool(self.made) and self.cast_seconds > MARGIN * overhead
        if not self.kept:
            self.clear()


_call_cost: list[float] = []


def call_cost() -> float:
    """Seconds a torch call takes longer inside :class:`CastOnce` (the least of a few timings of
    200 scalar additions with and without it; once per process)."""
    if not _call_cost:
        x = torch.zeros(1)
        idle = Copies(nn.Module())
        idle.kept = True  # as the mode runs once decided: counting nothing
        mode = CastOnce(idle)

        def timed(inside: bool) -> float:
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                if inside:
                    with mode:
                        for _ in range(200):
                            torch.add(x, x)
                else:
                    for _ in range(200):
                        torch.add(x, x)
                best = min(best, time.perf_counter() - started)
            return best

        _call_cost.append(max(timed(True) - timed(False), 0.0) / 200)
    return _call_cost[0]


class CastOnce(TorchFunctionMode):
    """Inside a forward under nanopatch's autocast: frozen parameters reach :data:`PRODUCTS` as
    their bf16 copies while autocast's dtype is bf16."""

    def __init__(self, copies: Copies) -> None:
        super().__init__()
        self.copies = copies

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self.copies.kept is None and exc[0] is None:
            self.copies.decide()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.copies.kept is None:
            self.copies.calls += 1
        if func in PRODUCTS and amp.autocast_enabled() and amp.current_dtype() == torch.bfloat16:
            swap = self.copies.swap
            args = tuple(swap(arg) for arg in args)
            if kwargs:
                kwargs = {name: swap(arg) for name, arg in kwargs.items()}
        return func(*args, **kwargs)
