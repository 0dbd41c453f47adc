"""Advice from a run's breakdown: what the user could change that nanopatch cannot change for
them without changing the script's meaning. Each piece names the figure of this run that
triggered it and the exact change; where no rule's figure is met, there is no advice."""

from __future__ import annotations

from typing import Any

from nanopatch.runtime import measure

#: waiting for data above this share of the training time calls for DataLoader workers
DATA_WAIT_SHARE = 0.20
#: the optimizer step above this share of a step: per-step costs dominate the batch's work
OPTIMIZER_SHARE = 0.25
#: the steps kept fewer than this share of the process's threads busy: room for --nproc
BUSY_SHARE = 0.6
#: other processes kept more than this many cores busy meanwhile: the idle threads were not idle cores
OTHERS_BUSY = 0.5
#: the fewest steps a rate or share is read from (the first, the start-up's, not counted)
MIN_STEPS = 5
MAX_WORKERS = 8


def advise(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The advice for one process's breakdown (:func:`nanopatch.targets.breakdown.patch.describe`):
    a list of ``{"rule", "figure", "change", "text"}``, empty when nothing applies."""
    if (report.get("steps") or 0) - 1 < MIN_STEPS:
        return []
    found = []
    if off_cpu(report):
        # a model that trained on a GPU (any device but the CPU): nanopatch left it alone, its
        # speed is not the CPU threads' or the loader's to give, and the host-side clock of an
        # asynchronous device does not split its step: no advice
        return []
    for rule in (_workers, _batch, _nproc):
        advice = rule(report)
        if advice is not None:
            found.append(advice)
    return found


def off_cpu(report: dict[str, Any]) -> list[str]:
    """The devices other than the CPU that the run's optimizers stepped parameters on."""
    return [device for device in report.get("devices") or () if device != "cpu"]


def _training_s(report: dict[str, Any]) -> float:
    return report["data_s"] + report["compute_s"] + report["optimizer_s"]


def _workers(report: dict[str, Any]) -> dict[str, Any] | None:
    """Waiting for data is a large share of training and the loader has fewer workers than
    this process's CPUs: suggest as many workers as it has CPUs (at most 8)."""
    workers, trained = report.get("num_workers"), _training_s(report)
    if workers is None or trained <= 0:
        return None
    share = report["data_s"] / trained
    suggested = max(1, min(report["cpus"], MAX_WORKERS))
    if share <= DATA_WAIT_SHARE or workers >= suggested:
        return None
    each = " per process" if report.get("world_size", 1) > 1 else ""
    figure = f"waiting for data took {share:.0%} of training with num_workers={workers}"
    change = f"DataLoader(..., num_workers={suggested})"
    return {
        "rule": "num_workers",
        "figure": figure,
        "change": change,
        "text": f"{figure}: {change} prepares batches in {suggested} worker process(es) while the model "
        f"trains (this process may use {report['cpus']} CPU(s){each})",
    }


def _batch(report: dict[str, Any]) -> dict[str, Any] | None:
    """The optimizer step takes a large share of each step at a small batch: per-step costs
    (updating every weight, Python and per-operator overhead) do not shrink with the batch."""
    batch, step = report.get("batch_size"), report["compute_s"] + report["optimizer_s"]
    if not batch or step <= 0:
        return None
    share = report["optimizer_s"] / step
    if share <= OPTIMIZER_SHARE:
        return None
    bigger = batch * 4
    figure = f"the optimizer step took {share:.0%} of each training step at batch size {batch}"
    change = f"batch size {bigger} with the learning rate x4"
    return {
        "rule": "batch_size",
        "figure": figure,
        "change": change,
        "text": f"{figure} ({report['step_s'] * 1e3:.1f} ms a step): per-step costs dominate; a batch of "
        f"{bigger} spreads them over 4x the samples. Scale the learning rate with the batch (the linear "
        f"scaling rule: lr x4, warmed up over the first steps)",
    }


def _nproc(report: dict[str, Any]) -> dict[str, Any] | None:
    """Where ``--nproc measure`` timed this command on this machine, its figures decide: advice
    only when this run used another count than the fastest. Otherwise: one process kept few of
    its threads busy during its steps, so several processes, each on its own cores, would use
    the machine better."""
    measured = measure.figures()
    if measured is not None:
        return _measured(report, measured)
    busy, threads, cpus = report.get("cores_busy"), report.get("threads") or 1, report["cpus"]
    if busy is None or report.get("world_size", 1) > 1 or min(threads, cpus) < 2:
        return None
    usable = min(threads, cpus)
    if busy >= BUSY_SHARE * usable:
        return None
    if (report.get("others_busy") or 0.0) > OTHERS_BUSY:
        return None  # the machine's other work took the cores: a second process would not have them
    nproc = max(2, min(cpus, round(usable / max(busy, 1.0))))
    figure = f"the training steps kept {busy:.1f} of this process's {usable} threads busy"
    change = f"python -m nanopatch --nproc {nproc} script.py"
    return {
        "rule": "nproc",
        "figure": figure,
        "change": change,
        "text": f"{figure}: one process does not use this machine's cores well; `{change}` trains {nproc} "
        "processes data-parallel, each pinned to its own cores (`--nproc measure` times 1, 2, 4, ... processes "
        "first and trains with the fastest)",
    }


def _measured(report: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any] | None:
    chosen, world = measured.get("chosen"), report.get("world_size", 1) or 1
    if not isinstance(chosen, int) or chosen == world:
        return None
    rates = {t.get("nproc"): t for t in measured["trials"] if isinstance(t, dict) and t.get("rate")}
    if chosen not in rates or world not in rates:
        return None
    fast, this = rates[chosen], rates[world]
    figure = (
        f"--nproc measure timed this command on {measured.get('date') or 'an earlier run'}: {chosen} process(es) "
        f"{fast['rate']:.1f} {fast.get('unit', 'samples/s')} against {this['rate']:.1f} with {world}"
    )
    change = f"python -m nanopatch --nproc {chosen} script.py"
    return {
        "rule": "nproc",
        "figure": figure,
        "change": change,
        "text": f"{figure}: `{change}` (or `--nproc measure`, which reads the same figures) trains "
        f"{fast['rate'] / this['rate']:.2f}x as fast",
    }


#: a compiled run's training rate must beat the eager run's by this factor to be advised
COMPILE_GAIN = 1.05


def compile_trial(eager: dict[str, Any] | None, compiled: dict[str, Any] | None) -> dict[str, Any] | None:
    """What ``--compare --try-compile`` found: the run under ``--compile`` against the patched
    run, by their samples per second while training (the first step, where the model is
    compiled, is start-up). A dict as :func:`advise` gives, with ``"faster"`` saying whether it
    is advice; None when either run has no rate."""
    eager_rate = (eager or {}).get("samples_per_s")
    compiled_rate = (compiled or {}).get("samples_per_s")
    if not eager_rate or not compiled_rate:
        return None
    gain = compiled_rate / eager_rate
    extra = compiled["startup_s"] - eager["startup_s"]
    figure = (
        f"torch.compile ran {gain:.2f}x the samples/s of the run without it while training "
        f"({compiled_rate:.1f} against {eager_rate:.1f}; its start-up took {extra:+.1f} s)"
    )
    faster = gain >= COMPILE_GAIN
    change = "python -m nanopatch --compile script.py" if faster else "none"
    text = f"{figure}: `{change}` trains faster" if faster else f"{figure}: not faster here, nothing to change"
    return {"rule": "compile", "figure": figure, "change": change, "text": text, "faster": faster}
