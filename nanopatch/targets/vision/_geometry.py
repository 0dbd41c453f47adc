"""Geometry kernels on HWC uint8 arrays: resize, crops, flips, gaussian_blur and pad with stock's pixels.

Every kernel takes ``arr``, a 3-D ``uint8`` array of shape (H, W, C) with C == 1 (what a PIL
"L" image holds) or C == 3 ("RGB"), possibly a read-only or strided view, and returns a new
array (or a view of the input where stock would copy unchanged pixels, e.g. a crop inside the
image); the input is never written to. The reference is
``torchvision.transforms.functional.<name>`` on the same pixels as a PIL image:

* bilinear resize runs its first pass on torch's uint8 antialiased kernel and its second on
  Pillow, in the order Pillow resamples the axes: within 1 grey level of Pillow (see
  ``_bilinear``); nearest resize reproduces Pillow's accumulated source coordinates,
  bit-exact; the other filters run on Pillow itself, bit-exact;
* crops, flips and ``pad`` are exact (OpenCV's border modes are NumPy's pad modes, also for
  pads wider than the image);
* ``gaussian_blur`` is stock's float32 convolution (the very kernel, reflect padding, round half
  to even) done separably by OpenCV. Stock sums in float32 in its own order, so a value within
  ~1e-4 of a rounding boundary can round the other way: within 1 grey level of stock.

A kernel raises ``NotImplementedError`` for an argument it cannot reproduce (or that makes
stock raise); the caller then runs stock torchvision on a PIL image instead.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from collections.abc import Sequence

import numpy as np

from nanopatch.foundation import usage

from . import native as _native
from ._opencv import cv2
from ._pillow import ROWS_CHECKS
from ._pillow import columns as _pillow_columns
from ._pillow import rows_l as _pillow_rows_l
from ._pixels import checked, contiguous, from_pil, to_pil

# torchvision.transforms.InterpolationMode values (strings), so this module needs no torchvision.
NEAREST = "nearest"
BILINEAR = "bilinear"
BICUBIC = "bicubic"
#: Pillow's resampling filter for each InterpolationMode value it implements.
PIL_FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


def _mode_value(interpolation) -> str:
    return getattr(interpolation, "value", interpolation)


def is_pil_filter(interpolation) -> bool:
    """Whether ``interpolation`` (an InterpolationMode or its value) is one of Pillow's filters."""
    return _mode_value(interpolation) in PIL_FILTERS


# --- argument parsing ------------------------------------------------------------------------


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


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
# Work arrays are reused per thread: fresh megabyte-sized temporaries on every call make glibc
# return memory to the kernel and fault it back in on the next call.

_SCRATCH_LIMIT = 1 << 22  # bytes kept per slot; a bigger request gets a fresh array


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


# --- resize ------------------------------------------------------------------------------


def _accumulate(start: float, step: float, count: int) -> np.ndarray:
    """``start``, ``start + step``, ``(start + step) + step``, ...: a double bumped in a loop."""
    values = np.full(count, step, dtype=np.float64)
    values[0] = start
    return np.add.accumulate(values)


def _vertical_first(in_hw: tuple[int, int], out_hw: tuple[int, int]) -> bool:
    """Whether Pillow resamples the rows before the columns for this resize.

    Pillow 10.4+ does the vertical pass first when it shrinks the height by more than twice
    what it shrinks the width (so the second pass runs on fewer rows); older Pillow always
    went horizontal first.
    """
    return _pillow_picks_order() and in_hw[0] > out_hw[0] and (in_hw[0] - out_hw[0]) > 2 * (in_hw[1] - out_hw[1])


@functools.cache
def _pillow_picks_order() -> bool:
    """Whether this Pillow resamples rows first when the height shrinks most: a direct resize of
    a noise image is compared with Pillow's own two single-axis passes in either order."""
    from PIL import Image

    noise = Image.fromarray(np.random.default_rng(7).integers(0, 256, (40, 9), dtype=np.uint8))
    direct = np.asarray(noise.resize((8, 5), Image.BILINEAR))
    rows_first = np.asarray(noise.resize((9, 5), Image.BILINEAR).resize((8, 5), Image.BILINEAR))
    columns_first = np.asarray(noise.resize((8, 40), Image.BILINEAR).resize((8, 5), Image.BILINEAR))
    return bool(np.array_equal(direct, rows_first) and not np.array_equal(direct, columns_first))


