"""Rendering a results file: its Markdown report and charts beside it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from suite.benches import Bench

from .charts import chart
from .markdown import bench_meta, markdown


def render(results: dict[str, Any], json_path: Path, benches: dict[str, Bench]) -> list[Path]:
    """Write the Markdown summary and the charts beside ``json_path``; return what was written."""
    written: list[Path] = []
    charts: dict[str, str] = {}
    stem = json_path.with_suffix("").name
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no charts (pip install matplotlib)", file=sys.stderr)
    else:
        for name, entry in results.get("benches", {}).items():
            if entry.get("status") != "ok":
                continue
            png = json_path.parent / f"{stem}-{name}.png"
            if chart(results, name, bench_meta(name, benches), png):
                charts[name] = png.name
                written.append(png)
    md_path = json_path.with_suffix(".md")
    md_path.write_text(markdown(results, benches, charts))
    return [md_path, *written]
