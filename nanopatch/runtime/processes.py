"""How TorchNano, ``@nano`` and the Trainer start their training processes from a running script.

They fork where this process's OpenMP can be made safe for it: a forked process inherits the
script as it stands (its closures, lambdas and locally defined classes, its data), so the
script needs no main guard and its top-level code runs once. Where fork is not available or
not safe, they spawn, which re-imports the script (it then needs its main guard). Either way
no process is left behind: a failure, Ctrl-C or the caller's death ends them all, and the
caller sees the traceback of the process that failed first, not of one that failed because of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from nanopatch.foundation.log import log_once, warn_once

logger = logging.getLogger("nanopatch")

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t's omp_pause_soft (OpenMP 5.0)
_PR_SET_PDEATHSIG = 1


def _loaded_libgomp() -> list[str]:
    """Paths of the GNU OpenMP runtimes loaded into this process (torch's bundled one, or the system's)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and "/" in line}
    except OSError:
        return []
    return sorted(paths)


def _openmp_pauses() -> tuple[list[tuple[str, Any]], str | None]:
    """``omp_pause_resource_all`` of each GNU OpenMP runtime loaded here, by library name; or
    why one of them cannot be paused."""
    pauses = []
    for path in _loaded_libgomp():
        name = os.path.basename(path)
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            return [], f"{name} has no omp_pause_resource_all"
        pause.argtypes = [ctypes.c_int]
        pause.restype = ctypes.c_int
        pauses.append((name, pause))
    return pauses, None


def release_openmp() -> str | None:
    """Shut down this process's GNU OpenMP thread pools, so that a process forked next starts
    pools of its own; ``None`` when done, else why it could not be.

    GNU libgomp has no fork handler: a child forked after its parent ran a parallel region
    hangs in its own first parallel region with more than one thread. OpenMP 5's
    ``omp_pause_resource_all`` frees the pool; the next parallel region (in the parent too)
    starts a new one. Intel's OpenMP runtime handles fork itself."""
    pauses, why = _openmp_pauses()
    for name, pause in pauses:
        if pause(_OMP_PAUSE_SOFT) != 0:
            return f"{name} refused to pause its threads"
    return why


def why_not_fork() -> str | None:
    """``None`` when this process can fork training processes safely, else why not."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this platform cannot fork"
    return _openmp_pauses()[1]


def fork_or_spawn(who: str) -> str:
    """The start method for ``who``'s processes: "fork" when :func:`why_not_fork` finds no
    reason against it (start them inside :func:`forking`), else "spawn" (logged once, with why)."""
    why = why_not_fork()
    if why is None:
        return "fork"
    warn_once(
        "processes-spawned",
        f"{who}: processes are spawned, not forked ({why}): the script needs its "
        '`if __name__ == "__main__":` guard, and what it hands the processes must pickle',
    )
    return "spawn"


_launches = 0  # how many launches of training processes are under way in this process
_launcher: int | None = None  # the pid of the process that launched them (a forked rank inherits it)
_hooked = False


def _before_fork() -> None:
    if _launches:
        why = release_openmp()
        if why is not None:
            log_once("omp-not-released", "a forked training process may hang in OpenMP: %s", why)


def _in_child() -> None:
    global _launches
    _launches = 0  # a training process's own forks (DataLoader workers) are not launches


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Training processes forked inside this block fork with OpenMP's threads released just
    before (:func:`release_openmp`), whoever forks them (torch's or Lightning's launcher)."""
    global _launches, _launcher, _hooked
    if not _hooked:
        _hooked = True
        os.register_at_fork(before=_before_fork, after_in_child=_in_child)
    _launcher = os.getpid()
    _launches += 1
    try:
        yield
    finally:
        _launches -= 1