def _torch_pass(arr: np.ndarray, size: tuple[int, int], slot: str | None = None) -> np.ndarray:
    """One axis of a bilinear antialiased resize by torch's uint8 kernel (``size`` differs from
    ``arr``'s in one axis only, so the kernel runs one pass): HWC-contiguous uint8 out, in the
    per-thread scratch array ``slot`` when given (an intermediate the caller consumes at once).

    With 3 channels the kernel writes straight into an HWC array (its ``out=`` form, given a
    channels-last tensor): the same values as ``interpolate``, which returns planar memory that
    must then be interleaved again, and about half the time (see ``_aa_into_usable``)."""
    import torch

    if not (arr.flags.c_contiguous and arr.flags.writeable):
        # torch warns about read-only arrays (it only reads this one, so a scratch copy will do)
        arr = _copy_into(_scratch("torch_in", arr.shape, np.uint8), arr)
    t = torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0)  # 1CHW view, channels-last memory
    channels = arr.shape[2]
    out_h, out_w = int(size[0]), int(size[1])
    if channels == 3 and _aa_into_usable():
        out = np.empty((out_h, out_w, 3), np.uint8) if slot is None else _scratch(slot, (out_h, out_w, 3), np.uint8)
        _aa_into(t, out)
        return out
    return _aa_interpolate(t, (out_h, out_w))


def _copy_into(target: np.ndarray, arr: np.ndarray) -> np.ndarray:
    np.copyto(target, arr)
    return target


def _aa_interpolate(t, size: tuple[int, int]) -> np.ndarray:
    """``interpolate`` (bilinear, antialias) of the 1CHW uint8 tensor ``t`` to ``size``, as HWC."""
    import torch
    import torch.nn.functional as tf

    t = tf.interpolate(t, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
    if t.shape[1] > 1 and not t.is_contiguous(memory_format=torch.channels_last):
        # the kernel returns planar (NCHW) memory: interleave the planes again (cv2.merge beats
        # a numpy transpose copy), so later steps get HWC-contiguous pixels
        return cv2().merge(list(t[0].numpy()))
    return t[0].permute(1, 2, 0).numpy()


def _aa_into(t, out: np.ndarray) -> None:
    """torch's bilinear antialiased uint8 kernel from the 1CHW tensor ``t`` into the HWC array
    ``out`` (its size is the output size): the op ``interpolate`` calls, in its ``out=`` form."""
    import torch

    target = torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0)
    torch.ops.aten._upsample_bilinear2d_aa.out(t, [out.shape[0], out.shape[1]], False, None, None, out=target)


@functools.cache
def _aa_into_usable() -> bool:
    """Whether ``_aa_into`` exists here and gives ``interpolate``'s very pixels (and no warning),
    checked on noise images for single-axis passes that shrink and enlarge either axis."""
    import torch

    from nanopatch.foundation.log import warnings_from

    rng = np.random.default_rng(5)
    try:
        with warnings_from(r"(torch|nanopatch)(\.|\Z)", "error"):  # the kernels' warnings
            for in_hw, out_hw in (
                ((37, 29), (37, 17)),
                ((37, 29), (20, 29)),
                ((13, 11), (13, 30)),
                ((13, 11), (31, 11)),
            ):
                pixels = rng.integers(0, 256, (*in_hw, 3), dtype=np.uint8)
                t = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
                out = np.empty((*out_hw, 3), np.uint8)
                _aa_into(t, out)
                if not np.array_equal(out, _aa_interpolate(t, out_hw)):
                    return False
    except Exception:  # no such op or signature in this torch: interpolate then
        return False
    return True


