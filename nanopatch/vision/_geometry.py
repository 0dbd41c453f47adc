"""Geometry kernels on HWC uint8 arrays: affine, rotate, gaussian_blur and pad with stock's pixels.

Every kernel takes ``arr``, a 3-D ``uint8`` array of shape (H, W, C) with C == 1 (a PIL "L"
image) or C == 3 ("RGB"), contiguous or not, possibly read-only, and returns a new array; the
input is never written to. The reference is ``torchvision.transforms.functional.<name>`` on the
same pixels as a PIL image:

* ``affine`` and ``rotate`` end in Pillow's ``Image.transform(..., AFFINE, ...)``, whose engine
  is re-implemented here step for step, so the results are bit-exact. Nearest neighbour takes
  the same one of Pillow's three loops (pure scale: truncated doubles accumulated per row and
  column; the usual case: 16.16 fixed point; huge coordinates: doubles accumulated along the
  rows), and OpenCV's nearest remap then only moves whole pixels. Bilinear evaluates Pillow's
  double-precision lerps in its order and truncates like its cast. Bicubic is not offered: done
  exactly in NumPy it costs about twice Pillow's time.
* ``gaussian_blur`` is stock's float32 convolution (the very kernel, reflect padding, round half
  to even) done separably by OpenCV. Stock sums in float32 in its own order, so a value within
  ~1e-4 of a rounding boundary can round the other way: within 1 grey level of stock, and
  different on roughly one value in 100,000.
* ``pad`` is exact (OpenCV's border modes are NumPy's pad modes, also for pads wider than the
  image).

A kernel raises ``NotImplementedError`` for an argument it cannot reproduce (or that makes
stock raise); the caller then runs stock torchvision on a PIL image instead.
"""

from __future__ import annotations

import functools
import math
import numbers
import sys
import threading
from collections.abc import Sequence

import numpy as np

from ._opencv import cv2

__all__ = ["BICUBIC", "BILINEAR", "NEAREST", "affine", "gaussian_blur", "pad", "rotate"]

# torchvision.transforms.InterpolationMode values; InterpolationMode members work too.
NEAREST = "nearest"
BILINEAR = "bilinear"
BICUBIC = "bicubic"

# Pillow's filter numbers for the modes torchvision hands to Image.transform.
_PIL_NEAREST, _PIL_BILINEAR, _PIL_BICUBIC = 0, 2, 3
_MODE_TO_PIL = {
    "nearest": _PIL_NEAREST,
    "nearest-exact": _PIL_NEAREST,
    "bilinear": _PIL_BILINEAR,
    "bicubic": _PIL_BICUBIC,
}
_INT_TO_PIL = {0: _PIL_NEAREST, 2: _PIL_BILINEAR, 3: _PIL_BICUBIC}

# OpenCV's remap addresses pixels with 16-bit signed coordinates (and wants both images smaller).
_REMAP_LIMIT = 32767
# Pillow's nearest-neighbour affine uses 16.16 fixed point while all four corners stay below this.
_FIXED_LIMIT = 32768.0
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# Matrix entries beyond this would make Pillow's double arithmetic overflow or go undefined.
_MATRIX_LIMIT = 1e12


# --- argument parsing ------------------------------------------------------------------------


def _check_image(arr: np.ndarray) -> np.ndarray:
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in (1, 3):
        raise NotImplementedError("expected an (H, W, 1) or (H, W, 3) uint8 array")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise NotImplementedError("empty image")
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _pil_filter(interpolation) -> int:
    """Pillow's filter number for an InterpolationMode (or its value, or a Pillow constant)."""
    if isinstance(interpolation, bool):
        raise NotImplementedError(f"interpolation {interpolation!r}")
    if isinstance(interpolation, int):
        code = _INT_TO_PIL.get(interpolation)
    else:
        code = _MODE_TO_PIL.get(getattr(interpolation, "value", interpolation))
    if code is None:
        raise NotImplementedError(f"interpolation {interpolation!r}")
    return code


