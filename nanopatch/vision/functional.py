"""Pixel kernels on HWC uint8 ndarrays: torchvision's functional ops with stock's pixels.

Every kernel takes ``arr``, a 3-D ``uint8`` array of shape (H, W, C) with C == 1 (what a PIL
"L" image holds) or C == 3 ("RGB"), possibly a read-only or strided view, and returns a new
array (or a view of the input where stock would copy unchanged pixels, e.g. a crop inside the
image); the input is never written to. The reference for each kernel is what
``torchvision.transforms.functional`` returns on the same pixels as a PIL image, which is the
path stock torchvision takes for ImageFolder-style data:

* bilinear resize runs its first pass on torch's uint8 antialiased kernel and its second on
  Pillow, in the order Pillow resamples the axes: within 1 grey level of Pillow (see
  ``_bilinear``); other filters run on Pillow itself, bit-exact;
* nearest resize reproduces Pillow's accumulated source coordinates, bit-exact;
* crops and flips are exact; the fused ``to_tensor_normalize`` is bit-identical to ToTensor
  followed by Normalize (a per-channel float32 lookup table computed with stock's arithmetic);
* colour and geometry kernels live in ``_color`` and ``_geometry`` and are re-exported here.

A kernel raises ``NotImplementedError`` for an input it cannot reproduce within tolerance
(an unusual filter, say); callers then run stock torchvision on a PIL image instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from ._opencv import cv2

# torchvision.transforms.InterpolationMode values (strings), so this module needs no torchvision.
NEAREST = "nearest"
BILINEAR = "bilinear"
BICUBIC = "bicubic"
_PIL_FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


def _mode_value(interpolation) -> str:
    return getattr(interpolation, "value", interpolation)


# --- conversions -----------------------------------------------------------------------------


def from_pil(img) -> np.ndarray:
    """The pixels of an "L" or "RGB" PIL image as (H, W, C) uint8 (a fresh array)."""
    arr = np.asarray(img)
    return arr[:, :, None] if arr.ndim == 2 else arr


def to_pil(arr: np.ndarray):
    """An "L" (C == 1) or "RGB" (C == 3) PIL image of ``arr``."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(arr[:, :, 0] if arr.shape[2] == 1 else arr))


def contiguous(arr: np.ndarray) -> np.ndarray:
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


# --- resize --------------------------------------------------------------------------------


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


