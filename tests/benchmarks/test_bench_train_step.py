"""bench/train_step.py runs end to end: quick mode, the hidden tiny model, one round of one step of
stock, by-hand, patched, the two Lightning variants and the hidden ``broken`` one (patched, its
first layer detached), profiled, and the JSON report holds what it should: every variant's learning
record judged against stock's, and no rate for the one that does not learn. One run serves every
test here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

import pytest

from nanopatch.engine import config

from conftest import REPO_ROOT, run_python

#: the Lightning variants run where Lightning is installed (the py and ipex envs; not turbojpeg2)
HAVE_LIGHTNING = importlib.util.find_spec("lightning") is not None
LIGHTNING = ["lightning-bf16", "lightning-bf16-patched"] if HAVE_LIGHTNING else []
VARIANTS = ["stock", "by-hand", "by-hand-tcmalloc", "patched", *LIGHTNING]
#: and a variant that does not learn as stock: patched, with its first layer's output detached
RUN = [*VARIANTS, "broken"]
needs_lightning = pytest.mark.skipif(not HAVE_LIGHTNING, reason="Lightning is not installed here")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path_factory.mktemp("train_step") / "train_step.json"
    script = str(REPO_ROOT / "bench" / "train_step.py")
    args = [script, "--quick", "--models", "tiny", "--variants", ",".join(RUN), "--rounds", "1"]
    proc = run_python([*args, "--profile", "1", "--json", str(out)], cwd=REPO_ROOT, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def kept(row: dict, key: str) -> bool:
    """Whether nanopatch kept what it measured (``key``: ``bf16_measured`` or
    ``channels_last_measured``) for the row's model: not measured (None) counts as kept."""
    [decision] = row["setup"]["nanopatch"][key]
    assert decision != "measuring", f"{key}: still measuring after the warm-up"
    return not (decision or "").startswith("off")