def _bilinear(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Pillow's bilinear resize, faster than Pillow: its very pixels where both passes run on
    nanopatch's compiled copies of Pillow's loops (``native``), else within one grey level.

    Pillow resamples one axis, rounds to uint8, then the other. The compiled passes are
    Pillow's arithmetic. The horizontal one runs 16 lines at a time on transposed bytes, as
    fast as torch's kernel or faster for lines of up to 1024 RGB pixels shrunk at most 4x
    (:func:`_columns_pay`); for wider ones, or without the kernel, torch's uint8 kernel does
    the first pass. That one is within one level of Pillow's (16-bit weights where Pillow uses
    22-bit ones), and two such passes could add up to two levels, so the second pass is always
    exact: an exact pass with non-negative weights moves a one-level error in its input by at
    most one level, and rounding is monotone, so the result stays within one.
    """
    in_h, in_w = arr.shape[:2]
    out_h, out_w = size
    if out_h == in_h and out_w == in_w:
        return _torch_pass(arr, size)  # a copy
    if out_h == in_h:
        return _first_columns(arr, out_w, None)  # a single pass
    if out_w == in_w:
        return _first_rows(arr, out_h, None)
    if _vertical_first((in_h, in_w), size):
        return _pillow_pass(_first_rows(arr, out_h, "mid"), size, vertical=False)
    return _pillow_pass(_first_columns(arr, out_w, "mid"), size, vertical=True)


def _columns_pay(in_w: int, out_w: int, channels: int) -> bool:
    """Whether the compiled horizontal pass is as fast as torch's kernel or faster, so that the
    resize is exact at no cost: lines of up to 1024 RGB pixels shrunk at most 4x. Measured on a
    2-core AMD EPYC, one core, its time over torch's: 0.74 for 300x512 -> 224 wide, 0.80 for
    450x600 -> 341, 0.92 for 600x800 -> 341, 0.99-1.04 for 450x600 -> 224, 300x700 -> 224 and
    300x1000 -> 300; outside the rule 1.10 for 900x1200 -> 341, 1.24 for 512 -> 32 and 1.56 for
    1800x2400 -> 800 (16 transposed lines of 2400 pixels no longer fit the L1 cache)."""
    return in_w * channels <= 3072 and in_w <= 4 * out_w


def _compiled_columns(arr: np.ndarray, out_w: int, span: tuple[float, float] | None) -> np.ndarray | None:
    """The horizontal pass of the (H, W, C) ``arr`` on the compiled kernel, where it is used and
    pays (:func:`_columns_pay`): (H, out_w, C); else None."""
    fn = _native.columns_kernel() if _columns_pay(arr.shape[1], out_w, arr.shape[2]) else None
    out = None if fn is None else _native.columns(fn, arr, out_w, span)
    if out is not None:
        usage.record("resize-kernel")
    return out


def _compiled_rows(arr: np.ndarray, out_h: int, span: tuple[float, float] | None) -> np.ndarray | None:
    """The vertical pass of the bytes of ``arr`` on the compiled kernel, where it is used:
    (out_h, row bytes); else None."""
    fn = _native.kernel()
    out = None if fn is None else _native.rows(fn, arr, out_h, span)
    if out is not None:
        usage.record("resize-kernel")
    return out


def _first_columns(arr: np.ndarray, out_w: int, slot: str | None) -> np.ndarray:
    """The first, horizontal, pass: exact on the compiled kernel where it pays, else torch's."""
    out = _compiled_columns(arr, out_w, None)
    return out if out is not None else _torch_pass(arr, (arr.shape[0], out_w), slot)


def _first_rows(arr: np.ndarray, out_h: int, slot: str | None) -> np.ndarray:
    """The first, vertical, pass: exact on the compiled kernel where it is used, else torch's."""
    out = _compiled_rows(arr, out_h, None)
    if out is not None:
        return out.reshape(out_h, *arr.shape[1:])
    return _torch_pass(arr, (out_h, arr.shape[1]), slot)


