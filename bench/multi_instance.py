"""Training throughput of one machine: one process, one process tuned, or several pinned processes.

Times the training loop a user writes for torchvision's ResNet-18 (batch 32 per process at
224 px, SGD(lr 0.01, momentum 0.9, weight decay 1e-4), cross-entropy over 1000 classes; the data
is a synthetic data set of 8 batches, generated with a fixed seed and read through a shuffling
``DataLoader``) in these variants, all on the same cores:

* ``stock``: ``python worker.py``; nanopatch is never imported (checked), torch's default threads.
* ``patched, untuned``: ``python -m nanopatch --no-tune worker.py``: the patches, no runtime tuning.
* ``patched, tuned``: ``python -m nanopatch worker.py``: one process on all the cores, with the
  runtime tuning (``OMP_NUM_THREADS``, OpenMP affinity, an allocator preloaded).
* ``patched, --nproc 2``: ``python -m nanopatch --nproc 2 worker.py``: two processes, each pinned
  to its share of the cores, the model in DistributedDataParallel (gloo), the loader sharded.
  Each process trains batch 32, so a step is 64 images; the rate is the images of all ranks over
  the slowest rank's time (DDP keeps the ranks in lock-step).

The worker is this file run with ``--worker`` (the same file and arguments for every variant) and
behaves as a plain training script: it builds its data, model and optimizer, runs ``--warmup``
untimed steps, times ``--steps`` steps (``loss.item()`` after each, as a script that logs its loss
does), and writes its images, seconds and what it ran with to ``rank<RANK>.json`` in the folder
its command line names (``RANK`` from the environment, 0 when unset). It never calls nanopatch
or sets anything up for torch.distributed; after the timed steps it only *asks* what it ran with:
torch's intra- and inter-op threads, its CPU affinity when it started and each thread's after
the run, whether jemalloc or tcmalloc is mapped (``/proc/self/maps``), whether a process group
is initialised and its world size and backend, whether a DistributedDataParallel object exists,
the loader's batches per epoch, a checksum of the data it saw first and of the parameters after
the run. The parent checks from those, and reports, that the ranks of ``--nproc`` had disjoint
CPUs, saw different data (the loader was sharded) and still ended with equal parameters (their
gradients were averaged), and that ``stock`` never imported nanopatch.

Each variant must learn as stock before it gets a rate: its first run (the first that ran, if
that failed) records its first ``--learning-steps`` optimizer steps from the seed before the
warm-up with ``nanopatch.learning.Recorder`` (stock loads that file without importing nanopatch)
and writes them to its result; the parent judges rank 0's against stock's with
``nanopatch.learning.compare``. A variant that does not learn as stock is printed "does not learn"
with the verdict and keeps no rate, ratio or timing.

How it is made fair:

* Every variant runs once per round as a fresh process (or process group), one at a time, the
  order rotated each round, so drift of the machine hits every variant alike; the rate is the
  median over the rounds, ``min-max`` the spread.
* The same worker file, data, seed, model and step for every variant; only the launch differs.
  ``OMP_NUM_THREADS``, OpenMP affinity, ``LD_PRELOAD``/``MALLOC_CONF``, torchrun's and
  ``NANOPATCH_*`` variables are removed from the environment of all of them, so each runs what
  its command line says and no setting of the caller's leaks in.
* Nothing else is timed: start-up, data generation, model building and warm-up are outside.
* ``CPU`` is the CPU time of all processes over (wall time x the cores allowed): well below 100%
  means the processes idled (waiting on each other) or other processes took the cores.
  ``other load`` tells which: the CPU time the rest of the machine took during a run (the busy
  time in ``/proc/stat``, steal included, less the run's own processes), as a share of all CPUs,
  the most of any round. Above 5%, the report warns that the variant's rates are suspect.

    PYTHONPATH=. python bench/multi_instance.py [--quick] [--rounds 3] [--steps 5] [--warmup 2]
        [--learning-steps 6] [--variants stock,untuned,tuned,nproc] [--nproc 2] [--json PATH]

``--quick``: 2 rounds of 2 steps after 1 warm-up step, 3 learning steps. See bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness as h  # bench/ is this script's folder, first on sys.path

SEED = 20250
CLASSES = 1000
DATASET_BATCHES = 8  # batches in the synthetic data set (a multiple of every --nproc tried: no partial shards)
SETTLE_S = 0.5  # pause before each run
GROUP = "resnet18"
STOCK, UNTUNED, TUNED, NPROC = "stock", "untuned", "tuned", "nproc"
VARIANTS = (STOCK, UNTUNED, TUNED, NPROC)
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
        UNTUNED: "patched, untuned",
        TUNED: "patched, tuned",
        NPROC: f"patched, --nproc {nproc}",
    }[key]


# --- the worker: a plain training script ----------------------------------------------------


def build_model(name: str):
    if name == "tiny":
        from families.train_step.models import tiny_model  # bench/ is the script's folder, first on sys.path

        return tiny_model(CLASSES)
    import torchvision

    return getattr(torchvision.models, name)(weights=None, num_classes=CLASSES)


def thread_cpus() -> dict[str, list[str]]:
    """CPU list -> the names of this process's threads that may run there."""
    found: dict[str, list[str]] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{task}/status") as f:
                cpus = next(line for line in f if line.startswith("Cpus_allowed_list:")).split(":", 1)[1].strip()
        except (OSError, StopIteration):
            continue
        found.setdefault(cpus, []).append(name)
    return {cpus: sorted(names) for cpus, names in sorted(found.items())}


