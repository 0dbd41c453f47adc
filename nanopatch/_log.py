"""Logging for nanopatch: one logger, one warning category, and "say it once" helpers.

Fallbacks (IPEX not installed, no native bf16, ...) happen on every call of a patched
function; users must hear about each of them once per process, not once per call.
"""

from __future__ import annotations

import logging
import threading
import warnings

logger = logging.getLogger("nanopatch")
logger.addHandler(logging.NullHandler())


class NanopatchWarning(UserWarning):
    """Something the user should fix: an option we could not honour, a stale stock binding."""


_said: set[str] = set()
_said_lock = threading.Lock()


def _first_time(key: str) -> bool:
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def log_once(key: str, message: str, *args: object, level: int = logging.INFO) -> bool:
    """Log ``message`` under ``key`` unless that key was logged before; True if it was logged now."""
    if not _first_time(key):
        return False
    logger.log(level, message, *args)
    return True


def warn_once(key: str, message: str, stacklevel: int = 2) -> bool:
    """Issue a :class:`NanopatchWarning` (and log it) once per process for ``key``."""
    if not _first_time(key):
        return False
    logger.warning(message)
    warnings.warn(message, NanopatchWarning, stacklevel=stacklevel + 1)
    return True


def configure_stderr(level: str | int) -> None:
    """Send nanopatch's log records to stderr at ``level`` (used by the runner's ``-v``)."""
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError(f"log level: unknown level {level!r}")
    if not any(getattr(h, "_nanopatch", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("nanopatch: %(levelname)s: %(message)s"))
        handler._nanopatch = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
