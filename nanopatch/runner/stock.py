"""The stock run of ``--compare`` and ``--verify``: the script as it stands, with at most what
measuring it or running it on a CPU at all needs.

    python -m nanopatch._stock [--cuda-to-cpu] [--breakdown] (script.py | -m module) [args ...]

Nothing that accelerates is applied: no training or vision target, no data-parallel target,
and no runtime tuning (this is not the runner), so a comparison measures what nanopatch adds.
``--breakdown`` times the run (:mod:`nanopatch.targets.breakdown`: a clock read in a DataLoader's
``__next__`` and around the optimizer's step) and writes it to ``NANOPATCH_REPORT`` at the
end, as the patched run does. ``--cuda-to-cpu``: a script written for a CUDA GPU cannot run
here at all without the redirect, so its stock run is the redirect alone, what the user would
get by editing "cuda" to "cpu" by hand (``torch.autocast("cuda")`` becoming the CPU's bf16
autocast where the CPU has native bf16, as ``torch.autocast("cpu")`` is by default).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: what the stock run may switch on, by its flag (``nanopatch.runner.runs.stock_prefix`` writes them)
FLAGS = {"--cuda-to-cpu": "cuda_to_cpu", "--breakdown": "breakdown"}
#: the options of the stock run beside those: nothing that accelerates
STOCK_OPTIONS = {"vision": False, "training": False, "data_parallel": False}


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    options = dict(STOCK_OPTIONS, cuda_to_cpu=False, breakdown=False)
    while argv and argv[0] in FLAGS:
        options[FLAGS[argv.pop(0)]] = True
    if not argv or argv == ["-m"]:
        print("nanopatch._stock: no script or -m module to run", file=sys.stderr)
        return 2
    from nanopatch import patch_torch

    from ._scripts import NoModule, run_module, run_script
    from .runs import write_report

    patch_torch(**options)
    try:
        if argv[0] == "-m":
            run_module(argv[1], argv[2:])
        else:
            run_script(argv[0], argv[1:])
    except NoModule as exc:
        print(f"python -m nanopatch: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if options["breakdown"]:
            write_report()
    return 0
