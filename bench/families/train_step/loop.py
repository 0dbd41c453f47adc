"""A train_step worker's own training loop (every variant but Lightning's), and the worker's entry:
answer the parent's requests until it says exit.
"""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

import harness as h

from families.train_step.inside import compute_dtype, detach_first_layer, learning_steps, observed, probed_step
from families.train_step.lightning import lightning_serve
from families.train_step.models import Job
from families.train_step.profiling import Profiling
from families.train_step.roof import flops_per_sample
from families.train_step.worker import MAX_TRIAL_STEPS, Channel, Sample, answer, apply_patch, setup_reply


class StepRunner:
    """The worker of a variant whose loop is the script's own: built and warmed up at ``setup``,
    timed at each ``run``, profiled at ``profile``."""

    def __init__(self) -> None:
        self.job: Job | None = None

    def serve(self, channel: Channel, request: dict[str, Any]) -> None:
        channel.answer(self.setup(request))
        while (request := channel.next())["cmd"] != "exit":
            channel.answer(answer(self, request))

    def setup(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        import torch

        apply_patch(request["patch"])  # before the model and optimizer are built
        imported = time.perf_counter()
        job = self.job = Job(request["model"], request["shape"], by_hand=request.get("by_hand", False))
        if request.get("broken"):
            detach_first_layer(job.model)
        built = time.perf_counter()
        record, learning_s = learning_steps(job, request["learn"])
        warmup_s = []
        while len(warmup_s) < request["warmup"] or (h.measuring() and len(warmup_s) < MAX_TRIAL_STEPS):
            start = time.perf_counter()
            output, loss = job.step()
            loss.item()
            warmup_s.append(time.perf_counter() - start)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=job.by_hand)  # as the step runs forward
        facts = observed(job, compute_dtype(job.model, job.inputs, autocast), output, loss)
        facts["probe"] = probed_step(job)
        if request.get("count_flops"):
            facts["flops_per_sample"] = flops_per_sample(job)
        times = {
            "import_s": imported - started,
            "build_s": built - imported,
            "learning_step_s": learning_s,
            "warmup_step_s": warmup_s,
        }
        return {**setup_reply(request, job, facts, **times), "learning": record}

    def run(self, steps: int) -> dict[str, Any]:
        assert self.job is not None, "run before setup"
        sample = Sample()
        for _ in range(steps):
            _, loss = self.job.step()
        return sample.finish(loss)

    def profile(self, steps: int) -> dict[str, Any]:
        assert self.job is not None, "profile before setup"
        profiling = Profiling(steps)
        for _ in range(steps):
            _, loss = self.job.step()
        return profiling.finish(loss)


def worker_main() -> int:
    """Answer the parent's requests, one JSON line each, until it says exit: ``setup`` first, then
    ``run`` or ``profile`` (N steps each). On an error, answer it and exit."""
    channel = Channel()
    request = channel.next()
    if request["cmd"] == "exit":
        return 0
    try:
        if request.get("lightning"):
            lightning_serve(channel, request)
        else:
            StepRunner().serve(channel, request)
    except BaseException as exc:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        channel.answer({"error": f"{type(exc).__name__}: {exc}", "traceback": text})
        return 1
    return 0
