"""The capability report behind ``python -m nanopatch --info``.

It may import torch, torchvision and OpenCV (the user asked for a report), but never
intel_extension_for_pytorch: a mismatched IPEX terminates the interpreter on import, so
its compatibility is judged from package metadata.
"""

from __future__ import annotations

import ctypes.util
import os
import platform
import re
import sys
from typing import Any

from nanopatch import __version__
from nanopatch.engine import config, status, versions
from nanopatch.foundation import cpu
from nanopatch.runtime import tuning as runtime

_DISTRIBUTIONS = (
    "torch",
    "torchvision",
    "intel-extension-for-pytorch",
    "numpy",
    "opencv-python-headless",
    "opencv-python",
    "PyTurboJPEG",
    "pillow",
    "wrapt",
)

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "GOMP_CPU_AFFINITY",
    "OMP_PROC_BIND",
    "LD_PRELOAD",
    "MALLOC_CONF",
)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


_OPENMP_LIBRARIES = (("libiomp5", "Intel OpenMP"), ("libgomp", "GNU OpenMP"), ("libomp", "LLVM OpenMP"))


def loaded_openmp_runtime(maps_path: str = "/proc/self/maps") -> str:
    """Which OpenMP runtime this process has loaded (torch brings its own), from the memory map."""
    paths = runtime.mapped_libraries(maps_path)
    if paths is None:
        return "unknown"
    for stem, label in _OPENMP_LIBRARIES:
        for path in paths:
            # "libgomp.so.1", or a wheel's vendored copy with a hash: "libgomp-a34b3233.so.1"
            if re.match(re.escape(stem) + r"(-[0-9a-f]+)?\.so", os.path.basename(path)):
                return f"{label} ({path})"
    return "none loaded"


