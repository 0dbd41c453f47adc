"""decode's worker process: the variants timed in interleaved rounds, pinned to one CPU."""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness as h

from families.decode.dataset import SIZES, dataset, size_name
from families.decode.processes import machine, reuse_freed_memory, run_worker_processes
from families.decode.variants import STOCK, variants, verify

#: the script a worker process runs (with --worker-offset): bench/decode.py
SCRIPT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "decode.py"))


def measure(funcs: dict[str, Callable[[Path], Any]], paths: dict, rounds: int, offset: int, sample_time: float):
    """Time every variant once per round, the order rotated each round (starting at ``offset``).

    A sample is ``passes`` passes over the images of a size, enough for the stock loader to
    take ``sample_time`` seconds (the same count for every variant of that size). Besides
    images/s, each sample records its CPU time / wall time (below ~1, other processes took the
    core) and its minor page faults per image (memory freshly mapped, and zeroed by the kernel,
    for every image). Returns {metric: {"variant|size": [per round]}} and {size: passes}."""
    names = list(funcs)
    keys = [f"{name}|{size_name(size)}" for size in paths for name in names]
    out: dict[str, dict[str, list[float]]] = {m: {k: [] for k in keys} for m in ("img_per_s", "cpu_share", "faults")}
    passes: dict[str, int] = {}
    for size, files in paths.items():  # warm-up pass, untimed; then size the samples
        for name in names:
            for path in files:
                funcs[name](path)
        start = time.perf_counter()
        for path in files:
            funcs[STOCK](path)
        passes[size_name(size)] = max(1, math.ceil(sample_time / (time.perf_counter() - start)))
    for round_index in range(offset, offset + rounds):
        order = h.rotated(names, round_index)
        for size, files in paths.items():
            count = passes[size_name(size)] * len(files)
            for name in order:
                fn = funcs[name]
                gc.collect()
                faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                cpu_start = time.process_time()
                start = time.perf_counter()
                for _ in range(passes[size_name(size)]):
                    for path in files:
                        fn(path)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu_start
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_start
                key = f"{name}|{size_name(size)}"
                out["img_per_s"][key].append(count / elapsed)
                out["cpu_share"][key].append(cpu / elapsed)
                out["faults"][key].append(faults / count)
    return out, passes


def worker(args: argparse.Namespace) -> int:
    """One measuring process: pin, patch once, verify, time; print the raw results as JSON."""
    os.sched_setaffinity(0, {args.cpu})  # before anything starts a thread pool
    if args.malloc == "reuse":
        reuse_freed_memory()
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    paths = dataset(args.data, {SIZES[0]: args.small, SIZES[1]: args.large}, generate=False)

    import nanopatch

    nanopatch.patch_torch(vision=True)  # once: toggling per call would time the patching
    funcs, calls = variants()
    outputs = verify(funcs, paths)
    load_before = h.load_average()
    results, passes = measure(funcs, paths, args.rounds, args.worker_offset, args.sample_time)
    info = machine(args.cpu)
    info["loadavg"] = {"before": load_before, "after": h.load_average()}
    json.dump({"machine": info, "calls": calls, "outputs": outputs, "passes": passes, **results}, sys.stdout)
    return 0


def run_workers(args: argparse.Namespace, log: Callable[[str], None]) -> list[dict]:
    return run_worker_processes(SCRIPT, args, ["--malloc", args.malloc], log)
