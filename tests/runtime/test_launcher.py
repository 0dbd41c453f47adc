"""The launcher as users run it: runtime tuning of one process, and ``--nproc`` data-parallel
training of a script that knows nothing of torch.distributed (tests/data/dp_train.py)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from nanopatch.foundation import cpu
from nanopatch.runtime import launch, loopback
from nanopatch.runtime import tuning as runtime
from nanopatch.targets.parallel import patch as distributed

from conftest import TESTS_DIR, child_env, run_python
from helpers import listening

SCRIPT = str(TESTS_DIR / "data" / "dp_train.py")
TWO_CORES = len(cpu.host_facts().cores) >= 2


def nanopatch(args, cwd, **env):
    return run_python(["-m", "nanopatch", *args], cwd=cwd, env=child_env(env), timeout=300)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return proc


def load(path):
    return torch.load(path, weights_only=False)


def assert_same_weights(a, b, atol):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=atol, rtol=0), (key, (a[key] - b[key]).abs().max().item())


# --- one process: tuning ----------------------------------------------------------------------

AFFINITY = """
import json, multiprocessing as mp, os, sys


def report(q):
    q.put(sorted(os.sched_getaffinity(0)))


if __name__ == "__main__":
    import torch

    out = {"main": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}
    torch.ones(512, 512) @ torch.ones(512, 512)  # a parallel region: OpenMP's threads are started
    out["after"] = sorted(os.sched_getaffinity(0))
    out["thread_cpus"] = [sorted(os.sched_getaffinity(int(t))) for t in sorted(os.listdir("/proc/self/task"))]
    out["env"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "LD_PRELOAD", "MALLOC_CONF")}
    with open("/proc/self/maps") as f:
        maps = f.read()
    out["jemalloc"] = "jemalloc" in maps
    out["tcmalloc"] = "tcmalloc" in maps
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=report, args=(q,))
        p.start()
        out[method] = q.get()
        p.join()
    print("RESULT " + json.dumps(out))
