"""What a target is, and what its ``patch(ctx)`` gets: the only way a target changes anything.

* :class:`Target`: the base class of a target's code (one concern: ``vision``, ``training``, ...):
  the versions it supports, :meth:`Target.patch` and, with defaults, :meth:`Target.unpatch`,
  :meth:`Target.describe` and :meth:`Target.self_checks`. The engine makes one instance per
  registration (:class:`nanopatch.engine.Registration`), which names it.
* :class:`Context`: what :meth:`Target.patch` gets: the options in force (:attr:`Context.config`,
  typed) and the engine's journal bound to that target. :meth:`Context.replace`,
  :meth:`Context.replace_everywhere` and :meth:`Context.wrap` replace module and class attributes
  while ``patch`` runs; :meth:`Context.set_on`, :meth:`Context.add_hook` and
  :meth:`Context.on_undo` record every other change, at patch time or later while the target is
  applied (a target keeps its context for that). Each is an entry of the journal
  (:mod:`.journal`), undone when the target is.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .journal import JOURNAL, NOTSET, Change, raw_attribute

if TYPE_CHECKING:
    from .config import Config


class Context:
    """One registered target's handle on the engine: made once per registration, refreshed each
    time the target is applied. Every method files its change under the target's name."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: the options in force while the target is applied; None once it is undone
        self.config: Config | None = None
        #: whether it is being applied because its module was just imported (so no object of that
        #: library can exist yet)
        self.applied_on_import = False
        #: whether the target is applied now (its patch() ran and it is not undone)
        self.applied = False
        self._patching = False
        self._bindings: dict[str, tuple[int, dict[int, list[tuple[str, Any, str]]]]] = {}

    def __repr__(self) -> str:
        return f"<nanopatch target context {self.name!r}{' (applied)' if self.applied else ''}>"

    # --- the engine's side -------------------------------------------------------------------

    def begin(self, config: Config, on_import: bool) -> None:
        """The target's patch() is about to run with ``config``."""
        self.config, self.applied_on_import, self._patching = config, on_import, True

    def end(self, applied: bool) -> None:
        """Its patch() returned (``applied``) or failed; module attributes are replaced no more."""
        self._patching, self.applied = False, applied
        self._bindings.clear()  # the index holds modules and ids: only for one patch()
        if not applied:
            self.config = None

    def undone(self) -> None:
        self.applied, self.config = False, None

    # --- module and class attributes: while patch() runs --------------------------------------

    def _patch_time(self, what: str) -> None:
        if not self._patching:
            raise RuntimeError(f"nanopatch: {what}() may only be called while the target's patch() runs")

    def replace(self, owner: Any, name: str, new: Any) -> None:
        """Set ``owner.name = new``, recording the original for exact undo."""
        self._patch_time("replace")
        JOURNAL.replace(self.name, owner, name, new)

    def wrap(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> Any:
        """Wrap ``owner.name`` with a wrapt ``FunctionWrapper`` calling
        ``wrapper(wrapped, instance, args, kwargs)``; the raw descriptor is what gets wrapped."""
        import wrapt

        self._patch_time("wrap")
        original = raw_attribute(owner, name)
        if original is NOTSET:
            original = getattr(owner, name)
        wrapped = wrapt.FunctionWrapper(original, wrapper)
        JOURNAL.replace(self.name, owner, name, wrapped)
        return wrapped

    def replace_everywhere(self, original: Any, new: Any, package: str) -> list[str]:
        """Replace ``original`` with ``new`` in every loaded module of ``package`` that binds it
        (where it is defined and every namespace that re-exports it). Returns the places."""
        self._patch_time("replace_everywhere")
        places = []
        for module_name, module, attr in self._index(package).get(id(original), ()):
            if getattr(module, "__dict__", {}).get(attr) is original:
                JOURNAL.replace(self.name, module, attr, new)
                places.append(f"{module_name}.{attr}")
        return places

    def _index(self, package: str) -> dict[int, list[tuple[str, Any, str]]]:
        """id(value) -> where the package's modules bind it, built once per patch() (a target may
        replace dozens of functions) and again when more modules are loaded."""
        cached = self._bindings.get(package)
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
        self._bindings[package] = (len(sys.modules), index)
        return index

    def original(self, owner: Any, name: str) -> Any:
        """What ``owner.name`` was before this target replaced it (raw), or what it is now if the
        target has not replaced it: the journal's record, never a copy."""
        return JOURNAL.original(self.name, owner, name)

    # --- every other change: at patch time or later, while the target is applied ---------------

    def set_on(self, obj: Any, name: str, value: Any) -> None:
        """``obj.name = value`` on one of the user's objects (a model's ``forward``, a DataLoader's
        sampler): recorded once, undone when the target is (or by :meth:`restore_on`), the raw
        original put back or the attribute deleted."""
        JOURNAL.set_on(self.name, obj, name, value)

    def restore_on(self, obj: Any, name: str) -> None:
        """Undo :meth:`set_on` for ``obj.name`` now."""
        JOURNAL.restore_on(self.name, obj, name)

    def keep_on(self, obj: Any, name: str) -> None:
        """Leave ``obj.name`` as :meth:`set_on` set it, past the target's undo (what cannot be
        undone: an IPEX bf16 model keeps its autocast forward)."""
        JOURNAL.keep_on(self.name, obj, name)

    def add_hook(self, handle: Any, where: str) -> Change:
        """A hook handle (``torch.utils.hooks.RemovableHandle`` or anything with ``remove()``):
        removed when the target is undone, or by :meth:`discard`."""
        return JOURNAL.add(Change(self.name, where, handle.remove))

    def on_undo(self, undo: Callable[[], None], where: str, owner: Any = None) -> Change:
        """Any other change (a library setting, an object's flags): ``undo`` runs when the target
        is undone, or by :meth:`discard`; a change to ``owner`` is forgotten when the owner dies."""
        return JOURNAL.add(Change(self.name, where, undo), owner)

    def discard(self, change: Change, undo: bool = True) -> None:
        """Undo one :meth:`add_hook`/:meth:`on_undo` change now (``undo=False``: only forget it)."""
        JOURNAL.discard(change, undo)


class Target:
    """The code of one target. Subclass it, set :attr:`supported` and write :meth:`patch`; the
    engine makes the instance (one per registration, named by it) when the target first applies.
    """

    #: distribution -> version specifier the target is written against (outside it: left stock);
    #: nanopatch's own take theirs from :func:`nanopatch.engine.versions.supported`
    supported: ClassVar[Mapping[str, str]] = {}

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} target {self.name!r}>"

    def patch(self, ctx: Context) -> None:
        """Make the target's changes, each through ``ctx``. Raising undoes what it made."""
        raise NotImplementedError(f"{type(self).__qualname__}.patch")

    def unpatch(self, ctx: Context) -> None:
        """Forget what the target keeps besides the journal (its state); called before the
        journal undoes its entries. By default, nothing."""

    def describe(self) -> Any:
        """What the target did, as plain data for ``status()``'s ``details`` (asked only when it is
        applied, and only of a target that overrides this)."""
        return None

    def self_checks(self) -> list[dict[str, Any]]:
        """Its self-checks and their verdicts, for ``status()`` (only of a target that overrides
        this)."""
        return []

    @classmethod
    def describes(cls) -> bool:
        return cls.describe is not Target.describe

    @classmethod
    def checks_itself(cls) -> bool:
        return cls.self_checks is not Target.self_checks
