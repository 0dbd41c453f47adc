"""OpenCV, imported on first use and set to one thread.

nanopatch's kernels run on images of a few hundred pixels, where OpenCV's thread pool buys
little, and data loading is parallel across DataLoader workers already: a pool per worker
would oversubscribe the cores (albumentations does the same). There is a second reason to do
it in every process, not only in workers: a pool that has run in the main process does not
survive ``fork``, and a forked worker that then touches OpenCV's threading (even to set it to
one thread) can hang. With one thread from the first use, no pool is ever started, and a
forked child inherits the setting without having to touch it.

This is process-wide: OpenCV calls the user's own code makes after nanopatch's first use run
single-threaded too (``cv2.setNumThreads`` changes it back).
"""

from __future__ import annotations

from types import ModuleType

_configured = False


def cv2() -> ModuleType:
    import cv2 as module

    global _configured
    if not _configured:
        _configured = True
        if module.getNumThreads() != 1:
            module.setNumThreads(1)
    return module
