"""The public surface is where the README and docs/ say it is: every ``nanopatch...`` name and
every ``from nanopatch... import ...`` they give imports from that very path, and the public
modules are the package's own modules under a second name, not copies."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys

import pytest

import nanopatch

from conftest import REPO_ROOT

#: the README and every page of docs/: what users read
README = "\n".join(path.read_text() for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))])

#: the public modules that stand for a module of a layer (docs/architecture.md)
PUBLIC_MODULES = {
    "nanopatch.learning": "nanopatch.foundation.learning",
    "nanopatch.lightning": "nanopatch.compat.lightning",
    "nanopatch.cuda.standins": "nanopatch.targets.cuda.standins",
}

LIGHTNING = ("lightning", "pytorch_lightning")

#: what the package itself offers (``from nanopatch import *``)
PACKAGE_NAMES = {
    "patch_torch",
    "unpatch_torch",
    "patched",
    "unpatched",
    "status",
    "is_patched",
    "TorchNano",
    "nano",
    "NanopatchWarning",
    "__version__",
}


def readme_names() -> set[str]:
    """Every dotted ``nanopatch.X`` the README and docs/ name, and ``M.N`` for each ``from M import N``."""
    names = set(re.findall(r"(?<![\w.\[])nanopatch(?:\.\w+)+", README))
    for module, imported in re.findall(r"from (nanopatch[\w.]*) import ([\w, ]+)", README):
        names.update(f"{module}.{name.strip()}" for name in imported.split(",") if name.strip())
    return names


def resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted`` and read the rest as attributes."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as exc:
            if exc.name is None or not ".".join(parts[:end]).startswith(exc.name):
                raise
            continue
        for attr in parts[end:]:
            found = getattr(found, attr)
        return found
    raise ImportError(dotted)


def test_the_readme_names_the_public_surface():
    names = readme_names()
    assert {"nanopatch.patch_torch", "nanopatch.learning", "nanopatch.cuda.standins.NoCpuEquivalent"} <= names
    assert "nanopatch.lightning.Trainer" in names  # from its `from nanopatch.lightning import Trainer`
    assert "nanopatch.TorchNano" in names


@pytest.mark.parametrize("dotted", sorted(readme_names()))
def test_every_name_the_readme_gives_imports_from_its_path(dotted):
    if dotted == "nanopatch.lightning.Trainer" and not any(map(importlib.util.find_spec, LIGHTNING)):
        pytest.skip("Lightning is not installed: the Trainer is Lightning's")
    assert resolve(dotted) is not None


def test_the_package_offers_its_names():
    assert set(nanopatch.__all__) == PACKAGE_NAMES
    for name in PACKAGE_NAMES:
        assert getattr(nanopatch, name) is not None, name


@pytest.mark.parametrize(("public", "real"), sorted(PUBLIC_MODULES.items()))
def test_a_public_module_is_its_layers_module(public, real):
    module = importlib.import_module(public)
    assert module is importlib.import_module(real)
    assert sys.modules[public] is module
    parent, _, last = public.rpartition(".")
    assert getattr(importlib.import_module(parent), last) is module


def test_public_paths_in_a_fresh_interpreter():
    """Imported first, before anything of the package's, each public path still gives the same
    objects as the real one (here nothing is imported yet, unlike in the test process)."""
    code = (
        "import nanopatch.learning as a, nanopatch.foundation.learning as b\n"
        "assert a is b and a.Recorder is b.Recorder\n"
        "from nanopatch.cuda.standins import NoCpuEquivalent as E\n"
        "from nanopatch.targets.cuda.standins import NoCpuEquivalent as F\n"
        "assert E is F and issubclass(E, RuntimeError)\n"
        "import nanopatch.lightning, nanopatch.compat.lightning as c; assert nanopatch.lightning is c\n"
        "from nanopatch import TorchNano, nano; import nanopatch.compat.torch_nano as t\n"
        "assert TorchNano is t.TorchNano and nano is t.nano\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


@pytest.mark.parametrize("entry", [["nanopatch", "--help"], ["nanopatch._stock"]])
def test_the_readme_entries_run(entry):
    """``python -m nanopatch`` and ``python -m nanopatch._stock`` (the README's commands) start:
    the runner prints its help; the stock run, given no script, says so with a usage error."""
    out = subprocess.run([sys.executable, "-m", *entry], capture_output=True, text=True, timeout=300)
    if entry[0] == "nanopatch":
        assert out.returncode == 0 and out.stdout.startswith("usage: python -m nanopatch"), out.stderr
    else:
        assert out.returncode == 2 and "nanopatch._stock: no script or -m module to run" in out.stderr
