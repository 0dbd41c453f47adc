"""The ``breakdown`` target: a training run's wall time split into waiting for data, forward +
backward, the optimizer step, and the rest, from hooks on what every loop calls.

A loop asks a DataLoader iterator for a batch (``__next__``: the time inside is the wait for
data), computes the loss and its gradients, and steps an optimizer (the time inside
``step``; a closure it is given is the loop's forward and backward, timed apart). The time from
a batch to the step it leads to is forward + backward. Batches that lead to no step (an
evaluation's) and the time from a step to the next batch (logging, checkpoints) are the rest.
The start-up is the time until the first optimizer step has ended: imports, building the data
and the model, and the first step's one-off costs (kernels chosen, memory allocated, nanopatch
pairing the model), which would otherwise weigh on a short run's shares.
Each hook reads a clock and adds: microseconds against a training step's milliseconds.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import dataloader

from nanopatch import engine
from nanopatch.foundation import learning
from nanopatch.runtime import tuning as runtime

from ..training import ipex, optim
from . import measure

#: a report's shares of the wall time, in the order a table shows them
PARTS = (
    ("startup_s", "start-up (to the first step's end)"),
    ("data_s", "waiting for data"),
    ("compute_s", "forward + backward"),
    ("optimizer_s", "optimizer step"),
    ("other_s", "other (evaluation, logging, checkpoints)"),
)


class _Loader:
    """What one DataLoader (its dataset and worker count) gave the loop."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.training_batches = 0
        self.batch_size = 0  # the largest batch seen


