"""train_step's --profile: a variant's steps under torch.profiler, its top ops and dtype conversions."""

from __future__ import annotations

import gc
import time
from typing import Any

from families.train_step.variants import PROFILE_TOP


class Profiling:
    """A ``profile`` request, started at construction: ``steps`` steps under torch.profiler (CPU
    activities; shapes recorded, which gives the kineto events their dtypes)."""

    def __init__(self, steps: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.steps = steps
        gc.collect()
        self.profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        self.request_cpu = time.process_time()
        self.profiler.start()
        self.start = time.perf_counter()

    def finish(self, loss) -> dict[str, Any]:
        loss.item()
        elapsed = time.perf_counter() - self.start
        self.profiler.stop()
        summary = profile_summary(self.profiler, self.steps, elapsed)
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
