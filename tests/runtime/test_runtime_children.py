"""Scripts that start their own processes under ``python -m nanopatch``: each worker gets its
share of the runner's threads (never all of them: 2 processes x 2 threads on 2 cores would be
oversubscribed), no worker is pinned onto another's CPUs, and a value the user set is kept.

The scripts (tests/data/rt_*.py) report, per process, ``torch.get_num_threads()``, the CPU
affinity and the OpenMP variables it saw."""

from __future__ import annotations

import json
import os

import pytest

from nanopatch.foundation import cpu

from conftest import TESTS_DIR, child_env, run_python

DATA = TESTS_DIR / "data"
RUNNER_THREADS = len(cpu.host_facts().cores)  # what the runner sets on a machine without a CPU quota
SHARE = max(1, RUNNER_THREADS // 2)


def run(script, tmp_path, *runner_args, **env):
    out = tmp_path / "out"
    out.mkdir()
    proc = run_python(
        ["-m", "nanopatch", *runner_args, str(DATA / script), str(out)], cwd=tmp_path, env=child_env(env), timeout=240
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    reports = [json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return {r["name"]: r for r in reports}


def assert_unpinned(report):
    """Every CPU, and no OpenMP pinning inherited from the runner."""
    assert report["affinity"] == sorted(os.sched_getaffinity(0)), report
    assert report["env"]["GOMP_CPU_AFFINITY"] is None and report["env"]["KMP_AFFINITY"] is None, report


pytestmark = [
    pytest.mark.skipif(cpu.host_facts().cpu_quota is not None, reason="expectations assume no CPU quota"),
    pytest.mark.py_only,  # the cores of the processes a script starts: tox's py env runs these (tox.ini)
]


@pytest.mark.parametrize("runner_args", [(), ("--no-pin-threads",)], ids=["pinned", "unpinned"])
def test_torch_multiprocessing_spawn_children_share_the_cores(tmp_path, runner_args):
    seen = run("rt_spawn_children.py", tmp_path, *runner_args)
    assert seen["parent"]["threads"] == RUNNER_THREADS
    for name in ("child0", "child1"):
        assert seen[name]["threads"] == SHARE and seen[name]["env"]["OMP_NUM_THREADS"] == str(SHARE), seen[name]
        assert_unpinned(seen[name])


def test_spawn_children_keep_a_thread_count_the_user_set(tmp_path):
    seen = run("rt_spawn_children.py", tmp_path, OMP_NUM_THREADS=str(RUNNER_THREADS))
    for name in ("child0", "child1"):
        assert seen[name]["threads"] == RUNNER_THREADS and seen[name]["env"]["OMP_NUM_THREADS"] == str(RUNNER_THREADS)


def test_lightning_ddp_ranks_share_the_cores(tmp_path):
    pytest.importorskip("lightning")
    seen = run("rt_lightning_ddp.py", tmp_path)
    assert seen["rank0"]["pid"] == seen["script"]["pid"]  # rank 0 is the script's own process
    assert seen["rank1"]["pid"] != seen["script"]["pid"]
    for name in ("rank0", "rank1"):
        assert seen[name]["threads"] == SHARE and seen[name]["env"]["OMP_NUM_THREADS"] == str(SHARE), seen[name]
    assert_unpinned(seen["rank1"])


def test_workers_of_a_torchrun_the_script_starts_share_the_cores(tmp_path):
    seen = run("rt_torchrun_children.py", tmp_path)
    assert seen["script"]["env"]["OMP_NUM_THREADS"] == str(RUNNER_THREADS)
    for name in ("rank0", "rank1"):
        assert seen[name]["threads"] == SHARE and seen[name]["env"]["OMP_NUM_THREADS"] == str(SHARE), seen[name]
        assert_unpinned(seen[name])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: the pinned main thread's and another")
def test_processes_started_through_subprocess_get_the_runs_cpus_and_a_mask_of_their_own_is_kept(tmp_path):
    """The runner pins the script's main thread to one CPU, and ``subprocess`` never runs
    at-fork handlers: a program that is no Python, or a ``python -I`` (no bootstrap), started
    on that one CPU with the runner's OpenMP pinning and thread count (``Cpus_allowed_list:
    0``). Now each starts on the run's CPUs without the runner's OpenMP and allocator variables;
    a child under ``taskset`` keeps its own mask (the bootstrap widened it to the run's); a
    bootstrapped Python still gets the run's tuning, and is patched."""
    seen = run("rt_other_children.py", tmp_path)
    everything = sorted(os.sched_getaffinity(0))
    assert len(cpu.parse_cpu_list(seen["script"]["cpus"])) == 1  # the pinned main thread these start from
    for name in ("sh", "isolated"):
        assert list(cpu.parse_cpu_list(seen[name]["cpus"])) == everything, seen[name]
        unset = "<unset>" if name == "sh" else None
        for variable in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "NANOPATCH_TUNED"):
            assert seen[name]["env"][variable] == unset, (name, variable, seen[name])
        assert "malloc" not in str(seen[name]["env"]["LD_PRELOAD"]), seen[name]
    assert list(cpu.parse_cpu_list(seen["taskset"]["cpus"])) == [everything[-1]], seen["taskset"]
    assert list(cpu.parse_cpu_list(seen["python"]["cpus"])) == everything, seen["python"]
    assert seen["python"]["env"]["OMP_NUM_THREADS"] == str(RUNNER_THREADS) and seen["python"]["patched"] is True
