"""The patch engine: a registry of targets and a journal of everything they replaced.

* A **target** is one concern (``vision``, ``training``, ...): the option that switches it,
  the module whose import triggers it, and the module of a nanopatch package that does the
  work, its ``patch.py`` (the ``lightning`` targets: ``parallel/lightning.py`` beside it):
  ``patch(config)``, ``unpatch()``, and ``SUPPORTED``: distribution -> version specifier.
* A target's ``patch(config)`` never calls ``setattr`` on a foreign module itself: it calls
  :func:`replace`, :func:`replace_everywhere` or :func:`wrap` here, which record the raw
  original (read from ``__dict__``, so a ``staticmethod`` stays a ``staticmethod``) exactly
  once per target and attribute.
* Every other change a target makes, at patch time or later while it is applied, is an
  entry of the same journal: an attribute of one of the user's objects (:func:`set_on`: a
  model's ``forward``, a DataLoader's sampler; held weakly, forgotten with the object), a hook
  handle (:func:`add_hook`), or a setting with its own undo (:func:`on_undo`: an optimizer's
  step flags, OpenCV's thread count). ``status()`` lists them per target.
* Undo replays the journal in reverse (LIFO), so after :func:`unpatch_torch` every patched
  attribute ``is`` its original again, attributes that did not exist are deleted, and no
  hook or setting of nanopatch's is left.
* A target whose module is not imported yet is applied by a wrapt post-import hook when it
  is, so patching works in either import order.

All state changes happen under one re-entrant lock.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import importlib
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

from nanopatch.foundation._log import log_once

from . import config as _config

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
        return f"{_qualname(self.owner)}.{self.name}"


def _qualname(owner: Any) -> str:
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


# --- the registry ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    option: str  # the config option that switches this target on
    module: str  # the target is applied once this module is imported
    patcher: str  # dotted name of the module with patch(config), unpatch(), SUPPORTED


_registry: dict[str, Target] = {}


def register(target: Target) -> None:
    """Add a target to the registry (targets apply in registration order)."""
    if target.option not in _config.OPTIONS:
        raise ValueError(f"target {target.name!r}: unknown option {target.option!r}")
    with _locked():
        if target.name in _registry and _registry[target.name] != target:
            raise ValueError(f"a different target named {target.name!r} is registered")
        _registry[target.name] = target
        if _active is not None:
            _sync(target)


def unregister(name: str) -> None:
    """Remove a target, undoing it first if it is applied."""
    with _locked():
        target = _registry.get(name)
        if target is None:
            return
        if name in _applied:
            _undo_targets([name])
        del _registry[name]
        _states.pop(name, None)


def targets() -> list[Target]:
    return list(_registry.values())


# --- engine state ---------------------------------------------------------------------

_lock = threading.RLock()
_journal = Journal()
_active: _config.Config | None = None  # the configuration in force, None when unpatched
_applied: list[str] = []  # target names, in the order they were applied
_states: dict[str, tuple[str, str]] = {}  # target name -> (state, detail)
_hooked: set[str] = set()  # modules with a post-import hook waiting
_imported: list[str] = []  # imports whose targets wait for the engine's lock (_on_import)
_queue_lock = threading.Lock()  # guards _imported, never held while anything else is taken
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("nanopatch_target", default=None)


_on_import_of: contextvars.ContextVar[str | None] = contextvars.ContextVar("nanopatch_import", default=None)


def applied_on_import() -> bool:
    """Whether the target being applied is applied because its module was just imported (so
    no object of that library can exist yet)."""
    return _on_import_of.get() is not None


def _current_target() -> str:
    name = _current.get()
    if name is None:
        raise RuntimeError("nanopatch: replace()/wrap() may only be called from a target's patch()")
    return name


def current_target() -> str:
    """The name of the target whose ``patch()`` is running (one patcher may serve several)."""
    return _current_target()


# --- what target modules call ---------------------------------------------------------


def replace(owner: Any, name: str, new: Any) -> None:
    """Set ``owner.name = new``, recording the original for exact undo."""
    _journal.replace(_current_target(), owner, name, new)


def original(target: str, owner: Any, name: str) -> Any:
    """What ``owner.name`` was before ``target`` replaced it (raw), or what it is now if
    ``target`` has not replaced it: the journal's record, never a copy."""
    return _journal.original(target, owner, name)


