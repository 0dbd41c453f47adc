"""Training throughput of one machine: one process, one process tuned, or several pinned processes.

Times the training loop a user writes for torchvision's ResNet-18 (batch 32 per process at
224 px, SGD(lr 0.01, momentum 0.9, weight decay 1e-4), cross-entropy over 1000 classes; the data
is a synthetic data set of 8 batches, generated with a fixed seed and read through a shuffling
``DataLoader``) in these variants, all on the same cores:

* ``stock``: ``python worker.py``; nanopatch is never imported (checked), torch's default threads.
* ``patched, untuned``: ``python -m nanopatch --no-tune worker.py``: the patches, no runtime tuning.
* ``patched, tuned``: ``python -m nanopatch worker.py``: one process on all the cores, with the
  runtime tuning (``OMP_NUM_THREADS``, OpenMP affinity, jemalloc or tcmalloc preloaded).
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
        [--variants stock,untuned,tuned,nproc] [--nproc 2] [--json PATH]

``--quick``: 2 rounds of 2 steps after 1 warm-up step. See bench/README.md.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEED = 20250
CLASSES = 1000
DATASET_BATCHES = 8  # batches in the synthetic data set (a multiple of every --nproc tried: no partial shards)
SETTLE_S = 0.5  # pause before each run
OTHER_LOAD_WARNING = 0.05  # share of the machine's CPU time taken by other processes during a run
GROUP = "resnet18"
STOCK, UNTUNED, TUNED, NPROC = "stock", "untuned", "tuned", "nproc"
VARIANTS = (STOCK, UNTUNED, TUNED, NPROC)
MODELS = ("resnet18", "tiny")  # tiny: a small CNN, for the test suite
DEFAULTS = {False: {"rounds": 3, "steps": 5, "warmup": 2}, True: {"rounds": 2, "steps": 2, "warmup": 1}}
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
        from train_step import tiny_model  # bench/ is the script's folder, first on sys.path

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


def mapped(fragment: str) -> str | None:
    """Path of a library mapped into this process whose file name contains ``fragment``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if fragment in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


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
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity_at_start": affinity_at_start,
        "affinity_after": sorted(os.sched_getaffinity(0)),
        "thread_cpus": thread_cpus(),
        "jemalloc": mapped("libjemalloc"),
        "tcmalloc": mapped("libtcmalloc"),
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
    import importlib.util

    spec = importlib.util.find_spec("nanopatch")
    assert spec is not None and spec.origin is not None
    package_parent = str(Path(spec.origin).resolve().parent.parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CLEARED and not k.startswith(("NANOPATCH_", "TORCHELASTIC_", "TORCH_NCCL", "KMP_"))
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command(key: str, args: argparse.Namespace, out: str) -> list[str]:
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
    ]
    launcher = {
        STOCK: [],
        UNTUNED: ["-m", "nanopatch", "--no-tune"],
        TUNED: ["-m", "nanopatch"],
        NPROC: ["-m", "nanopatch", "--nproc", str(args.nproc)],
    }[key]
    return [sys.executable, *launcher, *worker]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def machine_busy_s() -> float | None:
    """CPU seconds all CPUs of the machine have spent busy since boot (steal included), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_PR_SET_CHILD_SUBREAPER = 36


def adopt_descendants() -> None:
    """Processes a run leaves behind (Lightning's DDP rank 1, started by rank 0 and not waited
    for) become this process's children when their parent exits, so that
    :func:`reap_descendants` can wait for them and their CPU time counts as the run's own, not
    as other load. Linux only; elsewhere nothing changes."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def reap_descendants(group: int, timeout: float) -> None:
    """Wait for every child left (see :func:`adopt_descendants`); after ``timeout`` seconds,
    kill process group ``group`` (the run's session) and reap what remains."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
            deadline = float("inf")
        time.sleep(0.05)


def run_once(key: str, args: argparse.Namespace, env: dict[str, str], workdir: str) -> dict[str, Any]:
    """One fresh process (group) of a variant: its rate, or its error."""
    out = tempfile.mkdtemp(prefix=f"{key}-", dir=workdir)
    argv = command(key, args, out)
    log_path = Path(out, "log.txt")
    expected = args.nproc if key == NPROC else 1
    adopt_descendants()
    busy_before, ours_before = machine_busy_s(), children_cpu_s()
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"error": f"no result within {args.timeout:.0f} s (killed)", "log": tail(log_path)}
    reap_descendants(proc.pid, 60)
    wall = time.perf_counter() - started
    busy_after, ours = machine_busy_s(), children_cpu_s() - ours_before
    # CPU time of everything else on the machine during the run, as a share of all its CPUs
    other_load = None
    if busy_before is not None and busy_after is not None:
        other_load = max(0.0, busy_after - busy_before - ours) / (wall * (os.cpu_count() or 1))
    ranks = []
    for path in sorted(Path(out).glob("rank*.json")):
        try:
            ranks.append(json.loads(path.read_text()))
        except ValueError as exc:
            return {"error": f"{path.name}: {exc}", "log": tail(log_path)}
    if code != 0:
        return {"error": f"exited with status {code}", "log": tail(log_path)}
    if len(ranks) != expected:
        return {"error": f"{len(ranks)} rank result(s), expected {expected}", "log": tail(log_path)}
    ranks.sort(key=lambda r: r["rank"])
    images = sum(r["images"] for r in ranks)
    seconds = max(r["seconds"] for r in ranks)
    return {
        "rate": images / seconds,
        "images": images,
        "seconds": seconds,
        "cpu_s": sum(r["cpu_s"] for r in ranks),
        "wall_s": wall,
        "other_load": other_load,
        "ranks": ranks,
    }


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
    starts = [set(r["affinity_at_start"]) for r in ranks]
    disjoint = all(not (a & b) for i, a in enumerate(starts) for b in starts[i + 1 :])
    checksums = [r["param_checksum"] for r in ranks]
    in_sync = all(abs(c - checksums[0]) <= 1e-9 * max(1.0, abs(checksums[0])) for c in checksums)
    data = [r["data_checksum"] for r in ranks]
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
        "disjoint_affinity": disjoint if len(ranks) > 1 else None,
        "ranks_in_sync": in_sync if len(ranks) > 1 else None,
        "ranks_saw_different_data": len(set(data)) == len(data) if len(ranks) > 1 else None,
    }


#: facts that must not change from one round to the next
STABLE = ("processes", "threads", "affinity", "jemalloc", "tcmalloc", "world_size", "ddp", "loader_batches")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ran_with(d: dict[str, Any]) -> str:
    """A short account of a variant's details, for the table."""
    if d["processes"] == 1:
        parts = [f"1 process, {plural(d['threads'][0], 'thread')}, CPUs {d['affinity'][0]}"]
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
    rows = []
    by_key = {}
    for key in keys:
        name = variant_name(key, args.nproc)
        ok = [r for r in runs[key] if "rate" in r]
        errors = [r for r in runs[key] if "rate" not in r]
        row: dict[str, Any] = {
            "group": GROUP if args.model == "resnet18" else args.model,
            "variant": name,
            "key": key,
            "rate": None,
            "unit": "img/s",
            "ratio": None,
            "baseline": variant_name(STOCK, args.nproc),
            "spread": [],
            "rates": [r["rate"] for r in ok],
            "rounds": [r["round"] for r in ok],
            "command": shlex.join(command(key, args, "OUT")),
            "details": {},
        }
        if errors:
            row["error"] = errors[0]["error"]
            row["failed_runs"] = len(errors)
            row["log"] = errors[0].get("log", "")
        if ok:
            rates = row["rates"]
            row["rate"] = statistics.median(rates)
            row["spread"] = [min(rates), max(rates)]
            details = facts_of(ok[-1])
            changed = [f for f in STABLE if any(facts_of(r)[f] != details[f] for r in ok)]
            details["changed_between_rounds"] = changed
            details["cpu_use"] = statistics.median(r["cpu_s"] / (r["seconds"] * cores) for r in ok)
            details["step_s_per_rank"] = [r["step_s"] for r in ok[-1]["ranks"]]
            details["setup_s"] = statistics.median(max(x["setup_s"] for x in r["ranks"]) for r in ok)
            details["wall_s"] = statistics.median(r["wall_s"] for r in ok)
            loads = [r["other_load"] for r in ok if r["other_load"] is not None]
            details["other_load"] = loads
            busy = [f"{x * 100:.0f}%" for x in loads if x > OTHER_LOAD_WARNING]
            details["load_warning"] = None
            if busy:
                details["load_warning"] = (
                    f"other processes took {', '.join(busy)} of the machine's CPU time during "
                    f"{plural(len(busy), 'run')} of {len(ok)}: those rates are suspect"
                )
            details["problems"] = problems(key, details, physical, args.nproc) + [
                f"{f} changed between rounds" for f in changed
            ]
            row["details"] = details
        rows.append(row)
        by_key[key] = row
    stock, tuned = by_key.get(STOCK), by_key.get(TUNED)
    for row in rows:
        if row["rate"] is None:
            continue
        if stock and stock["rate"]:
            row["ratio"] = row["rate"] / stock["rate"]
        if tuned and tuned["rate"]:
            row["ratio_to_tuned"] = row["rate"] / tuned["rate"]
    return rows, by_key


