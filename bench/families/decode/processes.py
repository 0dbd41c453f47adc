"""What decode.py and transforms.py share: the CPU a worker is pinned to, its malloc, the machine
facts, the worker processes in turn, the process options and the report they emit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness as h


def idlest_cpu(allowed: set[int], seconds: float = 0.3) -> int:
    """The allowed core with the most idle time over a short sample of /proc/stat (others may be
    running work on this machine); the highest-numbered one if that cannot be read."""

    def idle() -> dict[int, int]:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit():
                    out[int(name[3:])] = int(fields[3]) + int(fields[4])  # idle + iowait
        return out

    try:
        before = idle()
        time.sleep(seconds)
        after = idle()
        return max(sorted(allowed), key=lambda cpu: (after.get(cpu, 0) - before.get(cpu, 0), cpu))
    except (OSError, ValueError, IndexError):
        return max(allowed)


def reuse_freed_memory() -> None:
    """Fix glibc's malloc thresholds (as MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ would):
    buffers up to 32 MiB come from the heap and the heap is never trimmed, so a freed image
    buffer is reused by the next image instead of being unmapped and faulted in afresh."""
    import ctypes

    libc = ctypes.CDLL(None)
    m_trim_threshold, m_mmap_threshold = -1, -3
    if not (libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 30)):
        raise RuntimeError("mallopt failed: --malloc reuse needs glibc")


def deb_version(path: str | None) -> str | None:
    """``package version`` of the Debian package that installed ``path``, if dpkg knows it."""
    if path is None:
        return None
    try:
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, timeout=10)
        if owner.returncode != 0:
            return None
        package = owner.stdout.split(": ", 1)[0].strip()
        version = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{package} {version.stdout.strip()}" if version.returncode == 0 else None


def machine(cpu: int) -> dict[str, Any]:
    from importlib.metadata import version

    import cv2
    import numpy as np
    import PIL
    import torch
    import torchvision
    from PIL import features

    import nanopatch
    from nanopatch.targets.vision import decode

    opencv_jpeg = next(
        (line.split(":", 1)[1].strip() for line in cv2.getBuildInformation().splitlines() if "JPEG:" in line), "?"
    )
    backend = decode.jpeg_backend()
    libturbojpeg = h.mapped_library("libturbojpeg")
    return {
        "cpu": h.cpu_model(),
        "pinned_cpu": cpu,
        "cpus_available": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pillow": PIL.__version__,
        "pillow_jpg": features.version("jpg"),
        "pillow_libjpeg_turbo": features.check_feature("libjpeg_turbo"),
        "pillow_libjpeg_turbo_version": features.version("libjpeg_turbo"),
        "pyturbojpeg": version("PyTurboJPEG"),
        "libturbojpeg": libturbojpeg,
        "libturbojpeg_deb": deb_version(libturbojpeg),
        "opencv": cv2.__version__,
        "opencv_jpeg": opencv_jpeg,
        "nanopatch": nanopatch.__version__,
        "nanopatch_backend": backend.name if backend is not None else "pil",
    }


def run_worker_processes(
    script: str,
    args: argparse.Namespace,
    extra: list[str],
    log: Callable[[str], None],
    env: dict[str, str] | None = None,
) -> list[dict]:
    """The measurement, in ``args.processes`` fresh processes of ``script`` one after the
    other: the speed of Pillow's path varies from process to process (heap layout, malloc
    thresholds), so one process would draw a single sample of that. Each prints its JSON
    report; ``extra`` are the script's own worker options."""
    reports = []
    for index in range(args.processes):
        command = [sys.executable, os.path.abspath(script), "--worker-offset", str(index * args.rounds)]
        command += ["--cpu", str(args.cpu), "--rounds", str(args.rounds), "--data", str(args.data)]
        command += ["--small", str(args.small), "--large", str(args.large), "--sample-time", str(args.sample_time)]
        log(f"process {index + 1}/{args.processes}: {args.rounds} rounds")
        done = subprocess.run([*command, *extra], stdout=subprocess.PIPE, text=True, check=True, env=env)
        reports.append(json.loads(done.stdout))
    return reports


