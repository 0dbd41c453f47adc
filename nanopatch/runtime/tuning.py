"""CPU runtime tuning for the launcher: threads, OpenMP affinity, and a faster allocator.

:func:`plan` works out, from :class:`nanopatch.foundation.cpu.CpuFacts` and the environment, what the
runner should set before torch is imported:

* ``OMP_NUM_THREADS``: the physical cores this process may use (its affinity mask, and a
  cgroup v1/v2 CPU quota rounded down);
* ``KMP_BLOCKTIME=1`` for Intel OpenMP (its threads sleep soon after a parallel region);
* OpenMP affinity (``pin=True``, the runner's default; ``--no-pin-threads`` turns it off):
  ``GOMP_CPU_AFFINITY`` (GNU OpenMP, what PyPI's torch ships) or ``KMP_AFFINITY`` (Intel
  OpenMP), one thread per physical core, the main thread included. The main thread is
  thread 0 of every parallel region and stays pinned: left free beside pinned workers, the
  scheduler puts it on a worker's CPU whenever other work shares the machine, and the two
  then take turns at every barrier. The price: threads the main thread starts share its
  CPU (processes it starts get the whole set back, see :func:`keep_children_unpinned`).
  Never pinned under a CPU quota: the quota, not a set of cores, is the limit there;
* an allocator appended to ``LD_PRELOAD``: tcmalloc when installed (``auto``), or jemalloc
  (with the ``MALLOC_CONF`` IPEX's launcher uses) when asked for. ``LD_PRELOAD`` is read only when a process starts,
  so this needs the interpreter re-executed once.

A variable the user set already is kept and reported, never overwritten. Nothing here
imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import inspect
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from nanopatch.foundation import cpu

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


def mapped_libraries(maps_path: str = "/proc/self/maps") -> list[str] | None:
    """Paths of the shared libraries mapped into this process (sorted), or None when its memory
    map cannot be read."""
    try:
        with open(maps_path) as maps:
            return sorted({line.split()[-1] for line in maps if ".so" in line})
    except OSError:
        return None


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


def ldconfig_libraries(listing: str | None = None) -> dict[str, str]:
    """name -> path from the dynamic linker's cache (``ldconfig -p``, or ``listing``: its
    output), of this interpreter's architecture only: a multiarch host lists an i386 copy of a
    library beside the x86-64 one, which cannot be preloaded here (empty when ldconfig is
    unavailable)."""
    if listing is None:
        try:
            listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
    entries = []  # (name, ldconfig's tag such as "libc6,x86-64", path)
    for line in listing.splitlines():
        head, sep, path = line.strip().partition(" => ")
        if sep:
            name, _, tag = head.partition(" ")
            entries.append((name, tag.strip(), path.strip()))
    # ldconfig tags each library with its architecture: this interpreter's tag is the one of the C
    # library it can load, so a header is read for that library alone, not for every entry (540
    # of them here took 180 ms at every start); without it, each entry's own header decides
    ours = next((tag for name, tag, path in entries if name == "libc.so.6" and not foreign_binary(path)), None)
    found: dict[str, str] = {}
    for name, tag, path in entries:
        if name not in found and (tag == ours if ours is not None else not foreign_binary(path)):
            found[name] = path
    return found


def _elf_machine(path: str) -> tuple[int, int, bytes] | None:
    """(class, byte order, machine) of an ELF file's header; None for a file that is none."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    return header[4], header[5], header[18:20]


@functools.cache
def _own_machine() -> tuple[int, int, bytes] | None:
    return _elf_machine(os.path.realpath(sys.executable))


def foreign_binary(path: str) -> bool:
    """Whether ``path`` is a shared library of another architecture than this interpreter's
    (an i386 ``libtcmalloc`` on an x86-64 host, say), which the dynamic linker would refuse to
    preload; a file whose header cannot be read is not judged foreign."""
    ours = _own_machine()
    theirs = _elf_machine(path)
    return ours is not None and theirs is not None and ours != theirs


