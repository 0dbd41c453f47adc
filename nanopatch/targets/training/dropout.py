"""Dropout masks from a faster generator, inside an accelerated model's training forward.

Dropout draws its mask with ``bernoulli_`` (``nn.Dropout``, ``F.dropout``, the attention dropout
inside ``scaled_dot_product_attention``, ``Dropout2d``'s feature noise). On CPU that draws one
value per element from torch's Mersenne Twister in one thread.

While the patch is on, nanopatch registers a kernel for that one operator,
``aten::bernoulli_.float``, at the dispatcher's ``BackendSelect`` key: below autograd, autocast
and any dispatch mode, just above the CPU kernel, so it also sees the calls torch's C++
operators make. Inside a *mask region* (a paired model's training forward, and activation
checkpointing's replay of one: :mod:`.replay`) it fills an eligible tensor from 64-bit draws of
the same generator cut into four 16-bit lanes: an element is 1 when its lane falls below
``round(p * 65536)`` of the 65536 values. The mask has the distribution stock's has, with the
probability rounded to 1/65536 (``p=0.9`` becomes 0.899994); it is not the same random stream,
so a patched run's masks differ from stock's (as bf16 makes its numbers differ), and a seed
still reproduces a run. Everywhere else, and for masks with ``p`` closer than 1/1024 to 0 or 1,
small tensors, a generator that is not the CPU's, the call goes on to the CPU kernel unchanged.
``fast_dropout=False`` turns it off.

It is a kernel for one operator, not a ``TorchDispatchMode``, on purpose: a mode receives every
operator below autograd as one call, so a library that gives a CompositeImplicitAutograd
operator a backend kernel of its own (IPEX registers a CPU ``aten::layer_norm``, whose autograd
comes from the operators that kernel calls) records no autograd history under it, and every
gradient before that operator is lost.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from nanopatch.engine import _patching
from nanopatch.foundation._log import log_once, warnings_from

from .plan import TARGET, local

_aten = torch.ops.aten
#: tensors smaller than this draw their mask stock (the kernel's own cost would outweigh the gain)
MIN_ELEMENTS = 4096
_LANES = 65536
_EDGE = 1 / 1024

#: set when a self-check found that fast masks do not learn as stock: every mask is stock's
disabled = [False]
_installed: list[Any] = []  # the journal's entry while the kernel is registered


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


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, generator: Any = None) -> torch.Tensor:
    """A bool tensor of ``shape``, each element True with probability ``p`` rounded to 1/65536,
    drawn four elements per 64-bit value of ``generator`` (the default CPU generator when None)."""
    n = torch.Size(shape).numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64)
    words.random_(-(2**63), None, generator=generator)
    lanes = words.view(torch.int16)[:n]
    below = round(p * _LANES) - _LANES // 2  # P(lane < below) = round(p * 65536) / 65536
    return torch.lt(lanes, below).view(shape)


def fill_bernoulli(tensor: torch.Tensor, p: float, generator: Any = None) -> torch.Tensor:
    """``tensor.bernoulli_(p)`` from :func:`keep_mask` (copied as bytes: torch converts uint8 to
    floating types in vector code and bool element by element, five times slower)."""
    return tensor.copy_(keep_mask(tensor.shape, p, generator).view(torch.uint8))


def note_drawn() -> None:
    """Count a fast draw in this thread (a region's ``fast`` reads it)."""
    local.drawn = getattr(local, "drawn", 0) + 1


def in_region() -> bool:
    """Whether this thread is inside a mask region."""
    return getattr(local, "masks", 0) > 0


def _kernel(keyset: Any, tensor: torch.Tensor, p: Any = 0.5, generator: Any = None) -> torch.Tensor:
    if getattr(local, "masks", 0) > 0 and not disabled[0] and eligible(tensor, p, generator):
        note_drawn()  # per thread: a region counts its own thread's
        return fill_bernoulli(tensor, p, generator)
    return _aten.bernoulli_.float.redispatch(
        keyset.remove(torch._C.DispatchKey.BackendSelect), tensor, p, generator=generator
    )


def install() -> bool:
    """Register the kernel while the training target is applied (an entry of the patch
    engine's journal: unregistered at unpatch). Returns whether it is registered; when torch
    cannot take it, says so once and masks stay stock."""
    return register(
        _installed, "bernoulli_.float", _kernel, "BackendSelect", "fast dropout masks off", "fast dropout mask kernel"
    )


def register(installed: list[Any], op: str, kernel: Any, key: str, refused: str, what: str, undo: Any = None) -> bool:
    """Register ``kernel`` for ``aten::<op>`` at dispatch key ``key`` as an entry of the patch
    engine's journal, noted in ``installed`` while it is on (``undo`` also runs when it comes
    off). When torch cannot take it, logs ``refused`` once and returns False."""
    if installed:
        return True
    try:
        library = torch.library.Library("aten", "IMPL")
        # torch < 2.13 warns (once, as a UserWarning) on replacing autocast's own kernel
        with warnings_from(r"torch\.library\Z", "ignore", "Warning only once for all operators", UserWarning):
            library.impl(op, kernel, key, with_keyset=True)
    except Exception as exc:
        log_once(
            f"kernel-{op}",
            "%s: torch %s cannot register the kernel for aten::%s (%s: %s)",
            refused,
            torch.__version__,
            op,
            type(exc).__name__,
            exc,
            level=logging.INFO,
        )
        return False

    def remove() -> None:
        installed.clear()
        if undo is not None:
            undo()
        library._destroy()

    installed.append(_patching.on_undo(TARGET, remove, f"aten::{op}: {what}"))
    return True


def installed() -> bool:
    return bool(_installed)


class region:
    """A mask region for this thread (nestable): eligible ``bernoulli_(p)`` calls inside draw
    fast; ``fast`` says afterwards whether any did."""

    def __init__(self) -> None:
        self.fast = False
        self._before = 0

    def __enter__(self) -> region:
        self._before = getattr(local, "drawn", 0)
        local.masks = getattr(local, "masks", 0) + 1
        return self

    def __exit__(self, *exc: Any) -> None:
        local.masks -= 1
        self.fast = getattr(local, "drawn", 0) != self._before