def test_quick_tiny_run_writes_json(tiny_run):
    proc, report = tiny_run
    assert all(f"| {v} |" in proc.stdout for v in VARIANTS), proc.stdout

    assert report["benchmark"] == "train_step" and report["quick"] and report["rounds"] == 1
    assert report["steps"] == 1 and report["profile_steps"] == 1
    machine = report["machine"]
    assert machine["torch"] and machine["model_name"] is not None and machine["git"]["commit"]
    assert isinstance(machine["flags"], list)
    lightning = {"lightning-bf16": None, "lightning-bf16-patched": {}} if HAVE_LIGHTNING else {}
    assert report["variant_options"] == {
        "stock": None,
        "by-hand": None,
        "by-hand-tcmalloc": None,
        "patched": {},
        **lightning,
        "broken": {},
    }

    model = report["models"]["tiny"]
    assert model["unit"] == "img/s" and model["shape"]["image_batch"] == 8
    assert [r["order"] for r in model["rounds"]] == [RUN]
    rows = {r["variant"]: r for r in report["rows"] if r["variant"] in VARIANTS}
    assert [r["variant"] for r in report["rows"]] == RUN
    stock, by_hand, patched = rows["stock"], rows["by-hand"], rows["patched"]
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
        assert row["bench"] == "train_step" and row["group"] == "tiny" and row["unit"] == "img/s"
        assert len(row["samples"]) == len(row["rates"]) == 1 and row["spread"] == [row["rate"], row["rate"]]
        assert row["rate"] > 0 and row["samples"][0]["elapsed_s"] > 0
        # the rest of the machine's CPU time during the sample, as a share of all CPUs
        assert 0 <= row["samples"][0]["other_load"] <= 1 and row["other_load"] == row["samples"][0]["other_load"]
        setup = row["setup"]
        assert setup["threads"] >= 1 and setup["torch"] and setup["samples_per_step"] == 8
        assert setup["observed"]["loss_dtype"] == "float32"  # cross-entropy runs in fp32 under CPU autocast
    # nanopatch casts the model's outputs back to fp32; by-hand autocast leaves them in bf16
    assert stock["setup"]["observed"]["output_dtype"] == patched["setup"]["observed"]["output_dtype"] == "float32"
    assert stock["stock"] and not patched["stock"] and stock["ratio_to_stock"] == 1.0
    assert patched["ratio_to_stock"] == patched["rate"] / stock["rate"]
    assert len(patched["ratio_per_round"]) == 1
    assert patched["target_x_stock"] is None  # targets are for the real models only

    # stock and by-hand never import nanopatch; patched does, with patch_torch()'s defaults
    assert stock["setup"]["nanopatch_imported"] is False and "nanopatch" not in stock["setup"]
    assert by_hand["setup"]["nanopatch_imported"] is False and "nanopatch" not in by_hand["setup"]
    assert patched["setup"]["nanopatch_imported"] is True
    assert patched["setup"]["nanopatch"]["patch_torch"] == {}

    # inside the model, in a training step: a forward hook on the first convolution saw what it
    # computed in and whether its input was channels-last
    probes = {v: r["setup"]["observed"]["probe"] for v, r in rows.items()}
    ipex = config.ipex_compatibility()[0]  # patch_torch()'s defaults turn IPEX on where it is usable
    for variant, probe in probes.items():
        layer = "0 (_IPEXConv2d)" if variant == "patched" and ipex else "0 (Conv2d)"
        if variant == "lightning-bf16-patched" and ipex:  # whether IPEX's conv replaced it depends on the Trainer
            layer = probe["layer"] if probe["layer"] in ("0 (Conv2d)", "0 (_IPEXConv2d)") else layer
        assert probe["layer"] == layer and probe["calls"] == 1 and probe["inputs_4d"] == 1, probe
    assert probes["stock"]["dtypes"] == {"float32": 1} and probes["stock"]["channels_last"] == 0
    # by-hand: the script edited for bf16 autocast and channels-last, without nanopatch
    assert probes["by-hand"]["dtypes"] == {"bfloat16": 1} and probes["by-hand"]["channels_last"] == 1
    # patched: the unedited script, and nanopatch made the same happen, where its first steps
    # measured bf16 and channels-last faster (the warm-up lasts until they are decided)
    bf16, layout = (kept(patched, key) for key in ("bf16_measured", "channels_last_measured"))
    assert probes["patched"]["dtypes"] == {"bfloat16" if bf16 else "float32": 1}
    assert probes["patched"]["channels_last"] == int(layout)
    for variant in ("by-hand", "patched"):
        seen = rows[variant]["setup"]["observed"]
        # IPEX's convolution holds its weight prepacked: no plain weight to read a layout from
        weights = None if variant == "patched" and ipex else (True if variant == "by-hand" else layout)
        dtype = "bfloat16" if variant == "by-hand" or bf16 else "float32"
        assert seen["compute_dtype"] == dtype and seen["conv_weight_channels_last"] is weights, seen
    assert rows["patched"]["setup"]["observed"]["ipex_imported"] is ipex
    assert stock["setup"]["observed"]["compute_dtype"] == "float32"
    assert stock["setup"]["observed"]["conv_weight_channels_last"] is False
    assert "inside bf16 / channels-last" in proc.stdout and "inside fp32 / contiguous" in proc.stdout


@needs_lightning
def test_lightning_variants(tiny_run):
    """lightning-bf16: Lightning's Trainer(precision="bf16-mixed") trained the same model, without
    nanopatch, and the probe saw bf16 inside it (NCHW: Lightning does not convert the layout);
    every request timed exactly the steps asked for, by Lightning's own count."""
    proc, report = tiny_run
    rows = {r["variant"]: r for r in report["rows"]}
    lightning, patched = rows["lightning-bf16"], rows["lightning-bf16-patched"]
    for row in (lightning, patched):
        assert row["status"] == "ok" and row["rate"] > 0 and row["ratio_to_stock"] > 0, row.get("error")
        setup = row["setup"]
        assert setup["lightning"]["precision"] == "bf16-mixed" and setup["lightning"]["version"]
        assert setup["lightning"]["strategy"] == "SingleDeviceStrategy"
        assert setup["observed"]["compute_dtype"] == "bfloat16"
        assert setup["observed"]["probe"]["dtypes"] == {"bfloat16": 1}, setup["observed"]["probe"]
        assert setup["observed"]["loss_dtype"] == "float32" and setup["samples_per_step"] == 8
        assert [s["optimizer_steps"] for s in row["samples"]] == [1]
        assert row["profile"]["steps"] == 1
    assert lightning["setup"]["nanopatch_imported"] is False and "nanopatch" not in lightning["setup"]
    assert lightning["setup"]["observed"]["probe"]["channels_last"] == 0
    assert patched["setup"]["nanopatch_imported"] is True
    assert patched["setup"]["nanopatch"]["patch_torch"] == {}
    # nanopatch's channels-last, under Lightning, where it measured faster
    assert patched["setup"]["observed"]["probe"]["channels_last"] == int(kept(patched, "channels_last_measured"))
    assert "Lightning" in proc.stdout and "inside bf16 / contiguous" in proc.stdout


