"""breakdown_cost's command line and table."""

from __future__ import annotations

import argparse
import json
import sys

import harness as h

from families.breakdown_cost.measure import BATCH, TARGET_SHARE, hook_cost, measure, rows


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """bench/breakdown_cost.py's command line; ``description`` is its --help text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per loop, mode and round")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    times = measure(args.rounds, args.steps)
    table = rows(times)
    direct = hook_cost()
    per_step = direct["batch"] + direct["step"]
    for r in table:
        if r["variant"] == "breakdown off":
            r["hook_share"] = per_step / (r["rate"] / 1e6)
    if args.json:
        report = {"machine": h.machine_facts(), "python": sys.executable, "rounds": args.rounds, "steps": args.steps}
        print(json.dumps({**report, "samples_s": times, "hook_cost_s": direct, "rows": table}, indent=2))
        return 0
    print(f"{'loop':<12}{'breakdown':>10}{'median':>14}  cost (target: under {TARGET_SHARE:.0%} of a step)")
    for r in table:
        print(f"{r['group']:<12}{r['variant'].split()[-1]:>10}{r['rate']:>11.1f} us  {r.get('note') or ''}")
    print(f"({args.rounds} interleaved rounds of {args.steps} steps, batch {BATCH}, {sys.executable})")
    print(
        f"hooks timed directly: {direct['batch'] * 1e6:.1f} us per batch + {direct['step'] * 1e6:.1f} us per step = "
        f"{per_step * 1e6:.1f} us a training step: "
        + ", ".join(f"{r['hook_share']:.2%} of a {r['group']} step" for r in table if "hook_share" in r)
    )
    return 0
