"""Pillow's bilinear resampling of one axis as a compiled loop: the exact pass of nanopatch's resizes.

A bilinear resize runs its exact pass (``_geometry._pillow_rows``: Pillow's vertical pass over
the bytes of each line, which also serves horizontal passes on transposed pixels) on Pillow,
whose loop multiplies one byte by one 22-bit weight at a time: ~0.5 ms of a 500x375 image's
~1.5 ms of transforms. This module carries that loop's C source: Pillow's weights
(``precompute_coeffs`` and ``normalize_coeffs_8bpc`` of Resample.c for the bilinear filter: the
same double arithmetic in the same order, no contraction into fused multiply-adds) and Pillow's
integer sums, rounding and clipping, over a block of bytes at a time so that the compiler
vectorizes it. Same arithmetic, so the very bytes Pillow gives, ~4x faster.

nanopatch compiles it with this machine's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``;
``-mavx2`` where the CPU has AVX2) once, into the cache folder (``kernels/`` under
``NANOPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/nanopatch``, else ``~/.cache/nanopatch``; the
file name is a hash of the source and the flags), and loads it with ctypes in each process on
first use (forked DataLoader workers inherit it). Before the first use in a process it is
checked against Pillow on noise images; a kernel that differs is never used.

Where there is no compiler, the build fails or the check does not pass, Pillow's loop runs as
before (said once in the log, at INFO), and ``--info`` says why. ``NANOPATCH_NATIVE=0`` turns
the kernel off.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np

from nanopatch.foundation.log import log_once

logger = logging.getLogger("nanopatch")

VARIABLE = "NANOPATCH_NATIVE"

SOURCE = r"""
#include <stdint.h>
#include <math.h>

#define PRECISION_BITS (32 - 8 - 2)
#define BLOCK 256

/* Pillow's bilinear weights for one axis (Resample.c: precompute_coeffs with the bilinear
   filter, then normalize_coeffs_8bpc), ksize taps per output, the unused ones 0. */
static void bilinear_coeffs(int in_size, float in0, float in1, int out_size, int ksize,
                            int32_t *xmin_out, int32_t *count_out, int32_t *w, double *tmp) {
    double scale, filterscale, support, center, ww, ss;
    int xx, x, xmin, xmax;
    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0) filterscale = 1.0;
    support = 1.0 * filterscale;
    for (xx = 0; xx < out_size; xx++) {
        center = in0 + (xx + 0.5) * scale;
        ww = 0.0;
        ss = 1.0 / filterscale;
        xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (x = 0; x < xmax; x++) {
            double t = (x + xmin - center + 0.5) * ss;
            if (t < 0.0) t = -t;
            tmp[x] = t < 1.0 ? 1.0 - t : 0.0;
            ww += tmp[x];
        }
        for (x = 0; x < xmax; x++) {
            if (ww != 0.0) tmp[x] /= ww;
        }
        for (x = 0; x < ksize; x++) {
            double v = x < xmax ? tmp[x] : 0.0;
            w[xx * ksize + x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS))
                                      : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
        }
        xmin_out[xx] = xmin;
        count_out[xx] = xmax;
    }
}

static inline uint8_t clip8(int32_t v) {
    v >>= PRECISION_BITS;
    return v < 0 ? 0 : (v > 255 ? 255 : (uint8_t)v);
}

/* Pillow's vertical bilinear 8-bit pass (ImagingResampleVertical_8bpc) from in_h lines of
   `row` bytes (src_stride apart) to out_h lines (out_stride apart), the source box [in0, in1)
   along the lines. scratch: out_h * (2 + ksize) int32, tmp: ksize doubles. */