"""


def result(proc):
    line = next(line for line in ok(proc).stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.py_only  # the processes a launch starts and leaves
def test_tuned_run_sets_threads_pins_them_and_preloads_the_allocator(tmp_path):
    script = tmp_path / "aff.py"
    script.write_text(AFFINITY)
    seen = result(nanopatch([str(script)], cwd=tmp_path))
    allowed = sorted(os.sched_getaffinity(0))
    first_cpus = [core[0] for core in cpu.host_facts().cores]
    cores = len(first_cpus)
    assert seen["env"]["OMP_NUM_THREADS"] == str(cores) and seen["threads"] == cores
    assert seen["env"]["GOMP_CPU_AFFINITY"] == ",".join(map(str, first_cpus))
    # the main thread is OpenMP's thread 0: it stays on the first core, each worker on its own
    assert seen["after"] == first_cpus[:1]
    pinned = sorted(cpus[0] for cpus in seen["thread_cpus"] if len(cpus) == 1)
    assert pinned == first_cpus[: seen["threads"]]
    # processes it starts (DataLoader workers, forked or spawned) get the whole set, and not the pinning
    assert seen["fork"] == allowed and seen["spawn"] == allowed
    tcmalloc = runtime.find_allocator("tcmalloc")  # auto preloads tcmalloc only
    if tcmalloc is not None:  # installed where the suite runs in CI (.ci/run)
        assert seen["tcmalloc"] and seen["env"]["LD_PRELOAD"].endswith(tcmalloc) and not seen["jemalloc"]
    else:
        assert not seen["tcmalloc"] and seen["env"]["LD_PRELOAD"] is None
    jemalloc = runtime.find_allocator("jemalloc")
    if jemalloc is not None:  # installed in CI too
        asked = result(nanopatch(["--allocator", "jemalloc", str(script)], cwd=tmp_path))
        assert asked["jemalloc"] and asked["env"]["LD_PRELOAD"].endswith(jemalloc)
        assert asked["env"]["MALLOC_CONF"] == runtime.JEMALLOC_CONF
        assert asked["fork"] == allowed and asked["spawn"] == allowed
    # --no-tune: nothing set, nothing pinned, nothing preloaded
    plain = result(nanopatch(["--no-tune", str(script)], cwd=tmp_path))
    assert plain["main"] == allowed and not plain["jemalloc"] and not plain["tcmalloc"]
    assert plain["env"] == {"OMP_NUM_THREADS": None, "GOMP_CPU_AFFINITY": None, "LD_PRELOAD": None, "MALLOC_CONF": None}


def test_no_pin_threads_leaves_every_thread_to_the_scheduler(tmp_path):
    script = tmp_path / "aff.py"
    script.write_text(AFFINITY)
    seen = result(nanopatch(["--no-pin-threads", "--allocator", "default", str(script)], cwd=tmp_path))
    allowed = sorted(os.sched_getaffinity(0))
    cores = len(cpu.host_facts().cores)
    assert seen["env"]["OMP_NUM_THREADS"] == str(cores) and seen["env"]["GOMP_CPU_AFFINITY"] is None
    assert seen["main"] == seen["after"] == allowed
    assert len(seen["thread_cpus"]) >= min(cores, 2) and all(cpus == allowed for cpus in seen["thread_cpus"])
    assert seen["fork"] == allowed and seen["spawn"] == allowed


def test_init_prints_exports_that_set_a_shell_up_as_the_runner_would(tmp_path):
    script = tmp_path / "aff.py"
    script.write_text(AFFINITY)
    env = child_env({})
    for name in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "LD_PRELOAD", "MALLOC_CONF"):
        env.pop(name, None)
    shell = f'eval "$({sys.executable} -m nanopatch --init)" && exec {sys.executable} aff.py'
    proc = subprocess.run(["sh", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    seen = result(proc)
    first_cpus = [core[0] for core in cpu.host_facts().cores]
    assert seen["env"]["OMP_NUM_THREADS"] == str(len(first_cpus)) and seen["threads"] == len(first_cpus)
    assert seen["env"]["GOMP_CPU_AFFINITY"] == ",".join(map(str, first_cpus)) and seen["after"] == first_cpus[:1]
    tcmalloc = runtime.find_allocator("tcmalloc")
    assert seen["tcmalloc"] == (tcmalloc is not None)
    # a value already set is kept, and said so
    kept = subprocess.run(
        [sys.executable, "-m", "nanopatch", "--init", "--no-pin-threads"],
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert kept.returncode == 0, kept.stderr
    assert "# OMP_NUM_THREADS=1: set by you" in kept.stdout and "export OMP_NUM_THREADS" not in kept.stdout
    assert "GOMP_CPU_AFFINITY=" not in kept.stdout
    for wrong in (["--init", "train.py"], ["--init", "--nproc", "2"], ["--init", "--no-tune"]):
        bad = subprocess.run([sys.executable, "-m", "nanopatch", *wrong], env=env, capture_output=True, text=True)
        assert bad.returncode == 2 and "--init takes no script" in bad.stderr


def test_values_the_user_set_are_kept(tmp_path):
    script = tmp_path / "aff.py"
    script.write_text(AFFINITY)
    seen = result(nanopatch(["--allocator", "default", str(script)], cwd=tmp_path, OMP_NUM_THREADS="1"))
    assert seen["env"]["OMP_NUM_THREADS"] == "1" and seen["threads"] == 1
    assert seen["env"]["LD_PRELOAD"] is None and not seen["jemalloc"] and not seen["tcmalloc"]


@pytest.mark.py_only  # the processes a launch starts and leaves
def test_info_shows_the_plan_for_one_process_and_for_several(tmp_path):
    one = ok(nanopatch(["--info", "--allocator", "default"], cwd=tmp_path)).stdout
    assert "Runtime tuning" in one and "OMP_NUM_THREADS" in one and "physical core(s)" in one
    data = json.loads(ok(nanopatch(["--info", "--json", "--nproc", "1"], cwd=tmp_path)).stdout)
    assert data["tuning"]["processes"][0].startswith("CPUs ")
    measured = ok(nanopatch(["--info", "--nproc", "measure"], cwd=tmp_path)).stdout
    assert "processes (--nproc measure)" in measured and "timed at the start with 1" in measured
    bad = nanopatch(["--info", "--nproc", "999"], cwd=tmp_path)
    assert bad.returncode == 2 and "999 processes need at least 999 physical cores" in bad.stderr


def test_torchrun_gets_the_multi_node_options_unchanged():
    parser = argparse.ArgumentParser()
    launch.add_options(parser)
    opts = parser.parse_args(
        ["--nproc", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29400"]
    )
    argv = launch.torchrun_argv(opts, [(0, 1), (2, 3)], ["train.py", "--epochs", "3"])
    assert "--standalone" not in argv
    for pair in (["--nnodes", "2"], ["--node-rank", "1"], ["--master-addr", "10.0.0.1"], ["--master-port", "29400"]):
        i = argv.index(pair[0])
        assert argv[i : i + 2] == pair
    assert argv[-8:] == ["-m", "nanopatch", "--rank-worker", "--rank-cpus", "0-1;2-3", "train.py", "--epochs", "3"]
    single = launch.torchrun_argv(parser.parse_args(["--nproc", "2"]), [(0,), (1,)], ["-m", "pkg"])
    assert loopback.BACKEND in single and single[-2:] == ["-m", "pkg"]


def test_learning_rate_warm_up():
    factors = [distributed.lr_factor(step, 4, 8) for step in range(10)]
    assert factors[0] == pytest.approx(1 + 3 / 8) and factors[7:] == [4.0, 4.0, 4.0]
    assert all(a < b for a, b in itertools.pairwise(factors[:8]))
    assert distributed.lr_factor(0, 1, 8) == 1.0


# --- several processes --------------------------------------------------------------------------

needs_two = pytest.mark.skipif(not TWO_CORES, reason="needs 2 physical cores")


def dp_run(tmp_path, runner_args, script_args=(), name="dp"):
    out = tmp_path / name
    out.mkdir()
    proc = nanopatch([*runner_args, SCRIPT, "--out", str(out), *script_args], cwd=tmp_path)
    return proc, out


def reference(tmp_path, script_args=(), name="ref"):
    out = tmp_path / name
    out.mkdir()
    ok(run_python([SCRIPT, "--out", str(out), *script_args], cwd=tmp_path, env=child_env()))
    return load(out / "single.pt")


@needs_two
def test_two_processes_match_one_process_with_the_doubled_batch(tmp_path):
    proc, out = dp_run(tmp_path, ["--nproc", "2", "--no-auto-lr", "--no-bf16"], ["--batch", "4"])
    ok(proc)
    ranks = [load(out / "0.pt"), load(out / "1.pt")]
    # only rank 0 prints
    assert "hello from rank 0" in proc.stdout and "hello from rank 1" not in proc.stdout
    # each process pinned to its own core, one OpenMP thread each
    assert ranks[0]["cpus"] != ranks[1]["cpus"] and not set(ranks[0]["cpus"]) & set(ranks[1]["cpus"])
    assert ranks[0]["threads"] == ranks[1]["threads"] == 1
    # the training loader is sharded (in order here, as the loader asked): disjoint halves
    assert all(r["sampler"] == "EpochDistributedSampler" and r["batches"] == 8 for r in ranks)
    for epoch in range(2):
        a, b = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert len(a) == len(b) == 32 and not set(a) & set(b) and sorted(a + b) == list(range(64))
    # the validation loader is not: every process sees all of it
    assert ranks[0]["val"] == ranks[1]["val"] == list(range(20)) * 2
    assert ranks[0]["status"]["models"] == 1 and ranks[0]["status"]["world_size"] == 2
    # same weights as one process with the doubled batch (the unused layer included)
    ref = reference(tmp_path, ["--batch", "8"])
    assert_same_weights(ranks[0]["state"], ranks[1]["state"], atol=0)
    assert_same_weights(ranks[0]["state"], ref["state"], atol=1e-6)
    # with bf16 (the default here when the CPU has it) within bf16 tolerance; on a CPU without
    # native bf16 that run would be the one above again
    if not cpu.host_facts().native_bf16:
        return
    proc, bf16 = dp_run(tmp_path, ["--nproc", "2", "--no-auto-lr"], ["--batch", "4"], name="bf16")
    ok(proc)
    assert_same_weights(load(bf16 / "0.pt")["state"], ref["state"], atol=2e-2)


@needs_two
def test_auto_lr_scales_the_step_by_the_world_size_after_a_warm_up(tmp_path):
    proc, out = dp_run(tmp_path, ["--nproc", "2", "--no-bf16"], ["--batch", "4"])
    ok(proc)
    ranks = [load(out / "0.pt"), load(out / "1.pt")]
    assert ranks[0]["lrs"] == [pytest.approx(0.1)]  # the script's param_groups keep its own value
    warmup = ranks[0]["status"]["warmup_steps"]
    assert warmup == 8  # one epoch of the sharded loader
    # one process with the doubled batch whose script sets the scaled learning rates by hand
    factors = ",".join(repr(distributed.lr_factor(i, 2, warmup)) for i in range(ranks[0]["steps"]))
    ref = reference(tmp_path, ["--batch", "8", "--lr-factors", factors])
    assert_same_weights(ranks[0]["state"], ranks[1]["state"], atol=0)
    assert_same_weights(ranks[0]["state"], ref["state"], atol=1e-6)


@needs_two
def test_a_shuffling_loader_is_sharded_with_a_new_shuffle_each_epoch(tmp_path):
    proc, out = dp_run(tmp_path, ["--nproc", "2", "--no-bf16"], ["--batch", "4", "--shuffle"])
    ok(proc)
    ranks = [load(out / "0.pt"), load(out / "1.pt")]
    for epoch in range(2):
        a, b = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert sorted(a + b) == list(range(64)) and a != sorted(a)
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]
    assert_same_weights(ranks[0]["state"], ranks[1]["state"], atol=0)


@needs_two
def test_a_script_doing_its_own_ddp_is_left_alone(tmp_path):
    proc, out = dp_run(tmp_path, ["--nproc", "2", "--no-bf16"], ["--batch", "4", "--own-ddp"])
    ok(proc)
    ranks = [load(out / "0.pt"), load(out / "1.pt")]
    assert ranks[0]["sampler"] == "DistributedSampler" and ranks[0]["status"]["models"] == 0
    assert "init_process_group" in ranks[0]["status"]["self_managed"] or "own" in ranks[0]["status"]["self_managed"]
    assert ranks[0]["lrs"] == [pytest.approx(0.1)]
    assert_same_weights(ranks[0]["state"], ranks[1]["state"], atol=0)
    ref = reference(tmp_path, ["--batch", "8"])
    assert_same_weights(ranks[0]["state"], ref["state"], atol=1e-6)  # its DDP, no auto-LR of ours


@pytest.mark.py_only  # the processes a launch starts and leaves
@needs_two
@pytest.mark.skipif(not cpu.host_facts().native_bf16, reason="bf16 is not nanopatch's choice here: nothing to measure")
@pytest.mark.parametrize("own_ddp", [False, True], ids=["nanopatchs-ddp", "the-scripts-ddp"])
def test_every_rank_measures_the_same_and_decides_the_same(tmp_path, own_ddp):
    """bf16 against fp32 is measured on every rank, from the slowest rank's step times: each
    rank records the same figures and keeps the same choice (measured apart, the two ranks of
    one run kept bf16 on one and fp32 on the other, each with its own figures). Under
    nanopatch's own DDP channels-last is measured too, before DDP wraps the model; in the
    script's own, inside it (its gradient buckets laid out again at each switch)."""
    out = tmp_path / "out"
    out.mkdir()
    script = str(TESTS_DIR / "data" / "dp_trial.py")
    ok(nanopatch(["--nproc", "2", script, "--out", str(out), *(["--own-ddp"] if own_ddp else [])], cwd=tmp_path))
    ranks = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert len(ranks[0]) == 1 and ranks[0][0]["data_parallel"] is not own_ddp
    measured = ranks[0][0]["bf16_measured"]
    assert measured.startswith(("kept: measured", "off: ")) and "ms per step" in measured
    assert ranks[0] == ranks[1]
    weights = [load(out / f"{rank}.pt") for rank in (0, 1)]
    assert_same_weights(weights[0], weights[1], atol=0)
    layout = ranks[0][0]["channels_last_measured"]
    chosen = ranks[0][0]["channels_last"] == "channels_last"
    assert ranks[0][0]["weights_channels_last"] == [chosen, chosen]  # weights and momentum as decided
    if "channels-last" in " ".join(ranks[0][0]["notes"]):
        # nanopatch chose channels-last (AVX2 and up): measured first, its DDP wrapped after
        assert layout.startswith(("kept: measured", "off: ")), layout
        notes = ranks[0][0]["notes"]
        if not own_ddp:
            assert notes[-1] == "data-parallel: DistributedDataParallel over 2 processes"
            assert any(n.startswith("data-parallel over 2 processes: gradients averaged") for n in notes)
    else:
        assert layout is None