def find_allocator(name: str, dirs: Sequence[str] | None = None, cache: Mapping[str, str] | None = None) -> str | None:
    """Path of the jemalloc/tcmalloc shared library, or None."""
    dirs = default_library_dirs(os.environ) if dirs is None else dirs
    for filename in _LIBRARY_NAMES[name]:
        for d in dirs:
            path = os.path.join(d, filename)
            if os.path.isfile(path) and not foreign_binary(path):
                return path
    cache = ldconfig_libraries() if cache is None else cache
    for filename in _LIBRARY_NAMES[name]:
        if filename in cache:
            return cache[filename]
    return None


# --- the plan -------------------------------------------------------------------------


#: :func:`_choose` with the environment and nanopatch's own names given: (name, value, reason) to a Setting
_Chooser = Callable[[str, str | None, str], Setting]


def plan(
    facts: cpu.CpuFacts,
    environ: Mapping[str, str],
    openmp: str,
    allocator: str = "auto",
    cpus: Sequence[int] | None = None,
    finder: Callable[[str], str | None] = find_allocator,
    share: int = 1,
    ours: Iterable[str] = (),
    pin: bool = True,
) -> Plan:
    """What to set for one process that may run on ``cpus`` (default: all it is allowed).

    ``share`` is the number of processes that split the cgroup CPU quota between them;
    ``ours`` names variables in ``environ`` that nanopatch itself set (in a launcher), which
    are not the user's and may be set again; ``pin`` pins OpenMP's threads, one per core."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator {allocator!r}: use one of {', '.join(ALLOCATORS)}")
    choose: _Chooser = functools.partial(_choose, environ, set(ours))
    cores = cores_of(facts, cpus)
    threads, quota_limited, why = _thread_count(facts, len(cores), share)
    settings = [choose("OMP_NUM_THREADS", str(threads), why)]
    pinned, reason = _pinning(cores[:threads], quota_limited, pin)
    settings.extend(_affinity_settings(choose, openmp, pinned, reason))
    path, allocator_settings = _allocator_settings(choose, environ, allocator, finder)
    settings.extend(allocator_settings)
    return Plan(tuple(settings), threads, pinned, openmp, path)


def _choose(environ: Mapping[str, str], ours: set[str], name: str, value: str | None, reason: str) -> Setting:
    """``name`` set to ``value`` because of ``reason``, or the user's own value kept where
    ``environ`` has a non-empty one that nanopatch did not set (``name`` not in ``ours``)."""
    user = environ.get(name)
    if user is not None and user != "" and name not in ours:
        return Setting(name, value, "set by you: kept", kept=user)
    return Setting(name, value, reason)


def _thread_count(facts: cpu.CpuFacts, core_count: int, share: int) -> tuple[int, bool, str]:
    """OpenMP's thread count for a process with ``core_count`` physical cores, whether a cgroup
    CPU quota (split ``share`` ways) cut it below the cores, and why that count."""
    threads = max(1, core_count)
    quota = facts.cpu_quota
    allowed = cpu.usable_cores(threads, None if quota is None else quota / max(1, share))
    if quota is not None and allowed < threads:
        of = f" split {share} ways" if share > 1 else ""
        return allowed, True, f"a cgroup CPU quota of {quota:g} CPUs{of} allows {allowed} core(s)"
    return threads, False, f"{threads} physical core(s) in this process's CPU set"


def _pinning(cores: Sequence[Sequence[int]], quota_limited: bool, pin: bool) -> tuple[tuple[int, ...], str]:
    """The CPUs to pin OpenMP's threads to, the first of each of ``cores`` (one core per thread),
    or () where they stay unpinned (under a CPU quota, or ``pin`` False); and why."""
    if quota_limited:
        return (), "not pinned: under a CPU quota the scheduler, not a core set, limits this process"
    if not pin:
        return (), "not pinned (--no-pin-threads): threads go where the scheduler puts them, as in stock torch"
    pinned = tuple(core[0] for core in cores)
    return pinned, "one OpenMP thread per physical core, the main thread included; hyperthread siblings left free"


def _affinity_settings(choose: _Chooser, openmp: str, pinned: tuple[int, ...], reason: str) -> list[Setting]:
    """The ``openmp`` runtime's own affinity variable, pinning to ``pinned`` (unset when it is
    empty), and Intel OpenMP's short block time; a runtime nanopatch does not know is left alone."""
    if openmp == "intel":
        return [
            choose("KMP_AFFINITY", KMP_AFFINITY if pinned else None, reason),
            choose("KMP_BLOCKTIME", "1", "Intel OpenMP: threads sleep 1 ms after a parallel region, not 200"),
        ]
    if openmp == "gnu":
        return [choose("GOMP_CPU_AFFINITY", _cpu_list(pinned) if pinned else None, reason)]
    return [Setting("OMP_PROC_BIND", None, f"OpenMP runtime {openmp}: affinity left alone")]


