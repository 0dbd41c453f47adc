"""bench/train_step.py runs end to end: quick mode, the hidden tiny model, one round of stock and
patched, and the JSON report holds what it should."""

from __future__ import annotations

import json

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
    assert machine["torch"] and machine["host_facts"]["model_name"] is not None
    assert isinstance(machine["host_facts"]["flags"], list)
    assert report["variant_options"] == {"stock": None, "by-hand": None, "patched": {}}

    model = report["models"]["tiny"]
    assert model["unit"] == "img/s" and model["shape"]["image_batch"] == 8
    assert [r["order"] for r in model["rounds"]] == [["stock", "by-hand", "patched"]]
    stock, patched = model["variants"]["stock"], model["variants"]["patched"]
    for row in (stock, patched):
        assert row["status"] == "ok", row.get("error")
        assert len(row["samples"]) == len(row["rates"]) == 1
        assert row["median"] > 0 and row["samples"][0]["elapsed_s"] > 0
        setup = row["setup"]
        assert setup["threads"] >= 1 and setup["torch"] and setup["samples_per_step"] == 8
        assert setup["observed"]["output_dtype"] == "float32"
    assert stock["setup"]["nanopatch_imported"] is False and "nanopatch" not in stock["setup"]
    assert patched["setup"]["nanopatch_imported"] is True
    assert patched["setup"]["nanopatch"]["patch_torch"] == {}
    assert stock["x_stock"] == 1.0
    assert patched["x_stock"] == patched["median"] / stock["median"]
    assert len(patched["x_stock_per_round"]) == 1
    assert patched["target_x_stock"] is None  # targets are for the real models only

    # by-hand: the script edited for bf16 autocast and channels-last, without nanopatch
    by_hand = model["variants"]["by-hand"]
    assert by_hand["status"] == "ok", by_hand.get("error")
    assert by_hand["setup"]["nanopatch_imported"] is False and "nanopatch" not in by_hand["setup"]
    seen = by_hand["setup"]["observed"]
    assert seen["compute_dtype"] == "bfloat16" and seen["conv_weight_channels_last"] is True
    assert seen["loss_dtype"] == "float32"  # cross-entropy runs in fp32 under CPU autocast
    assert stock["setup"]["observed"]["compute_dtype"] == "float32"
    assert stock["setup"]["observed"]["conv_weight_channels_last"] is False
