"""Logging for nanopatch: one logger, one warning category, and "say it once" helpers.

Fallbacks (IPEX not installed, no native bf16, ...) happen on every call of a patched
function; users must hear about each of them once per process, not once per call.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
import weakref
from collections.abc import Iterator

logger = logging.getLogger("nanopatch")
logger.addHandler(logging.NullHandler())


class NanopatchWarning(UserWarning):
    """Something the user should fix: an option we could not honour, a stale stock binding."""


_said: set[str] = set()
_said_about: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # object -> its keys said
_said_lock = threading.Lock()


def _first_time(key: str, about: object = None) -> bool:
    """Whether ``key`` (for the object ``about``, when given) was not said before. Keys about an
    object live as long as it does: a new object never inherits a silenced message through a
    recycled ``id``, and the record does not grow with every model a process ever built."""
    with _said_lock:
        said = _said if about is None else _said_about.setdefault(about, set())
        if key in said:
            return False
        said.add(key)
        return True


def log_once(key: str, message: str, *args: object, level: int = logging.INFO, about: object = None) -> bool:
    """Log ``message`` under ``key`` (per object ``about``, when given) unless that was logged
    before; True if it was logged now."""
    if not _first_time(key, about):
        return False
    logger.log(level, message, *args)
    return True


def warn_once(key: str, message: str, stacklevel: int = 2, about: object = None) -> bool:
    """Issue a :class:`NanopatchWarning` (and log it) once per process for ``key`` (per object
    ``about``, when given)."""
    if not _first_time(key, about):
        return False
    logger.warning(message)
    warnings.warn(message, NanopatchWarning, stacklevel=stacklevel + 1)
    return True


def configure_stderr(level: str | int) -> None:
    """Send nanopatch's log records to stderr at ``level`` (used by the runner's ``-v``), and
    there only: a handler the root logger has (a script's ``logging.basicConfig``, or IPEX's,
    which it installs on import) would print each of them a second time."""
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError(f"log level: unknown level {level!r}")
    if not any(getattr(h, "_nanopatch", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("nanopatch: %(levelname)s: %(message)s"))
        handler._nanopatch = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(level)


@contextlib.contextmanager
def warnings_from(module: str, action: str, message: str = "", category: type[Warning] = Warning) -> Iterator[None]:
    """Inside, the warnings raised from ``module`` (a regular expression on the module that warns)
    take ``action`` ("error" or "ignore"): for nanopatch's own probes and registrations. It does
    what ``warnings.catch_warnings()`` with ``filterwarnings(...)`` would, without making Python
    forget the warnings it has shown: any change of the filters through the warnings API clears
    every module's record, and a warning the script raises once per place would print again. The
    filter is put in front of the list and taken out again in place; "error" and "ignore" leave no
    record behind."""
    if action not in ("error", "ignore"):
        raise ValueError(f"action must be 'error' or 'ignore', not {action!r}")
    entry = (action, re.compile(message, re.I) if message else None, category, re.compile(module), 0)
    warnings.filters.insert(0, entry)
    try:
        yield
    finally:
        for i, kept in enumerate(warnings.filters):
            if kept is entry:
                del warnings.filters[i]
                break
