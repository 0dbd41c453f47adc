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


def _vision_report(key: str) -> dict[str, Any]:
    """One row's ``{"used", "reason"}`` of the compiled vision code, which the report may build
    and check (``--info`` asked); never fails over one row. ``key``: ``resize_kernel`` (bilinear
    resizes on nanopatch's kernels), ``crop_decode`` (RandomResizedCrop's box decoded alone),
    ``lookup_kernel`` (ToTensor + Normalize's planes in one pass) or ``jitter_kernel``
    (ColorJitter's saturation and hue passes)."""
    try:
        from nanopatch.targets.vision import decode, native

        reports = {
            "resize_kernel": native.report,
            "crop_decode": decode.region_report,
            "lookup_kernel": native.lookup_report,
            "jitter_kernel": native.jitter_report,
        }
        return reports[key]()
    except Exception as exc:
        return {"used": False, "reason": _error(exc)}


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
        "resize_kernel": _vision_report("resize_kernel"),
        "crop_decode": _vision_report("crop_decode"),
        "lookup_kernel": _vision_report("lookup_kernel"),
        "jitter_kernel": _vision_report("jitter_kernel"),
        "environment": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "options": current["options"] if current["patched"] else config.resolve(options).as_dict(),
        "targets": current["targets"],
        "warnings": current["warnings"],
        "tuning": tuning,
    }


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


#: one section of the ``--info`` table: its title and its (key, value) rows
_Section = tuple[str, list[tuple[str, str]]]


def format_table(info: dict[str, Any]) -> str:
    """The report as aligned two-column sections for a terminal: a header line, one section per
    part of the report (each built by a ``_*_section`` helper below), then the warnings."""
    sections: list[_Section] = [
        _cpu_section(info["cpu"]),
        ("Packages", [(name, version or "not installed") for name, version in info["packages"].items()]),
        _pytorch_section(info["torch"], info["ipex"], info["torch_support"]),
        _image_decoding_section(
            info["libturbojpeg"],
            info["opencv"],
            info.get("resize_kernel"),
            info.get("crop_decode"),
            info.get("lookup_kernel"),
            info.get("jitter_kernel"),
        ),
        _environment_section(info["environment"]),
    ]
    tuning = _tuning_section(info)
    if tuning is not None:
        sections.append(tuning)
    sections.append(_options_section(info["options"]))
    if info["targets"]:
        sections.append(_targets_section(info["targets"]))
    header = f"nanopatch {info['nanopatch']}  |  Python {info['python']}  |  {info['platform']}"
    lines = [header, *_aligned_sections(sections)]
    lines.extend(f"warning: {warning}" for warning in _warnings(info["warnings"], info["torch_support"]))
    return "\n".join(lines)


def _cpu_section(facts: dict[str, Any]) -> _Section:
    """The CPU: what it is, which of its CPUs this process may use, and its vector extensions
    (``facts``: :meth:`nanopatch.foundation.cpu.CpuFacts.as_dict`)."""
    quota = "none" if facts["cpu_quota"] is None else f"{facts['cpu_quota']:g} CPUs"
    extensions = f"{_yes(facts['avx2'])} / {_yes(facts['avx512'])} / {_yes(facts['amx'])}"
    return (
        "CPU",
        [
            ("model", f"{facts['vendor']} {facts['model_name']}".strip() or "unknown"),
            ("logical CPUs", str(facts["logical_cpus"])),
            ("allowed CPUs", ",".join(map(str, facts["allowed_cpus"]))),
            ("physical cores (allowed)", str(facts["physical_cores"])),
            ("cgroup CPU quota", quota),
            ("usable cores", str(facts["usable_cores"])),
            ("AVX2 / AVX-512 / AMX", extensions),
            ("native bf16", f"{_yes(facts['native_bf16'])}: {facts['bf16_reason']}"),
        ],
    )


def _pytorch_section(torch: dict[str, Any], ipex: dict[str, Any], support: dict[str, Any]) -> _Section:
    """torch as this process imports it (``torch``: :func:`_torch_report`, or why it cannot be
    imported), whether IPEX would be used, and whether this torch version is a tested one."""
    if torch["importable"]:
        torchvision = "imports fine" if torch["torchvision_importable"] else f"BROKEN: {torch['torchvision_error']}"
        rows = [
            ("torch threads (intra / inter-op)", f"{torch['num_threads']} / {torch['num_interop_threads']}"),
            ("OpenMP runtime", torch["openmp"]),
            ("oneDNN bf16 supported", _yes(torch["mkldnn_bf16_supported"])),
            ("torchvision", torchvision),
        ]
    else:
        rows = [("torch", f"cannot import: {torch['error']}")]
    rows.append(("IPEX", ("compatible: " if ipex["compatible"] else "not used: ") + ipex["reason"]))
    rows.append(("tested torch versions", support["summary"]))
    rows.append(("this torch", support["message"]))
    return ("PyTorch", rows)


