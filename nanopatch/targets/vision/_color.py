"""Colour transforms on HWC uint8 arrays that give stock torchvision's pixels on PIL images.

Every function takes ``arr``, an (H, W, C) uint8 array with C == 1 (a PIL "L" image) or C == 3
(an "RGB" image), never modifies it, and returns a new C-contiguous (H, W, C') uint8 array equal,
bit for bit, to what ``torchvision.transforms.functional.<name>`` returns on
``Image.fromarray(arr[..., 0] if C == 1 else arr)``. Anything it cannot reproduce exactly (another
dtype or layout, an empty image, a factor of a type or size whose arithmetic Pillow leaves
undefined) raises :class:`NotImplementedError` so the caller can run stock instead; a factor
stock rejects raises stock's exception.

How Pillow computes, and how this module matches it:

* ``ImageEnhance`` (brightness, contrast, saturation, sharpness) is ``Image.blend(degenerate,
  image, factor)``: in C single precision, ``float t = d + alpha * (v - d)`` with ``alpha``
  rounded to a C float, then truncated towards zero (and clipped to 0..255 when ``alpha`` is
  outside [0, 1]). The same float32 operations in numpy (one rounding per operation, never
  fused) give the same bits. With a constant degenerate image (black for brightness, a grey of
  the rounded mean of the "L" image for contrast) the blend is a 256-entry lookup table.
* "L" is ``(19595 R + 38470 G + 7471 B + 0x8000) >> 16``. Scaled by 2**-16 every partial sum is
  a multiple of 2**-16 below 256, exactly representable in float32, so ``cv2.transform`` on a
  float32 image gives it exactly, whatever order or precision OpenCV sums in.
* SMOOTH (sharpness) is ``trunc(sum / 13 + 0.5)`` over the 3x3 kernel [1 1 1; 1 5 1; 1 1 1],
  in float, the outermost rows and columns copied, images narrower or shorter than 3 copied
  whole. ``sum / 13 + 0.5`` is never within 1/26 of an integer, far more than float error, so
  any float evaluation of it floors to Pillow's value.
* Hue goes through Pillow's HSV, a mix of float and double arithmetic with truncations and a
  round-half-away. Hue and saturation bytes are tabulated once from that arithmetic (hue
  depends only on R - G and G - B); HSV -> RGB is ``round(V * y)`` per channel with ``y`` from
  a (hue, saturation) table, and ``floor(V * y + 0.5)`` in float32 equals Pillow's double
  result for all 2**24 (H, S, V) bytes, as the tests check exhaustively.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from . import _jitter
from ._opencv import cv2
from ._pixels import checked

__all__ = [
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "adjust_sharpness",
    "autocontrast",
    "color_jitter",
    "equalize",
    "invert",
    "posterize",
    "rgb_to_grayscale",
    "solarize",
]

_F32 = np.float32
_F32_MAX = float(np.finfo(np.float32).max)
_F64 = np.float64
_LEVELS_F32 = np.arange(256, dtype=_F32)
#: "L" from RGB, scaled by 2**-16 (exact in float32) with the rounding constant as the offset.
_LUMA = np.array([[19595, 38470, 7471, 32768]], dtype=_F32) / _F32(65536)
#: OpenCV's remap takes coordinates below SHRT_MAX only.
_REMAP_LIMIT = 32767
#: cv2.calcHist counts in float32: exact below 2**24 pixels.
_CALCHIST_LIMIT = 1 << 24


# ----------------------------------------------------------------------------------------------
# argument checks


def _real(value: object, what: str) -> float:
    # bool is an int, which Pillow takes; tensors, strings, complex, None are left to stock.
    if not isinstance(value, numbers.Real):
        raise NotImplementedError(f"{what} of type {type(value).__name__}")
    return float(value)


def _alpha(factor: object) -> np.float32:
    """The enhance factor as the C float Pillow's blend uses; NaN and infinity (and doubles that
    overflow a float) make Pillow cast NaN to an integer, which C leaves undefined."""
    value = _real(factor, "factor")
    if -_F32_MAX <= value <= _F32_MAX:  # the common case: no overflow, no NaN (errstate is slow)
        return _F32(value)
    with np.errstate(over="ignore"):
        alpha = _F32(value)
    if not np.isfinite(alpha):
        raise NotImplementedError(f"non-finite factor {factor!r}")
    return alpha


def _extrapolates(alpha: np.float32) -> bool:
    return not 0.0 <= alpha <= 1.0


# ----------------------------------------------------------------------------------------------
# building blocks


def _lut(arr: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """``lut[arr]`` through cv2.LUT on the flattened (H, W*C) view; the result's dtype is the
    table's."""
    h = arr.shape[0]
    return cv2().LUT(arr.reshape(h, -1), lut).reshape(arr.shape)


