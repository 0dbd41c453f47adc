"""``transforms.v2``'s ColorJitter on uint8 image tensors, with v2's values, faster.

torchvision's docs advise decoding to uint8 (C, H, W) tensors and running ``transforms.v2`` on
them. There v2's colour ops compute in float32 over the whole image: brightness and contrast a
blend and a truncation back to uint8, hue a float port of Pillow's HSV conversion, both ways
(about 2 ms for a 224x224 image on one core, ten times its brightness). Here:

* brightness: v2's own kernel run once on the 256 levels gives a table (the op is elementwise,
  so each level gets the very bits it gets in the image), applied by ``cv2.LUT``;
* contrast: the grey mean by v2's own ops, then v2's own blend with that mean run on the 256
  levels as a table, the same way;
* saturation: v2's own kernel (a per-pixel blend with the grey image: no table to gain);
* hue: OpenCV's float32 HSV conversions, both ways, on the pixels in [0, 1]: the formulas v2
  ports from Pillow, in another order of float operations, so a value that lands within ~1e-4
  of a level's edge can truncate to the next level. Within one level of v2 on every colour
  (tests/vision/test_tensor_color.py checks all 2**24 for several factors), and checked again
  on this machine's OpenCV before first use (:func:`hue_usable`); else v2's own kernel runs.

The image may be a CHW tensor, ``torchvision.io.decode_jpeg``'s channels-last one, or a crop
of either; each result is laid out as v2's is (the tables' in the input's dimension order, as
``empty_like`` allocates for v2's elementwise ops; hue's contiguous, as v2 stacks its planes).
Anything else (another dtype or channel count, a batch, a tensor that needs grad, a device other
than the CPU) gets v2's own kernels: :func:`accepts` says which inputs are taken.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from . import _chw
from ._opencv import cv2

#: v2's float -> uint8 scale (``to_dtype_image``: 255 + 1 - eps, eps = 1e-3, then truncation)
_TO_UINT8 = np.float32(255.0 + 1.0 - 1e-3)
_FROM_UINT8 = np.float32(1.0 / 255)


def accepts(image: object) -> bool:
    """A uint8 RGB image tensor (plain or ``tv_tensors.Image``) of shape (3, H, W) on the CPU,
    with pixels and no grad, whose rows are contiguous, planar or interleaved (a CHW tensor,
    ``decode_jpeg``'s channels-last one, or a crop of either): what these kernels read."""
    return (
        isinstance(image, torch.Tensor)
        and image.dtype == torch.uint8
        and image.ndim == 3
        and image.shape[0] == 3
        and image.numel() > 0
        and image.device.type == "cpu"
        and not image.requires_grad
        and (planar_rows(image) or interleaved_rows(image))
    )


def planar_rows(image: torch.Tensor) -> bool:
    """(3, H, W) memory as three planes whose rows are contiguous (a CHW tensor, or a crop of one)."""
    return (
        image.stride(2) == 1
        and image.stride(1) >= image.shape[2]
        and image.stride(0) >= image.shape[1] * image.stride(1)
    )


def interleaved_rows(image: torch.Tensor) -> bool:
    """(3, H, W) memory as HWC rows of interleaved pixels (a channels-last tensor, as
    ``torchvision.io.decode_jpeg`` returns, or a crop of one)."""
    return image.stride(0) == 1 and image.stride(2) == 3 and image.stride(1) >= 3 * image.shape[2]


def _v2():
    from torchvision.transforms.v2 import functional as F2

    return F2


def _levels() -> torch.Tensor:
    """The 256 uint8 levels as a one-channel image (1, 1, 256)."""
    return torch.arange(256, dtype=torch.uint8).reshape(1, 1, 256)


def lookup(image: torch.Tensor, table: np.ndarray, out: torch.Tensor) -> bool:
    """Write ``table[c][image[c]]`` into ``out`` (same shape; ``table`` is (3, 256) of ``out``'s
    dtype) for an image :func:`accepts` takes: one interleaved ``cv2.LUT`` when both are
    channels-last, a LUT per plane into a contiguous ``out`` (planes split from interleaved
    memory first). False, writing nothing, for another pair of layouts."""
    if interleaved_rows(image) and out.stride(0) == 1 and out.permute(1, 2, 0).is_contiguous():
        hwc = np.ascontiguousarray(table.T).reshape(1, 256, 3)
        cv2().LUT(image.permute(1, 2, 0).numpy(), hwc, dst=out.permute(1, 2, 0).numpy())
    elif out.is_contiguous():
        if not planar_rows(image) and _chw.lookup_into(image.permute(1, 2, 0).numpy(), table, out.numpy()):
            return True  # interleaved pixels to planes in one compiled pass
        planes = image.numpy() if planar_rows(image) else cv2().split(image.permute(1, 2, 0).numpy())
        out_planes = out.numpy()
        for c in range(3):
            cv2().LUT(planes[c], table[c], dst=out_planes[c])
    else:
        return False
    return True


def _apply_table(image: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[image]`` for a uint8 (256,) table, as a new uint8 tensor laid out as v2's
    elementwise ops lay theirs out (``empty_like``: the input's dimension order, dense)."""
    out = torch.empty_like(image)
    if not lookup(image, np.repeat(table.numpy().reshape(1, 256), 3, axis=0), out):  # pragma: no cover
        raise NotImplementedError(f"a uint8 image with strides {image.stride()}")  # empty_like is dense
    return out


def _hwc(image: torch.Tensor) -> np.ndarray:
    """The pixels as an (H, W, 3) uint8 array: a view of interleaved memory, planes merged."""
    if interleaved_rows(image):
        return image.permute(1, 2, 0).numpy()
    planes = image.numpy()
    return cv2().merge([planes[0], planes[1], planes[2]])


def adjust_brightness(image: torch.Tensor, factor: float) -> torch.Tensor:
    """v2's ``adjust_brightness`` (its own kernel on the levels, as a table)."""
    return _apply_table(image, _v2().adjust_brightness_image(_levels(), brightness_factor=factor).reshape(256))


def adjust_contrast(image: torch.Tensor, factor: float) -> torch.Tensor:
    """v2's ``adjust_contrast``: its grey mean, then its blend with that mean as a table."""
    from torchvision.transforms.v2.functional import _color as F2_color

    if factor < 0:
        raise ValueError(f"contrast_factor ({factor}) is not non-negative.")
    grey = F2_color._rgb_to_grayscale_image(image, num_output_channels=1, preserve_dtype=False).floor_()
    mean = torch.mean(grey, dim=(-3, -2, -1), keepdim=True)
    return _apply_table(image, F2_color._blend(_levels(), mean, factor).reshape(256))


def _hue_kernel(image: torch.Tensor, factor: float) -> torch.Tensor:
    ocv = cv2()
    rgb = _hwc(image).astype(np.float32)
    rgb *= _FROM_UINT8
    hsv = ocv.cvtColor(rgb, ocv.COLOR_RGB2HSV)  # H in degrees [0, 360), S and V in [0, 1]
    shift = float(factor) * 360.0
    # OpenCV wraps a hue in [360, 720) into [0, 360), not a negative one: shift forwards
    ocv.add(hsv, (shift + 360.0 if shift < 0 else shift, 0.0, 0.0, 0.0), dst=hsv)
    rgb = ocv.cvtColor(hsv, ocv.COLOR_HSV2RGB)
    rgb *= _TO_UINT8
    out = torch.empty(image.shape, dtype=torch.uint8)  # v2's hue ends in stacked planes: contiguous
    ocv.split(rgb.astype(np.uint8), list(out.numpy()))
    return out


@functools.cache
def hue_usable() -> bool:
    """Whether :func:`_hue_kernel` is within one level of v2's ``adjust_hue`` on this OpenCV,
    checked on a spread of colours (greys, primaries, noise) for factors of both signs and the
    bounds, before it is relied on."""
    F2 = _v2()
    rng = np.random.default_rng(23)
    levels = np.arange(0, 256, 17, dtype=np.uint8)  # 16 levels: 4096 colours, 0 and 255 among them
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij")).reshape(3, -1)
    noise = rng.integers(0, 256, (3, 4096), dtype=np.uint8)
    image = torch.from_numpy(np.ascontiguousarray(np.concatenate([grid, noise], axis=1).reshape(3, -1, 64)))
    try:
        for factor in (-0.5, -0.3, -0.01, -1e-9, 0.0, 0.05, 0.37, 0.5):
            got = _hue_kernel(image, factor)
            if (got.int() - F2.adjust_hue_image(image, hue_factor=factor).int()).abs().max().item() > 1:
                return False
    except Exception:  # an OpenCV without these conversions: v2's kernel then
        return False
    return True


def adjust_hue(image: torch.Tensor, factor: float) -> torch.Tensor | None:
    """v2's ``adjust_hue`` within one level, or None where v2's own kernel must run."""
    if not (-0.5 <= factor <= 0.5):
        raise ValueError(f"hue_factor ({factor}) is not in [-0.5, 0.5].")
    if not hue_usable():
        return None
    return _hue_kernel(image, factor)


def color_jitter(image: torch.Tensor, order, brightness, contrast, saturation, hue) -> torch.Tensor:
    """ColorJitter's body on an image :func:`accepts` takes: for each index in ``order`` (0
    brightness, 1 contrast, 2 saturation, 3 hue, as v2's ``fn_idx``) the adjustment whose factor
    is not None, in v2's order; none applying hands the input back itself, as v2 does."""
    F2 = _v2()
    out = image
    for fn_id in order:  # compared as v2's ColorJitter.transform compares them (a tensor's items)
        if fn_id == 0 and brightness is not None:
            out = adjust_brightness(out, brightness)
        elif fn_id == 1 and contrast is not None:
            out = adjust_contrast(out, contrast)
        elif fn_id == 2 and saturation is not None:
            out = F2.adjust_saturation_image(out, saturation_factor=saturation)
        elif fn_id == 3 and hue is not None:
            adjusted = adjust_hue(out, hue)
            out = F2.adjust_hue_image(out, hue_factor=hue) if adjusted is None else adjusted
    return out
