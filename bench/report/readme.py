"""The compact Markdown table of a results file for the project README's performance section."""

from __future__ import annotations

from typing import Any

import harness as h
from harness import SUSPECT_MARK, one_line, suspect
from suite.benches import Bench

from .markdown import bench_meta, bench_rows, fmt_rate, fmt_ratio, machine_line, ordered, roof_text, stock_of


def readme_table(results: dict[str, Any], benches: dict[str, Bench]) -> str:
    """A compact Markdown table for the project README: one row per bench and pipeline or model,
    stock's rate and nanopatch's speed-up(s); then the machine, date and command."""
    lines = ["| benchmark | pipeline / model | stock | nanopatch (speed-up over stock) |", "|---|---|---:|---|"]
    any_suspect = any_refused = False
    for name, entry in results.get("benches", {}).items():
        if entry.get("status") != "ok":
            lines.append(f"| {name} | - | - | failed: {one_line(entry.get('error', ''), 80)} |")
            continue
        bench = bench_meta(name, benches)
        labels = bench.readme if bench else None
        rows = bench_rows(results, name)
        for group in ordered([r["group"] for r in rows]):
            stock = stock_of(rows, group)
            shown = []
            for r in rows:
                refused = h.learns(r) is False
                if r["group"] != group or r["stock"] or (r["ratio_to_stock"] is None and not refused):
                    continue
                if labels is not None and r["variant"] not in labels:
                    continue
                label = labels[r["variant"]] if labels is not None else r["variant"]
                if refused:  # no speed-up for it, only the verdict
                    shown.append(f"{label} **{h.DOES_NOT_LEARN}**")
                    any_refused = True
                    continue
                value = fmt_ratio(r["ratio_to_stock"])
                if suspect(r) or (stock is not None and suspect(stock)):
                    value += SUSPECT_MARK
                    any_suspect = True
                if bench and bench.show_delta and stock is not None:
                    value = f"{r['rate'] - stock['rate']:+.0f} {r['unit']} ({value})"
                if roof_text(r):
                    value += f", {roof_text(r)}"
                shown.append(f"{label} {value}")
            stock_text = f"{fmt_rate(stock['rate'])} {stock['unit']}" if stock and stock["rate"] is not None else "-"
            lines.append(f"| {name} | {group} | {stock_text} | {', '.join(shown) or '-'} |")
    quick = " (quick mode: a smoke test, not numbers to quote)" if results.get("quick") else ""
    lines.append("")
    if any_suspect:
        lines += [
            f"{SUSPECT_MARK} suspect: other processes were taking the cores while it was timed, or its samples "
            "spread wider than the effect.",
            "",
        ]
    if any_refused:
        lines += [
            f"**{h.DOES_NOT_LEARN}**: its first training steps from the seed did not learn as stock's (the report "
            "gives why), so no speed-up is given for it.",
            "",
        ]
    lines += [
        f"Measured on {machine_line(results)}, {results.get('started', '')[:10]}{quick}. "
        f"Reproduce: `{results.get('command')}`",
    ]
    return "\n".join(lines)
