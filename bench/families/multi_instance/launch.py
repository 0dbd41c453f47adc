"""multi_instance's variants and how each is launched (stock, stock torchrun --nproc N with DDP by hand,
nanopatch untuned, tuned, tuned without a DataLoader, one process on one rank's share of the cores, N such
processes at once without a process group, --nproc N),
in a clean environment, one fresh process group per run; frameworks.py shares its environment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import harness as h

from families.multi_instance.worker import INSTANCE_VARIABLE, INSTANCES_VARIABLE

SETTLE_S = 0.5  # pause before each run
GROUP = "resnet18"
STOCK, STOCK_NPROC, UNTUNED, TUNED, NPROC = "stock", "stock-nproc", "untuned", "tuned", "nproc"
NO_LOADER, SHARE, APART = "no-loader", "share", "apart"
UNPINNED, GLIBC = "unpinned", "glibc"  # the tuning less one of its settings
VARIANTS = (STOCK, STOCK_NPROC, UNTUNED, TUNED, UNPINNED, GLIBC, NO_LOADER, SHARE, APART, NPROC)
MODELS = ("resnet18", "tiny")  # tiny: a small CNN, for the test suite
#: environment variables no variant inherits from the caller
CLEARED = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "GOMP_CPU_AFFINITY",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "LD_PRELOAD",
    "MALLOC_CONF",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


#: variants run once per process count of ``--nproc`` (their keys carry it: "nproc:4")
COUNTED = (STOCK_NPROC, SHARE, APART, NPROC)


def expand(keys: list[str], counts: list[int]) -> list[str]:
    """The runs' keys: a counted variant once per count ("nproc:2", "nproc:4"), the others once."""
    return [key for k in keys for key in ([f"{k}:{n}" for n in counts] if k in COUNTED else [k])]


def split(key: str) -> tuple[str, int]:
    """ "nproc:4" -> ("nproc", 4); "tuned" -> ("tuned", 1)."""
    base, _, count = key.partition(":")
    return base, int(count or 1)


def variant_name(key: str) -> str:
    base, nproc = split(key)
    return {
        STOCK: "stock",
        STOCK_NPROC: f"stock, torchrun --nproc {nproc}",
        UNTUNED: "patched, untuned",
        TUNED: "patched, tuned",
        UNPINNED: "patched, tuned, threads not pinned",
        GLIBC: "patched, tuned, glibc malloc",
        NO_LOADER: "patched, tuned, no DataLoader",
        SHARE: f"patched, one process on 1/{nproc} of the cores",
        APART: f"patched, {nproc} processes at once, no DDP",
        NPROC: f"patched, --nproc {nproc}",
    }[base]


def rank_cpus(nproc: int) -> list[tuple[int, ...]]:
    """The CPUs of each of ``--nproc nproc``'s ranks on this machine (nanopatch's own split)."""
    from nanopatch.foundation import cpu
    from nanopatch.runtime import tuning

    try:
        return [tuple(group) for group in tuning.process_cpus(cpu.host_facts(), nproc)]
    except ValueError:  # more processes than cores: the runner refuses --nproc too; an even split
        cpus = sorted(os.sched_getaffinity(0))
        size = max(1, len(cpus) // nproc)
        return [tuple(cpus[i * size : (i + 1) * size] or cpus[:size]) for i in range(nproc)]


def apart_main(argv: list[str]) -> int:
    """``--apart N``: the worker command that follows under ``python -m nanopatch``, N times at
    once, each process pinned to one rank's CPUs as --nproc N pins it, with no process group: what
    the ranks' steps take side by side on this machine without their gradients' all-reduce."""
    import subprocess

    at = argv.index("--apart")
    count, worker = int(argv[at + 1]), argv[:at] + argv[at + 2 :]
    processes = [
        subprocess.Popen(
            [*pinned(group), sys.executable, "-m", "nanopatch", SCRIPT, *worker],
            env={**os.environ, INSTANCE_VARIABLE: str(i), INSTANCES_VARIABLE: str(count)},
        )
        for i, group in enumerate(rank_cpus(count))
    ]
    while any(p.poll() is None for p in processes):  # one failing stops the others (they would wait for it)
        if any(p.poll() for p in processes):
            for p in processes:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.1)
    return next((p.returncode for p in processes if p.returncode), 0)


def pinned(cpus: tuple[int, ...]) -> list[str]:
    """A command prefix that starts the command on ``cpus`` only: ``taskset -c``, or where the
    machine has none, a Python that sets its affinity and executes the command."""
    text = cpu_text(list(cpus))
    if shutil.which("taskset"):
        return ["taskset", "-c", text]
    chosen = ", ".join(map(str, cpus))
    pin = f"import os, sys; os.sched_setaffinity(0, {{{chosen}}}); os.execvp(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", pin]


