"""What a target's ``patch(config)`` calls: the only way a target changes anything.

A target never calls ``setattr`` on a foreign module itself. :func:`replace`,
:func:`replace_everywhere` and :func:`wrap` replace module and class attributes while its
``patch()`` runs (the engine knows which target is running); :func:`set_on`, :func:`add_hook`
and :func:`on_undo` record every other change, at patch time or later while the target is
applied. Each is an entry of the engine's journal (:mod:`.journal`), undone when the target is.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any

from .journal import JOURNAL, NOTSET, Change, raw_attribute

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("nanopatch_target", default=None)
_on_import_of: contextvars.ContextVar[str | None] = contextvars.ContextVar("nanopatch_import", default=None)


@contextlib.contextmanager
def applying(name: str) -> Iterator[None]:
    """The engine's side: the target ``name``'s ``patch()`` runs inside this."""
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)
        _binding_index.clear()  # the index holds modules and ids: only for one target's patch


@contextlib.contextmanager
def on_import_of(module: str) -> Iterator[None]:
    """The engine's side: targets applied inside this apply because ``module`` was just imported."""
    token = _on_import_of.set(module)
    try:
        yield
    finally:
        _on_import_of.reset(token)


def applied_on_import() -> bool:
    """Whether the target being applied is applied because its module was just imported (so
    no object of that library can exist yet)."""
    return _on_import_of.get() is not None


def current_target() -> str:
    """The name of the target whose ``patch()`` is running (one patcher may serve several)."""
    name = _current.get()
    if name is None:
        raise RuntimeError("nanopatch: replace()/wrap() may only be called from a target's patch()")
    return name


def replace(owner: Any, name: str, new: Any) -> None:
    """Set ``owner.name = new``, recording the original for exact undo."""
    JOURNAL.replace(current_target(), owner, name, new)


def original(target: str, owner: Any, name: str) -> Any:
    """What ``owner.name`` was before ``target`` replaced it (raw), or what it is now if
    ``target`` has not replaced it: the journal's record, never a copy."""
    return JOURNAL.original(target, owner, name)


def set_on(target: str, obj: Any, name: str, value: Any) -> None:
    """``obj.name = value`` on one of the user's objects (a model's ``forward``, a DataLoader's
    sampler), by ``target`` at any time while it is applied: recorded once, undone when the
    target is (or by :func:`restore_on`), the raw original put back or the attribute deleted."""
    JOURNAL.set_on(target, obj, name, value)


def restore_on(target: str, obj: Any, name: str) -> None:
    """Undo :func:`set_on` for ``obj.name`` now."""
    JOURNAL.restore_on(target, obj, name)


def keep_on(target: str, obj: Any, name: str) -> None:
    """Leave ``obj.name`` as :func:`set_on` set it, past the target's undo (what cannot be
    undone: an IPEX bf16 model keeps its autocast forward)."""
    JOURNAL.keep_on(target, obj, name)


def add_hook(target: str, handle: Any, where: str) -> Change:
    """A hook handle (``torch.utils.hooks.RemovableHandle`` or anything with ``remove()``)
    registered by ``target``: removed when the target is undone, or by :func:`discard`."""
    return JOURNAL.add(Change(target, where, handle.remove))


def on_undo(target: str, undo: Callable[[], None], where: str, owner: Any = None) -> Change:
    """Any other change ``target`` made (a library setting, an object's flags): ``undo`` runs
    when the target is undone, or by :func:`discard`; a change to ``owner`` is forgotten when
    the owner dies."""
    return JOURNAL.add(Change(target, where, undo), owner)


def discard(change: Change, undo: bool = True) -> None:
    """Undo one :func:`add_hook`/:func:`on_undo` change now (``undo=False``: only forget it)."""
    JOURNAL.discard(change, undo)


def replace_everywhere(original: Any, new: Any, package: str) -> list[str]:
    """Replace ``original`` with ``new`` in every loaded module of ``package`` that binds it
    (where it is defined and every namespace that re-exports it). Returns the places."""
    target = current_target()
    places = []
    for module_name, module, attr in _bindings(package).get(id(original), ()):
        if getattr(module, "__dict__", {}).get(attr) is original:
            JOURNAL.replace(target, module, attr, new)
            places.append(f"{module_name}.{attr}")
    return places


#: package -> (len(sys.modules) when built, id(value) -> where the package's modules bind it);
#: built once while a target is applied, which may replace dozens of functions
_binding_index: dict[str, tuple[int, dict[int, list[tuple[str, Any, str]]]]] = {}


def _bindings(package: str) -> dict[int, list[tuple[str, Any, str]]]:
    cached = _binding_index.get(package)
    if cached is not None and cached[0] == len(sys.modules):
        return cached[1]
    index: dict[int, list[tuple[str, Any, str]]] = {}
    prefix = package + "."
    collecting = gc.isenabled()
    gc.disable()  # tens of thousands of small entries would set off full collections meanwhile
    try:
        for module_name, module in list(sys.modules.items()):
            if module is None or not (module_name == package or module_name.startswith(prefix)):
                continue
            for attr, value in list(getattr(module, "__dict__", {}).items()):
                index.setdefault(id(value), []).append((module_name, module, attr))
    finally:
        if collecting:
            gc.enable()
    _binding_index[package] = (len(sys.modules), index)
    return index


def wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> Any:
    """Wrap ``owner.name`` with a wrapt ``FunctionWrapper`` calling
    ``wrapper(wrapped, instance, args, kwargs)``; the raw descriptor is what gets wrapped."""
    import wrapt

    original = raw_attribute(owner, name)
    if original is NOTSET:
        original = getattr(owner, name)
    wrapped = wrapt.FunctionWrapper(original, wrapper)
    replace(owner, name, wrapped)
    return wrapped
