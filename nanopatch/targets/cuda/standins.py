"""What ``torch.cuda``'s queries and objects become under ``--cuda-to-cpu``: answers from this
process and this CPU, and do-nothing stand-ins where the GPU notion has no CPU meaning that
could change a result (streams, events, device scopes).

Nothing here patches anything: :mod:`.patch` installs these through the engine's journal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import time
from typing import Any

#: the prefix of every error for a CUDA call that has no CPU equivalent
NO_CPU = "nanopatch --cuda-to-cpu: {what} has no CPU equivalent"


class NoCpuEquivalent(RuntimeError):
    """A CUDA call that cannot mean anything on a CPU (CUDA graphs, stream priorities, custom
    CUDA kernels): the script has to be changed there."""

    def __init__(self, what: str, hint: str = "") -> None:
        message = NO_CPU.format(what=what)
        super().__init__(f"{message}; {hint}" if hint else message)
        self.what = what


def refuse(what: str, hint: str = "", as_class: bool = False) -> Any:
    """A callable that raises :class:`NoCpuEquivalent` for ``what`` when called; with
    ``as_class`` a class whose instantiation raises it, so that where ``what`` is a class it
    still serves as one in annotations (``torch.cuda.CUDAGraph | None``) and ``isinstance``."""
    name = what.rsplit(".", 1)[-1]

    def no_cpu_equivalent(*args: Any, **kwargs: Any) -> Any:
        raise NoCpuEquivalent(what, hint)

    if as_class:
        return type(
            name, (), {"__new__": no_cpu_equivalent, "__module__": __name__, "__doc__": NO_CPU.format(what=what)}
        )
    no_cpu_equivalent.__qualname__ = no_cpu_equivalent.__name__ = name
    return no_cpu_equivalent


# --- memory: the process's own figures ------------------------------------------------

_STATUS = "/proc/self/status"


def _status_bytes(field: str) -> int | None:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status, in bytes (None where there is none)."""
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes() -> int:
    """The process's resident memory now (what ``memory_allocated()`` answers)."""
    found = _status_bytes("VmRSS")
    return found if found is not None else peak_bytes()


def peak_bytes() -> int:
    """The process's peak resident memory since start or the last :func:`reset_peak`."""
    found = _status_bytes("VmHWM")
    return found if found is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak(device: Any = None) -> None:
    """``reset_peak_memory_stats()``: Linux resets the peak (VmHWM) to the current resident
    size when ``5`` is written to /proc/self/clear_refs (elsewhere the peak stays the
    process's peak)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def memory_allocated(device: Any = None) -> int:
    return resident_bytes()


def max_memory_allocated(device: Any = None) -> int:
    return peak_bytes()


def total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return 0


def _available_memory() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(total_memory() - resident_bytes(), 0)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes, as ``torch.cuda.mem_get_info`` answers for a GPU."""
    return _available_memory(), total_memory()


def memory_stats(device: Any = None) -> dict[str, int]:
    """The keys scripts read most from ``torch.cuda.memory_stats()``."""
    now, peak = resident_bytes(), peak_bytes()
    return {
        "allocated_bytes.all.current": now,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": now,
        "reserved_bytes.all.peak": peak,
        "active_bytes.all.current": now,
        "active_bytes.all.peak": peak,
    }


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    return (
        "nanopatch --cuda-to-cpu: the process's resident memory "
        f"{resident_bytes() / 2**20:.1f} MiB, peak {peak_bytes() / 2**20:.1f} MiB"
    )


def nothing(*args: Any, **kwargs: Any) -> None:
    """``synchronize``, ``empty_cache``, ``manual_seed_all``...: nothing to do on a CPU."""
    return None


# --- the device ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CpuDeviceProperties:
    """What ``torch.cuda.get_device_properties()`` answers: this CPU, with no CUDA
    architecture (major, minor 0)."""

    name: str
    total_memory: int
    multi_processor_count: int
    major: int = 0
    minor: int = 0
    is_integrated: bool = True
    is_multi_gpu_board: bool = False
    uuid: str = "cpu"


def device_name(model_name: str) -> str:
    return f"CPU via nanopatch --cuda-to-cpu ({model_name or 'unknown model'})"


def device_properties(model_name: str) -> CpuDeviceProperties:
    return CpuDeviceProperties(device_name(model_name), total_memory(), os.cpu_count() or 1)


class DeviceScope(contextlib.AbstractContextManager):
    """``torch.cuda.device(i)`` / ``device_of(t)``: a scope with nothing to switch."""

    def __init__(self, device: Any = None) -> None:
        self.idx = 0

    def __exit__(self, *exc: Any) -> None:
        return None


class DeviceOf(DeviceScope):
    """``torch.cuda.device_of(tensor)``."""


# --- streams and events: one CPU stream, in order ---------------------------------------


class Stream:
    """``torch.cuda.Stream()``: the CPU runs everything in program order on one stream, so a
    stream is only a name; waiting on it is done. A priority other than 0 has no CPU meaning
    and raises."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        if priority:
            raise NoCpuEquivalent(
                "torch.cuda.Stream(priority=...)", "a CPU runs one stream in program order; drop the priority"
            )
        self.device = "cpu"
        self.priority = 0

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


_DEFAULT_STREAM = Stream()


def current_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


def stream(s: Any = None) -> contextlib.AbstractContextManager:
    """``with torch.cuda.stream(s):`` runs its body as written."""
    return contextlib.nullcontext(s)


class Event:
    """``torch.cuda.Event(enable_timing=True)``: ``record()`` notes the time, ``elapsed_time``
    gives milliseconds between two records (the CPU ran the work in between already)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kw: Any):
        self.enable_timing = enable_timing
        self._at: float | None = None

    def record(self, stream: Any = None) -> None:
        self._at = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: Event) -> float:
        if self._at is None or end._at is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end._at - self._at) * 1000.0