def run_env() -> dict[str, str]:
    """No caller's tuning, torchrun or NANOPATCH_* settings; this checkout's nanopatch importable."""
    return h.clean_env(CLEARED, ("NANOPATCH_", "TORCHELASTIC_", "TORCH_NCCL", "KMP_"))


#: the script each variant runs (with --worker): bench/multi_instance.py
SCRIPT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "multi_instance.py"))


def command(key: str, args: argparse.Namespace, out: str, learn: int = 0) -> list[str]:
    """The run's command line; ``learn``: the steps it records first for the learning check."""
    key, nproc = split(key)
    worker = [
        SCRIPT,
        "--worker",
        out,
        "--model",
        args.model,
        "--batch",
        str(args.batch),
        "--image-size",
        str(args.image_size),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        *(["--learn", str(learn)] if learn else []),
    ]
    if key == STOCK_NPROC:  # data-parallel by hand: torchrun, and DDP in the script
        worker.append("--ddp")
    if key == NO_LOADER:  # the timed steps take batches the loader collated before
        worker.append("--no-loader")
    launcher = {
        STOCK: [],
        STOCK_NPROC: ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)],
        UNTUNED: ["-m", "nanopatch", "--no-tune"],
        TUNED: ["-m", "nanopatch"],
        UNPINNED: ["-m", "nanopatch", "--no-pin-threads"],
        GLIBC: ["-m", "nanopatch", "--allocator", "default"],
        NO_LOADER: ["-m", "nanopatch"],
        SHARE: ["-m", "nanopatch"],
        APART: [],
        NPROC: ["-m", "nanopatch", "--nproc", str(nproc)],
    }[key]
    if key == APART:  # bench/multi_instance.py starts the N processes itself
        return [sys.executable, SCRIPT, "--apart", str(nproc), *worker[1:]]
    prefix = pinned(rank_cpus(nproc)[0]) if key == SHARE else []
    return [*prefix, sys.executable, *launcher, *worker]


def run_once(key: str, args: argparse.Namespace, env: dict[str, str], workdir: str, learn: int) -> dict[str, Any]:
    """One fresh process (group) of a variant: its rate, or its error. ``learn``: the steps it
    records first for the learning check."""
    out = tempfile.mkdtemp(prefix=f"{key.replace(':', '-')}-", dir=workdir)
    base, nproc = split(key)
    expected = nproc if base in (NPROC, STOCK_NPROC, APART) else 1
    if base == STOCK_NPROC:  # each process its share of the cores, as a careful user sets it (torchrun's default is 1)
        env = {**env, "OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // nproc))}
    return h.run_ranks(
        command(key, args, out, learn), env=env, out=out, timeout=args.timeout, count="images", expected=expected
    )


def cpu_text(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    ranges: list[list[int]] = []
    for c in sorted(cpus):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def parse_cpus(text: str) -> set[int]:
    """ "0-2,5" -> {0, 1, 2, 5}."""
    cpus: set[int] = set()
    for part in text.split(","):
        if part.strip():
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def outside(rank: dict[str, Any]) -> list[str]:
    """Names of the threads that may run on CPUs outside the process's own set (from its start)."""
    own = set(rank["affinity_at_start"])
    return [name for cpus, names in rank["thread_cpus"].items() if not parse_cpus(cpus) <= own for name in names]


def facts_of(run: dict[str, Any]) -> dict[str, Any]:
    """What a run's processes ran with, and the checks across its ranks."""
    ranks = run["ranks"]
    return {
        "processes": len(ranks),
        "threads": [r["threads"] for r in ranks],
        "interop_threads": [r["interop_threads"] for r in ranks],
        "affinity": [cpu_text(r["affinity_at_start"]) for r in ranks],
        "thread_cpus": [r["thread_cpus"] for r in ranks],
        "threads_outside_own_cpus": [outside(r) for r in ranks],
        "jemalloc": [r["jemalloc"] is not None for r in ranks],
        "tcmalloc": [r["tcmalloc"] is not None for r in ranks],
        "world_size": [r["world_size"] for r in ranks],
        "backend": ranks[0]["backend"],
        "ddp": [r["ddp"] for r in ranks],
        "loader_batches": [r["loader_batches"] for r in ranks],
        "loader_timed": [r.get("loader_timed", True) for r in ranks],
        "channels_last": [r["channels_last"] for r in ranks],
        "nanopatch_imported": [r["nanopatch_imported"] for r in ranks],
        "env": [r["env"] for r in ranks],
        "peak_rss_mib": [r.get("peak_rss_mib") for r in ranks],
        "total_peak_rss_mib": sum(r.get("peak_rss_mib") or 0.0 for r in ranks),
        **h.rank_checks(ranks, "data_checksum"),
    }
