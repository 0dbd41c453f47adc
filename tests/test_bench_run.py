"""bench/run.py without running a real benchmark: the adapters on samples of each bench's JSON
(from real --quick runs, trimmed), the Markdown and README tables, the charts, and a run of tiny
fake benches (one failing, one too slow, one missing) through an injected registry."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT


def load_bench_run():
    path = REPO_ROOT / "bench" / "run.py"
    spec = importlib.util.spec_from_file_location("nanopatch_bench_run", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


run = load_bench_run()

# --- samples of each bench's JSON (real --quick runs on the 2-core EPYC, trimmed) ---------------

DECODE = {
    "machine": {"cpu": "AMD EPYC", "cpus_available": 2, "torch": "2.13.0+cu130", "nanopatch": "0.1.0"},
    "processes": 3,
    "rounds_per_process": 2,
    "results": [
        {
            "variant": "stock loader",
            "size": "500x375",
            "img_per_s": 972.289,
            "x_stock": 1.0,
            "cpu_share": 0.99,
            "iqr_pct": 5.1,
        },
        {
            "variant": "nanopatch loader",
            "size": "500x375",
            "img_per_s": 1121.944,
            "x_stock": 1.153920,
            "cpu_share": 0.99,
            "iqr_pct": 4.0,
        },
        {
            "variant": "PyTurboJPEG decode",
            "size": "500x375",
            "img_per_s": 1332.414,
            "x_stock": 1.370389,
            "cpu_share": 0.99,
        },
        {
            "variant": "nanopatch DCT-scaled (min 224)",
            "size": "500x375",
            "img_per_s": 1208.200,
            "x_stock": 1.242635,
            "cpu_share": 0.99,
        },
        {"variant": "stock loader", "size": "2400x1800", "img_per_s": 50.8527, "x_stock": 1.0, "cpu_share": 0.99},
        {
            "variant": "nanopatch loader",
            "size": "2400x1800",
            "img_per_s": 59.6108,
            "x_stock": 1.172226,
            "cpu_share": 0.99,
        },
        {
            "variant": "PyTurboJPEG decode",
            "size": "2400x1800",
            "img_per_s": 67.5889,
            "x_stock": 1.329112,
            "cpu_share": 0.99,
        },
        {
            "variant": "nanopatch DCT-scaled (min 224)",
            "size": "2400x1800",
            "img_per_s": 102.8446,
            "x_stock": 2.022402,
            "cpu_share": 0.99,
        },
    ],
    "seconds": 44.1,
}

TRANSFORMS = {
    "machine": {"cpu": "AMD EPYC", "cpus_available": 2},
    "clock": "wall",
    "notes": [],
    "results": [
        {"pipeline": "train", "size": "500x375", "variant": "stock", "clock": "wall", "rate": 398.9308, "x_stock": 1.0,
         "cpu_share": 0.76},
        {"pipeline": "train", "size": "500x375", "variant": "nanopatch", "clock": "wall", "rate": 515.6146,
         "x_stock": 1.292491},
        {"pipeline": "train", "size": "500x375", "variant": "nanopatch fast decode", "clock": "wall",
         "rate": 547.2045, "x_stock": 1.371678},
        {"pipeline": "train", "size": "500x375", "variant": "albumentations", "clock": "wall", "rate": 777.9492,
         "x_stock": 1.950086},
        {"pipeline": "val", "size": "2400x1800", "variant": "stock", "clock": "wall", "rate": 23.98826, "x_stock": 1.0},
        {"pipeline": "val", "size": "2400x1800", "variant": "nanopatch", "clock": "wall", "rate": 48.84289,
         "x_stock": 2.036117},
        {"pipeline": "val", "size": "2400x1800", "variant": "nanopatch fast decode", "clock": "wall",
         "rate": 67.5739, "x_stock": 2.816958},
        {"pipeline": "val", "size": "2400x1800", "variant": "albumentations", "clock": "wall", "rate": 52.16633,
         "x_stock": 2.174661},
    ],
}  # fmt: skip

IPEX_SKIPPED = (
    "skipped: /work/venv/bin/python: intel-extension-for-pytorch is not installed; give an interpreter that has "
    "it with --ipex-python PATH"
)

TRAIN_STEP = {
    "benchmark": "train_step",
    "quick": True,
    "rounds": 3,
    "machine": {"cpu": "AMD EPYC", "torch": "2.13.0"},
    "models": {
        "resnet18": {
            "unit": "img/s",
            "variants": {
                "stock": {
                    "status": "ok",
                    "median": 38.83405,
                    "x_stock": 1.0,
                    "cpu_share": 0.98,
                    "target_x_stock": None,
                },
                "patched": {"status": "ok", "median": 58.90236, "x_stock": 1.516771, "target_x_stock": 2.5},
                "compile": {
                    "status": "ok",
                    "median": 70.64674,
                    "x_stock": 1.819196,
                    "cpu_share": 0.51,
                    "compile_s": 5.8,
                },
                "ipex": {"status": "skipped", "error": IPEX_SKIPPED, "samples": [], "target_x_stock": None},
            },
        },
        "transformer": {
            "unit": "tokens/s",
            "variants": {
                "stock": {"status": "ok", "median": 1650.2, "x_stock": 1.0},
                "patched": {"status": "failed", "error": "worker exited with code -9 (killed)\n", "samples": []},
            },
        },
    },
    "notes": [],
}

IMPORT_COST = {
    "rounds": 3,
    "median_s": {"import torch": 2.674474, "import torch, nanopatch": 2.519149, "... + patch_torch()": 2.504686},
    "samples_s": {"import torch": [2.674474, 2.662333, 2.697959]},
}

MULTI_INSTANCE = {
    "machine": {"cpu": "AMD EPYC"},
    "rows": [
        {"group": "resnet18", "variant": "stock, 1 process", "rate": 14.2, "unit": "img/s", "ratio": None,
         "baseline": "stock, 1 process"},
        {"group": "resnet18", "variant": "nanopatch, 2 instances", "rate": 35.5, "unit": "img/s", "ratio": 2.5,
         "baseline": "stock, 1 process"},
    ],
}  # fmt: skip

ROW_KEYS = {"bench", "group", "variant", "rate", "unit", "ratio_to_stock", "stock"}
MEASURED_KEYS = ROW_KEYS | {"cpu_share"}


def by_key(rows):
    return {(r["group"], r["variant"]): r for r in rows}


def test_adapt_decode():
    rows = run.adapt_decode(DECODE)
    assert len(rows) == 8 and all(set(r) == MEASURED_KEYS for r in rows)
    assert {r["bench"] for r in rows} == {"decode"} and {r["unit"] for r in rows} == {"img/s"}
    cells = by_key(rows)
    stock = cells[("500x375", "stock loader")]
    assert stock["stock"] and stock["ratio_to_stock"] == 1.0 and stock["rate"] == pytest.approx(972.289)
    loader = cells[("2400x1800", "nanopatch loader")]
    assert not loader["stock"] and loader["ratio_to_stock"] == pytest.approx(1.172226)
    assert [r["group"] for r in rows if r["stock"]] == ["500x375", "2400x1800"]


def test_adapt_transforms():
    rows = run.adapt_transforms(TRANSFORMS)
    assert len(rows) == 8 and all(set(r) in (ROW_KEYS, MEASURED_KEYS) for r in rows)
    cells = by_key(rows)
    assert cells[("train 500x375", "stock")]["cpu_share"] == 0.76 and run.suspect(cells[("train 500x375", "stock")])
    assert cells[("train 500x375", "stock")]["stock"] and cells[("train 500x375", "stock")]["ratio_to_stock"] == 1.0
    fast = cells[("val 2400x1800", "nanopatch fast decode")]
    assert fast["rate"] == pytest.approx(67.5739) and fast["ratio_to_stock"] == pytest.approx(2.816958)
    assert fast["unit"] == "img/s"
    cpu_clock = {**TRANSFORMS, "results": [{**r, "clock": "cpu"} for r in TRANSFORMS["results"]]}
    assert {r["unit"] for r in run.adapt_transforms(cpu_clock)} == {"img/CPU-s"}


def test_adapt_train_step():
    rows = run.adapt_train_step(TRAIN_STEP)
    cells = by_key(rows)
    assert len(rows) == 6
    assert cells[("resnet18", "stock")]["stock"] and cells[("resnet18", "stock")]["ratio_to_stock"] == 1.0
    assert cells[("resnet18", "patched")]["ratio_to_stock"] == pytest.approx(1.516771)
    assert cells[("resnet18", "compile")]["rate"] == pytest.approx(70.64674)
    assert run.suspect(cells[("resnet18", "compile")]) and not run.suspect(cells[("resnet18", "stock")])
    ipex = cells[("resnet18", "ipex")]
    assert ipex["rate"] is None and ipex["ratio_to_stock"] is None and not ipex["stock"]
    assert ipex["note"].startswith("skipped: ") and "--ipex-python" in ipex["note"]
    assert cells[("transformer", "stock")]["unit"] == "tokens/s"
    failed = cells[("transformer", "patched")]
    assert failed["rate"] is None and failed["note"] == "worker exited with code -9 (killed)"


def test_adapt_import_cost():
    rows = run.adapt_import_cost(IMPORT_COST)
    assert [r["variant"] for r in rows] == [
        "import torch",
        "import torch, nanopatch",
        "import torch, nanopatch + patch_torch()",
    ]
    assert all(set(r) == ROW_KEYS and r["group"] == "start-up" and r["unit"] == "ms" for r in rows)
    stock, imported, patched = rows
    assert stock["stock"] and stock["ratio_to_stock"] == 1.0 and stock["rate"] == pytest.approx(2674.474)
    # a speed-up like every other ratio: stock's time over the variant's
    assert imported["ratio_to_stock"] == pytest.approx(2.674474 / 2.519149)
    assert patched["rate"] == pytest.approx(2504.686)


def test_adapt_import_cost_flags_noise():
    noisy = {**IMPORT_COST, "samples_s": {"import torch": [4.287, 2.260, 2.270, 3.972, 4.950]}}
    stock, imported, _ = run.adapt_import_cost(noisy)
    assert run.suspect(stock) and stock["note"].startswith("\u2020 samples 2260-4950 ms over 5 rounds")
    assert not run.suspect(imported) and "note" not in imported


def test_adapt_multi_instance():
    rows = run.adapt_multi_instance(MULTI_INSTANCE)
    base, multi = rows
    assert base["stock"] and base["ratio_to_stock"] == 1.0 and base["variant"] == "stock, 1 process"
    assert not multi["stock"] and multi["ratio_to_stock"] == 2.5 and multi["rate"] == 35.5
    assert base["bench"] == "multi_instance" and base["group"] == "resnet18" and base["unit"] == "img/s"


def test_bench_command_lines(tmp_path):
    quick, full = run.Options(quick=True), run.Options(ipex_python="/opt/ipex/bin/python")
    out = tmp_path / "out.json"
    benches = run.BENCHES
    assert benches["decode"].args(quick, out) == ["--quick", "--json"]
    assert benches["transforms"].args(full, out) == ["--json"]
    assert benches["import_cost"].args(quick, out) == ["--rounds", str(run.IMPORT_COST_QUICK_ROUNDS), "--json"]
    assert benches["import_cost"].args(full, out) == ["--json"]
    assert benches["train_step"].args(quick, out) == ["--quick", "--json", str(out)]
    assert benches["train_step"].args(full, out) == ["--ipex-python", "/opt/ipex/bin/python", "--json", str(out)]
    assert benches["multi_instance"].args(quick, out) == ["--quick", "--json", str(out)]
    for name in ("decode", "transforms", "train_step", "import_cost"):
        assert benches[name].script.exists(), name


def test_parse_json_output_skips_lines_before_it():
    assert run.parse_json_output('{"a": 1}\n') == {"a": 1}
    assert run.parse_json_output('a note\n{"a": [1,\n 2]}\n') == {"a": [1, 2]}
    with pytest.raises(ValueError):
        run.parse_json_output("Traceback (most recent call last):\n  oops")


# --- reports --------------------------------------------------------------------------------


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
        "nanopatch_info": None,
    }


def sample_results():
    benches = {}
    for name, raw in (("decode", DECODE), ("transforms", TRANSFORMS), ("train_step", TRAIN_STEP)):
        benches[name] = {"status": "ok", "raw": raw, "rows": run.BENCHES[name].adapt(raw), "seconds": 45.0}
    benches["import_cost"] = {
        "status": "failed",
        "error": "exited with code 1",
        "log": "2026-11-22-testhost-import_cost.log",
        "log_tail": "Traceback (most recent call last):\nRuntimeError: boom",
        "seconds": 3.0,
    }
    return {
        "schema": run.SCHEMA,
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


def test_markdown_tables():
    text = run.markdown(sample_results(), run.BENCHES, {"decode": "x-decode.png"})
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
    text = run.readme_table(sample_results(), run.BENCHES)
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
    raw = IMPORT_COST
    results = {**sample_results(), "benches": {"import_cost": {"status": "ok", "rows": run.adapt_import_cost(raw)}}}
    lines = run.readme_table(results, run.BENCHES).splitlines()
    assert (
        "| import_cost | start-up | 2674 ms | import nanopatch -155 ms (1.06x), + patch_torch() -170 ms (1.07x) |"
        in (lines)
    )


def test_render_writes_charts(tmp_path):
    pytest.importorskip("matplotlib")
    results = sample_results()
    path = tmp_path / "2026-11-22-testhost.json"
    path.write_text(json.dumps(results))
    written = run.render(results, path, run.BENCHES)
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


def test_render_normalises_the_raw_json_again(tmp_path):
    stale = sample_results()
    stale["benches"]["decode"]["rows"] = stale["benches"]["decode"]["rows"][:1]  # as an older adapter left it
    stale["rows"] = []
    path = tmp_path / "2026-11-22-testhost.json"
    path.write_text(json.dumps(stale))
    assert run.main(["--render", str(path)]) == 0
    again = json.loads(path.read_text())
    assert again == {**sample_results(), "rows": again["rows"]} and len(again["benches"]["decode"]["rows"]) == 8
    assert len(again["rows"]) == 8 + 8 + 6
    assert "| 2400x1800 | img/s | 50.9 |" in (tmp_path / "2026-11-22-testhost.md").read_text()


def test_results_stem_never_overwrites(tmp_path):
    import datetime as dt

    when = dt.datetime(2026, 11, 22, 9, 0)
    assert run.results_stem(tmp_path, when, "my host/1") == "2026-11-22-my-host-1"
    (tmp_path / "2026-11-22-my-host-1.json").write_text("{}")
    assert run.results_stem(tmp_path, when, "my host/1") == "2026-11-22-my-host-1-2"


# --- a run of fake benches --------------------------------------------------------------------


def fake_bench(tmp_path: Path, name: str, code: str, *, json_to: str = "stdout", exists: bool = True):
    script = tmp_path / f"{name}.py"
    if exists:
        script.write_text(textwrap.dedent(code))

    def args(options, json_path):
        return [*(["--quick"] if options.quick else []), *(["--json", str(json_path)] if json_to == "file" else [])]

    def adapt(raw):
        return [
            run.row(name, "tiny", "stock", raw["stock"], "img/s", None, stock=True),
            run.row(name, "tiny", "patched", raw["patched"], "img/s", raw["patched"] / raw["stock"]),
        ]

    return run.Bench(name=name, script=script, title=f"fake {name}", group_label="model", args=args, adapt=adapt,
                     json_to=json_to)  # fmt: skip


GOOD = """
    import json, sys
    print("warming up", file=sys.stderr)
    print(json.dumps({"stock": 10.0, "patched": 25.0, "argv": sys.argv[1:]}))
