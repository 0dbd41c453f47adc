"""working_weights' command line and table."""

from __future__ import annotations

import argparse
from typing import Any

import harness as h

from families.train_step import models as ts
from families.working_weights.prototype import run


def print_table(report: dict[str, Any]) -> None:
    print("| model | variant | rate | spread | x autocast | bf16 weight copies |")
    print("|---|---|---|---|---|---|")
    for r in report["rows"]:
        if r["rate"] is None:  # does not learn as autocast does: no rate, the verdict instead
            print(f"| {r['group']} | {r['variant']} | {h.DOES_NOT_LEARN} |  |  | {r['weights_in_bf16']} |")
            continue
        low, high = r["spread"]
        print(
            f"| {r['group']} | {r['variant']} | {r['rate']:.1f} {r['unit']} | {low:.1f}-{high:.1f} "
            f"| {r['ratio_to_stock']:.3f}x | {r['weights_in_bf16']} |"
        )
    print(f"\nLearning: {h.first_steps(report['learning_steps'])} of each variant from the seed:\n")
    for r in report["rows"]:
        print(f"- {r['group']}, {h.learning_line(r)}")


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """bench/working_weights.py's command line; ``description`` is its --help text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=(description or "").split("\n\n")[0])
    parser.add_argument("--models", default="transformer,resnet18", help="of " + ", ".join(ts.MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--learning-steps",
        type=int,
        help=f"steps each variant records from the seed, judged against autocast's for the learning check "
        f"(default {h.LEARNING_STEPS[False]}; {h.LEARNING_STEPS[True]} with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="the small shapes of train_step.py --quick")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.learning_steps is None:
        args.learning_steps = h.LEARNING_STEPS[args.quick]
    args.models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(args.models) - set(ts.MODELS) - set(ts.HIDDEN_MODELS))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    return h.finish(run(args), args.json, print_table)