@pytest.mark.py_only  # the processes a launch starts and leaves
@needs_two
@pytest.mark.parametrize("own_ddp", [False, True], ids=["nanopatchs-ddp", "the-scripts-ddp"])
@pytest.mark.parametrize("slower", ["channels-last", "stock-layout"])
def test_nproc_measures_channels_last_in_data_parallel_training(tmp_path, slower, own_ddp):
    """Under ``--nproc`` the layout is measured (one layout made 30 ms a step slower here):
    nanopatch's DDP waits for the decision and wraps the model after; a script's own DDP has
    its gradient buckets laid out again at each switch (torch warns, "Grad strides do not match
    bucket view strides", and misplaces the averaged gradients' elements: made an error here). Every
    rank keeps the faster layout, the weights and the optimizer's state in it, and the ranks
    end with equal weights."""
    if not cpu.host_facts().avx2:
        pytest.skip("channels-last is not nanopatch's choice on this CPU")
    out = tmp_path / "out"
    out.mkdir()
    script = str(TESTS_DIR / "data" / "dp_trial.py")
    args = ["--nproc", "2", "--no-bf16", script, "--out", str(out), "--slower", slower]
    warnings = "error:Grad strides do not match bucket view strides:UserWarning"
    ok(nanopatch(args + (["--own-ddp"] if own_ddp else []), cwd=tmp_path, PYTHONWARNINGS=warnings))
    ranks = [json.loads((out / f"{rank}.json").read_text())[0] for rank in (0, 1)]
    assert ranks[0] == ranks[1]
    kept = slower == "stock-layout"
    assert ranks[0]["channels_last_measured"].startswith("kept: " if kept else "off: ")
    assert ranks[0]["weights_channels_last"] == [kept, kept]
    assert ranks[0]["data_parallel"] is not own_ddp
    if not own_ddp:
        assert ranks[0]["notes"][-1] == "data-parallel: DistributedDataParallel over 2 processes"
    weights = [load(out / f"{rank}.pt") for rank in (0, 1)]
    assert_same_weights(weights[0], weights[1], atol=0)


