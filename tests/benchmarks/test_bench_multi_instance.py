"""bench/multi_instance.py runs end to end: the hidden tiny model at 32 px, batch 4, one round of
every variant (plain python, torchrun with DDP by hand, the runner untuned and tuned, tuned with
its timed steps skipping the DataLoader, one process on one rank's CPUs, two such processes at
once without a process group, and --nproc 2), and the JSON rows have the shape bench/run.py
reads, with what each variant really ran with, its processes' peak memory against stock's at the
same count, its first steps judged against stock's (nanopatch.learning), and the comparisons
issue 40 sets targets for (the DataLoader's cost, weak scaling, split into the machine's part and
DDP's)."""

from __future__ import annotations

import json

import pytest

from nanopatch.foundation import cpu

from conftest import REPO_ROOT, run_python
from helpers.bench_reports import h, suite_benches

NAMES = [
    "stock",
    "stock, torchrun --nproc 2",
    "patched, untuned",
    "patched, tuned",
    "patched, tuned, threads not pinned",
    "patched, tuned, glibc malloc",
    "patched, tuned, no DataLoader",
    "patched, one process on 1/2 of the cores",
    "patched, 2 processes at once, no DDP",
    "patched, --nproc 2",
]
STOCK_NAMES = ("stock", "stock, torchrun --nproc 2")