def _machine_jiffies(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) clock ticks of all the machine's CPUs since boot; None where unreadable."""
    try:
        with open(path) as stat:
            ticks = [int(field) for field in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(ticks) < 5:
        return None
    total = sum(ticks)  # user nice system idle iowait irq softirq steal
    return total - ticks[3] - ticks[4], total


class _Meter:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None  # when the first optimizer step ended: training's start
        self.last = self.start  # the end of the latest event
        self.cpu_last = time.process_time()
        self.after: str | None = None  # what the latest event was: "batch", "step" or None
        self.data = self.compute = self.optimizer = 0.0
        self.train_cpu = self.train_wall = 0.0  # process CPU time and wall time of the steps
        self.steps = self.samples = 0
        self.loaders: dict[tuple[int, int], _Loader] = {}
        self.latest: _Loader | None = None
        # the batches since the last step, of the latest loader: (wait, time after it, samples)
        self.pending = [0.0, 0.0, 0]
        self.depth = 0  # optimizer steps in progress (one wrapping another counts once)
        self.step_start = 0.0
        self.closures = 0.0
        self.machine_first: tuple[int, int] | None = None  # the machine's CPU ticks at training's start
        self.cpu_first = 0.0
        self.devices: set[str] = set()  # the device types of the parameters the run's optimizers step
        self.optimizers: weakref.WeakSet = weakref.WeakSet()  # those whose devices are noted
        self.lock = threading.Lock()

    def note_devices(self, optimizer: Any) -> None:
        """The device types of ``optimizer``'s parameters, read once per optimizer."""
        try:
            if optimizer in self.optimizers:
                return
            self.optimizers.add(optimizer)
        except TypeError:  # not weakly referenceable: read it every step (a few attribute reads)
            pass
        self.devices.update(parameter_devices(optimizer))

    # --- events ---

    def batch(self, loader: _Loader, asked: float, got: float, samples: int | None) -> None:
        with self.lock:
            if self.after == "batch" and loader is self.latest:
                self.pending[1] += asked - self.last  # computing on the previous batch (accumulating)
            elif loader is not self.latest:
                self.pending = [0.0, 0.0, 0]  # another loader's batches (an evaluation's): the rest
            loader.batch_size = max(loader.batch_size, samples or 0)
            self.pending[0] += got - asked
            self.pending[2] += samples or 0
            self.latest, self.after, self.last = loader, "batch", got
            self.cpu_last = time.process_time()

    def step_begins(self, now: float) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            if self.after == "batch":
                wait, computed, samples = self.pending
                self.data += wait
                self.compute += computed + (now - self.last)
                self.samples += samples
                if self.latest is not None:
                    self.latest.training_batches += 1
            elif self.after == "step":
                # a second optimizer after the first (a GAN's), or a loop without a DataLoader
                self.compute += now - self.last
            self.pending = [0.0, 0.0, 0]
            self.step_start, self.closures = now, 0.0

    def step_ends(self, now: float) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth:
                return
            self.compute += self.closures
            self.optimizer += max(0.0, now - self.step_start - self.closures)
            self.steps += 1
            cpu = time.process_time()
            if self.after is not None:
                self.train_cpu += cpu - self.cpu_last
                self.train_wall += now - self.last
            self.after, self.last, self.cpu_last = "step", now, cpu
            if self.first is None:  # the first step was the start-up's: training starts now
                self.first = now
                self.machine_first, self.cpu_first = _machine_jiffies(), cpu
                self.data = self.compute = self.optimizer = self.train_cpu = self.train_wall = 0.0
                self.samples = 0

    # --- the account ---

    def report(self) -> dict[str, Any]:
        with self.lock:
            now = time.perf_counter()
            wall = now - self.start
            startup = (self.first if self.first is not None else now) - self.start
            trained = self.data + self.compute + self.optimizer
            training = [loader for loader in self.loaders.values() if loader.training_batches]
            main = max(training, key=lambda loader: loader.training_batches, default=None)
            cpus = len(runtime.run_cpus() or os.sched_getaffinity(0))
            threads = torch.get_num_threads()
            others = None  # the cores other processes kept busy while this one trained
            machine = _machine_jiffies()
            if self.first is not None and self.machine_first is not None and machine is not None:
                ticks = machine[1] - self.machine_first[1]
                if ticks > 0 and now > self.first:
                    busy = (machine[0] - self.machine_first[0]) / ticks * (os.cpu_count() or 1)
                    others = max(0.0, busy - (time.process_time() - self.cpu_first) / (now - self.first))
            return {
                "wall_s": wall,
                "startup_s": startup,
                "data_s": self.data,
                "compute_s": self.compute,
                "optimizer_s": self.optimizer,
                "other_s": max(0.0, wall - startup - trained),
                "steps": self.steps,  # every step, the start-up's first one too
                "samples": self.samples,
                "samples_per_s": self.samples / trained if trained and self.samples else None,
                "step_s": (self.compute + self.optimizer) / (self.steps - 1) if self.steps > 1 else None,
                "batch_size": main.batch_size if main else None,
                "num_workers": main.num_workers if main else None,
                "threads": threads,
                "cpus": cpus,
                # the cores the steps kept busy: process CPU time over their wall time
                "cores_busy": self.train_cpu / self.train_wall if self.train_wall > 0 else None,
                "others_busy": others,
                "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
                "devices": sorted(self.devices),
            }


_meter: _Meter | None = None
_trial: measure.Trial | None = None  # a --nproc measure trial's timing, in the processes of one


def _samples(batch: Any) -> int | None:
    """The batch's size: the first dimension of its first tensor (in a tuple, list or dict)."""
    for _ in range(4):
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0]) if batch.dim() else 1
        if isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        elif isinstance(batch, Mapping) and batch:
            batch = next(iter(batch.values()))
        else:
            return None
    return None