def _allocator_settings(
    choose: _Chooser, environ: Mapping[str, str], allocator: str, finder: Callable[[str], str | None]
) -> tuple[str | None, list[Setting]]:
    """The allocator's library to preload (``finder`` looks it up by name), None where there is
    none, and the settings for it: ``LD_PRELOAD`` with the library appended (unless preloaded
    already), and jemalloc's ``MALLOC_CONF``. Nothing for ``allocator="default"``."""
    if allocator == "default":
        return None, []
    # auto: tcmalloc only; jemalloc trains slower than glibc in bench/README's measurements,
    # so it is used only when asked for.
    candidates = ("tcmalloc",) if allocator == "auto" else (allocator,)
    found = [(candidate, finder(candidate)) for candidate in candidates]
    name, path = next(((candidate, library) for candidate, library in found if library), (None, None))
    preload = environ.get("LD_PRELOAD", "")
    if path is None:
        return None, [Setting("LD_PRELOAD", None, f"no {' or '.join(candidates)} library found: default allocator")]
    if path in preload.split(os.pathsep) + preload.split():
        return path, [Setting("LD_PRELOAD", None, f"{name} is preloaded already", kept=preload)]
    joined = f"{preload}{os.pathsep if preload else ''}{path}"
    settings = [Setting("LD_PRELOAD", joined, f"{name} appended to LD_PRELOAD")]
    if name == "jemalloc":
        settings.append(choose("MALLOC_CONF", JEMALLOC_CONF, "jemalloc settings IPEX's launcher uses"))
    return path, settings


