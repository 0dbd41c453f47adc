"""TorchNano, ``@nano`` and ``Trainer(num_processes=2)`` in a script written as BigDL-Nano's guides
write them: at the top level, without a main guard, with a lambda collate function, a class and
closures defined in the script (tests/data/nano_unguarded.py). The processes are forked: the
script's top-level code runs once; a worker's failure reaches the caller with its traceback;
no process outlives a failure, Ctrl-C or the caller's death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nanopatch.foundation import cpu
from nanopatch.runtime import processes
from nanopatch.runtime import tuning as runtime

from conftest import TESTS_DIR, child_env, run_rank_script
from helpers import listening
from helpers.learning_oracle import framework

SCRIPT = str(TESTS_DIR / "data" / "nano_unguarded.py")
TWO_CORES = len(cpu.host_facts().cores) >= 2

pytestmark = pytest.mark.skipif(not TWO_CORES, reason="two processes need two physical cores")

#: (api, arguments): on Lightning (Fabric, Trainer) and on nanopatch's own engine (no Lightning)
RUNS = {
    "torchnano": ("torchnano",),
    "torchnano-no-fabric": ("torchnano", "--no-fabric"),
    "decorated": ("decorated",),
    "decorated-no-fabric": ("decorated", "--no-fabric"),
    "trainer": ("trainer",),
}


def needs_lightning(run: str) -> None:
    if "no-fabric" not in run:
        framework("lightning.pytorch" if run == "trainer" else "lightning.fabric")


@pytest.mark.py_only  # a whole script's launch: tox's py env runs these (tox.ini)
@pytest.mark.parametrize("run", list(RUNS))
def test_an_unguarded_script_trains_data_parallel_and_runs_its_top_level_once(tmp_path, run):
    needs_lightning(run)
    out = tmp_path / "out"
    ranks = run_rank_script(SCRIPT, out, *RUNS[run], cwd=tmp_path)
    printed = (out / "output.txt").read_text()
    # the script's own code ran in one process only: one print, one pass over its top level
    assert printed.count("preparing the data") == 1 and printed.count("done") == 1, printed
    (script_pid,) = (out / "top-level.txt").read_text().split()
    assert sorted(ranks) == [0, 1]
    assert len({script_pid, ranks[0]["pid"], ranks[1]["pid"]}) == 3
    groups = runtime.process_cpus(cpu.host_facts(), 2)
    for rank, report in ranks.items():
        assert report["affinity"] == sorted(groups[rank]) and report["threads"] == 1  # pinned
        assert len(report["losses"]) == 2 * 64 // (8 * 2)  # two epochs of a loader sharded in two
        # 0.05 warmed up to 2x over the first epoch's 4 steps, as --nproc's auto_lr
        assert report["lrs"] == pytest.approx([0.0625, 0.075, 0.0875] + [0.1] * 5)
    for key, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][key]), key
    if "no-fabric" in run:  # nanopatch's own engine: the caller hosts the store, on loopback only
        assert ranks[0]["listening"] and all(listening.loopback(a) for a in ranks[0]["listening"]), ranks[0]
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank read its own shard
    main = json.loads((out / "main.json").read_text())
    assert main["equals_rank0"]  # rank 0's result (or, for the Trainer, weights) came back
    if run != "trainer":
        assert main["rank"] == 0 and main["steps"] == 8
    if run.startswith("decorated"):
        assert main["changed"]  # the caller's model holds the trained weights


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """The script in a session of its own (so that a signal to its process group reaches only it)."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, str(out), *args],
        cwd=tmp_path,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, out