def _pillow_pass(
    arr: np.ndarray, size: tuple[int, int], span: tuple[float, float] | None = None, *, vertical: bool
) -> np.ndarray:
    """One axis of Pillow's bilinear resize to ``size``, bit-exact: the rows (``vertical``) or
    the columns; ``size`` keeps the other axis. ``span``: the (start, end) source box along the
    axis, as ``Image.resize``'s ``box`` takes it (float32 values), else the whole axis.

    A vertical pass mixes rows only, so each byte column of the (H, W, C) pixels is resampled
    on its own with the same weights (``_pillow_rows_rgbx``, else ``_pillow_rows_l``). Pillow
    computes its horizontal pass with the same weights and arithmetic as its vertical one, so a
    horizontal pass is the vertical pass of the transposed pixels, transposed back (two cheap
    OpenCV transposes: about half the time of Pillow's RGB image pass), where checked alike."""
    in_h, in_w, channels = arr.shape
    out_h, out_w = size
    if vertical:
        return _pillow_rows(arr, out_h, span).reshape(out_h, out_w, channels)
    done = _compiled_columns(arr, out_w, span)
    if done is not None:
        return done
    if _axes_alike():
        across = cv2().transpose(contiguous(arr)).reshape(in_w, in_h, channels)
        done = _pillow_rows(across, out_w, span).reshape(out_w, in_h, channels)
        return cv2().transpose(done).reshape(out_h, out_w, channels)
    return _pillow_columns(arr, out_w, span)


def _pillow_rows(arr: np.ndarray, out_h: int, span: tuple[float, float] | None) -> np.ndarray:
    """Pillow's bilinear vertical pass of the bytes of ``arr`` (H, ...) to ``out_h`` rows:
    (out_h, row bytes) uint8, by nanopatch's compiled copy of Pillow's loop (``native``: the
    same bytes, ~4x faster) where this machine built it, else the fastest of Pillow's own
    loops that gives these bytes."""
    out = _compiled_rows(arr, out_h, span)
    if out is not None:
        return out
    rows = _pillow_rows_rgbx if _rgbx_rows_usable() else _pillow_rows_l
    return rows(arr.reshape(arr.shape[0], -1) if arr.flags.c_contiguous else arr, out_h, span)


@functools.cache
def _axes_alike() -> bool:
    """Whether Pillow's horizontal pass (``_pillow_columns``) gives, on this Pillow, the
    transposed vertical pass of the transposed pixels (``_pillow_pass``'s way), checked on noise
    images: shrinking, enlarging, with and without a box, 3 channels and 1."""
    rng = np.random.default_rng(17)
    try:
        for in_hw, out_w, span, channels in (
            ((23, 37), 20, None, 3),
            ((23, 37), 61, None, 3),
            ((19, 300), 224, None, 3),
            ((17, 60), 23, (3.5, 55.25), 3),
            ((17, 60), 40, (0.0, 41.0), 1),
        ):
            pixels = rng.integers(0, 256, (*in_hw, channels), dtype=np.uint8)
            across = cv2().transpose(pixels).reshape(in_hw[1], in_hw[0], channels)
            done = _pillow_rows(across, out_w, span).reshape(out_w, in_hw[0], channels)
            mine = cv2().transpose(done).reshape(in_hw[0], out_w, channels)
            if not np.array_equal(mine, _pillow_columns(pixels, out_w, span)):
                return False
    except Exception:  # an OpenCV or Pillow that will not: Pillow's own horizontal pass then
        return False
    return True


