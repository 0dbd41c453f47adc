"""Processes a bench starts: fresh process groups, their load on the machine, reaping what they leave,
and the ranks of a group run in rounds (multi_instance.py, frameworks.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .rows import OTHER_LOAD_WARNING, row
from .text import one_line, plural, tail


def machine_busy_s() -> float | None:
    """CPU seconds all CPUs of the machine have spent busy since boot (steal included), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_PR_SET_CHILD_SUBREAPER = 36


def adopt_descendants() -> None:
    """Make processes a run leaves behind (Lightning's DDP rank 1, not waited for by rank 0) this
    process's children, so :func:`reap_descendants` waits for them and their CPU time counts as
    the run's own. Linux only; elsewhere nothing changes."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def reap_descendants(group: int, timeout: float) -> None:
    """Wait for every child left; after ``timeout`` seconds kill process group ``group`` and reap."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
            deadline = float("inf")
        time.sleep(0.05)


class LoadMeter:
    """The CPU time the rest of the machine takes from now to :meth:`other_load`, as a share of all
    CPUs: the machine's busy time (``/proc/stat``) less ``own_cpu_s``, what the measured work took."""

    def __init__(self) -> None:
        self.busy = machine_busy_s()
        self.started = time.perf_counter()

    def other_load(self, own_cpu_s: float) -> float | None:
        busy, wall = machine_busy_s(), time.perf_counter() - self.started
        if self.busy is None or busy is None or wall <= 0:
            return None
        return max(0.0, busy - self.busy - own_cpu_s) / (wall * (os.cpu_count() or 1))


def clean_env(cleared: Sequence[str] = (), prefixes: tuple[str, ...] = ("NANOPATCH_",)) -> dict[str, str]:
    """This environment without the variables ``cleared`` or starting with ``prefixes`` (no
    NANOPATCH_* setting from outside: a variant is what its command line or arguments say), with
    this checkout's nanopatch first on PYTHONPATH and unbuffered output."""
    import importlib.util

    spec = importlib.util.find_spec("nanopatch")
    assert spec is not None and spec.origin is not None
    package_parent = str(Path(spec.origin).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k not in cleared and not k.startswith(prefixes)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_process_group(argv: list[str], *, env: dict[str, str], cwd: str, log_path: Path, timeout: float):
    """Run ``argv`` as its own session, output to ``log_path``, reaping what it leaves behind.
    Returns (exit code or None on timeout, wall seconds, other load): the CPU time the rest of the
    machine took meanwhile, as a share of all CPUs (None where /proc/stat cannot be read)."""
    adopt_descendants()
    meter, ours_before = LoadMeter(), children_cpu_s()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    reap_descendants(proc.pid, 60)
    return code, time.perf_counter() - meter.started, meter.other_load(children_cpu_s() - ours_before)


def load_warning(loads: Sequence[float], runs: int) -> str | None:
    """The note for a variant whose runs overlapped other load above :data:`OTHER_LOAD_WARNING`."""
    busy = [f"{x * 100:.0f}%" for x in loads if x > OTHER_LOAD_WARNING]
    if not busy:
        return None
    return (
        f"other processes took {', '.join(busy)} of the machine's CPU time during "
        f"{plural(len(busy), 'run')} of {runs}: those rates are suspect"
    )


def run_ranks(argv: list[str], *, env: dict[str, str], out: str, timeout: float, count: str, expected: int | None):
    """One fresh process group whose ranks each write ``rank<N>.json`` (``count`` done in
    ``seconds``, ``cpu_s``) into ``out``: the rate is all ranks' count over the slowest rank's
    seconds. Returns that with the ranks' reports, or ``error`` and the log's ``log`` tail."""
    log_path = Path(out, "log.txt")
    code, wall, other_load = run_process_group(argv, env=env, cwd=out, log_path=log_path, timeout=timeout)
    if code is None:
        return {"error": f"no result within {timeout:.0f} s (killed)", "log": tail(log_path)}
    ranks = []
    for path in sorted(Path(out).glob("rank*.json")):
        try:
            ranks.append(json.loads(path.read_text()))
        except ValueError as exc:
            return {"error": f"{path.name}: {exc}", "log": tail(log_path)}
    if code != 0:
        return {"error": f"exited with status {code}", "log": tail(log_path)}
    if not ranks or (expected is not None and len(ranks) != expected):
        return {"error": f"{len(ranks)} rank result(s), expected {expected or 'some'}", "log": tail(log_path)}
    ranks.sort(key=lambda r: r["rank"])
    done = sum(r[count] for r in ranks)
    seconds = max(r["seconds"] for r in ranks)
    return {
        "rate": done / seconds,
        count: done,
        "seconds": seconds,
        "cpu_s": sum(r["cpu_s"] for r in ranks),
        "wall_s": wall,
        "other_load": other_load,
        "ranks": ranks,
        "log_tail": tail(log_path, 8),
    }


def rank_checks(ranks: list[dict[str, Any]], data_key: str) -> dict[str, bool | None]:
    """Across the ranks of one run (None for a single rank): whether their CPUs at start were
    disjoint, their parameters equal after the run (gradients averaged) and the data they saw
    first (``data_key``) different (the loader sharded)."""
    if len(ranks) < 2:
        return {"disjoint_affinity": None, "ranks_in_sync": None, "ranks_saw_different_data": None}
    starts = [set(r["affinity_at_start"]) for r in ranks]
    sums = [r["param_checksum"] for r in ranks]
    data = [r[data_key] for r in ranks]
    return {
        "disjoint_affinity": all(not (a & b) for i, a in enumerate(starts) for b in starts[i + 1 :]),
        "ranks_in_sync": all(abs(c - sums[0]) <= 1e-9 * max(1.0, abs(sums[0])) for c in sums),
        "ranks_saw_different_data": len(set(data)) == len(data) if None not in data else None,
    }


def ranks_row(bench: str, group: str, variant: str, unit: str, results: list[dict[str, Any]], cores: int, **extra):
    """The row of a variant run by :func:`run_ranks` in rounds: the median rate, the spread, the
    first error, and in ``details`` the CPU use, set-up and wall time and the other load."""
    ok = [r for r in results if "rate" in r]
    errors = [r for r in results if "rate" not in r]
    loads = [r["other_load"] for r in ok if r["other_load"] is not None]
    if errors:
        extra.update(error=errors[0]["error"], failed_runs=len(errors), log=errors[0].get("log", ""))
    details: dict[str, Any] = {}
    if ok:
        details = {
            "cpu_use": statistics.median(r["cpu_s"] / (r["seconds"] * cores) for r in ok),
            "setup_s": statistics.median(max(x["setup_s"] for x in r["ranks"]) for r in ok),
            "wall_s": statistics.median(r["wall_s"] for r in ok),
            "other_load": loads,
            "load_warning": load_warning(loads, len(ok)),
        }
    rates = [r["rate"] for r in ok]
    return row(
        bench,
        group,
        variant,
        statistics.median(rates) if rates else None,
        unit,
        None,
        rates=rates,
        rounds=[r["round"] for r in ok],
        other_load=max(loads) if loads else None,
        note=None if ok else one_line(extra.get("error", "no rate")),
        details=details,
        **extra,
    )
