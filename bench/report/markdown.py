"""The Markdown report of a results file: the machine, then one table per bench with its notes."""

from __future__ import annotations

from typing import Any

import harness as h
from harness import BUSY_CPU_SHARE, SUSPECT_MARK, suspect
from suite.benches import Bench


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 99.95:
        return f"{value:.0f}"
    return f"{value:#.3g}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def ordered(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def bench_rows(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    entry = results["benches"].get(name, {})
    return entry.get("rows") or [r for r in results.get("rows", []) if r["bench"] == name]


def table_layout(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, Any]]]:
    """Groups (in order), variants (stock first) and the row of each (group, variant)."""
    groups = ordered([r["group"] for r in rows])
    variants = ordered([r["variant"] for r in rows if r["stock"]] + [r["variant"] for r in rows])
    cells = {(r["group"], r["variant"]): r for r in rows}
    return groups, variants, cells


def stock_of(rows: list[dict[str, Any]], group: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["group"] == group and r["stock"]), None)


def machine_line(results: dict[str, Any], *, short: bool = False) -> str:
    m = results.get("machine", {})
    v = results.get("versions", {})
    cores = m.get("physical_cores")
    parts = [m.get("cpu_model") or "unknown CPU"]
    if cores:
        parts.append(
            f"{cores} physical cores" if short else f"{cores} physical cores ({m.get('logical_cpus')} logical)"
        )
    bf16 = [f for f in m.get("flags", []) if "bf16" in f or f.startswith("amx")]
    parts.append(", ".join(bf16) if bf16 else "no native bf16")
    if m.get("amx") is False:
        parts.append("no AMX")
    parts.append(f"torch {v.get('torch') or '?'}")
    return ", ".join(parts)


def bench_meta(name: str, benches: dict[str, Bench]) -> Bench | None:
    return benches.get(name)


def cell(r: dict[str, Any] | None, stock: dict[str, Any] | None, show_delta: bool) -> str:
    if r is None:
        return ""
    if h.learns(r) is False:
        return f"**{h.DOES_NOT_LEARN}**"
    if r["rate"] is None:
        return "did not run"
    mark = SUSPECT_MARK if suspect(r) else ""
    roof = f", {roof_text(r)}" if roof_text(r) else ""
    if r["stock"]:
        return fmt_rate(r["rate"]) + mark + (f" ({roof_text(r)})" if roof else "")
    extra = fmt_ratio(r["ratio_to_stock"])
    if show_delta and stock is not None and stock["rate"] is not None:
        extra = f"{r['rate'] - stock['rate']:+.0f} {r['unit']}, {extra}"
    return f"{fmt_rate(r['rate'])}{mark} ({extra}{roof})"


def roof_text(r: dict[str, Any]) -> str:
    """A training step's fraction of the machine's matmul roof, where it was measured."""
    return f"{r['roof_fraction']:.0%} of roof" if r.get("roof_fraction") is not None else ""


def comparison_lines(raw: dict[str, Any]) -> list[str]:
    """A bench's own comparisons (multi_instance's weak scaling, the DataLoader's cost, ...) with
    their per-round range and target, and its memory against stock's, where its JSON has them."""
    found = []
    for c in raw.get("comparisons") or []:
        rounds = c.get("per_round") or []
        spread = f" (per round {min(rounds):.2f}-{max(rounds):.2f}x)" if rounds else ""
        target = ""
        if "target" in c:
            target = f"; target >= {c['target']:.2f}: {'met' if c['meets_target'] else '**not met**'}"
        found.append(f"- {c['label']}: {c['ratio']:.2f}x{spread}{target}")
    for m in raw.get("memory") or []:
        verdict = "within" if m["within_limit"] else "**over**"
        found.append(
            f"- memory, {m['label']}: {m['mib']:.0f} MiB against {m['against_mib']:.0f} ({m['ratio']:.2f}x, {verdict} "
            "the limit)"
        )
    return ["", *found] if found else []


