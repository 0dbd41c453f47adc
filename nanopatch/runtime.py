"""CPU runtime tuning for the launcher: threads, OpenMP affinity, and a faster allocator.

:func:`plan` works out, from :class:`nanopatch.cpu.CpuFacts` and the environment, what the
runner should set before torch is imported:

* ``OMP_NUM_THREADS``: the physical cores this process may use (its affinity mask, and a
  cgroup v1/v2 CPU quota rounded down);
* OpenMP affinity for the runtime torch loads: ``GOMP_CPU_AFFINITY`` (GNU OpenMP, what
  PyPI's torch ships) or ``KMP_AFFINITY`` plus ``KMP_BLOCKTIME=1`` (Intel OpenMP), one
  thread per physical core. Threads are not pinned under a CPU quota: the quota, not a
  set of cores, is the limit there;
* an allocator: jemalloc or tcmalloc appended to ``LD_PRELOAD`` (jemalloc with the
  ``MALLOC_CONF`` IPEX's launcher uses). ``LD_PRELOAD`` is read only when a process starts,
  so this needs the interpreter re-executed once.

A variable the user set already is kept and reported, never overwritten. Nothing here
imports torch.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import cpu

ALLOCATORS = ("auto", "jemalloc", "tcmalloc", "default")

#: library file names, most specific first
_LIBRARY_NAMES = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc.so", "libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so"),
}

#: what IPEX's launcher gives jemalloc: return memory lazily, background purging, THP metadata
JEMALLOC_CONF = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)
KMP_AFFINITY = "granularity=fine,compact,1,0"

#: set by the runner in the re-executed interpreter, so it re-executes only once
REEXEC_MARKER = "NANOPATCH_RUNTIME_TUNED"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: what nanopatch sets (``value``), or the user's value it
    keeps (``kept``), and why."""

    name: str
    value: str | None
    reason: str
    kept: str | None = None

    @property
    def effective(self) -> str | None:
        return self.kept if self.kept is not None else self.value


@dataclasses.dataclass(frozen=True)
class Plan:
    settings: tuple[Setting, ...]
    threads: int
    cpus: tuple[int, ...]  # the logical CPUs the threads are pinned to, () when not pinned
    openmp: str  # "gnu", "intel", "llvm" or "unknown"
    allocator: str | None  # path of the preloaded allocator, None for the default one

    def changes(self) -> dict[str, str]:
        """The variables to set (the user's own are not in it)."""
        return {s.name: s.value for s in self.settings if s.kept is None and s.value is not None}

    @property
    def needs_reexec(self) -> bool:
        return "LD_PRELOAD" in self.changes()

    def as_dict(self) -> dict:
        return {
            "threads": self.threads,
            "pinned_cpus": list(self.cpus),
            "openmp": self.openmp,
            "allocator": self.allocator,
            "settings": [dataclasses.asdict(s) for s in self.settings],
            "needs_reexec": self.needs_reexec,
        }


# --- what is installed ----------------------------------------------------------------


