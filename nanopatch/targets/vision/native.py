"""Pillow's bilinear resampling of one axis as compiled loops: nanopatch's exact resize passes.

Pillow resizes one axis, rounds to bytes, then the other, multiplying one byte by one 22-bit
weight at a time. This module carries C for both of its 8-bit passes: Pillow's weights
(``precompute_coeffs`` and ``normalize_coeffs_8bpc`` of Resample.c for the bilinear filter: the
same double arithmetic in the same order, no contraction into fused multiply-adds) and Pillow's
integer sums, rounding and clipping. Same arithmetic, so the very bytes Pillow gives:

* the pass down the columns (``nanopatch_bilinear_rows``, :func:`rows`: each output line a
  weighted sum of source lines, over a block of bytes at a time, which the compiler
  vectorizes), ~4x faster than Pillow's;
* the pass along the lines (``nanopatch_bilinear_columns``, :func:`columns`), on 16 lines at a
  time transposed in SSE2 registers so that each weight multiplies the 16 lines' bytes at once
  (AVX2 where the CPU has it): as fast as torch's 16-bit kernel or faster for lines of up to
  1024 RGB pixels shrunk at most 4x (``_geometry._columns_pay``), which ``_geometry`` then uses for wider ones.

nanopatch compiles it (:mod:`nanopatch.foundation.compiled`) with this machine's C compiler
(``$CC``, else ``cc``, ``gcc`` or ``clang``; ``-mavx2`` where the CPU has AVX2) once, into the
cache folder (``kernels/`` under ``NANOPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/nanopatch``,
else ``~/.cache/nanopatch``; the file name is a hash of the source and the flags), and loads
it with ctypes in each process on first use (forked DataLoader workers inherit it). Before the
first use in a process each pass is checked against Pillow on noise images; a pass that differs is never used.

Where there is no compiler, the build fails or the check does not pass, resizes run as before
(torch's first pass, Pillow's second; said once in the log, at INFO), and ``--info`` says why.
``NANOPATCH_NATIVE=0`` turns the kernels off.

``--info`` also reads the state of the package's other compiled passes here
(:func:`lookup_report`, :func:`jitter_report`).
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np

from nanopatch.foundation import compiled as _compiled
from nanopatch.foundation.log import log_once

logger = logging.getLogger("nanopatch")

VARIABLE = _compiled.VARIABLE

SOURCE = r"""
#include <stdint.h>
#include <math.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

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

/* A 16 x 16 block of bytes, transposed: out[j * out_stride + i] = in[i * in_stride + j]. */
static void transpose16(const uint8_t *in, int64_t in_stride, uint8_t *out, int64_t out_stride) {
#if defined(__SSE2__)
    /* four rounds of interleaving row i with row i + 8 transpose a 16 x 16 byte matrix */
    __m128i x[16], y[16];
    for (int i = 0; i < 16; i++) x[i] = _mm_loadu_si128((const __m128i *)(in + i * in_stride));
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 8; i++) {
            y[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
            y[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
        }
        memcpy(x, y, sizeof(x));
    }
    for (int i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(out + i * out_stride), x[i]);
#else
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) out[j * out_stride + i] = in[i * in_stride + j];
#endif
}

/* Pillow's horizontal bilinear 8-bit pass (ImagingResampleHorizontal_8bpc) of h lines of in_w
   pixels of `channels` interleaved bytes (src_stride apart) to out_w pixels (out_stride apart),
   the source box [in0, in1) along the lines. It runs on 16 lines at a time, transposed into
   tile_in (in_w * channels lines of 16 bytes) so that each weight multiplies 16 lines' bytes
   at once, then transposed back from tile_out (out_w * channels lines of 16 bytes).
   scratch: out_w * (2 + ksize) int32, tmp: ksize doubles. */
