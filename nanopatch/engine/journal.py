"""The journal of every change a target makes, and its exact undo.

* :class:`Record`: an attribute of a module or class a target replaced, with the raw original
  read from the owner's ``__dict__`` (a ``staticmethod`` stays a ``staticmethod``), recorded
  exactly once per target and attribute; :data:`NOTSET` where the attribute did not exist (undo
  deletes it).
* :class:`Change`: any other change made while a target is applied: an attribute of one of the
  user's objects (held weakly, forgotten with the object), a hook handle, a setting with its
  own undo.
* :class:`Journal` keeps both in order and undoes a target's entries last in, first out.
  :data:`JOURNAL` is the engine's one journal (:mod:`.patching` applies and undoes targets
  through it; :mod:`.api` is what targets call to write to it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

logger = logging.getLogger("nanopatch")


class _NotSet:
    """Marks an attribute that did not exist in the owner's own ``__dict__`` before patching."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOTSET"


NOTSET: Any = _NotSet()


# --- the journal ----------------------------------------------------------------------


@dataclasses.dataclass
class Record:
    target: str
    owner: Any
    name: str
    original: Any  # the raw value from the owner's __dict__, or NOTSET
    replacement: Any

    @property
    def where(self) -> str:
        return f"{qualname(self.owner)}.{self.name}"


def qualname(owner: Any) -> str:
    """``owner`` as a status line names it: a module's name, a class's dotted path, else its repr."""
    if isinstance(owner, ModuleType):
        return owner.__name__
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return repr(owner)


def raw_attribute(owner: Any, name: str) -> Any:
    """The attribute as stored on ``owner`` itself (no descriptor binding, no inheritance),
    or NOTSET."""
    namespace = getattr(owner, "__dict__", None)
    if namespace is not None:
        return namespace.get(name, NOTSET)
    return getattr(owner, name, NOTSET)


@dataclasses.dataclass(eq=False)
class Change:
    """A change made while a target is applied, outside module and class attributes: an
    attribute of one of the user's objects (a model's ``forward``, a DataLoader's sampler),
    a hook handle, or a setting with its own undo. ``undo`` puts it back."""

    target: str
    where: str
    undo: Callable[[], None]
    key: tuple[Any, ...] | None = None  # (id(obj), name) for an object's attribute


def _set_raw(obj: Any, name: str, value: Any) -> None:
    """Set or (``NOTSET``) delete ``obj.name`` in the instance's own ``__dict__``, past any
    ``__setattr__`` of its class (``nn.Module``'s, ``DataLoader``'s refusal after init)."""
    if value is NOTSET:
        obj.__dict__.pop(name, None)
    else:
        object.__setattr__(obj, name, value)


def _call_keeping(undo: Callable[[], None], keep: Any) -> None:
    """``undo()``; ``keep`` (the owner's weak reference, whose callback forgets the change) is
    only held alive by this partial."""
    undo()


