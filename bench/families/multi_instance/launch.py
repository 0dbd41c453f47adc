"""multi_instance's variants and how each is launched (stock, stock torchrun --nproc N with DDP by hand,
nanopatch untuned, tuned, --nproc N),
in a clean environment, one fresh process group per run; frameworks.py shares its environment.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

import harness as h

SETTLE_S = 0.5  # pause before each run
GROUP = "resnet18"
STOCK, STOCK_NPROC, UNTUNED, TUNED, NPROC = "stock", "stock-nproc", "untuned", "tuned", "nproc"
VARIANTS = (STOCK, STOCK_NPROC, UNTUNED, TUNED, NPROC)
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


def variant_name(key: str, nproc: int) -> str:
    return {
        STOCK: "stock",
        STOCK_NPROC: f"stock, torchrun --nproc {nproc}",
        UNTUNED: "patched, untuned",
        TUNED: "patched, tuned",
        NPROC: f"patched, --nproc {nproc}",
    }[key]


def run_env() -> dict[str, str]:
    """No caller's tuning, torchrun or NANOPATCH_* settings; this checkout's nanopatch importable."""
    return h.clean_env(CLEARED, ("NANOPATCH_", "TORCHELASTIC_", "TORCH_NCCL", "KMP_"))


#: the script each variant runs (with --worker): bench/multi_instance.py
SCRIPT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "multi_instance.py"))


def command(key: str, args: argparse.Namespace, out: str, learn: int = 0) -> list[str]:
    """The variant's command line; ``learn``: the steps it records first for the learning check."""
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
    launcher = {
        STOCK: [],
        STOCK_NPROC: ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc)],
        UNTUNED: ["-m", "nanopatch", "--no-tune"],
        TUNED: ["-m", "nanopatch"],
        NPROC: ["-m", "nanopatch", "--nproc", str(args.nproc)],
    }[key]
    return [sys.executable, *launcher, *worker]


def run_once(key: str, args: argparse.Namespace, env: dict[str, str], workdir: str, learn: int) -> dict[str, Any]:
    """One fresh process (group) of a variant: its rate, or its error. ``learn``: the steps it
    records first for the learning check."""
    out = tempfile.mkdtemp(prefix=f"{key}-", dir=workdir)
    expected = args.nproc if key in (NPROC, STOCK_NPROC) else 1
    if key == STOCK_NPROC:  # each process its share of the cores, as a careful user sets it (torchrun's default is 1)
        env = {**env, "OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // args.nproc))}
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
        "channels_last": [r["channels_last"] for r in ranks],
        "nanopatch_imported": [r["nanopatch_imported"] for r in ranks],
        "env": [r["env"] for r in ranks],
        "peak_rss_mib": [r.get("peak_rss_mib") for r in ranks],
        "total_peak_rss_mib": sum(r.get("peak_rss_mib") or 0.0 for r in ranks),
        **h.rank_checks(ranks, "data_checksum"),
    }
