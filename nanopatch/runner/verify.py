"""``python -m nanopatch --verify [N] script.py [args]``: does the script learn patched as it
does stock?

The script runs twice for N optimizer steps (default 20), from the same seed: stock (nothing
of nanopatch's applied, as ``--compare``'s stock run: no ``NANOPATCH_*`` variables, no bootstrap
on ``PYTHONPATH``) and patched (``python -m nanopatch [your runner options] script.py args``).
In both, :mod:`nanopatch.runner._verify_child` seeds torch, numpy and ``random``, gives each
DataLoader iterator a random stream of its own (the same order and worker seeds in both runs,
whatever the training draws from the global RNG), records every optimizer step with
:class:`nanopatch.learning.Recorder` and stops the run at the end of step N. It works around
any training loop: a plain one, Lightning's ``optimizer.step(closure)``, the Hugging Face
``Trainer``.

Then, per step: the loss of each run, the parameters that got a gradient in one run and not
the other (by name), and the largest relative drift of a parameter between the runs,
``||p_patched - p_stock|| / ||p_stock||`` after the step (estimated from a fixed sample of the
elements of each larger parameter, the same in both runs). The verdict is
:func:`nanopatch.learning.compare`'s, the definition the test suite and the bench use.

Exit status: :data:`LEARNS` (0), :data:`DOES_NOT_LEARN` (1), :data:`RUN_FAILED` (3: a run
ended with an error or a signal before its N steps, or the stock run took no optimizer step,
so there is nothing to verify); 2 is a usage error, as everywhere in the runner.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from .output import Run
from .report import accelerated
from .runs import REPORT_VARIABLE, execute, package_path, stock_environ, stock_prefix

DEFAULT_STEPS = 20
SEED = 0
#: a parameter's drift is taken relative to at least this fraction of the model's RMS parameter
DRIFT_FLOOR = 0.1

LEARNS = 0
DOES_NOT_LEARN = 1
RUN_FAILED = 3

CHILD = "nanopatch.runner._verify_child"
#: what a run writes in its folder: a line per step here, and a parameter sample per step
STEPS_FILE = "steps.jsonl"
#: parameters with more elements than this are sampled: this many elements, the same in both runs
SAMPLE_SIZE = 1024


def params_file(folder: str, step: int) -> str:
    return os.path.join(folder, f"params-{step:04d}.pt")


def runner_options(words: Sequence[str]) -> list[str]:
    """The runner options without ``--verify``, ``--verify=N`` or ``--verify N``: what the
    patched run gets."""
    kept: list[str] = []
    skip_number = False
    for word in words:
        if skip_number and word.isdigit():
            skip_number = False
            continue
        skip_number = word == "--verify"
        if word == "--verify" or word.startswith("--verify="):
            continue
        kept.append(word)
    return kept


def _environments(folder: str) -> tuple[dict[str, str], dict[str, str]]:
    """(stock, patched) environments, with files in ``folder``. Both can import this nanopatch
    (the recorder; :func:`nanopatch.runner.runs.package_path`); only the patched one keeps
    the ``NANOPATCH_*`` settings of the environment, as the runner would."""
    report = os.path.join(folder, "report.json")
    stock = stock_environ()
    stock["PYTHONPATH"] = os.pathsep.join(p for p in (package_path(folder), stock.get("PYTHONPATH")) if p)
    patched = dict(stock)
    patched.update({k: v for k, v in os.environ.items() if k.startswith("NANOPATCH_")})
    patched[REPORT_VARIABLE] = report
    return stock, patched


def verify(
    runner_words: Sequence[str], target: Sequence[str], steps: int = DEFAULT_STEPS, out=None, cuda_to_cpu: bool = False
) -> int:
    """Run ``target`` (``script.py args`` or ``-m module args``) stock and patched for ``steps``
    optimizer steps, print the comparison, and return the exit status (see the module's text).
    ``cuda_to_cpu``: the stock run is the CUDA redirect alone, as ``--compare``'s."""
    out = sys.stdout if out is None else out
    options = runner_options(runner_words)
    with tempfile.TemporaryDirectory(prefix="nanopatch-verify-") as folder:
        stock_env, patched_env = _environments(folder)
        runs = []
        for name, prefix, env in (
            ("stock", stock_prefix(cuda_to_cpu), stock_env),
            ("nanopatch", ["-m", "nanopatch", *options], patched_env),
        ):
            record = os.path.join(folder, name)
            run = Run(name, [sys.executable, *prefix, "-m", CHILD, record, str(steps), str(SEED), *target])
            shown = " ".join(["python", *prefix, *target])  # the stock run of a GPU script names its redirect
            out.write(f"== {name}: {shown} (for at most {steps} optimizer steps)\n")
            out.flush()
            execute(run, env, out)
            runs.append((run, record))
        (stock, stock_dir), (patched, patched_dir) = runs
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(folder, "report.json")) as f:
                patched.report = json.load(f)
        return _conclude(stock, patched, read_run(stock_dir), read_run(patched_dir), steps, out)