def end_with_parent() -> None:
    """In a started process: end when the process that started it dies, however it dies
    (Linux; elsewhere a no-op). SIGKILL, not SIGTERM: nobody is left to take the result, and
    Lightning's Trainer catches SIGTERM to stop only after the step it is in."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if _launcher is not None and os.getppid() != _launcher:
        os._exit(1)  # the launcher died before prctl: nobody is waiting for us


@contextlib.contextmanager
def none_left_behind(grace: float = 5.0) -> Iterator[None]:
    """Whatever ends the block early (a worker's failure, Ctrl-C), the processes started in it
    are ended too: SIGTERM, then SIGKILL after ``grace`` seconds, and each one reaped."""
    before = {p.pid for p in multiprocessing.active_children()}
    try:
        yield
    except BaseException:
        started = [p for p in multiprocessing.active_children() if p.pid not in before]
        for process in started:
            with contextlib.suppress(Exception):
                process.terminate()
        for process in started:
            process.join(grace)
            if process.is_alive():
                process.kill()
                process.join()
        if started:
            logger.info("ended %d training process(es) left running", len(started))
        raise


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """The block that starts a launch's training processes: :func:`none_left_behind`,
    :func:`forking` and :func:`first_failure_reported` together."""
    with none_left_behind(), forking(), first_failure_reported():
        yield


_FIRST = "first"  # the file, in a launch's failures folder, of the first process that raised


@contextlib.contextmanager
def first_failure_reported() -> Iterator[None]:
    """The caller sees the traceback of the training process that raised first.

    When one process raises, the others fail after it (a collective's peer closed its
    connection: gloo's "Connection closed by peer"), and torch's launcher
    (``torch.multiprocessing.start_processes``, which Lightning's launchers call too) reports
    whichever failed process it looks at first. Processes started in this block note the
    traceback of their exception as they fail, the first to note winning; a process that fails
    because another has exited notes after it, since the other's connection closes only once
    it has exited. A ``ProcessRaisedException`` about another process, or a
    ``ProcessExitedException`` (a process that died of a signal or exited without raising, as
    gloo's C++ threads can make it after its peer left), is replaced with a
    ``ProcessRaisedException`` about the first one."""
    try:
        import torch.multiprocessing as mp
        from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException
    except ImportError:
        yield
        return
    start = mp.start_processes
    folder = tempfile.mkdtemp(prefix="nanopatch-failures-")

    @functools.wraps(start)
    def noting(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return start(functools.partial(_noting_failure, folder, fn), *args, **kwargs)

    mp.start_processes = noting
    try:
        yield
    except (ProcessRaisedException, ProcessExitedException) as reported:
        first = _first_failure(folder)
        if first is None or first[0] == reported.error_index:
            raise
        index, pid, trace = first
        message = f"\n\n-- Process {index} terminated with the following error:\n{trace}"
        raise ProcessRaisedException(message, index, pid) from None
    finally:
        if mp.start_processes is noting:
            mp.start_processes = start
        shutil.rmtree(folder, ignore_errors=True)


def _noting_failure(folder: str, fn: Callable[..., Any], index: int, *args: Any) -> Any:
    """In a started process: ``fn(index, *args)``, noting its exception in ``folder`` before it
    propagates (to torch's wrapper, which hands it to the launcher)."""
    try:
        return fn(index, *args)
    except Exception:
        _note_failure(folder, index, traceback.format_exc())
        raise


def _note_failure(folder: str, index: int, trace: str) -> None:
    """Write this process's failure as the launch's first, unless one is there: the note is
    written whole to a file of its own, then linked to its final name, which fails if taken."""
    with contextlib.suppress(OSError):
        fd, path = tempfile.mkstemp(dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(f"{index} {os.getpid()}\n{trace}")
        with contextlib.suppress(FileExistsError):
            os.link(path, os.path.join(folder, _FIRST))
        os.unlink(path)


def _first_failure(folder: str) -> tuple[int, int, str] | None:
    """(index, pid, traceback) of the first process of the launch that noted a failure."""
    try:
        with open(os.path.join(folder, _FIRST)) as f:
            head, trace = f.read().split("\n", 1)
        index, pid = head.split()
        return int(index), int(pid), trace
    except (OSError, ValueError):
        return None
