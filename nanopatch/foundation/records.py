"""What nanopatch measured on this machine and keeps for later runs: small JSON files of
records in one cache folder (``NANOPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/nanopatch``, else
``~/.cache/nanopatch``), each record filed under a key that says what it was measured for
(the model or script, torch's version, the CPU and its threads). A file that cannot be read
or written is no record: the measurement is simply made again."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger("nanopatch")


def cache_dir(environ: Any = None) -> Path:
    environ = os.environ if environ is None else environ
    given = environ.get("NANOPATCH_CACHE_DIR")
    if given:
        return Path(given)
    xdg = environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "nanopatch"


def read_record(key: str, file: str) -> dict[str, Any] | None:
    """The record filed under ``key`` in ``file`` of the cache folder, or None."""
    try:
        records = json.loads((cache_dir() / file).read_text())
    except (OSError, ValueError):
        return None
    record = records.get(key) if isinstance(records, dict) else None
    return record if isinstance(record, dict) else None


def write_record(key: str, record: dict[str, Any], file: str) -> None:
    """Add one record to ``file`` in the cache folder (written whole, then renamed into place)."""
    folder = cache_dir()
    path = folder / file
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            records = json.loads(path.read_text())
        except (OSError, ValueError):
            records = {}
        if not isinstance(records, dict):
            records = {}
        records[key] = record
        temporary = folder / f".{file}.{os.getpid()}"
        temporary.write_text(json.dumps(records, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError as exc:
        logger.debug("nanopatch could not write %s: %s", path, exc)