def set_on(target: str, obj: Any, name: str, value: Any) -> None:
    """``obj.name = value`` on one of the user's objects (a model's ``forward``, a DataLoader's
    sampler), by ``target`` at any time while it is applied: recorded once, undone when the
    target is (or by :func:`restore_on`), the raw original put back or the attribute deleted."""
    _journal.set_on(target, obj, name, value)


def restore_on(target: str, obj: Any, name: str) -> None:
    """Undo :func:`set_on` for ``obj.name`` now."""
    _journal.restore_on(target, obj, name)


def keep_on(target: str, obj: Any, name: str) -> None:
    """Leave ``obj.name`` as :func:`set_on` set it, past the target's undo (what cannot be
    undone: an IPEX bf16 model keeps its autocast forward)."""
    _journal.keep_on(target, obj, name)


def add_hook(target: str, handle: Any, where: str) -> Change:
    """A hook handle (``torch.utils.hooks.RemovableHandle`` or anything with ``remove()``)
    registered by ``target``: removed when the target is undone, or by :func:`discard`."""
    return _journal.add(Change(target, where, handle.remove))


def on_undo(target: str, undo: Callable[[], None], where: str, owner: Any = None) -> Change:
    """Any other change ``target`` made (a library setting, an object's flags): ``undo`` runs
    when the target is undone, or by :func:`discard`; a change to ``owner`` is forgotten when
    the owner dies."""
    return _journal.add(Change(target, where, undo), owner)


def discard(change: Change, undo: bool = True) -> None:
    """Undo one :func:`add_hook`/:func:`on_undo` change now (``undo=False``: only forget it)."""
    _journal.discard(change, undo)


def replace_everywhere(original: Any, new: Any, package: str) -> list[str]:
    """Replace ``original`` with ``new`` in every loaded module of ``package`` that binds it
    (where it is defined and every namespace that re-exports it). Returns the places."""
    target = _current_target()
    places = []
    for module_name, module, attr in _bindings(package).get(id(original), ()):
        if getattr(module, "__dict__", {}).get(attr) is original:
            _journal.replace(target, module, attr, new)
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


# --- applying and undoing targets -----------------------------------------------------


def _enabled(target: Target, config: _config.Config) -> bool:
    return bool(getattr(config, target.option))


def _sync(target: Target) -> None:
    """Bring one target in line with the active configuration (lock held)."""
    assert _active is not None
    if target.name in _applied:
        return
    if not _enabled(target, _active):
        _states[target.name] = ("disabled", f"option {target.option} is off")
        return
    if target.module not in sys.modules:
        _states[target.name] = ("pending", f"applies when {target.module} is imported")
        if target.module not in _hooked:
            _hooked.add(target.module)
            import wrapt  # imported on first need (import cost: bench/import_cost.py)

            wrapt.register_post_import_hook(_on_import, target.module)
        return
    _apply_target(target)


def _on_import(module: ModuleType) -> None:
    """The post-import hook: the targets of ``module`` apply now. It runs inside the import
    machinery, holding that module's import lock, so it must never wait for the engine's lock:
    a thread in ``patch_torch()`` holds the engine's lock and may be waiting for this very
    module's import to finish (its patch imports a submodule), and each would wait for the
    other forever. So the module is queued, and whichever thread holds the engine's lock (this
    one, if none does) applies it as soon as it can."""
    with _queue_lock:
        _imported.append(module.__name__)
    _drain_imports()


def _drain_imports() -> None:
    """Apply the targets of queued imports, unless another thread holds the engine's lock: that
    thread drains the queue when it lets go (see :func:`_locked`)."""
    while True:
        if not _lock.acquire(blocking=False):
            return
        try:
            with _queue_lock:
                names = list(_imported)
                _imported.clear()
            for name in names:
                _apply_imported(name)
        finally:
            _lock.release()
        with _queue_lock:
            if not _imported:
                return