def wait_for_ranks(proc: subprocess.Popen, out: Path, timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        paths = [out / "pid0", out / "pid1"]
        if all(p.exists() and p.read_text() for p in paths):
            return [int(p.read_text()) for p in paths]
        if proc.poll() is not None:
            raise AssertionError(f"the script ended early ({proc.returncode}):\n{proc.communicate()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the ranks did not start training")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped by a PID 1 that never reaps does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_gone(pids: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"training processes left behind: {left}"


@pytest.mark.py_only
@pytest.mark.parametrize("run", list(RUNS))
def test_a_failing_rank_reaches_the_caller_with_its_traceback_and_ends_them_all(tmp_path, run):
    needs_lightning(run)
    proc, out = start(tmp_path, *RUNS[run], "--fail")
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode != 0
    # the worker's own traceback: the line that raised in the script, and the exception
    assert 'raise ValueError("rank 1 found a bad batch")' in stderr, stderr
    assert "ValueError: rank 1 found a bad batch" in stderr, stderr
    assert "done" not in stdout
    assert_gone([int((out / f"pid{rank}").read_text()) for rank in (0, 1) if (out / f"pid{rank}").exists()])


@pytest.mark.py_only
@pytest.mark.parametrize(
    ("run", "how"),
    [
        # a rank ends when the script dies: each launcher sets that up in its ranks
        *((run, "script-killed") for run in ("torchnano", "torchnano-no-fabric", "trainer")),
        # the script ends the ranks it started when it is interrupted
        *((run, "sigint-to-the-script") for run in ("torchnano", "torchnano-no-fabric", "trainer")),
        ("torchnano", "ctrl-c"),  # and a terminal's Ctrl-C, which every process gets
    ],
)
def test_no_rank_outlives_ctrl_c_or_the_script(tmp_path, run, how):
    needs_lightning(run)
    proc, out = start(tmp_path, *RUNS[run], "--hang")
    ranks = wait_for_ranks(proc, out)
    if how == "ctrl-c":  # a terminal's Ctrl-C: SIGINT to the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    elif how == "sigint-to-the-script":
        proc.send_signal(signal.SIGINT)
    else:
        proc.kill()
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the script did not end") from None
    assert proc.returncode != 0
    if how != "script-killed":
        assert "KeyboardInterrupt" in stderr, stderr
    assert_gone(ranks)


@pytest.mark.py_only
def test_the_guarded_script_still_works_where_processes_are_spawned(tmp_path):
    """Where fork is unsafe or missing, the processes are spawned (the script needs its guard),
    with one line saying why."""
    out = tmp_path / "out"
    args = ["decorated", "--num-processes", "2", "--no-fabric", "--spawn"]
    ranks = run_rank_script(str(TESTS_DIR / "data" / "nano_loop.py"), out, *args, cwd=tmp_path)
    assert sorted(ranks) == [0, 1] and ranks[0]["shared"] == [] == ranks[1]["shared"]
    main = json.loads((out / "main.json").read_text())
    assert main["returned"]["rank"] == 0 and main["changed"] and main["equals_rank0"]
    printed = (out / "output.txt").read_text()
    assert printed.count("processes are spawned, not forked (as a test asks)") == 1, printed


def test_forking_releases_openmp_so_a_forked_process_can_run_several_threads(tmp_path):
    """GNU libgomp has no fork handler: after the parent ran a parallel region, a forked child's
    first parallel region with two threads hangs, unless the parent's pool was released first."""
    code = """
        import torch, torch.multiprocessing as mp
        from nanopatch.runtime import processes

        def work(rank):
            torch.set_num_threads(2)
            x = torch.randn(512, 512)
            for _ in range(5):
                x = (x @ x).tanh()

        torch.set_num_threads(2)
        x = torch.randn(1024, 1024)
        for _ in range(5):
            x = (x @ x).tanh()  # the parent's OpenMP pool is up
        assert processes.why_not_fork() is None
        with processes.forking():
            mp.start_processes(work, nprocs=2, start_method="fork")
        x @ x  # and the parent's next parallel region starts a pool of its own
        print("forked and back")
    """
    from conftest import run_python

    proc = run_python(code, timeout=120)
    assert proc.returncode == 0 and "forked and back" in proc.stdout, proc.stderr


FAILING_RANKS = """
import multiprocessing.util, os, signal, sys, time
import torch.multiprocessing as mp
from nanopatch.runtime import processes

def work(rank, folder):
    raised = os.path.join(folder, "raised")
    if rank == 1:
        # this rank's process lingers after its exception (as one ending its gloo threads does)
        multiprocessing.util.Finalize(None, time.sleep, args=(3,), exitpriority=0)
        open(raised, "w").close()
        raise ValueError("rank 1 found a bad batch")
    while not os.path.exists(raised):
        time.sleep(0.01)
    time.sleep(0.5)
    if DIES:  # as gloo's threads can make a process die, with no Python exception
        os.kill(os.getpid(), signal.SIGABRT)
    raise RuntimeError("Connection closed by peer")  # what the others' collectives raise after it

if __name__ == "__main__":
    folder, method, block, after = sys.argv[1:]
    DIES = after == "dies"
    try:
        with processes.launching() if block == "launching" else processes.forking():
            mp.start_processes(work, args=(folder,), nprocs=2, start_method=method)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        print("reported", exc.error_index, "ValueError: rank 1 found a bad batch" in str(exc), type(exc).__name__)
    print("start_processes restored", mp.start_processes is sys.modules["torch.multiprocessing.spawn"].start_processes)
"""


@pytest.mark.parametrize(
    ("method", "block", "after", "reported"),
    [
        ("fork", "launching", "raises", 1),
        ("spawn", "launching", "raises", 1),
        # the other rank dies of a signal instead of raising
        ("fork", "launching", "dies", 1),
        # stock's launcher reports the process it sees end first: the one that failed after it
        ("fork", "forking", "raises", 0),
        ("fork", "forking", "dies", 0),
    ],
)
def test_the_caller_sees_the_rank_that_raised_first(tmp_path, method, block, after, reported):
    from conftest import run_python

    script = tmp_path / "ranks.py"
    script.write_text(FAILING_RANKS)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**child_env(), "TMPDIR": str(temp)}
    proc = run_python([str(script), str(tmp_path), method, block, after], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    kind = "ProcessRaisedException" if reported == 1 or after == "raises" else "ProcessExitedException"
    assert f"reported {reported} {reported == 1} {kind}" in proc.stdout, proc.stdout + proc.stderr
    assert "start_processes restored True" in proc.stdout
    assert not [p for p in os.listdir(temp) if p.startswith("nanopatch-")]  # the notes went with the launch


def test_only_launches_release_openmp_before_a_fork(monkeypatch):
    released = []
    monkeypatch.setattr(processes, "release_openmp", lambda: released.append(1))
    processes._before_fork()
    assert released == []  # a DataLoader worker's fork outside a launch costs nothing
    with processes.forking():
        processes._before_fork()
    assert released == [1] and processes._launches == 0


def test_a_rank_ends_only_when_its_launcher_is_gone(monkeypatch):
    """A forked rank whose launcher died before it could ask to be ended with it ends at once;
    one whose launcher is PID 1 (a container's training script) trains, as any other."""
    ended = []
    monkeypatch.setattr(processes.os, "_exit", ended.append)
    monkeypatch.setattr(processes.ctypes, "CDLL", lambda *a, **k: (_ for _ in ()).throw(OSError("no prctl here")))
    monkeypatch.setattr(processes.os, "getppid", lambda: 1)
    monkeypatch.setattr(processes, "_launcher", 1)  # the script is PID 1, and alive
    processes.end_with_parent()
    assert ended == []
    monkeypatch.setattr(processes, "_launcher", 4242)  # the launcher died: reparented to PID 1
    processes.end_with_parent()
    assert ended == [1]
    monkeypatch.setattr(processes, "_launcher", None)  # spawned: nothing inherited to compare with
    processes.end_with_parent()
    assert ended == [1]
