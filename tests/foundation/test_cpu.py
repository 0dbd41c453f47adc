"""Host CPU facts (nanopatch.foundation.cpu): /proc/cpuinfo parsing, ISA features and bf16, physical cores,
cgroup CPU quotas and the usable core count, on fixture files of real CPUs and on this host.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanopatch.foundation import cpu

from conftest import TESTS_DIR

FIXTURES = TESTS_DIR / "fixtures" / "cpu"

SPR = "xeon_spr_2s_ht.cpuinfo"
SKYLAKE = "xeon_skylake_4c.cpuinfo"
EPYC = "epyc_zen4_2c_vm.cpuinfo"
LAPTOP = "laptop_avx2.cpuinfo"
ARM = "arm64_graviton.cpuinfo"

NO_BF16 = (
    "CPU has no native bf16 instructions (needs avx512_bf16 or amx_bf16); bf16 would be emulated and slower than fp32"
)


def procs(name):
    return cpu.parse_cpuinfo((FIXTURES / name).read_text())


def flags_of(name):
    return cpu.cpu_flags(procs(name))


# --------------------------------------------------------------------------
# parse_cpuinfo / cpu_flags
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name, count", [(SPR, 16), (SKYLAKE, 8), (EPYC, 2), (LAPTOP, 8), (ARM, 4)])
def test_parse_cpuinfo_block_count(name, count):
    ps = procs(name)
    assert len(ps) == count
    assert [p["processor"] for p in ps] == [str(i) for i in range(count)]


def test_parse_cpuinfo_keys_and_values_are_stripped():
    first = procs(SPR)[0]
    assert first["vendor_id"] == "GenuineIntel"
    assert first["model name"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert first["physical id"] == "0"
    assert first["core id"] == "0"
    assert first["power management"] == ""
    assert first["flags"].startswith("fpu vme")
    assert all(k == k.strip() and v == v.strip() for k, v in first.items())


def test_parse_cpuinfo_arm_keys():
    first = procs(ARM)[0]
    assert first["CPU architecture"] == "8"
    assert first["CPU implementer"] == "0x41"
    assert "core id" not in first and "flags" not in first


def test_parse_cpuinfo_tolerates_odd_layout():
    text = (
        "junk before any processor\n"
        "processor : 0\nflags : a b\n"
        "processor : 1\nflags : a c"  # no blank line between, no final newline
        "\n\nHardware : BCM2835\nRevision : a02082\n"  # arm32 trailer block
    )
    ps = cpu.parse_cpuinfo(text)
    assert ps == [
        {"processor": "0", "flags": "a b"},
        {"processor": "1", "flags": "a c"},
    ]
    assert cpu.parse_cpuinfo("") == []


def test_cpu_flags_is_the_intersection():
    ps = [{"flags": "a b c"}, {"flags": "b c d"}, {"flags": "c b"}]
    assert cpu.cpu_flags(ps) == frozenset({"b", "c"})
    assert cpu.cpu_flags([]) == frozenset()
    # A processor that reports no flags at all means nothing is guaranteed.
    assert cpu.cpu_flags([{"flags": "a"}, {"processor": "1"}]) == frozenset()


def test_cpu_flags_ignores_vmx_flags_line():
    flags = flags_of(SPR)
    assert "ept" in flags  # from "flags"
    assert "posted_intr" not in flags  # only on the "vmx flags" line


def test_cpu_flags_arm_features():
    assert flags_of(ARM) >= {"fp", "asimd", "atomics", "asimddp"}


# --------------------------------------------------------------------------
# Feature detection
# --------------------------------------------------------------------------

# name: (avx2, avx512, native_bf16, amx, reason)
DETECTION = {
    SPR: (True, True, True, True, "CPU has native bf16 (amx_bf16, avx512_bf16)"),
    SKYLAKE: (True, True, False, False, NO_BF16),
    EPYC: (True, True, True, False, "CPU has native bf16 (avx512_bf16)"),
    LAPTOP: (True, False, False, False, NO_BF16),
    ARM: (False, False, False, False, NO_BF16),
}


@pytest.mark.parametrize("name", list(DETECTION))
def test_feature_detection(name):
    avx2, avx512, bf16, amx, reason = DETECTION[name]
    flags = flags_of(name)
    assert ("avx2" in flags) is avx2
    assert cpu.has_avx512(flags) is avx512
    assert cpu.has_native_bf16(flags) is bf16
    assert cpu.has_amx(flags) is amx
    assert cpu.bf16_reason(flags) == reason


def test_has_amx_needs_tile_and_a_compute_type():
    assert not cpu.has_amx({"amx_tile"})
    assert not cpu.has_amx({"amx_bf16", "amx_int8"})
    assert cpu.has_amx({"amx_tile", "amx_int8"})
    assert cpu.has_amx({"amx_tile", "amx_bf16"})


def test_native_bf16_from_either_flag():
    assert cpu.has_native_bf16({"amx_bf16"})
    assert cpu.has_native_bf16(["avx512_bf16"])
    assert not cpu.has_native_bf16({"avx512f", "bf16"})


def test_bf16_reason_unknown_flags_and_arm_bf16():
    assert "unknown" in cpu.bf16_reason(frozenset())
    arm_v1 = {"fp", "asimd", "sve", "bf16", "i8mm"}
    assert not cpu.has_native_bf16(arm_v1)
    assert "Arm bf16" in cpu.bf16_reason(arm_v1)


# --------------------------------------------------------------------------
# physical_cores
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, cpus, expected",
    [
        (SPR, None, 8),
        (SPR, (0, 2, 4), 3),  # core id 0 on both sockets: distinct cores
        (SPR, (0, 4), 2),
        (SPR, (0, 8), 1),  # HT siblings
        (SPR, range(8, 16), 8),
        (SKYLAKE, None, 4),
        (SKYLAKE, (0, 2, 4), 2),  # 4 is the sibling of 0
        (SKYLAKE, (0, 4), 1),
        (SKYLAKE, (1, 2), 2),
        (EPYC, None, 2),
        (EPYC, (1,), 1),
        (LAPTOP, None, 4),
        (LAPTOP, (3, 7), 1),
        (ARM, None, 4),
        (ARM, (0, 2), 2),
    ],
)
def test_physical_cores(name, cpus, expected):
    assert cpu.physical_cores(procs(name), cpus) == expected


def test_physical_cores_without_cpuinfo():
    assert cpu.physical_cores([]) == 1
    assert cpu.physical_cores([], (0, 1, 2)) == 3
    # Mask mentions CPUs cpuinfo does not know: guess one core each.
    assert cpu.physical_cores(procs(EPYC), (5, 6, 7)) == 3
    assert cpu.physical_cores(procs(EPYC), ()) == 1


def test_physical_cores_mixed_core_id_info():
    ps = [
        {"processor": "0", "physical id": "0", "core id": "0"},
        {"processor": "1", "physical id": "0", "core id": "0"},
        {"processor": "2"},
    ]
    assert cpu.physical_cores(ps) == 2


# --------------------------------------------------------------------------
# parse_cpu_list
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
        ("0-1\n", (0, 1)),
        ("5", (5,)),
        ("7,3,3-4", (3, 4, 7)),
        ("2-2", (2,)),
        ("", ()),
        ("\n", ()),
    ],
)
def test_parse_cpu_list(text, expected):
    assert cpu.parse_cpu_list(text) == expected


@pytest.mark.parametrize("text", ["abc", "1-", "-1", "3-1", "0,,1", "0-3,", "1.5", "0 1", "0-1-2", "²"])
def test_parse_cpu_list_rejects_garbage(text):
    with pytest.raises(ValueError):
        cpu.parse_cpu_list(text)


# --------------------------------------------------------------------------
# cgroup_cpu_quota
# --------------------------------------------------------------------------


def make_cgroup(tmp_path, proc_cgroup, files):
    """Write a /proc/self/cgroup file and a fake /sys/fs/cgroup tree."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for rel, content in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(content)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(proc_cgroup)
    return str(proc), str(root)


