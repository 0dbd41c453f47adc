"""Interleaved rounds: the rotated order of variants, ratios per round, and running every variant
once per round (recording the learning steps in its first run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def rotated(names: Sequence[str], index: int) -> list[str]:
    """The order of round ``index``: every variant once, starting one further each round."""
    shift = index % len(names) if names else 0
    return [*names[shift:], *names[:shift]]


def per_round(rates: Sequence[float], rounds: Sequence[int], base_rates: Sequence[float], base_rounds: Sequence[int]):
    """rate / base rate, round by round, for the rounds both ran."""
    base = dict(zip(base_rounds, base_rates, strict=True))
    return [r / base[i] for i, r in zip(rounds, rates, strict=True) if i in base]


def recording_first(run_one, steps: int):
    """``run_one(name, learn)`` as :func:`interleave` calls it: a variant's runs record ``steps``
    learning steps before their warm-up until one of them ran (its first round, unless that failed);
    the later rounds record none."""
    recorded: set[str] = set()

    def run(name: str) -> dict[str, Any]:
        result = run_one(name, 0 if name in recorded else steps)
        if "rate" in result:
            recorded.add(name)
        return result

    return run


def record_of(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The learning record of a variant's runs (:func:`run_ranks`' results): rank 0's, of the
    first run that recorded one."""
    for result in results:
        if "rate" in result and result["ranks"][0].get("learning_steps"):
            return result["ranks"][0]["learning"]
    return None


def interleave(names: Sequence[str], rounds: int, run_one, log, settle_s: float):
    """Run every name once per round, the order rotated each round, pausing ``settle_s`` before
    each. ``run_one(name)`` returns a dict (``rate`` or ``error``); each gets its ``round``.
    Returns ({name: [results]}, [{"order": [...]}, ...])."""
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    orders = []
    for index in range(rounds):
        order = rotated(names, index)
        orders.append({"order": order})
        log(f"round {index + 1}/{rounds}: {', '.join(order)}")
        for name in order:
            time.sleep(settle_s)
            result = run_one(name)
            result["round"] = index
            runs[name].append(result)
            if "rate" in result:
                log(f"  {name}: {result['rate']:.3g} ({result['wall_s']:.0f} s)")
            else:
                log(f"  {name}: FAILED: {result['error']}\n{result.get('log', '')}")
    return runs, orders
