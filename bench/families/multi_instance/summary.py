"""multi_instance's rows and report: what each variant ran with, its problems, and the comparisons."""

from __future__ import annotations

import shlex
import statistics
from typing import Any

import harness as h

from families.multi_instance.launch import (
    APART,
    GLIBC,
    GROUP,
    NO_LOADER,
    NPROC,
    SHARE,
    STOCK,
    STOCK_NPROC,
    TUNED,
    UNPINNED,
    UNTUNED,
    command,
    facts_of,
    split,
    variant_name,
)

#: facts that must not change from one round to the next
STABLE = ("processes", "threads", "affinity", "jemalloc", "tcmalloc", "world_size", "ddp", "loader_batches")


def rss_text(d: dict[str, Any]) -> str:
    peaks = [p for p in d.get("peak_rss_mib") or [] if p]
    if not peaks:
        return "?"
    if len(peaks) == 1:
        return f"{peaks[0]:.0f}"
    return f"{sum(peaks):.0f} ({' + '.join(f'{p:.0f}' for p in peaks)})"


def ran_with(d: dict[str, Any]) -> str:
    """A short account of a variant's details, for the table."""
    if d["processes"] == 1:
        parts = [f"1 process, {h.plural(d['threads'][0], 'thread')}, CPUs {d['affinity'][0]}"]
    else:
        threads = "/".join(map(str, sorted(set(d["threads"]))))
        word = "thread" if threads == "1" else "threads"
        parts = [f"{d['processes']} processes x {threads} {word}, CPUs {' | '.join(d['affinity'])}"]
    if any(len(t) > 1 for t in d["thread_cpus"]):  # threads allowed on different CPU sets
        parts.append("OpenMP threads pinned")
    strays = sorted({n for names in d["threads_outside_own_cpus"] for n in names})
    if strays:
        count = max(len(names) for names in d["threads_outside_own_cpus"])
        parts.append(f"up to {count} threads per process not confined to its CPUs ({', '.join(strays)})")
    alloc = "jemalloc" if all(d["jemalloc"]) else "tcmalloc" if all(d["tcmalloc"]) else None
    if alloc is None and (any(d["jemalloc"]) or any(d["tcmalloc"])):
        alloc = "allocator differs between ranks"
    parts.append(alloc or "glibc malloc")
    if max(d["world_size"]) > 1:
        ddp = "DDP" if all(d["ddp"]) else "no DDP"
        parts.append(f"world {max(d['world_size'])} ({d['backend']}), {ddp}")
        parts.append(f"{d['loader_batches'][0]} batches/epoch per rank")
    elif d["processes"] > 1:
        parts.append(f"no process group, {d['loader_batches'][0]} batches/epoch each")
    if not any(d.get("loader_timed", [True])):
        parts.append("timed steps without the DataLoader")
    if d["nanopatch_imported"][0] and d["channels_last"][0]:
        parts.append("channels-last")
    return ", ".join(parts)


def problems(key: str, d: dict[str, Any], physical_cores: int) -> list[str]:
    """What a variant's details say it did not run as it should."""
    key, nproc = split(key)
    found = []
    if key in (STOCK, STOCK_NPROC) and any(d["nanopatch_imported"]):
        found.append("nanopatch was imported")
    if key not in (STOCK, STOCK_NPROC) and not all(d["nanopatch_imported"]):
        found.append("nanopatch was not imported")
    if key in (NPROC, STOCK_NPROC):
        if d["processes"] != nproc or set(d["world_size"]) != {nproc}:
            found.append(f"{d['processes']} processes, world size {d['world_size']} (expected {nproc})")
        if not all(d["ddp"]):
            found.append("no DistributedDataParallel in some rank")
        if key == NPROC and physical_cores >= nproc and not d["disjoint_affinity"]:
            found.append(f"ranks' CPUs overlap: {' | '.join(d['affinity'])}")
        if not d["ranks_in_sync"]:
            found.append("ranks' parameters differ after the run (gradients not averaged)")
        if not d["ranks_saw_different_data"]:
            found.append("ranks saw the same first batch (loader not sharded)")
    elif max(d["world_size"]) != 1:
        found.append(f"world size {d['world_size']}")
    if key == APART:
        if d["processes"] != nproc:
            found.append(f"{d['processes']} processes (expected {nproc})")
        if physical_cores >= nproc and not d["disjoint_affinity"]:
            found.append(f"processes' CPUs overlap: {' | '.join(d['affinity'])}")
    if d.get("loader_timed") and any(d["loader_timed"]) == (key == NO_LOADER):
        found.append(
            "its timed steps took their batches from the DataLoader"
            if key == NO_LOADER
            else "its timed steps skipped the DataLoader"
        )
    return found


