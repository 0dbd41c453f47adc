"""``--nproc measure``: time the script's first steps at 1, 2, 4, ... processes on this machine
and train with the fastest.

Each count is a trial: the script starts under the runner as it would for that count (one
tuned process, or ``--nproc N`` pinned ranks), its output hidden. Its processes time their
optimizer steps once nanopatch has settled what it measures itself (bf16 against fp32: those
steps are warm-up), write what they measured and end (the breakdown target does that part, in
:mod:`nanopatch.targets.breakdown.measure`). The rate of a count is the samples all its ranks
trained per second of the slowest rank (steps where no DataLoader tells the batch: each rank's
batch is the script's, whatever the count). The run trains with the fewest processes whose rate
is within :data:`MIN_GAIN` of the fastest: more processes hold more memory.

The figures are kept in ``nproc.json`` of nanopatch's cache folder, filed under the script, its
arguments, the runner's options, the interpreter and the CPUs: the next run of the same command
on the machine trains with the count measured, without the trials. The final run's breakdown
reads them from :data:`FIGURES_VARIABLE` for its ``--nproc`` advice.

Trials run the script's first steps again each time: what those steps do besides training
(files written, lines logged) happens once per count.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanopatch.foundation import argv, cpu, records
from nanopatch.runtime import tuning

#: where a trial's processes write what they measured (a folder; one file per rank)
OUT_VARIABLE = "NANOPATCH_MEASURE_OUT"
#: the steps a trial times after its warm-up
STEPS_VARIABLE = "NANOPATCH_MEASURE_STEPS"
#: the final run's figures, as JSON, for the breakdown's advice
FIGURES_VARIABLE = "NANOPATCH_NPROC_MEASURED"
#: the seconds one trial may take before it is stopped and its count left out
TIMEOUT_VARIABLE = "NANOPATCH_MEASURE_TIMEOUT"
DEFAULT_STEPS = 5
DEFAULT_TIMEOUT_S = 300.0
#: the fewest processes whose rate times this reaches the fastest rate are chosen
MIN_GAIN = 1.05
RECORD_FILE = "nproc.json"


@dataclass
class Trial:
    """One count's trial: its rate, or why it has none."""

    nproc: int
    rate: float | None = None
    unit: str = "samples/s"
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"nproc": self.nproc, "rate": self.rate, "unit": self.unit, "problem": self.problem}


def candidates(facts: cpu.CpuFacts) -> list[int]:
    """1, 2, 4, ... up to one process per physical core the run may use."""
    cores = len(tuning.cores_of(facts, None))
    counts, n = [], 1
    while n <= cores:
        counts.append(n)
        n *= 2
    return counts


def without_nproc(own: Sequence[str]) -> list[str]:
    """The runner options with ``--nproc`` and its value left out."""
    return argv.without(own, valued=("--nproc",))


#: runner options that change what a run says, not how fast it trains: not part of a record's key
#: (``-v --nproc auto`` follows the figures ``--nproc measure`` kept)
SAYING = ("-v", "-vv", "-vvv", "--verbose", "--all-ranks-print")


def record_key(options: Sequence[str], target: Sequence[str], facts: cpu.CpuFacts) -> str:
    """The script (its path made absolute), its arguments, the runner's options but those that
    only change what it says, this interpreter and the CPUs the run may use."""
    options = argv.without(options, flags=SAYING)
    target = list(target)
    if target and target[0] != "-m":
        target[0] = os.path.abspath(target[0])
    text = json.dumps([list(options), target, sys.executable, facts.model_name, list(facts.allowed_cpus)])
    return hashlib.sha1(text.encode()).hexdigest()


def rate_of(ranks: Sequence[dict[str, Any]]) -> tuple[float | None, str]:
    """The samples (or steps) every rank trained, over the slowest rank's seconds."""
    seconds = max((float(r.get("seconds") or 0.0) for r in ranks), default=0.0)
    if not ranks or seconds <= 0:
        return None, "samples/s"
    if all(r.get("samples") for r in ranks):
        return sum(int(r["samples"]) for r in ranks) / seconds, "samples/s"
    return sum(int(r.get("steps") or 0) for r in ranks) / seconds, "steps/s"