def read_run(folder: str) -> list[tuple[Any, dict[str, Any] | None]]:
    """A run's records as written so far: (Step, parameter sample or None) per step."""
    import torch

    from nanopatch.foundation.learning import Step

    records = []
    with contextlib.suppress(FileNotFoundError), open(os.path.join(folder, STEPS_FILE), encoding="utf-8") as f:
        for line in f:
            try:
                step = Step.from_dict(json.loads(line))
            except (ValueError, KeyError):  # the line a crash cut short
                break
            path = params_file(folder, len(records) + 1)
            sample = torch.load(path, weights_only=True) if os.path.exists(path) else None
            records.append((step, sample))
    return records


def drift(stock: dict[str, Any] | None, patched: dict[str, Any] | None) -> tuple[float, str] | None:
    """The largest ``||p_patched - p_stock|| / ||p_stock||`` over the parameters both samples
    hold with the same shape, and that parameter's name.

    A parameter near zero (a bias that gets no gradient, as attention's key bias) is measured
    against :data:`DRIFT_FLOOR` times the model's root-mean-square parameter instead: relative
    to its own norm, rounding noise on nothing would show as an unbounded drift."""
    if stock is None or patched is None:
        return None
    pairs = [
        (name, values, patched["values"][name])
        for name, values in stock["values"].items()
        if name in patched["values"] and patched["shapes"].get(name) == stock["shapes"][name]
    ]
    elements = sum(values.numel() for _, values, _ in pairs)
    if not elements:
        return None
    rms = math.sqrt(sum(float(values.norm()) ** 2 for _, values, _ in pairs) / elements)
    largest: tuple[float, str] | None = None
    for name, values, other in pairs:
        scale = max(float(values.norm()), DRIFT_FLOOR * rms * math.sqrt(values.numel()))
        difference = float((other - values).norm())
        relative = difference / scale if scale > 0 else (0.0 if difference == 0 else math.inf)
        if largest is None or relative > largest[0]:
            largest = (relative, name)
    return largest


def _failure(run: Run, recorded: int, steps: int) -> str | None:
    if run.exit_code == 0:
        return None
    how = f"was killed by signal {-run.exit_code}" if run.exit_code and run.exit_code < 0 else "failed"
    return f"the {run.name} run {how} (exit code {run.exit_code}) after {recorded} of {steps} optimizer steps"


def _drift_note(sampled: bool) -> str:
    note = (
        "drift: ||p_patched - p_stock|| / ||p_stock|| after the step, the largest over the parameters (for one near "
        f"zero, relative to {DRIFT_FLOOR:.0%} of the model's RMS parameter)"
    )
    if sampled:
        note += f"; estimated from {SAMPLE_SIZE} elements of each larger parameter, the same in both runs"
    return note