def worker_main(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))  # only to name the output file
    affinity_at_start = sorted(os.sched_getaffinity(0))
    started = time.perf_counter()
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(SEED)
    size = DATASET_BATCHES * args.batch
    images = torch.randn(size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, CLASSES, (size,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch, shuffle=True, drop_last=True)
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    model.train()

    def batches():
        while True:
            yield from loader

    stream = batches()
    first_batch: list[float] = []

    def step() -> float:
        x, y = next(stream)
        if not first_batch:
            first_batch.append(float(x.double().sum()) + float(y.sum()))
        optimizer.zero_grad()
        output = model(x)
        loss = criterion(output, y)
        loss.backward()
        optimizer.step()
        return loss.item()

    built = time.perf_counter()
    with h.Learning(args.learn, [model]).start() as learning:  # the first steps, for the learning check
        for _ in range(args.learn):
            step()
            learning.after_step()
    for _ in range(args.warmup):
        step()
    warmed = time.perf_counter()
    step_s = []
    cpu_start = time.process_time()
    start = time.perf_counter()
    for _ in range(args.steps):
        before = time.perf_counter()
        loss = step()
        step_s.append(time.perf_counter() - before)
    elapsed = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start

    # what it ran with, asked after the timing (queries only)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    initialised = dist.is_available() and dist.is_initialized()
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    with torch.no_grad():
        checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    result = {
        "rank": rank,
        "images": args.steps * args.batch,
        "seconds": elapsed,
        "cpu_s": cpu_s,
        "step_s": step_s,
        "loss": loss,
        "setup_s": built - started,
        "warmup_s": warmed - built,
        "learning_steps": args.learn,
        "learning": learning.record,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity_at_start": affinity_at_start,
        "affinity_after": sorted(os.sched_getaffinity(0)),
        "thread_cpus": thread_cpus(),
        "jemalloc": h.mapped_library("libjemalloc"),
        "tcmalloc": h.mapped_library("libtcmalloc"),
        "process_group": initialised,
        "world_size": dist.get_world_size() if initialised else 1,
        "backend": str(dist.get_backend()) if initialised else None,
        "ddp": any(isinstance(o, DistributedDataParallel) for o in gc.get_objects()),
        "loader_batches": len(loader),
        "data_checksum": first_batch[0] if first_batch else None,
        "param_checksum": checksum,
        "channels_last": None
        if conv is None
        else bool(conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()),
        "nanopatch_imported": "nanopatch" in sys.modules,
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "LD_PRELOAD")},
        "torch": torch.__version__,
        "pid": os.getpid(),
    }
    Path(args.worker, f"rank{rank}.json").write_text(json.dumps(result))
    return 0


# --- the parent: runs, rounds, report ---------------------------------------------------------


