"""What a user or a tool reads from nanopatch stays as it was unless a change means it to: the
runner's ``--help`` (word for word), the rows of ``--info`` and the keys of ``--info --json``
(their values are this machine's facts), and ``nanopatch.status()`` after a small training run
with every option given (word for word: every target's state, each attribute it replaced, what
it found and checked). Each is compared with a snapshot in ``tests/fixtures/golden/``.

A change that means to alter one of them regenerates the snapshots and shows the difference in
its commit::

    NANOPATCH_GOLDEN_WRITE=1 tox -e py -- tests/runner/test_golden_outputs.py

``status()``'s snapshot lists the attributes of torch and torchvision that the targets replace,
which differ between versions: it is compared on the pair tox's ``py`` env pins, where it was
written, and skipped on others (the same code is what their other tests check).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import REPO_ROOT, child_env, run_python

GOLDEN = REPO_ROOT / "tests" / "fixtures" / "golden"
WRITE = os.environ.get("NANOPATCH_GOLDEN_WRITE") == "1"


def compare(name: str, text: str) -> None:
    path = GOLDEN / name
    if WRITE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    expected = path.read_text()
    assert text == expected, (
        f"{name} changed (NANOPATCH_GOLDEN_WRITE=1 rewrites the snapshot; its diff belongs in the commit):\n{text}"
    )


def test_help_is_as_it_was():
    env = child_env(COLUMNS="100")
    proc = run_python(["-m", "nanopatch", "--help"], env=env, check=True, timeout=120)
    compare("help.txt", proc.stdout)


#: sections whose rows are this machine's own (what the runner would set depends on its OpenMP
#: runtime and allocators): their titles are compared, not their rows
MACHINE_ROWS = ("Runtime tuning",)


def info_rows(text: str) -> str:
    """The report's section titles and row names, one per line (a row's value is this machine's)."""
    lines: list[str] = []
    for line in text.split("\n")[1:]:
        if line and not line.startswith(" ") and not set(line) <= {"-"}:
            lines.append(line)
        elif line.startswith("  ") and not lines[-1].startswith(MACHINE_ROWS):
            match = re.fullmatch(r"  (\S.*?)(  +\S.*)?", line)
            lines.append("  " + match.group(1))
    return "\n".join(lines) + "\n"


def key_paths(value: object, prefix: str = "") -> list[str]:
    """Every key path of a JSON value (``a.b``; a list's items as ``a[]``), sorted."""
    if isinstance(value, dict):
        paths = [prefix] if prefix else []
        for key, item in value.items():
            paths += key_paths(item, f"{prefix}.{key}" if prefix else str(key))
        return sorted(set(paths))
    if isinstance(value, list):
        return sorted(set([prefix] + [p for item in value for p in key_paths(item, prefix + "[]")]))
    return [prefix]


def test_info_rows_and_json_keys_are_as_they_were():
    env = child_env(COLUMNS="100")
    table = run_python(["-m", "nanopatch", "--info"], env=env, check=True, timeout=180).stdout
    compare("info_rows.txt", info_rows(table))
    report = json.loads(run_python(["-m", "nanopatch", "--info", "--json"], env=env, check=True, timeout=180).stdout)
    # the packages and environment sections name what is installed and set here: their keys
    # are this machine's; every other key is the report's own
    for machine_keyed in ("packages", "environment"):
        report[machine_keyed] = {}
    compare("info_json_keys.txt", "\n".join(key_paths(report)) + "\n")


STATUS_SCRIPT = """
    import json, torch, torchvision
    import nanopatch
    from nanopatch.engine import config

    options = {name: False for name, kind in config.OPTIONS.items() if kind in ("bool", "tristate")}
    options.update(vision=True, training=True, channels_last=True, fast_dropout=True, breakdown=True)
    options["compile"] = False  # a choice of mode, not a switch
    nanopatch.patch_torch(**options)
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout(0.1), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(2, 3, 8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(2, 3, 8, 8)).sum().backward()
        optimizer.step()
    status = nanopatch.status()
    status.pop("breakdown")  # its seconds
    status["targets"]["breakdown"].pop("details")  # the same seconds
    print(json.dumps({"versions": [torch.__version__, torchvision.__version__], "status": status}))
"""


def test_status_after_a_small_run_is_as_it_was():
    import torch
    import torchvision

    path = GOLDEN / "status.json"
    pinned = json.loads(path.read_text())["versions"] if path.exists() and not WRITE else None
    here = [torch.__version__, torchvision.__version__]
    if pinned is not None and pinned != here:
        pytest.skip(f"status() was snapshot on torch {pinned[0]} + torchvision {pinned[1]}: this is {here}")
    proc = run_python(STATUS_SCRIPT, check=True, timeout=180)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    text = json.dumps(seen, indent=1, sort_keys=True) + "\n"
    compare("status.json", re.sub(r"\(at 0x[0-9a-f]+\)", "(at 0x...)", text))  # the objects' addresses
