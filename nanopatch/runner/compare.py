"""``python -m nanopatch --compare script.py [args]``: run a script stock, then patched, and
compare.

Both runs get the same arguments, the same environment (no ``NANOPATCH_*`` in the stock
one) and ``PYTHONHASHSEED=0``; a script that seeds its RNGs sees the same random numbers in
both. The stock run is the script as it stands, timed (``python -m nanopatch._stock
--breakdown script.py args``: nothing that accelerates, a clock read per batch and per
optimizer step), and the patched run is ``python -m nanopatch --breakdown [your runner
options] script.py args``; with ``--no-breakdown`` the stock run is plain ``python script.py
args``. With ``--cuda-to-cpu`` the stock run has the CUDA redirect too, since a GPU script
cannot run here without it. Their output is shown as it comes, each
line prefixed with the run's name. Afterwards a table gives each run's wall time and exit
code. It also gives the last images/s, loss and accuracy the script printed, recognised by
their labels (``images/s``, ``img/s``, ``samples/s``, ``loss``, ``acc``/``accuracy``; an
evaluation's loss and accuracy, ``val loss`` or a ``Test: ...`` line, in rows of their own), the
speed-ups, and whether the patched run accelerated a model (from the account it writes at
its end: which model, in which dtype and layout, or why none). Then where each run's time
went (:mod:`nanopatch.targets.breakdown`) and the patched run's advice; ``--plot FILE.png`` draws the
breakdown as a stacked bar chart. The exit code is the first failing run's, else 0.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import NamedTuple

from nanopatch.foundation import usage

REPORT_VARIABLE = "NANOPATCH_REPORT"  # where the patched run writes its account (write_report, below)

# Every pattern here runs on every line a script prints, so none may take more than linear time
# on any line (a line of 16,000 digits, or a label followed by 16,000 spaces, took 28 s with
# overlapping alternatives): a number starts only where no digit or point is before it, and its
# parts cannot match the same characters two ways; a separator is ``\s*(?:[:=]\s*)?``, not
# ``\s*[:=]?\s*``; a count is at most 12 digits, so ``int()`` never meets Python's 4,300-digit limit.
_NUMBER = r"(?<![\d.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_COUNT = r"(?<!\d)\d{1,12}(?!\d)"
_PER_SECOND = r"(?:images|imgs|img|samples|examples)\s*/\s*s(?:ec)?\b"
#: the ways scripts print their speed, strongest first: a run's rate is read from the values of
#: the strongest kind found anywhere in its output (a training meter over a progress bar's it/s)
RATE_KINDS = (
    # "img/s: 135.2" (torchvision's references), "samples/s = 80", HF's "'train_samples_per_second': 3.2"
    ("labelled", re.compile(rf"(?:{_PER_SECOND}|\btrain_samples_per_second\b)['\"]?\s*[:=]\s*({_NUMBER})", re.I)),
    # "412.5 img/s", "1.2e3 samples/sec" (not the number before a label: "lr: 0.05  img/s: 135")
    ("labelled", re.compile(rf"({_NUMBER})\s*{_PER_SECOND}(?!['\"]?\s*[:=])", re.I)),
    # timm's "Time: 2.08s,  15.38/s  (2.08s,  15.38/s)"
    ("per second", re.compile(rf"(?:^|[\s,(])({_NUMBER})/s\b")),
    # a tqdm progress bar's batches per second (Lightning's, HF's): "5.93it/s", "2.10s/it"
    ("batches", re.compile(rf"({_NUMBER})\s*(it/s|s/it)\b")),
)
#: a word before a label that says whose figure it is: "val loss", "val_loss", "train loss"
_SCOPE = r"(?:\b(?P<scope>val|valid|validation|test|eval|evaluation|train|training)[\s_-]*|\b)"
_EVALUATION_SCOPES = {"val", "valid", "validation", "test", "eval", "evaluation"}
#: a line an evaluation prints: torchvision's references' "Test:", pytorch/examples' "Test set:",
#: Lightning's "Validation DataLoader 0: ..." progress bar (whose speed is not training's)
_EVALUATION_LINE = re.compile(
    r"^\W*(?:Test|Testing|Val|Valid|Validation|Validating|Eval|Evaluation|Evaluating|Predicting)\b", re.I
)
PATTERNS = {
    "loss": re.compile(rf"{_SCOPE}loss\b['\"]?\s*(?:[:=]\s*)?({_NUMBER})", re.I),
    # "acc@1: 71.2%", "acc1: 3.12", "accuracy=0.875", and the examples' "Accuracy: 9912/10000 (99%)"
    # and "80.00% (64/80)": a percentage with the count it is of
    "accuracy": re.compile(
        rf"{_SCOPE}acc(?:uracy)?(?:@?1)?\b['\"]?\s*(?:[:=]\s*)?({_NUMBER})"
        rf"\s*(?:(%)(?:\s*\(\s*{_COUNT}\s*/\s*({_COUNT})\s*\))?|/\s*({_COUNT}))?",
        re.I,
    ),
}
#: a batch counter, "[0/8]": an evaluation's line with one before its last batch shows that
#: batch's figures (torchvision's references print the first), not the whole set's
_BATCH_COUNTER = re.compile(rf"\[\s*({_COUNT})\s*/\s*({_COUNT})\s*\]")


@dataclasses.dataclass
class Run:
    name: str
    command: list[str]
    exit_code: int | None = None
    seconds: float = 0.0
    output: list[str] = dataclasses.field(default_factory=list)
    report: dict | None = None  # the patched run's account of what it accelerated
    used: set[str] = dataclasses.field(default_factory=set)  # the parts its processes used (foundation.usage)

    def rate(self) -> tuple[float, str, str] | None:
        """The script's own speed meter: (value, as shown, kind) of the strongest kind in
        :data:`RATE_KINDS` the output has; None when it has none. A meter printed several times
        gives the median of its values after the first (the first step's one-off costs), which
        a last, smaller batch or a slow moment does not sway; it is shown with their count."""
        found = []
        for line in self.output:
            for segment in line.split("\r"):  # a progress bar redraws itself on one line
                rate = _rate_in(segment)
                if rate is not None:
                    found.append(rate)
        if not found:
            return None
        strongest = min(rate[0] for rate in found)
        values = [rate for rate in found if rate[0] == strongest]
        values = sorted(values[1:] if len(values) > 1 else values, key=lambda rate: rate[1])
        kind = values[0][3]
        middle = len(values) // 2
        if len(values) == 1:
            return values[0][1], values[0][2], kind
        if len(values) % 2:
            value, shown = values[middle][1], _compact(values[middle][2])
        else:
            value = (values[middle - 1][1] + values[middle][1]) / 2
            shown = f"{value:.4g}" + {"per second": "/s", "batches": " it/s"}.get(kind, "")
        return value, f"{shown} (median of {len(values)})", kind

    def metric(self, key: str, validation: bool = False) -> tuple[float, str] | None:
        """The last value the script printed with this label: (value, as printed with its
        unit); with ``validation``, the last of an evaluation's (a label such as ``val loss``
        or ``eval_loss``, or a line such as ``Test: ...``), else the last of training's.
        ``"rate"``: :meth:`rate`."""
        if key == "rate":
            rate = self.rate()
            return None if rate is None else rate[:2]
        found = self.readings(key, validation)
        return (found[-1].value, found[-1].shown) if found else None

    def readings(self, key: str, validation: bool = False) -> list[Reading]:
        """Every value the script printed with this label (``"loss"`` or ``"accuracy"``), in
        order, training's or (``validation``) an evaluation's; see :meth:`metric`."""
        found = []
        for line in self.output:
            evaluation_line = bool(_EVALUATION_LINE.search(line))
            counter = _BATCH_COUNTER.search(line) if validation else None
            if counter and int(counter.group(1)) + 1 < int(counter.group(2)):
                continue  # one batch of an evaluation, not its last
            for match in PATTERNS[key].finditer(line):
                scope = (match.group("scope") or "").lower()
                if scope and "train_runtime" in line:  # the HF Trainer's summary: the run's mean loss
                    continue
                evaluation = scope in _EVALUATION_SCOPES or (evaluation_line and not scope)
                if evaluation != validation:
                    continue
                value, shown, total = float(match.group(2)), match.group(2), None
                if key == "accuracy" and match.group(3):
                    shown += "%"
                    total = int(match.group(4)) if match.group(4) else None
                elif key == "accuracy" and match.group(5):  # a count of a total
                    total = int(match.group(5))
                    value = 100.0 * value / max(total, 1)
                    shown += f"/{total} ({value:.1f}%)"
                found.append(Reading(value, shown, total))
        return found


class Reading(NamedTuple):
    """One value a script printed: the number (an accuracy in percent), as printed, and the
    number of samples it is of where the script said (``80.00% (64/80)``, ``9912/10000``)."""

    value: float
    shown: str
    total: int | None = None


def _compact(shown: str) -> str:
    """A number printed with a dozen digits (``32.14056839624901``) to four significant ones."""
    match = re.match(rf"{_NUMBER}", shown)
    if match and len(re.sub(r"\D", "", match.group())) > 6:
        return f"{float(match.group()):.4g}" + shown[match.end() :]
    return shown


#: each kind's rank in RATE_KINDS, strongest (0) first
_STRENGTH = {kind: rank for rank, kind in enumerate(dict.fromkeys(kind for kind, _ in RATE_KINDS))}


def _rate_in(text: str) -> tuple[int, float, str, str] | None:
    """The speed ``text`` prints, by the first of :data:`RATE_KINDS` it has: (strength, value,
    as shown, kind)."""
    for kind, pattern in RATE_KINDS:
        if kind == "batches" and _EVALUATION_LINE.search(text):
            continue
        matches = list(pattern.finditer(text))
        if not matches:
            continue
        match = matches[-1]
        value, shown = float(match.group(1)), match.group(1)
        if kind == "batches":
            shown += f" {match.group(2)}"
            if match.group(2) == "s/it":
                value = 1.0 / value if value else 0.0
        elif kind == "per second":
            shown += "/s"
        return _STRENGTH[kind], value, shown, kind
    return None


def stock_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with nothing of nanopatch's in it: no ``NANOPATCH_*`` variables and no
    bootstrap on ``PYTHONPATH`` (a compare run started from a patched process, say)."""
    from ._bootstrap import BOOTSTRAP_DIR

    env = {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith("NANOPATCH_")}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != BOOTSTRAP_DIR]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    env["PYTHONHASHSEED"] = "0"
    return env


