"""The one result row every bench writes (its JSON ``rows``, its own table, bench/run.py's report),
its spread, and the ratios of rows to a base row.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .rounds import per_round

#: CPU time / (wall time x threads) of a sample below which other processes shared its cores
BUSY_CPU_SHARE = 0.9
#: share of the machine's CPU time other processes took during a run above which it is suspect
OTHER_LOAD_WARNING = 0.05
SUSPECT_MARK = "\u2020"  # dagger


def row(
    bench: str,
    group: str,
    variant: str,
    rate: float | None,
    unit: str,
    ratio: float | None,
    *,
    stock: bool = False,
    rates: Sequence[float] = (),
    note: str | None = None,
    cpu_share: float | None = None,
    other_load: float | None = None,
    noisy: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """One result. ``rate`` is the median over the rounds (None: the variant did not run, ``note``
    says why); ``ratio_to_stock`` a speed-up over the group's ``stock`` row (above 1.0 is faster);
    ``rates`` the per-round rates and ``spread`` their [min, max]. ``cpu_share``: CPU time / (wall
    time x threads) of the timed samples; ``other_load``: the most CPU time other processes took
    during a round, as a share of all CPUs; ``noisy``: suspect for a reason the note gives.
    ``extra``: the bench's own details, kept beside the common keys."""
    rates = [float(r) for r in rates]
    out: dict[str, Any] = {
        "bench": bench,
        "group": group,
        "variant": variant,
        "rate": None if rate is None else float(rate),
        "unit": unit,
        "ratio_to_stock": 1.0 if stock and rate is not None else (None if ratio is None else float(ratio)),
        "stock": stock,
        "rates": rates,
        "spread": [min(rates), max(rates)] if rates else [],
    }
    if note:
        out["note"] = note
    if cpu_share is not None:
        out["cpu_share"] = float(cpu_share)
    if other_load is not None:
        out["other_load"] = float(other_load)
    if noisy:
        out["noisy"] = True
    out.update(extra)
    return out


def suspect(r: dict[str, Any]) -> bool:
    """Other processes took the cores while the row was timed, or it is too noisy to trust."""
    return (
        bool(r.get("noisy"))
        or (r.get("cpu_share") is not None and r["cpu_share"] < BUSY_CPU_SHARE)
        or (r.get("other_load") is not None and r["other_load"] > OTHER_LOAD_WARNING)
    )


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the interquartile range as a percentage of the median."""
    median = statistics.median(values)
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [median] * 3
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "iqr_pct": (quartiles[2] - quartiles[0]) / median * 100 if median else 0.0,
    }


def ratios_to(rows: list[dict[str, Any]], base: dict[str, Any] | None, key: str = "ratio_to_stock") -> None:
    """Set ``key`` (and, for the stock ratio, ``ratio_per_round``) of every row that ran against ``base``."""
    if base is None or not base["rate"]:
        return
    for r in rows:
        if r["rate"] is None:
            continue
        r[key] = r["rate"] / base["rate"]
        if key == "ratio_to_stock":
            r["ratio_per_round"] = per_round(r["rates"], r["rounds"], base["rates"], base["rounds"])
