"""bench/breakdown_cost.py runs end to end: the breakdown option's cost per training step, off
against on in interleaved rounds, for both loops."""

from __future__ import annotations

import json

from conftest import REPO_ROOT, run_python


def test_it_times_both_loops_with_the_option_off_and_on():
    proc = run_python([str(REPO_ROOT / "bench" / "breakdown_cost.py"), "--rounds", "2", "--steps", "5", "--json"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(r["group"], r["variant"]) for r in report["rows"]] == [
        ("tiny MLP", "breakdown off"),
        ("tiny MLP", "breakdown on"),
        ("small CNN", "breakdown off"),
        ("small CNN", "breakdown on"),
    ]
    for r in report["rows"]:
        assert r["unit"] == "us/step" and r["rate"] > 0 and len(r["rates"]) == 2
        assert ("note" not in r) == (r["variant"] == "breakdown off")
        if "note" in r:
            assert r["note"].startswith("cost ") and " us a step (" in r["note"]
        else:
            assert r["hook_share"] > 0  # the hooks' own time, measured directly, against the step
    assert report["hook_cost_s"]["batch"] > 0 and report["hook_cost_s"]["step"] > 0