def test_by_hand_with_tcmalloc_preloads_it(tiny_run):
    """by-hand-tcmalloc: the by-hand edit with tcmalloc preloaded, seen mapped in the worker;
    patched's row compares itself with it."""
    from nanopatch.runtime import tuning as runtime

    _, report = tiny_run
    rows = {r["variant"]: r for r in report["rows"]}
    row = rows["by-hand-tcmalloc"]
    if runtime.find_allocator("tcmalloc") is None:
        assert row["status"] == "skipped" and "tcmalloc" in row["note"]
        return
    assert row["status"] == "ok" and row["rate"] > 0, row.get("error")
    assert "tcmalloc" in row["setup"]["allocator"] and rows["by-hand"]["setup"]["allocator"] == "glibc"
    assert row["setup"]["observed"]["compute_dtype"] == "bfloat16" and row["setup"]["nanopatch_imported"] is False
    [bar] = [t for t in rows["patched"]["targets"] if t["against"] == "by-hand-tcmalloc"]
    assert bar["ratio"] == rows["patched"]["rate"] / row["rate"]


def test_ratio_to_by_hand_and_targets(tiny_run):
    proc, report = tiny_run
    rows = {r["variant"]: r for r in report["rows"] if r["variant"] in VARIANTS}
    by_hand = rows["by-hand"]
    assert by_hand["ratio_to_by_hand"] == 1.0
    for row in rows.values():
        assert row["ratio_to_by_hand"] == pytest.approx(row["rate"] / by_hand["rate"])
    assert "| x stock | per round | x by-hand |" in proc.stdout
    # targets are printed, never asserted: the tiny model has none against stock or by-hand, but every
    # variant nanopatch patched is held against lightning-bf16
    assert rows["stock"]["targets"] == rows["by-hand"]["targets"] == []
    if not HAVE_LIGHTNING:
        assert [t for t in rows["patched"]["targets"] if t["against"] != "by-hand-tcmalloc"] == []
    for variant in LIGHTNING and ("patched", "lightning-bf16-patched"):
        assert rows["lightning-bf16"]["targets"] == []
        (target,) = [t for t in rows[variant]["targets"] if t["against"] != "by-hand-tcmalloc"]
        assert target["against"] == "lightning-bf16" and target["min"] == 1.0
        assert target["ratio"] == pytest.approx(rows[variant]["rate"] / rows["lightning-bf16"]["rate"])
        assert target["met"] == (target["ratio"] >= 1.0)
    assert "Targets (from the issue; printed, never asserted)" in proc.stdout
    assert report["targets"]["x_by_hand"] == {"resnet18": 1.10, "resnet50": 1.10, "transformer": 1.25}


def test_profile(tiny_run):
    """--profile 1: every worker ran one more step under torch.profiler; the top ops by self CPU
    time and the dtype conversions came back, and the report prints a table per variant."""
    proc, report = tiny_run
    rows = {r["variant"]: r for r in report["rows"] if r["variant"] in VARIANTS}
    for variant, row in rows.items():
        profile = row["profile"]
        assert profile["steps"] == 1 and profile["step_ms"] > 0 and profile["self_ms"] > 0
        ops = profile["ops"]
        assert 0 < len(ops) <= 15 and [op["self_ms"] for op in ops] == sorted(
            (op["self_ms"] for op in ops), reverse=True
        )
        assert all(op["name"] and op["calls"] > 0 and 0 <= op["share"] for op in ops)
        # aten::convolution_backward, or torch_ipex::convolution_backward where IPEX is usable, or
        # aten::_slow_conv2d_backward (bf16 on a CPU without native bf16, where oneDNN has no kernel)
        assert any(op["name"].endswith(("::convolution_backward", "::_slow_conv2d_backward")) for op in ops), ops
        conversion = profile["conversion"]
        assert 0 <= conversion["ms"] <= conversion["copy_all"]["ms"]
        assert conversion["copy_unknown_dtypes"]["ms"] == 0  # every aten::copy_ had its dtypes recorded
        assert profile["faults_per_step"] >= 0  # the profiled steps' page faults, held against the timed ones'
        assert f"#### Profile: tiny, {variant}" in proc.stdout
    # autocast casts fp32 weights and activations to bf16: conversions that the fp32 step does not make
    for variant in ("by-hand", *LIGHTNING[:1]):
        pairs = rows[variant]["profile"]["conversion"]["copy_by_dtypes"]
        assert pairs.get("float32 -> bfloat16", {}).get("ms", 0) > 0, pairs
    assert "float32 -> bfloat16" not in rows["stock"]["profile"]["conversion"]["copy_by_dtypes"]