def _fill_color(fill, channels: int) -> tuple[int, ...]:
    """The pixel torchvision's ``_parse_fill`` plus ``Image.new`` give to the area outside the image.

    ``None`` means 0; a number is repeated over the channels and a 1-sequence too; every value
    is truncated with ``int()`` and clamped to 0..255 the way Pillow stores a colour.
    """
    if fill is None:
        fill = 0
    if isinstance(fill, (int, float)):
        values = [fill] * channels
    elif isinstance(fill, numbers.Real) and channels == 1:
        values = [fill]  # torchvision int()s a lone NumPy scalar for an "L" image
    elif isinstance(fill, (list, tuple)):
        values = list(fill) * channels if len(fill) == 1 else list(fill)
        if len(values) != channels:
            raise NotImplementedError(f"fill {fill!r} for {channels} channel(s)")  # stock: ValueError
    else:
        raise NotImplementedError(f"fill {fill!r}")
    try:
        ints = [int(v) for v in values]
    except (TypeError, ValueError, OverflowError) as exc:
        raise NotImplementedError(f"fill {fill!r}") from exc
    if any(not _INT32_MIN <= v <= _INT32_MAX for v in ints):
        raise NotImplementedError(f"fill {fill!r}")
    return tuple(min(max(v, 0), 255) for v in ints)


def _filled(shape: tuple[int, int, int], color: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype=np.uint8)
    if len(set(color)) == 1:
        out.fill(color[0])
    else:
        out[...] = color
    return out


# --- scratch memory ----------------------------------------------------------------------------
# Work arrays are reused per thread, and the output is produced in blocks of rows. Fresh
# megabyte-sized temporaries on every call make glibc return memory to the kernel and fault it
# back in on the next call, which can cost more than the arithmetic itself.

_BLOCK_PIXELS = 65536  # output pixels per block: bigger blocks pay less Python overhead per pixel
_SCRATCH_LIMIT = 1 << 22  # bytes kept per slot (about 16 slots); a bigger request gets a fresh array


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}


_SCRATCH = _Scratch()