def _image_decoding_section(
    turbojpeg: dict[str, Any],
    opencv: dict[str, Any],
    resize_kernel: dict[str, Any] | None = None,
    crop_decode: dict[str, Any] | None = None,
    lookup_kernel: dict[str, Any] | None = None,
    jitter_kernel: dict[str, Any] | None = None,
) -> _Section:
    """The JPEG decoders nanopatch can use: libturbojpeg through PyTurboJPEG
    (:func:`libturbojpeg_report`), and OpenCV (:func:`_opencv_report`); what decodes a crop's box
    alone, what runs the exact pass of bilinear resizes, ToTensor + Normalize's planes and
    ColorJitter's saturation and hue (each :func:`_vision_report`)."""
    if opencv["importable"]:
        opencv_text = f"{opencv['version']} ({opencv['num_threads']} threads)"
    else:
        opencv_text = f"cannot import: {opencv['error']}"
    rows = [
        ("libturbojpeg", turbojpeg["library"] or "not found"),
        ("PyTurboJPEG", ("usable: " if turbojpeg["usable"] else "not used: ") + turbojpeg["reason"]),
        ("OpenCV", opencv_text),
    ]
    compiled = (  # (row, its report, the words when used, when not)
        ("crop-aware decode", crop_decode, "the box alone, with ", "the whole image, then cut: "),
        ("bilinear resize", resize_kernel, "nanopatch's C kernels, ", "torch and Pillow: "),
        ("ToTensor + Normalize", lookup_kernel, "nanopatch's C pass, ", "OpenCV: "),
        ("ColorJitter saturation, hue", jitter_kernel, "nanopatch's C passes, ", "numpy and OpenCV: "),
    )
    for name, report, used, unused in compiled:
        if report is not None:
            rows.append((name, (used if report["used"] else unused) + str(report["reason"])))
    return ("Image decoding", rows)


def _environment_section(environment: dict[str, str | None]) -> _Section:
    """The :data:`THREAD_VARIABLES` as this process found them."""
    return (
        "Runtime environment",
        [(name, value if value is not None else "(unset)") for name, value in environment.items()],
    )


def _tuning_section(info: dict[str, Any]) -> _Section | None:
    """What the runner would set (``info["tuning"]``: :meth:`nanopatch.runtime.tuning.Plan.as_dict`
    plus ``processes`` and ``processes_measured`` for ``--nproc``), that tuning is off where it is
    None (``--no-tune``), or None (no section) where the report has no ``tuning`` at all."""
    tuning = info.get("tuning")
    if not tuning:
        if "tuning" in info:
            return ("Runtime tuning", [("tuning", "off (--no-tune): the environment is left as it is")])
        return None
    summary = f"{tuning['threads']} / {tuning['openmp']} / {tuning['allocator']}"
    rows = [("threads / OpenMP / allocator", summary)]
    rows.extend(_tuning_setting_row(setting) for setting in tuning["settings"])
    if tuning.get("needs_reexec"):
        rows.append(("re-exec", "the interpreter is started again once, so that LD_PRELOAD takes effect"))
    for rank, cpus in enumerate(tuning.get("processes") or []):
        rows.append((f"process {rank}", cpus))
    if tuning.get("processes_measured"):
        rows.append(("processes (--nproc measure)", tuning["processes_measured"]))
    return ("Runtime tuning (what python -m nanopatch would set, and why)", rows)


def _tuning_setting_row(setting: dict[str, Any]) -> tuple[str, str]:
    """One variable of the plan (a :class:`nanopatch.runtime.tuning.Setting` as a dict): the
    user's value it keeps, else the value it sets, and why."""
    shown = setting["kept"] if setting["kept"] is not None else setting["value"]
    return (setting["name"], f"{shown if shown is not None else '(unset)'}  # {setting['reason']}")


def _options_section(options: dict[str, dict[str, Any]]) -> _Section:
    """Each option's value, where it came from, and why."""
    return (
        "Options (argument > NANOPATCH_* > auto)",
        [(name, f"{option['value']}  [{option['source']}] {option['reason']}") for name, option in options.items()],
    )


def _targets_section(targets: dict[str, dict[str, Any]]) -> _Section:
    """The state of each patch target (only in a process that has patched)."""
    return (
        "Patch targets",
        [
            (name, f"{target['state']} ({target['module']}) {target['detail']}".rstrip())
            for name, target in targets.items()
        ],
    )


def _aligned_sections(sections: list[_Section]) -> list[str]:
    """The sections' lines: a blank line, the underlined title, then the rows, the keys of all
    sections padded to one width so that every value starts in the same column."""
    width = max(len(key) for _, rows in sections for key, _ in rows)
    lines = []
    for title, rows in sections:
        lines.append("")
        lines.append(title)
        lines.append("-" * len(title))
        lines.extend(f"  {key:<{width}}  {value}" for key, value in rows)
    return lines


def _warnings(warnings: list[str], support: dict[str, Any]) -> list[str]:
    """The report's warnings, and what an untested torch version means where it is one."""
    shown = list(warnings)
    if support["meaning"]:
        shown.append(f"{support['message']}: {support['meaning']}")
    return shown
