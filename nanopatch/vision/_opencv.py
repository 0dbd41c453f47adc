"""OpenCV, imported on first use and set up for the process it runs in.

In a DataLoader worker OpenCV gets one thread: the workers already run in parallel, and an
OpenCV pool per worker would oversubscribe the cores (albumentations does the same). The
check runs once per process, so forked workers set themselves up too.
"""

from __future__ import annotations

import os
from types import ModuleType

_configured_pid: int | None = None


def cv2() -> ModuleType:
    import cv2 as module

    global _configured_pid
    pid = os.getpid()
    if _configured_pid != pid:
        _configured_pid = pid
        if _in_dataloader_worker():
            module.setNumThreads(1)
    return module


def _in_dataloader_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return get_worker_info() is not None
