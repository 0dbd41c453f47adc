"""Hardware facts about the host CPU, for deciding how to train on it.

Everything here is read from Linux pseudo-files (``/proc/cpuinfo``,
``/proc/self/cgroup``, ``/sys/fs/cgroup``).  The readers are plain functions
over text or paths, with the file locations as parameters, so they can be
exercised against fixture files; nothing is read at import time.

Key answers:

* which SIMD / matrix extensions exist (AVX2, AVX-512, AMX) and whether bf16
  is native (``avx512_bf16`` / ``amx_bf16``) or would be emulated;
* how many *physical* cores this process may use, taking the affinity mask
  and any cgroup CPU quota into account -- the right value for
  ``OMP_NUM_THREADS``, since hyperthread siblings do not help dense math.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Collection, Iterable

__all__ = [
    "CpuFacts",
    "allowed_cpus",
    "bf16_reason",
    "cgroup_cpu_quota",
    "cpu_flags",
    "facts",
    "has_amx",
    "has_avx512",
    "has_native_bf16",
    "host_facts",
    "parse_cpu_list",
    "parse_cpuinfo",
    "physical_cores",
    "usable_cores",
]

# Flags worth reporting in CpuFacts.as_dict(); the full x86 list has ~150 entries.
INTERESTING_FLAGS = frozenset(
    {
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    }
)

_NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")

# arm64 /proc/cpuinfo has no vendor_id, only a numeric "CPU implementer".
_ARM_IMPLEMENTERS = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x43": "Cavium",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0xc0": "Ampere",
}


# --------------------------------------------------------------------------
# /proc/cpuinfo
# --------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """Split ``/proc/cpuinfo`` text into one dict per ``processor`` block.

    Keys and values are stripped (``"model name\\t: X"`` -> ``{"model name": "X"}``).
    Lines outside a processor block (e.g. the trailing ``Hardware``/``Revision``
    block on 32-bit ARM) are ignored.
    """
    processors: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if not line.strip():
            current = None  # a blank line ends the block
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            # Also handles blocks that are not separated by a blank line.
            current = {}
            processors.append(current)
        if current is not None:
            current[key] = value.strip()
    return processors


def cpu_flags(processors: list[dict[str, str]]) -> frozenset[str]:
    """Feature flags present on *every* processor.

    x86 lists them under ``flags``, arm64 under ``Features``.  Taking the
    intersection keeps us from using an instruction that some core (e.g. an
    E-core, or a CPU with a different microcode) lacks.
    """
    common: set[str] | None = None
    for proc in processors:
        own = set((proc.get("flags") or proc.get("Features") or "").split())
        common = own if common is None else common & own
    return frozenset(common or ())


def has_native_bf16(flags: Collection[str]) -> bool:
    """True iff the CPU executes bf16 math natively (AVX512-BF16 or AMX-BF16)."""
    return any(f in flags for f in _NATIVE_BF16_FLAGS)


def has_avx512(flags: Collection[str]) -> bool:
    """True iff the CPU has the AVX-512 foundation instructions."""
    return "avx512f" in flags


def has_amx(flags: Collection[str]) -> bool:
    """True iff the CPU has AMX tiles plus at least one AMX compute type."""
    return "amx_tile" in flags and ("amx_bf16" in flags or "amx_int8" in flags)


def bf16_reason(flags: Collection[str]) -> str:
    """One sentence explaining whether bf16 autocast would be auto-enabled."""
    native = sorted(f for f in _NATIVE_BF16_FLAGS if f in flags)
    if native:
        return f"CPU has native bf16 ({', '.join(native)})"
    if not flags:
        return (
            "CPU feature flags are unknown (no /proc/cpuinfo); "
            "native bf16 cannot be confirmed, so bf16 is not auto-enabled"
        )
    if "bf16" in flags:
        # arm64 "Features" spells it plainly (e.g. Graviton3, Neoverse V1/V2).
        return (
            "CPU has Arm bf16 instructions, but bf16 autocast is only auto-enabled "
            "on x86 CPUs with avx512_bf16 or amx_bf16"
        )
    return (
        "CPU has no native bf16 instructions (needs avx512_bf16 or amx_bf16); "
        "bf16 would be emulated and slower than fp32"
    )


def physical_cores(processors: list[dict[str, str]], cpus: Iterable[int] | None = None) -> int:
    """Number of distinct physical cores among the logical CPUs ``cpus``.

    ``cpus`` are processor numbers (as in the affinity mask); ``None`` means
    all processors.  A core is identified by its ``(physical id, core id)``
    pair -- ``core id`` alone repeats on every socket.  Processors without a
    ``core id`` (many VMs, arm64) count as one core each.  Always >= 1.
    """
    wanted = None if cpus is None else set(cpus)
    selected = [p for p in processors if wanted is None or _proc_number(p) in wanted]
    if not selected:
        # cpuinfo unavailable (or does not mention these CPUs): best guess
        # is one core per allowed logical CPU.
        return max(1, len(wanted) if wanted is not None else 0)
    cores = set()
    for p in selected:
        if "core id" in p:
            cores.add(("core", p.get("physical id", "0"), p["core id"]))
        else:
            cores.add(("cpu", p.get("processor", ""), ""))
    return max(1, len(cores))


def core_groups(processors: list[dict[str, str]], cpus: Iterable[int]) -> tuple[tuple[int, ...], ...]:
    """The logical CPUs ``cpus`` grouped by physical core (hyperthread siblings together),
    ordered by socket, then by each core's first CPU. A CPU cpuinfo does not describe, or
    one without a ``core id``, is a core of its own."""
    described = {_proc_number(p): p for p in processors}
    groups: dict[tuple[str, str], list[int]] = {}
    for number in sorted(set(cpus)):
        proc = described.get(number)
        if proc is not None and "core id" in proc:
            key = (proc.get("physical id", "0"), proc["core id"])
        else:
            key = ("", f"cpu{number}")
        groups.setdefault(key, []).append(number)
    ordered = sorted(groups.items(), key=lambda item: (item[0][0].rjust(8), item[1][0]))
    return tuple(tuple(members) for _, members in ordered)


def socket_count(processors: list[dict[str, str]], cpus: Iterable[int]) -> int:
    """Number of distinct ``physical id``s among the logical CPUs ``cpus`` (at least 1)."""
    wanted = set(cpus)
    ids = {p.get("physical id", "0") for p in processors if _proc_number(p) in wanted}
    return max(1, len(ids))


def _proc_number(proc: dict[str, str]) -> int | None:
    try:
        return int(proc.get("processor", ""))
    except ValueError:
        return None


# --------------------------------------------------------------------------
# cpu lists, affinity, cgroup quota
# --------------------------------------------------------------------------


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse a kernel cpulist such as ``"0-3,8,10-11"`` into sorted CPU numbers.

    This is the format of ``/sys/devices/system/cpu/online``, ``cpuset.cpus``
    and friends.  An empty (or whitespace-only) list gives ``()``; anything
    malformed raises ``ValueError``.
    """
    text = text.strip()
    if not text:
        return ()
    cpus: set[int] = set()
    for item in text.split(","):
        lo_s, dash, hi_s = item.strip().partition("-")
        lo = _parse_cpu_number(lo_s, text)
        hi = _parse_cpu_number(hi_s, text) if dash else lo
        if hi < lo:
            raise ValueError(f"invalid cpu list {text!r}: range {item!r} is reversed")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def _parse_cpu_number(s: str, whole: str) -> int:
    s = s.strip()
    # isdigit() rejects "", signs and whitespace that int() would accept.
    if not (s.isascii() and s.isdigit()):
        raise ValueError(f"invalid cpu list {whole!r}")
    return int(s)


