"""bench/working_weights.py runs end to end on the hidden tiny model and reports both variants,
the working-weights one with bf16 copies of the model's weights."""

from __future__ import annotations

import json

from conftest import REPO_ROOT, run_python


def test_quick_tiny_run_reports_both_variants(tmp_path):
    out = tmp_path / "ww.json"
    script = str(REPO_ROOT / "bench" / "working_weights.py")
    args = [script, "--quick", "--models", "tiny", "--rounds", "2", "--steps", "1", "--warmup", "1"]
    proc = run_python([*args, "--json", str(out)], cwd=REPO_ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"autocast", "working-weights"}
    assert rows["autocast"]["ratio_to_stock"] == 1.0 and rows["autocast"]["weights_in_bf16"] == 0
    # the tiny CNN's two convolutions and its linear layer get bf16 copies
    assert rows["working-weights"]["weights_in_bf16"] == 3
    assert all(r["rate"] > 0 and len(r["rates"]) == 2 for r in rows.values())
    assert "| working-weights |" in proc.stdout
