"""Runtime tuning: threads, OpenMP affinity and allocator worked out for fixture CPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from nanopatch.foundation import cpu
from nanopatch.runtime import tuning as runtime

from conftest import TESTS_DIR

FIXTURES = TESTS_DIR / "fixtures" / "cpu"


def big_xeon_cpuinfo(path: Path) -> Path:
    """A 2-socket, 56-core, 112-thread Sapphire Rapids: cpus 0-27 socket 0, 28-55 socket 1,
    56-111 their hyperthread siblings in the same order (the kernel's numbering)."""
    block = (FIXTURES / "xeon_spr_2s_ht.cpuinfo").read_text().split("\n\n")[0]
    blocks = []
    for number in range(112):
        core = number % 56
        socket, core_id = divmod(core, 28)
        text = re.sub(r"^processor\t: \d+", f"processor\t: {number}", block, flags=re.M)
        text = re.sub(r"^physical id\t: \d+", f"physical id\t: {socket}", text, flags=re.M)
        text = re.sub(r"^core id\t\t: \d+", f"core id\t\t: {core_id}", text, flags=re.M)
        blocks.append(text)
    path.write_text("\n\n".join(blocks) + "\n\n")
    return path


def facts(tmp_path, name="epyc_zen4_2c_vm.cpuinfo", allowed=(0, 1), quota=None, cpuinfo=None):
    root = tmp_path / "cgroup"
    root.mkdir(exist_ok=True)
    if quota is not None:
        (root / "cpu.max").write_text(f"{int(quota * 100000)} 100000\n")
    proc = tmp_path / "self_cgroup"
    proc.write_text("0::/\n")
    return cpu.facts(str(cpuinfo or FIXTURES / name), str(proc), str(root), allowed=allowed)


def no_allocator(name):
    return None


def setting(plan, name):
    return next(s for s in plan.settings if s.name == name)


def test_two_core_vm(tmp_path):
    p = runtime.plan(facts(tmp_path), {}, "gnu", finder=no_allocator)
    assert p.changes() == {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "0,1"}
    assert p.threads == 2 and p.cpus == (0, 1) and not p.needs_reexec
    assert "no tcmalloc library found" in setting(p, "LD_PRELOAD").reason


@pytest.mark.parametrize("openmp", ["gnu", "intel"])
def test_openmp_threads_are_left_to_the_scheduler_when_asked(tmp_path, openmp):
    """--no-pin-threads: affinity is the scheduler's, as in stock torch."""
    p = runtime.plan(facts(tmp_path), {}, openmp, finder=no_allocator, pin=False)
    assert not set(p.changes()) & set(runtime.PIN_VARIABLES) and p.cpus == ()
    assert "not pinned" in setting(p, "GOMP_CPU_AFFINITY" if openmp == "gnu" else "KMP_AFFINITY").reason
    assert ("KMP_BLOCKTIME" in p.changes()) == (openmp == "intel")


def test_an_openmp_runtime_without_affinity_variables_is_left_alone(tmp_path):
    """LLVM's OpenMP (or one not recognised): no affinity variable is set, pinned or not."""
    for pin in (True, False):
        p = runtime.plan(facts(tmp_path), {}, "llvm", finder=no_allocator, pin=pin)
        assert p.changes() == {"OMP_NUM_THREADS": "2"}
        assert setting(p, "OMP_PROC_BIND").reason == "OpenMP runtime llvm: affinity left alone"


def test_56_cores_on_2_sockets_with_hyperthreads(tmp_path):
    info = big_xeon_cpuinfo(tmp_path / "spr112.cpuinfo")
    f = facts(tmp_path, cpuinfo=info, allowed=range(112))
    assert f.physical_cores == 56 and len(f.cores) == 56 and f.cores[0] == (0, 56)
    p = runtime.plan(f, {}, "gnu", finder=no_allocator, pin=True)
    assert p.changes()["OMP_NUM_THREADS"] == "56"
    assert p.changes()["GOMP_CPU_AFFINITY"] == ",".join(str(c) for c in range(56))  # no HT siblings
    intel = runtime.plan(f, {}, "intel", finder=no_allocator, pin=True)
    assert intel.changes() == {
        "OMP_NUM_THREADS": "56",
        "KMP_AFFINITY": runtime.KMP_AFFINITY,
        "KMP_BLOCKTIME": "1",
    }
    # one process's share: the second socket's cores
    cpus = list(range(28, 56)) + list(range(84, 112))
    half = runtime.plan(f, {}, "gnu", cpus=cpus, finder=no_allocator, pin=True)
    assert half.changes()["OMP_NUM_THREADS"] == "28" and half.cpus == tuple(range(28, 56))
    assert runtime.plan(f, {}, "gnu", cpus=cpus, finder=no_allocator, pin=False).changes() == {"OMP_NUM_THREADS": "28"}


def test_cgroup_quota_of_3_5_cpus(tmp_path):
    info = big_xeon_cpuinfo(tmp_path / "spr112.cpuinfo")
    f = facts(tmp_path, cpuinfo=info, allowed=range(112), quota=3.5)
    assert f.cpu_quota == 3.5
    p = runtime.plan(f, {}, "gnu", finder=no_allocator, pin=True)
    assert p.changes() == {"OMP_NUM_THREADS": "3"}  # rounded down, and not pinned even when asked
    assert "quota of 3.5" in setting(p, "OMP_NUM_THREADS").reason
    assert p.cpus == () and "not pinned" in setting(p, "GOMP_CPU_AFFINITY").reason


def test_affinity_mask_0_2_4(tmp_path):
    f = facts(tmp_path, name="xeon_spr_2s_ht.cpuinfo", allowed=(0, 2, 4))
    p = runtime.plan(f, {}, "gnu", finder=no_allocator, pin=True)
    assert p.changes() == {"OMP_NUM_THREADS": "3", "GOMP_CPU_AFFINITY": "0,2,4"}
    # 0 and 8 are siblings on that machine: one core, one thread
    siblings = runtime.plan(
        facts(tmp_path, name="xeon_spr_2s_ht.cpuinfo", allowed=(0, 8)), {}, "gnu", finder=no_allocator, pin=True
    )
    assert siblings.changes() == {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "0"}


def test_values_the_user_set_are_kept_and_reported(tmp_path):
    env = {"OMP_NUM_THREADS": "7", "GOMP_CPU_AFFINITY": "1", "MALLOC_CONF": "narenas:1"}
    p = runtime.plan(
        facts(tmp_path), env, "gnu", allocator="jemalloc", finder=lambda name: "/opt/lib/libjemalloc.so.2", pin=True
    )
    assert setting(p, "OMP_NUM_THREADS").kept == "7" and "set by you" in setting(p, "OMP_NUM_THREADS").reason
    assert "OMP_NUM_THREADS" not in p.changes() and "GOMP_CPU_AFFINITY" not in p.changes()
    assert "MALLOC_CONF" not in p.changes() and setting(p, "MALLOC_CONF").kept == "narenas:1"
    assert p.changes()["LD_PRELOAD"] == "/opt/lib/libjemalloc.so.2"


def test_allocator_is_appended_to_ld_preload_never_replacing_it(tmp_path):
    env = {"LD_PRELOAD": "/usr/lib/libmine.so"}
    p = runtime.plan(facts(tmp_path), env, "gnu", allocator="jemalloc", finder=lambda name: f"/lib/lib{name}.so")
    assert p.changes()["LD_PRELOAD"] == "/usr/lib/libmine.so:/lib/libjemalloc.so"
    assert p.changes()["MALLOC_CONF"] == runtime.JEMALLOC_CONF
    assert p.needs_reexec and p.allocator == "/lib/libjemalloc.so"
    again = runtime.plan(
        facts(tmp_path),
        {"LD_PRELOAD": p.changes()["LD_PRELOAD"]},
        "gnu",
        allocator="jemalloc",
        finder=lambda n: f"/lib/lib{n}.so",
    )
    assert "LD_PRELOAD" not in again.changes() and not again.needs_reexec  # once, not twice


@pytest.mark.parametrize(
    ("choice", "libraries", "expected"),
    [
        ("auto", {"jemalloc": "/j.so", "tcmalloc": "/t.so"}, "/t.so"),
        ("auto", {"jemalloc": "/j.so"}, None),  # measured slower than glibc here: only when asked for
        ("jemalloc", {"jemalloc": "/j.so", "tcmalloc": "/t.so"}, "/j.so"),
        ("tcmalloc", {"jemalloc": "/j.so", "tcmalloc": "/t.so"}, "/t.so"),
        ("jemalloc", {"tcmalloc": "/t.so"}, None),
        ("default", {"jemalloc": "/j.so"}, None),
    ],
)
def test_allocator_choice(tmp_path, choice, libraries, expected):
    p = runtime.plan(facts(tmp_path), {}, "gnu", allocator=choice, finder=libraries.get)
    assert p.allocator == expected
    assert ("MALLOC_CONF" in p.changes()) == (expected == "/j.so")


def test_bad_allocator_name(tmp_path):
    with pytest.raises(ValueError, match="allocator 'mimalloc'"):
        runtime.plan(facts(tmp_path), {}, "gnu", allocator="mimalloc", finder=no_allocator)


def test_allocator_lookup_in_folders_and_the_linker_cache(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert runtime.find_allocator("tcmalloc", [str(tmp_path / "lib")], cache={}) == str(
        tmp_path / "lib" / "libtcmalloc_minimal.so.4"
    )
    assert runtime.find_allocator("jemalloc", [str(tmp_path / "lib")], cache={}) is None
    cache = {"libjemalloc.so.2": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert runtime.find_allocator("jemalloc", [str(tmp_path / "lib")], cache=cache) == cache["libjemalloc.so.2"]


def test_openmp_runtime_of_the_installed_torch(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libgomp-a34b3233.so.1").write_bytes(b"")
    assert runtime.openmp_runtime({}, [str(lib)]) == "gnu"
    assert runtime.openmp_runtime({"LD_PRELOAD": "/opt/intel/libiomp5.so"}, [str(lib)]) == "intel"
    (lib / "libiomp5.so").write_bytes(b"")
    assert runtime.openmp_runtime({}, [str(lib)]) == "intel"
    # this machine's torch: PyPI's Linux wheel ships GNU OpenMP
    assert runtime.openmp_runtime({}, runtime.torch_library_dirs()) in ("gnu", "intel", "llvm")


def test_plan_report_is_readable(tmp_path):
    p = runtime.plan(
        facts(tmp_path), {"OMP_NUM_THREADS": "4"}, "gnu", allocator="jemalloc", finder=lambda n: "/lib/libjemalloc.so.2"
    )
    text = runtime.format_plan(p)
    assert "OMP_NUM_THREADS=4  # set by you: kept" in text and "re-executed once" in text
    assert p.as_dict()["needs_reexec"] is True


# --- several processes: each one's CPUs and threads --------------------------------------------


def test_two_processes_on_the_two_core_vm(tmp_path):
    f = facts(tmp_path)
    assert runtime.process_cpus(f, 2) == [(0,), (1,)]
    assert runtime.process_cpus(f, 1) == [(0, 1)]
    assert runtime.auto_nproc(f) == 1  # one socket
    with pytest.raises(ValueError, match="3 processes need at least 3 physical cores"):
        runtime.process_cpus(f, 3)
    one = runtime.plan(cpu_facts_for(tmp_path, f, (1,)), {}, "gnu", allocator="default", share=2, pin=False)
    assert one.changes() == {"OMP_NUM_THREADS": "1"}
    one = runtime.plan(cpu_facts_for(tmp_path, f, (1,)), {}, "gnu", allocator="default", share=2, pin=True)
    assert one.changes() == {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "1"}


def cpu_facts_for(tmp_path, f, cpus, **kwargs):
    """The facts a process pinned to ``cpus`` sees on the machine of ``f``."""
    return facts(tmp_path, cpuinfo=kwargs.pop("cpuinfo", FIXTURES / "epyc_zen4_2c_vm.cpuinfo"), allowed=cpus, **kwargs)


def test_56_cores_on_2_sockets_split_by_socket_with_their_hyperthreads(tmp_path):
    info = big_xeon_cpuinfo(tmp_path / "spr112.cpuinfo")
    f = facts(tmp_path, cpuinfo=info, allowed=range(112))
    assert f.sockets == 2 and runtime.auto_nproc(f) == 2
    first, second = runtime.process_cpus(f, 2)
    assert first == tuple(range(28)) + tuple(range(56, 84))  # socket 0's cores and their siblings
    assert second == tuple(range(28, 56)) + tuple(range(84, 112))
    p = runtime.plan(facts(tmp_path, cpuinfo=info, allowed=second), {}, "gnu", allocator="default", share=2, pin=True)
    assert p.changes() == {"OMP_NUM_THREADS": "28", "GOMP_CPU_AFFINITY": ",".join(map(str, range(28, 56)))}
    four = runtime.process_cpus(f, 4, cores_per_proc=4)
    assert [len(g) for g in four] == [8, 8, 8, 8] and four[1] == (4, 5, 6, 7, 60, 61, 62, 63)
    assert runtime.auto_nproc(f, cores_per_proc=8) == 7
    uneven = runtime.process_cpus(f, 3)  # 56 = 19 + 19 + 18 cores
    assert [len(g) // 2 for g in uneven] == [19, 19, 18]
    with pytest.raises(ValueError, match="need 60 physical cores"):
        runtime.process_cpus(f, 6, cores_per_proc=10)


def test_processes_under_a_cgroup_quota_of_3_5_cpus_share_it(tmp_path):
    info = big_xeon_cpuinfo(tmp_path / "spr112.cpuinfo")
    f = facts(tmp_path, cpuinfo=info, allowed=range(112), quota=3.5)
    groups = runtime.process_cpus(f, 2)
    pinned = facts(tmp_path, cpuinfo=info, allowed=groups[0], quota=3.5)
    p = runtime.plan(pinned, {}, "gnu", allocator="default", share=2)
    assert p.changes() == {"OMP_NUM_THREADS": "1"}  # 3.5 / 2 CPUs each, rounded down; not pinned
    assert "split 2 ways" in setting(p, "OMP_NUM_THREADS").reason


def test_processes_on_an_affinity_mask_of_0_2_4(tmp_path):
    f = facts(tmp_path, name="xeon_spr_2s_ht.cpuinfo", allowed=(0, 2, 4))
    assert runtime.process_cpus(f, 3) == [(0,), (2,), (4,)]
    assert runtime.process_cpus(f, 2) == [(0, 2), (4,)]


def test_explicit_cpu_sets(tmp_path):
    f = facts(tmp_path, name="xeon_spr_2s_ht.cpuinfo", allowed=range(8))
    assert runtime.parse_process_cpus("0-3,4-7") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert runtime.parse_process_cpus("0,2;1,3") == [(0, 2), (1, 3)]
    assert runtime.process_cpus(f, 0, cpus="0-3,4-7") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    with pytest.raises(ValueError, match="2 CPU set"):
        runtime.process_cpus(f, 3, cpus="0-3,4-7")
    with pytest.raises(ValueError, match=r"CPU\(s\) 8-9 are not in this process's affinity mask"):
        runtime.process_cpus(f, 0, cpus="6-9,0")
    with pytest.raises(ValueError, match="3 are in more than one"):
        runtime.process_cpus(f, 0, cpus="0-3;3-5")
    with pytest.raises(ValueError, match="'x' is not a CPU list"):
        runtime.parse_process_cpus("0-1,x")


def test_variables_nanopatch_set_itself_are_not_the_users(tmp_path):
    env = {"OMP_NUM_THREADS": "2", "NANOPATCH_TUNED": "OMP_NUM_THREADS"}
    p = runtime.plan(facts(tmp_path, allowed=(1,)), env, "gnu", allocator="default", ours=runtime.tuned_names(env))
    assert p.changes()["OMP_NUM_THREADS"] == "1"


def test_children_get_the_whole_cpu_set_back(tmp_path):
    env = {
        "GOMP_CPU_AFFINITY": "0,1",
        "OMP_NUM_THREADS": "2",
        "NANOPATCH_TUNED": "GOMP_CPU_AFFINITY,OMP_NUM_THREADS",
        "NANOPATCH_CPUS": runtime.cpu_list_text(cpu.allowed_cpus()),
    }
    runtime.unpin_started_child(env)
    assert "GOMP_CPU_AFFINITY" not in env and env["OMP_NUM_THREADS"] == "2"
    assert env["NANOPATCH_TUNED"] == "OMP_NUM_THREADS"
    user = {"GOMP_CPU_AFFINITY": "0", "NANOPATCH_CPUS": env["NANOPATCH_CPUS"]}  # the user's own pinning stays
    runtime.unpin_started_child(user)
    assert user["GOMP_CPU_AFFINITY"] == "0"
    assert runtime.cpu_list_text([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


# --- processes a script starts: each its share of the threads --------------------------------------


def tuned_env(threads="2", **extra):
    """The environment the runner leaves after setting OMP_NUM_THREADS itself."""
    return {"OMP_NUM_THREADS": threads, "NANOPATCH_THREADS": threads, "NANOPATCH_TUNED": "OMP_NUM_THREADS", **extra}


def test_apply_records_the_thread_count_it_set(tmp_path):
    env = {}
    runtime.apply(runtime.plan(facts(tmp_path), {}, "gnu", finder=no_allocator), env)
    assert env["OMP_NUM_THREADS"] == env["NANOPATCH_THREADS"] == "2"
    assert runtime.nanopatch_threads(env) == 2
    user = {"OMP_NUM_THREADS": "3"}
    runtime.apply(runtime.plan(facts(tmp_path), user, "gnu", finder=no_allocator), user)
    assert "NANOPATCH_THREADS" not in user and runtime.nanopatch_threads(user) is None


def test_the_users_thread_count_is_told_from_nanopatchs():
    assert runtime.nanopatch_threads(tuned_env()) == 2
    assert runtime.nanopatch_threads({"OMP_NUM_THREADS": "2"}) is None  # the user's
    assert runtime.nanopatch_threads(tuned_env(OMP_NUM_THREADS="1")) is None  # changed since: the user's
    assert runtime.nanopatch_threads(tuned_env(NANOPATCH_TUNED="GOMP_CPU_AFFINITY")) is None
    assert runtime.nanopatch_threads({"NANOPATCH_THREADS": "2", "NANOPATCH_TUNED": "OMP_NUM_THREADS"}) is None


def test_launcher_groups():
    torchrun = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4", "MASTER_PORT": "29500"}
    size, key = runtime.launcher_group(torchrun)
    assert size == 2  # the processes on this machine, not the world
    assert runtime.launcher_group({**torchrun, "LOCAL_RANK": "0"})[1] == key  # one group, whatever the rank
    assert runtime.launcher_group({**torchrun, "MASTER_PORT": "29501"})[1] != key
    lightning = {"LOCAL_RANK": "1", "WORLD_SIZE": "3", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    assert runtime.launcher_group(lightning)[0] == 3
    assert runtime.launcher_group({"WORLD_SIZE": "2"}) is None  # no LOCAL_RANK: not a local worker
    assert runtime.launcher_group({"LOCAL_RANK": "0", "WORLD_SIZE": "x"}) is None


@pytest.mark.parametrize(("threads", "siblings", "share"), [("2", 2, 1), ("2", 3, 1), ("56", 3, 18), ("8", 2, 4)])
def test_each_sibling_gets_its_share_of_the_threads(threads, siblings, share):
    env = tuned_env(threads)
    assert runtime.take_share(env, siblings, "g") == share
    assert env["OMP_NUM_THREADS"] == env["NANOPATCH_THREADS"] == str(share) and env["NANOPATCH_SHARED"] == "g"
    # a process this one starts inherits the group: its threads are not divided again
    assert runtime.take_share(dict(env), siblings, "g") is None
    # one it starts as a group of its own divides its share
    assert runtime.take_share(dict(env), 2, "h") == max(1, share // 2)


def test_a_thread_count_the_user_set_is_never_divided():
    user = {"OMP_NUM_THREADS": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    runtime.share_threads_in_child(user, argv=["worker.py"])
    assert user["OMP_NUM_THREADS"] == "2" and "NANOPATCH_SHARED" not in user
    assert runtime.take_share(dict(user), 2, "g") is None
    assert runtime.take_share(tuned_env(), 1, "g") is None  # no siblings: nothing to share


def test_launcher_workers_take_their_share_before_torch_loads():
    env = tuned_env("4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_PORT="1")
    runtime.share_threads_in_child(env, argv=["worker.py"])
    assert env["OMP_NUM_THREADS"] == "2"
    rank = tuned_env("4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_PORT="1")
    runtime.mark_shared(rank)  # a --nproc rank: its threads are its share already
    runtime.share_threads_in_child(rank, argv=["worker.py"])
    assert rank["OMP_NUM_THREADS"] == "4"


def test_a_process_that_starts_ranks_of_its_own_group_takes_its_share():
    # Lightning's DDP launcher: rank 0 is the script's process, which sets these and starts rank 1
    group = {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "5"}
    parent = tuned_env(**group)
    child = {**parent, "LOCAL_RANK": "1"}
    assert runtime.share_when_starting(parent, child) == 1 and parent["OMP_NUM_THREADS"] == "1"
    assert runtime.share_when_starting(parent, child) is None  # once
    # a process started with an environment of no group, or of another group, changes nothing
    other = tuned_env(**group)
    assert runtime.share_when_starting(other, {"PATH": "/bin"}) is None
    assert runtime.share_when_starting(other, {**child, "MASTER_PORT": "6"}) is None
    assert runtime.share_when_starting(tuned_env(), None) is None  # not a rank itself
    assert other["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize("early, late", [(2, 1), (1, 2), (2, 2)], ids=["sibling-ended", "sibling-started", "both"])
def test_a_spawned_process_counts_its_siblings_before_and_after_torch_loads(monkeypatch, early, late):
    # the last sibling started sees the others at once (they cannot have ended yet); the first
    # sees the later ones once torch is imported: either count alone can miss one
    counts = iter([early, late])
    monkeypatch.setattr(runtime, "spawned_children", lambda pid, proc="/proc": next(counts))
    later = []
    monkeypatch.setattr(runtime, "_after_torch_import", later.append)
    env = tuned_env("2")
    runtime.share_threads_in_child(env, argv=["python", "-c", SPAWN_MAIN, "--multiprocessing-fork"])
    assert env["OMP_NUM_THREADS"] == "2" and len(later) == 1  # shared once torch is imported
    threads = []
    later[0](types.SimpleNamespace(set_num_threads=threads.append))
    assert env["OMP_NUM_THREADS"] == "1" and threads == [1]


def fake_proc(root, processes):
    """A /proc with ``processes``: pid -> (parent pid, argv); children listed per thread when
    ``children`` files are wanted."""
    for pid, (ppid, argv) in processes.items():
        d = root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        (d / "stat").write_text(f"{pid} (py thon) S {ppid} 1 1 0 -1\n")
    return root


SPAWN_MAIN = "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"
SPAWNED = ["python", "-c", SPAWN_MAIN, "--multiprocessing-fork"]


def test_spawned_siblings_are_counted_from_proc(tmp_path):
    processes = {
        10: (1, ["python", "-m", "nanopatch", "train.py"]),
        11: (10, SPAWNED),
        12: (10, SPAWNED),
        13: (10, ["python", "-c", "from multiprocessing.resource_tracker import main;main(4)"]),
        14: (12, SPAWNED),  # a grandchild: not a sibling
    }
    proc = fake_proc(tmp_path / "scan", processes)  # no children files: a scan of the stat files
    assert runtime.child_pids(10, str(proc)) == {11, 12, 13}
    assert runtime.spawned_children(10, str(proc)) == 2
    listed = fake_proc(tmp_path / "listed", processes)
    (listed / "10" / "task" / "10" / "children").write_text("11 13 ")
    (listed / "10" / "task" / "77").mkdir()
    (listed / "10" / "task" / "77" / "children").write_text("12")  # started by another thread
    assert runtime.spawned_children(10, str(listed)) == 2
    assert runtime.is_spawned(["-c", "--multiprocessing-fork"]) and not runtime.is_spawned(["train.py"])


def test_shell_exports_quote_values_and_show_what_is_kept(tmp_path):
    env = {"LD_PRELOAD": "/opt/my lib.so", "OMP_NUM_THREADS": "3"}
    p = runtime.plan(facts(tmp_path), env, "gnu", finder=lambda name: "/usr/lib/libtcmalloc_minimal.so.4")
    text = runtime.shell_exports(p)
    assert "export LD_PRELOAD='/opt/my lib.so:/usr/lib/libtcmalloc_minimal.so.4'  # " in text
    assert "export GOMP_CPU_AFFINITY=0,1  # " in text
    assert "# OMP_NUM_THREADS=3: set by you" in text and "export OMP_NUM_THREADS" not in text
    assert "NANOPATCH_" not in text  # in a shell the values are the user's own
    out = subprocess.run(
        ["sh", "-c", text + '\nprintf "%s|%s" "$LD_PRELOAD" "$GOMP_CPU_AFFINITY"'], capture_output=True, text=True
    )
    assert out.stdout == "/opt/my lib.so:/usr/lib/libtcmalloc_minimal.so.4|0,1"
    unpinned = runtime.shell_exports(runtime.plan(facts(tmp_path), {}, "gnu", finder=no_allocator, pin=False))
    assert "export GOMP_CPU_AFFINITY" not in unpinned and "pins its threads" not in unpinned


# --- --init's shell lines ---------------------------------------------------------------------

#: values a user may have set, each of which ends a comment line and runs a command if printed as it is
HOSTILE = {
    "OMP_NUM_THREADS": "8\necho INJECTED-1 #",
    "GOMP_CPU_AFFINITY": "0\r\necho INJECTED-2 #",
    "KMP_AFFINITY": "compact\x0becho INJECTED-3",
}


def test_init_lines_run_nothing_of_a_value_the_user_set_under_eval():
    """``eval "$(python -m nanopatch --init)"``: a kept value with a newline in it was printed
    inside a ``# NAME='...'`` comment, whose second line then ran as a command."""
    kept = [runtime.Setting(name, None, "set by you: kept", kept=value) for name, value in HOSTILE.items()]
    plan = runtime.Plan(
        settings=(*kept, runtime.Setting("LD_PRELOAD", "/lib/a.so:/lib/b\nc.so", "tcmalloc appended\nto LD_PRELOAD")),
        threads=2,
        cpus=(),
        openmp="gnu",
        allocator="/lib/b\nc.so",
    )
    text = runtime.shell_exports(plan)
    assert all(line.startswith(("# ", "export ")) for line in text.split("\n") if not line.startswith("c.so'"))
    assert "# OMP_NUM_THREADS='8\\x0aecho INJECTED-1 #': set by you: kept" in text
    proc = subprocess.run(
        ["sh", "-c", 'eval "$1"; printf "%s|" "$LD_PRELOAD"', "sh", text], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "INJECTED" not in proc.stdout + proc.stderr
    assert proc.stdout == "/lib/a.so:/lib/b\nc.so|"  # the value nanopatch sets arrives whole, newline and all


# --- processes a tuned process starts through subprocess --------------------------------------

BOOT = os.pathsep.join(["/x", os.path.join("/site", "nanopatch", "runner", "_bootstrap")])


@pytest.mark.parametrize(
    ("argv", "executable", "expected"),
    [
        ([sys.executable, "-c", "pass"], None, True),
        (["python3", "-u", "script.py"], None, True),
        (["python3.11", "-X", "dev", "-W", "ignore", "-m", "pkg"], None, True),
        (["python3", "-Wignore", "-I", "s.py"], None, False),
        (["python", "-I", "-c", "pass"], None, False),
        (["python", "-E", "s.py"], None, False),
        (["python", "-bS", "s.py"], None, False),
        (["python", "-c", "import sys; print(sys.argv)", "-I"], None, True),  # after -c: the command's
        (["python", "s.py", "-E"], None, True),  # after the script: the script's
        (["ninja", "-v"], None, False),
        (["sh", "-c", "python x.py"], None, False),
        ("python x.py", None, False),  # shell=True: the shell is the child
        (["anything"], sys.executable, True),
    ],
)
def test_which_children_run_the_bootstrap(argv, executable, expected):
    assert runtime.runs_bootstrap(argv, executable, {"PYTHONPATH": BOOT}) is expected


def test_a_python_without_the_bootstrap_on_its_path_does_not_run_it():
    assert runtime.runs_bootstrap(["python", "s.py"], None, {"PYTHONPATH": "/x"}) is False
    assert runtime.runs_bootstrap(["python", "s.py"], None, {}) is False


def test_other_programs_get_the_environment_without_the_runners_tuning():
    env = {
        "OMP_NUM_THREADS": "8",
        "GOMP_CPU_AFFINITY": "0,2,4,6",
        "LD_PRELOAD": f"/user/hook.so{os.pathsep}/usr/lib/libtcmalloc_minimal.so.4",
        "MALLOC_CONF": "x",
        "KMP_BLOCKTIME": "0",  # the user's: not in NANOPATCH_TUNED
        runtime.TUNED_VARIABLE: "GOMP_CPU_AFFINITY,LD_PRELOAD,MALLOC_CONF,OMP_NUM_THREADS",
        runtime.THREADS_VARIABLE: "8",
        runtime.CPUS_VARIABLE: "0-7",
        "PATH": "/bin",
    }
    out = runtime.environ_for_other_programs(env)
    assert out == {"LD_PRELOAD": "/user/hook.so", "KMP_BLOCKTIME": "0", runtime.CPUS_VARIABLE: "0-7", "PATH": "/bin"}
    assert env[runtime.TUNED_VARIABLE]  # the caller's mapping is not changed
    alone = runtime.environ_for_other_programs({"LD_PRELOAD": "/t.so", runtime.TUNED_VARIABLE: "LD_PRELOAD"})
    assert alone == {}


def test_only_the_cpu_the_main_thread_inherited_is_widened(monkeypatch):
    """A child whose mask is the runner's pinned main-thread CPU takes the run's set back; one
    started with a mask of its own (``taskset -c 1``) keeps it."""
    calls = []
    monkeypatch.setattr(runtime.os, "sched_setaffinity", lambda pid, cpus: calls.append(set(cpus)))
    base = {runtime.CPUS_VARIABLE: "0-3", "GOMP_CPU_AFFINITY": "0,1,2,3", runtime.TUNED_VARIABLE: "GOMP_CPU_AFFINITY"}
    assert runtime.main_thread_cpu(base) == 0
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0})
    runtime.unpin_started_child(dict(base))
    assert calls == [{0, 1, 2, 3}]
    calls.clear()
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {1})
    env = dict(base)
    runtime.unpin_started_child(env)
    assert calls == [] and "GOMP_CPU_AFFINITY" not in env  # its own mask kept, the pinning dropped
    assert runtime.main_thread_cpu({"GOMP_CPU_AFFINITY": "0,1"}) is None  # the user's pinning: not ours


def _elf(path: Path, elf_class: int, machine: int) -> str:
    path.write_bytes(b"\x7fELF" + bytes([elf_class, 1, 1]) + bytes(11) + bytes([3, 0]) + machine.to_bytes(2, "little"))
    return str(path)


def test_a_library_of_another_architecture_is_never_chosen(tmp_path):
    """``ldconfig -p`` on a multiarch host lists an i386 copy beside the x86-64 one."""
    with open(os.path.realpath(sys.executable), "rb") as f:
        ours = f.read(20)
    if ours[:4] != b"\x7fELF":
        pytest.skip("the interpreter is not an ELF binary")
    native = tmp_path / "native.so"
    native.write_bytes(ours)
    other_machine = 3 if int.from_bytes(ours[18:20], "little" if ours[5] == 1 else "big") != 3 else 62
    foreign = _elf(tmp_path / "foreign.so", 1, other_machine)
    listing = (
        f"\tlibtcmalloc_minimal.so.4 (libc6) => {foreign}\n\tlibtcmalloc_minimal.so.4 (libc6,x86-64) => {native}\n"
    )
    assert runtime.ldconfig_libraries(listing) == {"libtcmalloc_minimal.so.4": str(native)}
    # as ldconfig lists a real host: each library tagged, this interpreter's tag that of its C library
    tagged = (
        f"\tlibc.so.6 (libc6) => {foreign}\n\tlibc.so.6 (libc6,x86-64) => {native}\n"
        f"\tlibjemalloc.so.2 (libc6) => /nowhere/i386/libjemalloc.so.2\n"
        f"\tlibtcmalloc_minimal.so.4 (libc6) => /nowhere/i386/libtcmalloc_minimal.so.4\n"
        f"\tlibtcmalloc_minimal.so.4 (libc6,x86-64) => /nowhere/libtcmalloc_minimal.so.4\n"
    )
    assert runtime.ldconfig_libraries(tagged) == {
        "libc.so.6": str(native),
        "libtcmalloc_minimal.so.4": "/nowhere/libtcmalloc_minimal.so.4",
    }
    assert runtime.foreign_binary(foreign) and not runtime.foreign_binary(str(native))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libtcmalloc_minimal.so.4").write_bytes(Path(foreign).read_bytes())
    assert runtime.find_allocator("tcmalloc", [str(tmp_path / "lib")], cache={}) is None
