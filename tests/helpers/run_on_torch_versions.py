"""Run tests on several torch/torchvision pairs in turn, one fresh virtual environment at a time.

tox's ``between`` env runs the learning tests on the torch minors between the ones the full
suite runs on. Each pair gets a new venv under WORKDIR with the pair, nanopatch (with the
``test`` and ``frameworks`` extras) and nothing else, the tests run there, and the venv is
deleted once they ran. With ``uv`` on the PATH (CI installs tox-uv) the venvs are uv's, whose
cache keeps each downloaded file for the next pair and links it into the venvs, and the next
pair's venv is made and filled while a pair's tests run (downloads wait on the network, the
tests on the CPU: together they take ~15 s a pair less than in turn); else venv and pip, one at a
time (a torch install with its CUDA libraries copied takes 5-7 GB). Every
pair runs even when an earlier one fails; the exit status is non-zero if any failed.

    python tests/helpers/run_on_torch_versions.py WORKDIR TORCH/TORCHVISION [...] -- PYTEST_ARGS...

A test file named in PYTEST_ARGS that does not exist is left out, with a line saying so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(command: list[str], **kwargs) -> int:
    print("+", " ".join(command), flush=True)
    return subprocess.call(command, **kwargs)


class Venv:
    """One pair's venv under WORKDIR: made and filled by :meth:`start` (in the background where
    uv makes it), tested by :meth:`test`, deleted by :meth:`remove`."""

    def __init__(self, workdir: Path, torch: str, torchvision: str) -> None:
        self.torch, self.torchvision = torch, torchvision
        self.path = workdir / f"torch-{torch}"
        self.python = str(self.path / "bin" / "python")
        # the venv's own console scripts first, as if it were activated
        path = os.pathsep.join([str(self.path / "bin"), os.environ["PATH"]])
        self.env = {**os.environ, "VIRTUAL_ENV": str(self.path), "PATH": path}
        self.log = workdir / f"install-{torch}.log"
        self._installing: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self.alongside = False  # installed while the pair before ran its tests
        self.problem = ""

    def commands(self) -> list[list[str]]:
        uv = shutil.which("uv")
        create = [uv, "venv", "--quiet", "--python", sys.executable] if uv else [sys.executable, "-m", "venv"]
        installer = [uv, "pip", "install", "--python", self.python] if uv else [self.python, "-m", "pip", "install"]
        install = [*installer, "--quiet", f"torch=={self.torch}", f"torchvision=={self.torchvision}"]
        return [[*create, str(self.path)], [*install, f"{ROOT}[test,frameworks]"]]

    def start(self) -> None:
        """Make and fill the venv in a background process (its output kept for :meth:`wait`)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._started = time.monotonic()
        script = " && ".join(" ".join(map(shlex.quote, command)) for command in self.commands())
        print(f"+ (installing torch {self.torch} meanwhile) {script}", flush=True)
        with open(self.log, "wb") as log:
            self._installing = subprocess.Popen(["sh", "-c", script], env=self.env, stdout=log, stderr=log)

    def wait(self) -> bool:
        """Whether the venv was made and filled; its install's output printed."""
        assert self._installing is not None
        code = self._installing.wait()
        sys.stdout.write(self.log.read_text(errors="replace"))
        self.log.unlink(missing_ok=True)
        if code != 0:
            self.problem = "could not create the venv or install into it"
        return code == 0

    def test(self, pytest_args: list[str]) -> tuple[bool, str]:
        installed = time.monotonic()
        code = run([self.python, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args], cwd=ROOT, env=self.env)
        tested = time.monotonic()
        beside = " beside the tests before" if self.alongside else ""
        timing = f"install {installed - self._started:.0f} s{beside}, tests {tested - installed:.0f} s"
        return code == 0, ("passed, " if code == 0 else f"pytest exited {code}, ") + timing

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


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
    venvs = [Venv(workdir, *pair.split("/")) for pair in pairs]
    ahead = shutil.which("uv") is not None  # uv links from its cache: two venvs cost little disk
    results = []
    if venvs:
        venvs[0].start()
    for i, venv in enumerate(venvs):
        ok = venv.wait()
        if ahead and i + 1 < len(venvs):
            venvs[i + 1].alongside = True  # the next pair installs while this one's tests run
            venvs[i + 1].start()
        print(f"=== torch {venv.torch} + torchvision {venv.torchvision}", flush=True)
        try:
            ok, how = venv.test(kept) if ok else (False, venv.problem)
        finally:
            venv.remove()
        if not ahead and i + 1 < len(venvs):
            venvs[i + 1].start()
        results.append((ok, f"torch {venv.torch} + torchvision {venv.torchvision}: {how}"))
        print(results[-1][1], flush=True)
    print("\n".join(["=== summary", *(line for _, line in results)]), flush=True)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
