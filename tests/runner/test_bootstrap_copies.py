"""The child bootstrap and the runs of ``--compare`` / ``--verify`` never reach into programs
that are not the run's own:

- with two copies of nanopatch on one path (``python -m nanopatch`` from a checkout while
  another version is installed), a child runs the copy the run started with, and the
  environment's own ``sitecustomize`` still runs, once (the bootstrap found itself again, ~160
  levels deep until ``RecursionError``, and the real one never ran);
- a Python of another environment (another venv: the system ``python3`` behind a tool, say) is
  left as it is: nothing added to its ``sys.path`` (the bootstrap appended the folder above the
  package, for an installed copy the parent's whole site-packages), not patched, its CPUs as
  they were;
- the runs of ``--compare`` and ``--verify`` find this nanopatch through a folder that holds it
  alone, not the package's parent folder ahead of the user's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nanopatch
from nanopatch.runner import runs
from nanopatch.runner._bootstrap import BOOTSTRAP_DIR, PREFIX_VARIABLE

from conftest import child_env

PACKAGE = Path(nanopatch.__file__).resolve().parent

REPORT = """
import json, os, sys
mod = sys.modules.get("nanopatch")
print("REPORT " + json.dumps({
    "nanopatch": None if mod is None else os.path.realpath(mod.__file__),
    "patched": bool(mod and mod.is_patched()),
    "user_site": os.environ.get("USER_SITE_RAN"),
    "path": sys.path,
    "cpus": sorted(os.sched_getaffinity(0)),
}))
"""

USER_SITECUSTOMIZE = """
import os
os.environ["USER_SITE_RAN"] = str(int(os.environ.get("USER_SITE_RAN", "0")) + 1)
"""


def report(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


def bootstrapped(python: str, tmp_path: Path, *paths: Path, **env: str) -> subprocess.CompletedProcess:
    """``python -c REPORT`` started as the runner starts a child: its bootstrap first on
    ``PYTHONPATH`` (then ``paths``), the run's environment named."""
    environ = child_env(env)
    environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *map(str, paths)])
    environ.setdefault(PREFIX_VARIABLE, sys.prefix)
    return subprocess.run(
        [python, "-c", REPORT], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300
    )


def user_site(tmp_path: Path) -> Path:
    """A folder with a ``sitecustomize`` of the user's own, which counts its runs."""
    folder = tmp_path / "user_site"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    return folder


def another_copy(tmp_path: Path) -> Path:
    """A folder holding a second copy of the nanopatch package (an installed version, say)."""
    other = tmp_path / "other"
    shutil.copytree(PACKAGE, other / "nanopatch", ignore=shutil.ignore_patterns("__pycache__"))
    return other


def test_with_another_copy_first_on_the_path_a_child_runs_the_runs_copy_and_the_users_sitecustomize(tmp_path):
    proc = bootstrapped(sys.executable, tmp_path, another_copy(tmp_path), user_site(tmp_path))
    assert "RecursionError" not in proc.stderr, proc.stderr[-2000:]
    seen = report(proc)
    assert seen["nanopatch"] == str(PACKAGE / "__init__.py"), "the child runs another copy than the run's"
    assert seen["patched"] is True
    assert seen["user_site"] == "1", "the environment's own sitecustomize must run, once"
    assert not proc.stderr.strip(), proc.stderr


def test_two_copies_bootstraps_on_one_path_do_not_hand_over_to_each_other(tmp_path):
    """A run inside a run of another copy: both bootstrap folders on the path."""
    other = another_copy(tmp_path)
    bootstrap = other / "nanopatch" / "runner" / "_bootstrap"
    proc = bootstrapped(sys.executable, tmp_path, bootstrap, other, user_site(tmp_path))
    seen = report(proc)
    assert seen["user_site"] == "1" and seen["nanopatch"] == str(PACKAGE / "__init__.py")


def test_a_python_of_another_environment_is_left_as_it_is(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    cpus = sorted(os.sched_getaffinity(0))
    plain = report(subprocess.run([python, "-c", REPORT], capture_output=True, text=True, timeout=300, cwd=tmp_path))
    proc = bootstrapped(python, tmp_path, NANOPATCH_CPUS=",".join(map(str, cpus)))
    seen = report(proc)
    assert seen["nanopatch"] is None and seen["patched"] is False
    added = [entry for entry in seen["path"] if entry not in plain["path"] and entry != BOOTSTRAP_DIR]
    assert added == [], f"the bootstrap put {added} on a foreign Python's path"
    assert seen["cpus"] == plain["cpus"]
    assert not proc.stderr.strip(), proc.stderr  # not even a line saying it runs unpatched


def test_a_foreign_python_still_runs_its_own_sitecustomize(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    seen = report(bootstrapped(str(venv / "bin" / "python"), tmp_path, user_site(tmp_path)))
    assert seen["user_site"] == "1" and seen["nanopatch"] is None


def test_the_runs_find_this_nanopatch_through_a_folder_that_holds_it_alone(tmp_path):
    entry = Path(runs.package_path(str(tmp_path)))
    assert [p.name for p in entry.iterdir()] == ["nanopatch"]
    assert (entry / "nanopatch").resolve() == PACKAGE
    assert entry != PACKAGE.parent


def test_compare_keeps_the_users_pythonpath_first_after_nanopatch_alone(tmp_path):
    """The user's ``PYTHONPATH`` decides what both runs import, as under ``python script.py``:
    only ``nanopatch`` itself comes before it, never the package's parent folder."""
    override = tmp_path / "override"
    override.mkdir()
    (override / "mymodule.py").write_text("WHERE = 'override'\n")
    script = tmp_path / "show.py"
    script.write_text(
        "import os, mymodule\nprint('PATHS ' + os.environ.get('PYTHONPATH', ''))\nprint('WHERE ' + mymodule.WHERE)\n"
    )
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(override), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-m", "nanopatch", "--compare", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for run in ("stock", "nanopatch"):
        paths = next(line for line in proc.stdout.splitlines() if line.startswith(f"[{run}] PATHS "))
        entries = paths.split(" ", 2)[2].split(os.pathsep)
        assert str(PACKAGE.parent) not in entries[:2], (run, entries)
        assert str(override) in entries
        assert f"[{run}] WHERE override" in proc.stdout