def allowed_cpus() -> tuple[int, ...]:
    """Logical CPUs this process may run on (its affinity mask), sorted."""
    try:
        mask = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not available on macOS / Windows
        mask = set()
    if mask:
        return tuple(sorted(mask))
    return tuple(range(os.cpu_count() or 1))


def cgroup_cpu_quota(
    proc_self_cgroup: str = "/proc/self/cgroup",
    cgroup_root: str = "/sys/fs/cgroup",
) -> float | None:
    """CPU quota of this process in CPUs (e.g. ``3.5``), or None if unlimited/unknown.

    The quota of every ancestor cgroup applies too, so all levels from the
    process's cgroup up to the hierarchy root are checked and the smallest
    limit wins.  If the cgroup path is not visible under ``cgroup_root`` (a
    container whose own cgroup is mounted as the root), only the root is read.
    Never raises for missing or malformed files.
    """
    text = _read_text(proc_self_cgroup)
    if text is None:
        return None
    v2_path = None
    v1_entry = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier_id, controllers, path = parts
        if hier_id == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_entry = (controllers, path)

    # On hybrid systems both kinds of line exist; the cpu controller then
    # lives in the v1 hierarchy, so prefer it whenever it is mounted.
    if v1_entry is not None:
        controllers, path = v1_entry
        for name in (controllers, "cpu,cpuacct", "cpuacct,cpu", "cpu"):
            hier_root = os.path.join(cgroup_root, name)
            if os.path.isdir(hier_root):
                return _smallest_limit(_cgroup_levels(hier_root, path), _read_v1_limit)
    if v2_path is not None:
        return _smallest_limit(_cgroup_levels(cgroup_root, v2_path), _read_v2_limit)
    return None


def _cgroup_levels(root: str, path: str) -> list[str]:
    """Directories from the cgroup at ``path`` up to ``root`` (inclusive)."""
    parts = [p for p in path.strip().split("/") if p not in ("", ".")]
    if ".." in parts or not os.path.isdir(os.path.join(root, *parts)):
        return [root]
    return [os.path.join(root, *parts[:i]) for i in range(len(parts), -1, -1)]


