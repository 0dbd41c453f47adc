"""``transforms.v2``'s resized crop of a uint8 image tensor, with v2's values, faster.

v2's ``RandomResizedCrop`` hands torch's antialiased bilinear uint8 kernel a view of the box.
The kernel is fastest on channels-last (interleaved) memory, but a box of ``decode_jpeg``'s
channels-last image is not dense and a box of a planar image is planar, so torch repacks it on
the way in and out (on a 2-core AMD EPYC Zen 4, a 250x270 box of ``decode_jpeg``'s image to
224x224: 185 us; its dense interleaved copy: 125 us, copy included). Here the box is copied
into dense interleaved memory first and resized by the very same kernel: the same values, in
interleaved memory. Only a caller that gives the result stock's layout afterwards (the fused
conversion to float of ``transforms_v2``) may use it; :func:`stock_interleaved` says which
layout stock's resize returns.

Checked on this machine before first use (:func:`usable`): the kernel gives stock's values from
the copy for boxes of both layouts, and stock lays its result out as :func:`stock_interleaved`
says; else stock's own steps run. (Where v2 computes a uint8 resize in float, as torchvision 0.23
does on a CPU whose capability reads "AVX512", the check fails and v2's steps run.)
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ._opencv import cv2
from ._tensor_color import interleaved_rows


def dense_image(image: torch.Tensor) -> bool:
    """A (3, H, W) uint8 tensor in dense memory: planar (a CHW tensor) or interleaved
    (``decode_jpeg``'s and TorchCodec's channels-last image): the layouts whose boxes
    :func:`stock_interleaved` knows stock's result layout for."""
    return image.is_contiguous() or (interleaved_rows(image) and image.stride(1) == 3 * image.shape[2])


def stock_interleaved(image: torch.Tensor, top: int, left: int, height: int, width: int) -> bool:
    """Whether v2's resize of this box of the :func:`dense_image` ``image`` returns interleaved
    memory: where the box is dense channels-last memory (v2 restrides it so that torch keeps that
    layout), else torch returns a planar (contiguous) image."""
    box = image[:, top : top + height, left : left + width]
    return box.unsqueeze(0).is_contiguous(memory_format=torch.channels_last)


def _interleaved_box(image: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    """The box's pixels copied into a dense channels-last (1, 3, h, w) tensor (its batch stride
    the whole image's, or torch would not take it for channels-last)."""
    box = torch.empty((1, 3, height, width), dtype=torch.uint8, memory_format=torch.channels_last)
    if interleaved_rows(image):
        box[0].copy_(image[:, top : top + height, left : left + width])
    else:
        planes = image.numpy()[:, top : top + height, left : left + width]
        cv2().merge([planes[0], planes[1], planes[2]], dst=box[0].permute(1, 2, 0).numpy())
    return box


def resized_crop(image: torch.Tensor, top: int, left: int, height: int, width: int, size) -> torch.Tensor:
    """v2's ``resized_crop_image`` (bilinear, antialiased) of a box inside the :func:`dense_image`
    ``image``: its values, as a (3, h, w) tensor in interleaved memory."""
    import torch.nn.functional as tf

    box = _interleaved_box(image, top, left, height, width)
    out = tf.interpolate(box, size=[int(size[0]), int(size[1])], mode="bilinear", align_corners=False, antialias=True)
    return out[0]


@functools.cache
def usable() -> bool:
    """Whether :func:`resized_crop` gives v2's values here, and :func:`stock_interleaved` its
    layout, checked on noise images of both layouts for boxes that are the whole image, whole
    rows, whole columns and inside, shrinking and enlarging."""
    from torchvision.transforms.v2 import functional as F2

    rng = np.random.default_rng(29)
    try:
        hwc = torch.from_numpy(rng.integers(0, 256, (61, 83, 3), dtype=np.uint8))
        for image in (hwc.permute(2, 0, 1), hwc.permute(2, 0, 1).contiguous()):
            for box in ((0, 0, 61, 83), (5, 0, 40, 83), (0, 7, 61, 50), (9, 11, 37, 45), (2, 3, 1, 60)):
                for size in ((24, 24), (70, 90), (37, 20)):
                    stock = F2.resized_crop(image, *box, list(size), antialias=True)
                    mine = resized_crop(image, *box, size)
                    if not torch.equal(stock, mine) or interleaved_rows(stock) != stock_interleaved(image, *box):
                        return False
                    if not stock_interleaved(image, *box) and not stock.is_contiguous():
                        return False
    except Exception:  # a torch without this kernel for uint8: stock's steps then
        return False
    return True
