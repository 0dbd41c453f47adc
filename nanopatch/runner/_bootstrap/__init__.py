"""Child-process bootstrap: ``python -m nanopatch`` puts this folder on ``PYTHONPATH``.

The ``sitecustomize.py`` beside this file then runs at start-up in every Python process the
script starts (DataLoader workers under spawn/forkserver, subprocesses). In a process of the
run's own interpreter environment (``NANOPATCH_PREFIX``, the run's ``sys.prefix``) it loads this
copy of nanopatch and calls :func:`start_child`: the whole CPU set back and, when the process is
one of several workers, its share of the threads (see
:func:`nanopatch.runtime.tuning.share_threads_in_child`), then ``patch_torch()`` with the options
exported as ``NANOPATCH_*``. A Python of another environment is left as it is. Either way it
hands over to any other ``sitecustomize`` the environment had. Patching only installs import
hooks, so a child that never imports torch pays the import of nanopatch and wrapt and nothing
more.
"""

from __future__ import annotations

import os
import sys

BOOTSTRAP_DIR = os.path.dirname(os.path.abspath(__file__))
LOG_LEVEL_VARIABLE = "NANOPATCH_LOG_LEVEL"
#: the run's interpreter environment (``sys.prefix``): the bootstrap patches only processes of
#: that environment (as sitecustomize.py, which cannot import this module first, spells it)
PREFIX_VARIABLE = "NANOPATCH_PREFIX"


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
            from nanopatch.foundation.log import configure_stderr

            configure_stderr(level)
        from nanopatch import patch_torch

        patch_torch()
    except Exception as exc:  # a child must run even if it cannot be patched
        sys.stderr.write(f"nanopatch: this process runs unpatched: {type(exc).__name__}: {exc}\n")
