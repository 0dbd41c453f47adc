"""bench/run.py without running a real benchmark: the rows it reads (the one schema of
bench/harness/rows.py, as each bench writes them), the Markdown and README tables, the charts, and a
run of tiny fake benches (one failing, one too slow, one missing) through an injected registry.
Also the benches' own row builders on made-up samples. Nothing asserts on a timing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import textwrap
from pathlib import Path

import pytest

from nanopatch.foundation import cpu as cpu_facts

from helpers.bench_reports import (
    chart_parts,
    fake_facts,
    h,
    load_bench,
    report_charts,
    report_markdown,
    report_readme,
    report_render,
    run,
    suite_benches,
    suite_runner,
)

# --- samples of each bench's rows (real --quick runs on the 2-core EPYC, trimmed) ---------------


def rows(bench, unit, table, *, stock, **common):
    """Rows from (group, variant, rate, ratio[, cpu_share]) tuples."""
    out = []
    for group, variant, rate, ratio, *cpu in table:
        extra = {"cpu_share": cpu[0]} if cpu else {}
        out.append(h.row(bench, group, variant, rate, unit, ratio, stock=variant == stock, **common, **extra))
    return out


DECODE = {
    "machine": {"cpu": "AMD EPYC", "cpus_available": 2, "torch": "2.13.0+cu130", "nanopatch": "0.1.0"},
    "processes": 3,
    "rows": rows(
        "decode",
        "img/s",
        [
            ("500x375", "stock loader", 972.289, 1.0),
            ("500x375", "nanopatch loader", 1121.944, 1.153920),
            ("500x375", "PyTurboJPEG decode", 1332.414, 1.370389),
            ("500x375", "nanopatch DCT-scaled (min 224)", 1208.200, 1.242635),
            ("2400x1800", "stock loader", 50.8527, 1.0),
            ("2400x1800", "nanopatch loader", 59.6108, 1.172226),
            ("2400x1800", "PyTurboJPEG decode", 67.5889, 1.329112),
            ("2400x1800", "nanopatch DCT-scaled (min 224)", 102.8446, 2.022402),
        ],
        stock="stock loader",
        cpu_share=0.99,
        iqr_pct=5.0,
    ),
}

TRANSFORMS = {
    "clock": "wall",
    "rows": rows(
        "transforms",
        "img/s",
        [
            ("train 500x375", "stock", 398.9308, 1.0, 0.76),
            ("train 500x375", "nanopatch", 515.6146, 1.292491),
            ("train 500x375", "nanopatch fast decode", 547.2045, 1.371678),
            ("train 500x375", "albumentations", 777.9492, 1.950086),
            ("val 2400x1800", "stock", 23.98826, 1.0),
            ("val 2400x1800", "nanopatch", 48.84289, 2.036117),
            ("val 2400x1800", "nanopatch fast decode", 67.5739, 2.816958),
            ("val 2400x1800", "albumentations", 52.16633, 2.174661),
        ],
        stock="stock",
    ),
}

IPEX_SKIPPED = (
    "skipped: /work/venv/bin/python: intel-extension-for-pytorch is not installed; give an interpreter that has "
    "it with --ipex-python PATH"
)

TRAIN_STEP = {
    "benchmark": "train_step",
    "rows": [
        *rows(
            "train_step",
            "img/s",
            [
                ("resnet18", "stock", 38.83405, 1.0, 0.98),
                ("resnet18", "patched", 58.90236, 1.516771),
                ("resnet18", "compile", 70.64674, 1.819196, 0.51),
            ],
            stock="stock",
            status="ok",
        ),
        h.row("train_step", "resnet18", "ipex", None, "img/s", None, note=IPEX_SKIPPED, status="skipped"),
        h.row("train_step", "transformer", "stock", 1650.2, "tokens/s", 1.0, stock=True, status="ok"),
        h.row("train_step", "transformer", "patched", None, "tokens/s", None, status="failed",
              error="worker exited with code -9 (killed)\n"),
    ],
}  # fmt: skip

IMPORT_COST_S = {
    "import torch": [2.674474, 2.662333, 2.697959],
    "import torch, nanopatch": [2.519149],
    "import torch, nanopatch + patch_torch()": [2.504686],
}

MULTI_INSTANCE = {
    "rows": rows(
        "multi_instance",
        "img/s",
        [("resnet18", "stock", 14.2, None), ("resnet18", "patched, --nproc 2", 35.5, 2.5)],
        stock="stock",
        details={"cpu_use": 0.9},
        other_load=0.12,
    )
}

ROW_KEYS = {"bench", "group", "variant", "rate", "unit", "ratio_to_stock", "stock", "spread"}


def by_key(rows):
    return {(r["group"], r["variant"]): r for r in rows}


def test_rows_of_keeps_the_common_keys():
    decoded = suite_benches.rows_of(suite_benches.BENCHES["decode"], DECODE)
    assert len(decoded) == 8 and all(set(r) == ROW_KEYS | {"cpu_share"} for r in decoded)
    cells = by_key(decoded)
    stock = cells[("500x375", "stock loader")]
    assert stock["stock"] and stock["ratio_to_stock"] == 1.0 and stock["rate"] == pytest.approx(972.289)
    assert [r["group"] for r in decoded if r["stock"]] == ["500x375", "2400x1800"]
    multi = suite_benches.rows_of(suite_benches.BENCHES["multi_instance"], MULTI_INSTANCE)
    assert all("details" not in r for r in multi)  # the bench's own details stay in its raw JSON
    assert multi[0]["stock"] and multi[0]["ratio_to_stock"] == 1.0 and multi[1]["ratio_to_stock"] == 2.5


def test_rows_of_notes_what_did_not_run():
    cells = by_key(suite_benches.rows_of(suite_benches.BENCHES["train_step"], TRAIN_STEP))
    ipex = cells[("resnet18", "ipex")]
    assert ipex["rate"] is None and ipex["ratio_to_stock"] is None and not ipex["stock"]
    assert ipex["note"].startswith("skipped: ") and "--ipex-python" in ipex["note"]
    failed = cells[("transformer", "patched")]
    assert failed["rate"] is None and failed["note"] == "worker exited with code -9 (killed)"
    assert h.suspect(cells[("resnet18", "compile")]) and not h.suspect(cells[("resnet18", "stock")])


def test_train_step_rows_keep_the_ratio_to_by_hand():
    """train_step's rows carry ``ratio_to_by_hand`` (and their own details: targets, profile); the
    report keeps the ratio beside the common keys and leaves the details in the raw JSON."""
    raw = {
        "benchmark": "train_step",
        "rows": [
            h.row("train_step", "resnet18", "stock", 12.0, "img/s", None, stock=True, ratio_to_by_hand=0.5),
            h.row("train_step", "resnet18", "by-hand", 24.0, "img/s", 2.0, ratio_to_by_hand=1.0),
            h.row("train_step", "resnet18", "patched", 26.4, "img/s", 2.2, ratio_to_by_hand=1.1,
                  targets=[{"against": "by-hand", "min": 1.1, "ratio": 1.1, "met": True}], profile={"ops": []}),
            h.row("train_step", "resnet18", "lightning-bf16", None, "img/s", None, ratio_to_by_hand=None,
                  status="failed", error="boom"),
        ],
    }  # fmt: skip
    cells = by_key(suite_benches.rows_of(suite_benches.BENCHES["train_step"], raw))
    assert [cells[("resnet18", v)]["ratio_to_by_hand"] for v in ("stock", "by-hand", "patched")] == [0.5, 1.0, 1.1]
    patched = cells[("resnet18", "patched")]
    assert set(patched) == ROW_KEYS | {"ratio_to_by_hand"} and patched["ratio_to_stock"] == 2.2
    failed = cells[("resnet18", "lightning-bf16")]
    assert failed["rate"] is None and failed["ratio_to_by_hand"] is None and failed["note"] == "boom"
    # the other benches' rows have no such key and gain none
    assert all("ratio_to_by_hand" not in r for r in suite_benches.rows_of(suite_benches.BENCHES["decode"], DECODE))
    assert "lightning-bf16" in report_markdown.markdown(
        {"benches": {"train_step": {"status": "ok", "rows": list(cells.values())}}}, suite_benches.BENCHES, {}
    )


def test_frameworks_rows_lose_their_group_prefix():
    table = [("hf", "hf-stock", 50.0, 1.0), ("hf", "hf-nanopatch", 100.0, 2.0), ("lightning", "nproc2", 60.0, 2.2)]
    raw = {"rows": rows("frameworks", "samples/s", table, stock="hf-stock")}
    shown = suite_benches.rows_of(suite_benches.BENCHES["frameworks"], raw)
    assert [(r["group"], r["variant"], r["stock"]) for r in shown] == [
        ("hf", "stock", True),
        ("hf", "nanopatch", False),
        ("lightning", "nproc2", False),
    ]


def test_suspect_rows():
    assert h.suspect(h.row("b", "g", "v", 1.0, "x", 1.0, cpu_share=0.5))
    assert h.suspect(h.row("b", "g", "v", 1.0, "x", 1.0, other_load=0.2))
    assert h.suspect(h.row("b", "g", "v", 1.0, "x", 1.0, noisy=True))
    assert not h.suspect(h.row("b", "g", "v", 1.0, "x", 1.0, cpu_share=0.95, other_load=0.01))


def test_spread_and_rotation():
    assert h.spread([1.0, 2.0, 3.0, 4.0, 5.0])["median"] == 3.0
    assert h.spread([2.0])["iqr_pct"] == 0.0
    assert [h.rotated(["a", "b", "c"], i) for i in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert h.per_round([2.0, 4.0], [0, 1], [1.0, 2.0, 9.0], [0, 1, 2]) == [2.0, 2.0]


def test_import_cost_rows():
    ic = load_bench("import_cost")
    table = ic.rows(IMPORT_COST_S)
    assert [r["variant"] for r in table] == list(IMPORT_COST_S)
    assert all(r["group"] == "start-up" and r["unit"] == "ms" for r in table)
    stock, imported, patched = table
    assert stock["stock"] and stock["ratio_to_stock"] == 1.0 and stock["rate"] == pytest.approx(2674.474)
    # a speed-up like every other ratio: stock's time over the variant's
    assert imported["ratio_to_stock"] == pytest.approx(2.674474 / 2.519149)
    assert patched["rate"] == pytest.approx(2504.686)
    assert not any(h.suspect(r) for r in table)


def test_import_cost_rows_flag_noise():
    ic = load_bench("import_cost")
    stock, imported, _ = ic.rows({**IMPORT_COST_S, "import torch": [4.287, 2.260, 2.270, 3.972, 4.950]})
    assert h.suspect(stock) and stock["note"].startswith("\u2020 samples 2260-4950 ms over 5 rounds")
    assert not h.suspect(imported) and "note" not in imported


def test_decode_and_transforms_rows():
    load_bench("decode")  # the script imports; its rows are families/decode/summary.py's
    from families.decode import summary as decode_summary

    sizes = {(500, 375): ["a.jpg", "b.jpg"]}
    same = {"500x375": {"pixels": "= stock"}}
    outputs = {"stock loader": same, "nanopatch loader": same}
    report = {
        "outputs": outputs,
        "img_per_s": {"stock loader|500x375": [100.0, 110.0], "nanopatch loader|500x375": [200.0, 220.0]},
        "cpu_share": {"stock loader|500x375": [0.99, 0.98], "nanopatch loader|500x375": [0.97, 0.99]},
        "faults": {"stock loader|500x375": [10, 10], "nanopatch loader|500x375": [1, 1]},
    }
    stock, loader = decode_summary.summarise([report, report], sizes)
    assert stock["stock"] and stock["group"] == "500x375" and stock["rate"] == pytest.approx(105.0)
    assert loader["ratio_to_stock"] == pytest.approx(2.0) and loader["spread"] == [200.0, 220.0]
    assert loader["x_stock_per_process"] == [pytest.approx(2.0)] * 2 and loader["output"]["pixels"] == "= stock"


def test_bench_command_lines(tmp_path):
    quick, full = suite_benches.Options(quick=True), suite_benches.Options(ipex_python="/opt/ipex/bin/python")
    out = tmp_path / "out.json"
    benches = suite_benches.BENCHES
    assert benches["decode"].args(quick, out) == ["--quick", "--json"]
    assert benches["transforms"].args(full, out) == ["--json"]
    assert benches["import_cost"].args(quick, out) == [
        "--rounds",
        str(suite_benches.IMPORT_COST_QUICK_ROUNDS),
        "--json",
    ]
    assert benches["import_cost"].args(full, out) == ["--json"]
    assert benches["train_step"].args(quick, out) == ["--quick", "--json", str(out)]
    assert benches["train_step"].args(full, out) == ["--ipex-python", "/opt/ipex/bin/python", "--json", str(out)]
    assert benches["multi_instance"].args(quick, out) == ["--quick", "--json", str(out)]
    for name in ("decode", "transforms", "train_step", "import_cost"):
        assert benches[name].script.exists(), name


def test_server_command_lines(tmp_path):
    """``--server``: train_step, multi_instance and frameworks at server sizes; with ``--quick``
    their quick modes, GPT-2 at the small size."""
    server, quick = suite_benches.Options(server=True), suite_benches.Options(server=True, quick=True)
    out = tmp_path / "out.json"
    benches = suite_benches.BENCHES
    assert benches["train_step"].args(server, out) == [*suite_benches.SERVER["train_step"], "--json", str(out)]
    cores = cpu_facts.host_facts().physical_cores
    counts = ",".join(str(n) for n in (2, 4, 8) if n == 2 or n <= cores)  # 2,4,8, or fewer on fewer cores
    assert benches["multi_instance"].args(server, out) == [
        "--variants", "stock,stock-nproc,tuned,no-loader,share,apart,nproc", "--nproc", counts, "--rounds", "2",
        "--steps", "3", "--json", str(out)
    ]  # fmt: skip
    assert suite_benches.server_counts() == ("2,4,8" if cores >= 8 else "2,4" if cores >= 4 else "2")
    full = benches["frameworks"].args(server, out)
    assert full[full.index("--hf-size") + 1] == "base" and "--lora" in full
    checked = benches["frameworks"].args(quick, out)
    assert checked[0] == "--quick" and "--hf-size" not in checked and "--lora" in checked
    assert benches["decode"].args(server, out) == ["--json"]  # not a server family: unchanged
    budgeted = suite_benches.Options(server=True, until=1234.4)
    assert benches["train_step"].args(budgeted, out) == [
        *suite_benches.SERVER["train_step"], "--until", "1234", "--json", str(out)
    ]  # fmt: skip
    assert benches["decode"].args(budgeted, out) == ["--json"]  # takes no --until


def test_deadlines_share_the_minutes_in_the_order_run():
    """--minutes: each family that takes --until gets its share of the budget added to those run
    before it (time one leaves unused passes on), less a margin for its report; others get none."""
    shares, margin = suite_benches.BUDGET_SHARES, suite_benches.BUDGET_MARGIN_S
    found = suite_benches.deadlines(["decode", "train_step", "multi_instance", "frameworks"], 8, 1000.0)
    assert list(found) == ["train_step", "multi_instance", "frameworks"]
    assert found["train_step"] == pytest.approx(1000 + 480 * shares["train_step"] - margin)
    two = shares["train_step"] + shares["multi_instance"]
    assert found["multi_instance"] == pytest.approx(1000 + 480 * two - margin)
    assert found["frameworks"] == pytest.approx(1000 + 480 - margin)
    assert suite_benches.deadlines(["multi_instance"], 2, 0.0) == {"multi_instance": 120 - margin}


def test_interleave_makes_only_the_runs_expected_to_end_in_time():
    """A run is made where it is expected to end by --until: a name's last run's time, or the mean
    of the runs so far for one not run yet (the first run of all always); what is left out is
    named per round, and a name never run gets one result saying so."""
    now = [1000.0]
    took = {"a": 10.0, "b": 20.0, "c": 30.0}

    def run_one(name):
        now[0] += took[name]
        return {"rate": 1.0, "wall_s": took[name]}

    runs, orders = h.interleave(["a", "b", "c"], 2, run_one, lambda _: None, 0.0, until=1075.0, clock=lambda: now[0])
    # round 1: a (nothing known), b (~10 s: ends 1030), c (~15 s: ends 1045); round 2 from 1060:
    # b (20 s) and c (30 s) would end after 1075, a (10 s) ends at 1070
    assert [len(runs[n]) for n in "abc"] == [2, 1, 1] and now[0] == 1070.0
    assert orders == [{"order": ["a", "b", "c"]}, {"order": ["b", "c", "a"], "skipped": ["b", "c"]}]
    assert h.left_out(orders) == "the time budget (--until) left out round 2: `b`, `c`"

    now[0] = 1000.0
    runs, orders = h.interleave(["a", "b"], 2, run_one, lambda _: None, 0.0, until=1005.0, clock=lambda: now[0])
    assert len(runs["a"]) == 1 and runs["b"] == [{"error": h.NOT_RUN, "round": None, "not_run": True}]
    assert h.not_run({"rate": None, "error": runs["b"][0]["error"]}) and not h.not_run({"rate": None, "error": "x"})
    assert orders[0]["skipped"] == ["b"] and orders[1]["skipped"] == ["b", "a"]
    now[0] = 2000.0  # a budget ended before the first run: that one is made all the same
    runs, orders = h.interleave(["a", "b"], 1, run_one, lambda _: None, 0.0, until=1005.0, clock=lambda: now[0])
    assert len(runs["a"]) == 1 and runs["b"][0]["error"] == h.NOT_RUN
    runs, orders = h.interleave(["a", "b"], 2, run_one, lambda _: None, 0.0)  # no budget: every run
    assert [len(runs[n]) for n in "ab"] == [2, 2] and h.left_out(orders) is None


def test_server_runs_the_server_families_and_names_its_files(tmp_path, quick_facts):
    registry = {name: fake_bench(tmp_path, name, GOOD) for name in ("decode", *suite_benches.SERVER)}
    out = tmp_path / "results"
    assert run.main(["--server", "--quick", "--out", str(out)], benches=registry) == 0
    (path,) = out.glob("*.json")
    results = json.loads(path.read_text())
    assert path.stem.endswith("-server") and results["server"] is True and results["quick"] is True
    assert list(results["benches"]) == list(suite_benches.SERVER)
    budget = results["budget"]  # --server: 8 minutes unless --minutes says otherwise, shared out as --until
    assert budget["minutes"] == suite_benches.SERVER_MINUTES and list(budget["until"]) == list(suite_benches.SERVER)
    started = dt.datetime.fromisoformat(results["started"]).timestamp()
    assert budget["until"]["frameworks"] == pytest.approx(started + 480 - suite_benches.BUDGET_MARGIN_S, abs=5)


def test_minutes_hands_each_budgeted_family_its_until(tmp_path, quick_facts):
    """--minutes without --server: the families that take --until get it on their command line
    (the fake benches print theirs), the others run as before."""

    def args(options, _):
        return ["--until", f"{options.until:.0f}"] if options.until is not None else []

    registry = {
        name: dataclasses.replace(fake_bench(tmp_path, name, GOOD), args=args) for name in ("decode", "multi_instance")
    }
    out = tmp_path / "results"
    assert run.main(["--minutes", "2", "--out", str(out)], benches=registry) == 0
    (path,) = out.glob("*.json")
    results = json.loads(path.read_text())
    until = results["budget"]["until"]
    assert list(until) == ["multi_instance"]
    assert results["benches"]["multi_instance"]["raw"]["argv"] == ["--until", f"{until['multi_instance']:.0f}"]
    assert results["benches"]["decode"]["raw"]["argv"] == []


def test_parse_json_output_skips_lines_before_it():
    assert suite_runner.parse_json_output('{"a": 1}\n') == {"a": 1}
    assert suite_runner.parse_json_output('a note\n{"a": [1,\n 2]}\n') == {"a": [1, 2]}
    with pytest.raises(ValueError):
        suite_runner.parse_json_output("Traceback (most recent call last):\n  oops")


# --- reports --------------------------------------------------------------------------------


def sample_results():
    benches = {}
    for name, raw in (("decode", DECODE), ("transforms", TRANSFORMS), ("train_step", TRAIN_STEP)):
        benches[name] = {
            "status": "ok",
            "raw": raw,
            "rows": suite_benches.rows_of(suite_benches.BENCHES[name], raw),
            "seconds": 45.0,
        }
    benches["import_cost"] = {
        "status": "failed",
        "error": "exited with code 1",
        "log": "2026-11-22-testhost-import_cost.log",
        "log_tail": "Traceback (most recent call last):\nRuntimeError: boom",
        "seconds": 3.0,
    }
    return {
        "schema": suite_benches.SCHEMA,
        "command": "PYTHONPATH=. python bench/run.py --quick",
        "quick": True,
        "started": "2026-11-22T00:30:00+00:00",
        "duration_s": 312.0,
        **fake_facts(),
        "git": {"commit": "78f9672701cd0123456789", "dirty": False},
        "benches": benches,
        "skipped": {"multi_instance": "not run: bench/multi_instance.py does not exist"},
        "failures": [{"bench": "import_cost", "error": "exited with code 1"}],
        "rows": [r for entry in benches.values() for r in entry.get("rows", [])],
    }


def test_markdown_marks_other_load():
    entry = {
        "status": "ok",
        "rows": suite_benches.rows_of(suite_benches.BENCHES["multi_instance"], MULTI_INSTANCE),
        "seconds": 1.0,
    }
    text = report_markdown.markdown(
        {**sample_results(), "benches": {"multi_instance": entry}}, suite_benches.BENCHES, {}
    )
    assert "| resnet18 | img/s | 14.2\u2020 | 35.5\u2020 (2.50x) |" in text.splitlines()
    loaded = "(`stock` resnet18 12%, `patched, --nproc 2` resnet18 12%)"
    assert f"other load above 5% of all CPUs during a round {loaded}" in text


def test_markdown_tables():
    text = report_markdown.markdown(sample_results(), suite_benches.BENCHES, {"decode": "x-decode.png"})
    assert text.startswith("# nanopatch benchmarks: 2026-11-22, testhost\n")
    assert "AMD EPYC 9R14, 2 physical cores" in text and "avx512_bf16" in text and "AMX: no" in text
    assert "torch 2.13.0" in text and "nanopatch 0.1.0" in text and "78f9672701cd" in text
    assert "`PYTHONPATH=. python bench/run.py --quick`" in text and "took 5 min 12 s" in text
    lines = text.splitlines()
    header = "| size | unit | stock loader | nanopatch loader | PyTurboJPEG decode | nanopatch DCT-scaled (min 224) |"
    assert header in lines
    assert "| 500x375 | img/s | 972 | 1122 (1.15x) | 1332 (1.37x) | 1208 (1.24x) |" in lines
    assert "| 2400x1800 | img/s | 50.9 | 59.6 (1.17x) | 67.6 (1.33x) | 103 (2.02x) |" in lines
    assert "| pipeline | unit | stock | nanopatch | nanopatch fast decode | albumentations |" in lines
    assert "| val 2400x1800 | img/s | 24.0 | 48.8 (2.04x) | 67.6 (2.82x) | 52.2 (2.17x) |" in lines
    assert "| train 500x375 | img/s | 399\u2020 | 516 (1.29x) | 547 (1.37x) | 778 (1.95x) |" in lines
    assert any(line.startswith("- \u2020 CPU below 90% of the wall time (`stock` train 500x375 76%)") for line in lines)
    assert "| model | unit | stock | patched | compile | ipex |" in lines
    assert "| resnet18 | img/s | 38.8 | 58.9 (1.52x) | 70.6\u2020 (1.82x) | did not run |" in lines
    assert "| transformer | tokens/s | 1650 | did not run |  |  |" in lines
    assert any(line.startswith("- `ipex` (resnet18): skipped:") for line in lines)
    assert "![decode: speed-up over stock](x-decode.png)" in lines
    assert "**Failed**: exited with code 1 (log: `2026-11-22-testhost-import_cost.log`)" in lines
    assert "RuntimeError: boom" in text
    assert "- multi_instance: not run: bench/multi_instance.py does not exist" in lines


def test_readme_table():
    text = report_readme.readme_table(sample_results(), suite_benches.BENCHES)
    lines = text.splitlines()
    assert lines[0] == "| benchmark | pipeline / model | stock | nanopatch (speed-up over stock) |"
    assert "| decode | 500x375 | 972 img/s | loader 1.15x, DCT-scaled decode 1.24x |" in lines
    # a ratio whose stock or variant shared its cores while timed is marked
    assert "| transforms | train 500x375 | 399 img/s | nanopatch 1.29x\u2020, fast decode 1.37x\u2020 |" in lines
    assert "| transforms | val 2400x1800 | 24.0 img/s | nanopatch 2.04x, fast decode 2.82x |" in lines
    assert "| train_step | resnet18 | 38.8 img/s | patched 1.52x, compile 1.82x\u2020 |" in lines
    assert any(line.startswith("\u2020 suspect: other processes were taking the cores") for line in lines)
    assert "| train_step | transformer | 1650 tokens/s | - |" in lines
    assert "| import_cost | - | - | failed: exited with code 1 |" in lines
    assert not any("albumentations" in line or "PyTurboJPEG" in line for line in lines)  # only nanopatch's
    last = lines[-1]
    assert "AMD EPYC 9R14" in last and "avx512_bf16" in last and "no AMX" in last and "2026-11-22" in last
    assert "`PYTHONPATH=. python bench/run.py --quick`" in last


def test_readme_import_cost_shows_the_difference():
    raw = {"rows": load_bench("import_cost").rows(IMPORT_COST_S)}
    entry = {"status": "ok", "rows": suite_benches.rows_of(suite_benches.BENCHES["import_cost"], raw)}
    results = {**sample_results(), "benches": {"import_cost": entry}}
    lines = report_readme.readme_table(results, suite_benches.BENCHES).splitlines()
    assert (
        "| import_cost | start-up | 2674 ms | import nanopatch -155 ms (1.06x), + patch_torch() -170 ms (1.07x) |"
        in (lines)
    )


def test_render_writes_charts(tmp_path):
    pytest.importorskip("matplotlib")
    results = sample_results()
    path = tmp_path / "2026-11-22-testhost.json"
    path.write_text(json.dumps(results))
    written = report_render.render(results, path, suite_benches.BENCHES)
    names = sorted(p.name for p in written)
    assert names == [
        "2026-11-22-testhost-decode.png",
        "2026-11-22-testhost-train_step.png",
        "2026-11-22-testhost-transforms.png",
        "2026-11-22-testhost.md",
    ]
    for png in (p for p in written if p.suffix == ".png"):
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    md = (tmp_path / "2026-11-22-testhost.md").read_text()
    assert "![train_step: speed-up over stock](2026-11-22-testhost-train_step.png)" in md


def test_render_command_prints_readme(tmp_path, capsys):
    path = tmp_path / "2026-11-22-testhost.json"
    path.write_text(json.dumps(sample_results()))
    assert run.main(["--render", str(path), "--readme"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| benchmark | pipeline / model |") and "| decode | 2400x1800 | 50.9 img/s |" in out
    assert (tmp_path / "2026-11-22-testhost.md").read_text().startswith("# nanopatch benchmarks")
    assert json.loads(path.read_text()) == sample_results()  # rows up to date: the file is left alone


def test_results_stem_never_overwrites(tmp_path):
    import datetime as dt

    when = dt.datetime(2026, 11, 22, 9, 0)
    assert suite_runner.results_stem(tmp_path, when, "my host/1") == "2026-11-22-my-host-1"
    (tmp_path / "2026-11-22-my-host-1.json").write_text("{}")
    assert suite_runner.results_stem(tmp_path, when, "my host/1") == "2026-11-22-my-host-1-2"


# --- a run of fake benches --------------------------------------------------------------------


def fake_bench(tmp_path: Path, name: str, code: str, *, json_to: str = "stdout", exists: bool = True):
    script = tmp_path / f"{name}.py"
    if exists:
        script.write_text(textwrap.dedent(code))

    def args(options, json_path):
        return [*(["--quick"] if options.quick else []), *(["--json", str(json_path)] if json_to == "file" else [])]

    return suite_benches.Bench(name=name, script=script, title=f"fake {name}", group_label="model", args=args,
                     json_to=json_to)  # fmt: skip


#: what a fake bench's rows look like: stock and patched of group "tiny", in the schema
ROWS = """
    def rows(stock, patched):
        common = {"group": "tiny", "unit": "img/s", "spread": []}
        return [
            {"bench": "fake", "variant": "stock", "rate": stock, "ratio_to_stock": 1.0, "stock": True, **common},
            {"bench": "fake", "variant": "patched", "rate": patched, "ratio_to_stock": patched / stock,
             "stock": False, **common},
        ]