def _torch_pass(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """One axis of a bilinear antialiased resize by torch's uint8 kernel (``size`` differs from
    ``arr``'s in one axis only, so the kernel runs one pass): HWC-contiguous uint8 out."""
    import torch
    import torch.nn.functional as tf

    if not (arr.flags.c_contiguous and arr.flags.writeable):
        arr = arr.copy()  # torch warns about read-only arrays (it only reads this one)
    t = torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0)  # 1CHW view, channels-last memory
    t = tf.interpolate(t, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
    if t.shape[1] > 1 and not t.is_contiguous(memory_format=torch.channels_last):
        # the kernel returns planar (NCHW) memory: interleave the planes again (cv2.merge is
        # ~30x faster than a numpy transpose copy), so later steps get HWC-contiguous pixels
        return cv2().merge(list(t[0].numpy()))
    return t[0].permute(1, 2, 0).numpy()


def _bilinear(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Pillow's bilinear resize within one grey level, faster than Pillow.

    Pillow resamples one axis, rounds to uint8, then the other. torch's uint8 kernel computes
    each pass within one level of Pillow's (it uses 16-bit weights where Pillow uses 22-bit
    ones), but two such passes can add up to two levels. So torch does the first (larger) pass
    and Pillow the second: an exact pass with non-negative weights moves a one-level error in
    its input by at most one level, and rounding is monotone, so the result stays within one.
    """
    in_h, in_w = arr.shape[:2]
    out_h, out_w = size
    if out_h == in_h or out_w == in_w:
        return _torch_pass(arr, size)  # a single pass
    if _vertical_first((in_h, in_w), size):
        return _pillow_pass(_torch_pass(arr, (out_h, in_w)), size, vertical=False)
    return _pillow_pass(_torch_pass(arr, (in_h, out_w)), size, vertical=True)


def _pillow_pass(
    arr: np.ndarray, size: tuple[int, int], span: tuple[float, float] | None = None, *, vertical: bool
) -> np.ndarray:
    """One axis of Pillow's bilinear resize to ``size``, bit-exact: the rows (``vertical``) or
    the columns; ``size`` keeps the other axis. ``span``: the (start, end) source box along the
    axis, as ``Image.resize``'s ``box`` takes it (float32 values), else the whole axis.

    A vertical pass mixes rows only, so the (H, W, C) pixels go to Pillow as one "L" image of
    W * C columns, shared with the array (no conversion to Pillow's 4-byte RGB pixels) and
    computed with Pillow's single-band loop, which is faster than its RGB one."""
    from PIL import Image

    in_h, in_w, channels = arr.shape
    out_h, out_w = size
    filt = _PIL_FILTERS[BILINEAR]
    if vertical:
        arr = np.ascontiguousarray(arr)
        flat = Image.frombuffer("L", (in_w * channels, in_h), arr, "raw", "L", 0, 1)
        box = (0, 0, in_w * channels, in_h) if span is None else (0, span[0], in_w * channels, span[1])
        return np.asarray(flat.resize((in_w * channels, out_h), filt, box)).reshape(out_h, out_w, channels)
    box = (0, 0, in_w, in_h) if span is None else (span[0], 0, span[1], in_h)
    return from_pil(to_pil(arr).resize((out_w, out_h), filt, box))


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
        return _torch_pass(arr[:, left : left + width], (out_h, width))[top : top + height]
    if out_h == in_h:  # one horizontal pass: the rows are independent
        return _torch_pass(arr[top : top + height], (height, out_w))[:, left : left + width]
    if _vertical_first((in_h, in_w), (out_h, out_w)):  # torch down the columns, Pillow along the rows
        plan = _second_pass_plan(in_w, out_w, left, width)
        if plan is None or plan[1] - plan[0] < 2:
            mid = _torch_pass(arr, (out_h, in_w))[top : top + height]
            return _pillow_pass(mid, (height, out_w), vertical=False)[:, left : left + width]
        first, last, span = plan
        mid = _torch_pass(arr[:, first:last], (out_h, last - first))[top : top + height]
        return _pillow_pass(mid, (height, width), span, vertical=False)
    plan = _second_pass_plan(in_h, out_h, top, height)  # torch along the rows, Pillow down the columns
    if plan is None or plan[1] - plan[0] < 2:
        mid = _torch_pass(arr, (in_h, out_w))[:, left : left + width]
        return _pillow_pass(mid, (out_h, width), vertical=True)[top : top + height]
    first, last, span = plan
    mid = _torch_pass(arr[first:last], (last - first, out_w))[:, left : left + width]
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
    if mode not in _PIL_FILTERS or out_h <= 0 or out_w <= 0:
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
    return from_pil(to_pil(arr).resize((out_w, out_h), _PIL_FILTERS[mode]))


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


# --- to tensor -----------------------------------------------------------------------------


def pil_to_tensor(arr: np.ndarray):
    """``F.pil_to_tensor``: uint8 (C, H, W), a channels-last view of HWC memory as stock's is."""
    import torch

    out = torch.empty(arr.shape, dtype=torch.uint8)
    out.numpy()[...] = arr
    return out.permute(2, 0, 1)


def lookup(arr: np.ndarray, table: np.ndarray, *, channels_last: bool = False):
    """A float32 tensor (C, H, W) holding ``table[c][arr[..., c]]`` (``table`` is (C, 256)
    float32): C-contiguous as ToTensor's is, or with ``channels_last`` a view of HWC memory as
    stock's ``pil_to_tensor`` + float conversion (or v2's ``ToImage`` + ``ToDtype``) leaves it."""
    import torch

    in_h, in_w, channels = arr.shape
    if arr.size == 0:
        empty = torch.empty(arr.shape, dtype=torch.float32)
        return empty.permute(2, 0, 1) if channels_last else empty.permute(2, 0, 1).contiguous()
    if channels_last:
        out = cv2().LUT(contiguous(arr), np.ascontiguousarray(table.T).reshape(1, 256, channels))
        return torch.from_numpy(out[:, :, None] if out.ndim == 2 else out).permute(2, 0, 1)
    out = torch.empty((channels, in_h, in_w), dtype=torch.float32)
    planes = out.numpy()
    if channels == 1:
        cv2().LUT(contiguous(arr[:, :, 0]), table[0], dst=planes[0])
    else:  # one LUT per plane, written straight into the CHW planes
        for c, plane in enumerate(cv2().split(contiguous(arr))):
            cv2().LUT(plane, table[c], dst=planes[c])
    return out


@functools.lru_cache(maxsize=64)
def _lookup_table(channels: int, mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> np.ndarray:
    """(channels, 256) float32: value / 255, then (x - mean) / std, each step in float32 as
    ToTensor's ``div(255)`` and Normalize's ``sub_``/``div_`` compute it."""
    levels = np.arange(256, dtype=np.float32) / np.float32(255)
    table = np.repeat(levels[None], channels, axis=0)
    if mean is not None:
        m = np.broadcast_to(np.asarray(mean, np.float32), (channels,))[:, None]
        s = np.broadcast_to(np.asarray(std, np.float32), (channels,))[:, None]
        table = (table - m) / s
    table.flags.writeable = False
    return table


def to_tensor_normalize(arr: np.ndarray, mean: Sequence[float] | None = None, std: Sequence[float] | None = None):
    """ToTensor (uint8 HWC -> float32 CHW in [0, 1]), then Normalize when ``mean`` and ``std``
    are given, in one pass; bit-identical to the two stock steps. ``mean``/``std`` must have 1
    or C entries (as Normalize broadcasts them)."""
    channels = arr.shape[2]
    key_mean = None if mean is None else tuple(float(v) for v in mean)
    key_std = None if std is None else tuple(float(v) for v in std)
    if key_mean is not None and (len(key_mean) not in (1, channels) or len(key_std) not in (1, channels)):
        raise NotImplementedError("mean/std do not broadcast over the channels")
    return lookup(arr, _lookup_table(channels, key_mean, key_std))


def to_tensor(arr: np.ndarray):
    """``F.to_tensor`` of a uint8 image: float32 CHW in [0, 1]."""
    return to_tensor_normalize(arr)


# --- colour and geometry kernels (their own modules), re-exported ----------------------------

from ._color import (  # noqa: E402
    adjust_brightness,
    adjust_contrast,
    adjust_gamma,
    adjust_hue,
    adjust_saturation,
    adjust_sharpness,
    autocontrast,
    color_jitter,
    equalize,
    invert,
    posterize,
    rgb_to_grayscale,
    solarize,
)
from ._geometry import _accumulate, affine, gaussian_blur, pad, rotate  # noqa: E402

__all__ = [
    "adjust_brightness",
    "adjust_contrast",
    "adjust_gamma",
    "adjust_hue",
    "adjust_saturation",
    "adjust_sharpness",
    "affine",
    "autocontrast",
    "center_crop",
    "color_jitter",
    "crop",
    "equalize",
    "from_pil",
    "gaussian_blur",
    "hflip",
    "invert",
    "pad",
    "pil_to_tensor",
    "posterize",
    "resize",
    "resized_crop",
    "rgb_to_grayscale",
    "rotate",
    "solarize",
    "to_pil",
    "to_tensor",
    "to_tensor_normalize",
    "vflip",
]
