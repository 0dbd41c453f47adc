"""The closing lines of ``--compare``: the result at a glance, for someone who has never read
the tables above them. How much faster nanopatch trained, whether both runs reached the same
accuracy (judged against the noise the runs themselves show), what was accelerated on this CPU
and what was not and why, and the commands to look further (``--verify``, ``--plot``). The runs
are :class:`nanopatch.runner.compare.Run` objects (their output, exit code, the patched run's
account and usage marks), the figures their :class:`~nanopatch.runner.compare.Reading` lists."""

from __future__ import annotations

import math
import os
import shlex
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from .report import duration

#: a speed-up this close to 1 reads "about as fast": run-to-run noise on a shared machine
SAME_SPEED = 0.03
#: the lines' width: a terminal's, with room
WIDTH = 100


def summary(stock: Any, patched: Any, target: Sequence[str], facts: Any = None) -> str:
    """The closing block; ``target`` is the script and its arguments as given to ``--compare``,
    ``facts`` this machine's :class:`nanopatch.foundation.cpu.CpuFacts` (read when None)."""
    if facts is None:
        from nanopatch.foundation import cpu

        facts = cpu.host_facts()
    report = patched.report or {}
    script = " ".join(shlex.quote(_shown_path(word)) for word in target)
    command = runner_command()
    lines = ["", f"In short: {_shown_path(target[0]) if target else 'the script'} on this CPU ({machine(facts)})"]
    lines += _wrapped("  speed     ", speed(stock, patched))
    lines += _wrapped("  accuracy  ", accuracy(stock, patched))
    lines.append("  accelerated:")
    for part in accelerated_parts(report, patched.used) or ["nothing (see the lines above)"]:
        lines += _wrapped("    - ", part)
    lines.append("  not accelerated:")
    tcmalloc = None
    if report.get("runtime"):
        from nanopatch.runtime import tuning

        tcmalloc = tuning.find_allocator("tcmalloc") is not None
    not_done = not_accelerated_parts(report, facts, patched.used, tcmalloc)
    for part in not_done or ["nothing left stock that nanopatch could speed up"]:
        lines += _wrapped("    - ", part)
    lines.append("  next:")
    lines.append(f"    {command} --verify {script}")
    lines.append("        does it learn as stock? both runs step by step: losses, gradients, a verdict")
    lines.append(f"    {command} --compare --plot breakdown.png {script}")
    lines.append("        the same comparison, with where the time went drawn as a chart")
    return "\n".join(lines)


def _wrapped(lead: str, text: str) -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=lead,
        subsequent_indent=" " * len(lead),
        break_on_hyphens=False,
        break_long_words=False,
    ) or [lead.rstrip()]


def machine(facts: Any) -> str:
    """The CPU in a few words: its name, its cores, and what it has for bf16."""
    name = " ".join(facts.model_name.split()) or "unknown CPU"
    cores = f"{facts.usable_cores} core{'s' if facts.usable_cores != 1 else ''}"
    if facts.amx:
        isa = "AMX and native bf16"
    elif facts.native_bf16:
        isa = "native bf16 (avx512_bf16), no AMX"
    elif facts.avx512:
        isa = "AVX-512 without native bf16"
    elif facts.avx2:
        isa = "AVX2, no native bf16"
    else:
        isa = "no native bf16"
    return f"{name}, {cores}, {isa}"


