"""The version floors each built-in target declares (its class's ``supported``) are the oldest tested pair's
(engine/versions.py, the list tox tests), and pyproject.toml requires the same: a floor that
disagrees with what is tested could never fail."""

from __future__ import annotations

import importlib
import re

from nanopatch import engine
from nanopatch.engine import versions

from conftest import REPO_ROOT


def test_every_target_declares_the_oldest_tested_pair_and_pyproject_requires_it():
    oldest = versions.TESTED[0]
    floors = {
        "torch": ">=" + ".".join(oldest.torch.split(".")[:2]),
        "torchvision": ">=" + ".".join(oldest.torchvision.split(".")[:2]),
    }
    assert versions.supported("torch", "torchvision") == floors
    classes = {target.target for target in engine.targets()}
    assert len(classes) >= 6
    for name in classes:
        module, _, cls = name.partition(":")
        declared = dict(getattr(importlib.import_module(module), cls).supported)
        assert declared == {k: floors[k] for k in declared}, (name, declared)
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    for dist, floor in floors.items():
        assert re.search(rf'"{dist}{re.escape(floor)}"', pyproject), (dist, floor)