def _scratch(slot: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A per-thread work array with undefined contents, valid until ``slot`` is asked for again."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > _SCRATCH_LIMIT:
        return np.empty(shape, dtype)
    buffer = _SCRATCH.buffers.get(slot)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = _SCRATCH.buffers[slot] = np.empty(max(nbytes, 4096), dtype=np.uint8)
    return buffer[:nbytes].view(dtype).reshape(shape)


def _row_blocks(out_h: int, out_w: int, pixels: int):
    """Bands of output rows, about ``pixels`` each (OpenCV's remap takes fewer than 32767 rows)."""
    rows = max(1, min(pixels // out_w, _REMAP_LIMIT - 1))
    for y0 in range(0, out_h, rows):
        yield y0, min(y0 + rows, out_h)


def _ensure_written(result: np.ndarray, target: np.ndarray) -> None:
    """Copy an OpenCV result into ``target`` unless OpenCV already wrote it there (via ``dst=``)."""
    if result.ctypes.data != target.ctypes.data:
        target[...] = result.reshape(target.shape)


def _packed(arr: np.ndarray, slot: str) -> np.ndarray:
    """(H, W) array with one element per pixel: the plane of an "L" image, RGBX as int32 for RGB."""
    height, width, channels = arr.shape
    if channels == 1:
        return arr.reshape(height, width)
    rgbx = cv2().cvtColor(arr, cv2().COLOR_RGB2RGBA, dst=_scratch(slot, (height, width, 4), np.uint8))
    return rgbx.view(np.int32).reshape(height, width)


# --- Pillow's affine engine --------------------------------------------------------------------


def _pil_transform_affine(
    arr: np.ndarray, size: tuple[int, int], matrix: Sequence[float], resample: int, fill: tuple[int, ...]
) -> np.ndarray:
    """``Image.transform(size, Image.AFFINE, matrix, resample, fillcolor=fill)`` on an array.

    ``matrix`` maps output pixel centres to input coordinates; ``size`` is (width, height).
    """
    if resample not in (_PIL_NEAREST, _PIL_BILINEAR):
        raise NotImplementedError(f"Pillow filter {resample} (exact in NumPy only at twice stock's cost)")
    a = [float(v) for v in matrix[:6]]
    if len(a) != 6 or not all(math.isfinite(v) and abs(v) < _MATRIX_LIMIT for v in a):
        raise NotImplementedError(f"affine matrix {matrix!r}")
    out_w, out_h = int(size[0]), int(size[1])
    if out_w <= 0 or out_h <= 0 or max(out_w, out_h) > 1 << 24:
        raise NotImplementedError(f"output size {size!r}")
    if resample == _PIL_BILINEAR:
        return _bilinear(arr, out_w, out_h, a, fill)
    # Pillow picks one of three nearest-neighbour loops; each rounds differently.
    if a[1] == 0 and a[3] == 0:
        tables = _scale_tables(arr, out_w, out_h, a)
    elif all(
        abs(x * a[0] + y * a[1] + a[2]) < _FIXED_LIMIT and abs(x * a[3] + y * a[4] + a[5]) < _FIXED_LIMIT
        for x, y in ((0, 0), (out_w, out_h), (0, out_h), (out_w, 0))
    ):
        tables = _fixed_tables(out_w, out_h, a)
    else:
        tables = _accumulated_tables(arr, out_w, out_h, a)
    return _gather_nearest(arr, out_w, out_h, tables, fill)


# Nearest neighbour. Each strategy returns a function giving, for the output rows [y0, y1), the
# source pixel of every output pixel: as an OpenCV remap table, (rows, W_out, 2) int16 (x, y),
# when ``packed`` (the source is then smaller than 32767 a side), else as int32 (xs, ys).
# Coordinates outside the source (including -1 for "outside" from a double loop) get the fill.


def _accumulate(start: float, step: float, count: int) -> np.ndarray:
    """``start``, ``start + step``, ``(start + step) + step``, ...: a double bumped in a loop."""
    values = np.full(count, step, dtype=np.float64)
    values[0] = start
    return np.add.accumulate(values)


def _coord_index(values: np.ndarray, limit: int) -> np.ndarray:
    """Pillow's COORD() truncation of source coordinates, as int32, -1 where outside [0, limit)."""
    inside = (values >= 0.0) & (values < limit)
    return np.where(inside, np.floor(np.where(inside, values, 0.0)), -1.0).astype(np.int32)


def _remap_table(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """The int16 (x, y) table of int32 coordinates within int16 range. Clobbers ``xs``, ``ys``."""
    low, high = (xs, ys) if sys.byteorder == "little" else (ys, xs)
    np.left_shift(high, 16, out=high)
    np.bitwise_and(low, 0xFFFF, out=low)
    np.bitwise_or(high, low, out=high)
    return high.view(np.int16).reshape(*high.shape, 2)


def _scale_tables(arr: np.ndarray, out_w: int, out_h: int, a: list[float]):
    """Pillow's loop for a pure scale + translation: one truncated double per column and per row,
    each accumulated from half a step by repeated addition."""
    height, width, _ = arr.shape
    cols = _coord_index(_accumulate(a[2] + a[0] * 0.5, a[0], out_w), width)
    rows = _coord_index(_accumulate(a[5] + a[4] * 0.5, a[4], out_h), height)

    def block(y0: int, y1: int, packed: bool):
        xs = _scratch("map_x", (y1 - y0, out_w), np.int32)
        ys = _scratch("map_y", (y1 - y0, out_w), np.int32)
        xs[...] = cols
        ys[...] = rows[y0:y1, None]
        return _remap_table(xs, ys) if packed else (xs, ys)

    return block


def _fixed_tables(out_w: int, out_h: int, a: list[float]):
    """Pillow's usual loop: the matrix (shifted to pixel centres) rounded to 16.16 fixed point,
    stepped with integer additions; the source pixel is the value >> 16."""

    def fix(v: float) -> int:
        return math.floor(v * 65536.0 + 0.5)

    terms = []
    for step_x, step_y, start in (
        (fix(a[0]), fix(a[1]), fix(a[2] + a[0] * 0.5 + a[1] * 0.5)),
        (fix(a[3]), fix(a[4]), fix(a[5] + a[3] * 0.5 + a[4] * 0.5)),
    ):
        extremes = [start + x * step_x + y * step_y for x in (0, out_w - 1) for y in (0, out_h - 1)]
        if not all(_INT32_MIN <= v <= _INT32_MAX for v in (step_x, step_y, start, *extremes)):
            raise NotImplementedError("fixed-point overflow in Pillow's affine")
        # Every sum fits int32 (it is linear, and checked at the corners), so wrapping int32
        # arithmetic gives it exactly even where a partial product x * step does not fit.
        row_start = (start + np.arange(out_h, dtype=np.int64) * step_y).astype(np.int32)
        along = (np.arange(out_w, dtype=np.int64) * step_x).astype(np.int32)
        terms.append((row_start[:, None], along[None, :]))
    # value >> 16 is an int16: as the low half of the table entry it is the unsigned shift of
    # the value, as the high half it is the value with its low 16 bits cleared.
    low, high = (0, 1) if sys.byteorder == "little" else (1, 0)

    def block(y0: int, y1: int, packed: bool):
        shape = (y1 - y0, out_w)
        if not packed:
            maps = []
            for slot, (row_start, along) in zip(("map_x", "map_y"), terms, strict=True):
                value = np.add(row_start[y0:y1], along, out=_scratch(slot, shape, np.int32))
                maps.append(np.right_shift(value, 16, out=value))
            return maps[0], maps[1]
        row_start, along = terms[high]
        table = np.add(row_start[y0:y1], along, out=_scratch("map_y", shape, np.int32))
        np.bitwise_and(table, -65536, out=table)
        row_start, along = terms[low]
        shifted = np.add(row_start[y0:y1], along, out=_scratch("map_x", shape, np.int32)).view(np.uint32)
        np.right_shift(shifted, 16, out=shifted)
        np.bitwise_or(table, shifted.view(np.int32), out=table)
        return table.view(np.int16).reshape(*shape, 2)

    return block


def _accumulated_tables(arr: np.ndarray, out_w: int, out_h: int, a: list[float]):
    """Pillow's loop for coordinates beyond fixed point: doubles stepped along each row from a
    per-row start, itself stepped from row to row, truncated."""
    height, width, _ = arr.shape
    starts = [
        _accumulate(a[2] + a[1] * 0.5 + a[0] * 0.5, a[1], out_h),
        _accumulate(a[5] + a[4] * 0.5 + a[3] * 0.5, a[4], out_h),
    ]

    def block(y0: int, y1: int, packed: bool):
        maps = []
        for start, step, limit in zip(starts, (a[0], a[3]), (width, height), strict=True):
            values = np.full((y1 - y0, out_w), step, dtype=np.float64)
            values[:, 0] = start[y0:y1]
            maps.append(_coord_index(np.add.accumulate(values, axis=1), limit))
        return _remap_table(*maps) if packed else (maps[0], maps[1])

    return block


def _gather_nearest(arr: np.ndarray, out_w: int, out_h: int, tables, fill: tuple[int, ...]) -> np.ndarray:
    """out[y, x] = arr[source of (x, y)], or ``fill`` where the source lies outside ``arr``."""
    height, width, channels = arr.shape
    if max(height, width, out_w) >= _REMAP_LIMIT:  # too large for OpenCV's remap
        out = _filled((out_h, out_w, channels), fill)
        for y0, y1 in _row_blocks(out_h, out_w, _BLOCK_PIXELS):
            xs, ys = tables(y0, y1, False)
            inside = (xs >= 0) & (xs < width) & (ys >= 0) & (ys < height)
            out[y0:y1][inside] = arr[ys[inside], xs[inside]]
        return out
    # OpenCV's nearest remap with a constant border does exactly this lookup. It moves one
    # element per pixel, so RGB travels packed as RGBX int32.
    source = _packed(arr, "packed_source")
    if channels == 1:
        out = np.empty((out_h, out_w), dtype=np.uint8)
        border = fill[0]
    else:
        out = _scratch("packed_out", (out_h, out_w), np.int32)
        border = int(np.array([*fill, 255], dtype=np.uint8).view(np.int32)[0])
    for y0, y1 in _row_blocks(out_h, out_w, _BLOCK_PIXELS):
        target = out[y0:y1]
        result = cv2().remap(
            source,
            tables(y0, y1, True),
            None,
            cv2().INTER_NEAREST,
            dst=target,
            borderMode=cv2().BORDER_CONSTANT,
            borderValue=(border, 0, 0, 0),
        )
        _ensure_written(result, target)
    if channels == 1:
        return out.reshape(out_h, out_w, 1)
    return cv2().cvtColor(out.view(np.uint8).reshape(out_h, out_w, 4), cv2().COLOR_RGBA2RGB)


def _bilinear(arr: np.ndarray, out_w: int, out_h: int, a: list[float], fill: tuple[int, ...]) -> np.ndarray:
    """Pillow's generic affine engine with its BILINEAR filter, operation for operation.

    Each output pixel centre goes through the matrix in doubles; outside [0, size) the pixel
    keeps the fill, else Pillow takes the 2x2 neighbours of (x - 0.5, y - 0.5) with clamped
    indices and computes top = a + (b - a) * dx, bottom likewise, top + (bottom - top) * dy in
    doubles, truncated to uint8.
    """
    height, width, channels = arr.shape
    # A replicated border of 1 pixel turns Pillow's index clamping into plain reads: padded
    # (y + 1, x + 1) is source (clamp(y), clamp(x)). Below it come 2 rows of the fill colour;
    # pixels outside the image read their 4 taps there, and interpolating between equal taps
    # gives exactly that value whatever the fractions.
    padded_h, padded_w = height + 2, width + 2
    padded = _scratch("padded", (padded_h + 2, padded_w, channels), np.uint8)
    target = padded[:padded_h, :, 0] if channels == 1 else padded[:padded_h]
    _ensure_written(cv2().copyMakeBorder(arr, 1, 1, 1, 1, cv2().BORDER_REPLICATE, dst=target), target)
    padded[padded_h:] = fill
    source = _packed(padded, "packed_source").ravel()
    sentinel = padded_h * padded_w

    x_centre = np.arange(out_w, dtype=np.float64) + 0.5
    y_centre = np.arange(out_h, dtype=np.float64) + 0.5
    x_terms = [(a[0] * x_centre)[None, :], (a[3] * x_centre)[None, :]]
    y_terms = [(a[1] * y_centre)[:, None], (a[4] * y_centre)[:, None]]
    # Far more than the few ulps a position can be off by, relative to the terms summed.
    margins = tuple(1e-9 * (1.0 + abs(p) * out_w + abs(q) * out_h + abs(r)) for p, q, r in (a[0:3], a[3:6]))
    out = np.empty((out_h, out_w, channels), dtype=np.uint8)
    for y0, y1 in _row_blocks(out_h, out_w, _BLOCK_PIXELS):
        shape = (y1 - y0, out_w)
        count = shape[0] * out_w
        # Source position: Pillow's a0 * x + a1 * y + a2 at the pixel centre.
        pos_x = np.add(x_terms[0], y_terms[0][y0:y1], out=_scratch("pos_x", shape, np.float64))
        pos_x += a[2]
        pos_y = np.add(x_terms[1], y_terms[1][y0:y1], out=_scratch("pos_y", shape, np.float64))
        pos_y += a[5]
        outside = None
        if not _block_inside(pos_x, pos_y, width, height, margins):
            outside = (pos_x < 0.0) | (pos_x >= width) | (pos_y < 0.0) | (pos_y >= height)
        pos_x -= 0.5
        pos_y -= 0.5
        base_x = np.floor(pos_x, out=_scratch("base_x", shape, np.float64))
        base_y = np.floor(pos_y, out=_scratch("base_y", shape, np.float64))
        frac_x = np.subtract(pos_x, base_x, out=pos_x).reshape(count)
        frac_y = np.subtract(pos_y, base_y, out=pos_y).reshape(count)
        # Pixels inside have bases >= -1; clipping only keeps the others' reads in bounds.
        np.clip(base_x, -1, width - 1, out=base_x)
        np.clip(base_y, -1, height - 1, out=base_y)
        base_y += 1  # index of the top-left tap in the padded image
        base_y *= padded_w
        base_y += base_x
        base_y += 1
        if outside is not None:
            np.copyto(base_y, sentinel, where=outside)
        index = _scratch("index", (count,), np.intp)
        np.copyto(index, base_y.reshape(count), casting="unsafe")
        top = _lerp(_tap(source, index, 0, channels, "tap"), _tap(source, index, 1, channels, "top"), frac_x)
        below = source[padded_w:]
        bottom = _lerp(_tap(below, index, 0, channels, "tap"), _tap(below, index, 1, channels, "bottom"), frac_x)
        value = _lerp(top, bottom, frac_y)  # within [0, 255], so the cast truncates like Pillow's
        planes = _scratch("planes", (channels, count), np.uint8)
        np.copyto(planes, value, casting="unsafe")
        if channels == 1:
            out[y0:y1] = planes.reshape(*shape, 1)
        else:
            target = out[y0:y1]
            _ensure_written(cv2().merge([plane.reshape(shape) for plane in planes], dst=target), target)
    return out


def _block_inside(pos_x: np.ndarray, pos_y: np.ndarray, width: int, height: int, margins: tuple[float, float]) -> bool:
    """Whether every position of a block lies safely inside [0, width) x [0, height).

    The positions are an affine function of the pixel, so over a rectangular block they reach
    their extremes at its corners; ``margins`` cover the rounding of the per-pixel doubles.
    """
    for pos, limit, margin in ((pos_x, width, margins[0]), (pos_y, height, margins[1])):
        corners = (pos[0, 0], pos[0, -1], pos[-1, 0], pos[-1, -1])
        if min(corners) < margin or max(corners) >= limit - margin:
            return False
    return True


def _tap(source: np.ndarray, index: np.ndarray, offset: int, channels: int, slot: str) -> np.ndarray:
    """(C, N) float64 planes of source[index + offset] (packed pixels)."""
    count = index.size
    gathered = _scratch("gathered", (count,), source.dtype)
    np.take(source[offset:], index, out=gathered, mode="clip")
    planes = gathered[None, :] if channels == 1 else gathered.view(np.uint8).reshape(count, 4).T[:channels]
    result = _scratch(slot, (channels, count), np.float64)
    np.copyto(result, planes, casting="unsafe")
    return result


def _lerp(low: np.ndarray, high: np.ndarray, frac: np.ndarray) -> np.ndarray:
    """low + (high - low) * frac in doubles, as Pillow's BILINEAR macro; overwrites ``high``."""
    high -= low
    high *= frac
    high += low
    return high


# --- public kernels --------------------------------------------------------------------------


def affine(
    arr: np.ndarray,
    angle: float,
    translate: Sequence[float],
    scale: float,
    shear: float | Sequence[float],
    interpolation=NEAREST,
    fill=None,
    center: Sequence[float] | None = None,
) -> np.ndarray:
    """``torchvision.transforms.functional.affine`` on a PIL image, bit-exact, on (H, W, C) uint8.

    The inverse matrix comes from torchvision's own ``_get_inverse_affine_matrix`` (centre
    defaults to (W / 2, H / 2) as torchvision uses for PIL); Pillow's ``Image.transform`` is then
    reproduced exactly for NEAREST (and NEAREST_EXACT, which torchvision maps to it) and
    BILINEAR. ``interpolation`` is an InterpolationMode, its value or a Pillow filter number;
    ``fill`` is None, a number or a sequence (length 1 or C), as stock accepts it.

    Raises NotImplementedError (run stock instead) for BICUBIC and the other modes, for
    arguments stock rejects (bad types or lengths, scale <= 0, a fill of the wrong length), for
    matrices with non-finite or enormous (>= 1e12) entries, and for an input that is not an
    (H, W, 1|3) uint8 array.
    """
    arr = _check_image(arr)
    resample = _pil_filter(interpolation)
    if not isinstance(angle, (int, float)) or isinstance(angle, bool):
        raise NotImplementedError(f"angle {angle!r}")
    if not isinstance(translate, (list, tuple)) or len(translate) != 2:
        raise NotImplementedError(f"translate {translate!r}")
    if not isinstance(scale, numbers.Real) or not scale > 0.0:
        raise NotImplementedError(f"scale {scale!r}")
    if isinstance(shear, numbers.Number):
        shear = [shear, 0.0]
    elif isinstance(shear, (list, tuple)) and len(shear) in (1, 2):
        shear = [shear[0], shear[0]] if len(shear) == 1 else list(shear)
    else:
        raise NotImplementedError(f"shear {shear!r}")
    height, width, channels = arr.shape
    if center is None:
        center = [width * 0.5, height * 0.5]
    elif not isinstance(center, (list, tuple)) or len(center) != 2:
        raise NotImplementedError(f"center {center!r}")
    color = _fill_color(fill, channels)
    from torchvision.transforms.functional import _get_inverse_affine_matrix

    try:
        matrix = _get_inverse_affine_matrix(center, float(angle), list(translate), scale, shear)
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise NotImplementedError(f"affine parameters: {exc}") from exc
    return _pil_transform_affine(arr, (width, height), matrix, resample, color)


def rotate(
    arr: np.ndarray,
    angle: float,
    interpolation=NEAREST,
    expand: bool = False,
    center: Sequence[float] | None = None,
    fill=None,
) -> np.ndarray:
    """``torchvision.transforms.functional.rotate`` on a PIL image, bit-exact, on (H, W, C) uint8.

    Follows Pillow's ``Image.rotate``: angle taken modulo 360; without a centre, 0 / 180 degrees
    (and 90 / 270 when expanding or for a square image) are plain copies / transposes whatever
    the filter; otherwise the matrix with cos/sin rounded to 15 decimals around ``center``
    (default (W / 2, H / 2)), the ``expand`` canvas (ceil/floor of the turned corners) and
    Pillow's affine engine, reproduced exactly for NEAREST (NEAREST_EXACT) and BILINEAR.

    Raises NotImplementedError (run stock instead) for BICUBIC except on those transposes, for
    other modes, for arguments stock rejects (a non-number angle, a centre that is not a
    2-sequence, a fill of the wrong length) and for an input that is not an (H, W, 1|3) uint8
    array.
    """
    arr = _check_image(arr)
    resample = _pil_filter(interpolation)
    if not isinstance(angle, (int, float)) or isinstance(angle, bool) or not math.isfinite(angle):
        raise NotImplementedError(f"angle {angle!r}")
    if center is not None and (not isinstance(center, (list, tuple)) or len(center) != 2):
        raise NotImplementedError(f"center {center!r}")
    height, width, channels = arr.shape
    color = _fill_color(fill, channels)

    angle = angle % 360.0
    if not center:
        quarter = {90: cv2().ROTATE_90_COUNTERCLOCKWISE, 180: cv2().ROTATE_180, 270: cv2().ROTATE_90_CLOCKWISE}
        if angle == 0:
            return arr.copy()
        if angle == 180 or (angle in (90, 270) and (expand or width == height)):
            turned = cv2().rotate(arr, quarter[int(angle)])
            return turned.reshape(*turned.shape[:2], channels)

    cx, cy = (width / 2, height / 2) if center is None else center
    theta = -math.radians(angle)
    cos_t, sin_t = round(math.cos(theta), 15), round(math.sin(theta), 15)
    m = [cos_t, sin_t, 0.0, round(-math.sin(theta), 15), cos_t, 0.0]

    def apply(x: float, y: float) -> tuple[float, float]:
        return m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]

    m[2], m[5] = apply(-cx, -cy)
    m[2] += cx
    m[5] += cy
    out_w, out_h = width, height
    if expand:
        turned = [apply(x, y) for x, y in ((0, 0), (width, 0), (width, height), (0, height))]
        xs, ys = [p[0] for p in turned], [p[1] for p in turned]
        out_w = math.ceil(max(xs)) - math.floor(min(xs))
        out_h = math.ceil(max(ys)) - math.floor(min(ys))
        m[2], m[5] = apply(-(out_w - width) / 2.0, -(out_h - height) / 2.0)
    return _pil_transform_affine(arr, (out_w, out_h), m, resample, color)


@functools.lru_cache(maxsize=64)
def _gaussian_kernel(size: int, sigma: float) -> np.ndarray:
    """Stock's float32 1-D Gaussian (torchvision computes it with torch, so does this)."""
    import torch
    from torchvision.transforms._functional_tensor import _get_gaussian_kernel1d

    kernel = _get_gaussian_kernel1d(size, sigma, dtype=torch.float32, device=torch.device("cpu")).numpy().copy()
    kernel.setflags(write=False)
    return kernel


def gaussian_blur(arr: np.ndarray, kernel_size: Sequence[int], sigma: Sequence[float] | None = None) -> np.ndarray:
    """``torchvision.transforms.functional.gaussian_blur`` on a PIL image, for (H, W, C) uint8.

    ``kernel_size`` and ``sigma`` are (x, y) pairs as GaussianBlur passes them (an int / a
    number / a 1-sequence / ``sigma=None`` are expanded the way stock does). Stock's float32
    kernel is applied separably in float32 with reflect (no edge repeat) borders and rounded
    half to even; stock convolves with the 2-D outer product in its own summation order, so
    about one value in 10^5 differs, by 1.

    Raises NotImplementedError (run stock instead) for arguments stock rejects (even, negative
    or non-int sizes, non-positive sigmas, wrong lengths), when a kernel half-width is not
    smaller than the image side (stock's reflect padding raises there) and for a non-uint8 or
    non-(H, W, 1|3) input.
    """
    arr = _check_image(arr)
    if isinstance(kernel_size, int):
        kernel_size = [kernel_size, kernel_size]
    if not isinstance(kernel_size, (list, tuple)) or len(kernel_size) != 2:
        raise NotImplementedError(f"kernel_size {kernel_size!r}")
    if not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 and k % 2 == 1 for k in kernel_size):
        raise NotImplementedError(f"kernel_size {kernel_size!r}")
    if sigma is None:
        sigma = [k * 0.15 + 0.35 for k in kernel_size]
    elif isinstance(sigma, (int, float)):
        sigma = [float(sigma), float(sigma)]
    elif isinstance(sigma, (list, tuple)) and len(sigma) == 1:
        sigma = [sigma[0], sigma[0]]
    if not isinstance(sigma, (list, tuple)) or len(sigma) != 2:
        raise NotImplementedError(f"sigma {sigma!r}")
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and 0.0 < s < math.inf for s in sigma):
        raise NotImplementedError(f"sigma {sigma!r}")
    height, width, channels = arr.shape
    kx, ky = kernel_size
    if kx // 2 >= width or ky // 2 >= height:
        raise NotImplementedError("kernel half-width not smaller than the image (stock's reflect padding fails)")
    if kx == 1 and ky == 1:
        return arr.copy()
    mod = cv2()
    target = _scratch("blurred", (height, width) if channels == 1 else (height, width, channels), np.float32)
    blurred = mod.sepFilter2D(
        arr,
        mod.CV_32F,
        _gaussian_kernel(kx, float(sigma[0])),
        _gaussian_kernel(ky, float(sigma[1])),
        dst=target,
        borderType=mod.BORDER_REFLECT_101,
    )
    np.rint(blurred, out=blurred)  # torch.round: half to even; the weights are positive, so 0..255
    return blurred.astype(np.uint8).reshape(height, width, channels)


_BORDERS = {"edge": "BORDER_REPLICATE", "reflect": "BORDER_REFLECT_101", "symmetric": "BORDER_REFLECT"}


def _padding_sides(padding) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) from an int or a 1-, 2- or 4-sequence, as torchvision reads it."""
    if isinstance(padding, (list, tuple)) and len(padding) == 1:
        padding = padding[0]
    if isinstance(padding, int) and not isinstance(padding, bool):
        return padding, padding, padding, padding
    if not isinstance(padding, (list, tuple)) or len(padding) not in (2, 4):
        raise NotImplementedError(f"padding {padding!r}")
    if not all(isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in padding):
        raise NotImplementedError(f"padding {padding!r}")
    sides = [int(p) for p in padding]
    return (sides[0], sides[1], sides[0], sides[1]) if len(sides) == 2 else tuple(sides)  # type: ignore[return-value]


def pad(arr: np.ndarray, padding, fill=0, padding_mode: str = "constant") -> np.ndarray:
    """``torchvision.transforms.functional.pad`` on a PIL image, bit-exact, on (H, W, C) uint8.

    ``padding`` is an int or a 1-, 2- (left/right, top/bottom) or 4-sequence (left, top, right,
    bottom); negative values crop, as stock does. ``padding_mode`` is constant (``fill`` as
    stock parses it: None/number/sequence, truncated and clamped to 0..255), edge, reflect or
    symmetric (``fill`` ignored).

    Raises NotImplementedError (run stock instead) for arguments stock rejects or handles
    oddly (non-int padding, unknown mode, fill of the wrong length, a crop larger than the
    image), when the result would be empty, and for a non-uint8 or non-(H, W, 1|3) input.
    """
    arr = _check_image(arr)
    left, top, right, bottom = _padding_sides(padding)
    if padding_mode != "constant" and padding_mode not in _BORDERS:
        raise NotImplementedError(f"padding_mode {padding_mode!r}")
    height, width, channels = arr.shape
    out_h, out_w = height + top + bottom, width + left + right
    if out_h <= 0 or out_w <= 0:
        raise NotImplementedError("padding leaves no pixels")
    mod = cv2()
    if padding_mode == "constant":
        color = _fill_color(fill, channels)
        if min(left, top, right, bottom) >= 0:
            value = (*color, 0, 0, 0)[:4] if channels == 3 else (color[0], 0, 0, 0)
            out = mod.copyMakeBorder(arr, top, bottom, left, right, mod.BORDER_CONSTANT, value=value)
            return out.reshape(out_h, out_w, channels)
        # Negative sides: Pillow pastes the image at (left, top) on a canvas of the fill colour.
        out = _filled((out_h, out_w, channels), color)
        y0, y1 = max(top, 0), min(top + height, out_h)
        x0, x1 = max(left, 0), min(left + width, out_w)
        if y0 < y1 and x0 < x1:
            out[y0:y1, x0:x1] = arr[y0 - top : y1 - top, x0 - left : x1 - left]
        return out
    # Other modes: torchvision crops the negative sides first, then pads like numpy.pad.
    crop_l, crop_t, crop_r, crop_b = (max(-p, 0) for p in (left, top, right, bottom))
    if crop_l + crop_r >= width or crop_t + crop_b >= height:
        raise NotImplementedError("padding crops the whole image")
    src = arr[crop_t : height - crop_b, crop_l : width - crop_r]
    top, bottom, left, right = (max(p, 0) for p in (top, bottom, left, right))
    if not (top or bottom or left or right):
        return src.copy()
    out = mod.copyMakeBorder(np.ascontiguousarray(src), top, bottom, left, right, getattr(mod, _BORDERS[padding_mode]))
    return out.reshape(out_h, out_w, channels)
