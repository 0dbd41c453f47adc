"""What every benchmark in bench/ shares: the result row, spreads, the rotated order of rounds,
machine facts, load measurement, a forward-hook probe, and the reaping of processes a run leaves.

One row schema serves every bench's JSON (``rows``), its own table and ``bench/run.py``'s report:
see :func:`row`.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
#: CPU time / (wall time x threads) of a sample below which other processes shared its cores
BUSY_CPU_SHARE = 0.9
#: share of the machine's CPU time other processes took during a run above which it is suspect
OTHER_LOAD_WARNING = 0.05
SUSPECT_MARK = "\u2020"  # dagger


# --- the result row -----------------------------------------------------------------------------


def row(
    bench: str,
    group: str,
    variant: str,
    rate: float | None,
    unit: str,
    ratio: float | None,
    *,
    stock: bool = False,
    rates: Sequence[float] = (),
    note: str | None = None,
    cpu_share: float | None = None,
    other_load: float | None = None,
    noisy: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """One result. ``rate`` is the median over the rounds (None: the variant did not run, ``note``
    says why); ``ratio_to_stock`` a speed-up over the group's ``stock`` row (above 1.0 is faster);
    ``rates`` the per-round rates and ``spread`` their [min, max]. ``cpu_share``: CPU time / (wall
    time x threads) of the timed samples; ``other_load``: the most CPU time other processes took
    during a round, as a share of all CPUs; ``noisy``: suspect for a reason the note gives.
    ``extra``: the bench's own details, kept beside the common keys."""
    rates = [float(r) for r in rates]
    out: dict[str, Any] = {
        "bench": bench,
        "group": group,
        "variant": variant,
        "rate": None if rate is None else float(rate),
        "unit": unit,
        "ratio_to_stock": 1.0 if stock and rate is not None else (None if ratio is None else float(ratio)),
        "stock": stock,
        "rates": rates,
        "spread": [min(rates), max(rates)] if rates else [],
    }
    if note:
        out["note"] = note
    if cpu_share is not None:
        out["cpu_share"] = float(cpu_share)
    if other_load is not None:
        out["other_load"] = float(other_load)
    if noisy:
        out["noisy"] = True
    out.update(extra)
    return out