int nanopatch_bilinear_columns(const uint8_t *src, int64_t src_stride, int h, int in_w, int channels,
                               float in0, float in1, int out_w, int ksize, uint8_t *out, int64_t out_stride,
                               int32_t *scratch, double *tmp, uint8_t *tile_in, uint8_t *tile_out) {
    int32_t *xmin = scratch, *count = scratch + out_w, *w = scratch + 2 * out_w;
    double scale = (double)(in1 - in0) / out_w;
    if ((int)ceil(scale < 1.0 ? 1.0 : scale) * 2 + 1 != ksize) return -1;
    bilinear_coeffs(in_w, in0, in1, out_w, ksize, xmin, count, w, tmp);
    int64_t in_bytes = (int64_t)in_w * channels, out_bytes = (int64_t)out_w * channels;
    uint8_t block[16 * 16];
    for (int y0 = 0; y0 < h; y0 += 16) {
        int lines = h - y0 < 16 ? h - y0 : 16;
        /* tile_in[p * 16 + t] = src[(y0 + t) * src_stride + p], missing lines as 0 */
        int64_t p0 = 0;
        for (; p0 + 16 <= in_bytes; p0 += 16) {
            if (lines == 16) {
                transpose16(src + y0 * src_stride + p0, src_stride, tile_in + p0 * 16, 16);
            } else {
                memset(block, 0, sizeof(block));
                for (int t = 0; t < lines; t++) memcpy(block + t * 16, src + (y0 + t) * src_stride + p0, 16);
                transpose16(block, 16, tile_in + p0 * 16, 16);
            }
        }
        for (int64_t p = p0; p < in_bytes; p++)
            for (int t = 0; t < 16; t++) tile_in[p * 16 + t] = t < lines ? src[(y0 + t) * src_stride + p] : 0;
        /* the weights, 16 lines at a time */
        for (int ox = 0; ox < out_w; ox++) {
            const int32_t *k = w + (int64_t)ox * ksize;
            int n = count[ox];
            for (int c = 0; c < channels; c++) {
                const uint8_t *base = tile_in + ((int64_t)xmin[ox] * channels + c) * 16;
                uint8_t *o = tile_out + ((int64_t)ox * channels + c) * 16;
#if defined(__AVX2__)
                __m256i lo = _mm256_set1_epi32(1 << (PRECISION_BITS - 1)), hi = lo;
                for (int i = 0; i < n; i++) {
                    __m128i bytes = _mm_loadu_si128((const __m128i *)(base + (int64_t)i * channels * 16));
                    __m256i ki = _mm256_set1_epi32(k[i]);
                    lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(bytes), ki));
                    hi = _mm256_add_epi32(hi, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), ki));
                }
                /* clip8: shift, then saturate to int16 and to uint8 (packs work within 128-bit lanes) */
                __m256i words =
                    _mm256_packs_epi32(_mm256_srai_epi32(lo, PRECISION_BITS), _mm256_srai_epi32(hi, PRECISION_BITS));
                words = _mm256_permute4x64_epi64(words, 0xD8);
                __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
                _mm_storeu_si128((__m128i *)o, packed);
#else
                int32_t acc[16];
                for (int t = 0; t < 16; t++) acc[t] = 1 << (PRECISION_BITS - 1);
                for (int i = 0; i < n; i++) {
                    const uint8_t *line = base + (int64_t)i * channels * 16;
                    int32_t ki = k[i];
                    for (int t = 0; t < 16; t++) acc[t] += line[t] * ki;
                }
                for (int t = 0; t < 16; t++) o[t] = clip8(acc[t]);