def cores_of(facts: cpu.CpuFacts, cpus: Sequence[int] | None) -> tuple[tuple[int, ...], ...]:
    """The physical cores (each a tuple of its CPUs) among ``cpus`` (every allowed CPU when None);
    a CPU whose core is unknown counts as a core of its own."""
    if cpus is None:
        return facts.cores or tuple((c,) for c in facts.allowed_cpus)
    wanted = set(cpus)
    cores = tuple(tuple(c for c in core if c in wanted) for core in facts.cores)
    cores = tuple(core for core in cores if core)
    known = {c for core in cores for c in core}
    return cores + tuple((c,) for c in sorted(wanted - known))


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def cpu_list_text(cpus: Iterable[int]) -> str:
    """CPU numbers as a kernel-style list with ranges (``0-3,8``)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# --- several processes on one machine ---------------------------------------------------


def parse_process_cpus(text: str) -> list[tuple[int, ...]]:
    """``--cpus``: one CPU set per process. ``"0-3,4-7"`` is two processes (a comma between
    single CPUs or ranges separates processes); with semicolons each part is a full cpu
    list, ``"0,2;1,3"``."""
    text = text.strip()
    parts = text.split(";") if ";" in text else text.split(",")
    groups = []
    for part in parts:
        try:
            group = cpu.parse_cpu_list(part)
        except ValueError:
            raise ValueError(f"--cpus {text!r}: {part.strip()!r} is not a CPU list") from None
        if not group:
            raise ValueError(f"--cpus {text!r}: an empty CPU set")
        groups.append(group)
    return groups


def auto_nproc(facts: cpu.CpuFacts, cores_per_proc: int | None = None) -> int:
    """``--nproc auto``: one process per socket (OpenMP scales well within a socket and
    poorly across one), or as many as ``cores_per_proc`` allows."""
    if cores_per_proc:
        return max(1, len(cores_of(facts, None)) // cores_per_proc)
    return max(1, min(facts.sockets, len(cores_of(facts, None))))


def process_cpus(
    facts: cpu.CpuFacts, nproc: int, cores_per_proc: int | None = None, cpus: str | None = None
) -> list[tuple[int, ...]]:
    """The logical CPUs of each of ``nproc`` processes: an explicit ``--cpus`` list, else the
    allowed physical cores split in order (so a process stays on one socket where the
    numbers allow), ``cores_per_proc`` each or as evenly as possible; a core's
    hyperthread siblings go with it."""
    if cpus:
        groups = parse_process_cpus(cpus)
        if nproc and nproc != len(groups):
            raise ValueError(f"--cpus gives {len(groups)} CPU set(s) but --nproc is {nproc}")
        allowed = set(facts.allowed_cpus)
        seen: set[int] = set()
        for group in groups:
            outside = sorted(set(group) - allowed)
            if outside:
                raise ValueError(f"--cpus: CPU(s) {cpu_list_text(outside)} are not in this process's affinity mask")
            twice = sorted(seen & set(group))
            if twice:
                raise ValueError(f"--cpus: CPU(s) {cpu_list_text(twice)} are in more than one process's set")
            seen |= set(group)
        return groups
    cores = cores_of(facts, None)
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, not {nproc}")
    if cores_per_proc is not None:
        if cores_per_proc < 1:
            raise ValueError(f"--cores-per-proc must be at least 1, not {cores_per_proc}")
        if nproc * cores_per_proc > len(cores):
            raise ValueError(
                f"{nproc} processes x {cores_per_proc} cores need {nproc * cores_per_proc} physical cores; "
                f"this process may use {len(cores)}"
            )
        sizes = [cores_per_proc] * nproc
    else:
        if nproc > len(cores):
            raise ValueError(
                f"{nproc} processes need at least {nproc} physical cores; this process may use {len(cores)}"
            )
        base, extra = divmod(len(cores), nproc)
        sizes = [base + (1 if i < extra else 0) for i in range(nproc)]
    groups, start = [], 0
    for size in sizes:
        groups.append(tuple(sorted(c for core in cores[start : start + size] for c in core)))
        start += size
    return groups


def format_plan(p: Plan) -> str:
    lines = [f"runtime: {p.threads} thread(s), OpenMP {p.openmp}, allocator {p.allocator or 'default'}"]
    for s in p.settings:
        shown = s.effective if s.effective is not None else "(unset)"
        lines.append(f"  {s.name}={shown}  # {s.reason}")
    if p.needs_reexec:
        lines.append("  (the interpreter is re-executed once so that LD_PRELOAD takes effect)")
    return "\n".join(lines)


def shell_exports(p: Plan) -> str:
    """The plan as POSIX shell ``export`` lines, each with its reason as a comment, for
    ``eval "$(python -m nanopatch --init)"`` (what ``source bigdl-nano-init`` did). Values the
    user set are shown as comments and left alone. Nothing marks the variables as nanopatch's:
    in the shell they are the user's own, which a later ``python -m nanopatch`` keeps."""
    lines = [
        _comment(
            f"nanopatch: CPU runtime for {p.threads} thread(s), OpenMP {p.openmp}, allocator {p.allocator or 'default'}"
        )
    ]
    changes = p.changes()
    for s in p.settings:
        if s.name in changes:
            lines.append(f"export {s.name}={shlex.quote(changes[s.name])}  {_comment(s.reason)}")
        elif s.kept is not None:
            lines.append(_comment(f"{s.name}={shlex.quote(s.kept)}: {s.reason}"))
        else:
            lines.append(_comment(f"{s.name} not set: {s.reason}"))
    if any(name in changes for name in PIN_VARIABLES):
        lines.append(
            "# every OpenMP program started from this shell now pins its threads to these cores: run several "
            "at once with --no-pin-threads, or with python -m nanopatch --nproc"
        )
    return "\n".join(lines)


def _comment(text: str) -> str:
    """``text`` as one shell comment line: a control character in it (a newline in a value the
    user set, which would end the comment and run what follows under ``eval``) is written as an
    escape (``\\x0a``), never as itself."""
    return "# " + re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)


# --- applying a plan --------------------------------------------------------------------