"""

GOOD = (
    ROWS
    + """
    import json, sys
    print("warming up", file=sys.stderr)
    print(json.dumps({"rows": rows(10.0, 25.0), "argv": sys.argv[1:]}))
"""
)
BAD = """
    import sys
    print("step 1 fine", file=sys.stderr)
    print("something broke in the fake bench", file=sys.stderr)
    sys.exit(3)
"""
TO_FILE = (
    ROWS
    + """
    import json, sys
    path = sys.argv[sys.argv.index("--json") + 1]
    print("| a table for people |")
    with open(path, "w") as f:
        json.dump({"rows": rows(4.0, 6.0)}, f)
"""
)
NO_JSON = """
    print("a table, but no JSON")
"""
SLOW = """
    import time
    time.sleep(60)
"""


@pytest.fixture
def quick_facts(monkeypatch):
    monkeypatch.setattr(suite_runner, "machine_facts", fake_facts)  # where run() looks it up


def test_failing_bench_is_recorded_and_the_others_go_on(tmp_path, quick_facts, capsys):
    registry = {
        b.name: b
        for b in (
            fake_bench(tmp_path, "bad", BAD),
            fake_bench(tmp_path, "good", GOOD),
            fake_bench(tmp_path, "to_file", TO_FILE, json_to="file"),
            fake_bench(tmp_path, "no_json", NO_JSON),
            fake_bench(tmp_path, "missing", "", exists=False),
        )
    }
    out = tmp_path / "results"
    code = run.main(["--quick", "--out", str(out)], benches=registry)
    assert code == 1
    (path,) = out.glob("*.json")
    assert path.name.endswith("-testhost.json")
    results = json.loads(path.read_text())
    assert (
        results["complete"]
        and results["quick"]
        and results["command"].endswith("bench/run.py --quick --out " + str(out))
    )
    benches = results["benches"]
    assert list(benches) == ["bad", "good", "to_file", "no_json"]  # in order; bad did not stop the others

    bad = benches["bad"]
    assert bad["status"] == "failed" and bad["error"] == "exited with code 3" and bad["returncode"] == 3
    assert "something broke in the fake bench" in bad["log_tail"]
    assert "something broke" in (out / bad["log"]).read_text()

    good = benches["good"]
    assert good["status"] == "ok" and good["raw"]["argv"] == ["--quick"]
    assert [(r["variant"], r["ratio_to_stock"]) for r in good["rows"]] == [("stock", 1.0), ("patched", 2.5)]
    log = (out / good["log"]).read_text()
    assert "warming up" in log and '"rate": 25.0' in log  # stderr and stdout both kept

    assert benches["to_file"]["status"] == "ok" and benches["to_file"]["rows"][1]["rate"] == 6.0
    assert "| a table for people |" in (out / benches["to_file"]["log"]).read_text()

    assert benches["no_json"]["status"] == "failed" and "no JSON" in benches["no_json"]["error"]
    assert "a table, but no JSON" in benches["no_json"]["log_tail"]

    assert results["skipped"] == {
        "missing": f"not run: {suite_runner.display_path(tmp_path / 'missing.py')} does not exist"
    }
    assert [f["bench"] for f in results["failures"]] == ["bad", "no_json"]
    assert len(results["rows"]) == 4 and results["machine"]["hostname"] == "testhost"
    assert results["git"]["commit"] is None or len(results["git"]["commit"]) == 40

    md = path.with_suffix(".md").read_text()
    assert "**Failed**: exited with code 3" in md and "| tiny | img/s | 10.0 | 25.0 (2.50x) |" in md
    assert "failed: bad, no_json" in capsys.readouterr().err


def test_all_good_exits_zero_and_only_selects(tmp_path, quick_facts):
    registry = {b.name: b for b in (fake_bench(tmp_path, "bad", BAD), fake_bench(tmp_path, "good", GOOD))}
    out = tmp_path / "results"
    assert run.main(["--only", "good", "--out", str(out), "--readme"], benches=registry) == 0
    (path,) = out.glob("*.json")
    results = json.loads(path.read_text())
    assert list(results["benches"]) == ["good"] and results["benches"]["good"]["raw"]["argv"] == []
    assert not results["failures"]
    with pytest.raises(SystemExit) as exc:
        run.main(["--only", "good,nope", "--out", str(out)], benches=registry)
    assert exc.value.code == 2


def test_timeout_stops_the_bench(tmp_path, quick_facts):
    registry = {b.name: b for b in (fake_bench(tmp_path, "slow", SLOW), fake_bench(tmp_path, "good", GOOD))}
    out = tmp_path / "results"
    assert run.main(["--out", str(out), "--timeout", "1"], benches=registry) == 1
    (path,) = out.glob("*.json")
    benches = json.loads(path.read_text())["benches"]
    assert benches["slow"]["status"] == "failed" and benches["slow"]["error"].startswith("timed out after")
    assert benches["slow"]["seconds"] < 30
    assert benches["good"]["status"] == "ok"


def test_machine_facts_from_the_harness():
    facts = suite_runner.machine_facts()
    machine, versions = facts["machine"], facts["versions"]
    assert machine["cpu_model"] and machine["logical_cpus"] >= 1 and isinstance(machine["flags"], list)
    assert versions["torch"] and versions["nanopatch"] and "opencv-python" not in versions
    assert set(facts["git"]) >= {"commit", "dirty"}


# --- learning: a training variant that does not learn as stock gives no speed-up ------------------

PARAMS = ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]


def record(losses, grads=PARAMS):
    """A learning record as the benches' workers write it (nanopatch.learning.Step.as_dict)."""
    step = {"optimizer": "SGD", "grads": sorted(grads), "updated": sorted(grads), "zero": [], "nonfinite": []}
    return [{**step, "loss": loss} for loss in losses]


