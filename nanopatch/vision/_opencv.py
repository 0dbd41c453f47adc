"""OpenCV, imported on first use and set to one thread.

nanopatch's kernels run on images of a few hundred pixels, where OpenCV's thread pool buys
little, and data loading is parallel across DataLoader workers already: a pool per worker
would oversubscribe the cores (albumentations does the same). It is done in every process,
not only in workers, because of ``fork``: a pool that has run in a process does not survive
it, and a forked child that then touches OpenCV's threading (even to set one thread) can hang.
So the setting is made in the parent: on nanopatch's first OpenCV use, or, when the user's own
code imported OpenCV first, just before the process forks; a forked child inherits it and
never has to touch it. A spawned process sets it on its own first use.

This is process-wide: OpenCV calls the user's own code makes afterwards run single-threaded
too (``cv2.setNumThreads`` changes it back).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

_configured_in: int | None = None  # pid of the process that set it (forked children inherit it)


def _one_thread(module: ModuleType) -> None:
    global _configured_in
    _configured_in = os.getpid()
    if module.getNumThreads() != 1:
        module.setNumThreads(1)


def cv2() -> ModuleType:
    import cv2 as module

    if _configured_in is None:
        _one_thread(module)
    return module


def _before_fork() -> None:
    module = sys.modules.get("cv2")
    if module is not None and _configured_in is None and hasattr(module, "setNumThreads"):
        _one_thread(module)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)