def load_bench():
    """bench/train_step.py, loaded as a module; it puts bench/ on sys.path, so its package imports."""
    spec = importlib.util.spec_from_file_location("nanopatch_bench_train_step", REPO_ROOT / "bench" / "train_step.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench


def test_the_roof_is_fp32s_on_a_cpu_without_native_bf16():
    """On an AMD EPYC before Zen 4 bf16 products are emulated (0.3 against fp32's 129 GFLOP/s):
    the roof a step is read against is the faster rate, and the line says which."""
    load_bench()
    from families.train_step import roof

    emulated = {"bfloat16": 3e8, "float32": 1.29e11}
    rows = roof.with_roof([{"rate": 500.0}, {"rate": None}], emulated, 1.5e8)
    assert rows[0]["roof_fraction"] == pytest.approx(500 * 1.5e8 / 1.29e11) and rows[1]["roof_fraction"] is None
    line = roof.roof_line(
        {"matmul_flops": emulated, "n": 2048, "measured_in": "stock", "flops_per_sample": 1.5e8}, "tokens/s"
    )
    assert "bf16 0.3 GFLOP/s, fp32 129 GFLOP/s" in line and "fraction of the faster rate, fp32" in line
    native = {"bfloat16": 2.4e12, "float32": 3.9e11}
    assert roof.with_roof([{"rate": 500.0}], native, 1.5e8)[0]["roof_fraction"] == pytest.approx(500 * 1.5e8 / 2.4e12)


def test_probe_sees_a_layer_the_transformer_calls():
    """The probe hooks the first convolution or linear layer that the forward really calls: in the
    transformer LM not the attention's out_proj (its weight is used without calling it), so the
    table says what the step ran rather than "not probed"."""
    import torch

    load_bench()
    from families.train_step import inside, models

    model = models.transformer_lm(8)
    probe = inside.attach_probe(model)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randint(0, models.VOCAB, (2, 8))).float().sum().backward()
    finally:
        probe.detach()
    found = inside.probe_result(probe)
    assert found["layer"] == "encoder.layers.0.linear1 (Linear)" and found["calls"] == 1, found
    assert found["dtypes"] == {"bfloat16": 1} and found["inputs_4d"] == 0


def test_every_variant_is_judged_against_stock(tiny_run):
    """Each worker recorded its first steps from the seed (quick: 3) with nanopatch.learning's
    Recorder, and the parent judged them against stock's with nanopatch.learning.compare: every
    variant but ``broken`` learns as stock and has its rate and ratio."""
    proc, report = tiny_run
    assert report["learning_steps"] == 3
    rows = {r["variant"]: r for r in report["rows"]}
    stock = rows["stock"]["learning"]
    assert stock["verdict"] == "the reference" and stock["learns"] is True and stock["steps"] == 3
    assert stock["grads"] == [8, 8, 8] and all(loss > 0 for loss in stock["loss"])  # the tiny CNN's 8 parameters
    for variant in VARIANTS[1:]:
        row, entry = rows[variant], rows[variant]["learning"]
        if row["status"] == "skipped":
            continue
        assert entry["learns"] is True, (variant, entry["verdict"])
        assert entry["against"] == "stock" and entry["grads"] == [8, 8, 8] and entry["stock_loss"] == stock["loss"]
        assert entry["verdict"].startswith("learns as stock (3 steps")
        assert row["rate"] > 0 and row["ratio_to_stock"] == pytest.approx(row["rate"] / rows["stock"]["rate"])
        assert f"- `{variant}`: learns as stock (3 steps" in proc.stdout