def judged_train_step_rows():
    """stock, a ``patched`` that learns as stock (2x faster), a ``compile`` whose steps reach the
    head alone (3x faster): judged by the harness as train_step judges its rows."""
    stock_record = record([6.9, 6.7, 6.4])
    table = [
        ("stock", 40.0, stock_record),
        ("patched", 80.0, record([6.9, 6.71, 6.42])),
        ("compile", 120.0, record([6.9, 6.85, 6.8], grads=PARAMS[2:])),
    ]
    rows = []
    for variant, rate, steps in table:
        r = h.row("train_step", "resnet18", variant, rate, "img/s", None, stock=variant == "stock", rates=[rate],
                  rounds=[0], status="ok")  # fmt: skip
        rows.append(h.learning_row(r, steps, stock_record, "stock"))
    h.ratios_to(rows, rows[0])
    return {"benchmark": "train_step", "rows": rows}


def test_a_variant_that_does_not_learn_keeps_no_rate():
    raw = judged_train_step_rows()
    stock, patched, broken = raw["rows"]
    assert stock["learning"]["verdict"] == "the reference" and stock["learning"]["learns"] is True
    assert patched["learning"]["learns"] is True and patched["ratio_to_stock"] == pytest.approx(2.0)
    assert patched["learning"]["loss"] == [6.9, 6.71, 6.42] and patched["learning"]["stock_grads"] == [4, 4, 4]
    # the verdict of nanopatch.learning.compare: the backbone never got a gradient
    assert broken["learning"]["learns"] is False and broken["learning"]["grads"] == [2, 2, 2]
    assert broken["note"].startswith("does not learn as stock: at step 1, 2 of 4 parameters")
    # no speed-up can be computed from what is left of its row
    assert broken["rate"] is None and broken["ratio_to_stock"] is None
    assert broken["rates"] == [] and broken["spread"] == [] and "ratio_per_round" not in broken
    kept = by_key(suite_benches.rows_of(suite_benches.BENCHES["train_step"], raw))
    assert kept[("resnet18", "compile")]["learning"]["learns"] is False
    assert kept[("resnet18", "compile")]["rate"] is None and kept[("resnet18", "compile")]["ratio_to_stock"] is None


