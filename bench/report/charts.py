"""One bar chart per bench of a results file (matplotlib, when installed)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import harness as h
from harness import SUSPECT_MARK, suspect
from suite.benches import Bench

from .markdown import bench_rows, fmt_rate, machine_line, ordered, stock_of


def chart(results: dict[str, Any], name: str, bench: Bench | None, path: Path) -> bool:
    """One PNG of :func:`chart_figure` at ``path``. False if there is nothing to draw."""
    import matplotlib.pyplot as plt

    fig = chart_figure(results, name, bench)
    if fig is None:
        return False
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def chart_figure(results: dict[str, Any], name: str, bench: Bench | None):
    """Grouped bars of each variant's speed-up over stock per pipeline / model, stock as the 1.0
    line, values on the bars, the machine in the subtitle (a matplotlib figure, or None if there is
    nothing to draw). A variant that does not learn as stock gets no bar: a red cross and "does not
    learn" in its place."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = bench_rows(results, name)
    plotted = [r for r in rows if not r["stock"] and (r["ratio_to_stock"] is not None or h.learns(r) is False)]
    if not plotted:
        return None
    groups = ordered([r["group"] for r in rows if r["ratio_to_stock"] is not None or h.learns(r) is False])
    variants = ordered([r["variant"] for r in plotted])
    cells = {(r["group"], r["variant"]): r for r in plotted}
    n = len(variants)
    width = min(0.8 / n, 0.3)
    fig_width = min(16.0, max(7.0, 1.5 + len(groups) * (0.7 + 0.55 * n)))
    fig, ax = plt.subplots(figsize=(fig_width, 5.2))
    colours = plt.get_cmap("tab10").colors
    greys = ("0.62", "0.78", "0.48", "0.88", "0.36")
    # nanopatch's own variants in colour, the others (raw decoders, albumentations...) in grey, hatched
    ours = [v for v in variants if bench is None or bench.readme is None or v in bench.readme]
    variants = ours + [v for v in variants if v not in ours]
    top = 1.0
    label_size = 8 if n * len(groups) <= 16 else 7
    others = [v for v in variants if v not in ours]
    refused: list[tuple[float, Any]] = []  # (x, colour) of the cells of variants that do not learn as stock
    legend_only: list[Any] = []  # variants that never learned: a legend entry, no bar
    for i, variant in enumerate(variants):
        if variant in ours:
            style = {"color": colours[ours.index(variant) % len(colours)], "label": variant}
        else:
            grey = greys[others.index(variant) % len(greys)]
            style = {"color": grey, "hatch": "//", "edgecolor": "white", "label": f"{variant} (reference)"}
        xs, ys, labels = [], [], []
        for j, group in enumerate(groups):
            r = cells.get((group, variant))
            x = j + (i - (n - 1) / 2) * width
            if r is not None and h.learns(r) is False:
                refused.append((x, style["color"]))
            elif r is not None:
                xs.append(x)
                ys.append(r["ratio_to_stock"])
                busy = suspect(r) or (stock_of(rows, group) is not None and suspect(stock_of(rows, group)))
                labels.append(f"{r['ratio_to_stock']:.2f}x" + (SUSPECT_MARK if busy else ""))
        if not ys:
            legend_only.append(Patch(**style))
            continue
        top = max(top, *ys)
        bars = ax.bar(xs, ys, width * 0.92, zorder=2, **style)
        ax.bar_label(bars, labels=labels, padding=2, fontsize=label_size, rotation=90 if n > 3 else 0)
    for x, colour in refused:  # in a bar's place: a cross in the variant's colour, and the verdict
        ax.plot([x], [0.04 * top], marker="x", markersize=9, markeredgewidth=2.5, color=colour, zorder=4)
        ax.text(x, 0.09 * top, h.DOES_NOT_LEARN, rotation=90, ha="center", va="bottom", fontsize=label_size,
                color="tab:red", zorder=4)  # fmt: skip
    stock_names = ordered([r["variant"] for r in rows if r["stock"]])
    ax.axhline(
        1.0, color="black", linestyle="--", linewidth=1.2, zorder=3, label=f"{' / '.join(stock_names) or 'stock'} = 1.0"
    )
    ticks = []
    for group in groups:
        stock = stock_of(rows, group)
        ticks.append(group if stock is None else f"{group}\nstock {fmt_rate(stock['rate'])} {stock['unit']}")
    ax.set_xticks(range(len(groups)), ticks, fontsize=9)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, top * (1.3 if n > 3 else 1.15))
    ax.set_ylabel("speed-up over stock (x)")
    ax.grid(axis="y", color="0.9", zorder=0)
    ax.spines[["top", "right"]].set_visible(False)
    title = f"{name}: {bench.title}" if bench else name
    fig.suptitle(textwrap.fill(title, width=int(fig_width * 8)), fontsize=12, fontweight="bold")
    quick = ", --quick" if results.get("quick") else ""
    ax.set_title(
        f"{machine_line(results, short=True)}; {results.get('started', '')[:10]}{quick}", fontsize=9, color="0.3"
    )
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(
        handles=[*handles, *legend_only],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncols=min(n + 1, 4),
        fontsize=8,
        frameon=False,
    )
    if refused:
        fig.text(
            0.99,
            0.01,
            f"\u2717 {h.DOES_NOT_LEARN}: no speed-up drawn (its first steps did not learn as stock's)",
            fontsize=7,
            color="tab:red",
            ha="right",
        )
    if any(suspect(r) for r in rows):
        fig.text(
            0.01,
            0.01,
            f"{SUSPECT_MARK} suspect: other processes took the cores while it (or stock) was timed, or its samples "
            "spread wider than the effect",
            fontsize=7,
            color="0.35",
        )
    fig.tight_layout()
    return fig