def run_env() -> dict[str, str]:
    """No caller's tuning, torchrun or NANOPATCH_* settings; this checkout's nanopatch importable."""
    return h.clean_env(CLEARED, ("NANOPATCH_", "TORCHELASTIC_", "TORCH_NCCL", "KMP_"))


def command(key: str, args: argparse.Namespace, out: str, learn: int = 0) -> list[str]:
    """The variant's command line; ``learn``: the steps it records first for the learning check."""
    worker = [
        os.path.abspath(__file__),
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
    launcher = {
        STOCK: [],
        UNTUNED: ["-m", "nanopatch", "--no-tune"],
        TUNED: ["-m", "nanopatch"],
        NPROC: ["-m", "nanopatch", "--nproc", str(args.nproc)],
    }[key]
    return [sys.executable, *launcher, *worker]


def run_once(key: str, args: argparse.Namespace, env: dict[str, str], workdir: str, learn: int) -> dict[str, Any]:
    """One fresh process (group) of a variant: its rate, or its error. ``learn``: the steps it
    records first for the learning check."""
    out = tempfile.mkdtemp(prefix=f"{key}-", dir=workdir)
    expected = args.nproc if key == NPROC else 1
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
        **h.rank_checks(ranks, "data_checksum"),
    }


#: facts that must not change from one round to the next
STABLE = ("processes", "threads", "affinity", "jemalloc", "tcmalloc", "world_size", "ddp", "loader_batches")


def ran_with(d: dict[str, Any]) -> str:
    """A short account of a variant's details, for the table."""
    if d["processes"] == 1:
        parts = [f"1 process, {h.plural(d['threads'][0], 'thread')}, CPUs {d['affinity'][0]}"]
    else:
        threads = "/".join(map(str, sorted(set(d["threads"]))))
        word = "thread" if threads == "1" else "threads"
        parts = [f"{d['processes']} processes x {threads} {word}, CPUs {' | '.join(d['affinity'])}"]
    if any(len(t) > 1 for t in d["thread_cpus"]):  # threads allowed on different CPU sets
        parts.append("OpenMP threads pinned")
    strays = sorted({n for names in d["threads_outside_own_cpus"] for n in names})
    if strays:
        count = max(len(names) for names in d["threads_outside_own_cpus"])
        parts.append(f"up to {count} threads per process not confined to its CPUs ({', '.join(strays)})")
    alloc = "jemalloc" if all(d["jemalloc"]) else "tcmalloc" if all(d["tcmalloc"]) else None
    if alloc is None and (any(d["jemalloc"]) or any(d["tcmalloc"])):
        alloc = "allocator differs between ranks"
    parts.append(alloc or "glibc malloc")
    if d["processes"] > 1 or max(d["world_size"]) > 1:
        ddp = "DDP" if all(d["ddp"]) else "no DDP"
        parts.append(f"world {max(d['world_size'])} ({d['backend']}), {ddp}")
        parts.append(f"{d['loader_batches'][0]} batches/epoch per rank")
    if d["nanopatch_imported"][0] and d["channels_last"][0]:
        parts.append("channels-last")
    return ", ".join(parts)


def problems(key: str, d: dict[str, Any], physical_cores: int, nproc: int) -> list[str]:
    """What a variant's details say it did not run as it should."""
    found = []
    if key == STOCK and any(d["nanopatch_imported"]):
        found.append("nanopatch was imported")
    if key != STOCK and not all(d["nanopatch_imported"]):
        found.append("nanopatch was not imported")
    if key == NPROC:
        if d["processes"] != nproc or set(d["world_size"]) != {nproc}:
            found.append(f"{d['processes']} processes, world size {d['world_size']} (expected {nproc})")
        if not all(d["ddp"]):
            found.append("no DistributedDataParallel in some rank")
        if physical_cores >= nproc and not d["disjoint_affinity"]:
            found.append(f"ranks' CPUs overlap: {' | '.join(d['affinity'])}")
        if not d["ranks_in_sync"]:
            found.append("ranks' parameters differ after the run (gradients not averaged)")
        if not d["ranks_saw_different_data"]:
            found.append("ranks saw the same first batch (loader not sharded)")
    elif max(d["world_size"]) != 1:
        found.append(f"world size {d['world_size']}")
    return found


