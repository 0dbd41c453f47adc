"""What the ``vision`` target replaced, read from the patch engine's journal (the only store of
originals): nothing here keeps a copy."""

from __future__ import annotations

from typing import Any

from nanopatch import engine

#: The engine's name for this target (its journal records are filed under it).
TARGET = "vision"


def original(owner: Any, name: str) -> Any:
    """What ``owner.name`` was before this target replaced it: the engine's journal records it
    while the target is applied; otherwise the attribute is stock's own. Raw, as stored in
    ``owner.__dict__`` (a ``staticmethod`` stays one)."""
    found = engine.original(TARGET, owner, name)
    if found is engine.NOTSET or getattr(found, "__module__", "").startswith("nanopatch."):
        raise RuntimeError(f"nanopatch: no record of the stock {engine.qualname(owner)}.{name}")
    return found
