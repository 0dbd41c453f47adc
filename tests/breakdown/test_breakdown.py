"""The ``breakdown`` target: where a training run's time goes (waiting for data, forward +
backward, the optimizer step, the rest), read from a DataLoader iterator's ``__next__`` and the
optimizer's step; its advice, each rule firing on a run built to trigger it and silent on one
that does not; its place in ``status()``, the runner's ``-v`` and the patch contract."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.optim import optimizer as optimizer_mod
from torch.utils.data import DataLoader, Dataset, dataloader

import nanopatch
from nanopatch.runtime import measure
from nanopatch.targets.breakdown import advice
from nanopatch.targets.breakdown import patch as breakdown

from conftest import run_python
from helpers.compare_output import table_rows

SLEEP = 0.01  # seconds a slow item takes to load


class Items(Dataset):
    """``n`` items of 8 features; each takes ``delay`` seconds to load."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return torch.full((8,), float(i % 3)), torch.tensor(i % 2)


def train(loader, model, optimizer, closure: bool = False, compute_sleep: float = 0.0) -> None:
    for x, y in loader:

        def step(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            time.sleep(compute_sleep)
            return loss

        if closure:
            optimizer.step(step)
        else:
            step()
            optimizer.step()


@pytest.fixture(autouse=True)
def _no_nproc_figures(monkeypatch):
    """No ``--nproc measure`` figures from an earlier test of this process: the runner's code
    exports them into ``os.environ`` for its children, and the advice would follow them."""
    monkeypatch.delenv(measure.FIGURES_VARIABLE, raising=False)


@pytest.fixture
def timed():
    with nanopatch.patched(breakdown=True, training=False, vision=False, data_parallel=False):
        yield


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_the_wait_for_data_is_what_the_loader_took(timed):
    model, optimizer = model_and_optimizer()
    train(DataLoader(Items(32, SLEEP), batch_size=4), model, optimizer)
    report = nanopatch.status()["breakdown"]
    # the first step is the start-up's: training is the 7 after it
    assert report["steps"] == 8 and report["samples"] == 28 and report["batch_size"] == 4
    assert report["num_workers"] == 0
    assert 28 * SLEEP <= report["data_s"] < 28 * SLEEP + 0.5
    assert report["compute_s"] < report["data_s"]
    parts = sum(report[key] for key, _ in breakdown.PARTS)
    assert parts == pytest.approx(report["wall_s"], rel=0.01)
    assert report["samples_per_s"] == pytest.approx(
        28 / (report["data_s"] + report["compute_s"] + report["optimizer_s"])
    )
    assert report["startup_s"] >= 4 * SLEEP  # the first batch's loading


def test_a_closure_is_forward_and_backward_not_the_optimizer(timed):
    model, optimizer = model_and_optimizer()
    train(DataLoader(Items(16), batch_size=4), model, optimizer, closure=True, compute_sleep=0.05)
    report = nanopatch.status()["breakdown"]
    assert report["steps"] == 4
    assert report["compute_s"] >= 3 * 0.05 and report["optimizer_s"] < 0.05


def test_an_evaluation_loaders_batches_are_not_training(timed):
    """Batches that lead to no optimizer step (an evaluation under no_grad) count as "other",
    their loading too: not as waiting for data."""
    model, optimizer = model_and_optimizer()
    training, evaluation = DataLoader(Items(16), batch_size=4), DataLoader(Items(16, SLEEP), batch_size=4)
    for _ in range(2):
        train(training, model, optimizer)
        with torch.no_grad():
            for x, _ in evaluation:
                model(x)
    report = nanopatch.status()["breakdown"]
    assert report["steps"] == 8 and report["samples"] == 28
    assert report["other_s"] >= 2 * 16 * SLEEP and report["data_s"] < 16 * SLEEP


def test_gradient_accumulation_and_two_optimizers_count_their_forward_as_compute(timed):
    model, optimizer = model_and_optimizer()
    other = torch.nn.Linear(8, 2)
    second = torch.optim.SGD(other.parameters(), lr=0.1)
    for i, (x, y) in enumerate(DataLoader(Items(16), batch_size=2)):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        time.sleep(0.02)
        if i % 2:  # accumulated over two batches
            optimizer.step()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(other(x), y).backward()
            time.sleep(0.02)
            second.step()
    report = nanopatch.status()["breakdown"]
    assert report["steps"] == 8 and report["samples"] == 12
    assert report["compute_s"] >= 10 * 0.02 and report["other_s"] < 0.1


def test_a_loop_without_a_dataloader_is_timed_from_its_first_step(timed):
    model, optimizer = model_and_optimizer()
    for _ in range(6):
        time.sleep(0.02)
        torch.nn.functional.cross_entropy(model(torch.ones(4, 8)), torch.zeros(4, dtype=torch.long)).backward()
        optimizer.step()
    report = nanopatch.status()["breakdown"]
    assert report["steps"] == 6 and report["samples"] == 0 and report["samples_per_s"] is None
    assert report["compute_s"] >= 5 * 0.02 and report["data_s"] == 0 and report["startup_s"] >= 0.02


def test_off_by_default_and_undone_exactly():
    stock_next = dataloader._BaseDataLoaderIter.__dict__["__next__"]
    with nanopatch.patched(training=False, vision=False, data_parallel=False):
        assert nanopatch.status()["breakdown"] is None
        assert dataloader._BaseDataLoaderIter.__dict__["__next__"] is stock_next
    with nanopatch.patched(breakdown=True, training=False, vision=False, data_parallel=False):
        assert dataloader._BaseDataLoaderIter.__dict__["__next__"] is not stock_next
        nanopatch.patch_torch(breakdown=True, training=False, vision=False, data_parallel=False)  # idempotent
        assert nanopatch.status()["breakdown"]["steps"] == 0
    assert dataloader._BaseDataLoaderIter.__dict__["__next__"] is stock_next
    hooks = [*optimizer_mod._global_optimizer_pre_hooks.values(), *optimizer_mod._global_optimizer_post_hooks.values()]
    assert not [hook for hook in hooks if getattr(hook, "__module__", "") == breakdown.__name__]


# --- advice: each rule fires on the figures it is about, and only there ---


def report(**figures) -> dict:
    """A breakdown report: 100 steps of 50 ms of forward + backward, 5 ms of optimizer and
    10 ms of waiting for data at batch 32 with 4 workers, on 4 CPUs kept busy."""
    base = {
        "wall_s": 8.0,
        "startup_s": 1.0,
        "data_s": 1.0,
        "compute_s": 5.0,
        "optimizer_s": 0.5,
        "other_s": 0.5,
        "steps": 100,
        "samples": 3200,
        "samples_per_s": 3200 / 6.5,
        "step_s": 0.055,
        "batch_size": 32,
        "num_workers": 4,
        "threads": 4,
        "cpus": 4,
        "cores_busy": 3.8,
        "world_size": 1,
    }
    return {**base, **figures}


def rules(**figures) -> list[str]:
    return [a["rule"] for a in advice.advise(report(**figures))]


def test_no_advice_where_nothing_applies():
    assert rules() == []
    assert rules(steps=5, data_s=20.0, num_workers=0) == []  # too few steps to say anything


def test_workers_are_advised_when_the_wait_is_large_and_the_workers_few():
    (found,) = advice.advise(report(data_s=3.0, num_workers=0))
    assert found["rule"] == "num_workers" and found["change"] == "DataLoader(..., num_workers=4)"
    assert "waiting for data took 35% of training with num_workers=0" in found["text"]
    assert rules(data_s=3.0, num_workers=4) == []  # as many workers as CPUs: nothing to add
    assert rules(data_s=1.0, num_workers=0) == []  # 15%: the wait is small
    assert rules(data_s=3.0, num_workers=0, cpus=32) == ["num_workers"]
    assert "num_workers=8" in advice.advise(report(data_s=3.0, num_workers=0, cpus=32))[0]["change"]
    per_process = advice.advise(report(data_s=3.0, num_workers=0, world_size=2))[0]["text"]
    assert "per process" in per_process


def test_a_small_batch_is_advised_with_the_learning_rate_rule():
    (found,) = advice.advise(report(batch_size=2, compute_s=1.0, optimizer_s=1.0, step_s=0.02))
    assert found["rule"] == "batch_size" and "batch size 2" in found["figure"]
    assert "batch size 8 with the learning rate x4" == found["change"] and "linear scaling rule" in found["text"]
    assert rules(batch_size=2, compute_s=5.0, optimizer_s=0.5) == []  # the step's work dominates


def test_nproc_is_advised_when_one_process_leaves_cores_idle():
    (found,) = advice.advise(report(cores_busy=1.2))
    assert found["rule"] == "nproc" and found["change"] == "python -m nanopatch --nproc 3 script.py"
    assert "kept 1.2 of this process's 4 threads busy" in found["text"]
    assert rules(cores_busy=3.0) == []
    assert rules(cores_busy=1.2, world_size=2) == []  # already several processes
    assert rules(cores_busy=0.9, threads=1, cpus=1) == []  # one core: nothing to share out
    assert rules(cores_busy=1.2, others_busy=1.5) == []  # other work kept the cores busy meanwhile
    assert [a["rule"] for a in advice.advise(report(cores_busy=1.2, others_busy=0.2))] == ["nproc"]


def test_nproc_measure_figures_replace_the_busy_rule(monkeypatch):
    """Where --nproc measure timed the command, its figures decide the advice on processes."""
    figures = {
        "chosen": 2,
        "date": "2026-11-27",
        "trials": [{"nproc": 1, "rate": 100.0, "unit": "samples/s"}, {"nproc": 2, "rate": 150.0, "unit": "samples/s"}],
    }
    monkeypatch.setenv(measure.FIGURES_VARIABLE, json.dumps(figures))
    (found,) = advice.advise(report())  # busy enough by the rule; the measurement says 2
    assert found["rule"] == "nproc" and found["change"] == "python -m nanopatch --nproc 2 script.py"
    assert "2 process(es) 150.0 samples/s against 100.0 with 1" in found["text"] and "1.50x" in found["text"]
    assert advice.advise(report(world_size=2)) == []  # the count measured fastest ran
    figures["chosen"] = 1
    monkeypatch.setenv(measure.FIGURES_VARIABLE, json.dumps(figures))
    assert advice.advise(report(cores_busy=1.0)) == []  # idle threads, but one process measured fastest
    monkeypatch.delenv(measure.FIGURES_VARIABLE)
    (found,) = advice.advise(report(cores_busy=1.0))
    assert "--nproc measure" in found["text"]


def test_a_run_on_a_gpu_gets_no_cpu_advice():
    """A model trained on CUDA (any device but the CPU): no worker, batch or --nproc advice from
    figures that would give all three on the CPU, and the breakdown says where it trained."""
    busy = {"data_s": 3.0, "num_workers": 0, "cores_busy": 1.2, "optimizer_s": 3.0}
    assert rules(**busy, devices=["cpu"]) == ["num_workers", "batch_size", "nproc"]
    assert rules(**busy, devices=["cuda"]) == []
    assert rules(**busy, devices=["cpu", "cuda"]) == []
    line = breakdown.text(report(**busy, devices=["cuda"]))
    assert line.endswith(
        "; the model trained on cuda, which nanopatch leaves alone (no advice on CPU processes or DataLoader workers)"
    )
    assert "trained on" not in breakdown.text(report(**busy, devices=["cpu"]))
    meta = torch.optim.SGD([torch.zeros(2, device="meta", requires_grad=True)])
    assert breakdown.parameter_devices(meta) == {"meta"}


def test_the_breakdown_notes_the_device_the_optimizer_steps_on(timed, monkeypatch):
    """A loop whose loader keeps it waiting would be advised workers on the CPU; with a stand-in
    that reports its parameters on CUDA, the breakdown names cuda and advises nothing."""
    model, optimizer = model_and_optimizer()
    # the busy rule's advice on processes depends on what else the machine ran meanwhile: not this test's
    monkeypatch.setattr(advice, "_nproc", lambda report: None)
    train(DataLoader(Items(32, delay=SLEEP), batch_size=4), model, optimizer)
    report = nanopatch.status()["breakdown"]
    assert report["devices"] == ["cpu"] and [a["rule"] for a in report["advice"]] == ["num_workers"]
    monkeypatch.setattr(breakdown, "parameter_devices", lambda optimizer: {"cuda"})
    second = torch.optim.SGD(model.parameters(), lr=0.1)  # read once per optimizer: a new one
    train(DataLoader(Items(8, delay=SLEEP), batch_size=4), model, second)
    report = nanopatch.status()["breakdown"]
    assert report["devices"] == ["cpu", "cuda"] and report["advice"] == []


def test_the_cores_other_processes_kept_busy_are_measured(timed):
    """A process that spins beside the training loop shows in ``others_busy``."""
    import multiprocessing

    model, optimizer = model_and_optimizer()
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, args=(3.0,))
    train(DataLoader(Items(8), batch_size=4), model, optimizer)  # the first step: the start-up's
    spinner.start()
    try:
        time.sleep(1.5)
        train(DataLoader(Items(8), batch_size=4), model, optimizer)
        report = nanopatch.status()["breakdown"]
    finally:
        spinner.join()
    assert report["others_busy"] is not None and report["others_busy"] > 0.5, report


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.py_only
def test_the_runner_at_v_says_where_the_time_went_and_advises(tmp_path):
    script = tmp_path / "slow_data.py"
    script.write_text(
        "import time, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Slow(Dataset):\n"
        "    def __len__(self): return 48\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.01)\n"
        "        return torch.ones(8), torch.tensor(i % 2)\n"
        "model = torch.nn.Linear(8, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(Slow(), batch_size=4):\n"
        "    optimizer.zero_grad()\n"
        "    torch.nn.functional.cross_entropy(model(x), y).backward()\n"
        "    optimizer.step()\n"
        "print('done')\n"
    )
    proc = run_python(["-m", "nanopatch", "-v", str(script)], timeout=300)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "nanopatch" in line and " time: " in line]
    assert "waiting for data" in line and "12 optimizer step(s)" in line, line
    assert "advice: waiting for data took" in proc.stderr and "num_workers=" in proc.stderr, proc.stderr
    quiet = run_python(["-m", "nanopatch", str(script)], timeout=300)
    assert quiet.returncode == 0 and " time: " not in quiet.stderr and "advice" not in quiet.stderr