def choose(trials: Sequence[Trial]) -> int:
    """The count to train with: the fewest processes whose rate is within :data:`MIN_GAIN` of
    the fastest measured (1 where none was measured)."""
    measured = sorted((t for t in trials if t.rate), key=lambda t: t.nproc)
    if not measured:
        return 1
    if len({t.unit for t in measured}) > 1:  # samples for some counts only: those in one process's unit
        measured = [t for t in measured if t.unit == measured[0].unit]
    fastest = max(t.rate for t in measured)  # type: ignore[type-var]
    return next(t.nproc for t in measured if t.rate * MIN_GAIN >= fastest)  # type: ignore[operator]


def describe(trials: Sequence[Trial], chosen: int, when: str | None = None) -> str:
    """One line: each count's rate (against one process's), and the count chosen."""
    base = next((t.rate for t in trials if t.nproc == 1 and t.rate), None)
    parts = []
    for t in trials:
        label = f"{t.nproc} process{'es' if t.nproc > 1 else ''}"
        if t.rate:
            gain = f" ({t.rate / base:.2f}x)" if base and t.nproc != 1 else ""
            parts.append(f"{label} {t.rate:.1f} {t.unit}{gain}")
        else:
            parts.append(f"{label}: {t.problem or 'not measured'}")
    source = f"measured {when}" if when else "measured"
    return f"--nproc measure ({source}): {'; '.join(parts)}; training with {chosen}"


def _read_ranks(folder: str) -> list[dict[str, Any]]:
    found = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("rank") and name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(folder, name)) as f:
                    found.append(json.load(f))
    return found


def _stop(process: subprocess.Popen) -> None:
    """End a trial: its launcher, its ranks and their DataLoader workers (one session)."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
    with contextlib.suppress(OSError):  # what the launcher left (workers of a rank that exited)
        os.killpg(process.pid, signal.SIGKILL)


def run_trial(nproc: int, options: Sequence[str], target: Sequence[str], steps: int, timeout_s: float) -> Trial:
    """Start the script under the runner with ``nproc`` processes and read what they timed."""
    trial = Trial(nproc)
    with tempfile.TemporaryDirectory(prefix="nanopatch-measure-") as folder:
        count = ["--nproc", str(nproc)] if nproc > 1 else []
        argv = [sys.executable, "-m", "nanopatch", *options, *count, "--breakdown", *target]
        environ = {**os.environ, OUT_VARIABLE: folder, STEPS_VARIABLE: str(steps)}
        log = os.path.join(folder, "stderr.txt")
        started = time.perf_counter()
        with open(log, "wb") as stderr:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=environ,
                start_new_session=True,
            )
            try:
                while True:
                    ranks = _read_ranks(folder)
                    if len(ranks) >= nproc:
                        break
                    if process.poll() is not None:
                        ranks = _read_ranks(folder)
                        break
                    if time.perf_counter() - started > timeout_s:
                        trial.problem = f"stopped after {timeout_s:.0f} s"
                        break
                    time.sleep(0.05)
            finally:
                _stop(process)
        if len(ranks) >= nproc:
            trial.rate, trial.unit = rate_of(ranks)
        elif trial.problem is None:
            code = process.returncode
            if code == 0:
                trial.problem = "the script ended before its steps could be timed"
            else:
                with open(log, errors="replace") as f:
                    tail = f.read()[-2000:].strip().splitlines()
                last = tail[-1] if tail else ""
                trial.problem = f"failed (exit code {code}){': ' + last if last else ''}"
    return trial


def _say(line: str) -> None:
    """The runner's line on stderr."""
    print(f"nanopatch: {line}", file=sys.stderr, flush=True)


