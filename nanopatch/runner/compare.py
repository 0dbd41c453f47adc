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

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence

from nanopatch.foundation import usage

from .output import Run
from .report import breakdown_text, draw, table
from .runs import REPORT_VARIABLE, execute, package_path, stock_environ, stock_prefix


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