int nanopatch_bilinear_rows(const uint8_t *src, int64_t src_stride, int64_t row, int in_h,
                            float in0, float in1, int out_h, int ksize,
                            uint8_t *out, int64_t out_stride, int32_t *scratch, double *tmp) {
    int32_t *xmin = scratch, *count = scratch + out_h, *w = scratch + 2 * out_h;
    int32_t acc[BLOCK];
    double scale = (double)(in1 - in0) / out_h;
    if ((int)ceil(scale < 1.0 ? 1.0 : scale) * 2 + 1 != ksize) return -1;
    bilinear_coeffs(in_h, in0, in1, out_h, ksize, xmin, count, w, tmp);
    for (int i = 0; i < out_h; i++) {
        const int32_t *k = w + (int64_t)i * ksize;
        const uint8_t *base = src + (int64_t)xmin[i] * src_stride;
        int n = count[i];
        uint8_t *o = out + (int64_t)i * out_stride;
        for (int64_t j0 = 0; j0 < row; j0 += BLOCK) {
            int m = row - j0 < BLOCK ? (int)(row - j0) : BLOCK;
            for (int j = 0; j < m; j++) acc[j] = 1 << (PRECISION_BITS - 1);
            int t = 0;
            for (; t + 2 <= n; t += 2) {
                const uint8_t *r0 = base + t * src_stride + j0;
                const uint8_t *r1 = r0 + src_stride;
                int32_t k0 = k[t], k1 = k[t + 1];
                for (int j = 0; j < m; j++) acc[j] += r0[j] * k0 + r1[j] * k1;
            }
            if (t < n) {
                const uint8_t *r0 = base + t * src_stride + j0;
                int32_t k0 = k[t];
                for (int j = 0; j < m; j++) acc[j] += r0[j] * k0;
            }
            for (int j = 0; j < m; j++) o[j0 + j] = clip8(acc[j]);
        }
    }
    return 0;
}
"""

_lock = threading.Lock()
_loaded: dict[str, Any] = {}  # "fn": the loaded function, or None where it is not used
_why_not: str | None = None


def _compiler() -> str | None:
    given = os.environ.get("CC")
    if given:
        return shutil.which(given.split()[0]) and given
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def _flags() -> list[str]:
    from nanopatch.foundation import cpu

    flags = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]
    try:
        avx2 = "avx2" in cpu.host_facts().flags
    except Exception:
        avx2 = False
    if avx2:
        flags.append("-mavx2")
    return flags


def library_path(compiler: str, flags: list[str]) -> Path:
    """Where the kernel built by ``compiler`` with ``flags`` is kept."""
    from nanopatch.foundation.records import cache_dir

    key = hashlib.sha256("\0".join([SOURCE, compiler, *flags, os.uname().machine]).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"resample-{key}.so"


def _build(compiler: str, flags: list[str], path: Path) -> None:
    """Compile :data:`SOURCE` into ``path`` (written beside it, then renamed into place, so that
    processes building at once never load a half-written file). Raises OSError or
    CalledProcessError/TimeoutExpired."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.with_name(f".{path.stem}.{os.getpid()}.c")
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.so")
    try:
        source.write_text(SOURCE)
        subprocess.run(
            [*compiler.split(), *flags, "-o", str(temporary), str(source)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(temporary, path)
    finally:
        for leftover in (source, temporary):
            try:
                leftover.unlink()
            except OSError:
                pass


def _load() -> Any:
    """The compiled ``nanopatch_bilinear_rows``, built first where needed; None (with the reason
    in ``_why_not``) where it cannot be had or is off."""
    global _why_not
    if os.environ.get(VARIABLE, "").strip().lower() in ("0", "false", "no", "off"):
        _why_not = f"{VARIABLE}=0"
        return None
    compiler = _compiler()
    if compiler is None:
        _why_not = "no C compiler (cc, gcc or clang) on PATH"
        return None
    flags = _flags()
    path = library_path(compiler, flags)
    try:
        if not path.exists():
            _build(compiler, flags, path)
        lib = ctypes.CDLL(str(path))
    except subprocess.CalledProcessError as exc:
        _why_not = f"{compiler} could not build it: {(exc.stderr or '').strip()[-300:] or exc}"
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        _why_not = f"could not build or load {path}: {exc}"
        return None
    fn = lib.nanopatch_bilinear_rows
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    fn.argtypes = [p, i64, i64, i32, f32, f32, i32, i32, p, i64, p, p]
    fn.restype = ctypes.c_int
    _why_not = None
    return fn


def kernel() -> Any:
    """The loaded and checked kernel, or None (see :func:`why_not`). Loaded once per process
    (a forked DataLoader worker inherits its parent's)."""
    try:
        return _loaded["fn"]
    except KeyError:
        pass
    with _lock:
        if "fn" not in _loaded:
            fn = _load()
            if fn is not None and not _matches_pillow(fn):
                global _why_not
                _why_not = "the compiled kernel does not give Pillow's bytes on this machine"
                fn = None
            if fn is None:
                log_once("native-resample", "nanopatch: bilinear resizes' exact pass runs on Pillow: %s", _why_not)
            _loaded["fn"] = fn
        return _loaded["fn"]


def why_not() -> str | None:
    """Why :func:`kernel` gave None in this process (None when it gave the kernel or was not asked)."""
    return _why_not


def report() -> dict[str, Any]:
    """For ``--info``: whether the kernel is used, and where it is kept or why not."""
    fn = kernel()
    if fn is None:
        return {"used": False, "reason": _why_not}
    compiler = _compiler() or "?"
    return {"used": True, "reason": f"compiled by {compiler}, kept in {library_path(compiler, _flags())}"}


def _ksize(in0: float, in1: float, out_h: int) -> int:
    scale = float(np.float32(np.float32(in1) - np.float32(in0))) / out_h
    return math.ceil(max(scale, 1.0)) * 2 + 1


def rows(fn: Any, arr: np.ndarray, out_h: int, span: tuple[float, float] | None) -> np.ndarray | None:
    """Pillow's bilinear vertical pass of the bytes of ``arr`` (H, ...) to ``out_h`` rows, by the
    kernel ``fn``: (out_h, row bytes) uint8, or None where the kernel does not take this input
    (the caller runs Pillow then)."""
    in_h = arr.shape[0]
    if in_h == 0 or out_h <= 0 or arr.dtype != np.uint8:
        return None
    inner = arr[0]
    if arr.ndim < 2 or not inner.flags.c_contiguous or arr.strides[0] < inner.nbytes:
        arr = np.ascontiguousarray(arr)
        inner = arr[0]
    row = inner.size
    in0, in1 = (0.0, float(in_h)) if span is None else (float(span[0]), float(span[1]))
    ksize = _ksize(in0, in1, out_h)
    out = np.empty((out_h, row), np.uint8)
    if row == 0:
        return out
    scratch = np.empty(out_h * (2 + ksize), np.int32)
    tmp = np.empty(ksize, np.float64)
    status = fn(
        arr.ctypes.data,
        arr.strides[0],
        row,
        in_h,
        in0,
        in1,
        out_h,
        ksize,
        out.ctypes.data,
        row,
        scratch.ctypes.data,
        tmp.ctypes.data,
    )
    return out if status == 0 else None


def _matches_pillow(fn: Any) -> bool:
    """Whether ``fn`` gives Pillow's own vertical pass bytes (``_geometry._pillow_rows_l``) on
    noise images: ``_geometry.ROWS_CHECKS``, a large reduction, and one or a few lines."""
    from ._geometry import ROWS_CHECKS, _pillow_rows_l

    rng = np.random.default_rng(23)
    try:
        for in_h, row, out_h, span in (*ROWS_CHECKS, (301, 600, 7, None), (5, 7, 1, None), (1, 9, 4, None)):
            pixels = rng.integers(0, 256, (in_h, row), dtype=np.uint8)
            mine = rows(fn, pixels, out_h, span)
            if mine is None or not np.array_equal(mine, _pillow_rows_l(pixels, out_h, span)):
                return False
    except Exception as exc:  # any failure means: do not use it
        logger.debug("nanopatch: the compiled resample kernel failed its check: %s", exc)
        return False
    return True
