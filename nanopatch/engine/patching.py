"""Applying and undoing targets, and the public API: the registry of targets, the options in
force, :func:`patch_torch` / :func:`unpatch_torch` / :func:`patched` / :func:`unpatched` and
:func:`status`.

* A **target** is one concern (``vision``, ``training``, ...), registered as a
  :class:`Registration`: its name, the option that switches it, the module whose import triggers
  it, and where its code is: a :class:`~.api.Target` subclass (``"package.module:Class"``), made
  into one instance per registration when the target first applies.
  nanopatch's own targets are registered by the targets' package; the engine names none.
* A target changes things only through the :class:`~.api.Context` its ``patch(ctx)`` gets,
  whose every change is an entry of the journal (:mod:`.journal`). ``status()`` lists them per
  target.
* Undo replays the journal in reverse (LIFO), so after :func:`unpatch_torch` every patched
  attribute ``is`` its original again, attributes that did not exist are deleted, and no
  hook or setting of nanopatch's is left.
* A target whose module is not imported yet is applied by a wrapt post-import hook when it
  is, so patching works in either import order.

All state changes happen under one re-entrant lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

from nanopatch.foundation.log import log_once

from . import config as _config
from .api import Context
from .api import Target as TargetCode
from .journal import JOURNAL, NOTSET

logger = logging.getLogger("nanopatch")


# --- the registry ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Registration:
    """One target as the engine knows it before its code is imported (see the module's docstring)."""

    name: str
    option: str  # the config option that switches this target on
    module: str  # the target is applied once this module is imported
    target: str  # "package.module:Class", the Target subclass that does the work

    def load(self) -> TargetCode:
        """The target's code: its module imported, its class made into this registration's instance."""
        module_name, _, class_name = self.target.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        if not (isinstance(cls, type) and issubclass(cls, TargetCode)):
            raise TypeError(f"{self.target} is not a nanopatch.engine.Target subclass")
        return cls(self.name)


_registry: dict[str, Registration] = {}
_code: dict[str, TargetCode] = {}  # target name -> its instance, once it first applied
_contexts: dict[str, Context] = {}  # target name -> its context, for as long as it is registered


def register(target: Registration) -> None:
    """Add a target to the registry (targets apply in registration order)."""
    if target.option not in _config.OPTIONS:
        raise ValueError(f"target {target.name!r}: unknown option {target.option!r}")
    if ":" not in target.target:
        raise ValueError(f"target {target.name!r}: {target.target!r} is not 'package.module:Class'")
    with _locked():
        if target.name in _registry and _registry[target.name] != target:
            raise ValueError(f"a different target named {target.name!r} is registered")
        _registry[target.name] = target
        _contexts.setdefault(target.name, Context(target.name))
        if _active is not None:
            _sync(target)


def unregister(name: str) -> None:
    """Remove a target, undoing it first if it is applied: :func:`register`'s pair, for code
    that registers targets of its own (a plugin, a test's demo targets); built-in targets are
    switched off by their option instead."""
    with _locked():
        target = _registry.get(name)
        if target is None:
            return
        if name in _applied:
            _undo_targets([name])
        del _registry[name]
        _states.pop(name, None)
        _code.pop(name, None)
        _contexts.pop(name, None)


def targets() -> list[Registration]:
    return list(_registry.values())


# --- engine state ---------------------------------------------------------------------

_lock = threading.RLock()
_active: _config.Config | None = None  # the configuration in force, None when unpatched
_applied: list[str] = []  # target names, in the order they were applied
_states: dict[str, tuple[str, str]] = {}  # target name -> (state, detail)
_hooked: set[str] = set()  # modules with a post-import hook waiting
_imported: list[str] = []  # imports whose targets wait for the engine's lock (_on_import)
_queue_lock = threading.Lock()  # guards _imported, never held while anything else is taken


# --- applying and undoing targets -----------------------------------------------------


def _enabled(target: Registration, config: _config.Config) -> bool:
    return bool(getattr(config, target.option))


def _sync(target: Registration, on_import: bool = False) -> None:
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
    _apply_target(target, on_import)


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
        for target in list(_registry.values()):
            if target.module == name:
                _sync(target, on_import=True)
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


def _apply_target(target: Registration, on_import: bool) -> None:
    assert _active is not None
    ctx = _contexts[target.name]
    applied = False
    try:
        code = _code.get(target.name)
        if code is None:
            code = _code[target.name] = target.load()
        problem = version_problem(code.supported)
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
        ctx.begin(_active, on_import)
        code.patch(ctx)
        applied = True
    except BaseException as exc:
        JOURNAL.undo(target.name)  # no half-applied target
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
        ctx.end(applied)
    _applied.append(target.name)
    count = len(JOURNAL.records(target.name))
    _states[target.name] = ("patched", f"{count} attribute(s) replaced")


def _undo_targets(names: Iterable[str]) -> None:
    for name in reversed(list(names)):
        ctx = _contexts[name]
        try:
            _code[name].unpatch(ctx)
        except Exception:
            logger.exception("%s unpatch() failed; restoring its attributes anyway", name)
        JOURNAL.undo(name)
        ctx.undone()
        _applied.remove(name)
        _states[name] = ("unpatched", "")


# --- the public API (re-exported by nanopatch/__init__.py) ----------------------------


def patch_torch(**options: Any) -> None:
    config = _config.resolve(options)
    with _locked():
        _activate(config)


patch_torch.__doc__ = f"""Apply every enabled patch. Calling it again with the same options does nothing; with
    different options the patches are re-applied with the new ones.

    Each option not given falls back to its ``NANOPATCH_<NAME>`` environment variable, then to
    its default or auto-detection (in brackets); a bad value raises ValueError, an unknown
    name TypeError:

{_config.docstring_lines()}
    """


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
    for record in JOURNAL.records():
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
                "attributes": [r.where for r in JOURNAL.records(name)],
                "changes": [c.where for c in JOURNAL.changes(name)],
            }
            code = _code.get(name)
            if code is not None and state == "patched" and code.describes():
                target_info[name]["details"] = code.describe()
            if code is not None and code.checks_itself():
                target_info[name]["self_checks"] = code.self_checks()
        return {
            "patched": _active is not None,
            "options": config.as_dict() if config is not None else {},
            "targets": target_info,
            "warnings": errors + (_stale_bindings() if _active is not None else []),
            # where the run's time went and the advice it gives, with the breakdown option on
            "breakdown": target_info.get("breakdown", {}).get("details"),
        }
