"""glibc malloc set to keep freed memory for reuse, in-process (the ``malloc_reuse`` option).

A training step allocates and frees the same large buffers every step: activations, their
gradients, a language model's logits. glibc serves every block above its mmap threshold
(128 KiB, rising to at most 32 MiB) with a fresh ``mmap`` and unmaps it on ``free``, so the
next step's block is new memory again, and the kernel zero-fills each of its pages on first
touch, a large share of a bf16 training step (the figures are in CHANGELOG.md). tcmalloc and
jemalloc keep freed memory for reuse, which is why PyTorch's CPU guide and the runner
(``python -m nanopatch``) preload one; a script that calls ``patch_torch()`` itself runs on
glibc's malloc, which can do the same when told:

* ``M_MMAP_MAX = 0``: every block comes from the heap, none from its own mapping;
* ``M_TRIM_THRESHOLD`` at 2 GiB: freed memory at the heap's top stays for the next step;
* ``M_TOP_PAD`` at 64 MiB: the heap grows in larger steps (untouched pages cost nothing).

The process keeps its peak memory instead of returning it between steps, as it would with
tcmalloc or jemalloc. Nothing is done when another allocator is loaded (the runner's
tcmalloc), when the C library is not glibc, or when the user tuned glibc's malloc already
(``MALLOC_*_`` variables, ``GLIBC_TUNABLES`` with ``glibc.malloc``). Unpatch sets glibc's
documented defaults again (128 KiB thresholds and pad, 65536 mappings); glibc's dynamic mmap
threshold, which any ``mallopt`` call fixes, stays at its 128 KiB start.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

from . import tuning as runtime

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
#: (parameter, value while patched, glibc's default)
SETTINGS = (
    (M_MMAP_MAX, 0, 65536),
    (M_TRIM_THRESHOLD, 2**31 - 1, 128 * 1024),
    (M_TOP_PAD, 64 * 2**20, 128 * 1024),
)
_USER_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")
_OTHER_ALLOCATORS = ("libtcmalloc", "libjemalloc", "libmimalloc", "libhoard", "libtbbmalloc_proxy")


def other_allocator(maps: str = "/proc/self/maps") -> str | None:
    """The file name of a replacement allocator mapped into this process, or None."""
    for path in runtime.mapped_libraries(maps) or ():
        name = os.path.basename(path)
        if name.startswith(_OTHER_ALLOCATORS):
            return name
    return None


def why_not(environ: Mapping[str, str] | None = None, maps: str = "/proc/self/maps") -> str | None:
    """Why glibc's malloc is left as it is in this process, or None when it can be tuned."""
    environ = os.environ if environ is None else environ
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    given = [name for name in _USER_VARIABLES if environ.get(name, "").strip()]
    if given:
        return f"glibc's malloc is tuned by the environment already ({', '.join(given)})"
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        return "glibc's malloc is tuned by GLIBC_TUNABLES already"
    other = other_allocator(maps)
    if other is not None:
        return f"{other} is the allocator of this process"
    return None


def _mallopt():
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Tune glibc's malloc as described above. Returns (done, what or why not); the caller
    registers :func:`restore_defaults` as the undo when done."""
    reason = why_not(environ)
    if reason is not None:
        return False, reason
    mallopt = _mallopt()
    if mallopt is None:
        return False, "glibc's mallopt is not reachable"
    for param, value, _ in SETTINGS:
        if mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            restore_defaults()
            return False, f"mallopt({param}, {value}) failed"
    return True, "glibc malloc keeps freed memory for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB, M_TOP_PAD=64 MiB)"


def restore_defaults() -> None:
    mallopt = _mallopt()
    if mallopt is None:
        return
    for param, _, default in SETTINGS:
        mallopt(ctypes.c_int(param), ctypes.c_int(default))
