"""bench/'s modules for the tests that check its rows and reports: bench/ on ``sys.path`` (as its
entry scripts put it), ``run.py`` loaded as a module, the registry and runner (bench/suite/), the
renderer (bench/report/); made-up machine facts, and the parts of a drawn chart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # the benches import harness from their folder

import harness as h  # noqa: E402


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(f"nanopatch_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


run = load_bench("run")

# what run.py runs and renders with: the registry and runner (bench/suite/), the renderer (bench/report/)
from report import charts as report_charts  # noqa: E402
from report import markdown as report_markdown  # noqa: E402
from report import readme as report_readme  # noqa: E402
from report import render as report_render  # noqa: E402
from suite import benches as suite_benches  # noqa: E402
from suite import runner as suite_runner  # noqa: E402

__all__ = [
    "BENCH",
    "chart_parts",
    "fake_facts",
    "h",
    "load_bench",
    "report_charts",
    "report_markdown",
    "report_readme",
    "report_render",
    "run",
    "suite_benches",
    "suite_runner",
]


def fake_facts():
    return {
        "machine": {
            "hostname": "testhost",
            "cpu_model": "AMD EPYC 9R14",
            "physical_cores": 2,
            "logical_cpus": 2,
            "usable_cores": 2,
            "flags": ["avx2", "avx512_bf16", "avx512f"],
            "native_bf16": True,
            "amx": False,
            "platform": "Linux-6.18-x86_64",
        },
        "versions": {"python": "3.11.7", "torch": "2.13.0", "torchvision": "0.28.0", "nanopatch": "0.1.0"},
        "git": {"commit": "0" * 40, "dirty": False},
    }


def chart_parts(fig):
    """Each bar container's label and bar heights, and every text on the chart (the values on the
    bars are among them)."""
    ax = fig.axes[0]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    return bars, [t.get_text() for t in [*ax.texts, *fig.texts]]
