"""bench/train_step.py runs end to end: quick mode, the hidden tiny model, one round of stock and
patched, and the JSON report holds what it should."""

from __future__ import annotations

import json

from nanopatch import config

from conftest import REPO_ROOT, run_python


def test_quick_tiny_run_writes_json(tmp_path):
    out = tmp_path / "train_step.json"
    script = str(REPO_ROOT / "bench" / "train_step.py")
    args = [
        script,
        "--quick",
        "--models",
        "tiny",
        "--variants",
        "stock,by-hand,patched",
        "--rounds",
        "1",
        "--json",
        str(out),
    ]
    proc = run_python(args, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(f"| {v} |" in proc.stdout for v in ("stock", "by-hand", "patched")), proc.stdout

    report = json.loads(out.read_text())
    assert report["benchmark"] == "train_step" and report["quick"] and report["rounds"] == 1
    machine = report["machine"]
    assert machine["torch"] and machine["model_name"] is not None and machine["git"]["commit"]
    assert isinstance(machine["flags"], list)
    assert report["variant_options"] == {"stock": None, "by-hand": None, "patched": {}}

    model = report["models"]["tiny"]
    assert model["unit"] == "img/s" and model["shape"]["image_batch"] == 8
    assert [r["order"] for r in model["rounds"]] == [["stock", "by-hand", "patched"]]
    rows = {r["variant"]: r for r in report["rows"]}
    assert list(rows) == ["stock", "by-hand", "patched"]
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
        assert probe["layer"] == layer and probe["calls"] == 1 and probe["inputs_4d"] == 1, probe
    assert probes["stock"]["dtypes"] == {"float32": 1} and probes["stock"]["channels_last"] == 0
    # by-hand: the script edited for bf16 autocast and channels-last, without nanopatch
    assert probes["by-hand"]["dtypes"] == {"bfloat16": 1} and probes["by-hand"]["channels_last"] == 1
    # patched: the unedited script, and nanopatch made the same happen
    assert probes["patched"]["dtypes"] == {"bfloat16": 1} and probes["patched"]["channels_last"] == 1
    for variant in ("by-hand", "patched"):
        seen = rows[variant]["setup"]["observed"]
        # IPEX's convolution holds its weight prepacked: no plain weight to read a layout from
        layout = None if variant == "patched" and ipex else True
        assert seen["compute_dtype"] == "bfloat16" and seen["conv_weight_channels_last"] is layout, seen
    assert rows["patched"]["setup"]["observed"]["ipex_imported"] is ipex
    assert stock["setup"]["observed"]["compute_dtype"] == "float32"
    assert stock["setup"]["observed"]["conv_weight_channels_last"] is False
    assert "inside bf16 / channels-last" in proc.stdout and "inside fp32 / contiguous" in proc.stdout
