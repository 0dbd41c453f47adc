"""A ``--nproc measure`` trial's part inside the script's processes
(:mod:`nanopatch.runtime.measure` starts them): after each optimizer step, count; once
nanopatch has settled what it measures for the model itself (bf16 against fp32, compile="auto",
at most :data:`MAX_WARMUP` steps) time the next steps, write what they trained and end the
process, the script's remaining steps and its ``finally`` blocks unrun (a trial's checkpoint
must not replace the user's).

Every rank of a trial counts the same steps: while warming up, the ranks agree after each step
whether any of them is still measuring (one small all-reduce), so all stop timing at one step
and none waits for the gradients of a rank that left.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from nanopatch.runtime import measure as plan

#: the warm-up's steps at most: the start-up's first step, and nanopatch's own measurement
MAX_WARMUP = 18
#: the warm-up's steps at least (the first step is the start-up's)
MIN_WARMUP = 2


class Trial:
    def __init__(self, folder: str, steps: int) -> None:
        self.folder = folder
        self.steps = steps
        self.count = 0
        self.warmup: int | None = None  # the step the timing starts after
        self.start = 0.0
        self.samples_start = 0

    def after_step(self, now: float, samples: int) -> None:
        self.count += 1
        if self.warmup is None:
            if self.count >= MIN_WARMUP and (self.count >= MAX_WARMUP or not _anyone_measuring()):
                self.warmup = self.count
                self.start, self.samples_start = now, samples
            return
        if self.count - self.warmup >= self.steps:
            self.finish(now, samples)

    def finish(self, now: float, samples: int) -> None:
        rank = int(os.environ.get("RANK", "0") or 0)
        result = {
            "rank": rank,
            "world": int(os.environ.get("WORLD_SIZE", "1") or 1),
            "steps": self.count - (self.warmup or 0),
            "warmup_steps": self.warmup,
            "seconds": now - self.start,
            "samples": samples - self.samples_start,
        }
        write(self.folder, rank, result)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def write(folder: str, rank: int, result: dict[str, Any]) -> None:
    """One rank's result, written whole or not at all (the parent reads the folder meanwhile)."""
    temporary = os.path.join(folder, f".rank{rank}.tmp")
    with open(temporary, "w") as f:
        json.dump(result, f)
    os.replace(temporary, os.path.join(folder, f"rank{rank}.json"))


def _anyone_measuring() -> bool:
    # read where the training target loaded it: importing it here would make a run with the
    # target off look, to the runner's report, like one whose training found nothing
    training = sys.modules.get("nanopatch.targets.training.patch")
    mine = training is not None and training.measuring()
    try:
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return bool(flag.item())
    except Exception:  # no group to ask: this rank's own answer
        pass
    return mine


def from_environment() -> Trial | None:
    """The trial this process is part of, where the runner started it as one."""
    folder = os.environ.get(plan.OUT_VARIABLE)
    if not folder or not os.path.isdir(folder):
        return None
    try:
        steps = max(1, int(os.environ.get(plan.STEPS_VARIABLE) or plan.DEFAULT_STEPS))
    except ValueError:
        steps = plan.DEFAULT_STEPS
    return Trial(folder, steps)
