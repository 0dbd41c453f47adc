"""Child-process bootstrap: ``python -m nanopatch`` puts this folder on ``PYTHONPATH``.

The ``sitecustomize.py`` beside this file then runs at start-up in every Python process the
script starts (DataLoader workers under spawn/forkserver, subprocesses), gives it the whole
CPU set and, when it is one of several workers, its share of the threads (see
:func:`nanopatch.runtime.tuning.share_threads_in_child`), calls ``patch_torch()`` with the options
exported as ``NANOPATCH_*``, and hands over to any other ``sitecustomize`` the environment
had. Patching only installs import hooks, so a child that never imports torch pays the import
of nanopatch and wrapt and nothing more.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

BOOTSTRAP_DIR = os.path.dirname(os.path.abspath(__file__))
LOG_LEVEL_VARIABLE = "NANOPATCH_LOG_LEVEL"


def start_child() -> None:
    """Patch this (child) process from the environment; never raise."""
    try:
        from nanopatch.runtime.tuning import share_threads_in_child, unpin_started_child

        unpin_started_child()  # before torch (and its OpenMP) loads in this process
        share_threads_in_child()
    except Exception as exc:
        sys.stderr.write(f"nanopatch: could not set this process's CPU affinity and threads: {exc}\n")
    try:
        level = os.environ.get(LOG_LEVEL_VARIABLE)
        if level:
            from nanopatch.foundation._log import configure_stderr

            configure_stderr(level)
        from nanopatch import patch_torch

        patch_torch()
    except Exception as exc:  # a child must run even if it cannot be patched
        sys.stderr.write(f"nanopatch: this process runs unpatched: {type(exc).__name__}: {exc}\n")


def chain_sitecustomize() -> None:
    """Run the ``sitecustomize`` our bootstrap shadows, if the environment has one."""
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != BOOTSTRAP_DIR]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as CPython does for a failing sitecustomize: report, go on
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")
