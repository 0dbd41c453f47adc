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


#: what a run the time budget left out says in its variant's row (a variant that never ran)
NOT_RUN = "not run: the time budget (--until) ended before it"


def fits(until: float | None, seconds: float, clock=time.time) -> bool:
    """Whether something expected to take ``seconds`` ends by ``until`` (seconds since the epoch,
    as ``--until`` gives it; None: no budget)."""
    return until is None or clock() + seconds <= until


def expected_s(took: dict[str, float], name: str) -> float:
    """How long ``name``'s next run is expected to take: its last run's seconds in ``took``, else
    the mean of the others' (0 where nothing ran yet)."""
    return took.get(name, sum(took.values()) / len(took) if took else 0.0)


def interleave(
    names: Sequence[str], rounds: int, run_one, log, settle_s: float, until: float | None = None, clock=time.time
):
    """Run every name once per round, the order rotated each round, pausing ``settle_s`` before
    each. ``run_one(name)`` returns a dict (``rate`` or ``error``); each gets its ``round``.
    With ``until`` (``--until``: seconds since the epoch), a run is made only where it is expected
    to end by then: a name's last run's time, or for a name not run yet the mean of the runs so
    far (the first run of all is always made); a run left out is named in its round's
    ``skipped``, and a name that never ran gets one result with :data:`NOT_RUN` as its error.
    Returns ({name: [results]}, [{"order": [...]}, ...])."""
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    orders = []
    took: dict[str, float] = {}
    for index in range(rounds):
        order = rotated(names, index)
        orders.append({"order": order})
        log(f"round {index + 1}/{rounds}: {', '.join(order)}")
        for name in order:
            expected = expected_s(took, name)
            if took and not fits(until, settle_s + expected, clock):  # (the first run of all is made)
                orders[-1].setdefault("skipped", []).append(name)
                left = max(0.0, (until or 0.0) - clock())
                log(f"  {name}: not run: the time budget ends in {left:.0f} s, a run takes ~{expected:.0f} s")
                continue
            time.sleep(settle_s)
            started = clock()
            result = run_one(name)
            took[name] = clock() - started
            result["round"] = index
            runs[name].append(result)
            if "rate" in result:
                log(f"  {name}: {result['rate']:.3g} ({result['wall_s']:.0f} s)")
            else:
                log(f"  {name}: FAILED: {result['error']}\n{result.get('log', '')}")
    for results in runs.values():
        if not results:
            results.append({"error": NOT_RUN, "round": None, "not_run": True})
    return runs, orders


def left_out(orders: Sequence[dict[str, Any]]) -> str | None:
    """The report's line on the runs the time budget left out (rounds as :func:`interleave`
    returns them), or None where it left none out."""
    parts = [
        f"round {i + 1}: {', '.join(f'`{name}`' for name in o['skipped'])}"  # names hold commas
        for i, o in enumerate(orders)
        if o.get("skipped")
    ]
    return f"the time budget (--until) left out {'; '.join(parts)}" if parts else None


def not_run(row: dict[str, Any]) -> bool:
    """Whether a variant's row is one the time budget never ran."""
    return row.get("rate") is None and row.get("error") == NOT_RUN