def _recorded(key: str) -> tuple[list[Trial], str | None]:
    record = records.read_record(key, RECORD_FILE)
    if record is None:
        return [], None
    try:
        trials = [
            Trial(
                int(t["nproc"]),
                None if t.get("rate") is None else float(t["rate"]),
                str(t.get("unit", "samples/s")),
                problem=t.get("problem"),
            )
            for t in record["trials"]
        ]
    except (TypeError, KeyError, ValueError):
        return [], None
    return trials, str(record.get("date", "an earlier run"))


def _export(chosen: int, trials: Sequence[Trial], date: str | None) -> None:
    os.environ[FIGURES_VARIABLE] = json.dumps({"chosen": chosen, "trials": [t.as_dict() for t in trials], "date": date})


def measure(
    own: Sequence[str], target: Sequence[str], facts: cpu.CpuFacts | None = None, log: Any = None
) -> tuple[int, list[Trial], str]:
    """Choose the count for ``target`` (the script and its arguments): from the record of an
    earlier measurement of the same command on this machine, else by trials. Returns (count,
    trials, the line that says so), and exports the figures for the final run's advice."""
    given = figures()
    if given is not None and os.environ.get(tuning.REEXEC_MARKER) and isinstance(given.get("chosen"), int):
        return given["chosen"], [], ""  # this command again, in the interpreter restarted to preload an allocator
    facts = cpu.host_facts() if facts is None else facts
    log = log or _say
    options = without_nproc(own)
    key = record_key(options, target, facts)
    trials, date = _recorded(key)
    when = f"on {date}, kept in {records.cache_dir() / RECORD_FILE}" if trials else None
    if not trials:
        date = datetime.date.today().isoformat()
        steps = int(os.environ.get(STEPS_VARIABLE) or DEFAULT_STEPS)
        timeout_s = float(os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S)
        for nproc in candidates(facts):
            log(f"--nproc measure: timing {steps} steps with {nproc} process(es) ...")
            trial = run_trial(nproc, options, target, steps, timeout_s)
            trials.append(trial)
            if trial.rate is None and nproc == 1:
                break  # the script does not train long enough (or fails) in one process: no count would do
        if any(t.rate for t in trials):
            records.write_record(key, {"trials": [t.as_dict() for t in trials], "date": date}, RECORD_FILE)
    chosen = choose(trials)
    line = describe(trials, chosen, when)
    _export(chosen, trials, date)
    log(line)
    return chosen, trials, line


def recall(
    own: Sequence[str], target: Sequence[str], facts: cpu.CpuFacts | None = None, follow: bool = False, log: Any = None
) -> int | None:
    """For a run without ``--nproc measure``: the count an earlier measurement of the same
    command chose, exported for the run's advice (None where there is no record). ``follow``:
    ``--nproc auto`` trains with that count, and says so (once, not again in the interpreter
    restarted to preload an allocator)."""
    facts = cpu.host_facts() if facts is None else facts
    trials, date = _recorded(record_key(without_nproc(own), target, facts))
    if not trials:
        return None
    chosen = choose(trials)
    _export(chosen, trials, date)
    if follow and not os.environ.get(tuning.REEXEC_MARKER):
        log = log or _say
        when = f"on {date}, kept in {records.cache_dir() / RECORD_FILE}"
        log(f"--nproc auto follows {describe(trials, chosen, when)}")
    return chosen


def per_socket(facts: cpu.CpuFacts | None = None, log: Any = None) -> int:
    """``--nproc auto`` where no measurement of the command is kept: one process per socket,
    said once (not again in the interpreter restarted to preload an allocator)."""
    facts = cpu.host_facts() if facts is None else facts
    count = tuning.auto_nproc(facts)
    if not os.environ.get(tuning.REEXEC_MARKER):
        log = log or _say
        runs = "1 process" if count == 1 else f"{count} processes"
        log(
            f"--nproc auto: one process per socket, {runs} here (no --nproc measure figures for this command: "
            "it times 1, 2, 4, ... processes, and auto follows them)"
        )
    return count


def figures(environ: Any = None) -> dict[str, Any] | None:
    """The measured figures exported for this run, or None."""
    text = (os.environ if environ is None else environ).get(FIGURES_VARIABLE)
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) and isinstance(found.get("trials"), list) else None