def quota(tmp_path, proc_cgroup, files):
    return cpu.cgroup_cpu_quota(*make_cgroup(tmp_path, proc_cgroup, files))


def test_cgroup_v2_unlimited(tmp_path):
    files = {"app/cpu.max": "max 100000\n", "app/cgroup.procs": ""}
    assert quota(tmp_path, "0::/app\n", files) is None


def test_cgroup_v2_fractional(tmp_path):
    assert quota(tmp_path, "0::/app\n", {"app/cpu.max": "350000 100000\n"}) == 3.5


def test_cgroup_v2_parent_limit_wins(tmp_path):
    files = {
        "kubepods/cpu.max": "200000 100000\n",
        "kubepods/pod1/cpu.max": "400000 100000\n",
        "kubepods/pod1/ctr/cpu.max": "max 100000\n",
    }
    assert quota(tmp_path, "0::/kubepods/pod1/ctr\n", files) == 2.0


def test_cgroup_v2_child_limit_wins(tmp_path):
    files = {
        "user.slice/cpu.max": "800000 100000\n",
        "user.slice/job/cpu.max": "150000 100000\n",
    }
    assert quota(tmp_path, "0::/user.slice/job\n", files) == 1.5


def test_cgroup_v2_namespaced_path_falls_back_to_root(tmp_path):
    files = {"cpu.max": "150000 50000\n"}
    assert quota(tmp_path, "0::/docker/0123abcd\n", files) == 3.0


