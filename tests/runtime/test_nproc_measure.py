"""``--nproc measure``: the script's first steps timed at 1, 2, 4, ... processes, the fastest
count trained with, its figures kept for the next run of the command and read by the advice;
each trial's processes stop after their timed steps, the script's output and remaining work
unrun."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from nanopatch.foundation import cpu, records
from nanopatch.runtime import measure, tuning
from nanopatch.targets.breakdown import measure as trial_side
from nanopatch.targets.training import patch as training

from conftest import child_env, run_python

TWO_CORES = len(cpu.host_facts().cores) >= 2

SCRIPT = """
import os, sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(2048, 16)
y = (x[:, 0] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step, (xb, yb) in zip(range(40), loader):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    print("trained", os.environ.get("RANK", "0"), "of", os.environ.get("WORLD_SIZE", "1"))
finally:  # a trial must not get here: its steps end the process first
    if os.environ.get("RANK", "0") == "0":
        with open(sys.argv[1], "a") as f:
            f.write("finished\\n")
"""


def facts_with(cores: int) -> cpu.CpuFacts:
    return dataclasses.replace(
        cpu.host_facts(), cores=tuple((c,) for c in range(cores)), allowed_cpus=tuple(range(cores))
    )


def test_the_counts_tried_are_powers_of_two_up_to_a_process_per_core():
    assert measure.candidates(facts_with(1)) == [1]
    assert measure.candidates(facts_with(2)) == [1, 2]
    assert measure.candidates(facts_with(12)) == [1, 2, 4, 8]
    assert measure.candidates(facts_with(16)) == [1, 2, 4, 8, 16]


def test_a_count_rate_is_every_ranks_samples_over_the_slowest_rank():
    ranks = [{"samples": 160, "steps": 5, "seconds": 2.0}, {"samples": 160, "steps": 5, "seconds": 4.0}]
    assert measure.rate_of(ranks) == (80.0, "samples/s")
    steps_only = [{"samples": 0, "steps": 5, "seconds": 2.0}, {"samples": 0, "steps": 5, "seconds": 2.5}]
    assert measure.rate_of(steps_only) == (4.0, "steps/s")
    assert measure.rate_of([]) == (None, "samples/s")


def test_more_processes_are_chosen_only_where_they_are_clearly_faster():
    T = measure.Trial
    assert measure.choose([T(1, 100.0), T(2, 104.0), T(4, 103.0)]) == 1  # within 5%: fewer processes
    assert measure.choose([T(1, 100.0), T(2, 130.0), T(4, 150.0), T(8, 140.0)]) == 4
    assert measure.choose([T(4, 109.0), T(2, 104.0), T(1, 100.0)]) == 2  # the fewest within 5% of the fastest
    assert measure.choose([T(1, 100.0), T(2, None, problem="failed (exit code 1)")]) == 1
    assert measure.choose([T(1, None, problem="the script ended before its steps could be timed")]) == 1
    line = measure.describe([T(1, 100.0), T(2, 150.0), T(4, None, problem="stopped after 300 s")], 2)
    assert line == (
        "--nproc measure (measured): 1 process 100.0 samples/s; 2 processes 150.0 samples/s (1.50x); "
        "4 processes: stopped after 300 s; training with 2"
    )


def test_the_runner_options_keep_all_but_the_count():
    assert measure.without_nproc(["-v", "--nproc", "measure", "--no-bf16"]) == ["-v", "--no-bf16"]
    assert measure.without_nproc(["--nproc=measure", "--compile"]) == ["--compile"]


def test_a_records_key_leaves_out_what_only_changes_the_output():
    facts = facts_with(2)
    key = measure.record_key(["--no-bf16"], ["train.py"], facts)
    assert measure.record_key(["-v", "--no-bf16", "--all-ranks-print"], ["train.py"], facts) == key
    assert measure.record_key(["-vv", "--no-bf16"], ["train.py"], facts) == key
    assert measure.record_key([], ["train.py"], facts) != key  # an option that changes the speed counts
    assert measure.record_key(["--no-bf16"], ["train.py", "--epochs", "2"], facts) != key


def test_a_measurement_is_kept_and_the_next_run_of_the_command_reads_it(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(measure.FIGURES_VARIABLE, raising=False)
    tried = []

    def run_trial(nproc, options, target, steps, timeout_s):
        tried.append((nproc, list(options), list(target)))
        return measure.Trial(nproc, {1: 100.0, 2: 170.0, 4: 160.0}[nproc])

    monkeypatch.setattr(measure, "run_trial", run_trial)
    lines = []
    chosen, trials, line = measure.measure(
        ["-v", "--nproc", "measure"], ["train.py", "--epochs", "1"], facts_with(4), log=lines.append
    )
    assert chosen == 2 and [t.nproc for t in trials] == [1, 2, 4]
    assert tried[0] == (1, ["-v"], ["train.py", "--epochs", "1"])
    assert lines[-1] == line and "training with 2" in line and "2 processes 170.0 samples/s (1.70x)" in line
    exported = measure.figures()
    assert exported["chosen"] == 2 and [t["rate"] for t in exported["trials"]] == [100.0, 170.0, 160.0]

    # the same command again: the record, no trials; another argument: measured anew
    tried.clear()
    monkeypatch.delenv(measure.FIGURES_VARIABLE)
    chosen, _, line = measure.measure(
        ["-v", "--nproc=measure"], ["train.py", "--epochs", "1"], facts_with(4), log=print
    )
    assert chosen == 2 and tried == [] and f"kept in {tmp_path / measure.RECORD_FILE}" in line
    measure.measure(["-v", "--nproc", "measure"], ["train.py", "--epochs", "2"], facts_with(4), log=print)
    assert [n for n, *_ in tried] == [1, 2, 4]

    # a run of the command with another count (or none) reads the figures for its advice
    monkeypatch.delenv(measure.FIGURES_VARIABLE)
    assert measure.recall(["-v"], ["train.py", "--epochs", "1"], facts_with(4)) == 2
    assert measure.figures()["chosen"] == 2
    assert measure.recall(["-v"], ["other.py"], facts_with(4)) is None
    # --nproc auto follows the figures, and says so once (not again after the allocator's restart)
    lines.clear()
    assert measure.recall(["-v"], ["train.py", "--epochs", "1"], facts_with(4), follow=True, log=lines.append) == 2
    assert lines == [f"--nproc auto follows {line}"], lines
    monkeypatch.setenv(tuning.REEXEC_MARKER, "1")
    assert measure.recall(["-v"], ["train.py", "--epochs", "1"], facts_with(4), follow=True, log=lines.append) == 2
    assert len(lines) == 1
    # a record someone edited into nonsense is no record
    key = measure.record_key(["-v"], ["train.py", "--epochs", "1"], facts_with(4))
    records.write_record(key, {"trials": [{"nproc": 1, "rate": "fast"}]}, measure.RECORD_FILE)
    assert measure.recall(["-v"], ["train.py", "--epochs", "1"], facts_with(4)) is None


def test_a_script_that_fails_or_ends_in_one_process_is_not_tried_with_more(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(measure.FIGURES_VARIABLE, raising=False)
    tried = []

    def run_trial(nproc, *args):
        tried.append(nproc)
        return measure.Trial(nproc, problem="failed (exit code 1): ValueError: bad")

    monkeypatch.setattr(measure, "run_trial", run_trial)
    chosen, _, line = measure.measure([], ["train.py"], facts_with(4), log=print)
    assert chosen == 1 and tried == [1] and "1 process: failed (exit code 1): ValueError: bad" in line
    assert not (tmp_path / measure.RECORD_FILE).exists()  # nothing measured: nothing kept


class Exited(Exception):
    pass


def test_a_trial_times_its_steps_after_nanopatch_has_settled_and_ends_the_process(monkeypatch, tmp_path):
    measuring = iter([True, True, False])
    monkeypatch.setattr(training, "measuring", lambda: next(measuring))

    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setenv(measure.OUT_VARIABLE, str(tmp_path))
    monkeypatch.setenv(measure.STEPS_VARIABLE, "3")
    monkeypatch.delenv("RANK", raising=False)
    trial = trial_side.from_environment()
    assert trial is not None and trial.steps == 3
    # step 1: the start-up's; steps 2-3: still measuring; step 4: settled, the timing starts
    for step in range(1, 5):
        trial.after_step(float(step), samples=16 * step)
    assert trial.warmup == 4
    trial.after_step(5.0, 80)
    trial.after_step(6.0, 96)
    with pytest.raises(Exited):
        trial.after_step(7.5, 112)
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")]
    assert result == {"rank": 0, "world": 1, "steps": 3, "warmup_steps": 4, "seconds": 3.5, "samples": 48}

    monkeypatch.delenv(measure.OUT_VARIABLE)
    assert trial_side.from_environment() is None


def test_a_trial_stops_timing_its_warm_up_at_the_cap(monkeypatch, tmp_path):
    monkeypatch.setattr(training, "measuring", lambda: True)
    trial = trial_side.Trial(str(tmp_path), steps=2)
    for step in range(1, trial_side.MAX_WARMUP + 1):
        trial.after_step(float(step), 0)
    assert trial.warmup == trial_side.MAX_WARMUP


def test_records_live_in_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path / "c"))
    records.write_record("k", {"a": 1}, "x.json")
    assert records.read_record("k", "x.json") == {"a": 1} and records.read_record("k", "y.json") is None
    (tmp_path / "c" / "x.json").write_text("not json")
    assert records.read_record("k", "x.json") is None


@pytest.mark.py_only  # a whole script under the runner: tox's py env runs it (tox.ini)
@pytest.mark.skipif(not TWO_CORES, reason="needs 2 physical cores")
def test_nproc_measure_times_each_count_and_trains_once_with_the_fastest(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = tmp_path / "done.txt"
    env = child_env({"NANOPATCH_CACHE_DIR": str(tmp_path / "cache"), measure.STEPS_VARIABLE: "3"})
    proc = run_python(
        ["-m", "nanopatch", "--nproc", "measure", str(script), str(done)], cwd=tmp_path, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "training with" in x)
    assert "--nproc measure (measured): 1 process " in line and "; 2 processes " in line, line
    chosen = int(line.rsplit(" ", 1)[1])
    # the trials' output is hidden and their processes ended before the script's end: the
    # script's last lines ran once, in the run chosen
    assert proc.stdout.splitlines() == [f"trained 0 of {chosen}"]
    assert done.read_text() == "finished\n"
    kept = tmp_path / "cache" / measure.RECORD_FILE
    ((key, record),) = json.loads(kept.read_text()).items()
    assert [t["nproc"] for t in record["trials"]] == [1, 2]
    assert all(t["rate"] > 0 and t["unit"] == "samples/s" for t in record["trials"])
    assert measure.choose([measure.Trial(t["nproc"], t["rate"]) for t in record["trials"]]) == chosen

    # --nproc auto: the count measured for the command, with no trials, said; with the figures
    # made to favour the other count, that one
    for count in (chosen, 3 - chosen):
        rates = {1: 100.0, 2: 100.0 * (3.0 if count == 2 else 0.5)}
        record["trials"] = [dict(t, rate=rates[t["nproc"]]) for t in record["trials"]]
        kept.write_text(json.dumps({key: record}))
        proc = run_python(
            ["-m", "nanopatch", "--nproc", "auto", str(script), str(done)], cwd=tmp_path, env=env, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        assert "--nproc measure: timing" not in proc.stderr  # no trials
        assert f"--nproc auto follows --nproc measure (measured on {record['date']}" in proc.stderr, proc.stderr
        assert f"training with {count}\n" in proc.stderr
        assert proc.stdout.splitlines() == [f"trained 0 of {count}"]


@pytest.mark.parametrize(
    ("given", "count"),
    [
        (["--nproc", "auto"], 2),  # the count measured
        (["--nproc", "auto", "--cores-per-proc", "1"], "auto"),  # the user's split: auto as before
        (["--nproc", "auto", "--cpus", "0;1"], "auto"),
        (["--nproc", "3"], 3),  # a number is a number
    ],
)
def test_nproc_auto_trains_with_the_count_measure_chose_where_the_machine_chooses(monkeypatch, tmp_path, given, count):
    from nanopatch.runner import cli

    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(measure.FIGURES_VARIABLE, raising=False)
    monkeypatch.delenv(tuning.REEXEC_MARKER, raising=False)
    script = tmp_path / "train.py"
    script.write_text("")
    target = [str(script), "--epochs", "1"]
    own, opts, _, _, _ = cli.parse(cli.build_parser(), [*given, *target])
    key = measure.record_key(measure.without_nproc(own), target, cpu.host_facts())  # this command's figures
    trials = [{"nproc": 1, "rate": 100.0}, {"nproc": 2, "rate": 180.0}]
    records.write_record(key, {"trials": trials, "date": "2026-12-02"}, measure.RECORD_FILE)
    cli._choose_processes(opts, own, target)
    assert opts.nproc == count
    assert measure.figures()["chosen"] == 2  # the advice reads the figures either way


def test_nproc_auto_without_figures_runs_one_process_per_socket_and_says_so(monkeypatch, tmp_path, capsys):
    from nanopatch.runner import cli

    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))  # no figures kept
    monkeypatch.delenv(measure.FIGURES_VARIABLE, raising=False)
    monkeypatch.delenv(tuning.REEXEC_MARKER, raising=False)
    lines = []
    two_sockets = dataclasses.replace(facts_with(4), sockets=2)
    assert measure.per_socket(two_sockets, log=lines.append) == 2
    assert lines == [
        "--nproc auto: one process per socket, 2 processes here (no --nproc measure figures for this command: "
        "it times 1, 2, 4, ... processes, and auto follows them)"
    ]
    base = facts_with(4)
    for sockets, count in ((1, None), (2, 2)):  # one process runs as one process, not a process group of one
        monkeypatch.setattr(cpu, "host_facts", lambda s=sockets: dataclasses.replace(base, sockets=s))
        own, opts, _, _, _ = cli.parse(cli.build_parser(), ["--nproc", "auto", "train.py"])
        cli._choose_processes(opts, own, ["train.py"])
        assert opts.nproc == count
    assert "one process per socket, 1 process here" in capsys.readouterr().err
