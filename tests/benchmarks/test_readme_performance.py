"""The README's performance table is the one bench/run.py renders from the report it names."""

from __future__ import annotations

import json
import re

from conftest import REPO_ROOT
from helpers.bench_reports import report_readme, suite_benches

README = REPO_ROOT / "README.md"


def performance_section() -> str:
    text = README.read_text()
    match = re.search(r"^## Performance\n(.*?)^## ", text, re.S | re.M)
    assert match, "README has no '## Performance' section"
    return match.group(1)


def named_report() -> dict:
    names = re.findall(r"\(bench/results/([^)]+)\.md\)", performance_section())
    assert len(names) == 1, f"the section should link exactly one report, found {names}"
    report = REPO_ROOT / "bench" / "results" / f"{names[0]}.json"
    assert report.is_file(), f"{report} is not in the repository"
    assert (report.with_suffix(".md")).is_file()
    return json.loads(report.read_text())


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_readme_table_is_the_rendered_report():
    results = named_report()
    assert not results["quick"], "the README quotes a full run, not a quick one"
    assert results["complete"] and not results["failures"]
    assert table_lines(performance_section()) == table_lines(report_readme.readme_table(results, suite_benches.BENCHES))


def test_readme_names_the_reports_machine_and_date():
    results = named_report()
    section = performance_section()
    assert results["started"][:10] in section
    assert results["versions"]["torch"].split("+")[0] in section
    assert "bench/run.py" in section


#: the benches whose variants train, and so are judged against stock's run (bench/harness/)
TRAINING_BENCHES = ("train_step", "multi_instance", "frameworks")


def test_every_training_figure_comes_from_a_run_that_learned_as_stock():
    """Every training speed-up the README quotes is of a variant whose first steps from the seed
    learned as stock's; one that did not is shown "does not learn" with no ratio."""
    results = named_report()
    assert results["schema"] >= 2, "the README's report predates the learning check: re-measure it with bench/run.py"
    for r in results["rows"]:
        if r["bench"] not in TRAINING_BENCHES or (r["rate"] is None and not r.get("learning")):
            continue  # not training, or did not run
        assert r.get("learning"), f"{r['bench']} {r['group']} {r['variant']}: no learning record"
        if r["learning"]["learns"] is False:
            assert r["rate"] is None and r["ratio_to_stock"] is None, r
        else:
            assert r["learning"]["learns"] is True, (r["bench"], r["group"], r["variant"], r["learning"]["verdict"])