@pytest.mark.py_only  # the processes a launch starts and leaves
@needs_two
@pytest.mark.parametrize("own_ddp", [False, True], ids=["nanopatchs-ddp", "the-scripts-ddp"])
@pytest.mark.parametrize("fails", [False, True], ids=["compiles", "fails-on-rank-1"])
def test_compile_auto_is_decided_alike_on_every_rank(tmp_path, own_ddp, fails):
    """``compile="auto"`` under data-parallel training (told to try compiling after 3 eager
    steps): every rank compiles at the same step, times the steps as the slowest rank's and
    keeps the same forward; a compile that fails on rank 1 ends every rank's trial at the same
    step with eager (ended on rank 1 alone, it would leave rank 0 waiting in the all-reduce)."""
    out = tmp_path / "out"
    out.mkdir()
    script = str(TESTS_DIR / "data" / "dp_trial.py")
    args = ["--nproc", "2", "--compile=auto", script, "--out", str(out), "--compile-soon"]
    args += (["--own-ddp"] if own_ddp else []) + (["--compile-fails"] if fails else [])
    ok(nanopatch(args, cwd=tmp_path, NANOPATCH_CACHE_DIR=str(tmp_path / "cache")))
    ranks = [json.loads((out / f"{rank}.json").read_text())[0] for rank in (0, 1)]
    choices = [rank["compile_choice"] for rank in ranks]
    if fails:
        assert choices == [
            "eager: torch.compile failed on another rank",
            "eager: torch.compile failed (RuntimeError: this rank's compiler is broken)",
        ]
    else:
        assert choices[0] == choices[1] and choices[0].startswith(("compiled: measured", "eager: ")), choices
        assert "to compile" in choices[0]  # it compiled, and measured
    weights = [load(out / f"{rank}.pt") for rank in (0, 1)]
    assert_same_weights(weights[0], weights[1], atol=0)