SLOW_DATA = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.ones(8), torch.tensor(i % 2)
if __name__ == "__main__":
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Slow(), batch_size=4, num_workers=int(sys.argv[1])):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    print("done")
"""


def breakdown_rows(stdout: str) -> dict[str, list[str]]:
    return table_rows(stdout, "Where the time went (nanopatch.breakdown: wall time from torch's import to the end)")


@pytest.mark.py_only
@pytest.mark.parametrize("workers", [0, 2])
def test_compare_shows_both_runs_breakdowns_and_advises_workers_only_without_them(tmp_path, workers):
    script = tmp_path / "slow_data.py"
    script.write_text(SLOW_DATA)
    chart = tmp_path / "times.png"
    proc = run_python(
        ["-m", "nanopatch", "--compare", "--plot", str(chart), str(script), str(workers)],
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = breakdown_rows(proc.stdout)
    assert rows["optimizer steps"][:2] == ["16", "16"]
    for label in ("start-up (to the first step's end)", "waiting for data", "forward + backward", "optimizer step"):
        assert all(cell.endswith("%)") for cell in rows[label][:2]), rows
    assert rows["samples/s while training"][2].endswith("x")
    advised = "waiting for data took" in proc.stdout and "num_workers=" in proc.stdout
    assert advised == (workers == 0), proc.stdout
    assert f"--plot: the breakdown is drawn in {chart}" in proc.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.py_only
def test_plot_goes_with_compare_and_says_when_matplotlib_is_missing(tmp_path):
    proc = run_python(["-m", "nanopatch", "--plot", "x.png", "train.py"], cwd=tmp_path)
    assert proc.returncode == 2 and "--plot goes with --compare" in proc.stderr
    from nanopatch.runner import cli as runner
    from nanopatch.runner import output
    from nanopatch.runner import report as reports

    assert runner._without_compare(["--compare", "--plot", "a.png", "--no-bf16", "--plot=b.png"]) == ["--no-bf16"]
    runs = [output.Run(name, [], report={"breakdown": report()}) for name in ("stock", "nanopatch")]
    blocked = "import sys; sys.modules['matplotlib'] = None\n"  # as if it were not installed
    code = blocked + (
        "from nanopatch.runner import output, report as reports\n"
        "import json, sys\n"
        "runs = [output.Run(n, [], report={'breakdown': json.loads(sys.argv[1])}) for n in ('stock', 'nanopatch')]\n"
        "print(reports.draw(sys.argv[2], *runs))\n"
    )
    import json

    missing = run_python(["-c", code, json.dumps(report()), str(tmp_path / "x.png")])
    assert "--plot: matplotlib is not installed (pip install matplotlib)" in missing.stdout, missing.stderr
    assert not (tmp_path / "x.png").exists()
    assert "waiting for data" in reports.breakdown_text(*runs)
    runs[1].report = {"breakdown": report(steps=0)}  # the script's own ipex.optimize replaced the step
    assert "No optimizer step was seen in nanopatch: all its time counts as start-up" in reports.breakdown_text(*runs)


def test_the_compile_trial_says_by_how_much_and_advises_only_a_gain():
    eager = report(samples_per_s=100.0, startup_s=2.0)
    found = advice.compile_trial(eager, report(samples_per_s=125.0, startup_s=14.0))
    assert found["faster"] and found["change"] == "python -m nanopatch --compile script.py"
    assert "torch.compile ran 1.25x the samples/s" in found["text"] and "+12.0 s" in found["text"]
    slower = advice.compile_trial(eager, report(samples_per_s=97.0, startup_s=14.0))
    assert not slower["faster"] and "not faster here, nothing to change" in slower["text"]
    assert advice.compile_trial(eager, None) is None and advice.compile_trial(report(samples_per_s=None), eager) is None


@pytest.mark.py_only
def test_try_compile_runs_a_third_time_with_compile_and_reports_it(tmp_path):
    proc = run_python(["-m", "nanopatch", "--try-compile", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2 and "--try-compile goes with --compare" in proc.stderr
    script = tmp_path / "slow_data.py"
    script.write_text(SLOW_DATA)
    proc = run_python(["-m", "nanopatch", "--compare", "--try-compile", str(script), "2"], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== compiled: -m nanopatch --compile --breakdown" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.startswith(" ") and "| compiled" in line)
    assert [c.strip() for c in header.split("|")] == ["", "stock", "nanopatch", "compiled", "speedup"]
    assert breakdown_rows(proc.stdout)["optimizer steps"][:3] == ["16", "16", "16"]
    assert "- torch.compile ran " in proc.stdout and "x the samples/s of the run without it" in proc.stdout


def test_the_table_gives_a_training_steps_time_where_no_dataloader_counted_samples():
    from nanopatch.runner import output
    from nanopatch.runner import report as reports

    loop = {"data_s": 0.0, "samples": 0, "samples_per_s": None, "batch_size": None, "num_workers": None}
    runs = [
        output.Run(name, [], report={"breakdown": report(**loop, step_s=step_s)})
        for name, step_s in (("stock", 0.330), ("nanopatch", 0.220))
    ]
    [row] = [line for line in reports.breakdown_text(*runs).splitlines() if line.startswith("a training step")]
    assert [cell.strip() for cell in row.split("|")[1:]] == ["330 ms", "220 ms", "1.50x"]
    with_loader = [output.Run(name, [], report={"breakdown": report()}) for name in ("stock", "nanopatch")]
    assert "a training step" not in reports.breakdown_text(*with_loader)  # samples/s says it there
