"""Running a script or ``-m`` module as ``__main__``, the way ``python script.py`` and ``python -m
module`` do: the runner runs the user's script with it, and ``--verify``'s runs do too."""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import types
import zipfile
from collections.abc import Sequence


class NoModule(Exception):
    """``-m`` names no importable module: exit code 1, as ``python -m`` uses."""


def run_script(path: str, args: Sequence[str]) -> None:
    # `python script.py` puts the script's directory first on sys.path; `python -m nanopatch`
    # put the current directory there instead, and the `nanopatch` command its bin/ folder.
    launcher_dir = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    sys.argv[:] = [path, *args]
    script_dir = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.path.abspath(path)
    if sys.path and sys.path[0] in ("", os.getcwd(), launcher_dir):
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        exec_script(path)
    else:  # a directory or zip application with a __main__.py
        runpy.run_path(path, run_name="__main__")


def exec_script(path: str) -> None:
    """Run a source file as ``__main__`` the way ``python script.py`` does: ``sys.argv[0]``
    as typed but ``__file__`` absolute (runpy would give both the same value), ``__spec__``
    None, and the module left in ``sys.modules`` for the rest of the process (atexit
    handlers, pickling of classes defined in the script, spawn children)."""
    filename = os.path.abspath(path)
    with io.open_code(filename) as source_file:
        source = source_file.read()
    code = compile(source, filename, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=filename,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", filename),
        __spec__=None,
    )
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def run_module(name: str, args: Sequence[str]) -> None:
    # alter_sys=True sets sys.argv[0] to the module's file, as `python -m` does; sys.path[0]
    # is already the current directory because we were started with -m ourselves.
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package is missing, or the name is malformed
        found = False
    if not found:
        raise NoModule(f"No module named {name}")
    sys.argv[:] = [name, *args]
    runpy.run_module(name, run_name="__main__", alter_sys=True)