def _apply_imported(name: str) -> None:
    # Never let a failure here break the user's import: _apply_target already guards
    # the target code, this guards the engine.
    try:
        _hooked.discard(name)
        if _active is None:
            return
        token = _on_import_of.set(name)
        try:
            for target in list(_registry.values()):
                if target.module == name:
                    _sync(target)
        finally:
            _on_import_of.reset(token)
    except Exception:  # pragma: no cover - defensive
        logger.exception("patching on import of %s failed; left stock", name)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The engine's lock, and on letting go of it (the outermost hold of this thread) the
    imports queued meanwhile applied: imports in other threads that finished while this thread
    held the lock."""
    _depth.value = getattr(_depth, "value", 0) + 1
    try:
        with _lock:
            yield
    finally:
        _depth.value -= 1
    if _depth.value == 0:
        _drain_imports()


_depth = threading.local()  # how deep this thread is in _locked()


def version_problem(supported: dict[str, str]) -> str | None:
    """Why the installed distributions do not satisfy ``supported``, or None."""
    from packaging.specifiers import SpecifierSet

    for dist, spec in supported.items():
        version = _config.distribution_version(dist)
        if version is None:
            return f"{dist} is not installed"
        if not SpecifierSet(spec).contains(version, prereleases=True):
            return f"{dist} {version} is outside the supported range {spec}"
    return None


def _apply_target(target: Target) -> None:
    token = _current.set(target.name)
    try:
        patcher = importlib.import_module(target.patcher)
        problem = version_problem(getattr(patcher, "SUPPORTED", {}))
        if problem:
            _states[target.name] = ("unsupported", problem + "; left stock")
            log_once(
                f"unsupported-{target.name}",
                "%s patches not applied: %s; everything runs stock",
                target.name,
                problem,
                level=logging.WARNING,
            )
            return
        patcher.patch(_active)
    except BaseException as exc:
        _journal.undo(target.name)  # no half-applied target
        if not isinstance(exc, Exception):  # Ctrl-C in a notebook, SystemExit: undone, then raised
            _states[target.name] = ("unpatched", f"interrupted ({type(exc).__name__}) while patching; undone")
            raise
        _states[target.name] = ("failed", f"{type(exc).__name__}: {exc}; left stock")
        log_once(
            f"failed-{target.name}",
            "%s patches failed (%s: %s); everything runs stock",
            target.name,
            type(exc).__name__,
            exc,
            level=logging.WARNING,
        )
        return
    finally:
        _current.reset(token)
        _binding_index.clear()  # the index holds modules and ids: only for one target's patch
    _applied.append(target.name)
    count = len(_journal.records(target.name))
    _states[target.name] = ("patched", f"{count} attribute(s) replaced")


def _undo_targets(names: Iterable[str]) -> None:
    for name in reversed(list(names)):
        target = _registry[name]
        try:
            patcher = sys.modules.get(target.patcher)
            if patcher is not None and hasattr(patcher, "unpatch"):
                patcher.unpatch()
        except Exception:
            logger.exception("%s unpatch() failed; restoring its attributes anyway", name)
        _journal.undo(name)
        _applied.remove(name)
        _states[name] = ("unpatched", "")


# --- the public API (re-exported by nanopatch/__init__.py) ----------------------------


def patch_torch(**options: Any) -> None:
    """Apply every enabled patch. Options (all default to auto/env): vision, training, bf16,
    bf16_eval, channels_last, ipex, compile, fast_decode, data_parallel, auto_lr, fast_dropout,
    malloc_reuse, cuda_to_cpu (off by default: run a script written for a CUDA GPU on the CPU).
    Calling it again with the same options does nothing; with different options the patches
    are re-applied with the new ones."""
    config = _config.resolve(options)
    with _locked():
        _activate(config)


def _activate(config: _config.Config | None) -> None:
    global _active
    if config is None:
        if _active is not None:
            _undo_targets(list(_applied))
            _active = None
        return
    if _active is not None:
        if _active == config:
            return  # idempotent
        logger.info("re-applying patches with new options %s", config.values())
        _undo_targets(list(_applied))
    _active = config
    try:
        for target in list(_registry.values()):
            _sync(target)
    except BaseException:
        # interrupted between targets (Ctrl-C): nothing half-patched stays, and a later
        # patch_torch() with the same options applies everything instead of returning early
        _undo_targets(list(_applied))
        _active = None
        raise


def unpatch_torch() -> None:
    """Undo every patch exactly; a no-op when nothing is patched."""
    with _locked():
        _activate(None)


def is_patched() -> bool:
    return _active is not None


def is_applied(target: str) -> bool:
    """Whether the target named ``target`` is applied now."""
    return target in _applied


def active_config() -> _config.Config | None:
    """The configuration in force, None when nothing is patched."""
    return _active


def target_state(name: str) -> tuple[str, str]:
    """(state, detail) of the target named ``name`` now, as :func:`status` gives them, without
    asking every target to describe itself."""
    with _lock:
        return _states.get(name, ("unpatched", "")) if _active is not None else ("unpatched", "")


class _Scope(contextlib.ContextDecorator):
    """``patched(**options)`` / ``unpatched()``: set a state on entry, restore on exit.

    Nestable and re-entrant (a decorated recursive function works): each entry pushes the
    configuration it found and each exit re-applies exactly that one."""

    def __init__(self, options: dict[str, Any] | None) -> None:
        if options is not None:
            _config.resolve(options)  # bad options fail here, not at first use
        self._options = options
        self._saved: list[_config.Config | None] = []

    def __enter__(self) -> _Scope:
        with _locked():
            self._saved.append(_active)
            _activate(None if self._options is None else _config.resolve(self._options))
        return self

    def __exit__(self, *exc_info: object) -> bool:
        with _locked():
            _activate(self._saved.pop())
        return False

    def __repr__(self) -> str:
        if self._options is None:
            return "nanopatch.unpatched()"
        args = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"nanopatch.patched({args})"


def patched(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Context manager and decorator: patches applied (with ``options``) inside, the previous
    state restored after. ``@patched`` works with or without parentheses."""
    if func is not None:
        if not callable(func):
            raise TypeError("patched() takes only keyword options (or decorates a function)")
        return _Scope(options)(func)
    return _Scope(options)


