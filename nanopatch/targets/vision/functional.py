"""Pixel kernels on HWC uint8 ndarrays: torchvision's functional ops with stock's pixels.

The front of the kernels, which live in ``_geometry`` (resize, crops, flips, blur, pad),
``_color`` (colour ops, ColorJitter's fused body) and ``_pixels`` (conversions, to tensor).
Every kernel takes ``arr``, a 3-D ``uint8`` array of shape (H, W, C) with C == 1 (what a PIL
"L" image holds) or C == 3 ("RGB"), never writes to it, and returns what
``torchvision.transforms.functional`` returns on the same pixels as a PIL image (the path stock
torchvision takes for ImageFolder-style data), bit-exact unless its module says otherwise. A
kernel raises ``NotImplementedError`` for an input it cannot reproduce; callers then run stock
torchvision on a PIL image instead.
"""

from __future__ import annotations

from ._color import (
    adjust_brightness,
    adjust_contrast,
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
from ._geometry import (
    BICUBIC,
    BILINEAR,
    NEAREST,
    center_crop,
    crop,
    gaussian_blur,
    hflip,
    is_pil_filter,
    pad,
    resize,
    resize_crop,
    resized_crop,
    vflip,
)
from ._pixels import from_pil, lookup, pil_to_tensor, to_pil, to_tensor, to_tensor_normalize

__all__ = [
    "BICUBIC",
    "BILINEAR",
    "NEAREST",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "adjust_sharpness",
    "autocontrast",
    "center_crop",
    "color_jitter",
    "crop",
    "equalize",
    "from_pil",
    "gaussian_blur",
    "hflip",
    "invert",
    "is_pil_filter",
    "lookup",
    "pad",
    "pil_to_tensor",
    "posterize",
    "resize",
    "resize_crop",
    "resized_crop",
    "rgb_to_grayscale",
    "solarize",
    "to_pil",
    "to_tensor",
    "to_tensor_normalize",
    "vflip",
]
