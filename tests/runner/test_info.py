"""``python -m nanopatch --info [--json]``: the capability report (nanopatch/runner/_info.py).

The report itself runs in fresh interpreters (it imports torch, torchvision and OpenCV), once
per form, shared by the tests through module-scoped fixtures; ``loaded_openmp_runtime`` and
``format_table`` are tested in-process on hand-made input.
"""

from __future__ import annotations

import configparser
import ctypes.util
import importlib.metadata
import json
import os
import platform
import re

import pytest

import nanopatch
from nanopatch.engine import config, versions
from nanopatch.foundation import cpu
from nanopatch.runner import _info

from conftest import REPO_ROOT, child_env, run_python

SECTIONS = ["CPU", "Packages", "PyTorch", "Image decoding", "Runtime environment", "Runtime tuning", "Options"]
JSON_KEYS = {
    "cpu",
    "packages",
    "torch",
    "torch_support",
    "ipex",
    "libturbojpeg",
    "opencv",
    "resize_kernel",
    "crop_decode",
    "lookup_kernel",
    "jitter_kernel",
    "environment",
    "options",
}


def expected_libturbojpeg():
    """The library the report names: an explicit NANOPATCH_TURBOJPEG_LIB, else the system's."""
    return os.environ.get("NANOPATCH_TURBOJPEG_LIB") or ctypes.util.find_library("turbojpeg")


def parse_table(text: str) -> tuple[str, dict[str, dict[str, str]], list[str]]:
    """(header line, {section title: {key: value}}, trailing lines) of format_table's output;
    checks the layout on the way: blank line, title, dashes as long as the title, and every
    value starting in the same column."""
    lines = text.split("\n")
    header, rest = lines[0], lines[1:]
    sections: dict[str, dict[str, str]] = {}
    rows: list[str] = []
    trailing: list[str] = []
    i = 0
    while i < len(rest):
        if rest[i] == "":
            title, dashes = rest[i + 1], rest[i + 2]
            assert dashes == "-" * len(title), (title, dashes)
            sections[title] = {}
            i += 3
            while i < len(rest) and rest[i].startswith("  "):
                key, value = re.fullmatch(r"  (\S.*?)  +(\S.*)", rest[i]).groups()
                assert key not in sections[title], key
                sections[title][key] = value
                rows.append(rest[i])
                i += 1
        else:
            trailing.append(rest[i])
            i += 1
    columns = {len(row) - len(row[2:].split("  ", 1)[1].lstrip(" ")) for row in rows}
    assert len(columns) == 1, f"values start in columns {columns}"
    return header, sections, trailing


def section(sections: dict[str, dict[str, str]], prefix: str) -> dict[str, str]:
    (title,) = [t for t in sections if t.startswith(prefix)]
    return sections[title]


def untested_torch_warnings() -> list[str]:
    """The report's trailing warning about the installed torch: none when it is tested."""
    support = versions.torch_support()
    return [] if support.is_tested else [f"warning: {support.message}: {versions.UNTESTED_MEANING}"]


# --- the report in a subprocess --------------------------------------------------------------

INFO_ENV = {"OMP_NUM_THREADS": "1", "NANOPATCH_CHANNELS_LAST": "0"}


