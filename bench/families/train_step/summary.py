"""train_step's report: the rows of each model with their learning verdict, targets and roof, and
the Markdown table and notes it prints.
"""

from __future__ import annotations

import statistics
from typing import Any

import harness as h

from families.train_step.models import unit
from families.train_step.roof import roof_line
from families.train_step.variants import (
    BY_HAND,
    BY_HAND_TCMALLOC,
    COMPILE,
    COMPILE_EXTRA_WARMUP,
    LIGHTNING,
    PATCH_OPTIONS,
    PATCHED,
    STOCK,
    TARGET_X_LIGHTNING,
    TARGETS,
    TARGETS_BY_HAND,
)

#: a setup's timing, which a variant that does not learn as stock does not keep
SETUP_TIMING = ("learning_step_s", "warmup_step_s")


def learning_of(variant: str, results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The variant's learning entry: stock's own record, or the variant's judged against it
    (None when the variant never got through its setup)."""
    record = results[variant].get("setup", {}).get("learning")
    stock = results.get(STOCK, {}).get("setup", {}).get("learning")
    return None if record is None else h.learning_entry(record, stock, STOCK)


def summarise(model: str, results: dict[str, dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One row per variant: the median rate over the rounds, its spread, the ratio to stock, and
    the worker's setup and samples; or, for a variant that does not learn as stock, its verdict
    and no rate."""
    rows = []
    for variant, result in results.items():
        common = ("train_step", model, variant)
        learning = learning_of(variant, results)
        extra = {"learning": learning} if learning is not None else {}
        if learning is not None and learning["learns"] is False:  # keeps what it ran, not its samples
            setup = {k: v for k, v in result["setup"].items() if k not in SETUP_TIMING}
            failed = {"error": result["error"]} if result["status"] != "ok" else {}
            r = h.row(*common, None, unit(model), None, status=h.DOES_NOT_LEARN, setup=setup, **extra, **failed)
            rows.append(h.withhold(r))
            continue
        if result["status"] != "ok":
            note = h.one_line(result.get("error") or result["status"])
            rows.append(h.row(*common, None, unit(model), None, stock=variant == STOCK, note=note, **result, **extra))
            continue
        samples, setup = result["samples"], result["setup"]
        rates = [steps * setup["samples_per_step"] / s["elapsed_s"] for s in samples]
        stats = h.spread(rates)
        step_s = statistics.median(s["elapsed_s"] / steps for s in samples)
        untimed = setup["learning_step_s"] + setup["warmup_step_s"]
        extra_s = sum(untimed) - len(untimed) * step_s  # the untimed steps' time beyond as many steady steps
        r = h.row(
            *common,
            stats["median"],
            unit(model),
            None,
            stock=variant == STOCK,
            rates=rates,
            rounds=[s["round"] for s in samples],
            cpu_share=statistics.median(s["cpu_s"] / s["elapsed_s"] / setup["threads"] for s in samples),
            other_load=max((s["other_load"] for s in samples if s["other_load"] is not None), default=None),
            iqr_pct=stats["iqr_pct"],
            step_s=step_s,
            first_step_s=untimed[0] if untimed else None,
            warmup_extra_s=extra_s,
            peak_rss_mib=max(s["peak_rss_mib"] for s in samples),
            target_x_stock=TARGETS.get(model) if variant == PATCHED else None,
            **result,
            **extra,
        )
        if variant == COMPILE:
            r["compile_s"] = extra_s
        rows.append(r)
    stock = next((r for r in rows if r["stock"] and r["rate"] is not None), None)
    h.ratios_to(rows, stock)
    by_hand = next((r for r in rows if r["variant"] == BY_HAND and r["rate"] is not None), None)
    for r in rows:
        r["ratio_to_by_hand"] = None
    h.ratios_to(rows, by_hand, key="ratio_to_by_hand")
    lightning = next((r for r in rows if r["variant"] == LIGHTNING), None)
    tcmalloc = next((r for r in rows if r["variant"] == BY_HAND_TCMALLOC and r["rate"] is not None), None)
    for r in rows:
        if r.get("target_x_stock") is not None and r["ratio_to_stock"] is not None:
            r["met"] = r["ratio_to_stock"] >= r["target_x_stock"]
        r["targets"] = [] if h.learns(r) is False else targets_of(model, r, lightning)
        if r["variant"] == PATCHED and tcmalloc is not None and r["rate"] is not None:
            # not the issue's: nanopatch's own bar, never slower than the hand edit with the allocator
            ratio = r["rate"] / tcmalloc["rate"]
            r["targets"].append({"against": BY_HAND_TCMALLOC, "min": 1.0, "ratio": ratio, "met": ratio >= 1.0})
    return rows


def targets_of(model: str, r: dict[str, Any], lightning: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's targets that apply to row ``r`` (printed, never asserted): ``patched`` against
    stock and against by-hand (the real models); every variant nanopatch patched against
    ``lightning-bf16`` when that ran too (``lightning``: its row). ``met`` is None when either
    side has no rate."""
    out = []

    def check(against: str, minimum: float, ratio: float | None) -> None:
        out.append(
            {"against": against, "min": minimum, "ratio": ratio, "met": None if ratio is None else ratio >= minimum}
        )

    if r["variant"] == PATCHED and model in TARGETS:
        check(STOCK, TARGETS[model], r["ratio_to_stock"])
        if model in TARGETS_BY_HAND:
            check(BY_HAND, TARGETS_BY_HAND[model], r["ratio_to_by_hand"])
    if PATCH_OPTIONS[r["variant"]] is not None and lightning is not None:
        ratio = r["rate"] / lightning["rate"] if lightning["rate"] and r["rate"] is not None else None
        check(LIGHTNING, TARGET_X_LIGHTNING, ratio)
    return out


def ran_as(setup: dict[str, Any]) -> str:
    """A short account of what a variant's step really ran."""
    seen = setup["observed"]
    parts = [f"torch {setup['torch'].split('+')[0]}", f"{seen['compute_dtype'] or '?'} compute"]
    parts.append(f"inside {h.inside(seen['probe'])}" if seen["probe"] else "inside not probed (compiled)")
    if seen["conv_weight_channels_last"] is not None:
        parts.append("channels-last" if seen["conv_weight_channels_last"] else "NCHW")
    if seen["ipex_imported"]:
        parts.append(f"IPEX {setup['ipex']}")
    if seen["dynamo_graphs"]:
        parts.append(f"compiled ({seen['dynamo_graphs']} graphs)")
    if "lightning" in setup:
        parts.append(f"Lightning {setup['lightning']['version']} Trainer, precision {setup['lightning']['precision']}")
    parts.append(f"{seen['loss_dtype']} loss")
    decided = [d for d in setup.get("nanopatch", {}).get("bf16_measured", []) if d]
    if decided:
        parts.append("bf16 " + "; ".join(decided))
    return ", ".join(parts)


def notes_for(rows: list[dict[str, Any]], steps: int) -> list[str]:
    ok = {r["variant"]: r for r in rows if r["status"] == "ok"}
    notes = []
    for variant, result in ok.items():
        state = result["setup"]["nanopatch"]["targets"].get("training") if "nanopatch" in result["setup"] else None
        if "nanopatch" in result["setup"] and state != "patched":
            notes.append(f"`{variant}`: nanopatch's training target is {state}")
        counted = {s["optimizer_steps"] for s in result["samples"] if "optimizer_steps" in s}
        if counted - {steps}:
            notes.append(f"`{variant}`: Lightning counted {sorted(counted)} optimizer steps per sample, not {steps}")
        if result["setup"]["observed"]["loss_dtype"] != "float32":
            notes.append(f"`{variant}`: the loss was computed in {result['setup']['observed']['loss_dtype']}")
    suspects = {v: r for v, r in ok.items() if h.suspect(r)}
    busy = [f"`{v}` CPU {r['cpu_share']:.0%}, other {r.get('other_load') or 0:.0%}" for v, r in suspects.items()]
    if busy:
        notes.append(
            f"CPU below {h.BUSY_CPU_SHARE:.0%} or other load above {h.OTHER_LOAD_WARNING:.0%} ({'; '.join(busy)}): "
            "other processes were taking the cores, so these rates are suspect"
        )
    return notes


def print_markdown(report: dict[str, Any]) -> None:
    machine = report["machine"]
    print("## Training step: stock against nanopatch\n")
    print(h.cpu_line(machine) + f"; memory {machine['mem_total_gib'] or 0:.0f} GiB")
    for python, info in report["interpreters"].items():
        print(
            f"- `{python}` ({', '.join(info['variants'])}): Python {info['python_version']}, torch {info['torch']}, "
            f"torchvision {info['torchvision']}, IPEX {info['ipex'] or '-'}; threads: {info['threads']} intra-op "
            f"(torch's default), {info['interop_threads']} inter-op, affinity CPUs "
            f"{','.join(map(str, info['affinity']))}, OMP_NUM_THREADS {info['omp_num_threads_env'] or 'unset'}"
        )
    print(
        f"- {report['rounds']} rounds x {report['steps']} steps per variant, order rotated each round, one worker "
        f"computing at a time; before them {report['learning_steps']} learning steps and {report['warmup']} warm-up "
        f"steps (+{COMPILE_EXTRA_WARMUP} for compile)"
        f"{'; --quick sizes' if report['quick'] else ''}; 1-min load average at start {machine['loadavg_start']}"
    )
    for model, result in report["models"].items():
        print(f"\n### {model}: {result['description']} ({result['unit']})\n")
        print(roof_line(result.get("roof") or {}, result["unit"]) + "\n")
        print(
            f"| variant | {result['unit']} | min-max | IQR | CPU | x stock | per round | x by-hand | model GFLOP/s "
            "| of roof | first step s | warm-up extra s | peak RSS MiB | ran as |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        rows = [r for r in report["rows"] if r["group"] == model]
        for row in rows:
            variant = row["variant"]
            if row["status"] != "ok":  # failed, skipped, or does not learn (no rate: the verdict instead)
                error = h.cell(row["note"])
                print(f"| {variant} | {row['status']} |  |  |  |  |  |  |  |  |  |  |  | {error} |")
                continue
            per_round = row.get("ratio_per_round") or []
            spread = f"{min(per_round):.2f}-{max(per_round):.2f}" if per_round and variant != STOCK else ""
            cells = [
                variant,
                h.fmt(row["rate"]),
                "-".join(h.fmt(x) for x in row["spread"]),
                f"{row['iqr_pct']:.0f}%",
                f"{row['cpu_share'] * 100:.0f}%",
                ratio_text(row["ratio_to_stock"]),
                spread,
                ratio_text(row.get("ratio_to_by_hand")),
                f"{row['model_flops'] / 1e9:.0f}" if row.get("model_flops") is not None else "",
                f"{row['roof_fraction']:.0%}" if row.get("roof_fraction") is not None else "",
                f"{row['first_step_s']:.1f}" if row["first_step_s"] is not None else "",
                f"{max(0.0, row['warmup_extra_s']):.1f}",
                f"{row['peak_rss_mib']:.0f}",
                ran_as(row["setup"]),
            ]
            print("| " + " | ".join(cells) + " |")
        judged = [r for r in rows if r.get("learning")]
        if judged:
            print(
                f"\nLearning: {h.first_steps(report['learning_steps'])} of each variant from the seed, "
                "judged against stock's by nanopatch.learning (the test suite's definition); a variant that does not "
                "learn as stock gets no rate:\n"
            )
            for r in judged:
                print(f"- {h.learning_line(r)}")
        targets = [f"`{r['variant']}`: {targets_text(r['targets'])}" for r in rows if r.get("targets")]
        if targets:
            print("\nTargets (from the issue; printed, never asserted):\n")
            for line in targets:
                print(f"- {line}")
        notes = notes_for(rows, report["steps"])
        budget = h.left_out(result["rounds"])
        notes += [budget] if budget else []
        if notes:
            print()
            for note in notes:
                print(f"- {note}")
        for row in rows:
            if row.get("profile"):
                print_profile(model, row, report["steps"])
    print(
        "\nRates: median over the rounds of (steps x samples per step / wall time of the steps). min-max and IQR "
        "(interquartile range / median): the spread of those samples. CPU: the worker's CPU time / (wall time x "
        "its threads); well below 100%, other processes shared the cores. Other load (in the notes): the CPU time "
        "the rest of the machine took during a sample, as a share of all CPUs. x stock, x by-hand: ratios of the "
        "medians; per round: the range of the ratio to stock's sample of the same round. First step: the worker's "
        "first training step (the first learning step). Warm-up extra: the time of the learning and warm-up steps "
        "beyond as many steady steps (for compile: the compile time). Targets are printed, never asserted."
    )
    for note in report["notes"]:
        print(f"\nNote: {note}")
    print(f"\nRun took {report['seconds']:.0f} s.")


def ratio_text(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def targets_text(targets: list[dict[str, Any]]) -> str:
    parts = []
    for t in targets:
        against = f"{t['min']:g}x {t['against']}" if t["min"] != 1 else f"{t['against']}"
        verdict = "not run" if t["met"] is None else f"{t['ratio']:.2f}x, {'met' if t['met'] else 'not met'}"
        parts.append(f">= {against}: {verdict}")
    return "; ".join(parts)


def print_profile(model: str, row: dict[str, Any], steps: int) -> None:
    """One variant's profile: the top ops by self CPU time and the share of dtype conversion
    (``steps``: the steps of each timed sample, whose page faults the profiled ones are held against)."""
    profile = row["profile"]
    print(f"\n#### Profile: {model}, {row['variant']}\n")
    if "error" in profile:
        print(f"Not profiled: {h.cell(profile['error'])}")
        return
    conversion = profile["conversion"]
    unknown = conversion["copy_unknown_dtypes"]["ms"]
    load = profile.get("other_load")
    if load is not None and load > h.OTHER_LOAD_WARNING:
        print(
            f"**Other processes took {load:.0%} of the machine's CPU time while this was profiled: the times "
            "below are inflated by their contention.**\n"
        )
    inflated = page_faults_inflate(profile, row, steps)
    if inflated:
        print(f"**{inflated}**\n")
    print(
        f"{h.plural(profile['steps'], 'step')} under torch.profiler after the timed rounds: "
        f"{profile['step_ms']:.1f} ms per step (unprofiled: {row['step_s'] * 1000:.1f} ms); all ops' self CPU "
        f"{profile['self_ms']:.1f} ms. "
        f"Dtype conversion (self CPU of aten::copy_ with different destination and source dtypes): "
        f"**{conversion['ms']:.1f} ms, {conversion['share']:.0%} of the step**; all aten::copy_ "
        f"{conversion['copy_all']['ms']:.1f} ms ({conversion['copy_all']['share']:.0%}); aten::to + aten::_to_copy "
        f"{conversion['to_ops']['ms']:.1f} ms ({conversion['to_ops']['share']:.0%})"
        + (f"; aten::copy_ of unknown dtypes {unknown:.1f} ms" if unknown else "")
        + ". aten::copy_ by source -> destination dtype: "
        + ", ".join(f"{key} {value['ms']:.2f} ms" for key, value in conversion["copy_by_dtypes"].items())
        + ".\n"
    )
    print("| op | self CPU ms / step | % of step | calls / step |")
    print("|---|---:|---:|---:|")
    for op in profile["ops"]:
        print(f"| `{h.cell(op['name'])}` | {op['self_ms']:.2f} | {op['share']:.1%} | {op['calls']:g} |")


#: a profiled step that page-faults this many times more than a timed one (and at least
#: :data:`PROFILE_FAULTS_MIN` times) is flagged: its memory-bound operators' times are not the step's
PROFILE_FAULTS_RATIO = 2.0
PROFILE_FAULTS_MIN = 1000


def page_faults_inflate(profile: dict[str, Any], row: dict[str, Any], steps: int) -> str | None:
    """A warning where the profiled steps page-faulted far more than the timed ones (the
    profiler's own memory moving the steps' tensors onto new pages; see profiling.settle_heap),
    else None. Reports without the count (older ones) get none."""
    profiled = profile.get("faults_per_step")
    samples = [s for s in row.get("samples", []) if s.get("faults") is not None]
    if profiled is None or not samples or steps < 1:
        return None
    timed = sum(s["faults"] for s in samples) / (len(samples) * steps)
    if profiled < PROFILE_FAULTS_MIN or profiled < PROFILE_FAULTS_RATIO * timed:
        return None
    return (
        f"The profiled steps page-faulted {profiled:,.0f} times a step against {timed:,.0f} in the timed "
        "steps: the times of memory-bound operators below (copies, fills, element-wise and softmax "
        "kernels) are inflated by first touches of new memory that the timed steps do not make."
    )


def interpreters(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per interpreter, what its workers reported about themselves (first report wins)."""
    out: dict[str, dict[str, Any]] = {}
    keys = ("python_version", "torch", "torchvision", "ipex", "threads", "interop_threads", "affinity")
    for row in rows:
        if "setup" not in row:
            continue
        setup = row["setup"]
        entry = out.setdefault(setup["python"], {"variants": [], **{k: setup[k] for k in keys}})
        entry["omp_num_threads_env"] = setup["omp_num_threads_env"]
        if row["variant"] not in entry["variants"]:
            entry["variants"].append(row["variant"])
    return out
