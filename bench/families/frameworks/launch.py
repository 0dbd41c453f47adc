"""frameworks' parent: a variant's command line and environment, one fresh process group per run,
and the facts of its ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness as h

from families.frameworks.variants import TINY, VARIANTS, Variant
from families.multi_instance.launch import cpu_text
from families.train_step.roof import ROOF_N

#: the script each variant runs (with --worker): bench/frameworks.py
SCRIPT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "frameworks.py"))


def command(variant: Variant, args: argparse.Namespace, out: str, learn: int = 0) -> list[str]:
    """The variant's command line; ``learn``: the steps it records first for the learning check."""
    worker = [SCRIPT, "--worker", out, "--script", variant.script]
    if variant.precision:
        worker += ["--precision", variant.precision]
    if variant.nano_processes:
        worker += ["--nano-processes", str(variant.nano_processes)]
    if learn:
        worker += ["--learn", str(learn)]
    for name in ("steps", "warmup", *TINY):
        worker += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    worker += ["--hf-model", getattr(args, "hf_model", "bert")]
    worker += ["--timm-model", getattr(args, "timm_model", "resnet18")]
    if getattr(args, "lora", False):
        worker.append("--lora")
    return [sys.executable, *variant.launcher, *worker]


def init_env(env: dict[str, str], init: Sequence[str]) -> dict[str, str]:
    """``env`` after ``eval "$(python -m nanopatch <init>)"``: its ``export`` lines applied."""
    if not init:
        return env
    text = subprocess.run(
        [sys.executable, "-m", "nanopatch", *init], env=env, capture_output=True, text=True, check=True
    ).stdout
    exports = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            exports[name] = shlex.split(value, comments=True)[0]
    return {**env, **exports}


def run_once(
    variant: Variant, args: argparse.Namespace, env: dict[str, str], workdir: str, learn: int
) -> dict[str, Any]:
    """One fresh process (group) of a variant: its rate, or its error; with the digest of the
    nanopatch source it ran. ``learn``: the steps it records first for the learning check."""
    digest = h.source_digest()
    out = tempfile.mkdtemp(prefix=f"{variant.name}-", dir=workdir)
    argv = command(variant, args, out, learn)
    result = h.run_ranks(
        argv, env=init_env(env, variant.init), out=out, timeout=args.timeout, count="samples", expected=None
    )
    return {**result, "nanopatch_digest": digest}


def facts_of(run: dict[str, Any]) -> dict[str, Any]:
    """What a run's processes ran with, and the checks across its ranks."""
    ranks = run["ranks"]
    probes = [r["probe"] for r in ranks]
    return {
        "processes": len(ranks),
        "ranks": [r["rank"] for r in ranks],
        "framework": ranks[0]["framework"],
        "threads": [r["threads"] for r in ranks],
        "affinity": [cpu_text(r["affinity_at_start"]) for r in ranks],
        "tcmalloc": [r["tcmalloc"] for r in ranks],
        "jemalloc": [r["jemalloc"] for r in ranks],
        "world_size": [r["world_size"] for r in ranks],
        "backend": ranks[0]["backend"],
        "ddp": [r["ddp"] for r in ranks],
        "strategy": ranks[0].get("strategy"),
        "precision": ranks[0].get("precision"),
        "samples_per_rank": [r["samples"] for r in ranks],
        "steps_seen": [r["steps_seen"] for r in ranks],
        "measuring_when_timed": [r.get("measuring_when_timed", False) for r in ranks],
        "nanopatch_imported": [r["nanopatch_imported"] for r in ranks],
        "first_weight_channels_last": [r["first_weight_channels_last"] for r in ranks],
        "probe": probes[0],
        "inside": h.inside(probes[0]),
        "inside_per_rank": [h.inside(p) for p in probes],
        "loss": [r.get("loss") for r in ranks],
        "env": [r["env"] for r in ranks],
        **h.rank_checks(ranks, "first_batch"),
    }


def measure_roof(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any] | None:
    """The hf script's ``--roof`` run, after the rounds, as stock runs (a fresh process, all its
    threads): the model's FLOPs per sample of a training step and the machine's matmul rates;
    None where it failed (said in the log)."""
    with tempfile.TemporaryDirectory(prefix="nanopatch-frameworks-roof-") as out:
        argv = [*command(VARIANTS["hf-stock"], args, out), "--roof"]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
        found = Path(out, "roof.json")
        if proc.returncode != 0 or not found.exists():
            h.log(f"hf --roof failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
            return None
        roof = json.loads(found.read_text())
    return {**roof, "n": ROOF_N, "measured_in": "hf-stock"}