def _pillow_rows_rgbx(arr: np.ndarray, out_h: int, span: tuple[float, float] | None) -> np.ndarray:
    """``_pillow_rows_l``'s bytes, computed by Pillow's four-band loop: each row's bytes go to
    Pillow as the pixels of one "RGBX" image (shared with the array when a row is a whole number
    of 4-byte pixels, else copied into a scratch array with up to 3 padding bytes a row, whose
    outputs are dropped). Pillow resamples each of the 4 bands as it does an "L" image's one
    band (same weights, same integer arithmetic), with 4 accumulators at once, which is faster."""
    from PIL import Image

    in_h = arr.shape[0]
    row = arr.size // max(in_h, 1)
    padded = -(-row // 4) * 4
    if padded == row and arr.flags.c_contiguous:
        buf = arr
    else:
        buf = _scratch("pillow_rows", (in_h, padded), np.uint8)
        np.copyto(buf[:, :row].reshape(arr.shape), arr)
    img = Image.frombuffer("RGBX", (padded // 4, in_h), buf, "raw", "RGBX", 0, 1)
    box = (0, 0, padded // 4, in_h) if span is None else (0, span[0], padded // 4, span[1])
    out = np.asarray(img.resize((padded // 4, out_h), Image.BILINEAR, box)).reshape(out_h, padded)
    return out if padded == row else np.ascontiguousarray(out[:, :row])


@functools.cache
def _rgbx_rows_usable() -> bool:
    """Whether ``_pillow_rows_rgbx`` gives ``_pillow_rows_l``'s very bytes on this Pillow, checked
    on noise images (:data:`ROWS_CHECKS`)."""
    rng = np.random.default_rng(13)
    try:
        for in_h, row, out_h, span in ROWS_CHECKS:
            pixels = rng.integers(0, 256, (in_h, row), dtype=np.uint8)
            if not np.array_equal(_pillow_rows_rgbx(pixels, out_h, span), _pillow_rows_l(pixels, out_h, span)):
                return False
    except Exception:  # a Pillow without "RGBX" buffers: the "L" image then
        return False
    return True


def _pillow_coefficients(in_size: int, in0: float, in1: float, out_size: int):
    """Pillow's bilinear weights for one axis (``precompute_coeffs`` + ``normalize_coeffs_8bpc``
    in Resample.c, the same double arithmetic in the same order): per output pixel the first
    source index, the number of taps, and the 22-bit fixed-point weights (out_size, ksize).
    ``in0``/``in1`` are the box's float32 bounds along the axis."""
    f32 = np.float32
    scale = float(f32(f32(in1) - f32(in0))) / out_size
    filterscale = max(scale, 1.0)
    support = filterscale  # the bilinear filter's support is 1
    ksize = math.ceil(support) * 2 + 1
    center = float(f32(in0)) + (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    ss = 1.0 / filterscale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    count = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
    taps = np.arange(ksize)
    weights = np.abs(((taps[None, :] + xmin[:, None]).astype(np.float64) - center[:, None] + 0.5) * ss)
    weights = np.where((weights < 1.0) & (taps[None, :] < count[:, None]), 1.0 - weights, 0.0)
    total = weights[:, 0].copy()
    for i in range(1, ksize):  # summed in Pillow's order
        total += weights[:, i]
    safe = np.where(total != 0.0, total, 1.0)
    fixed = np.trunc(0.5 + (weights / safe[:, None]) * float(1 << 22)).astype(np.int64)
    return xmin, count, fixed


@functools.lru_cache(maxsize=1024)
def _second_pass_plan(in_size: int, out_size: int, start: int, length: int):
    """For Pillow's second pass, along an axis resized ``in_size`` -> ``out_size``, of which only
    outputs ``[start, start + length)`` are wanted: the source lines ``(first, last)`` they read,
    and the box (float32 bounds within those lines) for which Pillow computes exactly those
    outputs with exactly the same weights; None when no such box exists (float32 box bounds
    shift the filter centres unless they are exact, as when ``out_size`` is a power of two)."""
    xmin, count, fixed = _pillow_coefficients(in_size, 0.0, float(in_size), out_size)
    end = start + length
    first, last = int(xmin[start]), int((xmin[start:end] + count[start:end]).max())
    scale = in_size / out_size
    lo = float(np.float32(start * scale - first))
    hi = float(np.float32(lo + length * scale))
    if not (0.0 <= lo < hi <= last - first) or not _box_is_pillows():
        return None
    sub_min, sub_count, sub_fixed = _pillow_coefficients(last - first, lo, hi, length)
    if sub_fixed.shape[1] != fixed.shape[1] or not (
        np.array_equal(sub_min + first, xmin[start:end])
        and np.array_equal(sub_count, count[start:end])
        and np.array_equal(sub_fixed, fixed[start:end])
    ):
        return None
    return first, last, (lo, hi)


@functools.cache
def _box_is_pillows() -> bool:
    """Whether Pillow's resize of a box gives what ``_second_pass_plan`` predicts (the outputs of
    the whole-axis resize), checked on noise images of a few shapes before it is relied on."""
    rng = np.random.default_rng(11)
    for in_size, out_size, start, length in (
        (375, 256, 16, 224),
        (500, 256, 16, 224),
        (300, 128, 5, 100),
        (100, 160, 7, 50),
    ):
        xmin, count, _ = _pillow_coefficients(in_size, 0.0, float(in_size), out_size)
        end = start + length
        first, last = int(xmin[start]), int((xmin[start:end] + count[start:end]).max())
        scale = in_size / out_size
        lo = float(np.float32(start * scale - first))
        span = (lo, float(np.float32(lo + length * scale)))
        pixels = rng.integers(0, 256, (in_size, 7, 3), dtype=np.uint8)
        whole = _pillow_pass(pixels, (out_size, 7), vertical=True)[start:end]
        if not np.array_equal(_pillow_pass(pixels[first:last], (length, 7), span, vertical=True), whole):
            return False
        across = np.ascontiguousarray(pixels.transpose(1, 0, 2))
        whole = _pillow_pass(across, (7, out_size), vertical=False)[:, start:end]
        part = np.ascontiguousarray(across[:, first:last])
        if not np.array_equal(_pillow_pass(part, (7, length), span, vertical=False), whole):
            return False
    return True


def resize_crop(
    arr: np.ndarray, size: Sequence[int], top: int, left: int, height: int, width: int, interpolation=BILINEAR
) -> np.ndarray:
    """``crop(resize(arr, size, interpolation), top, left, height, width)``, the same pixels,
    computing only what the crop keeps where that is exact (a bilinear resize, a box inside the
    resized image): the first pass only on the source lines the second pass reads for the
    box, the second pass only on the box's columns (rows), and only for its rows (columns) when
    a Pillow box gives the very same weights (see ``_second_pass_plan``)."""
    out_h, out_w = int(size[0]), int(size[1])
    in_h, in_w = arr.shape[:2]
    top, left, height, width = int(top), int(left), int(height), int(width)
    inside = 0 <= top and 0 <= left and top + height <= out_h and left + width <= out_w
    if (
        not inside
        or _mode_value(interpolation) != BILINEAR
        or arr.shape[2] != 3
        or min(in_h, in_w, out_h, out_w, height, width) < 2
        or (out_h, out_w) == (in_h, in_w)
    ):
        return crop(resize(arr, (out_h, out_w), interpolation), top, left, height, width)
    if out_w == in_w:  # one vertical pass: the columns are independent
        return _first_rows(arr[:, left : left + width], out_h, None)[top : top + height]
    if out_h == in_h:  # one horizontal pass: the rows are independent
        return _first_columns(arr[top : top + height], out_w, None)[:, left : left + width]
    if _vertical_first((in_h, in_w), (out_h, out_w)):  # first down the columns, then along the rows
        plan = _second_pass_plan(in_w, out_w, left, width)
        if plan is None or plan[1] - plan[0] < 2:
            mid = _first_rows(arr, out_h, "mid")[top : top + height]
            return _pillow_pass(mid, (height, out_w), vertical=False)[:, left : left + width]
        first, last, span = plan
        mid = _first_rows(arr[:, first:last], out_h, "mid")[top : top + height]
        return _pillow_pass(mid, (height, width), span, vertical=False)
    plan = _second_pass_plan(in_h, out_h, top, height)  # first along the rows, then down the columns
    if plan is None or plan[1] - plan[0] < 2:
        mid = _first_columns(arr, out_w, "mid")[:, left : left + width]
        return _pillow_pass(mid, (out_h, width), vertical=True)[top : top + height]
    first, last, span = plan
    mid = _first_columns(arr[first:last], out_w, "mid")[:, left : left + width]
    return _pillow_pass(mid, (height, width), span, vertical=True)


def _nearest_positions(in_len: int, out_len: int) -> np.ndarray:
    """Pillow's nearest-neighbour source index per output pixel: a double that starts at half a
    step and grows by the step, truncated (accumulated in the same order as Pillow's loop)."""
    step = in_len / out_len
    return np.minimum(_accumulate(step * 0.5, step, out_len).astype(np.int64), in_len - 1)


def resize(arr: np.ndarray, size: Sequence[int], interpolation=BILINEAR) -> np.ndarray:
    """``arr`` resized to ``size`` = (h, w) as Pillow's ``Image.resize`` does it."""
    out_h, out_w = int(size[0]), int(size[1])
    mode = _mode_value(interpolation)
    if mode not in PIL_FILTERS or out_h <= 0 or out_w <= 0:
        raise NotImplementedError(f"resize with {interpolation!r} to {size!r}")
    in_h, in_w = arr.shape[:2]
    if (out_h, out_w) == (in_h, in_w):
        return arr
    if in_h == 0 or in_w == 0:
        raise NotImplementedError("resize of an empty image")  # Pillow has its own answer
    if mode == NEAREST:
        return arr[_nearest_positions(in_h, out_h)][:, _nearest_positions(in_w, out_w)]
    if mode == BILINEAR and arr.shape[2] == 3 and min(in_h, in_w, out_h, out_w) > 1:
        # (torch's kernel trips an internal assert on some 1-pixel-wide shapes: Pillow does those)
        return _bilinear(arr, (out_h, out_w))
    return from_pil(to_pil(arr).resize((out_w, out_h), PIL_FILTERS[mode]))


# --- crops and flips -------------------------------------------------------------------------


def crop(arr: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    """The box as Pillow crops it: a view when it lies inside the image, zeros where it does
    not (Pillow pads a box that runs off the image with black)."""
    in_h, in_w, channels = arr.shape
    top, left, height, width = int(top), int(left), int(height), int(width)
    if top >= 0 and left >= 0 and top + height <= in_h and left + width <= in_w and height >= 0 and width >= 0:
        return arr[top : top + height, left : left + width]
    out = np.zeros((max(height, 0), max(width, 0), channels), np.uint8)
    y0, y1 = max(top, 0), min(top + height, in_h)
    x0, x1 = max(left, 0), min(left + width, in_w)
    if y1 > y0 and x1 > x0:
        out[y0 - top : y1 - top, x0 - left : x1 - left] = arr[y0:y1, x0:x1]
    return out


def center_crop(arr: np.ndarray, output_size: Sequence[int]) -> np.ndarray:
    """``F.center_crop`` on a PIL image: pad with zeros when the crop is larger, then crop at
    the rounded centre."""
    crop_h, crop_w = int(output_size[0]), int(output_size[1])
    in_h, in_w = arr.shape[:2]
    if crop_w > in_w or crop_h > in_h:
        pad_left = (crop_w - in_w) // 2 if crop_w > in_w else 0
        pad_top = (crop_h - in_h) // 2 if crop_h > in_h else 0
        padded_h = in_h + pad_top + ((crop_h - in_h + 1) // 2 if crop_h > in_h else 0)
        padded_w = in_w + pad_left + ((crop_w - in_w + 1) // 2 if crop_w > in_w else 0)
        arr = crop(arr, -pad_top, -pad_left, padded_h, padded_w)
        in_h, in_w = padded_h, padded_w
        if (crop_h, crop_w) == (in_h, in_w):
            return arr
    top = round((in_h - crop_h) / 2.0)
    left = round((in_w - crop_w) / 2.0)
    return crop(arr, top, left, crop_h, crop_w)


def resized_crop(arr, top, left, height, width, size, interpolation=BILINEAR) -> np.ndarray:
    return resize(crop(arr, top, left, height, width), size, interpolation)


def hflip(arr: np.ndarray) -> np.ndarray:
    if arr.size == 0:
        return arr[:, ::-1].copy()  # cv2.flip returns None for an empty image
    flipped = cv2().flip(contiguous(arr), 1)
    return flipped[:, :, None] if flipped.ndim == 2 else flipped


def vflip(arr: np.ndarray) -> np.ndarray:
    return arr[::-1]


# --- blur and pad -----------------------------------------------------------------------------


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
    arr = checked(arr)
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
    arr = checked(arr)
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