@pytest.fixture(scope="module")
def table_report(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("info")
    return run_python(["-m", "nanopatch", "--info"], env=child_env(INFO_ENV), cwd=cwd)


@pytest.fixture(scope="module")
def json_report(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("info_json")
    return run_python(["-m", "nanopatch", "--info", "--json"], env=child_env(INFO_ENV), cwd=cwd)


@pytest.fixture(scope="module")
def info(json_report):
    assert json_report.returncode == 0, json_report.stderr
    return json.loads(json_report.stdout)


def test_info_table_has_every_section_and_the_facts(table_report):
    assert table_report.returncode == 0, table_report.stderr
    header, sections, trailing = parse_table(table_report.stdout.rstrip("\n"))
    assert header.startswith(f"nanopatch {nanopatch.__version__}  |  Python {platform.python_version()}  |  ")
    titles = list(sections)
    assert [next(t for t in titles if t.startswith(s)) for s in SECTIONS] == titles[: len(SECTIONS)]
    assert section(sections, "Options") is sections["Options (argument > NANOPATCH_* > auto)"]
    assert trailing == untested_torch_warnings()  # no other warnings
    tuning = section(sections, "Runtime tuning")
    assert tuning["OMP_NUM_THREADS"] == "1  # set by you: kept"  # INFO_ENV sets it

    facts = cpu.host_facts()
    cpu_rows = sections["CPU"]
    assert cpu_rows["usable cores"] == str(facts.usable_cores)
    assert cpu_rows["logical CPUs"] == str(facts.logical_cpus)
    assert cpu_rows["native bf16"] == f"{'yes' if facts.native_bf16 else 'no'}: {facts.bf16_reason}"

    packages = sections["Packages"]
    assert packages["torch"] == importlib.metadata.version("torch")
    assert packages["torchvision"] == importlib.metadata.version("torchvision")
    for name, version in packages.items():
        assert version == (config.distribution_version(name) or "not installed"), name

    pytorch = sections["PyTorch"]
    assert pytorch["torch threads (intra / inter-op)"].startswith("1 / ")  # OMP_NUM_THREADS=1
    assert pytorch["torchvision"] == "imports fine"
    ipex_ok, ipex_reason = config.ipex_compatibility()
    assert pytorch["IPEX"] == ("compatible: " if ipex_ok else "not used: ") + ipex_reason
    assert pytorch["tested torch versions"] == versions.summary()
    assert pytorch["this torch"] == versions.torch_support().message

    decoding = sections["Image decoding"]
    assert decoding["libturbojpeg"] == (expected_libturbojpeg() or "not found")
    assert re.fullmatch(r"(usable|not used): .+", decoding["PyTurboJPEG"])
    resize = decoding["bilinear resize"]
    assert re.fullmatch(r"(nanopatch's C kernels, compiled by .+, kept in .+|torch and Pillow: .+)", resize)
    crop = decoding["crop-aware decode"]
    assert re.fullmatch(r"(the box alone, with (libjpeg|libjpeg-turbo 3) .+|the whole image, then cut: .+)", crop)
    if os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE") and expected_libturbojpeg():
        assert crop == "the box alone, with libjpeg (jpeg_crop_scanline, compiled by nanopatch)"
    lookup = decoding["ToTensor + Normalize"]
    assert re.fullmatch(r"(nanopatch's C pass, compiled by .+, kept in .+lookup-.+\.so|OpenCV: .+)", lookup)
    jitter = decoding["ColorJitter saturation, hue"]
    assert re.fullmatch(r"(nanopatch's C passes, compiled by .+, kept in .+jitter-.+\.so|numpy and OpenCV: .+)", jitter)
    if os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE"):
        assert all(row.startswith("nanopatch's C") for row in (resize, lookup, jitter))

    runtime = sections["Runtime environment"]
    assert list(runtime) == list(_info.THREAD_VARIABLES)
    assert runtime["OMP_NUM_THREADS"] == "1"
    assert runtime["MKL_NUM_THREADS"] == (os.environ.get("MKL_NUM_THREADS") or "(unset)")

    options = section(sections, "Options")
    assert list(options) == list(config.OPTIONS)
    # the bf16 decision with its reason, from auto-detection on this CPU
    assert options["bf16"] == f"{facts.native_bf16}  [auto] {facts.bf16_reason}"
    assert options["channels_last"] == "False  [environment] set by NANOPATCH_CHANNELS_LAST=0"
    assert options["compile"] == "False  [default] default"


def test_info_json_matches_ground_truth(info):
    assert set(info) >= JSON_KEYS | {"nanopatch", "python", "platform", "targets", "warnings"}
    assert info["nanopatch"] == nanopatch.__version__
    assert info["python"] == platform.python_version()

    c = info["cpu"]
    assert c == cpu.host_facts().as_dict()
    assert isinstance(c["usable_cores"], int) and 1 <= c["usable_cores"] <= c["logical_cpus"]
    assert c["allowed_cpus"] == sorted(os.sched_getaffinity(0))
    assert isinstance(c["native_bf16"], bool) and isinstance(c["bf16_reason"], str) and c["bf16_reason"]

    assert list(info["packages"]) == list(_info._DISTRIBUTIONS)
    assert info["packages"]["torch"] == importlib.metadata.version("torch")
    assert info["packages"] == {name: config.distribution_version(name) for name in _info._DISTRIBUTIONS}

    t = info["torch"]
    assert t["importable"] is True
    assert t["num_threads"] == 1  # OMP_NUM_THREADS=1 in the child's environment
    assert isinstance(t["num_interop_threads"], int) and t["num_interop_threads"] >= 1
    assert isinstance(t["mkldnn_bf16_supported"], bool)
    assert t["torchvision_importable"] is True and "torchvision_error" not in t
    # torch loads its own OpenMP: the report names a library file that exists
    found = re.fullmatch(r"(Intel|GNU|LLVM) OpenMP \((/.+)\)", t["openmp"])
    assert found, t["openmp"]
    assert os.path.exists(found.group(2))

    assert info["torch_support"] == versions.torch_support().as_dict()
    assert info["torch_support"]["version"] == importlib.metadata.version("torch")

    ipex_ok, ipex_reason = config.ipex_compatibility()
    assert info["ipex"] == {"compatible": ipex_ok, "reason": ipex_reason}

    j = info["libturbojpeg"]
    assert j["library"] == expected_libturbojpeg()
    assert j["pyturbojpeg"] == config.distribution_version("PyTurboJPEG")
    assert isinstance(j["usable"], bool)
    if j["usable"]:
        assert j["reason"] == f"PyTurboJPEG {j['pyturbojpeg']} loads libturbojpeg"
    if j["pyturbojpeg"] is None:
        assert j["usable"] is False and "not installed" in j["reason"]

    o = info["opencv"]
    assert o["importable"] is True
    installed = [info["packages"][n] for n in ("opencv-python-headless", "opencv-python") if info["packages"][n]]
    assert any(v.startswith(o["version"]) for v in installed), (o, installed)
    assert isinstance(o["num_threads"], int)

    expected_env = {name: child_env(INFO_ENV).get(name) for name in _info.THREAD_VARIABLES}
    assert expected_env["OMP_NUM_THREADS"] == "1"
    assert info["environment"] == expected_env

    options = info["options"]
    assert list(options) == list(config.OPTIONS)
    assert options["bf16"]["source"] == "auto"
    assert options["bf16"]["value"] is cpu.host_facts().native_bf16
    assert options["bf16"]["reason"] == cpu.host_facts().bf16_reason
    assert options["channels_last"] == {
        "value": False,
        "source": "environment",
        "reason": "set by NANOPATCH_CHANNELS_LAST=0",
    }
    assert options["vision"] == {"value": True, "source": "default", "reason": "default"}
    assert options["compile"] == {"value": False, "source": "default", "reason": "default"}
    assert options["ipex"] == {"value": ipex_ok, "source": "auto", "reason": ipex_reason}
    assert isinstance(info["targets"], dict)
    assert info["warnings"] == []


def test_info_reports_the_runners_own_options(tmp_path):
    proc = run_python(["-m", "nanopatch", "--no-bf16", "--info", "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["options"]["bf16"]["value"] is False
    assert json.loads(proc.stdout)["options"]["bf16"]["source"] == "argument"


FAKE_IPEX_INIT = """
import os, sys
sys.stderr.write("intel_extension_for_pytorch was imported\\n")
os._exit(99)  # like a mismatched IPEX, which terminates the interpreter on import
"""


def test_collect_never_imports_ipex(tmp_path):
    """Even with an IPEX that claims to match the installed torch, the report judges it from
    metadata only; a fake one that kills the interpreter on import proves it."""
    torch_version = importlib.metadata.version("torch")
    site = tmp_path / "site"
    (site / "intel_extension_for_pytorch").mkdir(parents=True)
    (site / "intel_extension_for_pytorch" / "__init__.py").write_text(FAKE_IPEX_INIT)
    dist_info = site / f"intel_extension_for_pytorch-{torch_version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: intel-extension-for-pytorch\nVersion: {torch_version}\n"
    )
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    proc = run_python(
        """
        import json, sys
        from nanopatch.runner import _info
        info = _info.collect()
        print(json.dumps({
            "ipex": info["ipex"],
            "ipex_package": info["packages"]["intel-extension-for-pytorch"],
            "torch_imported": "torch" in sys.modules,
            "ipex_imported": "intel_extension_for_pytorch" in sys.modules,
        }))
        """,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["ipex_imported"] is False
    assert seen["torch_imported"] is True  # the report did import torch, just not IPEX
    assert seen["ipex_package"] == torch_version
    assert seen["ipex"] == {
        "compatible": True,
        "reason": f"intel-extension-for-pytorch {torch_version} matches torch {torch_version}",
    }


# --- loaded_openmp_runtime (in-process, fixture maps) ----------------------------------------

MAPS_HEAD = """\
55d0c8a00000-55d0c8a2d000 r--p 00000000 08:01 393226                     /usr/bin/python3.11
7f2a10000000-7f2a10021000 rw-p 00000000 00:00 0
7f2a1a000000-7f2a1a028000 r--p 00000000 08:01 1315074                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f2a1b000000-7f2a1d000000 r-xp 00100000 08:01 2097160                    {site}/torch/lib/libtorch_cpu.so
"""
MAPS_TAIL = """\
7ffd3c5e0000-7ffd3c601000 rw-p 00000000 00:00 0                          [stack]
7ffd3c7f2000-7ffd3c7f4000 r-xp 00000000 00:00 0                          [vdso]
"""
SITE = "/venv/lib/python3.11/site-packages"


def maps_with(*libraries: str) -> str:
    lines = "".join(
        f"7f2a1e{n:06x}-7f2a1e{n + 1:06x} r-xp 00000000 08:01 {2097170 + n}                    {lib}\n"
        for n, lib in enumerate(libraries)
    )
    return MAPS_HEAD.format(site=SITE) + lines + MAPS_TAIL


@pytest.mark.parametrize(
    "libraries, expected",
    [
        ([f"{SITE}/torch/lib/libgomp.so.1"], f"GNU OpenMP ({SITE}/torch/lib/libgomp.so.1)"),
        (["/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0"], "GNU OpenMP (/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0)"),
        (["/opt/intel/oneapi/lib/libiomp5.so"], "Intel OpenMP (/opt/intel/oneapi/lib/libiomp5.so)"),
        (["/usr/lib/llvm-16/lib/libomp.so.5"], "LLVM OpenMP (/usr/lib/llvm-16/lib/libomp.so.5)"),
        ([], "none loaded"),
        # look-alikes are not OpenMP runtimes
        (["/usr/lib/libgompish.so", "/usr/lib/libompl.so.2"], "none loaded"),
    ],
    ids=["torch-gomp", "system-gomp", "iomp5", "llvm-omp", "none", "look-alikes"],
)
def test_loaded_openmp_runtime(tmp_path, libraries, expected):
    maps = tmp_path / "maps"
    maps.write_text(maps_with(*libraries))
    assert _info.loaded_openmp_runtime(str(maps)) == expected


@pytest.mark.parametrize(
    "library",
    [f"{SITE}/torch/lib/libgomp-a34b3233.so.1", f"{SITE}/torch.libs/libgomp-947d5fa1.so.1.0.0"],
    ids=["x86_64-torch-lib", "aarch64-torch-libs"],
)
def test_loaded_openmp_runtime_hashed_wheel_names(tmp_path, library):
    maps = tmp_path / "maps"
    maps.write_text(maps_with(library))
    assert _info.loaded_openmp_runtime(str(maps)) == f"GNU OpenMP ({library})"


def test_loaded_openmp_runtime_unreadable_maps(tmp_path):
    assert _info.loaded_openmp_runtime(str(tmp_path / "no-such-maps")) == "unknown"
    assert _info.loaded_openmp_runtime(str(tmp_path)) == "unknown"  # a directory: OSError too


# --- format_table (in-process, hand-made info) ---------------------------------------------------


def make_info(**overrides):
    info = {
        "nanopatch": "9.8.7",
        "python": "3.99.0",
        "platform": "Linux-test",
        "cpu": {
            "vendor": "GenuineIntel",
            "model_name": "Test Xeon",
            "logical_cpus": 8,
            "allowed_cpus": [0, 1, 2, 3],
            "physical_cores": 2,
            "cpu_quota": 1.5,
            "usable_cores": 1,
            "avx2": True,
            "avx512": False,
            "amx": False,
            "native_bf16": False,
            "bf16_reason": "no native bf16 here",
        },
        "packages": {"torch": "2.13.0", "intel-extension-for-pytorch": None},
        "torch": {
            "importable": True,
            "num_threads": 4,
            "num_interop_threads": 2,
            "openmp": "GNU OpenMP (/x/libgomp.so.1)",
            "mkldnn_bf16_supported": False,
            "torchvision_importable": True,
        },
        "torch_support": {"summary": "2.1 to 2.2: all", "message": "torch 2.13.0 is fine", "meaning": None},
        "ipex": {"compatible": False, "reason": "intel-extension-for-pytorch is not installed"},
        "libturbojpeg": {"library": None, "pyturbojpeg": None, "usable": False, "reason": "PyTurboJPEG is missing"},
        "opencv": {"importable": True, "version": "4.10.0", "num_threads": 3},
        "resize_kernel": {"used": False, "reason": "no C compiler (cc, gcc or clang) on PATH"},
        "crop_decode": {"used": False, "reason": "no fast JPEG decoder (Pillow decodes)"},
        "lookup_kernel": {"used": False, "reason": "NANOPATCH_NATIVE=0"},
        "jitter_kernel": {"used": True, "reason": "compiled by cc, kept in /c/kernels/jitter-0.so"},
        "environment": {"OMP_NUM_THREADS": "4", "LD_PRELOAD": None},
        "options": {
            "bf16": {"value": False, "source": "auto", "reason": "no native bf16 here"},
            "compile": {"value": "max-autotune", "source": "environment", "reason": "set by NANOPATCH_COMPILE"},
        },
        "targets": {},
        "warnings": [],
    }
    for key, value in overrides.items():
        info[key] = value
    return info


def test_format_table_on_a_hand_made_report():
    header, sections, trailing = parse_table(_info.format_table(make_info()))
    assert header == "nanopatch 9.8.7  |  Python 3.99.0  |  Linux-test"
    untuned = [t for t in SECTIONS[:-1] if t != "Runtime tuning"]  # no "tuning" key: no such section
    assert list(sections) == [*untuned, "Options (argument > NANOPATCH_* > auto)"]
    assert sections["CPU"] == {
        "model": "GenuineIntel Test Xeon",
        "logical CPUs": "8",
        "allowed CPUs": "0,1,2,3",
        "physical cores (allowed)": "2",
        "cgroup CPU quota": "1.5 CPUs",
        "usable cores": "1",
        "AVX2 / AVX-512 / AMX": "yes / no / no",
        "native bf16": "no: no native bf16 here",
    }
    assert sections["Packages"] == {"torch": "2.13.0", "intel-extension-for-pytorch": "not installed"}
    assert sections["PyTorch"] == {
        "torch threads (intra / inter-op)": "4 / 2",
        "OpenMP runtime": "GNU OpenMP (/x/libgomp.so.1)",
        "oneDNN bf16 supported": "no",
        "torchvision": "imports fine",
        "IPEX": "not used: intel-extension-for-pytorch is not installed",
        "tested torch versions": "2.1 to 2.2: all",
        "this torch": "torch 2.13.0 is fine",
    }
    assert sections["Image decoding"] == {
        "libturbojpeg": "not found",
        "PyTurboJPEG": "not used: PyTurboJPEG is missing",
        "OpenCV": "4.10.0 (3 threads)",
        "crop-aware decode": "the whole image, then cut: no fast JPEG decoder (Pillow decodes)",
        "bilinear resize": "torch and Pillow: no C compiler (cc, gcc or clang) on PATH",
        "ToTensor + Normalize": "OpenCV: NANOPATCH_NATIVE=0",
        "ColorJitter saturation, hue": "nanopatch's C passes, compiled by cc, kept in /c/kernels/jitter-0.so",
    }
    assert sections["Runtime environment"] == {"OMP_NUM_THREADS": "4", "LD_PRELOAD": "(unset)"}
    assert section(sections, "Options") == {
        "bf16": "False  [auto] no native bf16 here",
        "compile": "max-autotune  [environment] set by NANOPATCH_COMPILE",
    }
    assert trailing == []


def test_format_table_torch_not_importable():
    info = make_info(
        torch={"importable": False, "error": "OSError: libtorch_cpu.so: cannot open shared object file"},
        ipex={"compatible": False, "reason": "intel-extension-for-pytorch 2.1.0 needs torch 2.1.*"},
        opencv={"importable": False, "error": "ImportError: libGL.so.1: cannot open shared object file"},
    )
    _, sections, _ = parse_table(_info.format_table(info))
    assert sections["PyTorch"] == {
        "torch": "cannot import: OSError: libtorch_cpu.so: cannot open shared object file",
        "IPEX": "not used: intel-extension-for-pytorch 2.1.0 needs torch 2.1.*",
        "tested torch versions": "2.1 to 2.2: all",
        "this torch": "torch 2.13.0 is fine",
    }
    assert (
        sections["Image decoding"]["OpenCV"] == "cannot import: ImportError: libGL.so.1: cannot open shared object file"
    )


def test_format_table_broken_torchvision_targets_and_warnings():
    torch_report = {
        **make_info()["torch"],
        "torchvision_importable": False,
        "torchvision_error": "RuntimeError: operator torchvision::nms does not exist",
    }
    info = make_info(
        torch=torch_report,
        cpu={**make_info()["cpu"], "cpu_quota": None, "vendor": "", "model_name": ""},
        ipex={"compatible": True, "reason": "intel-extension-for-pytorch 2.8.0 matches torch 2.8.0"},
        libturbojpeg={
            "library": "libturbojpeg.so.0",
            "pyturbojpeg": "1.8.3",
            "usable": True,
            "reason": "PyTurboJPEG 1.8.3 loads libturbojpeg",
        },
        targets={
            "vision": {"state": "pending", "module": "torchvision", "detail": "applies when torchvision is imported"},
            "training": {"state": "patched", "module": "torch", "detail": ""},
        },
        warnings=["first problem", "second problem"],
    )
    _, sections, trailing = parse_table(_info.format_table(info))
    assert sections["PyTorch"]["torchvision"] == "BROKEN: RuntimeError: operator torchvision::nms does not exist"
    assert sections["PyTorch"]["IPEX"] == "compatible: intel-extension-for-pytorch 2.8.0 matches torch 2.8.0"
    assert sections["CPU"]["cgroup CPU quota"] == "none"
    assert sections["CPU"]["model"] == "unknown"
    assert sections["Image decoding"]["libturbojpeg"] == "libturbojpeg.so.0"
    assert sections["Image decoding"]["PyTurboJPEG"] == "usable: PyTurboJPEG 1.8.3 loads libturbojpeg"
    assert list(sections)[-1] == "Patch targets"
    assert sections["Patch targets"] == {
        "vision": "pending (torchvision) applies when torchvision is imported",
        "training": "patched (torch)",
    }
    assert trailing == ["warning: first problem", "warning: second problem"]


def test_format_table_shows_the_runtime_plan_and_each_process():
    from nanopatch.runtime import tuning as runtime

    plan = runtime.Plan(
        (
            runtime.Setting("OMP_NUM_THREADS", "2", "2 physical core(s) in this process's CPU set"),
            runtime.Setting("LD_PRELOAD", "/lib/libjemalloc.so.2", "jemalloc appended to LD_PRELOAD"),
        ),
        2,
        (0, 1),
        "gnu",
        "/lib/libjemalloc.so.2",
    )
    tuning = plan.as_dict()
    tuning["processes"] = ["CPUs 0: OMP_NUM_THREADS=1", "CPUs 1: OMP_NUM_THREADS=1"]
    _, sections, _ = parse_table(_info.format_table(make_info(tuning=tuning)))
    rows = section(sections, "Runtime tuning")
    assert rows["OMP_NUM_THREADS"] == "2  # 2 physical core(s) in this process's CPU set"
    assert rows["LD_PRELOAD"].startswith("/lib/libjemalloc.so.2  # jemalloc appended")
    assert "started again once" in rows["re-exec"]
    assert rows["process 1"] == "CPUs 1: OMP_NUM_THREADS=1"
    off = parse_table(_info.format_table(make_info(tuning=None)))[1]
    assert off["Runtime tuning"] == {"tuning": "off (--no-tune): the environment is left as it is"}
    tuning.update(needs_reexec=False, processes_measured="2 (measured: 1.8x the speed of 1)")
    rows = section(parse_table(_info.format_table(make_info(tuning=tuning)))[1], "Runtime tuning")
    assert "re-exec" not in rows and rows["processes (--nproc measure)"] == "2 (measured: 1.8x the speed of 1)"


# --- the tested torch versions (nanopatch/engine/versions.py) ------------------------------------------

OUTSIDE = "is outside the tested range (2.8 to 2.15)"


@pytest.mark.parametrize(
    "torch_version, message",
    [
        ("2.13.0", "torch 2.13.0 is tested: the full suite (tox -e py)"),
        ("2.13.0+cpu", "torch 2.13.0+cpu is tested: the full suite (tox -e py)"),
        ("2.15.0", "torch 2.15.0 is tested: the full suite (tox -e newest)"),
        ("2.8.0", "torch 2.8.0 is tested: the full suite with IPEX 2.8 (tox -e ipex)"),
        ("2.12.0", "torch 2.12.0 is tested: the learning oracle, on 2.12.1 of the same minor (tox -e between)"),
        ("2.10.0", "torch 2.10.0 is tested: the learning oracle (tox -e between)"),
    ],
)
def test_info_on_a_tested_torch(machine, torch_version, message):
    machine("xeon_spr_2s_ht.cpuinfo", torch=torch_version)
    info = _info.collect()
    support = info["torch_support"]
    assert (support["version"], support["tested"], support["message"]) == (torch_version, True, message)
    assert support["meaning"] is None
    _, sections, trailing = parse_table(_info.format_table(info))
    assert sections["PyTorch"]["this torch"] == message
    assert sections["PyTorch"]["tested torch versions"] == (
        "2.8 to 2.15: the full suite on 2.8 (+ IPEX 2.8), 2.13, 2.15; "
        "the learning oracle on 2.9, 2.10, 2.11, 2.12, 2.14"
    )
    assert trailing == []


@pytest.mark.parametrize("torch_version", ["2.16.0", "2.16.0.dev20261201+cpu", "2.7.1", "2.1.0"])
def test_info_says_plainly_when_torch_is_outside_the_tested_range(machine, torch_version):
    machine("xeon_spr_2s_ht.cpuinfo", torch=torch_version)
    info = _info.collect()
    support = info["torch_support"]
    message = f"torch {torch_version} {OUTSIDE}"
    assert (support["version"], support["tested"], support["message"]) == (torch_version, False, message)
    assert support["meaning"] == versions.UNTESTED_MEANING
    assert "self-checks turn off" in support["meaning"] and "--verify" in support["meaning"]
    assert [v["torch"] for v in support["versions"]] == [t.torch for t in versions.TESTED]
    assert json.loads(json.dumps(info))["torch_support"] == support  # --json prints it as it is
    _, sections, trailing = parse_table(_info.format_table(info))
    assert sections["PyTorch"]["this torch"] == message
    assert trailing == [f"warning: {message}: {versions.UNTESTED_MEANING}"]


def test_info_on_a_minor_inside_the_range_that_is_not_tested(machine, monkeypatch):
    monkeypatch.setattr(versions, "TESTED", tuple(t for t in versions.TESTED if t.torch != "2.11.0"))
    machine("xeon_spr_2s_ht.cpuinfo", torch="2.11.0")
    support = _info.collect()["torch_support"]
    assert support["tested"] is False
    inside = "inside the tested range, 2.8 to 2.15, but not tested itself"
    assert support["message"] == f"torch 2.11.0 is not tested ({inside})"
    assert support["summary"].endswith("the learning oracle on 2.9, 2.10, 2.12, 2.14")


def test_info_without_torch_installed(machine):
    machine("xeon_spr_2s_ht.cpuinfo", torch=None)
    support = versions.torch_support().as_dict()
    assert (support["version"], support["tested"], support["meaning"]) == (None, False, None)
    assert support["message"] == "torch is not installed"


def tox_ini() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(REPO_ROOT / "tox.ini")
    return parser


def pins(deps: str) -> tuple[str, str] | None:
    found = dict(re.findall(r"^\s*(torch|torchvision)==(\S+)\s*$", deps, re.MULTILINE))
    return (found["torch"], found["torchvision"]) if found else None


def test_the_tested_versions_are_what_tox_tests():
    """nanopatch/engine/versions.py (what --info claims) and tox.ini (what runs) name the same pairs."""
    tox = tox_ini()
    env_list = [e.strip() for e in tox["tox"]["env_list"].split(",")]
    claimed = {(t.torch, t.torchvision, t.tests, t.env) for t in versions.TESTED}
    run = set()
    for name in env_list:
        section = tox[f"testenv:{name}"] if name != "py" else tox["testenv"]
        commands = section.get("commands", tox["testenv"]["commands"]).strip()
        reference = re.fullmatch(r"\{\[testenv:(\w+)\]commands\}", commands)
        if reference:
            commands = tox[f"testenv:{reference[1]}"]["commands"].strip()
        # the whole suite (newest and ipex leave the bench scripts' tiny runs and the tests
        # marked py_only to py)
        left = r'(-m "not py_only" )?--ignore-glob=\*/test_bench_\*\.py'
        if re.fullmatch(rf"pytest( -n \d+)?( --durations=\d+)? \{{posargs(:{left})?\}}", commands):
            pair = pins(section.get("deps", ""))
            assert pair, f"tox env {name} runs the suite on an unpinned torch"
            run.add((*pair, versions.FULL, name))
        elif "run_on_torch_versions.py" in commands:
            assert "tests/training/test_learning.py" in commands
            pairs = re.findall(r"\s(\d+\.\d+\.\d+)/(\d+\.\d+\.\d+)", commands)
            run.update((torch, torchvision, versions.LEARNING, name) for torch, torchvision in pairs)
    assert run == claimed
    assert [t.minor for t in versions.TESTED] == sorted(t.minor for t in versions.TESTED)


def test_pyprojects_floor_is_the_oldest_tested_pair():
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    oldest = versions.TESTED[0]
    major_minor = ".".join(map(str, oldest.minor))
    assert f'"torch>={major_minor}"' in pyproject
    assert f'"torchvision>={".".join(oldest.torchvision.split(".")[:2])}"' in pyproject
    assert f'"intel-extension-for-pytorch>={major_minor}"' in pyproject
