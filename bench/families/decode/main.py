"""decode's command line: the data set, the worker processes and the report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import harness as h

from families.decode.dataset import GENERATOR_VERSION, SIZES, bits_per_pixel, dataset, qualities, size_name
from families.decode.processes import add_process_options, emit, quick_and_core
from families.decode.summary import print_report, summarise
from families.decode.worker import run_workers, worker


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """bench/decode.py's command line; ``description`` is its --help text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = Path.home() / ".cache" / "nanopatch-bench" / "decode" / f"v{GENERATOR_VERSION}"
    add_process_options(parser, processes=6, sample_time=0.2, data=data)
    parser.add_argument(
        "--malloc",
        choices=("default", "reuse"),
        default="default",
        help="default: glibc's own (dynamic) mmap/trim thresholds, what a training script gets; reuse: "
        "mmap threshold 32 MiB and no heap trimming, so freed image buffers are reused and no variant "
        "pays page faults for fresh memory (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.worker_offset is not None:
        return worker(args)
    quick_and_core(args)

    log = h.log
    started = time.perf_counter()
    paths = dataset(args.data, {SIZES[0]: args.small, SIZES[1]: args.large}, log=log)
    reports = run_workers(args, log)
    rows = summarise(reports, paths)
    elapsed = time.perf_counter() - started
    data = {
        size_name(size): {
            "dir": str(args.data),
            "images": len(files),
            "qualities": qualities(len(files)),
            "subsampling": "4:2:0",
            "bits_per_pixel": bits_per_pixel(files, size),
        }
        for size, files in paths.items()
    }
    return emit(args, reports, rows, data, elapsed, print_report, malloc=args.malloc, calls=reports[0]["calls"])
