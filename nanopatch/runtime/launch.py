"""The runner's process side: tune the CPU runtime, and start ``--nproc`` pinned processes.

* :func:`tune` sets threads, OpenMP affinity (unless ``--no-pin-threads``) and the allocator
  for a single process (see :mod:`nanopatch.runtime.tuning`), re-executing the interpreter once when
  ``LD_PRELOAD`` changed; processes the script starts as several workers each take their
  share of its threads.
* :func:`launch` starts N processes through ``torch.distributed.run`` (torchrun's machinery:
  rendezvous, monitoring, stopping every rank when one fails), each running
  ``python -m nanopatch --rank-worker ...`` with the same script and arguments.
* :func:`start_worker` is the first thing such a process does: pin itself to its share of
  the cores, set its threads, silence its stdout unless it is rank 0, and initialise the
  process group before the script runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from typing import Any

from nanopatch.foundation import cpu
from nanopatch.runtime import loopback, measure
from nanopatch.runtime import tuning as runtime

logger = logging.getLogger("nanopatch")

#: torchrun options passed through unchanged (runner flag -> torchrun flag), for multi-node jobs
PASSTHROUGH = {
    "nnodes": "--nnodes",
    "node_rank": "--node-rank",
    "rdzv_endpoint": "--rdzv-endpoint",
    "rdzv_backend": "--rdzv-backend",
    "rdzv_id": "--rdzv-id",
    "master_addr": "--master-addr",
    "master_port": "--master-port",
    "max_restarts": "--max-restarts",
}
#: the variables a rank sets for itself from its CPU share
RANK_VARIABLES = ("OMP_NUM_THREADS", *runtime.PIN_VARIABLES, "KMP_BLOCKTIME")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _nproc(text: str) -> int | str:
    if text in ("auto", "measure"):
        return text
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of processes (at least 1), 'auto' or 'measure'"
        ) from None


def add_options(parser: argparse.ArgumentParser) -> None:
    tuning = parser.add_argument_group("CPU runtime")
    tuning.add_argument(
        "--tune",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="set OMP_NUM_THREADS and a faster allocator for this machine, and give processes the script "
        "starts (torchrun, Lightning DDP, torch.multiprocessing.spawn) their share of the threads; values "
        "you set yourself are kept (default: on; --no-tune leaves the environment as it is)",
    )
    tuning.add_argument(
        "--pin-threads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin OpenMP's threads one per physical core, the main thread included (GOMP_CPU_AFFINITY or "
        "KMP_AFFINITY): much steadier when other work shares the machine; threads the script itself starts "
        "then share the main thread's CPU, processes it starts get every CPU (default: on; "
        "--no-pin-threads leaves placement to the scheduler, as in stock torch)",
    )
    tuning.add_argument(
        "--allocator",
        choices=runtime.ALLOCATORS,
        default="auto",
        help="memory allocator to preload: tcmalloc when installed (auto; jemalloc measured slower for "
        "training on the machine this was tuned on), jemalloc, tcmalloc, or the default one",
    )
    multi = parser.add_argument_group("multi-instance data-parallel training (torch.distributed, torchrun)")
    multi.add_argument(
        "--nproc",
        type=_nproc,
        metavar="N|auto|measure",
        help="run N pinned processes on this machine, data-parallel (measure: time the script's first steps with 1, "
        "2, 4, ... processes, each count started anew with its output hidden, and train with the fastest; the "
        "figures are kept for the next run of the same command; auto: the count a measure of the same command "
        "chose, else one per socket)",
    )
    multi.add_argument("--cores-per-proc", type=_positive, metavar="K", help="physical cores per process")
    multi.add_argument(
        "--cpus",
        metavar="LIST",
        help='explicit CPUs per process: "0-3,4-7" (two processes) or "0,2;1,3" (semicolons between processes)',
    )
    multi.add_argument(
        "--all-ranks-print",
        action="store_true",
        help="let every process print to stdout (default: rank 0 only; stderr is never silenced)",
    )
    for name, flag in PASSTHROUGH.items():
        multi.add_argument(flag, dest=name, metavar=name.upper(), help=argparse.SUPPRESS)
    multi.set_defaults()
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank-cpus", help=argparse.SUPPRESS)


def multi_node_help() -> str:
    return (
        "multi-node: --nnodes, --node-rank, --rdzv-endpoint, --rdzv-backend, --rdzv-id, --master-addr, "
        "--master-port and --max-restarts go to torchrun unchanged"
    )


def wants_launch(opts: argparse.Namespace) -> bool:
    return not opts.rank_worker and (
        opts.nproc is not None
        or opts.cpus is not None
        or opts.cores_per_proc is not None
        or any(getattr(opts, name) is not None for name in PASSTHROUGH)
    )


# --- a single process -----------------------------------------------------------------


def _openmp() -> str:
    return runtime.openmp_runtime(os.environ, runtime.torch_library_dirs())


def current_plan(opts: argparse.Namespace, facts: cpu.CpuFacts | None = None, **kwargs: Any) -> runtime.Plan:
    facts = cpu.host_facts() if facts is None else facts
    return runtime.plan(
        facts,
        os.environ,
        _openmp(),
        allocator=opts.allocator,
        ours=runtime.tuned_names(os.environ),
        pin=opts.pin_threads,
        **kwargs,
    )


def rank_plan(cpus: Sequence[int], nproc: int, openmp: str | None = None, pin: bool = True) -> runtime.Plan:
    """The threads and OpenMP affinity of one of ``nproc`` processes pinned to ``cpus`` (the
    allocator is the launcher's, which they all inherit)."""
    return runtime.plan(
        cpu.facts(allowed=cpus),
        os.environ,
        _openmp() if openmp is None else openmp,
        allocator="default",
        share=nproc,
        ours=runtime.tuned_names(os.environ),
        pin=pin,
    )


def tune(opts: argparse.Namespace, may_reexec: bool) -> runtime.Plan | None:
    """Tune this process's environment before torch is imported (single-process runs).
    Returns the plan applied, or None when tuning is off or was done before a re-exec."""
    if not opts.tune:
        return None
    p = None
    if not os.environ.get(runtime.REEXEC_MARKER):
        p = current_plan(opts)
        _apply_and_reexec(p, may_reexec)
        logger.info("%s", runtime.format_plan(p))
    if runtime.tuned_names(os.environ) & set(runtime.PIN_VARIABLES):
        runtime.keep_children_unpinned(cpu.host_facts().allowed_cpus)
    if runtime.nanopatch_threads(os.environ) is not None:
        runtime.watch_launches()  # a script that becomes one of several ranks (Lightning's DDP) takes its share
    return p


def _apply_and_reexec(p: runtime.Plan, may_reexec: bool, only: Sequence[str] | None = None) -> None:
    """Apply the plan (the variables in ``only``, if given); when it preloads an allocator,
    start the interpreter again so that the preload takes effect (without ``may_reexec``,
    as when the runner is called as a function, the allocator part is left out)."""
    names = set(p.changes()) if only is None else set(only)
    preload = "LD_PRELOAD" in p.changes() and "LD_PRELOAD" in names
    if preload and not may_reexec:
        names -= {"LD_PRELOAD", "MALLOC_CONF"}
        preload = False
    runtime.apply(p, only=names)
    os.environ[runtime.REEXEC_MARKER] = "1"
    if preload:
        try:
            runtime.reexec()
        except OSError as exc:  # the allocator simply is not used
            logger.warning("could not restart the interpreter to preload %s (%s)", p.allocator, exc)


# --- several processes ----------------------------------------------------------------


def describe_processes(opts: argparse.Namespace, p: runtime.Plan) -> dict[str, Any]:
    """``--info`` for ``--nproc``: the launcher's allocator, and each process's share."""
    report = p.as_dict()
    report["settings"] = [s for s in report["settings"] if s["name"] in ("LD_PRELOAD", "MALLOC_CONF")]
    if opts.nproc == "measure":
        counts = ", ".join(str(n) for n in measure.candidates(cpu.host_facts()))
        report["processes"] = []
        report["processes_measured"] = f"timed at the start with {counts} process(es), the fastest kept"
        report["threads"] = "--nproc measure"
        return report
    groups = rank_cpus(opts)
    report["processes"] = []
    for group in groups:
        share = rank_plan(group, len(groups), p.openmp, opts.pin_threads)
        settings = " ".join(f"{s.name}={s.effective}" for s in share.settings if s.effective is not None)
        report["processes"].append(f"CPUs {runtime.cpu_list_text(group)}: {settings}")
    report["threads"] = f"{len(groups)} process(es)"
    return report


def rank_cpus(opts: argparse.Namespace, facts: cpu.CpuFacts | None = None) -> list[tuple[int, ...]]:
    facts = cpu.host_facts() if facts is None else facts
    nproc = opts.nproc
    if nproc == "auto":
        nproc = runtime.auto_nproc(facts, opts.cores_per_proc)
    if nproc is None and opts.cpus is None:
        nproc = 1 if opts.cores_per_proc is None else runtime.auto_nproc(facts, opts.cores_per_proc)
    return runtime.process_cpus(facts, nproc or 0, opts.cores_per_proc, opts.cpus)


def torchrun_argv(opts: argparse.Namespace, groups: Sequence[Sequence[int]], target: Sequence[str]) -> list[str]:
    argv = ["--nproc-per-node", str(len(groups))]
    given = {name: getattr(opts, name) for name in PASSTHROUGH if getattr(opts, name) is not None}
    if not any(k in given for k in ("nnodes", "rdzv_endpoint", "master_addr", "master_port", "rdzv_backend")):
        # one node: the launcher hosts the rendezvous store on loopback (runtime/loopback.py),
        # not torchrun's --standalone store, which listens on every interface
        argv += ["--nnodes", "1", "--rdzv-backend", loopback.BACKEND, "--rdzv-endpoint", loopback.LOOPBACK]
        argv += ["--rdzv-id", uuid.uuid4().hex]
    given.setdefault("max_restarts", "0")
    for name, value in given.items():
        argv += [PASSTHROUGH[name], str(value)]
    worker = ["--rank-worker", "--rank-cpus", ";".join(runtime.cpu_list_text(g) for g in groups)]
    if not opts.tune:
        worker.append("--no-tune")
    if not opts.pin_threads:
        worker.append("--no-pin-threads")
    if opts.all_ranks_print:
        worker.append("--all-ranks-print")
    return [*argv, "-m", "nanopatch", *worker, *target]


def tune_launcher(opts: argparse.Namespace, may_reexec: bool) -> None:
    """The launcher's part of the tuning: the allocator (which its processes inherit); each
    process sets its own threads and affinity."""
    if opts.tune and not os.environ.get(runtime.REEXEC_MARKER):
        _apply_and_reexec(current_plan(opts), may_reexec, only=("LD_PRELOAD", "MALLOC_CONF"))


def launch(opts: argparse.Namespace, target: Sequence[str]) -> int:
    """Run ``target`` (script and its arguments, or ``-m module ...``) in pinned processes."""
    groups = rank_cpus(opts)
    facts = cpu.host_facts()
    # each rank sets its own threads; this keeps torchrun from setting 1 for all of them
    if not os.environ.get("OMP_NUM_THREADS") or "OMP_NUM_THREADS" in runtime.tuned_names(os.environ):
        runtime.set_threads(os.environ, rank_plan(groups[0], len(groups), "unknown").threads)
    os.environ.setdefault(runtime.CPUS_VARIABLE, runtime.cpu_list_text(facts.allowed_cpus))
    os.environ["NANOPATCH_DATA_PARALLEL"] = "1"
    argv = torchrun_argv(opts, groups, target)
    logger.info("torchrun %s", " ".join(argv))

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if loopback.BACKEND in argv:
        loopback.register_rendezvous()
        loopback.gloo_on_loopback()  # the ranks' gloo connections: on loopback too

    try:
        run(get_args_parser().parse_args(argv))
    except ChildFailedError as exc:
        return report_failure(exc, len(groups) * _nnodes(opts))
    return 0


def _written_at(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except (OSError, TypeError):
        return 0


def _nnodes(opts: argparse.Namespace) -> int:
    text = str(opts.nnodes or "1").split(":")[-1]
    return int(text) if text.isdigit() else 1


# --- inside one of them -----------------------------------------------------------------


def start_worker(opts: argparse.Namespace) -> None:
    """Pin this rank to its CPUs, set its threads, and set up stdout, before torch loads."""
    groups = runtime.parse_process_cpus(opts.rank_cpus) if opts.rank_cpus else []
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if groups:
        mine = groups[local_rank % len(groups)]
        pin_every_thread(set(mine))
        p = rank_plan(mine, len(groups), pin=opts.pin_threads)
        runtime.apply(p, only=RANK_VARIABLES if opts.tune else ("OMP_NUM_THREADS",))
        runtime.mark_shared(os.environ)  # processes this rank starts do not divide its threads again
        runtime.keep_children_unpinned(mine)
        logger.info("rank %s: CPUs %s\n%s", os.environ.get("RANK"), runtime.cpu_list_text(mine), runtime.format_plan(p))
    if int(os.environ.get("RANK", "0")) != 0 and not opts.all_ranks_print:
        silence_stdout()


def pin_every_thread(cpus: set[int]) -> None:
    """``sched_setaffinity(0, ...)`` moves the calling thread only: move the threads an
    allocator or the interpreter may already have started too."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cpus)


def silence_stdout() -> None:
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # stays open for the process's life


def record_failure(exc: BaseException, skip_file: str) -> None:
    """Write the exception, with the traceback from the script's frames on (frames of
    ``skip_file``, the runner, left out, as plain ``python`` shows it), where torchrun's agent
    reads a rank's error; the launcher prints it. Without such a place, print it here."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == skip_file:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    if not _write_error_file(f"{type(exc).__name__}: {exc}", text):
        sys.stderr.write(text)


def record_exit() -> None:
    """A rank that ends with a failing ``sys.exit(code)`` writes an error file too, so that the
    launcher sees when it ended: the other ranks fail a moment later in their next collective
    ("Connection closed by peer"), and without this rank's file the launcher would name one of
    them as the first to fail. The file holds no text: what plain ``python`` prints for that
    exit (nothing for a number, the object for anything else) the interpreter prints itself."""
    _write_error_file("", "")


#: the name torch gives gloo's worker threads (``c10::setThreadName``; so on torch 2.13 and 2.15)
_GLOO_WORKER = "pt_gloo_runloop"


def settle_gloo(timeout: float = 2.0) -> None:
    """Let gloo's worker threads finish with their last collective before the interpreter shuts
    down (called at the end of every rank, whether the script destroyed its group or not).

    A worker thread destroys each collective it ran just after the caller's ``wait()`` returned,
    and a collective started inside ``backward`` (DDP's all-reduces) carries a Python object in
    its thread-local state (the ``contextvars`` copy torch's autograd stashes there), so
    the destruction needs the GIL. Where the interpreter has started finalising by then (the
    script's last statement was ``dist.destroy_process_group()``, which leaves the group's
    threads to the DDP wrapper that holds it), the worker is made to exit while in a destructor:
    "terminate called without an active exception", SIGABRT. A process with one CPU (a pinned
    rank) loses that race a few times in a hundred; stock torchrun pinned to one core loses it
    too. So the main thread waits here, without the GIL, until every gloo worker sleeps (twice in
    a row, a millisecond apart), at most ``timeout`` seconds; where threads carry no names
    (another OS, an older torch) it returns at once."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        states = _thread_states(_GLOO_WORKER)
        if not states:
            return
        quiet = quiet + 1 if all(state == "S" for state in states) else 0
        time.sleep(0.001)


def _thread_states(name: str) -> list[str]:
    """The scheduler states (``R``, ``S``, ...) of this process's threads called ``name``."""
    states = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return states
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        open_paren, close_paren = stat.find("("), stat.rfind(")")
        if stat[open_paren + 1 : close_paren] == name:
            states.append(stat[close_paren + 2 : close_paren + 3])
    return states


def _write_error_file(message: str, callstack: str) -> bool:
    """Write a rank's error where torchrun's agent reads it; False where there is no such place."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        return False
    return True


def report_failure(exc: Any, world: int) -> int:
    """Print which rank failed first, and its traceback; returns the exit code to use."""
    failures = list(exc.failures.items())
    recorded = [(rank, f) for rank, f in failures if isinstance(f.message, dict)]
    if recorded:  # the earliest written error file (timestamps are whole seconds)
        rank, first = min(recorded, key=lambda item: _written_at(item[1].error_file))
    else:
        rank, first = next(((r, f) for r, f in failures if f.exitcode > 0), failures[0])
    if first.exitcode < 0:
        how = f"was killed by {first.signal_name()}"
    else:
        how = f"failed with exit code {first.exitcode}"
    print(f"python -m nanopatch: rank {rank} of {world} {how}; the other ranks were stopped.", file=sys.stderr)
    message = first.message
    if isinstance(message, dict):
        message = message.get("extraInfo", {}).get("py_callstack") or message.get("message", "")
    if message and not str(message).startswith("To enable traceback"):  # torchrun's text when there is none
        print(str(message).rstrip(), file=sys.stderr)
    return first.exitcode if first.exitcode > 0 else 1