#endif
            }
        }
        /* out[(y0 + t) * out_stride + q] = tile_out[q * 16 + t] */
        int64_t q0 = 0;
        for (; q0 + 16 <= out_bytes; q0 += 16) {
            if (lines == 16) {
                transpose16(tile_out + q0 * 16, 16, out + y0 * out_stride + q0, out_stride);
            } else {
                transpose16(tile_out + q0 * 16, 16, block, 16);
                for (int t = 0; t < lines; t++) memcpy(out + (y0 + t) * out_stride + q0, block + t * 16, 16);
            }
        }
        for (int64_t q = q0; q < out_bytes; q++)
            for (int t = 0; t < lines; t++) out[(y0 + t) * out_stride + q] = tile_out[q * 16 + t];
    }
    return 0;
}
"""

_compiler = _compiled.compiler
_flags = _compiled.flags


def library_path(compiler: str, flags: list[str]) -> Path:
    """Where the resize kernels built by ``compiler`` with ``flags`` are kept."""
    return _compiled.library_path(compiler, flags, "resample", SOURCE)


_lock = threading.Lock()
_loaded: dict[str, Any] = {}  # "fn": the loaded function, or None where it is not used
_why_not: str | None = None


def _load() -> Any:
    """The compiled ``nanopatch_bilinear_rows``, built first where needed; None (with the reason
    in ``_why_not``) where it cannot be had or is off."""
    global _why_not
    lib, reason = _compiled.compiled("resample", SOURCE)
    if lib is None:
        _why_not = reason
        return None
    fn = lib.nanopatch_bilinear_rows
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    fn.argtypes = [p, i64, i64, i32, f32, f32, i32, i32, p, i64, p, p]
    fn.restype = ctypes.c_int
    columns_fn = lib.nanopatch_bilinear_columns
    columns_fn.argtypes = [p, i64, i32, i32, i32, f32, f32, i32, i32, p, i64, p, p, p, p]
    columns_fn.restype = ctypes.c_int
    _loaded["columns"] = columns_fn
    _loaded["where"] = reason
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
                said = "nanopatch: bilinear resizes run on torch's and Pillow's kernels: %s"
                log_once("native-resample", said, _why_not)
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
    return {"used": True, "reason": _loaded.get("where", "compiled")}


def lookup_report() -> dict[str, Any]:
    """For ``--info``: whether ToTensor + Normalize's compiled pass (:mod:`._chw`) is used, and
    where it is kept or why not."""
    from . import _chw

    return _chw.report()


def jitter_report() -> dict[str, Any]:
    """For ``--info``: whether ColorJitter's compiled passes (:mod:`._jitter`) are used, and where
    they are kept or why not."""
    from . import _color

    return _color.jitter_report()


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
    """Whether ``fn`` gives Pillow's own vertical pass bytes (``_pillow.rows_l``) on
    noise images: ``_pillow.ROWS_CHECKS``, a large reduction, and one or a few lines."""
    from ._pillow import ROWS_CHECKS
    from ._pillow import rows_l as _pillow_rows_l

    rng = np.random.default_rng(23)
    cases = [
        (rng.integers(0, 256, (in_h, row), dtype=np.uint8), out_h, span)
        for in_h, row, out_h, span in (*ROWS_CHECKS, (301, 600, 7, None), (5, 7, 1, None), (1, 9, 4, None))
    ]
    return _agrees("vertical pass", cases, lambda case: rows(fn, *case), lambda case: _pillow_rows_l(*case))


def _agrees(what: str, cases: list, compute: Any, reference: Any) -> bool:
    """Whether ``compute(case)`` gives ``reference(case)`` on every case (an error: it does not)."""
    try:
        for case in cases:
            mine = compute(case)
            if mine is None or not np.array_equal(mine, reference(case)):
                return False
    except Exception as exc:  # any failure means: do not use it
        logger.debug("nanopatch: the compiled %s failed its check: %s", what, exc)
        return False
    return True


# --- the horizontal pass ----------------------------------------------------------------------


def columns_kernel() -> Any:
    """The compiled horizontal pass, where :func:`kernel` is used and it gives Pillow's own
    horizontal pass bytes here (checked once on noise images), else None."""
    try:
        return _loaded["columns_checked"]
    except KeyError:
        pass
    fn = _loaded.get("columns") if kernel() is not None else None
    with _lock:
        if "columns_checked" not in _loaded:
            _loaded["columns_checked"] = fn if fn is not None and _columns_match_pillow(fn) else None
        return _loaded["columns_checked"]


def columns(fn: Any, arr: np.ndarray, out_w: int, span: tuple[float, float] | None = None) -> np.ndarray | None:
    """Pillow's bilinear horizontal pass of the (H, W, C) uint8 ``arr`` to ``out_w`` columns, by
    the kernel ``fn``: (H, out_w, C) uint8, or None where the kernel does not take this input."""
    if arr.ndim != 3 or arr.dtype != np.uint8 or out_w <= 0:
        return None
    in_h, in_w, channels = arr.shape
    if in_w == 0 or channels == 0:
        return None
    if arr.strides[1:] != (channels, 1) or arr.strides[0] < in_w * channels:
        arr = np.ascontiguousarray(arr)
    in0, in1 = (0.0, float(in_w)) if span is None else (float(span[0]), float(span[1]))
    ksize = _ksize(in0, in1, out_w)
    out = np.empty((in_h, out_w, channels), np.uint8)
    if in_h == 0:
        return out
    scratch = np.empty(out_w * (2 + ksize), np.int32)
    tmp = np.empty(ksize, np.float64)
    tile_in = np.empty(in_w * channels * 16, np.uint8)
    tile_out = np.empty(out_w * channels * 16, np.uint8)
    status = fn(
        arr.ctypes.data,
        arr.strides[0],
        in_h,
        in_w,
        channels,
        in0,
        in1,
        out_w,
        ksize,
        out.ctypes.data,
        out_w * channels,
        scratch.ctypes.data,
        tmp.ctypes.data,
        tile_in.ctypes.data,
        tile_out.ctypes.data,
    )
    return out if status == 0 else None


def _columns_match_pillow(fn: Any) -> bool:
    """Whether ``fn`` gives Pillow's own horizontal pass (``_pillow.columns``) on noise
    images: 3 channels and 1, lines a multiple of 16 and not, shrinking, enlarging, a box."""
    from ._pillow import columns as _pillow_columns

    rng = np.random.default_rng(31)
    cases = [
        (rng.integers(0, 256, (*in_hw, channels), dtype=np.uint8), out_w, span)
        for in_hw, out_w, span, channels in (
            ((23, 37), 20, None, 3),
            ((32, 37), 61, None, 3),
            ((19, 300), 224, None, 3),
            ((33, 380), 224, None, 3),
            ((17, 60), 23, (3.5, 55.25), 3),
            ((17, 60), 40, (0.0, 41.0), 1),
            ((5, 1800), 7, None, 3),
            ((3, 2), 9, None, 1),
        )
    ]
    return _agrees("horizontal pass", cases, lambda case: columns(fn, *case), lambda case: _pillow_columns(*case))