def _torch_report() -> dict[str, Any]:
    report: dict[str, Any] = {"importable": False}
    try:
        import torch
    except Exception as exc:  # broken or missing install: report it, do not crash
        report["error"] = _error(exc)
        return report
    report["importable"] = True
    report["num_threads"] = torch.get_num_threads()
    report["num_interop_threads"] = torch.get_num_interop_threads()
    report["openmp"] = loaded_openmp_runtime()
    try:
        report["mkldnn_bf16_supported"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # the op moved or does not exist in this torch build
        report["mkldnn_bf16_supported"] = False
    try:
        import torchvision  # noqa: F401

        report["torchvision_importable"] = True
    except Exception as exc:  # e.g. "operator torchvision::nms does not exist": a mismatched pair
        report["torchvision_importable"] = False
        report["torchvision_error"] = _error(exc)
    return report


def libturbojpeg_report() -> dict[str, Any]:
    """Whether PyTurboJPEG can drive a libturbojpeg on this machine."""
    report: dict[str, Any] = {"library": ctypes.util.find_library("turbojpeg")}
    pyturbo = config.distribution_version("PyTurboJPEG")
    report["pyturbojpeg"] = pyturbo
    if pyturbo is None:
        report["usable"] = False
        report["reason"] = "PyTurboJPEG is not installed (pip install 'nanopatch[turbojpeg]')"
        return report
    from nanopatch.targets.vision.decode import TURBOJPEG_LIB_VARIABLE

    lib_path = os.environ.get(TURBOJPEG_LIB_VARIABLE) or None
    if lib_path:
        report["library"] = lib_path
    try:
        from turbojpeg import TurboJPEG

        TurboJPEG(lib_path=lib_path)
    except Exception as exc:
        report["usable"] = False
        report["reason"] = f"PyTurboJPEG {pyturbo} cannot load libturbojpeg: {_error(exc)}"
    else:
        report["usable"] = True
        report["reason"] = f"PyTurboJPEG {pyturbo} loads libturbojpeg"
    return report


def _opencv_report() -> dict[str, Any]:
    try:
        import cv2
    except Exception as exc:
        return {"importable": False, "error": _error(exc)}
    return {"importable": True, "version": cv2.__version__, "num_threads": cv2.getNumThreads()}


def collect(options: dict[str, Any] | None = None, tuning: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``--info`` shows, as a JSON-friendly dict. ``options`` are explicit option
    values (the runner's flags); the report shows how they resolve with the environment.
    ``tuning`` is what the runner would set (:meth:`nanopatch.runtime.tuning.Plan.as_dict`, plus
    ``processes`` for ``--nproc``)."""
    facts = cpu.host_facts()
    ipex_ok, ipex_reason = config.ipex_compatibility()
    current = status()
    return {
        "nanopatch": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": facts.as_dict(),
        "packages": {name: config.distribution_version(name) for name in _DISTRIBUTIONS},
        "torch": _torch_report(),
        "torch_support": versions.torch_support().as_dict(),
        "ipex": {"compatible": ipex_ok, "reason": ipex_reason},
        "libturbojpeg": libturbojpeg_report(),
        "opencv": _opencv_report(),
        "environment": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "options": current["options"] if current["patched"] else config.resolve(options).as_dict(),
        "targets": current["targets"],
        "warnings": current["warnings"],
        "tuning": tuning,
    }


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def format_table(info: dict[str, Any]) -> str:
    """The report as aligned two-column sections for a terminal."""
    c = info["cpu"]
    t = info["torch"]
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    quota = "none" if c["cpu_quota"] is None else f"{c['cpu_quota']:g} CPUs"
    sections.append(
        (
            "CPU",
            [
                ("model", f"{c['vendor']} {c['model_name']}".strip() or "unknown"),
                ("logical CPUs", str(c["logical_cpus"])),
                ("allowed CPUs", ",".join(map(str, c["allowed_cpus"]))),
                ("physical cores (allowed)", str(c["physical_cores"])),
                ("cgroup CPU quota", quota),
                ("usable cores", str(c["usable_cores"])),
                ("AVX2 / AVX-512 / AMX", f"{_yes(c['avx2'])} / {_yes(c['avx512'])} / {_yes(c['amx'])}"),
                ("native bf16", f"{_yes(c['native_bf16'])}: {c['bf16_reason']}"),
            ],
        )
    )
    packages = [(name, version or "not installed") for name, version in info["packages"].items()]
    sections.append(("Packages", packages))
    if t["importable"]:
        torch_rows = [
            ("torch threads (intra / inter-op)", f"{t['num_threads']} / {t['num_interop_threads']}"),
            ("OpenMP runtime", t["openmp"]),
            ("oneDNN bf16 supported", _yes(t["mkldnn_bf16_supported"])),
            (
                "torchvision",
                "imports fine" if t["torchvision_importable"] else f"BROKEN: {t['torchvision_error']}",
            ),
        ]
    else:
        torch_rows = [("torch", f"cannot import: {t['error']}")]
    ipex = info["ipex"]
    torch_rows.append(("IPEX", ("compatible: " if ipex["compatible"] else "not used: ") + ipex["reason"]))
    support = info["torch_support"]
    torch_rows.append(("tested torch versions", support["summary"]))
    torch_rows.append(("this torch", support["message"]))
    sections.append(("PyTorch", torch_rows))
    j = info["libturbojpeg"]
    o = info["opencv"]
    sections.append(
        (
            "Image decoding",
            [
                ("libturbojpeg", j["library"] or "not found"),
                ("PyTurboJPEG", ("usable: " if j["usable"] else "not used: ") + j["reason"]),
                (
                    "OpenCV",
                    f"{o['version']} ({o['num_threads']} threads)"
                    if o["importable"]
                    else f"cannot import: {o['error']}",
                ),
            ],
        )
    )
    sections.append(
        (
            "Runtime environment",
            [(name, value if value is not None else "(unset)") for name, value in info["environment"].items()],
        )
    )
    tuning = info.get("tuning")
    if tuning:
        rows = [("threads / OpenMP / allocator", f"{tuning['threads']} / {tuning['openmp']} / {tuning['allocator']}")]
        for s in tuning["settings"]:
            shown = s["kept"] if s["kept"] is not None else s["value"]
            rows.append((s["name"], f"{shown if shown is not None else '(unset)'}  # {s['reason']}"))
        if tuning.get("needs_reexec"):
            rows.append(("re-exec", "the interpreter is started again once, so that LD_PRELOAD takes effect"))
        for rank, cpus in enumerate(tuning.get("processes") or []):
            rows.append((f"process {rank}", cpus))
        if tuning.get("processes_measured"):
            rows.append(("processes (--nproc measure)", tuning["processes_measured"]))
        sections.append(("Runtime tuning (what python -m nanopatch would set, and why)", rows))
    elif "tuning" in info:
        sections.append(("Runtime tuning", [("tuning", "off (--no-tune): the environment is left as it is")]))
    sections.append(
        (
            "Options (argument > NANOPATCH_* > auto)",
            [(name, f"{o['value']}  [{o['source']}] {o['reason']}") for name, o in info["options"].items()],
        )
    )
    if info["targets"]:
        sections.append(
            (
                "Patch targets",
                [(name, f"{t['state']} ({t['module']}) {t['detail']}".rstrip()) for name, t in info["targets"].items()],
            )
        )
    width = max(len(key) for _, rows in sections for key, _ in rows)
    lines = [f"nanopatch {info['nanopatch']}  |  Python {info['python']}  |  {info['platform']}"]
    for title, rows in sections:
        lines.append("")
        lines.append(title)
        lines.append("-" * len(title))
        lines.extend(f"  {key:<{width}}  {value}" for key, value in rows)
    warnings = list(info["warnings"])
    if support["meaning"]:
        warnings.append(f"{support['message']}: {support['meaning']}")
    lines.extend(f"warning: {warning}" for warning in warnings)
    return "\n".join(lines)