@pytest.mark.py_only  # the processes a launch starts and leaves
@needs_two
def test_a_rank_that_raises_stops_every_rank_with_its_traceback(tmp_path):
    proc, _ = dp_run(tmp_path, ["--nproc", "2", "--all-ranks-print"], ["--fail-rank", "1"])
    assert proc.returncode == 1
    assert "rank 1 of 2 failed with exit code 1" in proc.stderr
    assert 'raise ValueError(f"rank {rank} is broken")' in proc.stderr and "ValueError: rank 1 is broken" in proc.stderr
    assert "nanopatch/runner/cli.py" not in proc.stderr  # the script's frames, as plain python shows them
    assert "hello from rank 0" in proc.stdout and "hello from rank 1" in proc.stdout  # --all-ranks-print
    exits, _ = dp_run(tmp_path, ["--nproc", "2"], ["--fail-rank", "0", "--exit-code", "3"], name="exit")
    assert exits.returncode == 3 and "rank 0 of 2 failed with exit code 3" in exits.stderr


def test_the_first_rank_to_fail_is_named_though_the_others_fail_in_the_same_poll(tmp_path, monkeypatch, capsys):
    """Rank 0 ends with ``sys.exit(3)``; rank 1 fails in its next collective a moment later and
    records that error. The agent can see both exits in one poll: the launcher names rank 0,
    from its own (empty) record written before it ended, with its exit code, and prints rank 1's
    error nowhere."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    files = {rank: tmp_path / f"error{rank}.json" for rank in (0, 1)}
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(files[0]))
    launch.record_exit()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(files[1]))
    try:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:29500")
    except RuntimeError as exc:
        launch.record_failure(exc, skip_file="")
    os.utime(files[0], ns=(1, 1))  # written first, whatever the file system's clock resolution
    exits = {1: 1, 0: 3}  # in the order the agent may list them
    failures = {rank: ProcessFailure(rank, 100 + rank, code, str(files[rank])) for rank, code in exits.items()}
    code = launch.report_failure(ChildFailedError("script", failures), world=2)
    err = capsys.readouterr().err
    assert code == 3 and "rank 0 of 2 failed with exit code 3" in err
    assert "Connection closed" not in err and "To enable traceback" not in err
    # a rank's exception, recorded, is printed with its traceback
    failures = {1: ProcessFailure(local_rank=1, pid=101, exitcode=1, error_file=str(files[1]))}
    assert launch.report_failure(ChildFailedError("script", failures), world=2) == 1
    err = capsys.readouterr().err
    assert "rank 1 of 2 failed with exit code 1" in err and "RuntimeError: Connection closed by peer" in err
    assert "Traceback" in err


@pytest.mark.py_only  # the processes a launch starts and leaves
@needs_two
def test_a_rank_that_ends_with_sys_exit_tears_its_group_down(tmp_path):
    """``sys.exit(main())`` ends most scripts: the rank's process group is torn down as after a
    script that returns, not left to the interpreter's shutdown (where gloo can abort the
    process with SIGABRT after its last epoch)."""
    proc, out = dp_run(tmp_path, ["--nproc", "2", "--no-bf16"], ["--sys-exit"])
    ok(proc)
    assert {(out / f"{rank}.exit").read_text() for rank in (0, 1)} == {"down"}
    assert "final loss" in proc.stdout and "Signal" not in proc.stderr


def _named_thread(name, busy_for, stop):
    """A thread the OS knows as ``name`` that keeps a CPU busy for ``busy_for`` seconds (its state
    R), then sleeps (S) until ``stop`` is set."""
    import ctypes
    import hashlib
    import threading
    import time

    block = bytes(1 << 22)
    named = threading.Event()

    def run():
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME, as c10::setThreadName
        named.set()
        end = time.monotonic() + busy_for
        while time.monotonic() < end and not stop.is_set():
            hashlib.sha256(block)  # busy without the GIL, as a worker in C++ is
        stop.wait()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    named.wait()
    return thread


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and states from /proc")
def test_a_rank_waits_for_gloos_workers_to_go_idle_before_it_ends():
    """A gloo worker destroys its last collective just after the caller's wait returned; where
    that collective ran in a backward, the destruction needs the GIL, and a worker that still
    does it when the interpreter finalises aborts the process (SIGABRT after the last epoch, a
    few runs in a hundred for a pinned rank). ``settle_gloo`` waits, without the GIL, until every
    thread named as torch names gloo's workers sleeps, and no longer than its timeout."""
    import threading
    import time

    assert launch._thread_states("pt_gloo_runloop") == []
    started = time.monotonic()
    launch.settle_gloo()  # no gloo worker: no wait
    assert time.monotonic() - started < 0.5
    stop = threading.Event()
    try:
        thread = _named_thread("pt_gloo_runloop", busy_for=0.3, stop=stop)
        assert launch._thread_states("pt_gloo_runloop") in (["R"], ["S"])  # S: between two blocks
        started = time.monotonic()
        launch.settle_gloo(timeout=10)
        waited = time.monotonic() - started
        assert 0.2 < waited < 5, waited  # until the worker slept, not the timeout
        assert launch._thread_states("pt_gloo_runloop") == ["S"]
    finally:
        stop.set()
        thread.join()
    stop = threading.Event()
    try:
        thread = _named_thread("pt_gloo_runloop", busy_for=60, stop=stop)
        started = time.monotonic()
        launch.settle_gloo(timeout=0.3)  # a worker that never sleeps: bounded
        assert 0.25 < time.monotonic() - started < 3
    finally:
        stop.set()
        thread.join()