def _conclude(stock_run: Run, patched_run: Run, stock: list, patched: list, steps: int, out) -> int:
    """Print the table, the notes and the verdict; return the exit status."""
    from nanopatch.foundation.learning import compare

    verdict = compare([step for step, _ in stock], [step for step, _ in patched])
    shown = len(verdict.rows)
    lines = [""]
    if shown:
        lines.append(table(verdict.rows, [s for _, s in stock[:shown]], [s for _, s in patched[:shown]]))
        lines.append(_drift_note(sampled=any(sample and sample["sampled"] for _, sample in stock)))
    lines.append(f"accelerated: {accelerated(patched_run.report)}")
    failures = [_failure(run, len(records), steps) for run, records in ((stock_run, stock), (patched_run, patched))]
    failures = [failure for failure in failures if failure]
    if 0 < len(stock) < steps and not failures:
        lines.append(f"the script ended after {len(stock)} optimizer steps (of {steps} asked for)")
    lines.extend(failures)
    if stock:
        lines.append(f"verdict: {verdict.summary()}")
    else:
        lines.append("verdict: nothing to verify: the stock run took no optimizer step")
    out.write("\n".join(lines) + "\n")
    out.flush()
    if failures or not stock:
        return RUN_FAILED
    return LEARNS if verdict.learns else DOES_NOT_LEARN


_HEADER = ("step", "optimizer", "stock loss", "patched loss", "difference", "largest drift (parameter)")
_RIGHT_ALIGNED = {0, 2, 3, 4}
_ONE_RUN_ONLY = (("grad_only_stock", "gradient in stock only"), ("grad_only_patched", "gradient patched only"))


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _cells(row: dict[str, Any], largest: tuple[float, str] | None) -> tuple[str, ...]:
    difference = row["loss_difference"]
    return (
        str(row["step"]),
        row["optimizer"],
        _loss(row["stock_loss"]),
        _loss(row["patched_loss"]),
        "-" if difference is None else f"{difference:.2%}",
        "-" if largest is None else f"{largest[0]:.2e} ({largest[1]})",
    )


def _notes(row: dict[str, Any], last: dict[str, tuple[list[str], int]]) -> list[str]:
    """The parameters with a gradient in one run only at this step, by name (or, when they are
    those of the step before, which step named them), and any inf or nan patched only."""
    notes = []
    for key, label in _ONE_RUN_ONLY:
        names = row[key]
        if not names:
            last.pop(key, None)
        elif key in last and last[key][0] == names:
            notes.append(f"{label}: the same {len(names)} as at step {last[key][1]}")
        else:
            last[key] = (names, row["step"])
            notes.append(f"{label} ({len(names)}): {', '.join(names)}")
    if row["nonfinite_patched"]:
        notes.append(f"inf or nan in the patched gradient of: {', '.join(row['nonfinite_patched'])}")
    return notes


def table(rows: list[dict[str, Any]], stock_samples: list, patched_samples: list) -> str:
    """One line per step of :class:`nanopatch.learning.Verdict`'s ``rows`` (the losses, their
    relative difference, the largest drift between the parameter samples), with the step's
    notes under it."""
    cells: list[tuple[str, ...]] = [_HEADER]
    notes: list[list[str]] = [[]]
    last: dict[str, tuple[list[str], int]] = {}
    for row, stock, patched in zip(rows, stock_samples, patched_samples, strict=True):
        cells.append(_cells(row, drift(stock, patched)))
        notes.append(_notes(row, last))
    widths = [max(len(row[i]) for row in cells) for i in range(len(_HEADER))]
    lines = []
    for row_cells, row_notes in zip(cells, notes, strict=True):
        padded = [
            cell.rjust(w) if i in _RIGHT_ALIGNED else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row_cells, widths, strict=True))
        ]
        lines.append("  ".join(padded).rstrip())
        lines.extend(" " * (widths[0] + 2) + note for note in row_notes)
    return "\n".join(lines)
