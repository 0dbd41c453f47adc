"""Run tests on several torch/torchvision pairs in turn, one fresh virtual environment at a time.

tox's ``between`` env runs the learning tests on the torch minors between the ones the full
suite runs on. Each pair gets a new venv under WORKDIR with the pair, nanopatch (with the
``test`` and ``frameworks`` extras) and nothing else, the tests run there, and the venv is
deleted before the next pair is installed: a torch install with its CUDA libraries takes
5-7 GB, so only one exists at a time. With ``uv`` on the PATH (CI installs tox-uv) the venvs
are uv's, whose cache keeps each downloaded file for the next pair; else venv and pip. Every
pair runs even when an earlier one fails; the exit status is non-zero if any failed.

    python tests/helpers/run_on_torch_versions.py WORKDIR TORCH/TORCHVISION [...] -- PYTEST_ARGS...

A test file named in PYTEST_ARGS that does not exist is left out, with a line saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(command: list[str], **kwargs) -> int:
    print("+", " ".join(command), flush=True)
    return subprocess.call(command, **kwargs)


def install_and_test(workdir: Path, torch: str, torchvision: str, pytest_args: list[str]) -> tuple[bool, str]:
    venv = workdir / f"torch-{torch}"
    shutil.rmtree(venv, ignore_errors=True)
    python = str(venv / "bin" / "python")
    # the venv's own console scripts first, as if it were activated
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": os.pathsep.join([str(venv / "bin"), os.environ["PATH"]])}
    started = time.monotonic()
    uv = shutil.which("uv")
    try:
        create = [uv, "venv", "--quiet", "--python", sys.executable] if uv else [sys.executable, "-m", "venv"]
        if run([*create, str(venv)]) != 0:
            return False, "could not create a venv"
        installer = [uv, "pip", "install", "--python", python] if uv else [python, "-m", "pip", "install"]
        install = [*installer, "--quiet", f"torch=={torch}", f"torchvision=={torchvision}"]
        if run([*install, f"{ROOT}[test,frameworks]"], env=env) != 0:
            return False, "pip install failed"
        installed = time.monotonic()
        code = run([python, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args], cwd=ROOT, env=env)
        tested = time.monotonic()
        timing = f"install {installed - started:.0f} s, tests {tested - installed:.0f} s"
        return code == 0, ("passed, " if code == 0 else f"pytest exited {code}, ") + timing
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    workdir, pairs, pytest_args = Path(argv[0]), argv[1:split], argv[split + 1 :]
    kept = []
    for arg in pytest_args:
        if arg.endswith(".py") and not (ROOT / arg).exists():
            print(f"{arg} does not exist: not run", flush=True)
        else:
            kept.append(arg)
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for pair in pairs:
        torch, torchvision = pair.split("/")
        print(f"=== torch {torch} + torchvision {torchvision}", flush=True)
        ok, how = install_and_test(workdir, torch, torchvision, kept)
        results.append((ok, f"torch {torch} + torchvision {torchvision}: {how}"))
        print(results[-1][1], flush=True)
    print("\n".join(["=== summary", *(line for _, line in results)]), flush=True)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