def execute(run: Run, env: dict[str, str], out=None) -> Run:
    """Run it, echoing its output (stdout and stderr, merged) as it comes, each line prefixed
    with its name. Output is echoed as soon as it is read, not a line at a time: a progress bar
    that redraws itself with ``\r`` and no newline shows as it moves (each redraw prefixed
    again), and the lines are kept for reading once the run ends."""
    out = sys.stdout if out is None else out
    start = time.perf_counter()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    echo = _Echo(f"[{run.name}] ", out)
    pending = ""
    with subprocess.Popen(run.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 65536)
            text = decoder.decode(chunk, final=not chunk)
            echo.write(text)
            pending += text
            *lines, pending = _LINE_END.split(pending)
            run.output.extend(lines)
            if not chunk:
                break
        run.exit_code = proc.wait()
    if pending:
        run.output.extend(pending.rstrip("\r").split("\r") if pending.strip("\r") else [])
    echo.close()
    run.seconds = time.perf_counter() - start
    return run


#: a line's end in a child's output, as Python's universal newlines read it: ``\n``, ``\r\n``, or
#: a lone ``\r`` (a progress bar's redraw); a ``\r`` last in what was read so far waits for what
#: follows it, which may be its ``\n``
_LINE_END = re.compile(r"\r\n|\n|\r(?!\Z)")
#: where the echo starts a new prefixed line: after a newline, or a redraw's carriage return
_ECHO_BREAK = re.compile(r"(\r\n|\n|\r)")


