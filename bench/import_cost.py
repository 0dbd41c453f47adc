"""What `import nanopatch` adds to a script's start-up.

Times ``python -c "import torch"`` against ``python -c "import torch, nanopatch"`` (and the
same with ``nanopatch.patch_torch()`` called), interleaved round by round so that machine
noise hits every variant alike, and prints the medians and the difference.

    python bench/import_cost.py [--rounds 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "import torch": "import torch",
    "import torch, nanopatch": "import torch, nanopatch",
    "... + patch_torch()": "import torch, nanopatch; nanopatch.patch_torch()",
}


def time_once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def measure(rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for code in VARIANTS.values():  # warm the file cache once, untimed
        time_once(code)
    for _ in range(rounds):
        for name, code in VARIANTS.items():
            times[name].append(time_once(code))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args(argv)
    times = measure(args.rounds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["import torch"]
    if args.json:
        print(json.dumps({"rounds": args.rounds, "median_s": medians, "samples_s": times}, indent=2))
        return 0
    print(f"{'command':<28}{'median':>10}{'vs import torch':>18}")
    for name, median in medians.items():
        extra = "" if name == "import torch" else f"+{(median - base) * 1000:.0f} ms ({median / base:.3f}x)"
        print(f"{name:<28}{median * 1000:>8.0f} ms{extra:>18}")
    print(f"({args.rounds} interleaved rounds, {sys.executable})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
