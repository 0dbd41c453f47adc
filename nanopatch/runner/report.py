"""``--compare``'s report of two runs (and ``--try-compile``'s third): the side-by-side table,
where each run's time went with the patched run's advice, and the bar chart of ``--plot``."""

from __future__ import annotations

from .output import Run


def table(stock: Run, patched: Run) -> str:
    """The side-by-side summary (speed-ups only when both runs succeeded)."""
    failed = [r for r in (stock, patched) if r.exit_code]
    rows = [
        ("exit code", str(stock.exit_code), str(patched.exit_code), ""),
        ("wall time", f"{stock.seconds:.1f} s", f"{patched.seconds:.1f} s", _ratio(stock.seconds, patched.seconds)),
    ]
    rate_s, rate_p = stock.rate(), patched.rate()
    same_kind = rate_s is not None and rate_p is not None and rate_s[2] == rate_p[2]
    samples = "samples/s" in (stock.rate_unit(), patched.rate_unit())
    rows.append(
        (
            "samples/s" if samples else "images/s",
            "not found" if rate_s is None else rate_s[1],
            "not found" if rate_p is None else rate_p[1],
            _ratio(rate_p[0], rate_s[0]) if same_kind else "",
        )
    )
    if failed:
        rows = [(*row[:3], "") for row in rows]
    for key in ("loss", "accuracy"):
        rows.append((f"final {key}", _show(stock.metric(key)), _show(patched.metric(key)), ""))
    for key in ("loss", "accuracy"):  # when a run printed any
        found = stock.metric(key, validation=True), patched.metric(key, validation=True)
        if any(found):
            rows.append((f"validation {key}", _show(found[0]), _show(found[1]), ""))
    rows.append(("model accelerated", "-", accelerated(patched.report), ""))
    lines = _aligned(("", "stock", "nanopatch", "speedup"), rows)
    if failed:
        lines.append("")
        lines.extend(f"{r.name} run failed with exit code {r.exit_code}: no speed-up is given" for r in failed)
    return "\n".join(lines)


def _show(value: tuple[float, str] | None) -> str:
    return "-" if value is None else value[1]


def _aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A text table: cells padded to their column's width, a rule under the header."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    for row in rows:
        lines.append(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return lines


def accelerated(report: dict | None) -> str:
    """ "yes (what)" or "no (why)" from the patched run's report."""
    if report is None or "models" not in report:
        return "no (the run reported nothing: it never imported torch, or nanopatch's training patch was off)"
    models = report.get("models", [])
    done = [m for m in models if m.get("model") and m.get("stock") is None and m.get("training_calls")]
    if done:
        parts = []
        for m in done:
            what = [f"computed in {m['computed_in']}"] if m.get("computed_in") else []
            if m.get("channels_last"):
                what.append("channels-last")
            if m.get("ipex"):
                what.append("IPEX")
            measured = m.get("bf16_measured")
            if measured:
                what.append("bf16 still being measured" if measured == "measuring" else f"bf16 {measured}")
            layout = m.get("channels_last_measured")
            if layout:
                brief = layout.split(" (fastest", 1)[0]
                what.append("channels-last still being measured" if layout == "measuring" else f"channels-last {brief}")
            parts.append(f"{m['model']}: {', '.join(what) or 'fused step only'}")
        return "yes (" + "; ".join(parts) + ")"
    reasons = [f"{m['model'] or ', '.join(m.get('optimizers', []))}: {m['stock']}" for m in models if m.get("stock")]
    if reasons:
        return "no (" + "; ".join(reasons) + ")"
    return "no (no optimizer stepped: nothing to accelerate was found)"


def _times(run: Run) -> dict | None:
    return (run.report or {}).get("breakdown")


def breakdown_text(stock: Run, patched: Run, *more: Run) -> str:
    """Where each run's time went, side by side, and the patched run's advice ("" when no run
    was timed). ``more``: a ``--try-compile`` run, shown beside them and judged against the
    patched one."""
    from nanopatch.targets.breakdown.advice import compile_trial
    from nanopatch.targets.breakdown.patch import PARTS

    runs = [stock, patched, *more]
    times = [_times(run) for run in runs]
    if not any(times):
        return ""

    def part(report: dict | None, key: str) -> str:
        if not report:
            return "-"
        share = report[key] / report["wall_s"] if report["wall_s"] > 0 else 0.0
        return f"{report[key]:.1f} s ({share:.0%})"

    rows = [(label, *(part(t, key) for t in times), "") for key, label in PARTS]
    rates = [t.get("samples_per_s") if t else None for t in times]
    speedup = _ratio(rates[1], rates[0]) if rates[0] and rates[1] else ""
    rows.append(("samples/s while training", *("-" if r is None else f"{r:.1f}" for r in rates), speedup))
    if not all(rates[:2]):  # no DataLoader counted the samples: the time of a step, forward to update
        steps = [t.get("step_s") if t else None for t in times]
        speedup = _ratio(steps[0], steps[1]) if steps[0] and steps[1] else ""
        rows.append(("a training step", *("-" if v is None else duration(v) for v in steps), speedup))
    rows.append(("optimizer steps", *("-" if not t else str(t["steps"]) for t in times), ""))
    lines = ["Where the time went (nanopatch.breakdown: wall time from torch's import to the end)", ""]
    lines.extend(_aligned(("", *(run.name for run in runs), "speedup"), rows))
    unseen = [run.name for run, t in zip(runs, times, strict=True) if t and not t["steps"]]
    if unseen:  # a script's own ipex.optimize replaces the optimizer's step on the instance: torch's hooks miss it
        lines += [
            "",
            f"No optimizer step was seen in {', '.join(unseen)}: all its time counts as start-up (an optimizer "
            "whose step the script replaced on the instance, as its own ipex.optimize call does, is not timed)",
        ]
    advice = list((times[1] or {}).get("advice") or [])
    if more:
        trial = compile_trial(times[1], times[2])
        advice.append(trial or {"text": "torch.compile: no rate to compare (a run failed or trained no steps)"})
    if advice:
        lines += ["", "Advice (measured on the nanopatch run):"]
        lines.extend(f"- {a['text']}" for a in advice)
    return "\n".join(lines)


def draw(path: str, *runs: Run) -> str:
    """The runs' breakdowns as a stacked bar chart in ``path``; what was done, as a line."""
    from nanopatch.targets.breakdown.patch import PARTS

    times = [(run.name, _times(run)) for run in runs]
    if not any(t for _, t in times):
        return f"--plot: no run was timed (--no-breakdown, or neither imported torch): {path} was not written"
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return f"--plot: matplotlib is not installed (pip install matplotlib): {path} was not written"
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.8 * len(times)))
    names = [name for name, _ in times]
    left = [0.0] * len(times)
    for key, label in PARTS:
        widths = [t[key] if t else 0.0 for _, t in times]
        ax.barh(names, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, (_, t) in enumerate(times):
        if t and t.get("samples_per_s"):
            ax.text(left[i], i, f"  {t['samples_per_s']:.1f} samples/s", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("seconds of wall time")
    ax.set_xlim(0, max(left) * 1.3 or 1)
    ax.set_title("Where the time went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize="small", frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return f"--plot: the breakdown is drawn in {path}"


def duration(seconds: float) -> str:
    """A step's time as the table and the summary write it: milliseconds, seconds from 10 s."""
    return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _ratio(numerator: float, denominator: float) -> str:
    if not numerator or not denominator or numerator <= 0 or denominator <= 0:
        return ""
    return f"{numerator / denominator:.2f}x"