def per_round(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """a's rate / b's, round by round (rounds where both ran)."""
    theirs = dict(zip(b["rounds"], b["rates"], strict=True))
    return [r / theirs[i] for i, r in zip(a["rounds"], a["rates"], strict=True) if i in theirs]


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
        rounds = per_round(ra, rb)
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


def fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def print_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    print("## Several training instances on one machine\n")
    print(
        f"- CPU: {m['model_name']} ({m['logical_cpus']} logical CPUs, {m['physical_cores']} physical cores "
        f"allowed, usable {m['usable_cores']}); flags: {' '.join(m['flags']) or '-'}; AMX: "
        f"{'yes' if m['amx'] else 'no'}; torch {m['torch']}, Python {m['python']}"
    )
    print(
        f"- {report['description']}; {plural(report['rounds'], 'round')} x {plural(report['steps'], 'timed step')} "
        f"per run after {report['warmup']} warm-up, each run a fresh process (group), order rotated each round; "
        f"1-min load average at start {m['loadavg_start']}"
    )
    print("\n| variant | img/s (median) | min-max | x stock | x patched, tuned | CPU | other load | ran with |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in report["rows"]:
        if row["rate"] is None:
            error = " ".join(str(row.get("error", "?")).split()).replace("|", "/")
            print(f"| {row['variant']} | failed |  |  |  |  |  | {error} |")
            continue
        d = row["details"]
        low, high = row["spread"]
        cells = [
            row["variant"],
            fmt(row["rate"]),
            f"{fmt(low)}-{fmt(high)}",
            f"{row['ratio']:.2f}x" if row["ratio"] is not None else "",
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
        for problem in row["details"].get("problems", []) if row["rate"] is not None else []:
            print(f"- warning: `{row['variant']}`: {problem}")
        if row["rate"] is not None and row["details"]["load_warning"]:
            print(f"- warning: `{row['variant']}`: {row['details']['load_warning']}")
        if row.get("failed_runs"):
            print(f"- `{row['variant']}`: {row['failed_runs']} run(s) failed: {row['error']}")
    nproc_row = next((r for r in report["rows"] if r["key"] == NPROC and r["rate"] is not None), None)
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


def shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return os.path.abspath(path) if relative.startswith("..") else relative


def machine_facts() -> dict[str, Any]:
    from importlib.metadata import version

    from nanopatch import cpu

    facts = cpu.host_facts().as_dict()
    try:
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except OSError:
        load = "?"
    return {
        **{
            k: facts[k]
            for k in ("vendor", "model_name", "flags", "logical_cpus", "allowed_cpus", "physical_cores", "sockets")
        },
        "usable_cores": facts["usable_cores"],
        "amx": facts["amx"],
        "native_bf16": facts["native_bf16"],
        "python": platform.python_version(),
        "torch": version("torch"),
        "torchvision": version("torchvision"),
        "loadavg_start": load,
    }


def parse_variants(text: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        parser.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="rounds; every variant runs once per round (default 3; 2 --quick)")
    parser.add_argument("--steps", type=int, help="timed training steps per run (default 5; 2 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them (default 2; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 steps after 1 warm-up step")
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
    args = parser.parse_args(argv)
    for name, value in DEFAULTS[args.quick].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.worker:
        return worker_main(args)
    keys = parse_variants(args.variants, parser)
    if min(args.rounds, args.steps, args.warmup, args.nproc, args.batch, args.image_size) < 1:
        parser.error("--rounds, --steps, --warmup, --nproc, --batch and --image-size must be >= 1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    machine = machine_facts()
    env = run_env()
    cores = len(os.sched_getaffinity(0))
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
    rounds_meta = []
    with tempfile.TemporaryDirectory(prefix="nanopatch-multi-instance-") as workdir:
        for index in range(args.rounds):
            order = keys[index % len(keys) :] + keys[: index % len(keys)]
            rounds_meta.append({"order": [variant_name(k, args.nproc) for k in order]})
            log(f"round {index + 1}/{args.rounds}: {', '.join(order)}")
            for key in order:
                time.sleep(SETTLE_S)
                result = run_once(key, args, env, workdir)
                result["round"] = index
                runs[key].append(result)
                name = variant_name(key, args.nproc)
                if "rate" in result:
                    log(f"  {name}: {result['rate']:.3g} img/s ({result['wall_s']:.0f} s)")
                else:
                    log(f"  {name}: FAILED: {result['error']}\n{result.get('log', '')}")
    rows, by_key = summarise(keys, runs, args, cores, machine["physical_cores"])
    described = "torchvision ResNet-18" if args.model == "resnet18" else "a small CNN"
    report = {
        "benchmark": "multi_instance",
        "machine": machine,
        "command": shlex.join(["python", shown_path(__file__), *(sys.argv[1:] if argv is None else argv)]),
        "description": (
            f"{described}, batch {args.batch} per process at {args.image_size} px, SGD(momentum 0.9), "
            f"cross-entropy over {CLASSES} classes, synthetic data ({DATASET_BATCHES} batches, seed {SEED})"
        ),
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "quick": args.quick,
        "round_orders": rounds_meta,
        "rows": rows,
        "comparisons": comparisons(by_key, args.nproc),
        "runs": {variant_name(k, args.nproc): v for k, v in runs.items()},
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print_markdown(report)
    # a variant that failed is a row with its error (bench/run.py reads the JSON only after exit code 0)
    return 0 if any(r["rate"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
