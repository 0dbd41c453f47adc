"""Start-up hook for processes launched under ``python -m nanopatch`` (see __init__.py here).

It runs before anything else in every Python process whose ``PYTHONPATH`` holds this folder, so
it uses nothing but the standard library until it has decided that the process is one of the
run's own: a Python of another environment (the system ``python3`` behind a tool the script
calls, another venv, another version) is left exactly as it is, not patched, its CPUs and
threads untouched. A process of the run's environment runs the nanopatch this file belongs to,
the copy the run started with, whichever other copy its ``sys.path`` would find first, and
without putting that copy's parent folder (for an installed copy, a whole site-packages) on its
path. Last, the ``sitecustomize`` this one shadows, if the environment has one, runs as it would
have without nanopatch."""

import os
import sys

#: the interpreter environment (``sys.prefix``) of the run, as the runner exports it
_PREFIX_VARIABLE = "NANOPATCH_PREFIX"
#: the tail of a bootstrap folder's path, in any copy of nanopatch
_BOOTSTRAP_TAIL = os.sep + os.path.join("nanopatch", "runner", "_bootstrap")


def _same_environment():
    """Whether this process runs in the interpreter environment of the run (always, where the
    runner did not say which that is)."""
    prefix = os.environ.get(_PREFIX_VARIABLE)
    return not prefix or os.path.realpath(prefix) == os.path.realpath(sys.prefix)


def _load_package(package_dir):
    """Import the nanopatch package in ``package_dir``: through ``sys.path`` where that finds
    this very copy, else from its folder directly."""
    import importlib.util

    found = importlib.util.find_spec("nanopatch")
    origin = getattr(found, "origin", None)
    if origin and os.path.realpath(os.path.dirname(origin)) == os.path.realpath(package_dir):
        import nanopatch  # noqa: F401 - the same copy, found the ordinary way

        return
    init = os.path.join(package_dir, "__init__.py")
    spec = importlib.util.spec_from_file_location("nanopatch", init, submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules["nanopatch"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("nanopatch", None)
        raise


def _is_bootstrap(entry, here):
    folder = os.path.realpath(os.path.abspath(entry or os.curdir))
    return folder == here or folder.endswith(_BOOTSTRAP_TAIL)


def _chain(here):
    """Run the ``sitecustomize`` this one shadows, if the environment has one: the first on
    ``sys.path`` that is no nanopatch bootstrap's (of this copy or of any other, so that two
    copies' bootstraps on one path never hand over to each other)."""
    import importlib.machinery
    import importlib.util

    path = [entry for entry in sys.path if not _is_bootstrap(entry, here)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as CPython does for a failing sitecustomize: report, go on
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


def _nanopatch_bootstrap():
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    if _same_environment():
        try:
            _load_package(os.path.dirname(os.path.dirname(here)))
            import nanopatch.runner._bootstrap as boot
        except Exception as exc:
            sys.stderr.write(f"nanopatch: this process runs unpatched: {type(exc).__name__}: {exc}\n")
        else:
            boot.start_child()
    _chain(here)


_nanopatch_bootstrap()
del _nanopatch_bootstrap
