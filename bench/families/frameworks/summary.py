"""frameworks' rows: each variant's median against its group's baseline, its problems and findings,
its learning verdict and targets.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

import harness as h

from families.frameworks.launch import command, facts_of
from families.frameworks.variants import (
    BASELINE,
    LEARNING_BASELINE,
    PRECISION_OF,
    SECOND_BASELINE,
    TARGETS,
    UNIT,
    VARIANTS,
    Variant,
)

#: facts that must not change from one round to the next
STABLE = ("processes", "threads", "affinity", "tcmalloc", "world_size", "ddp", "strategy", "precision", "inside")


def problems(v: Variant, d: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The checks: what a variant's details say it did not run as the variant says."""
    found = []
    if not v.patched and any(d["nanopatch_imported"]):
        found.append("nanopatch was imported")
    if v.patched and not all(d["nanopatch_imported"]):
        found.append("nanopatch was not imported")
    if d["processes"] != v.processes:
        found.append(f"{d['processes']} process(es) wrote a result, expected {v.processes}")
    expected_steps = args.warmup + args.steps
    if any(s != expected_steps for s in d["steps_seen"]):
        found.append(f"steps seen {d['steps_seen']}, expected {expected_steps} (warm-up + timed)")
    if not args.quick and any(d.get("measuring_when_timed", ())):
        found.append("nanopatch was still measuring its choices when the timed steps began (raise --warmup)")
    if any(p == "no call seen" for p in d["inside_per_rank"]):
        found.append("the probe saw no forward call of its layer in the timed steps")
    if v.precision and d["precision"] != v.precision:
        found.append(f"precision {d['precision']}, expected {v.precision}")
    if v.precision and d["probe"]["dtypes"] and set(d["probe"]["dtypes"]) != {"bfloat16"}:
        found.append(f"{v.precision}, but the layer computed in {h.dtype_name(d['probe']['dtypes'])}")
    if v.processes > 1:
        if set(d["world_size"]) != {v.processes}:
            found.append(f"world size {d['world_size']} (expected {v.processes}): not data-parallel")
        if not all(d["ddp"]):
            found.append("no DistributedDataParallel in some rank")
        if d["ranks_in_sync"] is False:
            found.append("ranks' parameters differ after the run (gradients not averaged)")
        if d["ranks_saw_different_data"] is False:
            found.append("ranks saw the same first batch (loader not sharded)")
    elif max(d["world_size"]) != 1:
        found.append(f"world size {d['world_size']}")
    return found


def findings(v: Variant, d: dict[str, Any], cores: int) -> list[str]:
    """What the probe says nanopatch did (or did not do) inside the model, and how the processes
    shared the cores: not failed checks."""
    notes = []
    if sum(d["threads"]) > cores and len(set(d["affinity"])) < d["processes"]:
        notes.append(
            f"{d['processes']} processes x {'/'.join(map(str, sorted(set(d['threads']))))} threads on the same "
            f"{h.plural(cores, 'core')}: oversubscribed"
        )
    if not v.patched or not d["probe"]["calls"]:
        return notes
    if "bfloat16" not in d["probe"]["dtypes"]:
        notes.append(f"not accelerated: the probed layer computed in {h.dtype_name(d['probe']['dtypes'])}")
    elif set(d["probe"]["dtypes"]) == {"bfloat16"} and v.precision:
        whose = PRECISION_OF.get(v.precision, v.precision)
        notes.append(f"bf16 inside may be {whose} alone (the probe cannot tell whose autocast it is)")
    probe = d["probe"]
    if probe["inputs_4d"] and probe["channels_last"] < probe["inputs_4d"]:
        notes.append("the probed convolution's input was not channels-last")
    return notes


def summarise(names: list[str], runs: dict[str, list[dict[str, Any]]], args, cores: int):
    rows, by_name = [], {}
    for name in names:
        v = VARIANTS[name]
        baseline = BASELINE[v.group]
        ok = [r for r in runs[name] if "rate" in r]
        r = h.ranks_row("frameworks", v.group, name, UNIT[v.group], runs[name], cores, stock=name == baseline)
        r["command"] = shlex.join(command(v, args, "OUT"))
        if ok:
            d = r["details"]
            facts = facts_of(ok[-1])
            changed = [f for f in STABLE if any(facts_of(x)[f] != facts[f] for x in ok)]
            d.update(facts, changed_between_rounds=changed)
            d["problems"] = problems(v, d, args) + [f"{f} changed between rounds" for f in changed]
            versions_seen = list(dict.fromkeys(x.get("nanopatch_digest") for x in ok))
            d["nanopatch_digests"] = versions_seen
            if v.patched and len(versions_seen) > 1:
                d["problems"].append(f"nanopatch's source changed between its rounds ({len(versions_seen)} versions)")
            d["findings"] = findings(v, d, cores)
        against = LEARNING_BASELINE.get(v.processes, baseline)
        if h.record_of(runs.get(against, [])) is None:
            against = baseline
        h.learning_row(r, h.record_of(runs[name]), h.record_of(runs.get(against, [])), against)
        rows.append(r)
        by_name[name] = r
    for group, baseline in BASELINE.items():
        in_group = [r for r in rows if r["group"] == group]
        h.ratios_to(in_group, by_name.get(baseline))
        h.ratios_to(in_group, by_name.get(SECOND_BASELINE.get(group, "")), "ratio_to_bf16_mixed")
    for r in rows:
        if r["rate"] is not None:
            r["targets"] = targets_of(r, by_name)
    return rows


def targets_of(row: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for variant, against, at_least in TARGETS:
        other = by_name.get(against)
        if variant != row["variant"] or other is None or not other["rate"]:
            continue
        ratio = row["rate"] / other["rate"]
        out.append({"against": against, "at_least": at_least, "ratio": ratio, "met": ratio >= at_least})
    return out


def ran_with(d: dict[str, Any]) -> str:
    threads = "/".join(map(str, sorted(set(d["threads"]))))
    if d["processes"] == 1:
        parts = [f"1 process, {threads} threads, CPUs {d['affinity'][0]}"]
    else:
        parts = [f"{d['processes']} processes x {threads} threads, CPUs {' | '.join(d['affinity'])}"]
    parts.append("tcmalloc" if all(d["tcmalloc"]) else "jemalloc" if all(d["jemalloc"]) else "glibc malloc")
    if max(d["world_size"]) > 1 or d["processes"] > 1:
        parts.append(f"world {max(d['world_size'])} ({d['backend']}), {'DDP' if all(d['ddp']) else 'no DDP'}")
    if d["strategy"]:
        parts.append(f"{d['strategy']}, precision {d['precision']}")
    return ", ".join(parts)