def _blend_table(degenerate: int, alpha: np.float32) -> np.ndarray:
    """Pillow's blend of the constant ``degenerate`` with every level 0..255, as a uint8 table."""
    d = _F32(degenerate)
    t = _LEVELS_F32 - d
    t *= alpha
    t += d
    np.clip(t, 0, 255, out=t)
    return t.astype(np.uint8)


def _blend_pixels(degenerate: np.ndarray, image: np.ndarray, alpha: np.float32) -> np.ndarray:
    """Pillow's blend of two float32 images holding integer levels; overwrites ``image``."""
    np.subtract(image, degenerate, out=image)
    np.multiply(image, alpha, out=image)
    np.add(image, degenerate, out=image)
    if _extrapolates(alpha):
        np.clip(image, 0, 255, out=image)
    return image.astype(np.uint8)  # truncates, as the C cast does


def _luma(f: np.ndarray) -> np.ndarray:
    """Pillow's "L" of a float32 (H, W, 3) image of integer levels, as float32 (H, W)."""
    y = cv2().transform(f, _LUMA).reshape(f.shape[:2])
    return np.floor(y, out=y)


def _as_float(arr: np.ndarray, lut: np.ndarray | None) -> np.ndarray:
    """``arr`` (through ``lut`` when given) as float32."""
    if lut is None:
        return arr.astype(_F32)
    return _lut(arr, lut.astype(_F32))


def _kernels() -> _jitter.Kernels | None:
    """The compiled passes of :mod:`._jitter`, checked once against the numpy versions here, or
    None (then numpy and OpenCV compute)."""
    return _jitter.kernels(_passes_agree)


def jitter_report() -> dict[str, object]:
    """For ``--info``: whether ColorJitter's compiled passes are used, and where they are kept
    or why not."""
    return {"used": _kernels() is not None, "reason": _jitter.reason()}


def _passes_agree(kernels: _jitter.Kernels) -> bool:
    """The compiled passes give the numpy versions' bytes and sums on random images, with and
    without a pending table, at factors inside and outside [0, 1]."""
    rng = np.random.default_rng(11)
    tables = _hue_tables()
    for shape in ((5, 7), (33, 40), (1, 1)):
        arr = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        for table in (None, rng.integers(0, 256, 256, dtype=np.uint8)):
            through = arr if table is None else table[arr]
            if kernels.luma_sum(arr, table) != _luma_sum_numpy(through):
                return False
            for alpha in (_F32(0.0), _F32(0.6), _F32(1.4)):
                got, total = kernels.saturation(arr, alpha, table, True)
                want = _saturation_numpy(through, alpha)
                if not np.array_equal(got, want) or total != _luma_sum_numpy(want):
                    return False
            for shift in (0, 25, 231):
                got, total = kernels.hue(arr, shift, tables, table, True)
                want = _hue_numpy(through, shift)
                if not np.array_equal(got, want) or total != _luma_sum_numpy(want):
                    return False
    return True


def _luma_sum(arr: np.ndarray, lut: np.ndarray | None = None) -> int:
    """The sum of the "L" image of ``arr`` (through ``lut`` when given)."""
    kernels = _kernels() if arr.shape[2] == 3 else None
    if kernels is not None:
        return kernels.luma_sum(arr, lut)
    return _luma_sum_numpy(arr, lut)


