"""multi_instance's command line: the rounds of every variant and the report."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

import harness as h

from families.multi_instance.launch import (
    MODELS,
    SCRIPT,
    SETTLE_S,
    VARIANTS,
    apart_main,
    expand,
    run_env,
    run_once,
    variant_name,
)
from families.multi_instance.summary import comparisons, memory, print_markdown, summarise
from families.multi_instance.worker import CLASSES, DATASET_BATCHES, SEED, worker_main


def counts(text: str) -> list[int]:
    """--nproc's "2" or "2,4,8": the counts, in order, once each."""
    try:
        found = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give process counts, as 2 or 2,4,8") from None
    if not found:
        raise argparse.ArgumentTypeError("give at least one process count")
    return list(dict.fromkeys(found))


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """bench/multi_instance.py's command line; ``description`` is its --help text (the script's docstring)."""
    given = sys.argv[1:] if argv is None else argv
    if "--apart" in given:  # internal: the launcher of the apart variant's processes
        return apart_main(list(given))
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_round_options(parser)
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, of stock (plain python), stock-nproc (torchrun --nproc-per-node N, the script "
        "doing DDP itself, OMP_NUM_THREADS its share of the cores), untuned (python -m nanopatch --no-tune), tuned "
        "(python -m nanopatch), unpinned (the same, --no-pin-threads), glibc (the same, --allocator default), "
        "no-loader (the same, its timed steps taking batches its DataLoader collated before), "
        "share (python -m nanopatch on the CPUs --nproc N gives its first process), apart (N such processes at once, "
        "each on its rank's CPUs, no process group), nproc (python -m nanopatch "
        "--nproc N) (default: %(default)s)",
    )
    parser.add_argument(
        "--nproc",
        type=counts,
        default=[2],
        metavar="N[,N...]",
        help="processes of the stock-nproc, share and nproc variants, each count a variant of its own: 2,4,8 "
        "measures weak scaling at each (default 2)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    # for the test suite: a small model and sizes
    parser.add_argument("--model", choices=MODELS, default="resnet18", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--image-size", type=int, default=224, help=argparse.SUPPRESS)
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)  # internal: run as the training script
    parser.add_argument("--learn", type=int, default=0, help=argparse.SUPPRESS)  # steps recorded first
    parser.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)  # the worker does DDP itself
    parser.add_argument("--no-loader", action="store_true", help=argparse.SUPPRESS)  # timed steps skip the loader
    args = parser.parse_args(argv)
    h.round_defaults(args)
    if args.worker:
        return worker_main(args)
    keys = expand(h.parse_names(args.variants, VARIANTS, "--variants", parser), args.nproc)
    if min(args.rounds, args.steps, args.warmup, args.learning_steps, *args.nproc, args.batch, args.image_size) < 1:
        parser.error("--rounds, --steps, --warmup, --learning-steps, --nproc, --batch and --image-size must be >= 1")

    log = h.log
    started = time.perf_counter()
    machine = h.machine_facts()
    env = run_env()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="nanopatch-multi-instance-") as workdir:
        run = h.recording_first(lambda key, learn: run_once(key, args, env, workdir, learn), args.learning_steps)
        runs, orders = h.interleave(keys, args.rounds, run, log, SETTLE_S, args.until)
    rounds_meta = [{"order": [variant_name(k) for k in o["order"]]} for o in orders]
    for meta, o in zip(rounds_meta, orders, strict=True):
        if o.get("skipped"):
            meta["skipped"] = [variant_name(k) for k in o["skipped"]]
    rows, by_key = summarise(keys, runs, args, cores, machine["physical_cores"])
    described = "torchvision ResNet-18" if args.model == "resnet18" else "a small CNN"
    report = {
        "benchmark": "multi_instance",
        "machine": machine,
        "command": shlex.join(["python", h.shown_path(SCRIPT), *(sys.argv[1:] if argv is None else argv)]),
        "description": (
            f"{described}, batch {args.batch} per process at {args.image_size} px, SGD(momentum 0.9), "
            f"cross-entropy over {CLASSES} classes, synthetic data ({DATASET_BATCHES} batches, seed {SEED})"
        ),
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "learning_steps": args.learning_steps,
        "quick": args.quick,
        "until": args.until,
        "round_orders": rounds_meta,
        "rows": rows,
        "comparisons": comparisons(by_key, args.nproc),
        "memory": memory(by_key, args.nproc),
        "runs": {variant_name(k): h.runs_kept(by_key[k], v) for k, v in runs.items()},
        "seconds": time.perf_counter() - started,
    }
    return h.finish(report, args.json, print_markdown)
