"""Floor 2, the patch engine, in four rooms:

* ``config``: every option, resolved (an argument beats a ``NANOPATCH_*`` variable, which beats
  auto-detection);
* ``journal``: every change a target makes, and its exact undo;
* ``api``: what a target's ``patch()`` calls to change anything (each call a journal entry);
* ``patching``: the registry of targets, applying them when their library is imported and
  undoing them, and the public API (``patch_torch``, ``unpatch_torch``, ``patched``,
  ``unpatched``, ``status``);

and ``versions``, the torch versions tox tests. Their public names are re-exported here: other
packages import ``nanopatch.engine`` (or one of its rooms), never a name with a leading
underscore.
"""

from . import api, config, journal, patching, versions
from .api import (
    add_hook,
    applied_on_import,
    current_target,
    discard,
    keep_on,
    on_undo,
    original,
    replace,
    replace_everywhere,
    restore_on,
    set_on,
    wrap,
)
from .journal import JOURNAL, NOTSET, Change, Journal, Record, qualname, raw_attribute
from .patching import (
    Target,
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
    "Journal",
    "Record",
    "Target",
    "active_config",
    "add_hook",
    "api",
    "applied_on_import",
    "config",
    "current_target",
    "discard",
    "is_applied",
    "is_patched",
    "journal",
    "keep_on",
    "on_undo",
    "original",
    "patch_torch",
    "patched",
    "patching",
    "qualname",
    "raw_attribute",
    "register",
    "replace",
    "replace_everywhere",
    "restore_on",
    "set_on",
    "status",
    "target_state",
    "targets",
    "unpatch_torch",
    "unpatched",
    "unregister",
    "version_problem",
    "versions",
    "wrap",
]