def _smallest_limit(levels, read_limit) -> float | None:
    limits = [lim for lim in map(read_limit, levels) if lim is not None]
    return min(limits) if limits else None


def _read_v2_limit(directory: str) -> float | None:
    # cpu.max holds "<quota> <period>" in microseconds, quota "max" = unlimited.
    text = _read_text(os.path.join(directory, "cpu.max"))
    if text is None:
        return None
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    try:
        quota = int(fields[0])
        period = int(fields[1]) if len(fields) > 1 else 100_000
    except ValueError:
        return None
    return _ratio(quota, period)


def _read_v1_limit(directory: str) -> float | None:
    # cpu.cfs_quota_us is -1 when unlimited.
    quota_s = _read_text(os.path.join(directory, "cpu.cfs_quota_us"))
    period_s = _read_text(os.path.join(directory, "cpu.cfs_period_us"))
    if quota_s is None or period_s is None:
        return None
    try:
        return _ratio(int(quota_s), int(period_s))
    except ValueError:
        return None


def _ratio(quota: int, period: int) -> float | None:
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):  # ValueError covers undecodable bytes
        return None


def usable_cores(physical: int, quota: float | None) -> int:
    """Threads worth running: physical cores, capped by the cgroup quota, >= 1."""
    if quota is None or not math.isfinite(quota):
        return max(1, physical)
    # The tiny epsilon keeps e.g. 2.9999999999 (float noise) from becoming 2.
    return max(1, min(physical, math.floor(quota + 1e-9)))


# --------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CpuFacts:
    """Everything nanopatch wants to know about the CPU it trains on."""

    vendor: str
    model_name: str
    flags: frozenset[str]
    logical_cpus: int  # processors listed in cpuinfo
    allowed_cpus: tuple[int, ...]  # affinity mask
    physical_cores: int  # physical cores among allowed cpus
    cpu_quota: float | None  # cgroup quota in CPUs, None = unlimited/unknown
    usable_cores: int  # what OMP_NUM_THREADS should be
    cores: tuple[tuple[int, ...], ...]  # allowed logical CPUs grouped by physical core
    sockets: int  # sockets (physical packages) the allowed CPUs are on
    avx2: bool
    avx512: bool
    native_bf16: bool
    amx: bool
    bf16_reason: str

    def as_dict(self) -> dict:
        """JSON-friendly view; ``flags`` is reduced to the interesting ones."""
        d = dataclasses.asdict(self)
        d["flags"] = sorted(self.flags & INTERESTING_FLAGS)
        d["allowed_cpus"] = list(self.allowed_cpus)
        d["cores"] = [list(core) for core in self.cores]
        return d


def facts(
    cpuinfo_path: str = "/proc/cpuinfo",
    proc_self_cgroup: str = "/proc/self/cgroup",
    cgroup_root: str = "/sys/fs/cgroup",
    allowed: Iterable[int] | None = None,
) -> CpuFacts:
    """Collect :class:`CpuFacts` from the given files (defaults: this machine).

    ``allowed`` is the affinity mask to assume; ``None`` reads it from the OS.
    Without a readable cpuinfo (non-Linux), flags are empty and counts come
    from ``os.cpu_count()`` and the affinity mask.
    """
    text = _read_text(cpuinfo_path)
    processors = parse_cpuinfo(text) if text is not None else []
    flags = cpu_flags(processors)
    allowed_t = allowed_cpus() if allowed is None else tuple(sorted(set(allowed)))
    physical = physical_cores(processors, allowed_t)
    quota = cgroup_cpu_quota(proc_self_cgroup, cgroup_root)
    first = processors[0] if processors else {}
    return CpuFacts(
        vendor=_vendor(first),
        model_name=first.get("model name", ""),
        flags=flags,
        logical_cpus=len(processors) or os.cpu_count() or 1,
        allowed_cpus=allowed_t,
        physical_cores=physical,
        cpu_quota=quota,
        usable_cores=usable_cores(physical, quota),
        cores=core_groups(processors, allowed_t),
        sockets=socket_count(processors, allowed_t),
        avx2="avx2" in flags,
        avx512=has_avx512(flags),
        native_bf16=has_native_bf16(flags),
        amx=has_amx(flags),
        bf16_reason=bf16_reason(flags),
    )


def _vendor(proc: dict[str, str]) -> str:
    if proc.get("vendor_id"):
        return proc["vendor_id"]
    implementer = proc.get("CPU implementer", "").lower()
    return _ARM_IMPLEMENTERS.get(implementer, implementer)


@functools.lru_cache(maxsize=1)
def host_facts() -> CpuFacts:
    """:func:`facts` for this machine, computed once per process."""
    return facts()