def torch_library_dirs() -> list[str]:
    """Folders where the installed torch keeps its shared libraries (found without importing
    torch)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for location in spec.submodule_search_locations:
        dirs.append(os.path.join(location, "lib"))
        dirs.append(os.path.join(os.path.dirname(location), "torch.libs"))  # auditwheel's vendored copies
    return [d for d in dirs if os.path.isdir(d)]


def openmp_runtime(environ: Mapping[str, str], library_dirs: Iterable[str]) -> str:
    """The OpenMP runtime torch will run on: Intel OpenMP when it is preloaded or torch ships
    it, else GNU OpenMP (PyPI's Linux wheels), LLVM's when that is what torch ships."""
    preload = environ.get("LD_PRELOAD", "")
    if "libiomp5" in preload:
        return "intel"
    names = [os.path.basename(path) for d in library_dirs for path in glob.glob(os.path.join(d, "*.so*"))]
    for stem, label in (("libiomp5", "intel"), ("libgomp", "gnu"), ("libomp", "llvm")):
        if any(name.startswith(stem) for name in names):
            return label
    return "gnu" if sys.platform.startswith("linux") else "unknown"


def default_library_dirs(environ: Mapping[str, str]) -> list[str]:
    dirs = []
    for prefix in (environ.get("CONDA_PREFIX"), sys.prefix, sys.base_prefix):
        if prefix:
            dirs.append(os.path.join(prefix, "lib"))
    dirs += ["/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
    return list(dict.fromkeys(dirs))


def ldconfig_libraries() -> dict[str, str]:
    """name -> path from the dynamic linker's cache (empty when ldconfig is unavailable)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep:
            found.setdefault(name.split(" ", 1)[0], path.strip())
    return found


def find_allocator(name: str, dirs: Sequence[str] | None = None, cache: Mapping[str, str] | None = None) -> str | None:
    """Path of the jemalloc/tcmalloc shared library, or None."""
    dirs = default_library_dirs(os.environ) if dirs is None else dirs
    for filename in _LIBRARY_NAMES[name]:
        for d in dirs:
            path = os.path.join(d, filename)
            if os.path.isfile(path):
                return path
    cache = ldconfig_libraries() if cache is None else cache
    for filename in _LIBRARY_NAMES[name]:
        if filename in cache:
            return cache[filename]
    return None


# --- the plan -------------------------------------------------------------------------


def plan(
    facts: cpu.CpuFacts,
    environ: Mapping[str, str],
    openmp: str,
    allocator: str = "auto",
    cpus: Sequence[int] | None = None,
    finder: Callable[[str], str | None] = find_allocator,
) -> Plan:
    """What to set for one process that may run on ``cpus`` (default: all it is allowed)."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator {allocator!r}: use one of {', '.join(ALLOCATORS)}")
    settings: list[Setting] = []

    def choose(name: str, value: str | None, reason: str) -> None:
        user = environ.get(name)
        if user is not None and user != "":
            settings.append(Setting(name, value, "set by you: kept", kept=user))
        else:
            settings.append(Setting(name, value, reason))

    cores = _cores_of(facts, cpus)
    threads = max(1, len(cores))
    why = f"{threads} physical core(s) in this process's CPU set"
    quota_limited = facts.cpu_quota is not None and cpus is None and facts.usable_cores < threads
    if quota_limited:
        threads = facts.usable_cores
        why = f"a cgroup CPU quota of {facts.cpu_quota:g} CPUs allows {threads} core(s)"
    choose("OMP_NUM_THREADS", str(threads), why)

    pinned: tuple[int, ...] = ()
    if quota_limited:
        reason = "not pinned: under a CPU quota the scheduler, not a core set, limits this process"
    else:
        pinned = tuple(core[0] for core in cores[:threads])
        reason = "one OpenMP thread per physical core, hyperthread siblings left free"
    if openmp == "intel":
        choose("KMP_AFFINITY", None if quota_limited else KMP_AFFINITY, reason)
        choose("KMP_BLOCKTIME", "1", "Intel OpenMP: threads sleep 1 ms after a parallel region, not 200")
    elif openmp == "gnu":
        choose("GOMP_CPU_AFFINITY", None if quota_limited else _cpu_list(pinned), reason)
    else:
        settings.append(Setting("OMP_PROC_BIND", None, f"OpenMP runtime {openmp}: affinity left alone"))

    path = None
    if allocator != "default":
        candidates = ("jemalloc", "tcmalloc") if allocator == "auto" else (allocator,)
        found = [(name, finder(name)) for name in candidates]
        name, path = next(((n, p) for n, p in found if p), (None, None))
        preload = environ.get("LD_PRELOAD", "")
        if path is None:
            settings.append(
                Setting("LD_PRELOAD", None, f"no {' or '.join(candidates)} library found: default allocator")
            )
        elif path in preload.split(os.pathsep) + preload.split():
            settings.append(Setting("LD_PRELOAD", None, f"{name} is preloaded already", kept=preload))
        else:
            joined = f"{preload}{os.pathsep if preload else ''}{path}"
            settings.append(Setting("LD_PRELOAD", joined, f"{name} appended to LD_PRELOAD"))
            if name == "jemalloc":
                choose("MALLOC_CONF", JEMALLOC_CONF, "jemalloc settings IPEX's launcher uses")
    return Plan(tuple(settings), threads, pinned, openmp, path)


def _cores_of(facts: cpu.CpuFacts, cpus: Sequence[int] | None) -> tuple[tuple[int, ...], ...]:
    if cpus is None:
        return facts.cores or tuple((c,) for c in facts.allowed_cpus)
    wanted = set(cpus)
    cores = tuple(tuple(c for c in core if c in wanted) for core in facts.cores)
    cores = tuple(core for core in cores if core)
    known = {c for core in cores for c in core}
    return cores + tuple((c,) for c in sorted(wanted - known))


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def format_plan(p: Plan) -> str:
    lines = [f"runtime: {p.threads} thread(s), OpenMP {p.openmp}, allocator {p.allocator or 'default'}"]
    for s in p.settings:
        shown = s.effective if s.effective is not None else "(unset)"
        lines.append(f"  {s.name}={shown}  # {s.reason}")
    if p.needs_reexec:
        lines.append("  (the interpreter is re-executed once so that LD_PRELOAD takes effect)")
    return "\n".join(lines)