def test_a_variant_that_does_not_learn_gets_no_rate(tiny_run):
    """``broken`` ran and was timed, but its first layer got no gradient: it is printed "does not
    learn" with the verdict's reason, and its row keeps nothing a speed-up could be computed from."""
    proc, report = tiny_run
    row = next(r for r in report["rows"] if r["variant"] == "broken")
    entry = row["learning"]
    assert row["status"] == "does not learn" and entry["learns"] is False and entry["grads"] == [7, 7, 7]
    assert entry["verdict"].startswith("does not learn as stock: at step 1, 1 of 8 parameters that got a gradient")
    assert "(0.weight)" in entry["verdict"] and row["note"] == entry["verdict"]
    assert row["rate"] is None and row["ratio_to_stock"] is None and row["ratio_to_by_hand"] is None
    assert row["rates"] == [] and row["spread"] == [] and row["targets"] == []
    assert not {"samples", "profile", "step_s", "ratio_per_round", "first_step_s"} & set(row)
    assert not {"learning_step_s", "warmup_step_s"} & set(row["setup"])
    assert row["setup"]["nanopatch"]["patch_torch"] == {}  # what it ran stays
    line = next(line for line in proc.stdout.splitlines() if line.startswith("| broken |"))
    assert line.startswith("| broken | does not learn |  |") and "x" not in line.split("|")[6]
    assert "- `broken`: does not learn as stock: at step 1" in proc.stdout


def test_the_report_renders_does_not_learn(tiny_run):
    """bench/run.py's Markdown, README table and chart of this run: the variants that learn with
    their ratio, ``broken`` as "does not learn" with no ratio and no bar."""
    import dataclasses

    from helpers.bench_reports import (
        chart_parts,
        fake_facts,
        report_charts,
        report_markdown,
        report_readme,
        suite_benches,
    )

    _, report = tiny_run
    every_variant = {"train_step": dataclasses.replace(suite_benches.BENCHES["train_step"], readme=None)}
    rows = suite_benches.rows_of(every_variant["train_step"], report)
    results = {
        **fake_facts(),
        "command": "python bench/run.py --quick",
        "quick": True,
        "started": "2026-11-25T00:00:00+00:00",
        "benches": {"train_step": {"status": "ok", "rows": rows, "seconds": 1.0}},
    }
    stock = next(r for r in rows if r["variant"] == "stock")
    patched = next(r for r in rows if r["variant"] == "patched")
    md = report_markdown.markdown(results, every_variant, {}).splitlines()
    (line,) = [line for line in md if line.startswith("| tiny | img/s |")]
    assert line.endswith("| **does not learn** |") and f"({patched['ratio_to_stock']:.2f}x, " in line
    assert any(x.startswith("- tiny: `broken`: does not learn as stock: at step 1") for x in md)
    readme = report_readme.readme_table(results, every_variant).splitlines()
    (line,) = [line for line in readme if line.startswith("| train_step | tiny |")]
    assert "broken **does not learn**" in line and f"patched {patched['ratio_to_stock']:.2f}x" in line
    assert line.startswith(f"| train_step | tiny | {report_markdown.fmt_rate(stock['rate'])} img/s |")
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = report_charts.chart_figure(results, "train_step", every_variant["train_step"])
    bars, texts = chart_parts(fig)
    plt.close(fig)
    assert "broken" not in bars and len(bars["patched"]) == 1 and "does not learn" in texts


def test_the_roof_and_each_rows_fraction_of_it(tiny_run):
    """The run measures this machine's matmul rates and the model's FLOPs per sample (in stock's
    worker, the first one started), and every row with a rate reads its model FLOP/s against the
    faster of the bf16 and fp32 rates."""
    proc, report = tiny_run
    roof = report["models"]["tiny"]["roof"]
    assert roof["measured_in"] == "stock" and roof["n"] == 2048
    # bf16 on a CPU without native bf16 (an AMD EPYC before Zen 4): emulated, well under 1 GFLOP/s
    assert roof["matmul_flops"]["bfloat16"] > 0 and roof["matmul_flops"]["float32"] > 1e9
    # the tiny CNN at 112 px: forward, and backward's input and weight gradients (the first
    # convolution's input needs none)
    first, second, linear = (2 * 16 * 3 * 9 * 56 * 56, 2 * 32 * 16 * 9 * 28 * 28, 2 * 32 * 1000)
    assert roof["flops_per_sample"] == pytest.approx(2 * first + 3 * second + 3 * linear, rel=0.01)
    for row in report["rows"]:
        if row.get("rate") is None:
            assert row["roof_fraction"] is None
            continue
        assert row["model_flops"] == pytest.approx(row["rate"] * roof["flops_per_sample"])
        assert row["roof_fraction"] == pytest.approx(row["model_flops"] / max(roof["matmul_flops"].values()))
    assert "Roof: this machine's 2048x2048 matrix product, bf16 " in proc.stdout
    assert "| model GFLOP/s | of roof |" in proc.stdout


