"""Text for logs and tables: numbers, plurals, one-line cells, log tails and shown paths."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def log(message: str) -> None:
    """Progress, on stderr (stdout carries the table or the JSON)."""
    print(message, file=sys.stderr, flush=True)


def cpu_line(m: dict[str, Any]) -> str:
    """The Markdown line of :func:`machine_facts`' CPU."""
    yes_no = {True: "yes", False: "no", None: "?"}
    return (
        f"- CPU: {m['model_name']} ({m['logical_cpus']} logical CPUs, {m['physical_cores']} physical cores "
        f"allowed, usable {m['usable_cores']}); flags: {' '.join(m['flags']) or '-'}; native bf16: "
        f"{yes_no[m['native_bf16']]}, AMX: {yes_no[m['amx']]}"
    )


def fmt(value: float) -> str:
    """A rate with 3 significant digits, or none after the point from 100 on."""
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def one_line(text: object, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cell(text: object) -> str:
    """``text`` on one line, fit for a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "/")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return os.path.abspath(path) if relative.startswith("..") else relative