"""
BAD = """
    import sys
    print("step 1 fine", file=sys.stderr)
    print("something broke in the fake bench", file=sys.stderr)
    sys.exit(3)
"""
TO_FILE = """
    import json, sys
    path = sys.argv[sys.argv.index("--json") + 1]
    print("| a table for people |")
    with open(path, "w") as f:
        json.dump({"stock": 4.0, "patched": 6.0}, f)
"""
NO_JSON = """
    print("a table, but no JSON")
"""
SLOW = """
    import time
    time.sleep(60)
"""


@pytest.fixture
def quick_facts(monkeypatch):
    monkeypatch.setattr(run, "machine_facts", lambda env=None: fake_facts())


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
    assert "warming up" in log and '"patched": 25.0' in log  # stderr and stdout both kept

    assert benches["to_file"]["status"] == "ok" and benches["to_file"]["rows"][1]["rate"] == 6.0
    assert "| a table for people |" in (out / benches["to_file"]["log"]).read_text()

    assert benches["no_json"]["status"] == "failed" and "no JSON" in benches["no_json"]["error"]
    assert "a table, but no JSON" in benches["no_json"]["log_tail"]

    assert results["skipped"] == {"missing": f"not run: {run.display_path(tmp_path / 'missing.py')} does not exist"}
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