def test_cgroup_v2_root_path(tmp_path):
    assert quota(tmp_path, "0::/\n", {"cpu.max": "50000 100000\n"}) == 0.5


def test_cgroup_v2_host_root_has_no_cpu_max(tmp_path):
    assert quota(tmp_path, "0::/\n", {"cgroup.controllers": "cpu io memory\n"}) is None


def test_cgroup_v2_path_cannot_escape_root(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # outside the root
    files = {"cpu.max": "max 100000\n"}
    assert quota(tmp_path, "0::/../\n", files) is None


def test_cgroup_v1_unlimited(tmp_path):
    files = {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    proc = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    assert quota(tmp_path, proc, files) is None


@pytest.mark.parametrize("hier", ["cpu,cpuacct", "cpuacct,cpu", "cpu"])
def test_cgroup_v1_limit(tmp_path, hier):
    files = {
        f"{hier}/docker/abc/cpu.cfs_quota_us": "200000\n",
        f"{hier}/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    assert quota(tmp_path, "4:cpu,cpuacct:/docker/abc\n", files) == 2.0


def test_cgroup_v1_ancestor_limit_and_root_fallback(tmp_path):
    files = {
        "cpu/cpu.cfs_quota_us": "-1\n",
        "cpu/cpu.cfs_period_us": "100000\n",
        "cpu/batch/cpu.cfs_quota_us": "100000\n",
        "cpu/batch/cpu.cfs_period_us": "100000\n",
        "cpu/batch/job7/cpu.cfs_quota_us": "600000\n",
        "cpu/batch/job7/cpu.cfs_period_us": "100000\n",
    }
    proc, root = make_cgroup(tmp_path, "3:cpu:/batch/job7\n", files)
    assert cpu.cgroup_cpu_quota(proc, root) == 1.0

    # Path not visible in this mount namespace: read the hierarchy root only.
    (tmp_path / "other").write_text("3:cpu:/docker/feedbeef\n")
    assert cpu.cgroup_cpu_quota(str(tmp_path / "other"), root) is None
    Path(root, "cpu/cpu.cfs_quota_us").write_text("250000\n")
    assert cpu.cgroup_cpu_quota(str(tmp_path / "other"), root) == 2.5


def test_cgroup_hybrid_prefers_v1_cpu_controller(tmp_path):
    # Layout of this dev VM: v1 controllers plus an (empty) unified hierarchy.
    proc = "4:memory:/x\n2:cpuacct:/\n1:cpu:/\n0::/\n"
    files = {
        "cpu/cpu.cfs_quota_us": "300000\n",
        "cpu/cpu.cfs_period_us": "100000\n",
        "unified/cgroup.procs": "",
    }
    assert quota(tmp_path, proc, files) == 3.0


def test_cgroup_v1_controller_without_mount_uses_v2(tmp_path):
    files = {"cpu.max": "100000 100000\n"}
    assert quota(tmp_path, "1:cpu:/\n0::/\n", files) == 1.0


@pytest.mark.parametrize(
    "proc_cgroup, files",
    [
        ("0::/app\n", {}),  # no cpu.max anywhere
        ("0::/app\n", {"app/cpu.max": "garbage\n"}),
        ("0::/app\n", {"app/cpu.max": ""}),
        ("0::/app\n", {"app/cpu.max": "0 100000\n"}),
        ("0::/app\n", {"app/cpu.max": "100000 0\n"}),
        ("4:cpu:/a\n", {"cpu/a/cpu.cfs_quota_us": "200000\n"}),  # no period
        ("4:cpu:/a\n", {"cpu/a/cpu.cfs_quota_us": "x", "cpu/a/cpu.cfs_period_us": "1"}),
        ("4:memory:/a\n", {"memory/a/x": ""}),  # no cpu controller line
        ("garbage\n", {}),
        ("", {}),
    ],
)
def test_cgroup_missing_or_bad_files(tmp_path, proc_cgroup, files):
    assert quota(tmp_path, proc_cgroup, files) is None


def test_cgroup_missing_proc_file(tmp_path):
    assert cpu.cgroup_cpu_quota(str(tmp_path / "nope"), str(tmp_path)) is None


def test_cgroup_binary_junk_does_not_raise(tmp_path):
    proc, root = make_cgroup(tmp_path, "0::/\n", {})
    Path(root, "cpu.max").write_bytes(b"\xff\xfe\x00")
    assert cpu.cgroup_cpu_quota(proc, root) is None


# --------------------------------------------------------------------------
# allowed_cpus / usable_cores
# --------------------------------------------------------------------------


def test_allowed_cpus_live():
    cpus = cpu.allowed_cpus()
    assert cpus and list(cpus) == sorted(set(cpus))
    assert all(isinstance(c, int) and c >= 0 for c in cpus)


def test_allowed_cpus_without_affinity(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert cpu.allowed_cpus() == (0, 1, 2)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cpu.allowed_cpus() == (0,)


@pytest.mark.parametrize(
    "physical, q, expected",
    [
        (8, 3.5, 3),
        (8, 0.5, 1),
        (8, None, 8),
        (2, 16.0, 2),
        (4, 3.0, 3),
        (4, 2.9999999999999996, 3),  # float noise from quota/period
        (0, None, 1),
        (4, float("inf"), 4),
    ],
)
def test_usable_cores(physical, q, expected):
    assert cpu.usable_cores(physical, q) == expected


# --------------------------------------------------------------------------
# facts / CpuFacts
# --------------------------------------------------------------------------


@pytest.fixture
def v2_quota(tmp_path):
    return make_cgroup(tmp_path, "0::/job\n", {"job/cpu.max": "350000 100000\n"})


# name: (vendor, model, logical, allowed, physical, usable with 3.5-CPU quota)
END_TO_END = {
    SPR: ("GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", 16, range(16), 8, 3),
    SKYLAKE: (
        "GenuineIntel",
        "Intel(R) Xeon(R) W-2125 CPU @ 4.00GHz",
        8,
        (0, 2, 4),
        2,
        2,
    ),
    EPYC: ("AuthenticAMD", "AMD EPYC", 2, (0, 1), 2, 2),
    LAPTOP: (
        "GenuineIntel",
        "Intel(R) Core(TM) i7-8550U CPU @ 1.80GHz",
        8,
        range(8),
        4,
        3,
    ),
    ARM: ("ARM", "", 4, (3, 1, 2, 0), 4, 3),
}


@pytest.mark.parametrize("name", list(END_TO_END))
def test_facts_end_to_end(name, v2_quota):
    vendor, model, logical, allowed, physical, usable = END_TO_END[name]
    f = cpu.facts(str(FIXTURES / name), *v2_quota, allowed=allowed)
    assert f.vendor == vendor
    assert f.model_name == model
    assert f.logical_cpus == logical
    assert f.allowed_cpus == tuple(sorted(allowed))
    assert f.physical_cores == physical
    assert f.cpu_quota == 3.5
    assert f.usable_cores == usable
    avx2, avx512, bf16, amx, reason = DETECTION[name]
    assert (f.avx2, f.avx512, f.native_bf16, f.amx) == (avx2, avx512, bf16, amx)
    assert f.bf16_reason == reason
    assert f.flags == flags_of(name)

    d = f.as_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["flags"] == sorted(d["flags"])
    assert set(d["flags"]) <= cpu.INTERESTING_FLAGS
    assert d["allowed_cpus"] == list(f.allowed_cpus)
    assert d["usable_cores"] == usable


def test_as_dict_flags_for_spr(tmp_path):
    f = cpu.facts(str(FIXTURES / SPR), str(tmp_path / "none"), str(tmp_path), allowed=(0,))
    assert f.as_dict()["flags"] == sorted(cpu.INTERESTING_FLAGS)
    assert f.cpu_quota is None and f.usable_cores == 1


def test_facts_without_cpuinfo(tmp_path):
    f = cpu.facts(
        str(tmp_path / "missing"),
        str(tmp_path / "none"),
        str(tmp_path),
        allowed=(0, 1, 2),
    )
    assert f.flags == frozenset()
    assert f.logical_cpus == (os.cpu_count() or 1)
    assert f.physical_cores == 3 and f.usable_cores == 3
    assert not (f.avx2 or f.avx512 or f.native_bf16 or f.amx)
    assert f.vendor == "" and f.model_name == ""
    json.dumps(f.as_dict())


def test_facts_is_frozen(tmp_path):
    f = cpu.facts(str(FIXTURES / EPYC), str(tmp_path / "none"), str(tmp_path), allowed=(0,))
    with pytest.raises(AttributeError):
        f.usable_cores = 99


def test_host_facts_live():
    f = cpu.host_facts()
    assert f is cpu.host_facts()  # cached
    assert f.usable_cores >= 1 and f.physical_cores >= 1 and f.logical_cpus >= 1
    assert f.usable_cores <= f.physical_cores
    assert set(f.allowed_cpus) == set(cpu.allowed_cpus())
    json.dumps(f.as_dict())


def test_import_is_cheap():
    # Load the module file on its own and check that importing it did no work.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('npcpu', {cpu.__file__!r})\n"
        "m = sys.modules['npcpu'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "assert m.host_facts.cache_info().currsize == 0\n"
        "heavy = {'numpy', 'torch', 'psutil', 'subprocess'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