#: comma-separated names of the variables nanopatch set in this environment (not the user's)
TUNED_VARIABLE = "NANOPATCH_TUNED"
#: the CPUs the processes of this run may use; a child whose main thread OpenMP pinned to one
#: CPU gets this set back
CPUS_VARIABLE = "NANOPATCH_CPUS"
#: OpenMP variables that pin the process that reads them (its main thread included)
PIN_VARIABLES = ("GOMP_CPU_AFFINITY", "KMP_AFFINITY")
#: the ``OMP_NUM_THREADS`` value nanopatch set, beside it: a process that finds the variable
#: still at this value knows it is nanopatch's, not a value the user set
THREADS_VARIABLE = "NANOPATCH_THREADS"
#: the group of sibling processes whose share ``OMP_NUM_THREADS`` already is: a process started
#: by one of them inherits the group's variables and must not divide the threads again
SHARED_VARIABLE = "NANOPATCH_SHARED"


def tuned_names(environ: Mapping[str, str]) -> set[str]:
    return {name for name in environ.get(TUNED_VARIABLE, "").split(",") if name}


def apply(p: Plan, environ: dict[str, str] | None = None, only: Iterable[str] | None = None) -> dict[str, str]:
    """Set the plan's variables (those in ``only``, if given) and record them as nanopatch's."""
    environ = os.environ if environ is None else environ
    wanted = None if only is None else set(only)
    changes = {k: v for k, v in p.changes().items() if wanted is None or k in wanted}
    environ.update(changes)
    mark(environ, changes)
    if "OMP_NUM_THREADS" in changes:
        environ[THREADS_VARIABLE] = changes["OMP_NUM_THREADS"]
    return changes


def mark(environ: dict[str, str], names: Iterable[str]) -> None:
    names = tuned_names(environ) | set(names)
    if names:
        environ[TUNED_VARIABLE] = ",".join(sorted(names))


def reexec(environ: dict[str, str] | None = None) -> None:
    """Start this interpreter again with the same command line (once: the marker stops a
    second time), so that ``LD_PRELOAD`` takes effect. Returns only if exec fails."""
    environ = os.environ if environ is None else environ
    environ[REEXEC_MARKER] = "1"
    argv = [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, environ)


def keep_children_unpinned(cpus: Sequence[int], environ: dict[str, str] | None = None) -> None:
    """Processes this one starts may use all of ``cpus``, whatever this process is pinned to.

    OpenMP affinity pins the main thread to one CPU when torch loads, and a process started
    from it inherits that mask: DataLoader workers would all share one CPU (and torch would
    warn that one worker is all the machine can take). Forked children get the set back
    here, started ones from the bootstrap, which reads it from the environment. The main
    thread itself stays pinned: freed, the scheduler would put it beside a pinned worker."""
    environ = os.environ if environ is None else environ
    environ[CPUS_VARIABLE] = cpu_list_text(cpus)
    first = not _children_cpus
    _children_cpus[:] = [set(cpus)]  # a later call (a rank after the runner) replaces the set
    if first:  # at-fork handlers cannot be removed: one for the process, reading the current set
        os.register_at_fork(after_in_child=_unpin_forked_child)


_children_cpus: list[set[int]] = []  # the CPU set forked children get back (keep_children_unpinned)


def _unpin_forked_child() -> None:
    if _children_cpus:
        try:
            os.sched_setaffinity(0, _children_cpus[0])
        except OSError:
            pass


def run_cpus(environ: Mapping[str, str] | None = None) -> set[int] | None:
    """The CPU set of the run, when the runner pinned this process's threads narrower than
    it (:func:`keep_children_unpinned`), else None."""
    text = (os.environ if environ is None else environ).get(CPUS_VARIABLE)
    if not text:
        return None
    try:
        cpus = set(cpu.parse_cpu_list(text))
    except ValueError:
        return None
    return cpus if cpus and cpus != set(os.sched_getaffinity(0)) else None