def suspect(r: dict[str, Any]) -> bool:
    """Other processes took the cores while the row was timed, or it is too noisy to trust."""
    return (
        bool(r.get("noisy"))
        or (r.get("cpu_share") is not None and r["cpu_share"] < BUSY_CPU_SHARE)
        or (r.get("other_load") is not None and r["other_load"] > OTHER_LOAD_WARNING)
    )


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the interquartile range as a percentage of the median."""
    median = statistics.median(values)
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [median] * 3
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "iqr_pct": (quartiles[2] - quartiles[0]) / median * 100 if median else 0.0,
    }


def rotated(names: Sequence[str], index: int) -> list[str]:
    """The order of round ``index``: every variant once, starting one further each round."""
    shift = index % len(names) if names else 0
    return [*names[shift:], *names[:shift]]


def per_round(rates: Sequence[float], rounds: Sequence[int], base_rates: Sequence[float], base_rounds: Sequence[int]):
    """rate / base rate, round by round, for the rounds both ran."""
    base = dict(zip(base_rounds, base_rates, strict=True))
    return [r / base[i] for i, r in zip(rounds, rates, strict=True) if i in base]


# --- the machine --------------------------------------------------------------------------------


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def installed(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def git_state() -> dict[str, Any]:
    """The checkout's commit, whether tracked files changed, and what changed under nanopatch/
    (untracked files too: they are what the nanopatch variants import)."""

    def git(*words: str) -> str | None:
        try:
            done = subprocess.run(["git", *words], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    changed = git("status", "--porcelain", "--untracked-files=no")
    ours = git("status", "--porcelain", "--", "nanopatch") or ""
    return {
        "commit": (git("rev-parse", "HEAD") or "").strip() or None,
        "dirty": None if changed is None else bool(changed.strip()),
        "nanopatch_changes": [line[3:] for line in ours.splitlines()],
    }


def machine_facts(*packages: str) -> dict[str, Any]:
    """CPU (from ``nanopatch.cpu``: model, cores, ISA flags, bf16/AMX), memory, the versions of
    Python, torch, torchvision, nanopatch and ``packages``, the git state and the load average."""
    from nanopatch import cpu

    facts = cpu.host_facts().as_dict()
    keep = ("vendor", "model_name", "flags", "logical_cpus", "allowed_cpus", "physical_cores", "sockets")
    return {
        **{k: facts[k] for k in keep},
        "usable_cores": facts["usable_cores"],
        "amx": facts["amx"],
        "native_bf16": facts["native_bf16"],
        "mem_total_gib": mem_total_gib(),
        "python": platform.python_version(),
        **{name: installed(name) for name in ("torch", "torchvision", "nanopatch", *packages)},
        "git": git_state(),
        "loadavg_start": load_average(),
    }


def source_digest() -> str | None:
    """A digest of nanopatch's source as the next run will import it, to see edits between rounds."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("nanopatch")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    digest = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def mapped_library(fragment: str) -> str | None:
    """Real path of a shared library mapped into this process whose file name contains ``fragment``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if fragment in os.path.basename(path):
                    return os.path.realpath(path)
    except OSError:
        pass
    return None


# --- load and processes -------------------------------------------------------------------------


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


# --- inside the model ---------------------------------------------------------------------------


class Probe:
    """A forward hook on one layer: the dtype it computed in and whether its 4-D input was
    channels-last, for every call in grad mode while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.layer: str | None = None
        self.calls = 0
        self.dtypes: Counter[str] = Counter()
        self.inputs_4d = 0
        self.channels_last = 0
        self.handle = None

    def attach(self, model, kind) -> None:
        """Hook the first module of ``model`` that ``kind(module)`` accepts (a class or a predicate)."""
        accepts = (lambda m: isinstance(m, kind)) if isinstance(kind, type) else kind
        for name, module in model.named_modules():
            if accepts(module):
                self.layer = f"{name} ({type(module).__name__})"
                self.handle = module.register_forward_hook(self.hook)
                return
        raise RuntimeError(f"no {getattr(kind, '__name__', kind)} in {type(model).__name__}")

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def hook(self, module, inputs, output) -> None:
        import torch

        if not self.active or not torch.is_grad_enabled():
            return
        self.calls += 1
        self.dtypes[str(output.dtype).removeprefix("torch.")] += 1
        x = inputs[0] if inputs else None
        if isinstance(x, torch.Tensor) and x.dim() == 4:
            self.inputs_4d += 1
            if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
                self.channels_last += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "calls": self.calls,
            "dtypes": dict(self.dtypes),
            "inputs_4d": self.inputs_4d,
            "channels_last": self.channels_last,
        }


def dtype_name(dtypes: dict[str, int]) -> str:
    short = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
    return "+".join(short.get(d, d) for d in sorted(dtypes, key=lambda d: -dtypes[d])) or "?"


def inside(probe: dict[str, Any]) -> str:
    """The probe's verdict for the table: '<dtype> / <channels-last or not>'."""
    if not probe["calls"]:
        return "no call seen"
    text = dtype_name(probe["dtypes"])
    if probe["inputs_4d"] == 0:
        return f"{text} / n/a"
    if probe["channels_last"] == probe["inputs_4d"]:
        return f"{text} / channels-last"
    if probe["channels_last"] == 0:
        return f"{text} / contiguous"
    return f"{text} / channels-last {probe['channels_last']} of {probe['inputs_4d']}"


# --- learning: does a variant learn as stock? -------------------------------------------------

#: optimizer steps every training variant records from the seed for the learning check (full, --quick)
LEARNING_STEPS = {False: 6, True: 3}
DOES_NOT_LEARN = "does not learn"
_STANDALONE_LEARNING = "_nanopatch_learning_for_bench"


