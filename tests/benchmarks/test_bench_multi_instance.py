"""bench/multi_instance.py runs end to end: the hidden tiny model at 32 px, batch 4, one round of
every variant (plain python, torchrun with DDP by hand, the runner untuned and tuned, and --nproc
2), and the JSON rows have the shape bench/run.py reads, with what each variant really ran with,
its processes' peak memory against stock's at the same count, and its first steps judged against
stock's (nanopatch.learning)."""

from __future__ import annotations

import json

import pytest

from nanopatch.foundation import cpu

from conftest import REPO_ROOT, run_python
from helpers.bench_reports import suite_benches

NAMES = ["stock", "stock, torchrun --nproc 2", "patched, untuned", "patched, tuned", "patched, --nproc 2"]
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

    # what bench/run.py makes of it
    adapted = suite_benches.rows_of(suite_benches.BENCHES["multi_instance"], report)
    assert [(r["variant"], r["stock"]) for r in adapted] == [(n, n == "stock") for n in NAMES]
    assert all(r["rate"] > 0 and r["ratio_to_stock"] is not None for r in adapted)