class _Echo:
    """Writes a child's output with a prefix at the start of each line (and after each ``\r``
    a progress bar redraws with), flushing at once."""

    def __init__(self, prefix: str, out) -> None:
        self.prefix, self.out, self.at_start = prefix, out, True

    def write(self, text: str) -> None:
        if not text:
            return
        parts = []
        for piece in _ECHO_BREAK.split(text):
            if not piece:
                continue
            if piece in ("\r\n", "\n", "\r"):
                parts.append("\n" if piece == "\r\n" else piece)
                self.at_start = True
            else:
                if self.at_start:
                    parts.append(self.prefix)
                    self.at_start = False
                parts.append(piece)
        self.out.write("".join(parts))
        self.out.flush()

    def close(self) -> None:
        """A last line without its newline gets one, so that what follows starts a line."""
        if not self.at_start:
            self.out.write("\n")
            self.out.flush()
            self.at_start = True


def _show(value: tuple[float, str] | None) -> str:
    return "-" if value is None else value[1]


def table(stock: Run, patched: Run) -> str:
    """The side-by-side summary (speed-ups only when both runs succeeded)."""
    failed = [r for r in (stock, patched) if r.exit_code]
    rows = [
        ("exit code", str(stock.exit_code), str(patched.exit_code), ""),
        ("wall time", f"{stock.seconds:.1f} s", f"{patched.seconds:.1f} s", _ratio(stock.seconds, patched.seconds)),
    ]
    rate_s, rate_p = stock.rate(), patched.rate()
    same_kind = rate_s is not None and rate_p is not None and rate_s[2] == rate_p[2]
    rows.append(
        (
            "images/s",
            "not found" if rate_s is None else rate_s[1],
            "not found" if rate_p is None else rate_p[1],
            _ratio(rate_p[0], rate_s[0]) if same_kind else "",
        )
    )
    if failed:
        rows = [(*row[:3], "") for row in rows]
    for key in ("loss", "accuracy"):
        rows.append((f"final {key}", _show(stock.metric(key)), _show(patched.metric(key)), ""))
    for key in ("loss", "accuracy"):  # when a run printed any
        found = stock.metric(key, validation=True), patched.metric(key, validation=True)
        if any(found):
            rows.append((f"validation {key}", _show(found[0]), _show(found[1]), ""))
    rows.append(("model accelerated", "-", accelerated(patched.report), ""))
    lines = _aligned(("", "stock", "nanopatch", "speedup"), rows)
    if failed:
        lines.append("")
        lines.extend(f"{r.name} run failed with exit code {r.exit_code}: no speed-up is given" for r in failed)
    return "\n".join(lines)