def markdown(results: dict[str, Any], benches: dict[str, Bench], charts: dict[str, str]) -> str:
    m, v, git = results.get("machine", {}), results.get("versions", {}), results.get("git", {})
    date = results.get("started", "")[:10]
    lines = [f"# nanopatch benchmarks: {date}, {m.get('hostname', '?')}", ""]
    flags = " ".join(m.get("flags", [])) or "-"
    yes_no = {True: "yes", False: "no", None: "?"}
    lines.append(
        f"- **Machine**: {m.get('cpu_model')}, {m.get('physical_cores')} physical cores ({m.get('logical_cpus')} "
        f"logical, {m.get('usable_cores')} usable); ISA flags: {flags}; native bf16: {yes_no[m.get('native_bf16')]}, "
        f"AMX: {yes_no[m.get('amx')]}"
        + (f"; {m['mem_total_gib']:.0f} GiB" if m.get("mem_total_gib") else "")
        + f"; {m.get('platform', '')}"
    )
    commit = (git.get("commit") or "?")[:12] + (" with uncommitted changes" if git.get("dirty") else "")
    lines.append(
        f"- **Software**: Python {v.get('python')}, torch {v.get('torch')}, torchvision {v.get('torchvision')}, "
        f"nanopatch {v.get('nanopatch')}"
        + (f", IPEX {v['intel-extension-for-pytorch']}" if v.get("intel-extension-for-pytorch") else "")
        + f" (git {commit})"
    )
    took = duration(results["duration_s"]) if results.get("duration_s") is not None else "?"
    lines.append(f"- **Command** (from the repository root): `{results.get('command')}`")
    load = results.get("loadavg") or {}
    lines.append(
        f"- Started {results.get('started')}, took {took}."
        + (" Interrupted." if results.get("interrupted") else "")
        + (f" Load average (1, 5, 15 min) at start: {load['start']}" if load.get("start") else "")
        + (f"; at the end: {load['end']}." if load.get("end") else "")
    )
    if results.get("quick"):
        lines.append(
            "- **Quick mode**: small sizes and few rounds, to check that everything runs; not numbers to quote."
        )
    if results.get("environment"):
        lines.append("- Environment: " + ", ".join(f"`{k}={val}`" for k, val in results["environment"].items()))
    lines += [
        "",
        "Each cell: the rate, then in brackets the speed-up over stock (above 1.00x is faster than stock). "
        "Every bench times its stock and nanopatch variants side by side in the same run; see bench/README.md. "
        f"A training variant whose first steps from the seed do not learn as stock's (nanopatch.learning, the test "
        f"suite's definition) shows **{h.DOES_NOT_LEARN}** and no rate.",
    ]
    for name, entry in results.get("benches", {}).items():
        bench = bench_meta(name, benches)
        title = bench.title if bench else name
        lines += ["", f"## {name}: {title}", ""]
        if bench and bench.about:
            lines += [bench.about[0].upper() + bench.about[1:] + f"; ran in {duration(entry.get('seconds', 0))}.", ""]
        if entry["status"] != "ok":
            lines += [f"**Failed**: {entry.get('error')} (log: `{entry.get('log')}`)", "", "```text"]
            lines += [entry.get("log_tail", "").replace("```", "'''"), "```"]
            continue
        rows = bench_rows(results, name)
        groups, variants, cells = table_layout(rows)
        label = bench.group_label if bench else "group"
        lines.append(f"| {label} | unit | " + " | ".join(variants) + " |")
        lines.append("|---|---|" + "---:|" * len(variants))
        for group in groups:
            stock = stock_of(rows, group)
            unit = next(r["unit"] for r in rows if r["group"] == group)
            show_delta = bool(bench and bench.show_delta)
            values = [cell(cells.get((group, variant)), stock, show_delta) for variant in variants]
            lines.append(f"| {group} | {unit} | " + " | ".join(values) + " |")
        noted: dict[tuple[str, str], list[str]] = {}
        for r in rows:
            if r.get("note") and h.learns(r) is not False:  # a verdict is in the learning list below
                noted.setdefault((r["variant"], r["note"]), []).append(r["group"])
        notes = [f"`{variant}` ({', '.join(groups)}): {note}" for (variant, note), groups in noted.items()]
        busy = [
            f"`{r['variant']}` {r['group']} {r['cpu_share'] * 100:.0f}%"
            for r in rows
            if r.get("cpu_share") is not None and r["cpu_share"] < BUSY_CPU_SHARE
        ]
        if busy:
            notes.append(
                f"{SUSPECT_MARK} CPU below {BUSY_CPU_SHARE:.0%} of the wall time ({', '.join(busy)}): other processes "
                "were taking the cores while these were timed, so these rates (and ratios) are suspect"
            )
        loaded = [
            f"`{r['variant']}` {r['group']} {r['other_load']:.0%}"
            for r in rows
            if r.get("other_load") is not None and r["other_load"] > h.OTHER_LOAD_WARNING
        ]
        if loaded:
            notes.append(
                f"{SUSPECT_MARK} other load above {h.OTHER_LOAD_WARNING:.0%} of all CPUs during a round "
                f"({', '.join(loaded)}): these rates (and ratios) are suspect"
            )
        if notes:
            lines.append("")
            lines += [f"- {note}" for note in notes]
        lines += comparison_lines(entry.get("raw") or {})
        judged = [r for r in rows if r.get("learning")]
        if judged:
            lines += ["", "Learning, per variant against stock's run (loss and gradient count per step):", ""]
            lines += [f"- {r['group']}: {h.learning_line(r)}" for r in judged]
        if name in charts:
            lines += ["", f"![{name}: speed-up over stock]({charts[name]})"]
    if results.get("skipped"):
        lines += ["", "## Not run", ""]
        lines += [f"- {name}: {why}" for name, why in results["skipped"].items()]
    if results.get("failures"):
        lines += ["", "**Failed benches**: " + ", ".join(f["bench"] for f in results["failures"]) + " (above)."]
    return "\n".join(lines) + "\n"
