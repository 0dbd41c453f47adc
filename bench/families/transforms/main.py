"""transforms' command line: the data set, the worker processes and the report."""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import harness as h

from families.decode import dataset as decode_dataset
from families.decode import processes as decode_processes
from families.transforms.pipelines import LARGE, OPTIONAL, PIPELINES, SMALL, dataset_files, size_name
from families.transforms.summary import print_report, summarise
from families.transforms.worker import run_workers, worker


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """bench/transforms.py's command line; ``description`` is its --help text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = Path.home() / ".cache" / "nanopatch-bench" / "transforms" / f"v{decode_dataset.GENERATOR_VERSION}"
    decode_processes.add_process_options(parser, processes=5, sample_time=0.25, data=data)
    parser.add_argument(
        "--pipelines",
        default=",".join(PIPELINES),
        help="comma-separated, of %(default)s (default: all)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: images per second of wall time (what a training job sees); cpu: per second of this "
        "process's CPU time, steadier when other processes share the core (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    args.pipelines = h.parse_names(args.pipelines, PIPELINES, "--pipelines", parser)
    if args.worker_offset is not None:
        return worker(args)
    decode_processes.quick_and_core(args)

    log = h.log
    started = time.perf_counter()
    for module in OPTIONAL.values():
        if importlib.util.find_spec(module) is None:
            log(f"{module} is not installed: running without the {module} column")
    files = dataset_files(args.data, {SMALL: args.small, LARGE: args.large}, generate=True, log=log)
    reports = run_workers(args, log)
    rows = summarise(reports, list(files), args.pipelines, args.clock)
    elapsed = time.perf_counter() - started
    data = {
        size_name(size): {
            "dir": str(root),
            "images": len(paths),
            "qualities": decode_dataset.qualities(len(paths)),
            "subsampling": "4:2:0",
            "bits_per_pixel": decode_dataset.bits_per_pixel(paths, size),
        }
        for size, (root, paths) in files.items()
    }
    checks = {key: [r["checks"][key] for r in reports] for key in reports[0]["checks"]}
    extra = {"implementations": reports[0]["implementations"], "checks": checks, "notes": reports[0]["notes"]}
    return decode_processes.emit(args, reports, rows, data, elapsed, print_report, clock=args.clock, **extra)