def test_tiny_run_of_every_variant(tmp_path):
    out = tmp_path / "mi.json"
    script = str(REPO_ROOT / "bench" / "multi_instance.py")
    tiny = ["--model", "tiny", "--image-size", "32", "--batch", "4", "--rounds", "1", "--steps", "2", "--warmup", "1"]
    tiny += ["--learning-steps", "2"]
    proc = run_python([script, *tiny, "--json", str(out)], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round 1/1" in proc.stderr
    for name in NAMES:
        assert f"| {name} |" in proc.stdout, proc.stdout
    assert "--nproc 2 vs one process on all cores" in proc.stdout
    assert "tuned vs untuned single process" in proc.stdout

    report = json.loads(out.read_text())
    machine = report["machine"]
    assert machine["model_name"] is not None and isinstance(machine["flags"], list) and machine["physical_cores"] >= 1
    assert "multi_instance.py" in report["command"] and "--json" in report["command"]
    assert [r["variant"] for r in report["rows"]] == NAMES
    assert report["round_orders"] == [{"order": NAMES}]

    rows = {r["variant"]: r for r in report["rows"]}
    stock_rate = rows["stock"]["rate"]
    for row in report["rows"]:
        assert row["group"] == "tiny" and row["unit"] == "img/s" and row["stock"] == (row["variant"] == "stock")
        assert len(row["details"]["peak_rss_mib"]) == row["details"]["processes"]
        total = row["details"]["total_peak_rss_mib"]
        assert total == pytest.approx(sum(row["details"]["peak_rss_mib"])) and total > 100
        assert row["bench"] == "multi_instance" and row["rate"] > 0, row.get("error")
        assert row["ratio_to_stock"] == pytest.approx(row["rate"] / stock_rate)
        assert row["spread"] == [row["rate"], row["rate"]]  # one round
        details = row["details"]
        assert details["problems"] == [], (row["variant"], details["problems"])
        assert all(t >= 1 for t in details["threads"]) and details["affinity"]
        assert len(details["other_load"]) == 1 and 0 <= details["other_load"][0] <= 1
        assert details["nanopatch_imported"] == [row["variant"] not in STOCK_NAMES] * details["processes"]
        # the first run's first 2 steps from the seed (rank 0's), judged against stock's
        learning = row["learning"]
        assert learning["steps"] == 2 and learning["grads"] == [8, 8], learning  # the tiny CNN's 8 parameters
        assert learning["learns"] is True, learning["verdict"]
        assert learning["against"] == (None if row["variant"] == "stock" else "stock")
        assert f"- learning: `{row['variant']}`: " in proc.stdout
    assert rows["stock"]["ratio_to_stock"] == 1.0
    # stock recorded without importing nanopatch (nanopatch.learning's file loaded on its own)
    assert report["runs"]["stock"][0]["ranks"][0]["nanopatch_imported"] is False
    # the --nproc ranks each recorded their own steps; rank 1 saw other batches
    ranks = report["runs"]["patched, --nproc 2"][0]["ranks"]
    assert [len(r["learning"]) for r in ranks] == [2, 2] and ranks[0]["learning"] != ranks[1]["learning"]
    # the steps nanopatch measured bf16 against fp32 in were warm-up, as many in every rank, up to
    # the bench's MAX_TRIAL_STEPS (bench/families/train_step/worker.py)
    assert ranks[0]["trial_steps"] == ranks[1]["trial_steps"] and 0 <= ranks[0]["trial_steps"] <= 38
    assert report["runs"]["stock"][0]["ranks"][0]["trial_steps"] == 0

    single = [rows[n]["details"] for n in ("stock", "patched, untuned", "patched, tuned")]
    for details in single:
        assert details["processes"] == 1 and details["world_size"] == [1] and details["ddp"] == [False]
        assert details["loader_batches"] == [8]
    assert single[0]["env"][0]["OMP_NUM_THREADS"] is None  # the caller's settings do not leak in
    assert single[1]["env"][0]["LD_PRELOAD"] is None and single[1]["jemalloc"] == [False]  # --no-tune
    assert single[2]["env"][0]["OMP_NUM_THREADS"] == str(machine["usable_cores"])  # tuned

    nproc = rows["patched, --nproc 2"]["details"]
    assert nproc["processes"] == 2 and nproc["world_size"] == [2, 2] and nproc["backend"] == "gloo"
    assert nproc["ddp"] == [True, True] and nproc["loader_batches"] == [4, 4]  # sharded: half each
    assert nproc["ranks_saw_different_data"] and nproc["ranks_in_sync"]
    if cpu.host_facts().physical_cores >= 2:
        assert nproc["disjoint_affinity"], nproc["affinity"]
        assert nproc["threads"] == [nproc["threads"][0]] * 2 and nproc["threads"][0] <= single[2]["threads"][0]

    by_hand = rows["stock, torchrun --nproc 2"]["details"]
    assert by_hand["processes"] == 2 and by_hand["ddp"] == [True, True] and by_hand["loader_batches"] == [4, 4]
    assert by_hand["ranks_saw_different_data"] and by_hand["ranks_in_sync"]
    assert by_hand["env"][0]["OMP_NUM_THREADS"] == str(max(1, machine["usable_cores"] // 2))

    # memory: the processes' peaks summed, nanopatch's against stock's at the same count
    memory = {m["label"]: m for m in report["memory"]}
    assert sorted(memory) == [
        "2 processes: --nproc 2 vs stock torchrun",
        "one process: patched, tuned on glibc's malloc vs stock",
        "one process: patched, tuned vs stock",
        "one process: patched, untuned vs stock",
    ]
    two = memory["2 processes: --nproc 2 vs stock torchrun"]
    assert two["mib"] == nproc["total_peak_rss_mib"] and two["against_mib"] == by_hand["total_peak_rss_mib"]
    assert two["ratio"] == pytest.approx(two["mib"] / two["against_mib"])
    assert all(m["within_limit"] == (m["ratio"] <= 1.3) for m in memory.values())
    assert "- memory, 2 processes: --nproc 2 vs stock torchrun: " in proc.stdout

    labels = {c["label"].split(" (")[0]: c for c in report["comparisons"]}
    assert labels["--nproc 2 vs one process on all cores"]["ratio"] == pytest.approx(
        rows["patched, --nproc 2"]["rate"] / rows["patched, tuned"]["rate"]
    )
    assert labels["--nproc 2 vs stock torchrun --nproc 2"]["ratio"] == pytest.approx(
        rows["patched, --nproc 2"]["rate"] / rows["stock, torchrun --nproc 2"]["rate"]
    )
    assert labels["tuned vs untuned single process"]["ratio"] == pytest.approx(
        rows["patched, tuned"]["rate"] / rows["patched, untuned"]["rate"]
    )

    # the tuning's settings one at a time: its pinning, its allocator
    unpinned, glibc = (rows[f"patched, tuned, {n}"]["details"] for n in ("threads not pinned", "glibc malloc"))
    assert unpinned["env"][0]["GOMP_CPU_AFFINITY"] is None and unpinned["tcmalloc"] == single[2]["tcmalloc"]
    assert glibc["tcmalloc"] == [False] and glibc["jemalloc"] == [False] and glibc["env"][0]["LD_PRELOAD"] is None
    assert glibc["env"][0]["GOMP_CPU_AFFINITY"] == single[2]["env"][0]["GOMP_CPU_AFFINITY"]
    for label, name in (("pinning", "threads not pinned"), ("allocator", "glibc malloc")):
        found = next(c for c in report["comparisons"] if c["label"].startswith(f"the tuning's {label}: "))
        assert found["ratio"] == pytest.approx(rows["patched, tuned"]["rate"] / rows[f"patched, tuned, {name}"]["rate"])

    # the DataLoader's cost: the same steps with batches the loader collated before
    no_loader = rows["patched, tuned, no DataLoader"]["details"]
    assert no_loader["loader_timed"] == [False] and single[2]["loader_timed"] == [True]
    assert "timed steps without the DataLoader" in proc.stdout
    loader = labels["DataLoader: patched, tuned vs the same steps without its DataLoader"]
    assert loader["ratio"] == pytest.approx(
        rows["patched, tuned"]["rate"] / rows["patched, tuned, no DataLoader"]["rate"]
    )
    assert loader["target"] == 0.9 and loader["meets_target"] == (loader["ratio"] >= 0.9)
    for row in report["rows"]:  # each step's wait for its batch, beside the step
        assert 0 <= row["details"]["fetch_ms"] < row["details"]["step_ms"], row["variant"]
    assert "- a timed step, median ms (of it, waiting for the batch): stock " in proc.stdout

    # weak scaling: --nproc 2 against twice one process on the first rank's CPUs, threads alike
    share = rows["patched, one process on 1/2 of the cores"]["details"]
    assert share["processes"] == 1 and share["affinity"][0] == nproc["affinity"][0]
    assert share["threads"][0] == nproc["threads"][0]
    weak = labels["weak scaling: --nproc 2 vs 2 x one process on 1/2 of the cores"]
    share_rate = rows["patched, one process on 1/2 of the cores"]["rate"]
    assert weak["ratio"] == pytest.approx(rows["patched, --nproc 2"]["rate"] / (2 * share_rate))
    assert weak["per_round"] == [pytest.approx(weak["ratio"])] and weak["target"] == 0.9
    # ... split into what the machine loses running two at once and what DDP costs on top
    apart = rows["patched, 2 processes at once, no DDP"]["details"]
    assert apart["processes"] == 2 and apart["world_size"] == [1, 1] and apart["ddp"] == [False, False]
    assert apart["loader_batches"] == [8, 8] and apart["affinity"] == nproc["affinity"]
    machine_part = labels["this machine: 2 processes at once without DDP vs 2 x one alone"]["ratio"]
    ddp_part = labels["DDP: --nproc 2 vs 2 processes at once without DDP"]["ratio"]
    assert machine_part * ddp_part == pytest.approx(weak["ratio"])

    # what bench/run.py makes of it
    adapted = suite_benches.rows_of(suite_benches.BENCHES["multi_instance"], report)
    assert [(r["variant"], r["stock"]) for r in adapted] == [(n, n == "stock") for n in NAMES]
    assert all(r["rate"] > 0 and r["ratio_to_stock"] is not None for r in adapted)


def test_counts_make_a_variant_each_and_weak_scaling_divides_by_the_count():
    """``--nproc 2,4``: the counted variants (stock torchrun, share, apart, --nproc) run once per
    count, named by it; weak scaling is N processes' rate over N times one process's on 1/N."""
    import argparse

    from families.multi_instance import launch, main, summary

    assert main.counts("2,4,2") == [2, 4]
    with pytest.raises(argparse.ArgumentTypeError):
        main.counts("two")
    keys = launch.expand(["stock", "share", "nproc"], [2, 4])
    assert keys == ["stock", "share:2", "share:4", "nproc:2", "nproc:4"]
    assert [launch.variant_name(k) for k in keys[1:]] == [
        "patched, one process on 1/2 of the cores",
        "patched, one process on 1/4 of the cores",
        "patched, --nproc 2",
        "patched, --nproc 4",
    ]
    assert launch.split("nproc:4") == ("nproc", 4) and launch.split("tuned") == ("tuned", 1)

    def row(rates):
        return {"variant": "v", "rate": sorted(rates)[1], "rates": rates, "rounds": [1, 2, 3]}

    by_key = {"share:4": row([10.0, 11.0, 12.0]), "nproc:4": row([36.0, 40.0, 44.0]), "tuned": row([30.0] * 3)}
    found = {c["label"]: c for c in summary.comparisons(by_key, [4])}
    weak = found["weak scaling: --nproc 4 vs 4 x one process on 1/4 of the cores"]
    assert weak["ratio"] == pytest.approx(40 / 44) and weak["per_round"] == pytest.approx([0.9, 40 / 44, 44 / 48])
    assert weak["meets_target"] is True
    assert found["--nproc 4 vs one process on all cores (patched, tuned)"]["ratio"] == pytest.approx(40 / 30)
    assert "target" not in found["--nproc 4 vs one process on all cores (patched, tuned)"]


def test_until_leaves_out_the_runs_that_would_end_after_it(tmp_path):
    """--until (bench/run.py --minutes' share): the first run is made, the runs expected to end
    after it are not; a variant never run is a row that says so, and the report names what was
    left out, round by round."""
    import time

    out = tmp_path / "mi.json"
    script = str(REPO_ROOT / "bench" / "multi_instance.py")
    tiny = ["--model", "tiny", "--image-size", "32", "--batch", "4", "--rounds", "2", "--steps", "1", "--warmup", "1"]
    tiny += ["--learning-steps", "1", "--variants", "stock,tuned", "--until", f"{time.time() + 1:.0f}"]
    proc = run_python([script, *tiny, "--json", str(out)], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]  # a row with a rate: stock's
    report = json.loads(out.read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert rows["stock"]["rate"] is not None and len(rows["stock"]["rates"]) == 1
    assert rows["patched, tuned"]["rate"] is None and rows["patched, tuned"]["error"] == h.NOT_RUN
    assert report["round_orders"] == [
        {"order": ["stock", "patched, tuned"], "skipped": ["patched, tuned"]},
        {"order": ["patched, tuned", "stock"], "skipped": ["patched, tuned", "stock"]},
    ]
    assert "| patched, tuned | not run |" in proc.stdout
    assert (
        "- the time budget (--until) left out round 1: `patched, tuned`; round 2: `patched, tuned`, `stock`"
        in proc.stdout
    )
    assert "run(s) failed" not in proc.stdout
