"""The training patch's shared state: one :class:`Plan` per model nanopatch accelerates, the
configuration in force, and the lock that guards both.

A plan says what was done to one model (channels-last, IPEX, fused steps, data-parallel) and
what its training forward really ran in (``computed_in``, ``autocast``, ``training_calls``,
observed on each training call, not planned), for :func:`nanopatch.status`.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
import weakref
from typing import Any

import torch
from torch import nn

from .. import _patching

#: the patch engine's name for the training target (what its journal entries are filed under)
TARGET = "training"

lock = threading.RLock()
local = threading.local()

_engines: dict[str, Any] = {}


def register_data_parallel(engine: Any) -> None:
    """The data-parallel engine (:mod:`nanopatch.parallel.patch` registers itself when it is
    imported; training never imports it): pairing asks it to wrap the model in DDP
    (``attach(module, model, optimizer)`` -> a wrapper or None, ``world_size()``), and the
    accelerated forward routes a training call through that wrapper (``routes``, ``through``,
    ``pre_forward``, ``post_forward``)."""
    _engines["data_parallel"] = engine


def data_parallel() -> Any:
    """The registered data-parallel engine, or None."""
    return _engines.get("data_parallel")


#: the active nanopatch Config while patched, else None
state: dict[str, Any] = {"config": None}

#: model -> Plan, for every model nanopatch found while patched (IPEX ones also after)
plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


logger = logging.getLogger("nanopatch")


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
    setup: list[Any] = dataclasses.field(default_factory=list)  # optimizers paired, set up outside the lock
    ddp: Any = None  # the DistributedDataParallel wrapper its training steps go through
    layout: Any = None  # the journal's entry for the channels-last weights nanopatch gave it
    # observed on training calls (grad mode, training mode)
    training_calls: int = 0
    computed_in: str | None = None  # dtype name the forward's floating outputs were computed in
    autocast: str | None = None  # "nanopatch", "framework" (an autocast already on), or None
    masks: bool = False  # its training forward may draw dropout masks fast (decided at pairing)
    fast_dropout: bool = False  # dropout masks of its training forward were drawn fast
    trial: Trial | None = None  # bf16 against fp32, step by step, while it is measured

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
            "fast_dropout": self.fast_dropout,
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
        if self.fast_dropout:
            parts.append("fast dropout masks")
        parts.extend(note for note in self.notes if note.endswith(" step"))
        if self.ddp is not None:
            parts.append("data-parallel")
        calls = f"{self.training_calls} training call{'s' if self.training_calls != 1 else ''}"
        return f"{self.name}: {', '.join(parts) or 'nothing applied'} ({calls})"


def doubtful(model: nn.Module) -> bool:
    """Whether bf16 may not pay for this model: recurrent layers (oneDNN's bf16 RNN kernels
    are not faster than fp32 on every CPU)."""
    return any(isinstance(sub, nn.RNNBase) for sub in model.modules())


@dataclasses.dataclass
class Trial:
    """Measure-and-decide for a model where bf16 may not pay: after ``warmup`` optimizer
    steps in bf16, its steps alternate between bf16 and fp32 until each has ``rounds``
    timings (the time from one step's end to the next one's, so the forward, backward and
    step of one iteration); bf16 stays only if its median is not slower than fp32's by more
    than ``margin``."""

    warmup: int = 2
    rounds: int = 4
    margin: float = 0.05
    bf16: bool = True  # the mode of the iteration running now
    steps: int = 0
    last: float | None = None
    times: dict[bool, list[float]] = dataclasses.field(default_factory=lambda: {True: [], False: []})

    def on_step(self, plan: Plan, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self.last is not None and self.steps > self.warmup:
            self.times[self.bf16].append(now - self.last)
        self.last = now
        self.steps += 1
        if min(len(v) for v in self.times.values()) >= self.rounds:
            self._decide(plan)
        elif self.steps > self.warmup:
            self.bf16 = not self.bf16 if self.steps > self.warmup + 1 else False

    def _decide(self, plan: Plan) -> None:
        bf16, fp32 = (statistics.median(self.times[mode]) for mode in (True, False))
        plan.trial = None
        verdict = f"bf16 {bf16 * 1e3:.1f} ms, fp32 {fp32 * 1e3:.1f} ms per step (medians of {self.rounds})"
        if bf16 > fp32 * (1 + self.margin):
            plan.amp_dtype = None
            plan.notes.append(f"bf16 autocast off: measured slower for this model ({verdict})")
        else:
            plan.notes.append(f"bf16 autocast kept: measured {verdict}")
        logger.info("%s: %s", plan.name, plan.notes[-1])