def share_problems(by_key: dict[str, dict[str, Any]]) -> None:
    """The one process on a rank's share must run where and as --nproc's first rank runs."""
    for key in by_key:
        base, nproc = split(key)
        share, ranks = (by_key.get(f"{k}:{nproc}", {}).get("details", {}) for k in (SHARE, NPROC))
        if base != SHARE or "problems" not in share or "problems" not in ranks:
            continue
        for fact in ("affinity", "threads"):
            if share[fact][0] != ranks[fact][0]:
                share["problems"].append(
                    f"{fact} {share[fact][0]}, where --nproc {nproc}'s first rank had {ranks[fact][0]}"
                )


def step_times(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median timed step of every run and rank, and the median wait for its batch in it, in ms."""
    steps = [t for run in runs for r in run["ranks"] for t in r["step_s"]]
    fetches = [t for run in runs for r in run["ranks"] for t in r.get("fetch_s", [])]
    return {
        "step_ms": statistics.median(steps) * 1000 if steps else None,
        "fetch_ms": statistics.median(fetches) * 1000 if fetches else None,
    }


def summarise(keys: list[str], runs: dict[str, list[dict[str, Any]]], args, cores: int, physical: int):
    rows, by_key = [], {}
    group = GROUP if args.model == "resnet18" else args.model
    for key in keys:
        ok = [r for r in runs[key] if "rate" in r]
        name, command_line = variant_name(key), shlex.join(command(key, args, "OUT"))
        r = h.ranks_row("multi_instance", group, name, "img/s", runs[key], cores, stock=key == STOCK, key=key)
        r["command"] = command_line
        if ok:
            facts = facts_of(ok[-1])
            changed = [f for f in STABLE if any(facts_of(x)[f] != facts[f] for x in ok)]
            d = r["details"]
            d.update(facts, changed_between_rounds=changed, step_s_per_rank=[x["step_s"] for x in ok[-1]["ranks"]])
            d.update(step_times(ok))
            d["problems"] = problems(key, d, physical) + [f"{f} changed between rounds" for f in changed]
        h.learning_row(r, h.record_of(runs[key]), h.record_of(runs.get(STOCK, [])), variant_name(STOCK))
        rows.append(r)
        by_key[key] = r
    share_problems(by_key)
    h.ratios_to(rows, by_key.get(STOCK))
    h.ratios_to(rows, by_key.get(TUNED), "ratio_to_tuned")
    return rows, by_key


#: issue 40's targets: a DataLoader costs at most 10% of the step; N processes train at least
#: 90% of N times what one process trains on 1/N of the cores (weak scaling)
LOADER_TARGET = 0.9
SCALING_TARGET = 0.9


def comparisons(by_key: dict[str, dict[str, Any]], counts: list[int]) -> list[dict[str, Any]]:
    """Ratios of one variant's rate to another's (median and per round); ``divisor`` makes the
    weak-scaling efficiency (N processes against N times one process on 1/N of the cores)."""
    pairs = []
    for n in counts:
        pairs += [
            (f"{NPROC}:{n}", TUNED, f"--nproc {n} vs one process on all cores (patched, tuned)", 1, None),
            (
                f"{NPROC}:{n}",
                f"{SHARE}:{n}",
                f"weak scaling: --nproc {n} vs {n} x one process on 1/{n} of the cores",
                n,
                SCALING_TARGET,
            ),
            (
                f"{APART}:{n}",
                f"{SHARE}:{n}",
                f"this machine: {n} processes at once without DDP vs {n} x one alone",
                n,
                None,
            ),
            (f"{NPROC}:{n}", f"{APART}:{n}", f"DDP: --nproc {n} vs {n} processes at once without DDP", 1, None),
            (f"{NPROC}:{n}", f"{STOCK_NPROC}:{n}", f"--nproc {n} vs stock torchrun --nproc {n} (DDP by hand)", 1, None),
        ]
    pairs += [
        (TUNED, NO_LOADER, "DataLoader: patched, tuned vs the same steps without its DataLoader", 1, LOADER_TARGET),
        (TUNED, UNTUNED, "tuned vs untuned single process", 1, None),
        (TUNED, UNPINNED, "the tuning's pinning: tuned vs the same with threads not pinned", 1, None),
        (TUNED, GLIBC, "the tuning's allocator: tuned vs the same on glibc's malloc", 1, None),
        (TUNED, STOCK, "patched, tuned vs stock", 1, None),
    ]  # fmt: skip
    out = []
    for a, b, label, divisor, target in pairs:
        ra, rb = by_key.get(a), by_key.get(b)
        if not ra or not rb or ra["rate"] is None or rb["rate"] is None:
            continue
        rounds = h.per_round(ra["rates"], ra["rounds"], rb["rates"], rb["rounds"])
        ratio = ra["rate"] / rb["rate"] / divisor
        found = {
            "label": label,
            "variant": ra["variant"],
            "against": rb["variant"],
            "ratio": ratio,
            "per_round": [r / divisor for r in rounds],
        }
        if target is not None:
            found.update(target=target, meets_target=ratio >= target)
        out.append(found)
    return out


#: nanopatch's processes together may peak at this many times stock's at the same process count
MEMORY_LIMIT = 1.3


def memory(by_key: dict[str, dict[str, Any]], counts: list[int]) -> list[dict[str, Any]]:
    """The processes' peak resident memory, summed over the ranks of a run (the last round's),
    nanopatch's against stock's at the same process count."""
    out = []
    pairs = [
        (TUNED, STOCK, "one process: patched, tuned vs stock"),
        (UNTUNED, STOCK, "one process: patched, untuned vs stock"),
        (GLIBC, STOCK, "one process: patched, tuned on glibc's malloc vs stock"),
    ] + [(f"{NPROC}:{n}", f"{STOCK_NPROC}:{n}", f"{n} processes: --nproc {n} vs stock torchrun") for n in counts]
    for a, b, label in pairs:
        da, db = (by_key.get(k, {}).get("details", {}) for k in (a, b))
        mine, theirs = da.get("total_peak_rss_mib"), db.get("total_peak_rss_mib")
        if not mine or not theirs:
            continue
        ratio = mine / theirs
        out.append(
            {
                "label": label,
                "variant": by_key[a]["variant"],
                "against": by_key[b]["variant"],
                "mib": mine,
                "against_mib": theirs,
                "ratio": ratio,
                "within_limit": ratio <= MEMORY_LIMIT,
            }
        )
    return out


def print_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    print("## Several training instances on one machine\n")
    print(h.cpu_line(m) + f"; torch {m['torch']}, Python {m['python']}")
    print(
        f"- {report['description']}; {h.plural(report['rounds'], 'round')} x {h.plural(report['steps'], 'timed step')} "
        f"per run after {report['warmup']} warm-up (and, under nanopatch, the steps it spent measuring bf16 against "
        "fp32 and channels-last against stock's layout, at most 38), each run a fresh process (group), "
        "order rotated each round; "
        f"1-min load average at start {m['loadavg_start']}"
    )
    print(
        "\n| variant | img/s (median) | min-max | x stock | x patched, tuned | CPU | other load | peak RSS, MiB "
        "(per process) | ran with |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in report["rows"]:
        if h.learns(row) is False:  # no rate: the verdict instead
            print(f"| {row['variant']} | {h.DOES_NOT_LEARN} |  |  |  |  |  |  | {h.cell(row['note'])} |")
            continue
        if row["rate"] is None:
            error = h.cell(row.get("error", "?"))
            print(f"| {row['variant']} | {'not run' if h.not_run(row) else 'failed'} |  |  |  |  |  |  | {error} |")
            continue
        d = row["details"]
        low, high = row["spread"]
        cells = [
            row["variant"],
            h.fmt(row["rate"]),
            f"{h.fmt(low)}-{h.fmt(high)}",
            f"{row['ratio_to_stock']:.2f}x" if row["ratio_to_stock"] is not None else "",
            f"{row['ratio_to_tuned']:.2f}x" if "ratio_to_tuned" in row else "",
            f"{d['cpu_use'] * 100:.0f}%",
            f"{max(d['other_load']) * 100:.0f}%" if d["other_load"] else "?",
            rss_text(d),
            ran_with(d),
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    for c in report["comparisons"]:
        rounds = c["per_round"]
        spread = f" (per round {min(rounds):.2f}-{max(rounds):.2f}x)" if rounds else ""
        target = ""
        if "target" in c:
            target = f"; target >= {c['target']:.2f}: {'met' if c['meets_target'] else '**not met**'}"
        print(f"- **{c['label']}**: {c['ratio']:.2f}x{spread}{target}")
    timed = [r for r in report["rows"] if r["rate"] is not None and r["details"].get("step_ms")]
    if timed:
        steps = "; ".join(
            f"{r['variant']} {r['details']['step_ms']:.0f} ({r['details']['fetch_ms'] or 0:.1f})" for r in timed
        )
        print(f"- a timed step, median ms (of it, waiting for the batch): {steps}")
    for m in report.get("memory", []):
        verdict = "within" if m["within_limit"] else "**over**"
        print(
            f"- memory, {m['label']}: {m['mib']:.0f} MiB against {m['against_mib']:.0f} ({m['ratio']:.2f}x, "
            f"{verdict} the {MEMORY_LIMIT}x limit)"
        )
    for row in report["rows"]:
        for problem in row["details"].get("problems", []):
            print(f"- warning: `{row['variant']}`: {problem}")
        if row["details"].get("load_warning"):
            print(f"- warning: `{row['variant']}`: {row['details']['load_warning']}")
        if row.get("failed_runs") and not h.not_run(row):
            print(f"- `{row['variant']}`: {row['failed_runs']} run(s) failed: {row['error']}")
    budget = h.left_out(report.get("round_orders", []))
    if budget:
        print(f"- {budget}")
    for row in report["rows"]:
        if row.get("learning"):
            print(f"- learning: {h.learning_line(row)}")
    for nproc_row in (r for r in report["rows"] if split(r["key"])[0] == NPROC and "problems" in r["details"]):
        d = nproc_row["details"]
        print(
            f"- `{nproc_row['variant']}` checks: CPUs of the ranks "
            f"{'disjoint' if d['disjoint_affinity'] else 'overlapping'} ({' | '.join(d['affinity'])}); "
            f"ranks saw {'different' if d['ranks_saw_different_data'] else 'the same'} data; parameters "
            f"{'equal' if d['ranks_in_sync'] else 'different'} across ranks after the run"
        )
    print(
        "\nimg/s: images of all processes / the slowest process's time for the timed steps; the median over "
        "the rounds. CPU: CPU time of all processes / (wall time x cores allowed). other load: the most CPU "
        "time other processes of the machine took during one of the variant's runs (from /proc/stat, less this "
        "run's own), as a share of all CPUs. peak RSS: the largest resident memory of the variant's processes "
        "in its last round, summed over them (each process's own peak in brackets). ran with: what the workers "
        "reported after the run (torch threads, CPU affinity when the process started, allocator mapped, "
        "process group)."
    )
    print(f"\nCommand: `{report['command']}`; run took {report['seconds']:.0f} s.")
