"""multi_instance's worker: a plain training script (one process, or one DDP rank) that writes its
rank's report.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import time
from pathlib import Path

import harness as h

from families.train_step.worker import MAX_TRIAL_STEPS, rss_mib  # bench/ is the script's folder, first on sys.path

SEED = 20250
CLASSES = 1000
DATASET_BATCHES = 8  # batches in the synthetic data set (a multiple of every --nproc tried: no partial shards)


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


#: set by --apart's launcher in each of its processes: its number, and how many run at once
INSTANCE_VARIABLE, INSTANCES_VARIABLE = "BENCH_INSTANCE", "BENCH_INSTANCES"


def meet(folder: str, name: str, count: int, timeout_s: float = 600.0) -> None:
    """Wait until ``count`` processes have reached this point (a file each in ``folder``)."""
    Path(folder, f"{name}{os.environ[INSTANCE_VARIABLE]}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(folder).glob(f"{name}*"))) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: {count} processes did not all arrive within {timeout_s:.0f} s")
        time.sleep(0.005)


def still_measuring() -> bool:
    """Whether nanopatch, if this script runs under it, still measures something for a model
    (bf16 against fp32, channels-last against stock's layout), in any rank of a process group."""
    measuring_here = h.measuring()
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return measuring_here
    import torch

    flag = torch.tensor([int(measuring_here)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def worker_main(args: argparse.Namespace) -> int:
    instance = os.environ.get(INSTANCE_VARIABLE)  # one of --apart's processes: no process group
    rank = int(instance or os.environ.get("RANK", "0"))  # only to name the output file
    affinity_at_start = sorted(os.sched_getaffinity(0))
    started = time.perf_counter()
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(SEED)
    size = DATASET_BATCHES * args.batch
    images = torch.randn(size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, CLASSES, (size,))
    data = TensorDataset(images, labels)
    if args.ddp:  # data-parallel by hand, as torch's DDP tutorial writes it (under torchrun)
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data.distributed import DistributedSampler

        dist.init_process_group("gloo")
        sampler = DistributedSampler(data, shuffle=True, seed=SEED, drop_last=True)
        loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
        model = DistributedDataParallel(build_model(args.model))
    else:
        loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True)
        model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    model.train()

    def batches():
        while True:
            yield from loader

    stream = batches()
    first_batch: list[float] = []
    fetch_s: list[float] = []  # each step's wait for its batch

    def step() -> float:
        before = time.perf_counter()
        x, y = next(stream)
        fetch_s.append(time.perf_counter() - before)
        if not first_batch:
            first_batch.append(float(x.double().sum()) + float(y.sum()))
        optimizer.zero_grad()
        output = model(x)
        loss = criterion(output, y)
        loss.backward()
        optimizer.step()
        return loss.item()

    built = time.perf_counter()
    with h.Learning(
        args.learn, [getattr(model, "module", model)]
    ).start() as learning:  # the first steps, for the learning check
        for _ in range(args.learn):
            step()
            learning.after_step()
    for _ in range(args.warmup):
        step()
    # the steps nanopatch spends measuring (bf16 against fp32, channels-last against stock's
    # layout: at most MAX_TRIAL_STEPS) are warm-up too: timed,
    # they would mix fp32 steps into the rate of what it chose. Ranks agree on the count, or the
    # one that stopped first would wait for the others' gradients for ever.
    trial_steps = 0
    while trial_steps < MAX_TRIAL_STEPS and still_measuring():
        step()
        trial_steps += 1
    if args.no_loader:  # the same steps without the loader's work: one epoch it collated, over again
        stream = itertools.cycle(list(loader))
    if instance is not None:  # the processes at once time their steps together
        meet(args.worker, "ready", int(os.environ[INSTANCES_VARIABLE]))
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
    if instance is not None:  # untimed steps until every process has timed its own: all timed side by side
        Path(args.worker, f"done{rank}").touch()
        while len(list(Path(args.worker).glob("done*"))) < int(os.environ[INSTANCES_VARIABLE]):
            step()

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
        "fetch_s": fetch_s[-args.steps :],
        "loss": loss,
        "setup_s": built - started,
        "warmup_s": warmed - built,
        "trial_steps": trial_steps,
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
        "loader_timed": not args.no_loader,
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
    result["rss_mib"], result["peak_rss_mib"] = rss_mib()
    Path(args.worker, f"rank{rank}.json").write_text(json.dumps(result))
    return 0