def print_setup(cpu: int, reports: list[dict], data: dict, libraries: list[str], load_prefix: str = "") -> None:
    """The machine, the libraries, the load and the data set, as decode.py and transforms.py print them."""
    info = reports[0]["machine"]
    print(f"CPU: {info['cpu']} ({info['cpus_available']} cpus; pinned to cpu {cpu}, 1 thread)")
    print(f"Python {info['python']}, numpy {info['numpy']}, torch {info['torch']}, torchvision {info['torchvision']}")
    for line in libraries:
        print(line)
    print(f"nanopatch {info['nanopatch']} (JPEG backend: {info['nanopatch_backend']})")
    loads = ", ".join(r["machine"]["loadavg"]["before"].split()[0] for r in reports)
    print(f"{load_prefix}1-min load average before each process's timing: {loads}")
    print()
    for name, entry in data.items():
        bpp = entry["bits_per_pixel"]
        print(
            f"data {name}: {entry['images']} JPEGs, q{entry['qualities'][0]}-{entry['qualities'][-1]}, 4:2:0, "
            f"{statistics.mean(bpp):.2f} bits/pixel mean ({min(bpp):.2f}-{max(bpp):.2f}) in {entry['dir']}"
        )
    print()


def emit(args: argparse.Namespace, reports: list[dict], rows: list[dict], data: dict, elapsed: float, print_report,
         **extra) -> int:  # fmt: skip
    """Print the results as JSON (``--json``: the machine as the measuring processes saw it, the
    host's facts and git state, the run's shape, ``extra``, the data set and the rows) or as the report."""
    if not args.json:
        print_report(args, reports, rows, data, elapsed)
        return 0
    report = {
        "machine": reports[0]["machine"],
        "host": h.machine_facts(),
        "pinned_cpu": args.cpu,
        "processes": args.processes,
        "rounds_per_process": args.rounds,
        "passes_per_sample": reports[0]["passes"],
        "loadavg_per_process": [r["machine"]["loadavg"] for r in reports],
        **extra,
        "data": data,
        "rows": rows,
        "seconds": elapsed,
    }
    print(json.dumps(report, indent=2))
    return 0


def quick_and_core(args: argparse.Namespace) -> None:
    """--quick halves the processes, rounds and images; the core is the idlest one unless given."""
    if args.quick:
        args.processes, args.rounds, args.small, args.large = (
            max(1, n // 2) for n in (args.processes, args.rounds, args.small, args.large)
        )
    if args.cpu is None:
        args.cpu = idlest_cpu(os.sched_getaffinity(0))


def add_process_options(parser: argparse.ArgumentParser, processes: int, sample_time: float, data: Path) -> None:
    """The options decode.py and transforms.py share: processes, rounds, images, sample time, data,
    core, --quick, --json and the internal --worker-offset."""
    parser.add_argument(
        "--processes", type=int, default=processes, help=f"fresh measuring processes (default {processes})"
    )
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per process (default 4)")
    parser.add_argument("--small", type=int, default=24, help="500x375 images (default 24)")
    parser.add_argument("--large", type=int, default=6, help="2400x1800 images (default 6)")
    parser.add_argument(
        "--sample-time", type=float, default=sample_time, help=f"seconds of stock per sample (default {sample_time})"
    )
    parser.add_argument("--quick", action="store_true", help="half the processes, rounds and images")
    parser.add_argument(
        "--data",
        type=Path,
        default=data,
        help="where the generated JPEGs live (made once, reused; default %(default)s)",
    )
    parser.add_argument("--cpu", type=int, help="the core to pin to (default: the idlest one at start)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--worker-offset", type=int, help=argparse.SUPPRESS)  # internal: one measuring process