def test_every_way_a_rank_ends_waits_for_gloo_to_settle(monkeypatch):
    from nanopatch.runner import cli

    calls = []
    monkeypatch.setattr(distributed, "start", lambda: None)
    monkeypatch.setattr(distributed, "finish", lambda: calls.append("finish"))
    monkeypatch.setattr(launch, "settle_gloo", lambda: calls.append("settle"))
    monkeypatch.setattr(launch, "record_exit", lambda: calls.append("record_exit"))
    monkeypatch.setattr(launch, "record_failure", lambda exc, skip_file: calls.append("record_failure"))

    def ends(how):
        def run_target(kind, target, script_args):
            if isinstance(how, BaseException):
                raise how
            return how

        return run_target

    for how, code, expected in (
        (0, 0, ["finish", "settle"]),
        (ValueError("broken"), 1, ["record_failure", "settle"]),
        (SystemExit(0), SystemExit, ["finish", "settle"]),
        (SystemExit(3), SystemExit, ["record_exit", "settle"]),
        (KeyboardInterrupt(), KeyboardInterrupt, ["settle"]),
    ):
        calls.clear()
        monkeypatch.setattr(cli, "_run_target", ends(how))
        if isinstance(code, type):
            with pytest.raises(code):
                cli._run_rank("script", "train.py", [])
        else:
            assert cli._run_rank("script", "train.py", []) == code
        assert calls == expected, (how, calls)