def learning_results():
    raw = judged_train_step_rows()
    entry = {
        "status": "ok",
        "raw": raw,
        "rows": suite_benches.rows_of(suite_benches.BENCHES["train_step"], raw),
        "seconds": 10.0,
    }
    return {**sample_results(), "benches": {"train_step": entry}, "failures": [], "rows": entry["rows"]}


def test_markdown_says_does_not_learn_with_the_reason():
    text = report_markdown.markdown(learning_results(), suite_benches.BENCHES, {})
    lines = text.splitlines()
    assert "| resnet18 | img/s | 40.0 | 80.0 (2.00x) | **does not learn** |" in lines
    assert "3.00x" not in text and "120" not in text
    (verdict,) = [line for line in lines if line.startswith("- resnet18: `compile`")]
    assert "does not learn as stock: at step 1, 2 of 4 parameters that got a gradient in stock got none" in verdict
    assert "loss 6.9 6.85 6.8, grads 2/2/2 (stock: loss 6.9 6.7 6.4, grads 4/4/4)" in verdict
    assert any(line.startswith("- resnet18: `patched`: learns as stock (3 steps") for line in lines)


def test_readme_table_says_does_not_learn():
    lines = report_readme.readme_table(learning_results(), suite_benches.BENCHES).splitlines()
    assert "| train_step | resnet18 | 40.0 img/s | patched 2.00x, compile **does not learn** |" in lines
    assert any(line.startswith("**does not learn**: its first training steps from the seed") for line in lines)
    # a report from before the learning check (no verdict in its rows) renders as it did
    assert (
        "| train_step | resnet18 | 38.8 img/s | patched 1.52x, compile 1.82x\u2020 |"
        in report_readme.readme_table(sample_results(), suite_benches.BENCHES).splitlines()
    )


