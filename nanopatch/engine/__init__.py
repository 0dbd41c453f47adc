"""Floor 2, the patch engine, in four rooms:

* ``config``: every option, resolved (an argument beats a ``NANOPATCH_*`` variable, which beats
  auto-detection);
* ``journal``: every change a target makes, and its exact undo;
* ``api``: what a target is (:class:`Target`) and what its ``patch(ctx)`` gets (:class:`Context`:
  the options in force, and every change it makes, each a journal entry);
* ``patching``: the registry of targets, applying them when their library is imported and
  undoing them, and the public API (``patch_torch``, ``unpatch_torch``, ``patched``,
  ``unpatched``, ``status``);

and ``versions``, the torch versions tox tests. Their public names are re-exported here: other
packages import ``nanopatch.engine`` (or one of its rooms), never a name with a leading
underscore.
"""

from . import api, config, journal, patching, versions
from .api import Context, Target
from .journal import JOURNAL, NOTSET, Change, Journal, Record, qualname, raw_attribute
from .patching import (
    Registration,
    active_config,
    is_applied,
    is_patched,
    patch_torch,
    patched,
    register,
    status,
    target_state,
    targets,
    unpatch_torch,
    unpatched,
    unregister,
    version_problem,
)

__all__ = [
    "JOURNAL",
    "NOTSET",
    "Change",
    "Context",
    "Journal",
    "Record",
    "Registration",
    "Target",
    "active_config",
    "api",
    "config",
    "is_applied",
    "is_patched",
    "journal",
    "patch_torch",
    "patched",
    "patching",
    "qualname",
    "raw_attribute",
    "register",
    "status",
    "target_state",
    "targets",
    "unpatch_torch",
    "unpatched",
    "unregister",
    "version_problem",
    "versions",
]