def learning_definition() -> tuple[Any, bool]:
    """(``nanopatch.learning``, standalone): the one definition of "learns as stock" that the
    test suite uses too. In a process that has not imported nanopatch (a stock variant, which
    must not) the same file is loaded on its own, without the package (it imports nothing of
    nanopatch's); ``standalone`` says so."""
    import importlib
    import importlib.util

    if "nanopatch" in sys.modules:
        return importlib.import_module("nanopatch.learning"), False
    if _STANDALONE_LEARNING in sys.modules:
        return sys.modules[_STANDALONE_LEARNING], True
    spec = importlib.util.find_spec("nanopatch")
    assert spec is not None and spec.origin is not None, "nanopatch is not importable"
    path = Path(spec.origin).parent / "learning.py"
    loaded = importlib.util.spec_from_file_location(_STANDALONE_LEARNING, path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules[_STANDALONE_LEARNING] = module  # dataclasses look their module up
    loaded.loader.exec_module(module)
    return module, True


class Learning:
    """The first ``steps`` optimizer steps of a training run, recorded by ``nanopatch.learning``'s
    Recorder (the loss backpropagated, the parameters that got a gradient and those updated),
    parameters named by ``models``. :meth:`start` before the first step; :meth:`after_step`
    after each (it stops recording once ``steps`` were taken); ``record``: the steps as dicts."""

    def __init__(self, steps: int, models: Sequence[Any] = ()) -> None:
        self.steps = steps
        self.models = list(models)
        self.record: list[dict[str, Any]] = []
        self._recorder: Any = None
        self._standalone = False

    def start(self) -> Learning:
        if self.steps > 0:
            definition, self._standalone = learning_definition()
            self._recorder = definition.Recorder(self.models).__enter__()
        return self

    def __enter__(self) -> Learning:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def after_step(self) -> None:
        if self._recorder is not None and len(self._recorder.steps) >= self.steps:
            self.stop()

    def stop(self) -> None:
        if self._recorder is None:
            return
        recorder, self._recorder = self._recorder, None
        recorder.__exit__(None, None, None)
        self.record = [step.as_dict() for step in recorder.steps[: self.steps]]
        if self._standalone and "nanopatch" in sys.modules:
            raise RuntimeError("nanopatch was imported while a variant that must not import it was recorded")


def judge(record: Sequence[dict[str, Any]], stock: Sequence[dict[str, Any]] | None, against: str) -> dict[str, Any]:
    """A variant's ``learning`` entry: its loss and gradient count per step beside stock's
    (``against``: the variant it is compared with) and ``nanopatch.learning.compare``'s verdict:
    ``learns`` True or False, or None when there is no stock record to compare with."""
    entry: dict[str, Any] = {
        "against": against,
        "steps": len(record),
        "loss": [s["loss"] for s in record],
        "grads": [len(s["grads"]) for s in record],
    }
    if stock is None:
        return {**entry, "learns": None, "verdict": f"not judged: no {against} run to compare with"}
    from nanopatch.learning import Step, compare

    verdict = compare([Step.from_dict(s) for s in stock], [Step.from_dict(s) for s in record])
    return {
        **entry,
        "stock_loss": [s["loss"] for s in stock],
        "stock_grads": [len(s["grads"]) for s in stock],
        "learns": verdict.learns,
        "verdict": verdict.summary(),
        "problems": verdict.problems,
        "final_difference": verdict.final_difference,
    }


def reference(record: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``learning`` entry of the stock row itself: the record the others are judged against."""
    return {
        "against": None,
        "steps": len(record),
        "loss": [s["loss"] for s in record],
        "grads": [len(s["grads"]) for s in record],
        "learns": True if record else None,
        "verdict": "the reference" if record else "not judged: no step recorded",
    }


def learning_entry(
    record: Sequence[dict[str, Any]], stock: Sequence[dict[str, Any]] | None, against: str
) -> dict[str, Any]:
    """:func:`reference` for stock's own record (``record is stock``), else :func:`judge`."""
    return reference(record) if record is stock else judge(record, stock, against)


def learns(r: dict[str, Any]) -> bool | None:
    """A row's verdict (``learning.learns``): None when it has none (not judged, or not training)."""
    return (r.get("learning") or {}).get("learns")


def withhold(r: dict[str, Any]) -> dict[str, Any]:
    """Make row ``r`` of a variant that does not learn as stock give no speed-up: its rate, per-round
    rates, spread, every ratio and target go; its note gives the verdict. Call it before the
    ratios are computed."""
    for key in [k for k in r if k.startswith("ratio") or k in ("rates", "spread", "targets")]:
        del r[key]
    r.update(rate=None, ratio_to_stock=None, rates=[], spread=[], note=one_line(r["learning"]["verdict"], 400))
    return r


#: the timing of a run of fresh processes (:func:`run_ranks`), its ranks' and its row's details:
#: what a variant that does not learn as stock does not keep
RUN_TIMING = ("rate", "seconds", "cpu_s", "wall_s", "step_s", "warmup_s", "setup_s", "cpu_use", "step_s_per_rank")


def learning_row(
    r: dict[str, Any], record: list[dict[str, Any]] | None, stock: list[dict[str, Any]] | None, against: str
) -> dict[str, Any]:
    """Give row ``r`` its ``learning`` entry: ``record`` judged against ``stock``'s (the record of
    the variant named ``against``; ``r`` is that variant's own row when ``record is stock``). A row
    that does not learn as stock keeps no timing (:func:`withhold`, and its details lose
    :data:`RUN_TIMING`). Nothing changes without a record."""
    if record is None:
        return r
    r["learning"] = learning_entry(record, stock, against)
    if r["learning"]["learns"] is False:
        withhold(r)
        if "details" in r:
            r["details"] = {k: v for k, v in r["details"].items() if k not in RUN_TIMING}
    return r


def runs_kept(r: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A variant's run results as its report keeps them: without their timing (:data:`RUN_TIMING`,
    the ranks' too) when its row ``r`` does not learn as stock."""
    if learns(r) is not False:
        return results
    kept = []
    for result in results:
        out = {k: v for k, v in result.items() if k not in RUN_TIMING}
        if "ranks" in out:
            out["ranks"] = [{k: v for k, v in rank.items() if k not in RUN_TIMING} for rank in out["ranks"]]
        kept.append(out)
    return kept


def first_steps(n: int) -> str:
    return "the first step" if n == 1 else f"the first {n} steps"


def learning_line(r: dict[str, Any]) -> str:
    """A row's learning record for a report: its verdict and its loss and gradient count per step
    beside stock's."""
    entry = r["learning"]

    def losses(values: Sequence[float | None]) -> str:
        return " ".join("-" if v is None else f"{v:.4g}" for v in values)

    text = f"`{r['variant']}`: {entry['verdict']}"
    if entry.get("loss"):
        text += f"; loss {losses(entry['loss'])}, grads {'/'.join(map(str, entry['grads']))}"
    if entry.get("stock_loss") is not None:
        grads = "/".join(map(str, entry["stock_grads"]))
        text += f" ({entry['against']}: loss {losses(entry['stock_loss'])}, grads {grads})"
    return text


# --- command lines and text ---------------------------------------------------------------------------------------


def parse_names(text: str, known, option: str, parser, aliases: dict[str, list[str]] | None = None,
                shown=None) -> list[str]:  # fmt: skip
    """The comma-separated names of ``text``, each in ``known`` (or an alias for several), in order
    and once each; a parser error names the unknown ones and what ``shown`` (default: ``known``) offers."""
    aliases = aliases or {}
    names: list[str] = []
    unknown = []
    for word in (w.strip() for w in text.split(",")):
        if word in aliases:
            names += aliases[word]
        elif word in known:
            names.append(word)
        elif word:
            unknown.append(word)
    if unknown or not names:
        offered = ", ".join([*(shown or known), *aliases])
        parser.error(f"{option}: unknown {', '.join(unknown) or '(none given)'}; choose from {offered}")
    return list(dict.fromkeys(names))


def log(message: str) -> None:
    """Progress, on stderr (stdout carries the table or the JSON)."""
    print(message, file=sys.stderr, flush=True)


def cpu_line(m: dict[str, Any]) -> str:
    """The Markdown line of :func:`machine_facts`' CPU."""
    yes_no = {True: "yes", False: "no", None: "?"}
    return (
        f"- CPU: {m['model_name']} ({m['logical_cpus']} logical CPUs, {m['physical_cores']} physical cores "
        f"allowed, usable {m['usable_cores']}); flags: {' '.join(m['flags']) or '-'}; native bf16: "
        f"{yes_no[m['native_bf16']]}, AMX: {yes_no[m['amx']]}"
    )


def fmt(value: float) -> str:
    """A rate with 3 significant digits, or none after the point from 100 on."""
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def one_line(text: object, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cell(text: object) -> str:
    """``text`` on one line, fit for a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "/")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return os.path.abspath(path) if relative.startswith("..") else relative


# --- rounds of fresh process groups (multi_instance.py, frameworks.py) -------------------------

#: rounds, timed steps, warm-up steps and learning steps by default and with --quick
ROUND_DEFAULTS = {
    False: {"rounds": 3, "steps": 5, "warmup": 2, "learning_steps": LEARNING_STEPS[False]},
    True: {"rounds": 2, "steps": 2, "warmup": 1, "learning_steps": LEARNING_STEPS[True]},
}


def add_round_options(parser) -> None:
    """--rounds, --steps, --warmup, --learning-steps and --quick (see :func:`round_defaults`)."""
    parser.add_argument("--rounds", type=int, help="rounds; every variant runs once per round (default 3; 2 --quick)")
    parser.add_argument("--steps", type=int, help="timed training steps per run (default 5; 2 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them (default 2; 1 with --quick)")
    parser.add_argument(
        "--learning-steps",
        type=int,
        help=f"steps a variant's first run records from the seed before its warm-up, judged against stock's for "
        f"the learning check (default {LEARNING_STEPS[False]}; {LEARNING_STEPS[True]} with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 2 steps after 1 warm-up step and 3 learning steps"
    )


def round_defaults(args) -> None:
    """Fill in the round options not given, as ``--quick`` says."""
    for name, value in ROUND_DEFAULTS[args.quick].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def finish(report: dict[str, Any], json_path: str | None, print_table) -> int:
    """Write ``report`` as JSON to ``json_path`` (if given) and print its table. The exit code is 0
    when any row has a rate: a variant that failed is a row with its error, and bench/run.py reads
    the JSON only after exit code 0."""
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    print_table(report)
    return 0 if any(r["rate"] is not None for r in report["rows"]) else 1


def recording_first(run_one, steps: int):
    """``run_one(name, learn)`` as :func:`interleave` calls it: a variant's runs record ``steps``
    learning steps before their warm-up until one of them ran (its first round, unless that failed);
    the later rounds record none."""
    recorded: set[str] = set()

    def run(name: str) -> dict[str, Any]:
        result = run_one(name, 0 if name in recorded else steps)
        if "rate" in result:
            recorded.add(name)
        return result

    return run


def record_of(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The learning record of a variant's runs (:func:`run_ranks`' results): rank 0's, of the
    first run that recorded one."""
    for result in results:
        if "rate" in result and result["ranks"][0].get("learning_steps"):
            return result["ranks"][0]["learning"]
    return None


def interleave(names: Sequence[str], rounds: int, run_one, log, settle_s: float):
    """Run every name once per round, the order rotated each round, pausing ``settle_s`` before
    each. ``run_one(name)`` returns a dict (``rate`` or ``error``); each gets its ``round``.
    Returns ({name: [results]}, [{"order": [...]}, ...])."""
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    orders = []
    for index in range(rounds):
        order = rotated(names, index)
        orders.append({"order": order})
        log(f"round {index + 1}/{rounds}: {', '.join(order)}")
        for name in order:
            time.sleep(settle_s)
            result = run_one(name)
            result["round"] = index
            runs[name].append(result)
            if "rate" in result:
                log(f"  {name}: {result['rate']:.3g} ({result['wall_s']:.0f} s)")
            else:
                log(f"  {name}: FAILED: {result['error']}\n{result.get('log', '')}")
    return runs, orders


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


def ratios_to(rows: list[dict[str, Any]], base: dict[str, Any] | None, key: str = "ratio_to_stock") -> None:
    """Set ``key`` (and, for the stock ratio, ``ratio_per_round``) of every row that ran against ``base``."""
    if base is None or not base["rate"]:
        return
    for r in rows:
        if r["rate"] is None:
            continue
        r[key] = r["rate"] / base["rate"]
        if key == "ratio_to_stock":
            r["ratio_per_round"] = per_round(r["rates"], r["rounds"], base["rates"], base["rounds"])
