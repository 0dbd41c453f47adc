"""What the ``vision`` target replaced, read from the patch engine's journal (the only store of
originals): nothing here keeps a copy. The target's context (:class:`nanopatch.engine.Context`)
is kept here when it applies, for the vision code that reads the options or records a change
later."""

from __future__ import annotations

from typing import Any

from nanopatch import engine

_context: engine.Context | None = None


def bind(ctx: engine.Context) -> None:
    """Keep the vision target's context (the engine makes one per registration, for good)."""
    global _context
    _context = ctx


def context() -> engine.Context | None:
    """The vision target's context, None before it first applied."""
    return _context


def original(owner: Any, name: str) -> Any:
    """What ``owner.name`` was before this target replaced it: the engine's journal records it
    while the target is applied; otherwise the attribute is stock's own. Raw, as stored in
    ``owner.__dict__`` (a ``staticmethod`` stays one)."""
    found = _context.original(owner, name) if _context is not None else engine.raw_attribute(owner, name)
    if found is engine.NOTSET or getattr(found, "__module__", "").startswith("nanopatch."):
        raise RuntimeError(f"nanopatch: no record of the stock {engine.qualname(owner)}.{name}")
    return found
