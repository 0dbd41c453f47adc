"""Drop-in ``torchvision.transforms.v2`` classes for the PIL path.

v2 transforms run on tensors, ``tv_tensors`` and PIL images. On a uint8 tensor v2 is already
fast (torch kernels), so those inputs, and every call with several inputs (an image with its
boxes or masks), run stock's code unchanged. What nanopatch takes over is the common
``ImageFolder`` case: a single PIL image (or the undecoded file a dataset hands a nanopatch
pipeline), which stock v2 processes with Pillow until ``ToImage``. Parameters come from the
class's own ``make_params`` (the same ``torch`` draws as stock), pixels from the same kernels
as the v1 classes, and ``ToImage``/``PILToTensor`` + ``ToDtype(float32, scale=True)`` [+
``Normalize``] fuse into one table lookup whose table is computed by stock's own functional
ops, so the values are bit-identical and the result is the same type (``tv_tensors.Image``)
with the same memory layout.

Rotations, affine warps and the auto-augment policies' geometric ops run stock's own v2 code
on a PIL image (Pillow's warps beat an exact ndarray version, see ``transforms._pillow``); the
policies' colour ops run nanopatch's exact kernels. AugMix (which works on tensors inside)
and Lambda stay stock.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import PIL.Image
import torch
import torchvision.transforms.v2 as _v2
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F2
from torchvision.transforms.v2._auto_augment import _AutoAugmentBase
from torchvision.transforms.v2._utils import _get_fill
from torchvision.transforms.v2.functional import _geometry as _F2_geometry

from . import functional as fn
from ._pixels import Pixels
from .datasets import ACCEPTS_ENCODED
from .transforms import (
    FusedToFloat,
    Planned,
    bind_stock,
    finish,
    jitter_pixels,
    on_array,
    resize_pixels,
    resized_crop_pixels,
    run_step,
    run_steps,
    stock_class,
    warn_antialias_ignored,
)

__all__ = [
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "GaussianBlur",
    "Grayscale",
    "Normalize",
    "PILToTensor",
    "Pad",
    "RandAugment",
    "RandomAffine",
    "RandomApply",
    "RandomChoice",
    "RandomCrop",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomOrder",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomVerticalFlip",
    "Resize",
    "ToDtype",
    "ToImage",
    "TrivialAugmentWide",
]


def _accept(img) -> Pixels | None:
    """Pixels for a lone PIL-path input; None (stock runs) for tensors, ndarrays and the rest."""
    if isinstance(img, np.ndarray):
        return None  # v2 passes ndarrays through (or, in ToImage, converts them): stock
    return Pixels.accept(img)


class _FastV2:
    """Mixin: a single PIL-path input runs nanopatch's ``_nanopatch_run``; anything else, stock."""

    _nanopatch_stock: type

    def forward(self, *inputs: Any) -> Any:
        if len(inputs) == 1:
            px = _accept(inputs[0])
            if px is not None:
                return finish(self._nanopatch_run(px))
        return self._stock_call(*inputs)

    def _nanopatch_run(self, px: Pixels) -> Any:  # pragma: no cover - every class overrides it
        raise NotImplementedError

    def _stock_call(self, *inputs: Any) -> Any:
        """Stock's own forward."""
        return self._nanopatch_stock.forward(self, *inputs)


setattr(_FastV2, ACCEPTS_ENCODED, True)


def _entry(cls):
    bind_stock(cls)
    return cls


def _random_apply(transform) -> bool:
    """``_RandomApplyTransform``'s coin: the same ``torch.rand(1)`` draw as stock."""
    return not bool(torch.rand(1) >= transform.p)


