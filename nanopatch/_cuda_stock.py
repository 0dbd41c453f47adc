"""The stock run of a GPU script for ``--compare`` and ``--verify`` with ``--cuda-to-cpu``.

    python -m nanopatch._cuda_stock (script.py | -m module) [args ...]

A script written for a CUDA GPU cannot run here at all without the redirect, so its "stock"
run is the redirect alone: what the user would get by editing "cuda" to "cpu" by hand
(``torch.autocast("cuda")`` becoming the CPU's bf16 autocast where the CPU has native bf16,
as ``torch.autocast("cpu")`` is by default). Nothing that accelerates is applied: no training
or vision target, no data-parallel target, and no runtime tuning (this is not the runner), so
the comparison measures what nanopatch adds on top.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: the options of the stock run: the redirect, and nothing that accelerates
STOCK_OPTIONS = {"cuda_to_cpu": True, "vision": False, "training": False, "data_parallel": False}


def command(python: str, target: Sequence[str]) -> list[str]:
    """The stock run's command line for ``target`` (``script.py args`` or ``-m module args``)."""
    return [python, "-m", __name__, *target]


def main(argv: Sequence[str]) -> int:
    if not argv or list(argv) == ["-m"]:
        print("nanopatch._cuda_stock: no script or -m module to run", file=sys.stderr)
        return 2
    from . import patch_torch
    from ._scripts import NoModule, run_module, run_script

    patch_torch(**STOCK_OPTIONS)
    try:
        if argv[0] == "-m":
            run_module(argv[1], argv[2:])
        else:
            run_script(argv[0], argv[1:])
    except NoModule as exc:
        print(f"python -m nanopatch: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from nanopatch._cuda_stock import main as _main  # the module under its own name, not __main__

    sys.exit(_main(sys.argv[1:]))
