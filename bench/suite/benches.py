"""The benches bench/run.py knows: how to run each (its script and options, where its JSON goes)
and how to read its rows into the report.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import one_line

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = BENCH_DIR.parent
#: 2: the training benches' rows carry ``learning`` (their verdict against stock's run)
SCHEMA = 2
IMPORT_COST_QUICK_ROUNDS = 5


@dataclass(frozen=True)
class Options:
    """What the benches are asked for."""

    quick: bool = False
    ipex_python: str | None = None
    server: bool = False  # bench/run.py --server: SERVER's families at server sizes
    until: float | None = None  # --until for a family that takes it (BUDGET_SHARES): bench/run.py --minutes


#: ``bench/run.py --server``: what a many-core server is measured with, each family's options (its
#: quick mode added under ``--quick``), inside bench/run.py's ``--minutes`` (:data:`SERVER_MINUTES`
#: by default: :data:`BUDGET_SHARES`). Estimated at 14 minutes whole on a 16-core Xeon with
#: AMX (from the 2026-11-27 figures there: ResNet-18 stock 0.56 s a step, the transformer 1 s,
#: GPT-2 small through LoRA about 4 s stock and 1.5 s patched): the train_step models stock, by
#: hand and patched with a profile of each; one process (with and without its DataLoader) against
#: --nproc 2, 4 and 8, each against one process on its share of the cores (weak scaling), as many
#: processes at once without DDP (its parts) and stock torchrun at the same count (memory; NPROC:
#: see :func:`server_counts`); the Hugging Face
#: Trainer fine-tuning GPT-2 small (124M parameters) through LoRA, stock, with the Trainer's own
#: bf16, and patched.
SERVER: dict[str, list[str]] = {
    "train_step": [
        "--models", "resnet18,transformer", "--variants", "stock,by-hand,patched", "--rounds", "2",
        "--steps", "3", "--profile", "2",
    ],
    "multi_instance": [
        "--variants", "stock,stock-nproc,tuned,no-loader,share,apart,nproc", "--nproc", "NPROC", "--rounds", "2",
        "--steps", "3",
    ],
    "frameworks": [
        "--variants", "hf-stock,hf-bf16,hf-nanopatch", "--hf-model", "gpt2", "--hf-size", "base", "--lora",
        "--rounds", "1", "--steps", "3",
    ],
}  # fmt: skip


@dataclass(frozen=True)
class Bench:
    """One benchmark script and how to read it.

    ``args(options, json_path)`` gives its command-line options; with ``json_to == "stdout"`` its
    JSON is what it prints, with ``"file"`` what it writes to ``json_path``; its ``rows`` are in
    the one schema of bench/harness/rows.py. ``label(variant)`` is the variant's name in the report.
    ``readme`` maps the variants shown in the README table to short labels (None: every variant but
    stock, by name). ``show_delta`` adds the difference from stock in the rate's unit (for times)."""

    name: str
    script: Path
    title: str
    group_label: str
    args: Callable[[Options, Path], list[str]]
    label: Callable[[str], str] = str
    json_to: str = "stdout"
    about: str = ""
    readme: dict[str, str] | None = None
    show_delta: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


#: the keys of a row (bench/harness/rows.py's ``row``) that the report keeps; the rest stays in ``raw``.
#: ``ratio_to_by_hand``: train_step's speed-up over its ``by-hand`` row (the step edited for bf16 and channels-last);
#: ``model_flops``, ``roof_fraction``: train_step's model FLOP/s and their share of the matmul roof measured
#: in the same run (the faster of bf16's and fp32's rates);
#: ``learning``: a training variant's loss and gradient count per step beside stock's, and its verdict (a row
#: whose variant does not learn as stock has no rate and no ratio)
ROW_KEYS = (
    "bench", "group", "variant", "rate", "unit", "ratio_to_stock", "stock", "spread", "note", "cpu_share",
    "other_load", "noisy", "ratio_to_by_hand", "learning", "model_flops", "roof_fraction",
)  # fmt: skip