@pytest.mark.py_only  # the processes a launch starts and leaves
@needs_two
def test_a_one_machine_job_listens_on_loopback_only(tmp_path):
    """torchrun's --standalone store listened on every interface, and gloo on the address the
    host name resolves to: a job of one machine took connections from the network. Rank 0
    reads every listening socket of the launcher and its ranks while the group is up."""
    proc, out = dp_run(tmp_path, ["--nproc", "2", "--no-bf16"], ["--report-listening"])
    ok(proc)
    seen = json.loads((out / "listening.json").read_text())
    assert len(seen["pids"]) >= 3, seen  # the launcher and both ranks
    assert seen["listening"], seen  # the rendezvous store at least
    assert all(listening.loopback(address) for address in seen["listening"]), seen


def test_the_one_machine_rendezvous_is_loopbacks():
    parser = argparse.ArgumentParser()
    launch.add_options(parser)
    argv = launch.torchrun_argv(parser.parse_args(["--nproc", "2"]), [(0,), (1,)], ["t.py"])
    i = argv.index("--rdzv-backend")
    assert argv[i + 1] == loopback.BACKEND and argv[argv.index("--rdzv-endpoint") + 1] == "127.0.0.1"
    store = loopback.host_store(1, 30)
    assert all(listening.loopback(a) for a in listening.listening({os.getpid()}) if a.endswith(f":{store.port}"))
    assert any(a.endswith(f":{store.port}") for a in listening.listening({os.getpid()}))


def test_bad_launcher_arguments(tmp_path):
    for args, message in (
        (["--nproc", "0"], "give a number of processes (at least 1), 'auto' or 'measure'"),
        (["--nproc", "many"], "give a number of processes (at least 1), 'auto' or 'measure'"),
        (["--nproc", "measure", "--cpus", "0"], "--nproc measure chooses the count on this machine"),
        (["--cpus", "0-1,x"], "not a CPU list"),
    ):
        proc = nanopatch([*args, SCRIPT], cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