def _next(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    meter = _meter
    if meter is None or learning.internal_now():
        return wrapped(*args, **kwargs)
    asked = time.perf_counter()
    batch = wrapped(*args, **kwargs)
    got = time.perf_counter()
    key = (id(getattr(instance, "_dataset", instance)), getattr(instance, "_num_workers", 0))
    loader = meter.loaders.get(key)
    if loader is None:
        loader = meter.loaders[key] = _Loader(key[1])
    meter.batch(loader, asked, got, _samples(batch))
    return batch


def _timed_closure(meter: _Meter, closure: Any) -> Any:
    def closure_timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return closure(*args, **kwargs)
        finally:
            meter.closures += time.perf_counter() - start

    return closure_timed


def _step_pre(optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    meter = _meter
    if meter is None or learning.internal_now():  # nanopatch's own probes: not the run's
        return None
    meter.step_begins(time.perf_counter())
    if meter.depth > 1:
        return None
    # torch hands the hooks the step's arguments with the optimizer first: (optimizer, closure)
    if len(args) > 1 and callable(args[1]):
        return (args[0], _timed_closure(meter, args[1]), *args[2:]), kwargs
    if callable(kwargs.get("closure")):
        return args, {**kwargs, "closure": _timed_closure(meter, kwargs["closure"])}
    return None


def _step_post(optimizer: Any, args: tuple, kwargs: dict) -> None:
    if _meter is not None and not learning.internal_now():
        now = time.perf_counter()
        _meter.step_ends(now)
        _meter.note_devices(optimizer)
        if _trial is not None and _meter.depth == 0:
            _trial.after_step(now, _meter.samples)


def parameter_devices(optimizer: Any) -> set[str]:
    """The device types (``cpu``, ``cuda``, ...) of the tensors an optimizer steps: the first
    parameter of each of its groups."""
    found = set()
    for group in getattr(optimizer, "param_groups", ()):
        for parameter in group.get("params", ())[:1]:
            device = getattr(parameter, "device", None)
            if device is not None:
                found.add(device.type)
    return found


def _instance_step(optimizer: Any) -> None:
    """IPEX's fused step, set on the optimizer itself, is past torch's hooks: timed around it."""
    if not learning.internal_now():  # nanopatch's own self-check probes: not the run's
        own = optimizer.__dict__["step"]
        assert _context is not None
        _context.set_on(optimizer, "step", optim.around_step(optimizer, own, _step_pre, _step_post))


class Breakdown(engine.Target):
    """Where a run's time goes: its loader's waits, forward and backward, the optimizer's steps."""

    def patch(self, ctx: engine.Context) -> None:
        global _meter, _trial, _context
        from torch.optim import optimizer as optimizer_mod

        _meter = _Meter()
        _trial = measure.from_environment()
        _context = ctx
        ctx.wrap(dataloader._BaseDataLoaderIter, "__next__", _next)
        for handle, where in (
            (optimizer_mod.register_optimizer_step_pre_hook(_step_pre), "optimizer step pre-hook (breakdown)"),
            (optimizer_mod.register_optimizer_step_post_hook(_step_post), "optimizer step post-hook (breakdown)"),
        ):
            ctx.add_hook(handle, where)
        ipex.on_instance_step(ctx, _instance_step)

    def unpatch(self, ctx: engine.Context) -> None:
        global _meter, _trial
        _meter = _trial = None

    def describe(self) -> dict[str, Any] | None:
        return describe()


_context: engine.Context | None = None  # the target's, for the optimizers IPEX gives a step later


def describe() -> dict[str, Any] | None:
    """The run's breakdown so far (None when the target is off), with the advice it gives."""
    if _meter is None:
        return None
    from .advice import advise

    report = _meter.report()
    report["advice"] = advise(report)
    return report


def text(report: dict[str, Any]) -> str:
    """The breakdown on one line: each part's seconds and share of the wall time, and the rate."""
    wall = report["wall_s"] or 1.0
    parts = ", ".join(f"{label.split(' (')[0]} {report[key]:.1f} s ({report[key] / wall:.0%})" for key, label in PARTS)
    rate = report.get("samples_per_s")
    steps = f"{report['steps']} optimizer step(s)"
    line = f"{report['wall_s']:.1f} s: {parts}; {steps}" + (f", {rate:.1f} samples/s while training" if rate else "")
    from .advice import off_cpu

    elsewhere = off_cpu(report)
    if elsewhere:
        line += (
            f"; the model trained on {', '.join(elsewhere)}, which nanopatch leaves alone "
            "(no advice on CPU processes or DataLoader workers)"
        )
    return line
