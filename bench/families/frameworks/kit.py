"""What every frameworks training script shares: the clock of its timed steps, its data, the facts
of its process and the rank report it writes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import harness as h

from families.frameworks.variants import CLASSES, DISTINCT_IMAGES, MAX_WORLD, SEED, STARTED


class Clock:
    """Times the steps after the learning and warm-up steps: the span from the first timed step's
    start to the last one's end, each step's own time, and the process's CPU time over the span.
    The first ``learning.steps`` steps are recorded for the learning check (``--learn``)."""

    def __init__(self, args: argparse.Namespace, probe: h.Probe, learning: h.Learning) -> None:
        self.learning = learning
        self.warmup, self.steps, self.probe = learning.steps + args.warmup, args.steps, probe
        self.seen = 0
        self.step_s: list[float] = []
        self.first_batch: float | None = None
        self.started = STARTED
        self.first_step_at: float | None = None
        self.t0 = self.t1 = self.cpu0 = self.cpu1 = self.before = 0.0
        self.on_done = None  # called once after the last timed step (facts that need the live run)
        self.measuring = False  # nanopatch still measuring its choices when the timed steps began

    @property
    def done(self) -> bool:
        return self.seen >= self.warmup + self.steps

    def begin(self, batch=None) -> None:
        now = time.perf_counter()
        if self.seen == 0:
            self.first_step_at = now
            if batch is not None:
                self.first_batch = checksum(batch)
        if self.seen == self.warmup:
            self.measuring = h.measuring()
            now = time.perf_counter()
            self.t0, self.cpu0 = now, time.process_time()
            self.probe.active = True
        self.before = now

    def end(self) -> None:
        now = time.perf_counter()
        if self.seen >= self.warmup:
            self.step_s.append(now - self.before)
        self.seen += 1
        self.learning.after_step()
        if self.seen == self.learning.steps:
            self.learning.stop()
        if self.seen == self.warmup + self.steps:
            self.t1, self.cpu1 = now, time.process_time()
            self.probe.active = False
            if self.on_done is not None:
                self.on_done()

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.t1 - self.t0,
            "cpu_s": self.cpu1 - self.cpu0,
            "step_s": self.step_s,
            "steps_seen": self.seen - self.learning.steps,
            "learning_steps": self.learning.steps,
            "learning": self.learning.record,
            "setup_s": (self.first_step_at or self.started) - self.started,
            "warmup_s": self.t0 - (self.first_step_at or self.t0),
            "first_batch": self.first_batch,
            "measuring_when_timed": self.measuring,
        }


def total_steps(args: argparse.Namespace) -> int:
    """The steps a run takes: the recorded learning steps, the warm-up and the timed steps."""
    return args.learn + args.warmup + args.steps


def checksum(batch) -> float:
    import torch

    tensors = batch.values() if isinstance(batch, dict) else batch
    return float(sum(float(t.double().sum()) for t in tensors if isinstance(t, torch.Tensor)))


def image_loader(args: argparse.Namespace):
    """A shuffling DataLoader over generated images: enough batches for every rank's steps."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class GeneratedImages(Dataset):
        def __init__(self, samples: int) -> None:
            g = torch.Generator().manual_seed(SEED)
            self.images = torch.randn(min(samples, DISTINCT_IMAGES), 3, args.image_size, args.image_size, generator=g)
            self.labels = torch.randint(0, CLASSES, (samples,), generator=g)

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, i: int):
            return self.images[i % len(self.images)], self.labels[i]

    samples = args.batch * total_steps(args) * MAX_WORLD
    return DataLoader(GeneratedImages(samples), batch_size=args.batch, shuffle=True, drop_last=True)


def process_facts(model) -> dict[str, Any]:
    """What this process ran with: queries only, made after (or at the end of) the timed steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    initialised = dist.is_available() and dist.is_initialized()
    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "tcmalloc": h.mapped_library("libtcmalloc") is not None,
        "jemalloc": h.mapped_library("libjemalloc") is not None,
        "process_group": initialised,
        "world_size": dist.get_world_size() if initialised else 1,
        "backend": str(dist.get_backend()) if initialised else None,
        "ddp": any(_is(o, DistributedDataParallel) for o in gc.get_objects()),
        "first_weight_channels_last": first_conv_channels_last(model),
    }


def _is(obj: Any, cls: type) -> bool:
    """``isinstance``, False for a weak proxy whose object is gone (torch.compile leaves some)."""
    try:
        return isinstance(obj, cls)
    except ReferenceError:
        return False


def first_conv_channels_last(model) -> bool | None:
    import torch
    from torch import nn

    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is None:
        return None
    w = conv.weight
    return bool(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous())


def param_checksum(model) -> float:
    import torch

    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


_AFFINITY_AT_START: list[int] = []


def write_rank(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Write one training process's result as ``rank<N>.json``, with the facts of its process."""
    import torch

    result.setdefault("affinity_at_start", _AFFINITY_AT_START)
    result.update(
        nanopatch_imported="nanopatch" in sys.modules,
        env={k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "LD_PRELOAD", "LOCAL_RANK", "WORLD_SIZE")},
        torch=torch.__version__,
        pid=os.getpid(),
    )
    Path(args.worker, f"rank{result['rank']}.json").write_text(json.dumps(result))