def rows_of(bench: Bench, raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The bench's rows as the report keeps them: the common keys, the variant shown by ``label``."""
    rows = []
    for r in raw["rows"]:
        kept = {k: r[k] for k in ROW_KEYS if k in r}
        kept["bench"] = bench.name
        kept["variant"] = bench.label(r["variant"])
        if kept["rate"] is None and not kept.get("note"):
            kept["note"] = one_line(r.get("error") or "did not run")
        rows.append(kept)
    return rows


def frameworks_label(variant: str) -> str:
    """``hf-nanopatch`` -> ``nanopatch``: the groups share columns."""
    return re.sub(r"^(ddp|hf|timm)-", "", variant)


def server_counts() -> str:
    """multi_instance's ``--nproc`` under ``--server``: 2, 4 and 8 processes, those this machine has
    the physical cores for (the runner refuses more; 2 alone on the 2-core VMs)."""
    try:
        from nanopatch.foundation import cpu

        cores = cpu.host_facts().physical_cores
    except Exception:  # an older checkout on PYTHONPATH: count the CPUs
        cores = max(1, len(os.sched_getaffinity(0)) // 2)
    return ",".join(str(n) for n in (2, 4, 8) if n == 2 or n <= cores)


def server_args(name: str, quick: bool) -> list[str]:
    """A family's options under ``--server``; with ``--quick`` (a check that it all works, in a
    few minutes on 2 cores) GPT-2 at the frameworks bench's small size instead of GPT-2 small."""
    found = [server_counts() if arg == "NPROC" else arg for arg in SERVER.get(name, [])]
    if quick and "--hf-size" in found:
        at = found.index("--hf-size")
        del found[at : at + 2]
    return found


#: the families that take ``--until`` (start no run expected to end after it), each with its share
#: of bench/run.py's ``--minutes``: multi_instance's many process groups the most
BUDGET_SHARES = {"train_step": 0.3, "multi_instance": 0.45, "frameworks": 0.25}
#: ``--minutes`` under ``--server`` where not given: issue 40's 8 minutes on 16 cores, inside a
#: device lease's 10-minute command
SERVER_MINUTES = 8.0
#: seconds of each family's share kept for what follows its last run (the report, a roof measurement)
BUDGET_MARGIN_S = 20.0


def deadlines(names: Sequence[str], minutes: float, start: float) -> dict[str, float]:
    """Each family's ``--until`` (seconds since the epoch) under a budget of ``minutes`` from
    ``start``, run in the order of ``names``: its share (:data:`BUDGET_SHARES`, among the families
    run) added to the ones before it, less :data:`BUDGET_MARGIN_S`, so that time an earlier family
    leaves unused passes to the next. Families without a share get none."""
    shares = {n: BUDGET_SHARES[n] for n in names if n in BUDGET_SHARES}
    total = sum(shares.values())
    out, spent = {}, 0.0
    for name, share in shares.items():
        spent += minutes * 60 * share / total
        out[name] = start + spent - BUDGET_MARGIN_S
    return out


def _quick(options: Options, name: str = "") -> list[str]:
    """``--quick`` where asked, the family's server options under ``--server``, and its ``--until``."""
    until = ["--until", f"{options.until:.0f}"] if options.until is not None and name in BUDGET_SHARES else []
    return (["--quick"] if options.quick else []) + (server_args(name, options.quick) if options.server else []) + until


def json_to_stdout(options: Options, _: Path) -> list[str]:
    return [*_quick(options), "--json"]


def json_to_file(options: Options, path: Path, name: str = "") -> list[str]:
    return [*_quick(options, name), "--json", str(path)]


BENCHES: dict[str, Bench] = {
    bench.name: bench
    for bench in (
        Bench(
            name="decode",
            script=BENCH_DIR / "decode.py",
            title="JPEG loading: torchvision's pil_loader, stock against nanopatch",
            group_label="size",
            args=json_to_stdout,
            about="images/s on one pinned core, file read included; stock = torchvision's own `pil_loader`",
            readme={"nanopatch loader": "loader", "nanopatch DCT-scaled (min 224)": "DCT-scaled decode"},
        ),
        Bench(
            name="transforms",
            script=BENCH_DIR / "transforms.py",
            title="ImageFolder + torchvision transforms pipelines",
            group_label="pipeline",
            args=json_to_stdout,
            about="images/s of `dataset[i]` on one pinned core; stock = torchvision as installed",
            readme={"nanopatch": "nanopatch", "nanopatch fast decode": "fast decode"},
        ),
        Bench(
            name="train_step",
            script=BENCH_DIR / "train_step.py",
            title="Training step: stock PyTorch against nanopatch's training patch",
            group_label="model",
            args=lambda o, path: [
                *(["--ipex-python", o.ipex_python] if o.ipex_python else []),
                *json_to_file(o, path, "train_step"),
            ],
            json_to="file",
            about="samples/s of a full training step with torch's default threads; stock = nanopatch not imported",
            readme={"patched": "patched", "compile": "compile", "ipex": "IPEX"},
        ),
        Bench(
            name="multi_instance",
            script=BENCH_DIR / "multi_instance.py",
            title="Several training instances on one machine",
            group_label="model",
            args=lambda o, path: json_to_file(o, path, "multi_instance"),
            json_to="file",
            about="total samples/s; stock = plain python, nanopatch not imported",
        ),
        Bench(
            name="frameworks",
            script=BENCH_DIR / "frameworks.py",
            title="Framework training code: Lightning, Hugging Face Trainer, timm",
            group_label="framework",
            args=lambda o, path: json_to_file(o, path, "frameworks"),
            label=frameworks_label,
            json_to="file",
            about="samples/s of the training steps of unmodified framework scripts; stock = plain python",
            readme={"nanopatch": "nanopatch", "nanopatch+bf16-mixed": "nanopatch + bf16-mixed", "nproc2": "--nproc 2"},
        ),
        Bench(
            name="import_cost",
            script=BENCH_DIR / "import_cost.py",
            title="Start-up: what importing nanopatch adds to import torch",
            group_label="command",
            args=lambda o, _: [*(["--rounds", str(IMPORT_COST_QUICK_ROUNDS)] if o.quick else []), "--json"],
            about="median wall time of `python -c ...`, interleaved rounds; ratio = stock's time / the variant's",
            readme={
                "import torch, nanopatch": "import nanopatch",
                "import torch, nanopatch + patch_torch()": "+ patch_torch()",
            },
            show_delta=True,
        ),
    )
}