def _luma_sum_numpy(arr: np.ndarray, lut: np.ndarray | None = None) -> int:
    if arr.shape[2] == 1:
        image = arr if lut is None else _lut(arr, lut)
        return round(cv2().sumElems(image)[0])
    return round(cv2().sumElems(_luma(_as_float(arr, lut)))[0])


def _contrast_table(
    arr: np.ndarray, alpha: np.float32, lut: np.ndarray | None = None, total: int | None = None
) -> np.ndarray:
    """The contrast table for ``arr`` (through ``lut``), whose "L" sums to ``total`` when known."""
    count = arr.shape[0] * arr.shape[1]
    if total is None:
        total = _luma_sum(arr, lut)
    # ImageStat's mean is sum / count in double precision; ImageEnhance rounds it with int(+0.5).
    mean = int(total / count + 0.5)
    return _blend_table(mean, alpha)


def _compose(first: np.ndarray | None, then: np.ndarray) -> np.ndarray:
    return then if first is None else then[first]


def _grey_to_rgb(grey: np.ndarray) -> np.ndarray:
    return cv2().cvtColor(grey, cv2().COLOR_GRAY2RGB)


# ----------------------------------------------------------------------------------------------
# ImageEnhance


def adjust_brightness(arr: np.ndarray, brightness_factor: float) -> np.ndarray:
    """``F.adjust_brightness``: a blend with black."""
    arr = checked(arr)
    return _lut(arr, _blend_table(0, _alpha(brightness_factor)))


def adjust_contrast(arr: np.ndarray, contrast_factor: float) -> np.ndarray:
    """``F.adjust_contrast``: a blend with the grey of the "L" image's rounded mean."""
    arr = checked(arr)
    return _lut(arr, _contrast_table(arr, _alpha(contrast_factor)))


def _saturation(arr: np.ndarray, alpha: np.float32, lut: np.ndarray | None = None) -> np.ndarray:
    kernels = _kernels()
    if kernels is not None:
        return kernels.saturation(arr, alpha, lut)[0]
    return _saturation_numpy(arr, alpha, lut)


def _saturation_numpy(arr: np.ndarray, alpha: np.float32, lut: np.ndarray | None = None) -> np.ndarray:
    f = _as_float(arr, lut)
    grey = _grey_to_rgb(_luma(f))
    if alpha == 0.0:
        return grey.astype(np.uint8)
    return _blend_pixels(grey, f, alpha)


def adjust_saturation(arr: np.ndarray, saturation_factor: float) -> np.ndarray:
    """``F.adjust_saturation``: a blend with the "L" image (an "L" image is returned as is)."""
    arr = checked(arr)
    alpha = _alpha(saturation_factor)
    if arr.shape[2] == 1 or alpha == 1.0:
        return arr.copy()
    return _saturation(arr, alpha)


def adjust_sharpness(arr: np.ndarray, sharpness_factor: float) -> np.ndarray:
    """``F.adjust_sharpness``: a blend with Pillow's SMOOTH filter, which leaves the outermost
    rows and columns (and images under 3x3) unfiltered."""
    arr = checked(arr)
    alpha = _alpha(sharpness_factor)
    h, w = arr.shape[:2]
    if alpha == 1.0 or h < 3 or w < 3:
        return arr.copy()
    ocv = cv2()
    f = arr.astype(_F32)
    # The kernel is 1 everywhere but 5 in the centre: the 3x3 box sum plus four times the pixel.
    # (box + 4 v) / 13 + 0.5 is never within 1/26 of an integer, so any float rounding floors
    # it the same way.
    box = ocv.boxFilter(arr, ocv.CV_32F, (3, 3), normalize=False, borderType=ocv.BORDER_REPLICATE)
    smooth = ocv.addWeighted(box.reshape(f.shape), 1 / 13, f, 4 / 13, 0.5).reshape(f.shape)
    np.floor(smooth, out=smooth)
    out = smooth.astype(np.uint8) if alpha == 0.0 else _blend_pixels(smooth, f, alpha)
    out[0] = arr[0]
    out[-1] = arr[-1]
    out[:, 0] = arr[:, 0]
    out[:, -1] = arr[:, -1]
    return out


