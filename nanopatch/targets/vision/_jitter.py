"""ColorJitter's saturation and hue, and the "L" sums contrast needs, as compiled passes over
RGB pixels, with Pillow's exact bytes.

:mod:`._color` computes them with numpy and OpenCV: a saturation is five passes over float32
copies, a hue twelve (split, two differences, two table remaps, max/min, products, merge), each
allocating its result. Here each is one pass that reads a pixel's three bytes, optionally
through the table of the brightness and contrast steps still pending before it (so they cost no
pass of their own), and writes its three bytes; it can also sum the "L" values of what it wrote,
for a contrast step right after it. The arithmetic is the numpy version's, operation for
operation in the same precision (built without floating-point contraction), which is Pillow's:

* "L" = ``(19595 R + 38470 G + 7471 B + 0x8000) >> 16`` in integers.
* saturation: ``float t = L + alpha * (v - L)`` in single precision, clipped to 0..255 and
  truncated (Pillow's blend with the "L" image).
* hue: the H byte from the (R - G, G - B) table, the S byte as ``trunc(span * reciprocal[V])``
  in float32, H shifted with uint8 wrap-around, each channel ``trunc(V * factor[H, S, c] + 0.5)``
  in float32: the tables of :func:`._color._hue_tables`, checked there against Pillow for all
  2**24 colours.

Built once per machine into the cache folder (:func:`nanopatch.foundation.compiled.compiled`)
and checked against the numpy version on first use (:func:`._color._passes_agree`: random images,
every step, with and without a pending table); where it cannot be had, :mod:`._color`'s
numpy/OpenCV code runs.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from nanopatch.foundation import usage
from nanopatch.foundation.compiled import compiled
from nanopatch.foundation.log import log_once

SOURCE = r"""
#include <stddef.h>
#include <stdint.h>

#define CHUNK 1024 /* pixels per block: a pending table is applied into a buffer this long */

static inline int luma(int r, int g, int b) { return (19595 * r + 38470 * g + 7471 * b + 0x8000) >> 16; }

/* the next block of n pixels of in, through lut when given (into buf), as a pointer to RGB bytes */
static inline const uint8_t *block(const uint8_t *restrict in, ptrdiff_t n, const uint8_t *restrict lut,
                                   uint8_t *restrict buf) {
    if (!lut) return in;
    for (ptrdiff_t k = 0; k < 3 * n; k++) buf[k] = lut[in[k]];
    return buf;
}

/* the sum of "L" over n <= CHUNK RGB pixels */
static inline int32_t luma_sum(const uint8_t *p, ptrdiff_t n) {
    int32_t sum = 0; /* CHUNK * 255 fits */
    for (ptrdiff_t k = 0; k < n; k++) sum += luma(p[3 * k], p[3 * k + 1], p[3 * k + 2]);
    return sum;
}

/* the sum of "L" over npix RGB pixels, each byte through lut when given */
int64_t nanopatch_luma_sum(const uint8_t *in, ptrdiff_t npix, const uint8_t *lut) {
    uint8_t buf[3 * CHUNK];
    int64_t sum = 0;
    for (ptrdiff_t start = 0; start < npix; start += CHUNK) {
        ptrdiff_t n = npix - start < CHUNK ? npix - start : CHUNK;
        sum += luma_sum(block(in + 3 * start, n, lut, buf), n);
    }
    return sum;
}

/* out = Pillow's blend of the "L" image with the image at alpha (saturation); returns the sum
   of "L" of out when want_sum, else 0 */
int64_t nanopatch_saturation(const uint8_t *restrict in, uint8_t *restrict out, ptrdiff_t npix, const uint8_t *lut,
                             float alpha, int want_sum) {
    uint8_t buf[3 * CHUNK];
    int64_t sum = 0;
    for (ptrdiff_t start = 0; start < npix; start += CHUNK) {
        ptrdiff_t n = npix - start < CHUNK ? npix - start : CHUNK;
        const uint8_t *p = block(in + 3 * start, n, lut, buf);
        uint8_t *o = out + 3 * start;
        for (ptrdiff_t k = 0; k < n; k++) {
            float l = (float)luma(p[3 * k], p[3 * k + 1], p[3 * k + 2]);
            for (int c = 0; c < 3; c++) {
                float t = l + alpha * ((float)p[3 * k + c] - l);
                t = t < 0.0f ? 0.0f : t;
                t = t > 255.0f ? 255.0f : t;
                o[3 * k + c] = (uint8_t)(int)t;
            }
        }
        if (want_sum) sum += luma_sum(o, n);
    }
    return sum;
}

/* out = Pillow's RGB -> HSV, H + shift (mod 256), HSV -> RGB, through the tables; returns the
   sum of "L" of out when want_sum, else 0 */
