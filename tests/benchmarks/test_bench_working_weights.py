"""bench/working_weights.py runs end to end on the hidden tiny model and reports both variants,
the working-weights one with bf16 copies of the model's weights, and its first steps judged
against autocast's (nanopatch.learning): it learns as autocast does, so it keeps its ratio."""

from __future__ import annotations

import json

from conftest import REPO_ROOT, run_python


def test_quick_tiny_run_reports_both_variants(tmp_path):
    out = tmp_path / "ww.json"
    script = str(REPO_ROOT / "bench" / "working_weights.py")
    args = [script, "--quick", "--models", "tiny", "--rounds", "2", "--steps", "1", "--warmup", "1"]
    proc = run_python([*args, "--json", str(out)], cwd=REPO_ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert set(rows) == {"autocast", "working-weights"}
    assert rows["autocast"]["ratio_to_stock"] == 1.0 and rows["autocast"]["weights_in_bf16"] == 0
    # the tiny CNN's two convolutions and its linear layer get bf16 copies
    assert rows["working-weights"]["weights_in_bf16"] == 3
    assert all(r["rate"] > 0 and len(r["rates"]) == 2 for r in rows.values())
    assert "| working-weights |" in proc.stdout
    # nanopatch's fast dropout mask kernel, registered as patch_torch() registers it
    assert report["fast_dropout"] is True and report["learning_steps"] == 3

    # the learning check: the first 3 steps from the seed, working weights against autocast
    reference, judged = rows["autocast"]["learning"], rows["working-weights"]["learning"]
    assert reference["verdict"] == "the reference" and reference["grads"] == [8, 8, 8]
    assert judged["learns"] is True and judged["against"] == "autocast", judged["verdict"]
    assert judged["grads"] == [8, 8, 8] and judged["stock_loss"] == reference["loss"]
    ratio = rows["working-weights"]["ratio_to_stock"]
    assert ratio == rows["working-weights"]["rate"] / rows["autocast"]["rate"] and f"| {ratio:.3f}x |" in proc.stdout
    assert "- tiny, `working-weights`: learns as stock (3 steps" in proc.stdout
