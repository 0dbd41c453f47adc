"""Dropout masks from a faster generator, inside an accelerated model's training forward.

Dropout draws its mask with ``bernoulli_`` (``nn.Dropout``, ``F.dropout``, the attention dropout
inside ``scaled_dot_product_attention``, ``Dropout2d``'s feature noise). On CPU that draws one
value per element from torch's Mersenne Twister in one thread: ~4 ns an element, a quarter of a
bf16 transformer step (bench/train_step.py, 24 masks of 1-4 M elements a step), more than all
its attention matrix products.

While a paired model's training forward runs, :class:`FastBernoulli` (a dispatch mode, so it
also sees the calls torch's C++ operators make) fills a CPU floating tensor's ``bernoulli_(p)``
from 64-bit draws of the same generator cut into four 16-bit lanes: an element is 1 when its lane
falls below ``round(p * 65536)`` of the 65536 values. The mask has the distribution stock's has,
with the probability rounded to 1/65536 (``p=0.9`` becomes 0.899994); it is not the same
random stream, so a patched run's masks differ from stock's (as bf16 makes its numbers differ),
and a seed still reproduces a run. Masks with ``p`` closer than 1/1024 to 0 or 1, small
tensors, a generator that is not the CPU's, and everything else run stock. ``fast_dropout=False``
turns it off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
#: tensors smaller than this draw their mask stock (the mode's own cost would outweigh the gain)
MIN_ELEMENTS = 4096
_LANES = 65536
_EDGE = 1 / 1024


def eligible(tensor: torch.Tensor, p: Any, generator: Any) -> bool:
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.is_floating_point()
        and tensor.numel() >= MIN_ELEMENTS
        and isinstance(p, (float, int))
        and _EDGE <= p <= 1 - _EDGE
        and (generator is None or generator.device.type == "cpu")
    )


def fill_bernoulli(tensor: torch.Tensor, p: float, generator: Any = None) -> torch.Tensor:
    """``tensor.bernoulli_(p)`` with the keep probability rounded to 1/65536, drawn four
    elements per 64-bit value of ``generator`` (the default CPU generator when None)."""
    n = tensor.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64)
    words.random_(-(2**63), None, generator=generator)
    lanes = words.view(torch.int16)[:n]
    below = round(p * _LANES) - _LANES // 2  # P(lane < below) = round(p * 65536) / 65536
    tensor.copy_(torch.lt(lanes, below).view(tensor.shape))
    return tensor


class FastBernoulli(TorchDispatchMode):
    """While entered, eligible ``bernoulli_(p)`` calls use :func:`fill_bernoulli`; ``drawn``
    counts them."""

    drawn = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _aten.bernoulli_.float:
            tensor = args[0]
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            generator = kwargs.get("generator")
            if eligible(tensor, p, generator):
                self.drawn += 1
                return fill_bernoulli(tensor, p, generator)
        return func(*args, **kwargs)