def unpatched(func: Callable[..., Any] | None = None, /) -> Any:
    """Context manager and decorator: stock behaviour inside, the previous state after."""
    if func is not None:
        return _Scope(None)(func)
    return _Scope(None)


def _stale_bindings() -> list[str]:
    """Stock objects bound in ``__main__`` before the patch (``from X import Y`` done early)."""
    main = sys.modules.get("__main__")
    if main is None:
        return []
    namespace = getattr(main, "__dict__", {})
    by_id = {}
    for record in _journal.records():
        if isinstance(record.owner, ModuleType) and record.original is not NOTSET:
            by_id.setdefault(id(record.original), record)
    found = []
    for name, value in list(namespace.items()):
        record = by_id.get(id(value))
        if record is not None and value is record.original:
            found.append(
                f"__main__.{name} is the stock {record.where}: it was bound before "
                f"patch_torch(), so it stays stock; look it up after patching instead"
            )
    return found


def status() -> dict[str, Any]:
    """What is patched now and why each option has its value, as a plain dict."""
    with _lock:
        config = _active
        errors = []
        if config is None:
            try:
                config = _config.resolve()
            except ValueError as exc:
                errors.append(str(exc))
        target_info = {}
        for name, target in _registry.items():
            state, detail = target_state(name)
            target_info[name] = {
                "option": target.option,
                "module": target.module,
                "state": state,
                "detail": detail,
                "attributes": [r.where for r in _journal.records(name)],
                "changes": [c.where for c in _journal.changes(name)],
            }
            patcher = sys.modules.get(target.patcher)
            if state == "patched" and hasattr(patcher, "describe"):
                target_info[name]["details"] = patcher.describe()
            if patcher is not None and hasattr(patcher, "self_checks"):
                target_info[name]["self_checks"] = patcher.self_checks()
        return {
            "patched": _active is not None,
            "options": config.as_dict() if config is not None else {},
            "targets": target_info,
            "warnings": errors + (_stale_bindings() if _active is not None else []),
            # where the run's time went and the advice it gives, with the breakdown option on
            "breakdown": target_info.get("breakdown", {}).get("details"),
        }


# --- the built-in targets -------------------------------------------------------------

# first: a GPU script's tensors and models are on the CPU before any other target sees them
register(Target(name="cuda_to_cpu", option="cuda_to_cpu", module="torch", patcher="nanopatch.targets.cuda.patch"))
register(
    Target(
        name="cuda_extensions",
        option="cuda_to_cpu",
        module="torch.utils.cpp_extension",
        patcher="nanopatch.targets.cuda.patch",
    )
)
register(Target(name="vision", option="vision", module="torchvision", patcher="nanopatch.targets.vision.patch"))
register(Target(name="training", option="training", module="torch", patcher="nanopatch.targets.training.patch"))
register(Target(name="distributed", option="data_parallel", module="torch", patcher="nanopatch.targets.parallel.patch"))
for _name, _module in (("lightning", "lightning.pytorch"), ("pytorch_lightning", "pytorch_lightning")):
    register(Target(name=_name, option="data_parallel", module=_module, patcher="nanopatch.targets.parallel.lightning"))
del _name, _module
# last: it times what the others accelerate
register(Target(name="breakdown", option="breakdown", module="torch", patcher="nanopatch.targets.breakdown.patch"))