# ----------------------------------------------------------------------------------------------
# hue


class _HueTables(NamedTuple):
    hue: np.ndarray  #: uint8 [R - G + 255, G - B + 255]: Pillow's H byte
    reciprocal: np.ndarray  #: float32 [V]: S byte = trunc(span * reciprocal[V])
    factors: np.ndarray  #: float32 [H, S, channel]: output channel = round(V * factor)


def _saturation_bytes() -> np.ndarray:
    """Pillow's S byte, [span, V] (span = max - min <= V): trunc((float)span / (float)V * 255.0)."""
    levels = np.arange(256, dtype=_F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (levels[:, None] / levels[None, :]).astype(_F64) * 255.0
    return np.trunc(np.nan_to_num(s, nan=0.0, posinf=0.0)).clip(0, 255)


@functools.cache
def _hue_tables() -> _HueTables:
    # -- RGB -> H. Only the differences matter; put B at 0 (levels may go negative, harmlessly).
    d_rg = np.arange(-255, 256)[:, None]
    d_gb = np.arange(-255, 256)[None, :]
    r, g = d_rg + d_gb, np.broadcast_to(d_gb, (511, 511))
    b = np.zeros_like(r)
    top = np.maximum(np.maximum(r, g), b)
    span = (top - np.minimum(np.minimum(r, g), b)).astype(_F32)
    safe = np.where(span == 0, _F32(1), span)
    # Distances from the top as float / float, in single precision.
    rc, gc, bc = ((top - c).astype(_F32) / safe for c in (r, g, b))
    # Red on top: float - float. Green, blue on top: double constants make it double arithmetic.
    h_red = bc - gc
    h_green = (2.0 + rc.astype(_F64) - bc).astype(_F32)
    h_blue = (4.0 + gc.astype(_F64) - rc).astype(_F32)
    h = np.where(r == top, h_red, np.where(g == top, h_green, h_blue))
    h = np.fmod(h.astype(_F64) / 6.0 + 1.0, 1.0).astype(_F32)
    hue = np.clip(np.trunc(h.astype(_F64) * 255.0), 0, 255).astype(np.uint8)
    hue[span == 0] = 0

    # -- RGB -> S, as span times a reciprocal of V: float32 255 / V, nudged by an ulp where that
    # truncates differently from Pillow's division for some span (a multiply is cheaper).
    target = _saturation_bytes()
    spans = np.arange(256, dtype=_F32)[:, None]
    used = spans <= spans.T  # span <= V
    reciprocal = _F32(255) / np.maximum(np.arange(256, dtype=_F32), _F32(1))
    for _ in range(4):
        got = np.trunc(spans * reciprocal)
        low, high = ((got < target) & used).any(axis=0), ((got > target) & used).any(axis=0)
        if not (low.any() or high.any()):
            break
        reciprocal = np.where(low, np.nextafter(reciprocal, _F32(np.inf)), reciprocal)
        reciprocal = np.where(high, np.nextafter(reciprocal, _F32(0)), reciprocal)
    else:  # pragma: no cover - IEEE float32 arithmetic is the same everywhere
        raise AssertionError("no float32 reciprocal reproduces Pillow's saturation")

    # -- HSV -> RGB. The channel getting V has factor 1, the one getting p has 1 - fs (double);
    # q is computed with the float product fs * f, t in double throughout.
    h = np.arange(256, dtype=_F32).astype(_F64)[:, None]
    sector = np.floor(h * 6.0 / 255.0)
    frac = (h * 6.0 / 255.0 - sector).astype(_F32)
    fs = (np.arange(256, dtype=_F32).astype(_F64) / 255.0).astype(_F32)[None, :]
    ones = np.ones((256, 256))
    y_p = np.broadcast_to(1.0 - fs.astype(_F64), (256, 256))
    y_q = 1.0 - (fs * frac).astype(_F64)
    y_t = 1.0 - fs.astype(_F64) * (1.0 - frac.astype(_F64))
    layouts = ((ones, y_t, y_p), (y_q, ones, y_p), (y_p, ones, y_t), (y_p, y_q, ones), (y_t, y_p, ones))
    layouts += ((ones, y_p, y_q),)
    sector = sector[:, 0].astype(int) % 6
    factors = np.empty((256, 256, 3), dtype=_F64)
    for i, layout in enumerate(layouts):
        rows = sector == i
        for c in range(3):
            factors[rows, :, c] = layout[c][rows]
    # floor(V * factor + 0.5) in float32 matches Pillow's round() in double for every (H, S, V).
    return _HueTables(hue, reciprocal, factors.astype(_F32))


def _hsv(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pillow's HSV bytes of an RGB image: H and V as uint8 (H, W), S as float32 (H, W)."""
    ocv = cv2()
    tables = _hue_tables()
    h, w = arr.shape[:2]
    r, g, b = ocv.split(arr)
    # Coordinates into the hue table, exact small integers in float32.
    col = ocv.addWeighted(g, 1, b, -1, 255, dtype=ocv.CV_32F).reshape(h, w)
    row = ocv.addWeighted(r, 1, g, -1, 255, dtype=ocv.CV_32F).reshape(h, w)
    hue = ocv.remap(tables.hue, col, row, ocv.INTER_NEAREST).reshape(h, w)
    top = ocv.max(ocv.max(r, g), b)
    s = ocv.subtract(top, ocv.min(ocv.min(r, g), b)).astype(_F32)
    s *= ocv.LUT(top, tables.reciprocal).reshape(h, w)
    return hue, np.trunc(s, out=s), top


def _hsv_to_rgb(hue: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pillow's HSV -> RGB of H, V (uint8) and S (float32) planes."""
    ocv = cv2()
    h, w = hue.shape
    y = ocv.remap(_hue_tables().factors, s, hue.astype(_F32), ocv.INTER_NEAREST).reshape(h, w, 3)
    y *= _grey_to_rgb(v.astype(_F32)).reshape(h, w, 3)
    y += _F32(0.5)
    return y.astype(np.uint8)


def _hue(arr: np.ndarray, shift: int) -> np.ndarray:
    kernels = _kernels()
    if kernels is not None:
        return kernels.hue(arr, shift, _hue_tables())[0]
    if max(arr.shape[:2]) >= _REMAP_LIMIT:
        raise NotImplementedError("image too large for cv2.remap")
    return _hue_numpy(arr, shift)


def _hue_numpy(arr: np.ndarray, shift: int) -> np.ndarray:
    hue, s, v = _hsv(arr)
    hue += np.uint8(shift)  # wraps around, as stock's uint8 addition
    return _hsv_to_rgb(hue, s, v)


def _hue_shift(hue_factor: object) -> int:
    if not isinstance(hue_factor, numbers.Real):
        raise NotImplementedError(f"hue_factor of type {type(hue_factor).__name__}")
    if not (-0.5 <= hue_factor <= 0.5):
        raise ValueError(f"hue_factor ({hue_factor}) is not in [-0.5, 0.5].")
    # Stock: np.int32(hue_factor * 255).astype(np.uint8), truncation then wrap-around.
    return int(hue_factor * 255) % 256


def adjust_hue(arr: np.ndarray, hue_factor: float) -> np.ndarray:
    """``F.adjust_hue``: through Pillow's HSV, shifting H with uint8 wrap-around ("L" images
    are returned as they are)."""
    shift = _hue_shift(hue_factor)
    arr = checked(arr)
    if arr.shape[2] == 1:
        return arr.copy()
    return _hue(arr, shift)


# ----------------------------------------------------------------------------------------------
# grayscale and ImageOps


def rgb_to_grayscale(arr: np.ndarray, num_output_channels: int = 1) -> np.ndarray:
    """``F.rgb_to_grayscale`` (Pillow's "L" conversion); (H, W, 1) or, for 3, (H, W, 3)."""
    arr = checked(arr)
    if num_output_channels != 1 and num_output_channels != 3:
        raise ValueError("num_output_channels should be either 1 or 3")
    h, w, c = arr.shape
    if c == 1:
        grey = arr.reshape(h, w)
    else:
        y = cv2().transform(arr.astype(_F32), _LUMA).reshape(h, w)
        grey = y.astype(np.uint8)  # truncation is the >> 16
    if num_output_channels == 1:
        return grey.reshape(h, w, 1).copy() if c == 1 else grey.reshape(h, w, 1)
    return _grey_to_rgb(grey).reshape(h, w, 3)


def invert(arr: np.ndarray) -> np.ndarray:
    """``F.invert``: 255 - v."""
    return np.invert(checked(arr))


def posterize(arr: np.ndarray, bits: int) -> np.ndarray:
    """``F.posterize``: keep the top ``bits`` bits (1..8; stock refuses 0 and others)."""
    arr = checked(arr)
    if not isinstance(bits, numbers.Integral):
        raise NotImplementedError(f"bits of type {type(bits).__name__}")
    if not (0 <= bits <= 8):
        raise ValueError(f"The number if bits should be between 0 and 8. Got {bits}")
    if not 1 <= bits <= 8:
        raise ValueError("bits must be between or equal to 1 and 8")
    return np.bitwise_and(arr, np.uint8(~(2 ** (8 - int(bits)) - 1) & 0xFF))


def solarize(arr: np.ndarray, threshold: float) -> np.ndarray:
    """``F.solarize``: levels ``>= threshold`` (more exactly, not ``< threshold``) inverted."""
    arr = checked(arr)
    if not isinstance(threshold, numbers.Real):
        raise NotImplementedError(f"threshold of type {type(threshold).__name__}")
    # ImageOps keeps the levels that compare below the threshold (none when it is NaN).
    if threshold != threshold or threshold <= 0:
        return np.invert(arr)
    if threshold > 255:
        return arr.copy()
    ocv = cv2()
    flat = arr.reshape(arr.shape[0], -1)
    # 255 - v is v ^ 255: XOR with a 0/255 mask of the levels above ceil(threshold) - 1.
    mask = ocv.threshold(flat, math.ceil(threshold) - 1, 255, ocv.THRESH_BINARY)[1]
    return np.bitwise_xor(flat, mask.reshape(flat.shape)).reshape(arr.shape)


def _planes(arr: np.ndarray) -> list[np.ndarray]:
    h, w, c = arr.shape
    return [arr.reshape(h, w)] if c == 1 else list(cv2().split(arr))


def _histogram(plane: np.ndarray) -> np.ndarray:
    """256-bin int64 histogram of a uint8 (H, W) plane."""
    if plane.size >= _CALCHIST_LIMIT:
        return np.bincount(plane.ravel(), minlength=256)
    return cv2().calcHist([plane], [0], None, [256], [0, 256]).reshape(256).astype(np.int64)


def _planes_lut(arr: np.ndarray, planes: list[np.ndarray], tables: list[np.ndarray | None]) -> np.ndarray:
    """Each plane through its table (None: unchanged), merged back into an (H, W, C) array."""
    if all(t is None for t in tables):
        return arr.copy()
    ocv = cv2()
    if len(planes) == 1:
        return _lut(arr, tables[0])
    return ocv.merge([p if t is None else ocv.LUT(p, t) for p, t in zip(planes, tables, strict=True)])


def autocontrast(arr: np.ndarray) -> np.ndarray:
    """``F.autocontrast``: per channel, stretch [min, max] to [0, 255] (ImageOps, no cutoff)."""
    arr = checked(arr)
    planes = _planes(arr)
    tables: list[np.ndarray | None] = []
    for plane in planes:
        lo, hi = (int(x) for x in cv2().minMaxLoc(plane)[:2])
        if hi <= lo:
            tables.append(None)
            continue
        scale = 255.0 / (hi - lo)
        offset = -lo * scale
        # ix * scale + offset in double, two roundings as in Python; int() truncates.
        levels = np.arange(256, dtype=_F64) * scale
        levels += offset
        tables.append(np.clip(np.trunc(levels), 0, 255).astype(np.uint8))
    return _planes_lut(arr, planes, tables)


def equalize(arr: np.ndarray) -> np.ndarray:
    """``F.equalize``: ImageOps' per-channel histogram equalisation."""
    arr = checked(arr)
    planes = _planes(arr)
    tables: list[np.ndarray | None] = []
    for plane in planes:
        hist = _histogram(plane)
        used = hist[hist != 0]
        step = (int(used.sum()) - int(used[-1])) // 255 if len(used) > 1 else 0
        if not step:
            tables.append(None)
            continue
        # Level i maps to (step // 2 + pixels below i) // step, clipped by Image.point.
        below = np.concatenate(([0], np.cumsum(hist)[:-1]))
        tables.append(np.clip((step // 2 + below) // step, 0, 255).astype(np.uint8))
    return _planes_lut(arr, planes, tables)


# ----------------------------------------------------------------------------------------------
# ColorJitter


def _jitter_steps(
    order: Iterable[int],
    brightness: float | None,
    contrast: float | None,
    saturation: float | None,
    hue: float | None,
    rgb: bool,
) -> list[tuple[int, object]]:
    """ColorJitter's steps as (index, alpha or hue shift), in ``order``, leaving out those that
    change nothing: a factor of None, saturation and hue on "L" images, saturation 1."""
    steps: list[tuple[int, object]] = []
    for fn_id in order:  # compared as ColorJitter.forward compares them (a tensor's items too)
        if fn_id == 0 and brightness is not None:
            steps.append((0, _alpha(brightness)))
        elif fn_id == 1 and contrast is not None:
            steps.append((1, _alpha(contrast)))
        elif fn_id == 2 and saturation is not None:
            steps.append((2, _alpha(saturation)))
        elif fn_id == 3 and hue is not None:
            steps.append((3, _hue_shift(hue)))
    return [(fn, value) for fn, value in steps if fn < 2 or (rgb and not (fn == 2 and value == 1.0))]


def color_jitter(
    arr: np.ndarray,
    order: Iterable[int],
    brightness: float | None,
    contrast: float | None,
    saturation: float | None,
    hue: float | None,
) -> np.ndarray:
    """ColorJitter's body: for each index in ``order`` (0 brightness, 1 contrast, 2 saturation,
    3 hue, as ``fn_idx``), the adjustment whose factor is not None, giving exactly what the
    functions above (and stock) give in sequence.

    Brightness and contrast are lookup tables: consecutive ones fold into one table, applied
    once at the end or when saturation or hue needs the pixels. Contrast needs the mean "L" of
    the image it lands on, which it reads through the pending table without applying it;
    saturation and hue read their input the same way. Where :mod:`._jitter`'s compiled passes
    load, saturation and hue are one pass each (which also sums "L" for a contrast right after
    it), else numpy's and OpenCV's calls."""
    arr = checked(arr)
    rgb = arr.shape[2] == 3
    steps = _jitter_steps(order, brightness, contrast, saturation, hue, rgb)
    kernels = _kernels() if rgb else None
    if kernels is None and any(fn == 3 for fn, _ in steps) and max(arr.shape[:2]) >= _REMAP_LIMIT:
        raise NotImplementedError("image too large for cv2.remap")

    image = arr  # never written to
    pending: np.ndarray | None = None  # lookup table not yet applied to ``image``
    total: int | None = None  # the "L" sum of ``image`` (when no table is pending), where known
    for i, (fn, value) in enumerate(steps):
        if fn == 0:
            pending = _compose(pending, _blend_table(0, value))
        elif fn == 1:
            known = total if pending is None else None
            pending = _compose(pending, _contrast_table(image, value, pending, known))
        elif kernels is not None:
            # one compiled pass through the pending table, summing "L" for a contrast right after
            want = i + 1 < len(steps) and steps[i + 1][0] == 1
            if fn == 2:
                image, total = kernels.saturation(image, value, pending, want)
            else:
                image, total = kernels.hue(image, value, _hue_tables(), pending, want)
            pending, total = None, total if want else None
        elif fn == 2:
            image, pending = _saturation_numpy(image, value, pending), None
        else:
            if pending is not None:
                image, pending = _lut(image, pending), None
            image = _hue_numpy(image, value)
    if pending is not None:
        return _lut(image, pending)
    return image.copy() if image is arr else image
