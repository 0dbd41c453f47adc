"""OpenCV, imported on first use and set to one thread.

nanopatch's kernels run on images of a few hundred pixels, where OpenCV's thread pool buys
little, and data loading is parallel across DataLoader workers already: a pool per worker
would oversubscribe the cores (albumentations does the same). It is done in every process,
not only in workers, because of ``fork``: a pool that has run in a process does not survive
it, and a forked child that then touches OpenCV's threading (even to set one thread) can hang.
So the setting is made in the parent: on nanopatch's first OpenCV use, or, when the user's own
code imported OpenCV first, just before the process forks; a forked child inherits it and
never has to touch it. A spawned process sets it on its own first use.

This is process-wide: OpenCV calls the user's own code makes while patched run single-threaded
too. Made while the ``vision`` target is applied, the setting is an entry of the patch engine's
journal: unpatch gives the process the thread count it had. Before a fork it is made only while the ``vision``
target is applied.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

_configured_in: int | None = None  # pid of the process that set it (forked children inherit it)


def _one_thread(module: ModuleType) -> None:
    global _configured_in
    pid = _configured_in = os.getpid()
    before = module.getNumThreads()
    if before == 1:
        return
    module.setNumThreads(1)

    def undo() -> None:
        global _configured_in
        _configured_in = None
        if os.getpid() == pid:  # a forked child never touches OpenCV's threading
            module.setNumThreads(before)

    from ._originals import context

    ctx = context()
    if ctx is not None and ctx.applied:  # else nanopatch's kernels run outside a patch (a spawned worker)
        ctx.on_undo(undo, f"cv2.setNumThreads(1) (it was {before})")


def cv2() -> ModuleType:
    import cv2 as module

    if _configured_in is None:
        _one_thread(module)
    return module


def _before_fork() -> None:
    module = sys.modules.get("cv2")
    if module is None or _configured_in is not None or not hasattr(module, "setNumThreads"):
        return
    from ._originals import context

    ctx = context()
    if ctx is not None and ctx.applied:
        _one_thread(module)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)