def test_a_profile_that_page_faulted_more_than_the_timed_steps_says_so():
    """A profiled step that page-faults far more often than a timed one (the profiler's records
    moving the step's tensors onto new pages) gets a warning above its table; one that faults as
    the timed steps do, a report from before the count, or too few faults to matter, none."""
    load_bench()
    from families.train_step import summary

    row = {"samples": [{"faults": 0}, {"faults": 30}]}  # 2 samples of 3 steps: 5 a step
    warning = summary.page_faults_inflate({"faults_per_step": 11268.5}, row, 3)
    assert warning and "11,268 times a step against 5" in warning and "inflated" in warning
    assert summary.page_faults_inflate({"faults_per_step": 6.0}, row, 3) is None
    assert summary.page_faults_inflate({}, row, 3) is None  # an older report
    faulting = {"samples": [{"faults": 339885}]}  # stock's steps fault in every step: 113,295 a step
    assert summary.page_faults_inflate({"faults_per_step": 150000.0}, faulting, 3) is None
    assert summary.page_faults_inflate({"faults_per_step": 242700.5}, faulting, 3)


SETTLED = """
import resource, sys
import torch
sys.path.insert(0, "bench")
from nanopatch.runtime import malloc
from families.train_step import profiling

done, why = malloc.keep_freed_memory()  # glibc's malloc as nanopatch tunes it in a patched process
if not done:
    print("untuned", why)
    raise SystemExit(0)
if sys.argv[1] == "settle":
    assert profiling.settle_heap(256 << 20) == 256 << 20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = torch.ones(32 << 18)  # 32 MiB, every page written
print("faults", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("settle", [True, False])
def test_settling_the_heap_gives_a_later_block_touched_pages(settle):
    """Under glibc's malloc as nanopatch tunes it (nothing mapped, nothing trimmed), a 32 MiB
    block made after profiling.settle_heap lands on pages already touched: no page faults; made
    without it, it grows the heap and faults once a page (the profiled steps' case)."""
    proc = run_python(["-c", SETTLED, "settle" if settle else "plain"], cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.startswith("untuned"):
        pytest.skip(proc.stdout.strip())
    faults = int(proc.stdout.split()[-1])
    assert faults < 500 if settle else faults > 4000, proc.stdout


def test_until_makes_only_what_fits_and_says_what_it_left_out(tmp_path):
    """--until already past: the first model's first variant is still set up and run once (a
    report with a rate), everything else is left out and named: the other variant never started,
    round 2, the roof, the profile and the second model."""
    import time

    out = tmp_path / "until.json"
    args = [str(REPO_ROOT / "bench" / "train_step.py"), "--quick", "--models", "tiny,resnet18"]
    args += ["--variants", "stock,patched", "--rounds", "2", "--profile", "1", "--until", f"{time.time():.0f}"]
    proc = run_python([*args, "--json", str(out)], cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(r["group"], r["variant"]): r for r in report["rows"]}
    assert rows["tiny", "stock"]["rate"] is not None and len(rows["tiny", "stock"]["rates"]) == 1
    assert rows["tiny", "stock"]["profile"] == {"error": h_not_run()}
    for key in (("tiny", "patched"), ("resnet18", "stock"), ("resnet18", "patched")):
        assert rows[key]["rate"] is None and rows[key]["status"] == "not run" and rows[key]["note"] == h_not_run()
    assert report["models"]["tiny"]["rounds"][1]["skipped"] == ["stock"]
    assert report["models"]["tiny"]["roof"]["matmul_flops"] is None
    assert "- the time budget (--until) left out round 2: `stock`" in proc.stdout
    assert "| patched | not run |" in proc.stdout


def h_not_run() -> str:
    load_bench()
    import harness

    return harness.NOT_RUN