def speed(stock: Any, patched: Any) -> str:
    failed = [run for run in (stock, patched) if run.exit_code]
    if failed:
        return "; ".join(f"the {run.name} run failed (exit code {run.exit_code})" for run in failed) + (
            ": no speed-up is given"
        )
    rate_s, rate_p = stock.rate(), patched.rate()
    if rate_s is not None and rate_p is not None and rate_s[2] == rate_p[2] and rate_s[0] > 0 and rate_p[0] > 0:
        unit = patched.rate_unit()
        figures = f"{_number(rate_p[0])} {unit} against stock's {_number(rate_s[0])} (the script's own meter)"
        return f"{_verdict(rate_p[0] / rate_s[0])}: {figures}"
    times = [(run.report or {}).get("breakdown") or {} for run in (stock, patched)]
    rates = [t.get("samples_per_s") for t in times]
    if all(rates):
        figures = f"{rates[1]:.1f} samples/s against stock's {rates[0]:.1f} while training (nanopatch's clock)"
        return f"{_verdict(rates[1] / rates[0])}: {figures}"
    # a loop that feeds its model without a DataLoader: no samples counted, but its optimizer
    # steps were timed (the same number in both runs: the same loop)
    steps = [t.get("step_s") for t in times]
    if all(steps) and times[0].get("steps") == times[1].get("steps"):
        figures = (
            f"{duration(steps[1])} a training step against stock's {duration(steps[0])} over "
            f"{times[1]['steps'] - 1} steps (nanopatch's clock; no DataLoader gave its batches, so no "
            "samples were counted)"
        )
        return f"{_verdict(steps[0] / steps[1])}: {figures}"
    if stock.seconds > 0 and patched.seconds > 0:
        return (
            f"{_verdict(stock.seconds / patched.seconds)} by wall time: {patched.seconds:.1f} s against stock's "
            f"{stock.seconds:.1f} s (the script printed no speed, and no training step was timed)"
        )
    return "not measured"


def _verdict(ratio: float) -> str:
    if abs(ratio - 1) <= SAME_SPEED:
        return f"about as fast as stock ({ratio:.2f}x)"
    if ratio > 1:
        return f"{ratio:.2f}x as fast as stock"
    return f"slower than stock ({ratio:.2f}x)"