def with_run_cpus(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``wrapped`` with this thread's affinity widened to the run's CPU set and put back
    after: a check that reads the affinity (DataLoader's worker-number warning) sees what the
    process may use, not the one CPU the runner pinned the main thread to."""
    cpus = run_cpus()
    if cpus is None:
        return wrapped(*args, **kwargs)
    pinned = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    finally:
        os.sched_setaffinity(0, pinned)


def main_thread_cpu(environ: Mapping[str, str]) -> int | None:
    """The CPU the runner's OpenMP settings pin a tuned process's main thread to (OpenMP's
    thread 0: the first CPU of ``GOMP_CPU_AFFINITY``; under Intel OpenMP's compact affinity the
    run's first CPU), or None where nanopatch pinned nothing."""
    ours = tuned_names(environ)
    try:
        if "GOMP_CPU_AFFINITY" in ours:
            first = environ["GOMP_CPU_AFFINITY"].replace(" ", ",").split(",")[0]
            return int(first.split("-")[0])
        if "KMP_AFFINITY" in ours and environ.get(CPUS_VARIABLE):
            return min(cpu.parse_cpu_list(environ[CPUS_VARIABLE]))
    except (KeyError, ValueError):
        return None
    return None


def unpin_started_child(environ: dict[str, str] | None = None) -> None:
    """In a process started by a tuned one (the bootstrap calls this before torch loads):
    take the run's whole CPU set back where this process inherited its parent's pinned main
    thread (its mask is that one CPU), and drop the pinning variables nanopatch set for its
    parent, so this process's own OpenMP does not pin it to one CPU too. A mask of its own (a
    child started under ``taskset -c 1``) is kept."""
    environ = os.environ if environ is None else environ
    text = environ.get(CPUS_VARIABLE)
    if not text:
        return
    pinned = main_thread_cpu(environ)
    try:
        if pinned is not None and os.sched_getaffinity(0) == {pinned}:
            os.sched_setaffinity(0, set(cpu.parse_cpu_list(text)))
    except (OSError, ValueError):
        pass
    ours = tuned_names(environ)
    for name in PIN_VARIABLES:
        if name in ours:
            environ.pop(name, None)
    remaining = ours - set(PIN_VARIABLES)
    if remaining:
        environ[TUNED_VARIABLE] = ",".join(sorted(remaining))
    else:
        environ.pop(TUNED_VARIABLE, None)


# --- processes the script starts through subprocess ------------------------------------------

#: the name of a Python interpreter's executable (``python``, ``python3``, ``python3.11``)
_PYTHON_NAME = re.compile(r"python[\d.]*(?:\.exe)?$")
#: the tail of a nanopatch bootstrap folder on ``PYTHONPATH`` (the runner's; this floor does not
#: import the runner's module that names it)
_BOOTSTRAP_TAIL = os.sep + os.path.join("nanopatch", "runner", "_bootstrap")


def runs_bootstrap(argv: Sequence[str] | str, executable: str | None, env: Mapping[str, str]) -> bool:
    """Whether a process started with this command line and environment is a Python that runs
    the runner's bootstrap at start-up (which gives it the run's CPUs and its share of the
    threads itself): a Python interpreter, the bootstrap on its ``PYTHONPATH``, and none of
    ``-I``, ``-E`` or ``-S`` (which skip ``PYTHONPATH`` or ``sitecustomize``). A shell command
    line is not one: the shell is the child."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        return False
    argv = [os.fsdecode(word) if isinstance(word, (bytes, os.PathLike)) else str(word) for word in argv]
    program = os.fsdecode(executable) if executable else (argv[0] if argv else "")
    if not _PYTHON_NAME.match(os.path.basename(program)) and os.path.realpath(program) != os.path.realpath(
        sys.executable
    ):
        return False
    if not any(entry.rstrip(os.sep).endswith(_BOOTSTRAP_TAIL) for entry in env.get("PYTHONPATH", "").split(os.pathsep)):
        return False
    words = iter(argv[1:])
    for word in words:
        if word == "--" or not word.startswith("-") or word == "-" or word.startswith("--"):
            break
        letters = word[1:]
        for i, letter in enumerate(letters):
            if letter in "IES":
                return False
            if letter in "cm":  # the rest is the command or module: no more options
                return True
            if letter in "WX":  # takes a value: the rest of this word, or the next one
                if i == len(letters) - 1:
                    next(words, None)
                break
    return True


def environ_for_other_programs(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what the runner set for the Python it tuned: the OpenMP thread count and
    pinning, the allocator's preload (the user's own ``LD_PRELOAD`` kept) and its settings, and
    nanopatch's records of them. A program that is not a bootstrapped Python (ninja and g++ from
    ``torch.utils.cpp_extension``, ffmpeg, a ``python -I``) runs as it would without the runner."""
    out = dict(env)
    for name in tuned_names(env):
        value = out.get(name)
        if name == "LD_PRELOAD" and value and os.pathsep in value:
            out[name] = value.rsplit(os.pathsep, 1)[0]  # nanopatch appended its allocator last
        else:
            out.pop(name, None)
    for name in (TUNED_VARIABLE, THREADS_VARIABLE, SHARED_VARIABLE):
        out.pop(name, None)
    return out


def start_process_as_the_run(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Around ``subprocess.Popen.__init__`` in a tuned process: the child starts on the run's
    whole CPU set, not on the one CPU the runner pinned this process's main thread to (the
    calling thread's mask is widened for the start and put back after; ``os.register_at_fork``
    handlers never run for ``subprocess``'s fork or ``posix_spawn``), and a child that is not a
    bootstrapped Python gets none of the runner's OpenMP and allocator variables."""
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
        env = bound.arguments.get("env")
        environ = os.environ if env is None else env
        if tuned_names(environ) and not runs_bootstrap(
            bound.arguments.get("args", ()), bound.arguments.get("executable"), environ
        ):
            bound.arguments["env"] = environ_for_other_programs(environ)
            args, kwargs = bound.args, bound.kwargs
    except Exception:  # never stand in the way of starting a process
        pass
    return with_run_cpus(wrapped, instance, args, kwargs)


# --- processes the script starts: each its share of the threads ------------------------------

#: what names a launcher's group of workers: torchrun's and Lightning's rendezvous variables
GROUP_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
#: the last argument of a process started by multiprocessing's spawn method
SPAWN_ARGUMENT = "--multiprocessing-fork"

_watching_launches = False


def nanopatch_threads(environ: Mapping[str, str]) -> int | None:
    """The ``OMP_NUM_THREADS`` nanopatch set in ``environ``; None when the variable is unset or
    is not nanopatch's (the user set it, or changed it since)."""
    value = environ.get("OMP_NUM_THREADS")
    if value is None or value != environ.get(THREADS_VARIABLE) or "OMP_NUM_THREADS" not in tuned_names(environ):
        return None
    return _whole(value)


def set_threads(environ: dict[str, str], threads: int) -> None:
    """Set ``OMP_NUM_THREADS`` as nanopatch's own value."""
    environ["OMP_NUM_THREADS"] = environ[THREADS_VARIABLE] = str(threads)
    mark(environ, ["OMP_NUM_THREADS"])


def launcher_group(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """``(processes on this machine, group key)`` when a launcher started this process as one of
    several workers: ``LOCAL_WORLD_SIZE`` (torchrun), else ``WORLD_SIZE`` beside ``LOCAL_RANK``
    (Lightning's DDP launcher, which sets no local size: on several machines each process then
    gets fewer threads than it could, never more)."""
    if "LOCAL_RANK" not in environ:
        return None
    size = _whole(environ.get("LOCAL_WORLD_SIZE")) or _whole(environ.get("WORLD_SIZE"))
    if size is None:
        return None
    return size, "launcher:" + ",".join(environ.get(name, "") for name in GROUP_VARIABLES)


def take_share(environ: dict[str, str], siblings: int, group: str) -> int | None:
    """Make nanopatch's ``OMP_NUM_THREADS`` this process's share as one of ``siblings``
    processes of ``group``: the threads divided by ``siblings``, at least 1. Returns the new
    count, or None when nothing changed (the value is the user's, or this group's share was
    taken already, or there are no siblings)."""
    threads = nanopatch_threads(environ)
    if threads is None or siblings <= 1 or environ.get(SHARED_VARIABLE) == group:
        return None
    share = max(1, threads // siblings)
    set_threads(environ, share)
    environ[SHARED_VARIABLE] = group
    return share


def mark_shared(environ: dict[str, str]) -> None:
    """This process's threads are its launcher group's share already (a ``--nproc`` rank)."""
    group = launcher_group(environ)
    if group is not None and nanopatch_threads(environ) is not None:
        environ[SHARED_VARIABLE] = group[1]


def share_threads_in_child(environ: dict[str, str] | None = None, argv: Sequence[str] | None = None) -> None:
    """In a Python process started under the runner (the bootstrap calls this before torch
    loads): when it is one of several workers, give it its share of the runner's threads.

    * A torchrun or Lightning worker knows its group from the launcher's variables: the share
      is set now, so OpenMP reads it when torch loads.
    * A process started by multiprocessing's spawn method (``torch.multiprocessing.spawn``,
      which sets no variable) counts the spawned processes its parent is running now and again
      once torch is imported, and takes the larger count: the last sibling started sees the
      others now (they cannot have ended yet), the first sees the later ones by then (one
      count alone misses a sibling that ended, or has not started, when it is taken).
    * A process that starts processes of its own launcher group, as Lightning's rank 0 does
      from the script's process, takes its share when it starts them."""
    environ = os.environ if environ is None else environ
    if nanopatch_threads(environ) is None:
        return
    group = launcher_group(environ)
    if group is not None:
        take_share(environ, *group)
    elif is_spawned(sys.argv if argv is None else argv):
        seen_early = spawned_children(os.getppid())
        _after_torch_import(lambda torch: _share_with_spawned_siblings(torch, environ, seen_early))
    watch_launches()


def is_spawned(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[-1] == SPAWN_ARGUMENT


def _share_with_spawned_siblings(torch: Any, environ: dict[str, str], seen_early: int = 0) -> None:
    parent = os.getppid()
    share = take_share(environ, max(seen_early, spawned_children(parent)), f"spawn:{parent}")
    if share is not None:
        torch.set_num_threads(share)


def spawned_children(pid: int, proc: str = "/proc") -> int:
    """How many running children of process ``pid`` were started by multiprocessing's spawn method."""
    return sum(1 for child in child_pids(pid, proc) if is_spawned(_cmdline(child, proc)))


def child_pids(pid: int, proc: str = "/proc") -> set[int]:
    """The children of process ``pid``: its threads' ``children`` files, else a scan of ``/proc``."""
    found: set[int] = set()
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
        for tid in tasks:
            with open(f"{proc}/{pid}/task/{tid}/children") as f:
                found.update(int(child) for child in f.read().split())
        return found
    except (OSError, ValueError):  # a kernel without CONFIG_PROC_CHILDREN
        pass
    for entry in os.listdir(proc):
        if entry.isdigit():
            try:
                with open(f"{proc}/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 1 and fields[1] == str(pid):
                found.add(int(entry))
    return found


def _cmdline(pid: int, proc: str) -> list[str]:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def watch_launches() -> None:
    """Lightning's DDP launcher runs rank 0 in the process it is called from: it sets
    ``LOCAL_RANK`` and ``WORLD_SIZE`` there and starts the other ranks with ``subprocess.Popen``.
    An audit hook sees that start; the process then takes its share, as the ranks it starts do.
    (Lightning sets a share itself only when ``OMP_NUM_THREADS`` is unset.)"""
    global _watching_launches
    if not _watching_launches:
        _watching_launches = True
        sys.addaudithook(_on_audit)


def _on_audit(event: str, args: tuple) -> None:
    if event != "subprocess.Popen":
        return
    try:
        share = share_when_starting(os.environ, args[3])
        if share is not None and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(share)
    except Exception:  # never break the start of a process
        pass


def share_when_starting(environ: dict[str, str], child_env: Mapping[str, str] | None) -> int | None:
    """This process starts one with ``child_env`` (None: this environment): when both are in
    the same launcher group, take this process's share (see :func:`take_share`)."""
    mine = launcher_group(environ)
    if mine is None:
        return None
    theirs = launcher_group(environ if child_env is None else child_env)
    if theirs is None or theirs[1] != mine[1]:
        return None
    return take_share(environ, *mine)


def _after_torch_import(callback: Callable[[Any], None]) -> None:
    if "torch" in sys.modules:
        callback(sys.modules["torch"])
    else:
        import wrapt

        wrapt.register_post_import_hook(callback, "torch")


def _whole(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else 0
    except ValueError:
        return None
    return value if value >= 1 else None
