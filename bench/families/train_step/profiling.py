"""train_step's --profile: a variant's steps under torch.profiler, its top ops and dtype conversions."""

from __future__ import annotations

import gc
import os
import resource
import time
from typing import Any

from families.train_step.variants import PROFILE_TOP

#: the block :func:`settle_heap` touches and frees before the profiled steps
HEAP_PAD_BYTES = 1 << 30


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def settle_heap(pad_bytes: int = HEAP_PAD_BYTES) -> int:
    """Touch and free a block of ``pad_bytes`` (at most an eighth of the memory available) before
    the profiled steps; returns its size. torch.profiler keeps a record of every event in the
    process's heap while it runs. Where glibc's malloc keeps freed memory for reuse (nanopatch's
    in-process tuning: no mmap, no trim), those records take the place of freed tensors' blocks
    and the steps' tensors land on new heap pages, whose first touch page-faults: on the bench's
    transformer under ``patched`` (2-core Zen 4, torch 2.13) 11,000 minor faults a profiled step
    against none in a timed one, the profiled step 672 ms against 577 unprofiled, the time going
    to the memory-bound operators (in a script profiling two steps at once, 28,000 faults a step
    and ``_log_softmax`` at 57 ms against 5). With the block first: 6 faults, 588 ms against 579.
    The block grows the heap once, its pages touched, so that they are there when the steps need
    them; where a large block is mapped and unmapped (glibc's defaults, stock's steps, which
    fault in every step anyway) it is returned at once and changes nothing."""
    import torch

    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = pad_bytes * 8
    size = min(pad_bytes, available // 8) // 4 * 4
    if size > 0:
        block = torch.ones(size // 4, dtype=torch.float32)  # written: every page touched
        del block
    return size


class Profiling:
    """A ``profile`` request, started at construction: ``steps`` steps under torch.profiler (CPU
    activities; shapes recorded, which gives the kineto events their dtypes), after
    :func:`settle_heap`; the steps' minor page faults are counted (the profiler's own stop and
    the events' processing after it are not)."""

    def __init__(self, steps: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.steps = steps
        gc.collect()
        settle_heap()
        self.profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        self.request_cpu = time.process_time()
        self.profiler.start()
        self.faults = minor_faults()
        self.start = time.perf_counter()

    def finish(self, loss) -> dict[str, Any]:
        loss.item()
        elapsed = time.perf_counter() - self.start
        faults = minor_faults() - self.faults
        self.profiler.stop()
        summary = profile_summary(self.profiler, self.steps, elapsed)
        summary["faults_per_step"] = faults / self.steps
        summary["request_cpu_s"] = time.process_time() - self.request_cpu
        return summary


#: the ops whose self time is dtype conversion glue around aten::copy_ (which does the converting)
TO_OPS = ("aten::to", "aten::_to_copy")


def profile_summary(profiler, steps: int, elapsed_s: float) -> dict[str, Any]:
    """Per step: the top :data:`PROFILE_TOP` ops by self CPU time (ms, share of the profiled step's
    wall time, calls), and dtype conversion: the self time of the ``aten::copy_`` calls whose
    destination and source dtypes differ (from the kineto events' recorded dtypes), beside all
    ``aten::copy_`` and the ``aten::to`` / ``aten::_to_copy`` around them. Self CPU time is the
    op's own time on the thread that called it (an intra-op parallel kernel counts once, by its
    wall time), so shares of the step's wall time add up to at most about 100%."""
    step_ms = elapsed_s * 1000 / steps
    dtypes: dict[int, list[str]] = {}
    try:  # private, but it is where the recorded dtypes are: [destination, source, non_blocking]
        for event in profiler.profiler.kineto_results.events():
            if event.name() == "aten::copy_":
                dtypes[event.correlation_id()] = list(event.dtypes())
    except Exception:  # informative only: copies of unknown dtypes are counted apart
        dtypes = {}
    copy_us = convert_us = unknown_us = to_us = 0.0
    pairs: dict[str, float] = {}  # "source -> destination" dtypes: self time of the aten::copy_ calls
    for event in profiler.events():
        if event.name == "aten::copy_":
            copy_us += event.self_cpu_time_total
            pair = dtypes.get(event.id, [])
            if len(pair) >= 2 and pair[0] and pair[1]:
                convert_us += event.self_cpu_time_total if pair[0] != pair[1] else 0.0
                key = f"{short_dtype(pair[1])} -> {short_dtype(pair[0])}"
                pairs[key] = pairs.get(key, 0.0) + event.self_cpu_time_total
            else:
                unknown_us += event.self_cpu_time_total
        elif event.name in TO_OPS:
            to_us += event.self_cpu_time_total
    averages = list(profiler.key_averages())
    averages.sort(key=lambda a: a.self_cpu_time_total, reverse=True)

    def per_step(us: float) -> dict[str, float]:
        ms = us / 1000 / steps
        return {"ms": ms, "share": ms / step_ms if step_ms else 0.0}

    return {
        "steps": steps,
        "step_ms": step_ms,
        "self_ms": sum(a.self_cpu_time_total for a in averages) / 1000 / steps,
        "ops": [
            {
                "name": a.key,
                "self_ms": a.self_cpu_time_total / 1000 / steps,
                "share": a.self_cpu_time_total / 1000 / steps / step_ms if step_ms else 0.0,
                "calls": a.count / steps,
            }
            for a in averages[:PROFILE_TOP]
        ],
        "conversion": {
            "what": "self CPU time of aten::copy_ calls whose destination and source dtypes differ",
            **per_step(convert_us),
            "copy_all": per_step(copy_us),
            "copy_unknown_dtypes": per_step(unknown_us),
            "to_ops": per_step(to_us),
            "copy_by_dtypes": {key: per_step(us) for key, us in sorted(pairs.items(), key=lambda kv: -kv[1])},
        },
    }


def short_dtype(name: str) -> str:
    """A kineto dtype name (``c10::BFloat16``, ``float``) as torch spells it (``bfloat16``, ``float32``)."""
    known = {"c10::BFloat16": "bfloat16", "c10::Half": "float16", "float": "float32", "double": "float64"}
    return known.get(name, name.removeprefix("c10::"))
