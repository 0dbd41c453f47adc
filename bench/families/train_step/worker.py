"""What every train_step worker shares: its requests and answers over stdin/stdout, applying the patch,
the answer to set-up and the clock of the timed steps.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import sys
import time
from typing import Any

import harness as h

from families.train_step.models import Job
from families.train_step.profiling import minor_faults
from families.train_step.roof import matmul_rates

#: warm-up steps a variant may add while nanopatch measures bf16 against fp32 and channels-last
#: against stock's layout for its model (its trial's longest: 3 + 3 set-up + 4 x 8 timed steps)
MAX_TRIAL_STEPS = 38


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MiB."""
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Channel:
    """The parent's requests (JSON lines on stdin) and the answers (JSON lines on the real stdout).
    Only the answers go to the real stdout; anything else printed (by torch, IPEX, Lightning, ...)
    goes to stderr."""

    def __init__(self) -> None:
        self.answers = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def next(self) -> dict[str, Any]:
        """The next request; ``exit`` when the parent closed the pipe."""
        line = sys.stdin.readline()
        return json.loads(line) if line.strip() else {"cmd": "exit"}

    def answer(self, reply: dict[str, Any]) -> None:
        self.answers.write(json.dumps(reply) + "\n")


def apply_patch(options: dict[str, Any] | None) -> None:
    """``nanopatch.patch_torch(**options)``, before the model and optimizer are built; for None,
    check that nanopatch was never imported."""
    if options is None:
        assert "nanopatch" not in sys.modules, "unpatched variant: nanopatch got imported"
        return
    import nanopatch

    nanopatch.patch_torch(**options)


def setup_reply(request: dict[str, Any], job: Job, facts: dict[str, Any], **times: Any) -> dict[str, Any]:
    """The answer to ``setup``: the interpreter, threads, what the step ran (``facts``), the set-up
    ``times`` (import_s, build_s, warmup_step_s) and nanopatch's status where it was applied."""
    import torch

    options = request["patch"]
    if options is None:
        assert "nanopatch" not in sys.modules, "unpatched variant: nanopatch got imported"
    reply: dict[str, Any] = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": h.installed("torchvision"),
        "ipex": h.installed("intel-extension-for-pytorch"),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "allocator": h.mapped_library("tcmalloc") or h.mapped_library("jemalloc") or "glibc",
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "nanopatch_imported": "nanopatch" in sys.modules,
        "samples_per_step": job.samples_per_step,
        **times,
        "observed": facts,
        "peak_rss_mib": rss_mib()[1],
    }
    if options is not None:
        import nanopatch

        status = nanopatch.status()
        reply["nanopatch"] = {
            "patch_torch": options,
            "options": {
                name: {"value": entry["value"], "reason": entry["reason"]}
                for name, entry in status["options"].items()
                if name in ("training", "bf16", "channels_last", "ipex", "compile")
            },
            "targets": {name: target["state"] for name, target in status["targets"].items()},
            "bf16_measured": [
                m.get("bf16_measured") for m in status["targets"].get("training", {}).get("details") or []
            ],
            "channels_last_measured": [
                m.get("channels_last_measured") for m in status["targets"].get("training", {}).get("details") or []
            ],
        }
    return reply


class Sample:
    """The clock of one ``run`` request, started at construction: wall and CPU time of the steps,
    page faults, memory. :meth:`finish` reads the last step's loss (``.item()``, inside the time)."""

    def __init__(self) -> None:
        self.request_cpu = time.process_time()
        gc.collect()
        self.faults = minor_faults()
        self.cpu_start = time.process_time()
        self.start = time.perf_counter()

    def finish(self, loss) -> dict[str, Any]:
        value = loss.item()
        elapsed = time.perf_counter() - self.start
        cpu = time.process_time() - self.cpu_start
        current, peak = rss_mib()
        return {
            "elapsed_s": elapsed,
            "cpu_s": cpu,
            "loss": value,
            "faults": minor_faults() - self.faults,
            "rss_mib": current,
            "peak_rss_mib": peak,
            "request_cpu_s": time.process_time() - self.request_cpu,
        }


def answer(runner: Any, request: dict[str, Any]) -> dict[str, Any]:
    """A request after ``setup``: ``run`` or ``profile`` N steps, or measure the ``roof``."""
    if request["cmd"] == "roof":
        return {"matmul_flops": matmul_rates()}
    return runner.run(request["steps"]) if request["cmd"] == "run" else runner.profile(request["steps"])