int64_t nanopatch_hue(const uint8_t *restrict in, uint8_t *restrict out, ptrdiff_t npix, const uint8_t *lut, int shift,
                      const uint8_t *hue /* [511][511] */, const float *reciprocal /* [256] */,
                      const float *factors /* [256][256][3] */, int want_sum) {
    uint8_t buf[3 * CHUNK];
    int64_t sum = 0;
    for (ptrdiff_t start = 0; start < npix; start += CHUNK) {
        ptrdiff_t n = npix - start < CHUNK ? npix - start : CHUNK;
        const uint8_t *p = block(in + 3 * start, n, lut, buf);
        uint8_t *o = out + 3 * start;
        for (ptrdiff_t k = 0; k < n; k++) {
            int r = p[3 * k], g = p[3 * k + 1], b = p[3 * k + 2];
            int top = r > g ? r : g, low = r < g ? r : g;
            top = top > b ? top : b;
            low = low < b ? low : b;
            int h = (uint8_t)(hue[(r - g + 255) * 511 + (g - b + 255)] + shift);
            int s = (int)((float)(top - low) * reciprocal[top]);
            const float *f = factors + ((ptrdiff_t)h * 256 + s) * 3;
            float v = (float)top;
            o[3 * k] = (uint8_t)(int)(v * f[0] + 0.5f);
            o[3 * k + 1] = (uint8_t)(int)(v * f[1] + 0.5f);
            o[3 * k + 2] = (uint8_t)(int)(v * f[2] + 0.5f);
        }
        if (want_sum) sum += luma_sum(o, n);
    }
    return sum;
}
"""

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def _rgb(arr: np.ndarray) -> np.ndarray:
    """``arr`` as the C-contiguous (H, W, 3) uint8 array the passes read."""
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 array, got {arr.dtype} {arr.shape}")
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


class Kernels:
    """The loaded passes, on C-contiguous (H, W, 3) uint8 arrays; ``lut`` is a uint8 (256,)
    table or None, ``want_sum`` asks for the sum of "L" of the result (0 when not asked)."""

    def __init__(self, lib: Any) -> None:
        p, size, i32, i64 = ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_int64
        self._luma = lib.nanopatch_luma_sum
        self._luma.argtypes = [p, size, p]
        self._luma.restype = i64
        self._saturation = lib.nanopatch_saturation
        self._saturation.argtypes = [p, p, size, p, ctypes.c_float, i32]
        self._saturation.restype = i64
        self._hue = lib.nanopatch_hue
        self._hue.argtypes = [p, p, size, p, i32, p, p, p, i32]
        self._hue.restype = i64

    @staticmethod
    def _table(lut: np.ndarray | None) -> tuple[np.ndarray | None, int | None]:
        """``lut`` as the contiguous uint8 table the passes read (kept by the caller for the
        call) and its address, or (None, None)."""
        if lut is None:
            return None, None
        table = np.ascontiguousarray(lut, dtype=np.uint8)
        return table, table.ctypes.data

    def luma_sum(self, arr: np.ndarray, lut: np.ndarray | None = None) -> int:
        arr = _rgb(arr)
        lut, address = self._table(lut)
        return int(self._luma(arr.ctypes.data, arr.shape[0] * arr.shape[1], address))

    def saturation(
        self, arr: np.ndarray, alpha: np.float32, lut: np.ndarray | None = None, want_sum: bool = False
    ) -> tuple[np.ndarray, int]:
        arr = _rgb(arr)
        lut, address = self._table(lut)
        out = np.empty_like(arr)
        usage.record("jitter-kernel")
        total = self._saturation(
            arr.ctypes.data, out.ctypes.data, arr.shape[0] * arr.shape[1], address, float(alpha), want_sum
        )
        return out, int(total)

    def hue(
        self, arr: np.ndarray, shift: int, tables: Any, lut: np.ndarray | None = None, want_sum: bool = False
    ) -> tuple[np.ndarray, int]:
        arr = _rgb(arr)
        lut, address = self._table(lut)
        out = np.empty_like(arr)
        usage.record("jitter-kernel")
        total = self._hue(
            arr.ctypes.data,
            out.ctypes.data,
            arr.shape[0] * arr.shape[1],
            address,
            int(shift),
            tables.hue.ctypes.data,
            tables.reciprocal.ctypes.data,
            tables.factors.ctypes.data,
            want_sum,
        )
        return out, int(total)


def _load(check: Callable[[Kernels], bool]) -> tuple[Kernels | None, str]:
    lib, reason = compiled("jitter", SOURCE)
    if lib is None:
        return None, reason
    kernels = Kernels(lib)
    if not check(kernels):
        return None, "the compiled colour passes do not give numpy's values on this machine"
    return kernels, reason


def kernels(check: Callable[[Kernels], bool]) -> Kernels | None:
    """The compiled passes, built or loaded once and checked once with ``check`` (whether they
    give the numpy versions' values: :func:`._color._passes_agree`), or None where they cannot be
    had (then numpy's and OpenCV's calls run; logged once)."""
    made = _loaded.get("made")
    if made is not None:
        return made[0]
    with _lock:
        if "made" not in _loaded:
            _loaded["made"] = _load(check)
            if _loaded["made"][0] is None:
                said = "nanopatch: ColorJitter's saturation and hue run on numpy and OpenCV: %s"
                log_once("native-jitter", said, _loaded["made"][1])
        return _loaded["made"][0]


def reason() -> str | None:
    """Where the passes are kept, or why they are not used (None before the first load)."""
    made = _loaded.get("made")
    return None if made is None else made[1]
