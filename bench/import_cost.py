"""What `import nanopatch` adds to a script's start-up.

Times ``python -c "import torch"`` against ``python -c "import torch, nanopatch"`` (and the
same with ``nanopatch.patch_torch()`` called), in interleaved rounds (the order rotated each
round) so that machine noise hits every variant alike, and prints the medians and the difference.

    python bench/import_cost.py [--rounds 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import harness as h  # bench/ is this script's folder, first on sys.path

STOCK = "import torch"
VARIANTS = {
    STOCK: "import torch",
    "import torch, nanopatch": "import torch, nanopatch",
    "import torch, nanopatch + patch_torch()": "import torch, nanopatch; nanopatch.patch_torch()",
}
#: (max - min) / median of a variant's samples above which its row is marked too noisy to trust
NOISY_SPREAD = 0.2


def time_once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def measure(rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for code in VARIANTS.values():  # warm the file cache once, untimed
        time_once(code)
    for index in range(rounds):
        for name in h.rotated(list(VARIANTS), index):
            times[name].append(time_once(VARIANTS[name]))
    return times


def rows(times: dict[str, list[float]]) -> list[dict]:
    """Rate = start-up time in ms; ratio = stock's time / the variant's (above 1.0 is faster)."""
    out = []
    base = h.spread(times[STOCK])["median"]
    for name, seconds in times.items():
        stats = h.spread(seconds)
        note = None
        if len(seconds) > 1 and (stats["max"] - stats["min"]) / stats["median"] > NOISY_SPREAD:
            note = (
                f"{h.SUSPECT_MARK} samples {stats['min'] * 1000:.0f}-{stats['max'] * 1000:.0f} ms over "
                f"{len(seconds)} rounds: the machine's noise is larger than what is measured"
            )
        ms = [s * 1000 for s in seconds]
        ratio = base / stats["median"]
        out.append(
            h.row("import_cost", "start-up", name, stats["median"] * 1000, "ms", ratio, stock=name == STOCK, rates=ms,
                  note=note, noisy=note is not None)
        )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    times = measure(args.rounds)
    table = rows(times)
    if args.json:
        report = {"machine": h.machine_facts(), "python": sys.executable, "rounds": args.rounds}
        print(json.dumps({**report, "samples_s": times, "rows": table}, indent=2))
        return 0
    base = table[0]["rate"]
    print(f"{'command':<42}{'median':>10}{'vs import torch':>18}")
    for r in table:
        extra = "" if r["stock"] else f"{r['rate'] - base:+.0f} ms ({r['rate'] / base:.3f}x)"
        print(f"{r['variant']:<42}{r['rate']:>8.0f} ms{extra:>18}")
    print(f"({args.rounds} interleaved rounds, {sys.executable})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
