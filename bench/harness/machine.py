"""Facts about the machine and the checkout a report records: CPU, memory, packages, git state,
the source digest of nanopatch and the libraries a process mapped.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def installed(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def git_state() -> dict[str, Any]:
    """The checkout's commit, whether tracked files changed, and what changed under nanopatch/
    (untracked files too: they are what the nanopatch variants import)."""

    def git(*words: str) -> str | None:
        try:
            done = subprocess.run(["git", *words], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    changed = git("status", "--porcelain", "--untracked-files=no")
    ours = git("status", "--porcelain", "--", "nanopatch") or ""
    return {
        "commit": (git("rev-parse", "HEAD") or "").strip() or None,
        "dirty": None if changed is None else bool(changed.strip()),
        "nanopatch_changes": [line[3:] for line in ours.splitlines()],
    }


def machine_facts(*packages: str) -> dict[str, Any]:
    """CPU (from ``nanopatch.foundation.cpu``: model, cores, ISA flags, bf16/AMX), memory, the versions of
    Python, torch, torchvision, nanopatch and ``packages``, the git state and the load average."""
    from nanopatch.foundation import cpu

    facts = cpu.host_facts().as_dict()
    keep = ("vendor", "model_name", "flags", "logical_cpus", "allowed_cpus", "physical_cores", "sockets")
    return {
        **{k: facts[k] for k in keep},
        "usable_cores": facts["usable_cores"],
        "amx": facts["amx"],
        "native_bf16": facts["native_bf16"],
        "mem_total_gib": mem_total_gib(),
        "python": platform.python_version(),
        **{name: installed(name) for name in ("torch", "torchvision", "nanopatch", *packages)},
        "git": git_state(),
        "loadavg_start": load_average(),
    }


def source_digest() -> str | None:
    """A digest of nanopatch's source as the next run will import it, to see edits between rounds."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("nanopatch")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    digest = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def mapped_library(fragment: str) -> str | None:
    """Real path of a shared library mapped into this process whose file name contains ``fragment``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if fragment in os.path.basename(path):
                    return os.path.realpath(path)
    except OSError:
        pass
    return None