def test_chart_draws_no_speed_up_for_a_variant_that_does_not_learn():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = report_charts.chart_figure(learning_results(), "train_step", suite_benches.BENCHES["train_step"])
    try:
        bars, texts = chart_parts(fig)
    finally:
        plt.close(fig)
    assert bars == {"patched": [pytest.approx(2.0)]}  # compile: no bar, a cross and a legend entry
    assert "compile" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "2.00x" in texts and "does not learn" in texts and not any("3.00" in t for t in texts)
    assert any("does not learn: no speed-up drawn" in t for t in texts)


def test_a_benchs_own_comparisons_and_memory_are_in_the_report():
    """multi_instance's weak scaling, DataLoader cost and memory (its JSON's ``comparisons`` and
    ``memory``) reach run.py's Markdown, with the per-round range and the target's verdict."""
    raw = {
        "comparisons": [
            {
                "label": "weak scaling: x",
                "ratio": 0.87,
                "per_round": [0.86, 0.89],
                "target": 0.9,
                "meets_target": False,
            },
            {"label": "tuned vs untuned single process", "ratio": 1.0, "per_round": [0.94, 1.0]},
        ],
        "memory": [{"label": "one process", "mib": 1985.0, "against_mib": 2065.0, "ratio": 0.96, "within_limit": True}],
    }
    assert report_markdown.comparison_lines(raw) == [
        "",
        "- weak scaling: x: 0.87x (per round 0.86-0.89x); target >= 0.90: **not met**",
        "- tuned vs untuned single process: 1.00x (per round 0.94-1.00x)",
        "- memory, one process: 1985 MiB against 2065 (0.96x, within the limit)",
    ]
    assert report_markdown.comparison_lines({"rows": []}) == []
