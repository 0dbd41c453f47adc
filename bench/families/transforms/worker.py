"""transforms' worker process: the pipelines timed in interleaved rounds, one thread everywhere."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness as h

from families.decode import processes as decode_processes
from families.transforms.checks import PatchStates, implementation, verify
from families.transforms.pipelines import (
    ALBU,
    CODEC,
    KORNIA,
    LARGE,
    OPTIONAL,
    PATCHED,
    SEED,
    SMALL,
    STOCK,
    TENSOR,
    TENSOR_NP,
    VARIANTS,
    albumentations_dataset,
    albumentations_pipeline,
    dataset_files,
    kornia_dataset,
    kornia_pipeline,
    reseed,
    size_name,
    tensor_dataset,
    tensor_pipeline,
    torchcodec_dataset,
    torchvision_pipeline,
)

#: the script a worker process runs (with --worker-offset): bench/transforms.py
SCRIPT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "transforms.py"))


def measure(sets: dict, states: PatchStates, rounds: int, offset: int, sample_time: float):
    """Time every variant once per round, the order rotated each round (starting at ``offset``).

    A sample is ``passes`` passes of ``dataset[i]`` over all images of a size, enough for stock
    to take ``sample_time`` seconds (the same count for every variant of that pipeline and size),
    in the variant's patch state (entered before the timer starts) and with the same seed for
    every variant of a round. Returns {metric: {"pipeline|size|variant": [per round]}} and
    {"pipeline|size": passes}."""
    names = list(next(iter(sets.values())))
    out: dict[str, dict[str, list[float]]] = {"img_per_s": {}, "img_per_cpu_s": {}, "cpu_share": {}}
    passes: dict[str, int] = {}
    for (pipeline, size), by_variant in sets.items():  # warm-up pass, untimed; then size the samples
        for name in names:
            states.enter(name)
            for index in range(len(by_variant[name])):
                by_variant[name][index]
        states.enter(STOCK)
        dataset = by_variant[STOCK]
        start = time.perf_counter()
        for index in range(len(dataset)):
            dataset[index]
        passes[f"{pipeline}|{size_name(size)}"] = max(1, round(sample_time / (time.perf_counter() - start)))
    for round_index in range(offset, offset + rounds):
        order = h.rotated(names, round_index)
        for (pipeline, size), by_variant in sets.items():
            group = f"{pipeline}|{size_name(size)}"
            for name in order:
                dataset = by_variant[name]
                count = len(dataset)
                states.enter(name)
                reseed(name, dataset, SEED + round_index)
                gc.collect()
                cpu_start = time.process_time()
                start = time.perf_counter()
                for _ in range(passes[group]):
                    for index in range(count):
                        dataset[index]
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu_start
                key = f"{group}|{name}"
                out["img_per_s"].setdefault(key, []).append(passes[group] * count / elapsed)
                out["img_per_cpu_s"].setdefault(key, []).append(passes[group] * count / cpu)
                out["cpu_share"].setdefault(key, []).append(cpu / elapsed)
    states.enter(STOCK)
    return out, passes


def worker(args: argparse.Namespace) -> int:
    """One measuring process: pin, build every variant in its patch state, verify, time; print
    the raw results as JSON."""
    os.sched_setaffinity(0, {args.cpu})  # before anything starts a thread pool
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # no version check over the network
    result_stream, sys.stdout = sys.stdout, sys.stderr  # stdout carries only the JSON
    import cv2
    import torch
    import torchvision.datasets

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    files = dataset_files(args.data, {SMALL: args.small, LARGE: args.large}, generate=False)
    notes = []
    versions = {variant: peer_version(module, notes) for variant, module in OPTIONAL.items()}

    states = PatchStates()  # nothing patched after this
    sets: dict[tuple[str, tuple[int, int]], dict[str, Any]] = {}
    by_variant: dict[str, dict[str, Any]] = {}  # variant -> {"pipeline size": dataset}
    for variant in VARIANTS:
        if variant in OPTIONAL and versions[variant] is None:
            continue
        states.enter(variant)  # each variant builds its own pipelines and ImageFolders in its own state
        for size, (root, paths) in files.items():
            for pipeline in args.pipelines:
                if variant == ALBU:
                    stock = sets[(pipeline, size)][STOCK]
                    dataset = albumentations_dataset(stock.samples, albumentations_pipeline(pipeline))
                elif variant in (TENSOR, TENSOR_NP):
                    stock = sets[(pipeline, size)][STOCK]
                    dataset = tensor_dataset(stock.samples, tensor_pipeline(pipeline))
                elif variant == CODEC:
                    stock = sets[(pipeline, size)][STOCK]
                    dataset = torchcodec_dataset(stock.samples, tensor_pipeline(pipeline))
                elif variant == KORNIA:
                    stock = sets[(pipeline, size)][STOCK]
                    dataset = kornia_dataset(stock.samples, kornia_pipeline(pipeline))
                else:
                    dataset = torchvision.datasets.ImageFolder(str(root), transform=torchvision_pipeline(pipeline))
                    found = sorted(Path(p) for p, _ in dataset.samples)
                    assert found == sorted(paths), f"{root} holds other images than the generated ones"
                sets.setdefault((pipeline, size), {})[variant] = dataset
                by_variant.setdefault(variant, {})[f"{pipeline} {size_name(size)}"] = dataset
    impls = {variant: implementation(variant, datasets, states) for variant, datasets in by_variant.items()}
    if all(impls[v]["uses"] == "tv transforms, np loader" for v in PATCHED):
        notes.append(
            "the nanopatch variants ran torchvision's own transform classes: they differ from stock only in the "
            "JPEG loader"
        )
    checks = verify(sets, {size: paths for size, (_, paths) in files.items()}, states)
    load_before = h.load_average()
    results, passes = measure(sets, states, args.rounds, args.worker_offset, args.sample_time)
    info = decode_processes.machine(args.cpu)
    info["albumentations"] = versions[ALBU]
    info["torchcodec"] = versions[CODEC]
    info["kornia"] = versions[KORNIA]
    info["torch_threads"] = torch.get_num_threads()
    info["opencv_threads"] = cv2.getNumThreads()
    info["loadavg"] = {"before": load_before, "after": h.load_average()}
    report = {"machine": info, "implementations": impls, "checks": checks, "notes": notes, "passes": passes}
    json.dump({**report, **results}, result_stream)
    return 0


def peer_version(module: str, notes: list[str]) -> str | None:
    """The version of the peer library ``module``, or None (and a note) where it does not import:
    not installed, or (TorchCodec) built for another torch."""
    import importlib

    try:
        return str(importlib.import_module(module).__version__)
    except Exception as exc:  # ImportError, or a native library that will not load beside this torch
        notes.append(f"{module} does not import here ({type(exc).__name__}: {str(exc)[:120]}): no {module} column")
        return None


def run_workers(args: argparse.Namespace, log: Callable[[str], None]) -> list[dict]:
    """The measurement, in ``args.processes`` fresh processes one after the other, one thread
    everywhere."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return decode_processes.run_worker_processes(SCRIPT, args, ["--pipelines", ",".join(args.pipelines)], log, env)