def summarise(keys: list[str], runs: dict[str, list[dict[str, Any]]], args, cores: int, physical: int):
    rows, by_key = [], {}
    group = GROUP if args.model == "resnet18" else args.model
    for key in keys:
        ok = [r for r in runs[key] if "rate" in r]
        name, command_line = variant_name(key, args.nproc), shlex.join(command(key, args, "OUT"))
        r = h.ranks_row("multi_instance", group, name, "img/s", runs[key], cores, stock=key == STOCK, key=key)
        r["command"] = command_line
        if ok:
            facts = facts_of(ok[-1])
            changed = [f for f in STABLE if any(facts_of(x)[f] != facts[f] for x in ok)]
            d = r["details"]
            d.update(facts, changed_between_rounds=changed, step_s_per_rank=[x["step_s"] for x in ok[-1]["ranks"]])
            d["problems"] = problems(key, d, physical, args.nproc) + [f"{f} changed between rounds" for f in changed]
        h.learning_row(r, h.record_of(runs[key]), h.record_of(runs.get(STOCK, [])), variant_name(STOCK, args.nproc))
        rows.append(r)
        by_key[key] = r
    h.ratios_to(rows, by_key.get(STOCK))
    h.ratios_to(rows, by_key.get(TUNED), "ratio_to_tuned")
    return rows, by_key


def comparisons(by_key: dict[str, dict[str, Any]], nproc: int) -> list[dict[str, Any]]:
    pairs = [
        (NPROC, TUNED, f"--nproc {nproc} vs one process on all cores (patched, tuned)"),
        (TUNED, UNTUNED, "tuned vs untuned single process"),
        (TUNED, STOCK, "patched, tuned vs stock"),
    ]
    out = []
    for a, b, label in pairs:
        ra, rb = by_key.get(a), by_key.get(b)
        if not ra or not rb or ra["rate"] is None or rb["rate"] is None:
            continue
        rounds = h.per_round(ra["rates"], ra["rounds"], rb["rates"], rb["rounds"])
        out.append(
            {
                "label": label,
                "variant": ra["variant"],
                "against": rb["variant"],
                "ratio": ra["rate"] / rb["rate"],
                "per_round": rounds,
            }
        )
    return out