def _number(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def accuracy(stock: Any, patched: Any) -> str:
    """Whether both runs reached the same accuracy (or, without one, loss), judged against the
    noise the figures carry: the sampling noise of an accuracy over the number of samples the
    script printed it of, else how far the runs' own successive figures move."""
    if stock.exit_code or patched.exit_code:
        return "not compared: a run failed"
    for key, validation, label in (
        ("accuracy", True, "validation accuracy"),
        ("accuracy", False, "training accuracy"),
        ("loss", True, "validation loss"),
        ("loss", False, "training loss"),
    ):
        found_s, found_p = stock.readings(key, validation), patched.readings(key, validation)
        if found_s and found_p:
            return judge(label, found_s, found_p, percent=key == "accuracy")
    return "not compared: neither an accuracy nor a loss was found in both runs' output"


def judge(label: str, stock: list[Any], patched: list[Any], percent: bool) -> str:
    last_s, last_p = stock[-1], patched[-1]
    gap = abs(last_p.value - last_s.value)
    figures = f"{label} {last_p.shown} against stock's {last_s.shown}"
    unit = " points" if percent else ""
    tolerance, why = _tolerance(stock, patched, percent)
    if tolerance is None:
        return (
            f"{figures} ({_gap(gap, percent)} apart; printed once, so its noise is unknown: "
            "--verify compares learning step by step)"
        )
    noise = f"the {_plain(tolerance)}{unit} {why}"
    if gap <= tolerance:
        return f"the same: {figures} ({_gap(gap, percent)} apart, within {noise})"
    return f"different: {figures} ({_gap(gap, percent)} apart, more than {noise}; check learning with --verify)"


def _gap(gap: float, percent: bool) -> str:
    return f"{_plain(gap)} point{'s' if gap != 1 else ''}" if percent else _plain(gap)


def _plain(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def _tolerance(stock: list[Any], patched: list[Any], percent: bool) -> tuple[float | None, str]:
    """How far apart two runs' last figures can be from noise alone, and what says so."""
    totals = {r.total for r in (stock[-1], patched[-1])}
    if percent and len(totals) == 1 and None not in totals:
        (n,) = totals
        p_s, p_p = stock[-1].value / 100, patched[-1].value / 100
        # two proportions over n samples each: twice the standard error of their difference
        spread = 2 * 100 * math.sqrt((p_s * (1 - p_s) + p_p * (1 - p_p)) / n)
        return max(spread, 100 / n), f"that {n} samples leave"
    # else the last two moves of each run's own figures (an epoch's to the next): a gap between
    # the runs no larger than that is a gap the runs show by themselves
    swings = [
        abs(run[i].value - run[i - 1].value) for run in (stock, patched) for i in range(max(1, len(run) - 2), len(run))
    ]
    if not swings:
        return None, ""
    return max(swings), "the runs' own figures move from one print to the next"


#: what each mark of :mod:`nanopatch.foundation.usage` says was accelerated
IMAGE_PARTS = {
    "decode-turbojpeg": "JPEG decoding by libjpeg-turbo through PyTurboJPEG",
    "decode-opencv": "JPEG decoding by OpenCV's libjpeg-turbo",
    "decode-region": "only the crop's box of each JPEG decoded",
    "transforms": "torchvision's transforms on OpenCV and numpy",
    "resize-kernel": "bilinear resizes on nanopatch's compiled copies of Pillow's loops",
    "jitter-kernel": "ColorJitter's saturation and hue in one compiled pass each",
}


def accelerated_parts(report: dict, used: set[str] = frozenset()) -> list[str]:
    """What the patched run accelerated: each model, the images (``used``: the parts its
    processes marked, :mod:`nanopatch.foundation.usage`), the CPU runtime."""
    parts = []
    for model in report.get("models", []):
        if not model.get("model") or model.get("stock") is not None or not model.get("training_calls"):
            continue
        what = []
        if model.get("computed_in"):
            what.append(f"computed in {_dtype(model['computed_in'])}")
        if model.get("channels_last"):
            what.append("channels-last")
        if model.get("ipex"):
            what.append("IPEX")
        if model.get("compile"):
            what.append(f"torch.compile ({model['compile']})")
        if model.get("fast_dropout"):
            what.append("fast dropout masks")
        if model.get("attention_products"):
            what.append("attention as bf16 products")
        if (model.get("frozen_weights") or "").split(" ", 1)[0].isdigit():
            what.append(model["frozen_weights"].split(" (", 1)[0])  # "N frozen weights cast to bf16 once"
        if model.get("gelu_kernel"):
            what.append("GELU on torch's kernel")
        if model.get("loss_on_bf16_logits"):
            what.append("causal-LM loss on the bf16 logits")
        what.extend(note.replace(": ", "'s ", 1) for note in model.get("notes", []) if note.endswith(" step"))
        if model.get("data_parallel"):
            what.append("data-parallel")
        parts.append(f"{model['model']}: {', '.join(what) or 'nothing applied'}")
    images = [text for part, text in IMAGE_PARTS.items() if part in used]
    if images:
        parts.append(f"images: {', '.join(images)}")
    runtime = report.get("runtime") or {}
    if runtime:
        what = []
        if "OMP_NUM_THREADS" in runtime:
            pinned = " pinned one per core" if "GOMP_CPU_AFFINITY" in runtime or "KMP_AFFINITY" in runtime else ""
            what.append(f"{runtime['OMP_NUM_THREADS']} OpenMP threads{pinned}")
        preload = runtime.get("LD_PRELOAD", "")
        if "tcmalloc" in preload:
            what.append("tcmalloc")
        elif "jemalloc" in preload:
            what.append("jemalloc")
        elif report.get("malloc_reuse"):
            what.append("glibc's malloc keeping freed memory for reuse")
        parts.append(f"the CPU runtime: {', '.join(what) or 'tuned'}")
    elif report.get("malloc_reuse"):
        parts.append("memory: glibc's malloc keeping freed memory for reuse")
    return parts


def _dtype(name: str) -> str:
    return {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(str(name).replace("torch.", ""), str(name))


def not_accelerated_parts(
    report: dict, facts: Any, used: set[str] = frozenset(), tcmalloc: bool | None = None
) -> list[str]:
    """What the patched run left stock, and why. ``tcmalloc``: whether this machine has the
    library the runner preloads (None: not asked)."""
    options = report.get("options") or {}
    models = [model for model in report.get("models", []) if model.get("model")]
    parts = [part for model in models for part in _stock_model_parts(model)]
    for entry in report.get("models", []):
        if not entry.get("model"):
            parts.append(f"{', '.join(entry.get('optimizers', [])) or 'an optimizer'}: no model ({entry.get('stock')})")
    parts.extend(_options_left_off(options, facts, models))
    runtime = report.get("runtime") or {}
    if runtime and "LD_PRELOAD" not in runtime and tcmalloc is False:
        parts.append(
            "tcmalloc: not installed, so the runner preloaded no allocator (apt-get install libtcmalloc-minimal4)"
        )
    vision = report.get("vision") or {}
    if vision.get("state") in ("disabled", "failed", "unsupported"):
        parts.append(f"torchvision: {vision.get('detail') or vision['state']}")
    elif vision.get("state") == "patched" and not used & set(IMAGE_PARTS):
        parts.append("images: torchvision is patched, but no image went through its loading or transforms")
    if not report:
        parts.append("the patched run wrote no account of what it did (it never imported torch, or it failed early)")
    return parts


def _stock_model_parts(model: dict) -> list[str]:
    """What one model of the account (one with a name) left stock: the whole model, bf16
    autocast or channels-last where measuring turned it off, torch.compile where compile=auto
    did not keep it."""
    name = model["model"]
    parts = []
    if model.get("stock") is not None:
        parts.append(f"{name} ran stock ({model['stock']})")
    for key, what, stock in (
        ("bf16_measured", "bf16 autocast", "fp32"),
        ("channels_last_measured", "channels-last", "stock's layout"),
    ):
        measured = model.get(key) or ""
        if measured.startswith("off"):
            why = measured.split(": ", 1)[1] if ": " in measured else measured
            kept = "them" if why.startswith("the script chose its weights' dtypes") else stock
            parts.append(f"{what} for {name}: {why.replace(' for this model', '')}, so it kept {kept}")
    # a custom autograd Function whose backward ops run in fp32 (rescue's backward)
    parts.extend(f"{name}: {note}" for note in model.get("notes", []) if note.startswith("custom autograd Function"))
    frozen = model.get("frozen_weights") or ""
    if frozen.startswith("cast in every forward"):
        parts.append(f"the frozen weights of {name}: {frozen}")
    compile_part = _compile_choice_part(name, model.get("compile_choice") or "")
    if compile_part is not None:
        parts.append(compile_part)
    return parts


def _compile_choice_part(name: str, choice: str) -> str | None:
    """Why compile=auto's choice for the model ``name`` left it eager (``choice``: ``eager:
    <why>``, ``waiting`` or ``measuring``), or None where it did not."""
    if choice.startswith("eager: "):
        return f"torch.compile (compile=auto) for {name}: {choice[len('eager: ') :]}, so it ran eagerly"
    if choice == "waiting":
        return (
            f"torch.compile (compile=auto) for {name}: not tried; the run ended before it had spent "
            "as long in eager steps as compiling was expected to take"
        )
    if choice == "measuring":
        return (
            f"torch.compile (compile=auto) for {name}: undecided; the run ended while compiled and "
            "eager steps were still being compared"
        )
    return None


def _options_left_off(options: dict, facts: Any, models: list[dict]) -> list[str]:
    """The options the run had off, and why: bf16 autocast (on this CPU, or as asked), IPEX, and
    torch.compile where no model (of ``models``, those with a name) tried it."""
    parts = []
    bf16 = options.get("bf16") or {}
    if bf16 and not bf16.get("value"):
        if bf16.get("source") == "auto":
            why = bf16.get("reason", "")
            if not facts.native_bf16:
                why = "this CPU has no native bf16 (avx512_bf16 or amx_bf16), where bf16 runs slower than fp32"
            parts.append(f"bf16 autocast: {why}, so training kept fp32")
        else:
            parts.append(f"bf16 autocast: off ({bf16.get('reason', 'as asked')})")
    ipex = options.get("ipex") or {}
    if ipex and not ipex.get("value"):
        parts.append(f"IPEX: {ipex.get('reason', 'off')}")
    compile_ = options.get("compile") or {}
    if compile_ and not compile_.get("value") and not _any_compile_tried(models):
        parts.append("torch.compile: off by default (--compare --try-compile measures whether it pays here)")
    return parts


def _any_compile_tried(models: list[dict]) -> bool:
    """Whether any of ``models`` was compiled, or compile=auto made a choice for it."""
    return any(model.get("compile") or model.get("compile_choice") for model in models)


def runner_command() -> str:
    """How to start this nanopatch from the shell the user is in: ``python -m nanopatch``,
    or this interpreter's path where it runs in an environment the shell does not have (a tox
    env, as ``tox -e demo`` runs)."""
    if os.environ.get("TOX_ENV_DIR") or os.environ.get("TOX_ENV_NAME"):
        return f"{shlex.quote(_shown_path(sys.executable))} -m nanopatch"
    return "python -m nanopatch"


def _shown_path(path: str) -> str:
    """A path below the working directory, relative to it; any other as given."""
    if not os.path.isabs(path):
        return path
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path