class Journal:
    """Originals recorded once per (target, owner, attribute), and every other change a
    target made; undone last-in first-out."""

    def __init__(self) -> None:
        self._records: list[Record | Change] = []
        self._index: dict[tuple[Any, ...], Record | Change] = {}
        self._lock = threading.RLock()  # the lists only: never held while user code runs

    def replace(self, target: str, owner: Any, name: str, new: Any) -> None:
        key = (target, id(owner), name)
        with self._lock:
            record = self._index.get(key)
            if record is None:
                record = Record(target, owner, name, raw_attribute(owner, name), new)
                self._records.append(record)
                self._index[key] = record
            else:
                record.replacement = new
        setattr(owner, name, new)

    def set_on(self, target: str, obj: Any, name: str, value: Any) -> None:
        """``obj.name = value`` on one of the user's objects, its own original recorded once.
        The journal holds the object weakly where it can: a model that is dropped is not kept
        alive by nanopatch, and its entry goes with it."""
        key = (target, id(obj), name)
        with self._lock:
            if key not in self._index:
                original = obj.__dict__.get(name, NOTSET)
                try:
                    ref = weakref.ref(obj, lambda _: self._forget(key))
                except TypeError:
                    ref = lambda obj=obj: obj  # noqa: E731 - not weak-referenceable: held strongly

                def undo() -> None:
                    owner = ref()
                    if owner is not None:
                        _set_raw(owner, name, original)

                change = Change(target, f"{type(obj).__name__}(at {id(obj):#x}).{name}", undo, key)
                self._records.append(change)
                self._index[key] = change
        _set_raw(obj, name, value)

    def add(self, change: Change, owner: Any = None) -> Change:
        """Record ``change``; with ``owner``, it is forgotten (not undone) when the owner dies
        (a hook or setting on an object that is gone needs no undo)."""
        if owner is not None:
            change.key = ("owned", id(change))
            owner_ref = weakref.ref(owner, lambda _: self._forget(change.key))
            change.undo = functools.partial(_call_keeping, change.undo, owner_ref)
        with self._lock:
            self._records.append(change)
            if change.key is not None:
                self._index[change.key] = change
        return change

    def _forget(self, key: tuple[Any, ...]) -> Record | Change | None:
        with self._lock:
            entry = self._index.pop(key, None)
            if entry is not None:
                self._records = [r for r in self._records if r is not entry]
            return entry

    def restore_on(self, target: str, obj: Any, name: str) -> None:
        """Undo ``set_on(target, obj, name, ...)`` now (nothing if there is none)."""
        entry = self._forget((target, id(obj), name))
        if entry is not None:
            entry.undo()

    def keep_on(self, target: str, obj: Any, name: str) -> None:
        """Let ``obj.name`` outlive the patch: its entry is dropped without undoing it."""
        self._forget((target, id(obj), name))

    def discard(self, change: Change, undo: bool = True) -> None:
        with self._lock:
            found = any(r is change for r in self._records)
            if found:
                self._records = [r for r in self._records if r is not change]
                if change.key is not None:
                    self._index.pop(change.key, None)
        if found and undo:
            change.undo()

    def undo(self, target: str | None = None) -> None:
        """Restore the originals of ``target`` (or of every target), newest first."""
        with self._lock:
            mine = [r for r in self._records if target is None or r.target == target]
            self._records = [r for r in self._records if not (target is None or r.target == target)]
            for record in mine:
                if isinstance(record, Record):
                    self._index.pop((record.target, id(record.owner), record.name), None)
                elif record.key is not None:
                    self._index.pop(record.key, None)
        interrupted: BaseException | None = None
        for record in reversed(mine):
            # one failed undo (a setattr refused, a hook's own error) must not leave the others
            # in place: the records are already out of the journal, so every one is tried; an
            # interrupt (Ctrl-C) waits until all are, then goes on
            try:
                if isinstance(record, Change):
                    record.undo()
                elif record.original is NOTSET:
                    with contextlib.suppress(AttributeError):
                        delattr(record.owner, record.name)
                else:
                    setattr(record.owner, record.name, record.original)
            except Exception:
                where = record.where if isinstance(record, Change) else f"{record.owner!r}.{record.name}"
                logger.exception("nanopatch could not undo %s", where)
            except BaseException as exc:
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    def original(self, target: str, owner: Any, name: str) -> Any:
        """The raw original ``target`` recorded for ``owner.name`` (NOTSET: it did not exist),
        or ``owner.name`` as stored now when ``target`` has not replaced it."""
        with self._lock:
            record = self._index.get((target, id(owner), name))
        if isinstance(record, Record) and record.owner is owner:
            return record.original
        return raw_attribute(owner, name)

    def records(self, target: str | None = None) -> list[Record]:
        """The module and class attributes replaced (by ``target``)."""
        with self._lock:
            return [r for r in self._records if isinstance(r, Record) and (target is None or r.target == target)]

    def changes(self, target: str | None = None) -> list[Change]:
        """Every other live change (of ``target``)."""
        with self._lock:
            return [r for r in self._records if isinstance(r, Change) and (target is None or r.target == target)]


#: the engine's journal: every target's changes, in the order they were made
JOURNAL = Journal()