@_entry
class Resize(_FastV2, stock_class(_v2, "Resize")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        out = _F2_geometry._compute_resized_output_size((height, width), size=self.size, max_size=self.max_size)
        if (out[0], out[1]) != (height, width):
            resized = resize_pixels(px, out, _F2_geometry._check_interpolation(self.interpolation))
            if resized is None:  # stock's pixels, errors and warnings
                return px.with_pil(self._stock_call(px.output()))
            px = resized
        if self.antialias is False:  # v2 warns for PIL input even when the size is unchanged
            warn_antialias_ignored()
        return px


@_entry
class CenterCrop(_FastV2, stock_class(_v2, "CenterCrop")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return px.with_array(fn.center_crop(px.array(), self.size))


@_entry
class RandomResizedCrop(_FastV2, stock_class(_v2, "RandomResizedCrop")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        params = self.make_params([px.proxy()])
        if self.antialias is False:
            warn_antialias_ignored()
        interpolation = _F2_geometry._check_interpolation(self.interpolation)
        box = params["top"], params["left"], params["height"], params["width"]
        return resized_crop_pixels(px, *box, self.size, interpolation)


@_entry
class RandomHorizontalFlip(_FastV2, stock_class(_v2, "RandomHorizontalFlip")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return px.with_array(fn.hflip(px.array())) if _random_apply(self) else px


@_entry
class RandomVerticalFlip(_FastV2, stock_class(_v2, "RandomVerticalFlip")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return px.with_array(fn.vflip(px.array())) if _random_apply(self) else px


def _pad(px: Pixels, transform, padding) -> Pixels:
    fill = _get_fill(transform._fill, PIL.Image.Image)
    return on_array(px, fn.pad, F2.pad, padding=padding, fill=fill, padding_mode=transform.padding_mode)


@_entry
class Pad(_FastV2, stock_class(_v2, "Pad")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _pad(px, self, self.padding)


@_entry
class RandomCrop(_FastV2, stock_class(_v2, "RandomCrop")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        params = self.make_params([px.proxy()])
        if params["needs_pad"]:
            px = _pad(px, self, params["padding"])
        if params["needs_crop"]:
            box = params["top"], params["left"], params["height"], params["width"]
            px = px.with_array(fn.crop(px.array(), *box))
        return px


def _with_stock_transform(px: Pixels, transform, params: dict[str, Any]) -> Pixels:
    """Stock's own ``transform(image, params)`` on the PIL image stock would hold here: the same
    Pillow warp, with the fill stock looks up for that image's type."""
    return px.with_pil(transform.transform(px.pil(), params))


@_entry
class RandomRotation(_FastV2, stock_class(_v2, "RandomRotation")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _with_stock_transform(px, self, self.make_params([px.proxy()]))


@_entry
class RandomAffine(_FastV2, stock_class(_v2, "RandomAffine")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _with_stock_transform(px, self, self.make_params([px.proxy()]))


@_entry
class GaussianBlur(_FastV2, stock_class(_v2, "GaussianBlur")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        sigma = self.make_params([px.proxy()])["sigma"]
        return on_array(px, fn.gaussian_blur, F2.gaussian_blur, self.kernel_size, sigma)


@_entry
class RandomApply(_FastV2, stock_class(_v2, "RandomApply")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.rand(1) >= self.p:
            return px
        return run_steps(self.transforms, px)


@_entry
class RandomChoice(_FastV2, stock_class(_v2, "RandomChoice")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        idx = int(torch.multinomial(torch.tensor(self.p), 1))
        return run_step(self.transforms[idx], px)


@_entry
class RandomOrder(_FastV2, stock_class(_v2, "RandomOrder")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return run_steps([self.transforms[i] for i in torch.randperm(len(self.transforms))], px)


@_entry
class ColorJitter(_FastV2, stock_class(_v2, "ColorJitter")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        params = self.make_params([px.proxy()])
        factors = [params[k] for k in ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")]
        return jitter_pixels(px, params["fn_idx"], factors)


def _grayscale(px: Pixels, channels: int) -> Pixels:
    return on_array(px, fn.rgb_to_grayscale, F2.rgb_to_grayscale, num_output_channels=channels)


@_entry
class Grayscale(_FastV2, stock_class(_v2, "Grayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _grayscale(px, self.num_output_channels)


@_entry
class RandomGrayscale(_FastV2, stock_class(_v2, "RandomGrayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        if not _random_apply(self):
            return px
        return _grayscale(px, self.make_params([px.proxy()])["num_input_channels"])


@_entry
class ToImage(_FastV2, stock_class(_v2, "ToImage")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return tv_tensors.Image(fn.pil_to_tensor(px.array()))


@_entry
class PILToTensor(_FastV2, stock_class(_v2, "PILToTensor")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return fn.pil_to_tensor(px.array())


@_entry
class ToDtype(_FastV2, stock_class(_v2, "ToDtype")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return self._stock_call(px.output())  # ToDtype passes PIL images through: stock


@_entry
class Normalize(_FastV2, stock_class(_v2, "Normalize")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return self._stock_call(px.output())  # Normalize refuses PIL images: stock's error


@_entry
class Compose(Planned, _FastV2, stock_class(_v2, "Compose")):
    def _fuse(self, steps: list[Any], i: int) -> tuple[Any, int] | None:
        if (
            isinstance(steps[i], (ToImage, PILToTensor))
            and i + 1 < len(steps)
            and isinstance(steps[i + 1], ToDtype)
            and steps[i + 1].dtype is torch.float32
            and steps[i + 1].scale
        ):
            length = 3 if i + 2 < len(steps) and isinstance(steps[i + 2], Normalize) else 2
            return FusedToFloat(steps[i : i + length]), length
        return None


# --- auto-augment policies -----------------------------------------------------------------

#: the policies' colour ops on nanopatch's kernels: op -> (kernel, its arguments from the
#: magnitude). Equalize is not here: Pillow's beats the kernel (540 vs 620 us on 500x375 RGB).
_AUGMENT_KERNELS = {
    "Brightness": (fn.adjust_brightness, lambda m: (1.0 + m,)),
    "Color": (fn.adjust_saturation, lambda m: (1.0 + m,)),
    "Contrast": (fn.adjust_contrast, lambda m: (1.0 + m,)),
    "Sharpness": (fn.adjust_sharpness, lambda m: (1.0 + m,)),
    "Posterize": (fn.posterize, lambda m: (int(m),)),
    "Solarize": (fn.solarize, lambda m: (255.0 * m,)),  # a PIL image's bound is 255.0
    "AutoContrast": (fn.autocontrast, lambda m: ()),
    "Invert": (fn.invert, lambda m: ()),
}
_NEVER = 1 << 62
_SMALL = 160 * 160
#: On a PIL image not converted yet (a lone call, or after a step that left one), Pillow beats
#: the kernel plus the conversions to an ndarray and back below this many pixels, for an "L"
#: and an "RGB" image. Measured on whole policy calls, 28x28 to 375x500: the conversions cost
#: more than the kernels save on small "L" images (a policy that chains a colour op with a
#: warp converts twice). On pixels already in an ndarray (inside a Compose) the kernels run.
_PILLOW_BELOW = {
    "Brightness": (_NEVER, _NEVER),
    "Color": (_NEVER, _NEVER),
    "Contrast": (256 * 256, 256 * 256),
    "Sharpness": (_SMALL, 96 * 96),
    "Posterize": (192 * 192, 0),
    "Solarize": (_SMALL, 0),
    "AutoContrast": (_SMALL, 0),
    "Invert": (_SMALL, 0),
}


def _on_kernel(op: str, px: Pixels) -> bool:
    """Whether ``op`` is faster on nanopatch's kernel than on Pillow for these pixels."""
    if op not in _AUGMENT_KERNELS:
        return False
    if not px.is_pil_image:
        return True
    channels, height, width = px.dims()
    return height * width >= _PILLOW_BELOW[op][channels == 3]


def _augment(policy, px: Pixels, op: str, magnitude: float) -> Pixels:
    """``_apply_image_or_video_transform`` on Pixels: the colour ops on the kernels, the rest
    (geometry, unknown names, a kernel that declines, every op of a subclass that overrides the
    method) on the policy's own method."""
    own_ops = type(policy)._apply_image_or_video_transform is _AutoAugmentBase._apply_image_or_video_transform
    if own_ops and op == "Identity":
        return px
    if own_ops and _on_kernel(op, px):
        kernel = _AUGMENT_KERNELS[op]
        try:
            return px.with_array(kernel[0](px.array(), *kernel[1](magnitude)))
        except NotImplementedError:
            pass
    image = policy._apply_image_or_video_transform(
        px.pil(), op, magnitude, interpolation=policy.interpolation, fill=policy._fill
    )
    return px.with_pil(image)


def _signed(magnitude: float, signed: bool) -> float:
    """The magnitude with stock's random sign: one ``torch.rand(())`` draw for a signed op."""
    if signed and torch.rand(()) <= 0.5:
        return -magnitude
    return magnitude


@_entry
class AutoAugment(_FastV2, stock_class(_v2, "AutoAugment")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        policy = self._policies[int(torch.randint(len(self._policies), ()))]
        for op, probability, magnitude_idx in policy:
            if not torch.rand(()) <= probability:
                continue
            magnitudes_fn, signed = self._AUGMENTATION_SPACE[op]
            magnitudes = magnitudes_fn(10, height, width)
            magnitude = 0.0 if magnitudes is None else _signed(float(magnitudes[magnitude_idx]), signed)
            px = _augment(self, px, op, magnitude)
        return px


@_entry
class RandAugment(_FastV2, stock_class(_v2, "RandAugment")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        for _ in range(self.num_ops):
            op, (magnitudes_fn, signed) = self._get_random_item(self._AUGMENTATION_SPACE)
            magnitudes = magnitudes_fn(self.num_magnitude_bins, height, width)
            magnitude = 0.0 if magnitudes is None else _signed(float(magnitudes[self.magnitude]), signed)
            px = _augment(self, px, op, magnitude)
        return px


@_entry
class TrivialAugmentWide(_FastV2, stock_class(_v2, "TrivialAugmentWide")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        op, (magnitudes_fn, signed) = self._get_random_item(self._AUGMENTATION_SPACE)
        magnitudes = magnitudes_fn(self.num_magnitude_bins, height, width)
        if magnitudes is None:
            magnitude = 0.0
        else:
            magnitude = _signed(float(magnitudes[int(torch.randint(self.num_magnitude_bins, ()))]), signed)
        return _augment(self, px, op, magnitude)
