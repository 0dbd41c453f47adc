"""train_step's command line: the options, the interpreters of the variants, and the report."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import harness as h

from families.train_step.loop import worker_main
from families.train_step.models import HIDDEN_MODELS, MODELS, SEED
from families.train_step.parent import run_model
from families.train_step.summary import interpreters, print_markdown
from families.train_step.variants import (
    BY_HAND_TCMALLOC,
    COMPILE_EXTRA_WARMUP,
    DEFAULT_VARIANTS,
    DEFAULTS,
    HIDDEN_VARIANTS,
    IPEX,
    IPEX_STOCK,
    IPEX_VARIANTS,
    LIGHTNING_VARIANTS,
    PATCH_OPTIONS,
    PATCHED,
    PROFILE_TOP,
    TARGET_X_LIGHTNING,
    TARGETS,
    TARGETS_BY_HAND,
    VARIANTS,
    ipex_interpreter,
    tcmalloc_library,
)


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """bench/train_step.py's command line; ``description`` is its --help text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, help="timed rounds (default 5; 3 with --quick)")
    parser.add_argument("--steps", type=int, help="training steps per variant and round (default 3; 1 with --quick)")
    parser.add_argument(
        "--warmup",
        type=int,
        help=f"untimed steps after building (default 2; 1 with --quick); compile gets {COMPILE_EXTRA_WARMUP} more",
    )
    parser.add_argument(
        "--learning-steps",
        type=int,
        help=f"steps each variant records from the seed before its warm-up, judged against stock's for the "
        f"learning check (default {h.LEARNING_STEPS[False]}; {h.LEARNING_STEPS[True]} with --quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes to check that it works: 112 px, image batch 8, 64 tokens; 3 rounds of 1 step",
    )
    parser.add_argument(
        "--ipex-python",
        help="interpreter for the ipex variants, whose environment has intel-extension-for-pytorch matching its "
        "torch (default: this one, if it has)",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds a worker may take to answer (default %(default)s)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help=f"after the timed rounds, run N steps of each variant under torch.profiler and report the top "
        f"{PROFILE_TOP} ops by self CPU time and the share of dtype conversion (default: no profile)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    h.add_until(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # internal: one variant's process
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main()
    models = h.parse_names(args.models, MODELS + HIDDEN_MODELS, "--models", parser, shown=MODELS)
    variants = h.parse_names(args.variants, VARIANTS + HIDDEN_VARIANTS, "--variants", parser, shown=VARIANTS)
    for name, value in DEFAULTS[args.quick].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.rounds, args.steps, args.warmup, args.learning_steps) < 1:
        parser.error("--rounds, --steps, --warmup and --learning-steps must be >= 1")
    if args.profile < 0:
        parser.error("--profile must be >= 0")

    log = h.log
    started = time.perf_counter()
    env = h.clean_env()
    machine = h.machine_facts("intel-extension-for-pytorch")
    pythons = {v: sys.executable for v in variants if v not in IPEX_VARIANTS}
    skipped: dict[str, str] = {}
    notes = []
    if any(v in LIGHTNING_VARIANTS for v in variants) and importlib.util.find_spec("lightning") is None:
        for v in variants:
            if v in LIGHTNING_VARIANTS:
                skipped[v] = "skipped: Lightning is not installed (pip install lightning)"
    if any(v in IPEX_VARIANTS for v in variants):
        ipex_python, why = ipex_interpreter(args.ipex_python, env)
        if ipex_python is None:
            skipped.update({v: f"skipped: {why}" for v in variants if v in IPEX_VARIANTS})
            notes.append(f"the ipex variants are skipped: {why}.")
            log(f"ipex variants skipped: {why}")
        else:
            pythons.update({v: ipex_python for v in variants if v in IPEX_VARIANTS})
            if ipex_python == sys.executable:
                if IPEX in variants and PATCHED in variants:
                    notes.append("`ipex` ran in the same interpreter as `patched`: both are patch_torch() defaults.")
            elif IPEX in variants:
                share = "`ipex-stock` shows that share" if IPEX_STOCK in variants else "add `ipex-stock` to see it"
                notes.append(
                    f"`ipex` runs in {ipex_python} ({why}): its ratio to stock includes the difference between "
                    f"the two interpreters' torch ({share})."
                )
    if BY_HAND_TCMALLOC in variants and tcmalloc_library() is None:
        skipped[BY_HAND_TCMALLOC] = "skipped: no tcmalloc library found (libtcmalloc_minimal4 or gperftools)"
    results, rows = {}, []
    for model in models:
        results[model], model_rows = run_model(
            model, variants, pythons, skipped, args, env, log, first=model == models[0]
        )
        rows += model_rows
    report = {
        "benchmark": "train_step",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "quick": args.quick,
        "until": args.until,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "learning_steps": args.learning_steps,
        "compile_extra_warmup": COMPILE_EXTRA_WARMUP,
        "profile_steps": args.profile,
        "targets": {"x_stock": TARGETS, "x_by_hand": TARGETS_BY_HAND, "x_lightning_bf16": TARGET_X_LIGHTNING},
        "seed": SEED,
        "machine": machine,
        "interpreters": interpreters(rows),
        "variant_options": {v: PATCH_OPTIONS[v] for v in variants},
        "models": results,
        "rows": rows,
        "notes": notes,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print_markdown(report)
    return 0