def _aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A text table: cells padded to their column's width, a rule under the header."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    for row in rows:
        lines.append(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return lines


def accelerated(report: dict | None) -> str:
    """ "yes (what)" or "no (why)" from the patched run's report."""
    if report is None or "models" not in report:
        return "no (the run reported nothing: it never imported torch, or nanopatch's training patch was off)"
    models = report.get("models", [])
    done = [m for m in models if m.get("model") and m.get("stock") is None and m.get("training_calls")]
    if done:
        parts = []
        for m in done:
            what = [f"computed in {m['computed_in']}"] if m.get("computed_in") else []
            if m.get("channels_last"):
                what.append("channels-last")
            if m.get("ipex"):
                what.append("IPEX")
            measured = m.get("bf16_measured")
            if measured:
                what.append("bf16 still being measured" if measured == "measuring" else f"bf16 {measured}")
            parts.append(f"{m['model']}: {', '.join(what) or 'fused step only'}")
        return "yes (" + "; ".join(parts) + ")"
    reasons = [f"{m['model'] or ', '.join(m.get('optimizers', []))}: {m['stock']}" for m in models if m.get("stock")]
    if reasons:
        return "no (" + "; ".join(reasons) + ")"
    return "no (no optimizer stepped: nothing to accelerate was found)"


def write_report() -> None:
    """At a run's end: its account as JSON to ``NANOPATCH_REPORT``, when that is set (by rank 0
    only in a ``--nproc`` run): the training patch's account of its models, where it is
    loaded, and the breakdown, where it is on."""
    path = os.environ.get(REPORT_VARIABLE)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    account: dict = {}
    training = sys.modules.get("nanopatch.targets.training.patch")
    if training is not None:
        account.update(models=training.describe(), summary=training.summary())
    account.update(_patched_account())
    timing = sys.modules.get("nanopatch.targets.breakdown.patch")
    times = timing.describe() if timing is not None else None
    if times is not None:
        account["breakdown"] = times
    with open(path, "w") as f:
        json.dump(account, f, default=str)


def _patched_account() -> dict:
    """What a patched run chose, for the closing summary: each option's value and why
    (``options``), whether torchvision's decoding and transforms were patched (``vision``; what
    really ran through them, in every process, is :mod:`nanopatch.foundation.usage`'s), and the
    CPU runtime variables the runner set (``runtime``). Empty in a run nothing patched
    (``--compare``'s stock run)."""
    from nanopatch import engine
    from nanopatch.runtime import tuning

    config = engine.active_config()
    if config is None:
        return {}
    state, detail = engine.target_state("vision")
    account: dict = {"options": config.as_dict(), "vision": {"state": state, "detail": detail}}
    account["runtime"] = {
        name: os.environ[name] for name in sorted(tuning.tuned_names(os.environ)) if name in os.environ
    }
    training = sys.modules.get("nanopatch.targets.training.patch")
    if training is not None and training.malloc_reuse():
        account["malloc_reuse"] = training.malloc_reuse()
    return account


def _times(run: Run) -> dict | None:
    return (run.report or {}).get("breakdown")


def breakdown_text(stock: Run, patched: Run, *more: Run) -> str:
    """Where each run's time went, side by side, and the patched run's advice ("" when no run
    was timed). ``more``: a ``--try-compile`` run, shown beside them and judged against the
    patched one."""
    from nanopatch.targets.breakdown.advice import compile_trial
    from nanopatch.targets.breakdown.patch import PARTS

    runs = [stock, patched, *more]
    times = [_times(run) for run in runs]
    if not any(times):
        return ""

    def part(report: dict | None, key: str) -> str:
        if not report:
            return "-"
        share = report[key] / report["wall_s"] if report["wall_s"] > 0 else 0.0
        return f"{report[key]:.1f} s ({share:.0%})"

    rows = [(label, *(part(t, key) for t in times), "") for key, label in PARTS]
    rates = [t.get("samples_per_s") if t else None for t in times]
    speedup = _ratio(rates[1], rates[0]) if rates[0] and rates[1] else ""
    rows.append(("samples/s while training", *("-" if r is None else f"{r:.1f}" for r in rates), speedup))
    rows.append(("optimizer steps", *("-" if not t else str(t["steps"]) for t in times), ""))
    lines = ["Where the time went (nanopatch.breakdown: wall time from torch's import to the end)", ""]
    lines.extend(_aligned(("", *(run.name for run in runs), "speedup"), rows))
    unseen = [run.name for run, t in zip(runs, times, strict=True) if t and not t["steps"]]
    if unseen:  # a script's own ipex.optimize replaces the optimizer's step on the instance: torch's hooks miss it
        lines += [
            "",
            f"No optimizer step was seen in {', '.join(unseen)}: all its time counts as start-up (an optimizer "
            "whose step the script replaced on the instance, as its own ipex.optimize call does, is not timed)",
        ]
    advice = list((times[1] or {}).get("advice") or [])
    if more:
        trial = compile_trial(times[1], times[2])
        advice.append(trial or {"text": "torch.compile: no rate to compare (a run failed or trained no steps)"})
    if advice:
        lines += ["", "Advice (measured on the nanopatch run):"]
        lines.extend(f"- {a['text']}" for a in advice)
    return "\n".join(lines)


def draw(path: str, *runs: Run) -> str:
    """The runs' breakdowns as a stacked bar chart in ``path``; what was done, as a line."""
    from nanopatch.targets.breakdown.patch import PARTS

    times = [(run.name, _times(run)) for run in runs]
    if not any(t for _, t in times):
        return f"--plot: no run was timed (--no-breakdown, or neither imported torch): {path} was not written"
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return f"--plot: matplotlib is not installed (pip install matplotlib): {path} was not written"
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.8 * len(times)))
    names = [name for name, _ in times]
    left = [0.0] * len(times)
    for key, label in PARTS:
        widths = [t[key] if t else 0.0 for _, t in times]
        ax.barh(names, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, (_, t) in enumerate(times):
        if t and t.get("samples_per_s"):
            ax.text(left[i], i, f"  {t['samples_per_s']:.1f} samples/s", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("seconds of wall time")
    ax.set_xlim(0, max(left) * 1.3 or 1)
    ax.set_title("Where the time went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize="small", frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return f"--plot: the breakdown is drawn in {path}"


def _ratio(numerator: float, denominator: float) -> str:
    if not numerator or not denominator or numerator <= 0 or denominator <= 0:
        return ""
    return f"{numerator / denominator:.2f}x"


def stock_prefix(cuda_to_cpu: bool, breakdown: bool = False) -> list[str]:
    """What the stock run starts with: plain ``python``; with ``--cuda-to-cpu``, the CUDA
    redirect (:mod:`nanopatch._stock`: a GPU script cannot run here without it); with
    ``breakdown``, the breakdown's timing."""
    flags = [flag for flag, on in (("--cuda-to-cpu", cuda_to_cpu), ("--breakdown", breakdown)) if on]
    return ["-m", "nanopatch._stock", *flags] if flags else []


def compare(
    runner_options: Sequence[str],
    target: Sequence[str],
    out=None,
    cuda_to_cpu: bool = False,
    plot: str | None = None,
    try_compile: bool = False,
) -> int:
    """Run ``target`` (``script.py args`` or ``-m module args``) stock, then with the runner and
    ``runner_options``; print the table, the breakdown and the advice; return the first failing
    run's exit code, else 0. ``cuda_to_cpu``: the stock run has the CUDA redirect too.
    ``plot``: draw the breakdown into this image file. ``try_compile``: a third run, patched
    with ``--compile``, whose training rate is judged against the patched run's."""
    out = sys.stdout if out is None else out
    timed = "--no-breakdown" not in runner_options
    if timed and "--breakdown" not in runner_options:
        runner_options = ["--breakdown", *runner_options]
    stock = Run("stock", [sys.executable, *stock_prefix(cuda_to_cpu, timed), *target])
    patched = Run("nanopatch", [sys.executable, "-m", "nanopatch", *runner_options, *target])
    compiled = Run("compiled", [sys.executable, "-m", "nanopatch", "--compile", *runner_options, *target])
    env = stock_environ()
    with tempfile.TemporaryDirectory(prefix="nanopatch-compare-") as folder:
        with_package = os.pathsep.join(p for p in (package_path(folder), env.get("PYTHONPATH")) if p)
        if cuda_to_cpu or timed:  # so that -m nanopatch._stock finds this nanopatch
            env["PYTHONPATH"] = with_package
        runs = []
        patched_env = dict(env, PYTHONPATH=with_package)
        planned = [(stock, env), (patched, patched_env)] + ([(compiled, dict(patched_env))] if try_compile else [])
        for run, run_env in planned:
            report = run_env[REPORT_VARIABLE] = os.path.join(folder, f"{run.name}.json")
            if run is not stock:
                run_env[usage.VARIABLE] = os.path.join(folder, f"{run.name}-used")
                os.mkdir(run_env[usage.VARIABLE])
            out.write(f"== {run.name}: {' '.join(run.command[1:])}\n")
            out.flush()
            execute(run, run_env, out)
            runs.append((run, report))
        for run, report in runs:
            with contextlib.suppress(OSError, ValueError):
                with open(report) as f:
                    run.report = json.load(f)
            run.used = usage.used(os.path.join(folder, f"{run.name}-used"))
    out.write("\n" + table(stock, patched) + "\n")
    more = [compiled] if try_compile else []
    times = breakdown_text(stock, patched, *more)
    if times:
        out.write("\n" + times + "\n")
    if plot:
        out.write(draw(plot, stock, patched, *more) + "\n")
    from ._summary import summary

    out.write(summary(stock, patched, target) + "\n")
    out.flush()
    code = next((r.exit_code for r in (stock, patched, *more) if r.exit_code), 0)
    return code if code > 0 else (1 if code else 0)  # a run killed by a signal: 1


def package_path(folder: str) -> str:
    """A ``PYTHONPATH`` entry through which ``-m nanopatch`` finds this nanopatch in the runs
    (when it runs from a checkout, say), and nothing else: a folder made in ``folder`` holding
    only a link to the package. The package's own parent folder would do it too, but for an
    installed copy that is a whole site-packages, which would come before the user's own
    ``PYTHONPATH`` in both runs and every process they start (another Python's included). Where
    links cannot be made, the parent folder after all."""
    import nanopatch

    package = os.path.dirname(os.path.abspath(nanopatch.__file__))
    entry = os.path.join(folder, "nanopatch-path")
    try:
        os.makedirs(entry, exist_ok=True)
        link = os.path.join(entry, "nanopatch")
        if not os.path.islink(link):
            os.symlink(package, link, target_is_directory=True)
    except OSError:
        return os.path.dirname(package)
    return entry
