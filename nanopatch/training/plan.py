"""The training patch's shared state: one :class:`Plan` per model nanopatch accelerates, the
configuration in force, and the lock that guards both.

A plan says what was done to one model (channels-last, IPEX, fused steps, data-parallel) and
what its training forward really ran in (``computed_in``, ``autocast``, ``training_calls``,
observed on each training call, not planned), for :func:`nanopatch.status`.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

import torch

from .. import _patching

lock = threading.RLock()
local = threading.local()

#: the active nanopatch Config while patched, else None
state: dict[str, Any] = {"config": None}

#: model -> Plan, for every model nanopatch found while patched (IPEX ones also after)
plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def config() -> Any:
    return state["config"]


def tls(name: str, default: Any) -> Any:
    """A per-thread value, created with ``default`` on first use."""
    if not hasattr(local, name):
        setattr(local, name, default)
    return getattr(local, name)


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
    heads: list[Any] = dataclasses.field(default_factory=list)  # output activations run in fp32
    stock: str | None = None  # why this model runs stock, if it does
    notes: list[str] = dataclasses.field(default_factory=list)
    installed: bool = False
    previous_forward: Any = _patching.NOTSET
    ddp: Any = None  # the DistributedDataParallel wrapper its training steps go through
    # observed on training calls (grad mode, training mode)
    training_calls: int = 0
    computed_in: str | None = None  # dtype name the forward's floating outputs were computed in
    autocast: str | None = None  # "nanopatch", "framework" (an autocast already on), or None

    def observe(self, dtype: torch.dtype | None, autocast: str | None) -> None:
        self.training_calls += 1
        self.autocast = autocast
        if dtype is not None:
            self.computed_in = str(dtype).replace("torch.", "")

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
            "fp32_heads": len(self.heads),
            "stock": self.stock,
            "notes": list(self.notes),
            "training_calls": self.training_calls,
            "computed_in": self.computed_in,
            "autocast": self.autocast,
        }

    def summary(self) -> str:
        """One line: what this model ran with."""
        if self.stock is not None:
            return f"{self.name}: stock ({self.stock})"
        parts = []
        if self.computed_in:
            source = f", {self.autocast} autocast" if self.autocast else ""
            parts.append(f"computed in {self.computed_in}{source}")
        if self.rank is not None:
            parts.append("channels-last")
        if self.ipex:
            parts.append("IPEX")
        parts.extend(note for note in self.notes if note.endswith(" step"))
        if self.ddp is not None:
            parts.append("data-parallel")
        calls = f"{self.training_calls} training call{'s' if self.training_calls != 1 else ''}"
        return f"{self.name}: {', '.join(parts) or 'nothing applied'} ({calls})"