def print_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    print("## Several training instances on one machine\n")
    print(h.cpu_line(m) + f"; torch {m['torch']}, Python {m['python']}")
    print(
        f"- {report['description']}; {h.plural(report['rounds'], 'round')} x {h.plural(report['steps'], 'timed step')} "
        f"per run after {report['warmup']} warm-up, each run a fresh process (group), order rotated each round; "
        f"1-min load average at start {m['loadavg_start']}"
    )
    print("\n| variant | img/s (median) | min-max | x stock | x patched, tuned | CPU | other load | ran with |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in report["rows"]:
        if h.learns(row) is False:  # no rate: the verdict instead
            print(f"| {row['variant']} | {h.DOES_NOT_LEARN} |  |  |  |  |  | {h.cell(row['note'])} |")
            continue
        if row["rate"] is None:
            error = h.cell(row.get("error", "?"))
            print(f"| {row['variant']} | failed |  |  |  |  |  | {error} |")
            continue
        d = row["details"]
        low, high = row["spread"]
        cells = [
            row["variant"],
            h.fmt(row["rate"]),
            f"{h.fmt(low)}-{h.fmt(high)}",
            f"{row['ratio_to_stock']:.2f}x" if row["ratio_to_stock"] is not None else "",
            f"{row['ratio_to_tuned']:.2f}x" if "ratio_to_tuned" in row else "",
            f"{d['cpu_use'] * 100:.0f}%",
            f"{max(d['other_load']) * 100:.0f}%" if d["other_load"] else "?",
            ran_with(d),
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    for c in report["comparisons"]:
        rounds = c["per_round"]
        spread = f" (per round {min(rounds):.2f}-{max(rounds):.2f}x)" if rounds else ""
        print(f"- **{c['label']}**: {c['ratio']:.2f}x{spread}")
    for row in report["rows"]:
        for problem in row["details"].get("problems", []):
            print(f"- warning: `{row['variant']}`: {problem}")
        if row["details"].get("load_warning"):
            print(f"- warning: `{row['variant']}`: {row['details']['load_warning']}")
        if row.get("failed_runs"):
            print(f"- `{row['variant']}`: {row['failed_runs']} run(s) failed: {row['error']}")
    for row in report["rows"]:
        if row.get("learning"):
            print(f"- learning: {h.learning_line(row)}")
    nproc_row = next((r for r in report["rows"] if r["key"] == NPROC and "problems" in r["details"]), None)
    if nproc_row is not None:
        d = nproc_row["details"]
        print(
            f"- `{nproc_row['variant']}` checks: CPUs of the ranks "
            f"{'disjoint' if d['disjoint_affinity'] else 'overlapping'} ({' | '.join(d['affinity'])}); "
            f"ranks saw {'different' if d['ranks_saw_different_data'] else 'the same'} data; parameters "
            f"{'equal' if d['ranks_in_sync'] else 'different'} across ranks after the run"
        )
    print(
        "\nimg/s: images of all processes / the slowest process's time for the timed steps; the median over "
        "the rounds. CPU: CPU time of all processes / (wall time x cores allowed). other load: the most CPU "
        "time other processes of the machine took during one of the variant's runs (from /proc/stat, less this "
        "run's own), as a share of all CPUs. ran with: what the workers "
        "reported after the run (torch threads, CPU affinity when the process started, allocator mapped, "
        "process group)."
    )
    print(f"\nCommand: `{report['command']}`; run took {report['seconds']:.0f} s.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_round_options(parser)
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, of stock (plain python), untuned (python -m nanopatch --no-tune), tuned "
        "(python -m nanopatch), nproc (python -m nanopatch --nproc N) (default: %(default)s)",
    )
    parser.add_argument("--nproc", type=int, default=2, help="processes of the nproc variant (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    # for the test suite: a small model and sizes
    parser.add_argument("--model", choices=MODELS, default="resnet18", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--image-size", type=int, default=224, help=argparse.SUPPRESS)
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)  # internal: run as the training script
    parser.add_argument("--learn", type=int, default=0, help=argparse.SUPPRESS)  # steps recorded first
    args = parser.parse_args(argv)
    h.round_defaults(args)
    if args.worker:
        return worker_main(args)
    keys = h.parse_names(args.variants, VARIANTS, "--variants", parser)
    if min(args.rounds, args.steps, args.warmup, args.learning_steps, args.nproc, args.batch, args.image_size) < 1:
        parser.error("--rounds, --steps, --warmup, --learning-steps, --nproc, --batch and --image-size must be >= 1")

    log = h.log
    started = time.perf_counter()
    machine = h.machine_facts()
    env = run_env()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="nanopatch-multi-instance-") as workdir:
        run = h.recording_first(lambda key, learn: run_once(key, args, env, workdir, learn), args.learning_steps)
        runs, orders = h.interleave(keys, args.rounds, run, log, SETTLE_S)
    rounds_meta = [{"order": [variant_name(k, args.nproc) for k in o["order"]]} for o in orders]
    rows, by_key = summarise(keys, runs, args, cores, machine["physical_cores"])
    described = "torchvision ResNet-18" if args.model == "resnet18" else "a small CNN"
    report = {
        "benchmark": "multi_instance",
        "machine": machine,
        "command": shlex.join(["python", h.shown_path(__file__), *(sys.argv[1:] if argv is None else argv)]),
        "description": (
            f"{described}, batch {args.batch} per process at {args.image_size} px, SGD(momentum 0.9), "
            f"cross-entropy over {CLASSES} classes, synthetic data ({DATASET_BATCHES} batches, seed {SEED})"
        ),
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "learning_steps": args.learning_steps,
        "quick": args.quick,
        "round_orders": rounds_meta,
        "rows": rows,
        "comparisons": comparisons(by_key, args.nproc),
        "runs": {variant_name(k, args.nproc): h.runs_kept(by_key[k], v) for k, v in runs.items()},
        "seconds": time.perf_counter() - started,
    }
    return h.finish(report, args.json, print_markdown)


if __name__ == "__main__":
    sys.exit(main())
