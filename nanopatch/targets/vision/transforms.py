"""Drop-in ``torchvision.transforms`` (v1) classes that run on ndarrays.

Each class here subclasses the stock class of the same name, so constructors, defaults,
argument checks, ``repr``, ``get_params`` and pickling are stock's own; only the call differs:

* on a PIL image ("L"/"RGB") or an undecoded dataset file, the parameters are drawn with the
  same ``torch``/``random`` calls stock makes (torchvision's own ``get_params``), then the pixels
  go through :mod:`nanopatch.targets.vision.functional`; the result is the type stock returns;
* on a user's ndarray stock's code runs (it raises ``TypeError``, or hands the array back when a
  random draw skips the step), except in ``ToTensor``, which takes one as stock's does;
* on anything else (tensors, other PIL modes) the stock code runs unchanged;
* a kernel that cannot reproduce stock for some argument raises ``NotImplementedError`` and
  the step runs stock's PIL code with the parameters already drawn.

A :class:`Compose` plans its steps once: consecutive nanopatch steps pass one ndarray along
with no PIL round trips, ``ToTensor`` + ``Normalize`` fuse into one lookup, any other step
(a ``Lambda``, a third-party transform) gets exactly the type stock would have passed it, and
when a dataset hands the pipeline an undecoded JPEG, the first Resize / RandomResizedCrop lets
the decoder work at the smallest DCT scale it allows (the ``fast_decode`` option).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torchvision.transforms.functional as F
from torchvision.transforms import autoaugment as _tv_autoaugment
from torchvision.transforms import transforms as _tv

from . import functional as fn
from ._pipeline import (
    Fast,
    FusedToFloat,
    Planned,
    augment_kernel,
    center_crop_pixels,
    entry,
    jitter_pixels,
    on_array,
    on_kernel,
    pillow,
    resize_pixels,
    resized_crop_pixels,
    run_step,
    run_steps,
    scaled_decode,
    stock_class,
    warn_antialias_ignored,
)
from ._pixels import Pixels

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
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomCrop",
    "RandomEqualize",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomOrder",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomSolarize",
    "RandomVerticalFlip",
    "Resize",
    "ToTensor",
    "TrivialAugmentWide",
]


# --- geometry ------------------------------------------------------------------------------


def resize_center_crop_pixels(px: Pixels, out, interpolation, crop_size) -> Pixels | None:
    """``px`` resized to ``out`` (h, w), then centre-cropped to ``crop_size`` (h, w) as
    ``F.center_crop`` does, resizing only what the crop keeps (the same pixels as the two steps:
    ``functional.resize_crop``); an undecoded JPEG is decoded DCT-scaled when allowed. None when
    the steps must run one by one (a crop that pads, a filter nanopatch does not reproduce)."""
    out_h, out_w = int(out[0]), int(out[1])
    crop_h, crop_w = int(crop_size[0]), int(crop_size[1])
    if crop_h > out_h or crop_w > out_w or not fn.is_pil_filter(interpolation):
        return None
    arr, _, _ = scaled_decode(px, (out_h, out_w))
    top, left = round((out_h - crop_h) / 2.0), round((out_w - crop_w) / 2.0)
    try:
        return px.with_array(fn.resize_crop(arr, (out_h, out_w), top, left, crop_h, crop_w, interpolation))
    except NotImplementedError:
        return None


@entry
class Resize(Fast, stock_class(_tv, "Resize")):
    def _output_size(self, px: Pixels) -> list[int] | None:
        """The (h, w) this step resizes ``px`` to; None when stock's code must run (for a size
        it rejects, or a (h, w) size with ``max_size``, where stock has its own answer)."""
        size = self.size
        if not (isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) in (1, 2))):
            return None
        if isinstance(size, (list, tuple)) and len(size) == 2 and self.max_size is not None:
            return None
        _, height, width = px.dims()
        requested = [size] if isinstance(size, int) else list(size)
        return F._compute_resized_output_size((height, width), requested, self.max_size)

    def _nanopatch_run(self, px: Pixels) -> Any:
        out = self._output_size(px)
        if out is None:
            return px.with_pil(self._stock_call(px.pil()))  # stock raises, or knows what to do
        if list(px.dims()[1:]) == out:
            return px
        resized = resize_pixels(px, out, self.interpolation)
        if resized is None:  # stock's pixels, errors and warnings
            return px.with_pil(self._stock_call(px.pil()))
        if self.antialias is False and px.domain == "pil":
            warn_antialias_ignored()
        return resized


@entry
class CenterCrop(Fast, stock_class(_tv, "CenterCrop")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        return center_crop_pixels(px, self.size)


@entry
class RandomResizedCrop(Fast, stock_class(_tv, "RandomResizedCrop")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        # parameters in full-resolution coordinates: the same crop whatever scale decodes
        top, left, height, width = self.get_params(px.proxy(), self.scale, self.ratio)
        return resized_crop_pixels(px, top, left, height, width, self.size, self.interpolation)


@entry
class RandomCrop(Fast, stock_class(_tv, "RandomCrop")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        if self.padding is not None:
            px = on_array(px, fn.pad, F.pad, self.padding, self.fill, self.padding_mode)
        _, height, width = px.dims()
        if self.pad_if_needed and width < self.size[1]:
            px = on_array(px, fn.pad, F.pad, [self.size[1] - width, 0], self.fill, self.padding_mode)
        if self.pad_if_needed and height < self.size[0]:
            px = on_array(px, fn.pad, F.pad, [0, self.size[0] - height], self.fill, self.padding_mode)
        top, left, h, w = self.get_params(px.proxy(), self.size)
        return px.with_array(fn.crop(px.array(), top, left, h, w))


@entry
class RandomHorizontalFlip(Fast, stock_class(_tv, "RandomHorizontalFlip")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.rand(1) < self.p:
            return px.with_array(fn.hflip(px.array()))
        return px


@entry
class RandomVerticalFlip(Fast, stock_class(_tv, "RandomVerticalFlip")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.rand(1) < self.p:
            return px.with_array(fn.vflip(px.array()))
        return px


@entry
class Pad(Fast, stock_class(_tv, "Pad")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        return on_array(px, fn.pad, F.pad, self.padding, self.fill, self.padding_mode)


@entry
class RandomRotation(Fast, stock_class(_tv, "RandomRotation")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        angle = self.get_params(self.degrees)
        return pillow(px, F.rotate, angle, self.interpolation, self.expand, self.center, self.fill)


@entry
class RandomAffine(Fast, stock_class(_tv, "RandomAffine")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        params = self.get_params(self.degrees, self.translate, self.scale, self.shear, [width, height])
        return pillow(px, F.affine, *params, interpolation=self.interpolation, fill=self.fill, center=self.center)


@entry
class GaussianBlur(Fast, stock_class(_tv, "GaussianBlur")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        sigma = self.get_params(self.sigma[0], self.sigma[1])
        return on_array(px, fn.gaussian_blur, F.gaussian_blur, self.kernel_size, [sigma, sigma])


# --- colour --------------------------------------------------------------------------------


@entry
class ColorJitter(Fast, stock_class(_tv, "ColorJitter")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        order, brightness, contrast, saturation, hue = self.get_params(
            self.brightness, self.contrast, self.saturation, self.hue
        )
        return jitter_pixels(px, order, (brightness, contrast, saturation, hue))


@entry
class Grayscale(Fast, stock_class(_tv, "Grayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return on_array(px, fn.rgb_to_grayscale, F.rgb_to_grayscale, num_output_channels=self.num_output_channels)


@entry
class RandomGrayscale(Fast, stock_class(_tv, "RandomGrayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        channels = px.dims()[0]
        if torch.rand(1) < self.p:
            return on_array(px, fn.rgb_to_grayscale, F.rgb_to_grayscale, num_output_channels=channels)
        return px


class _RandomColourOp(Fast):
    """torchvision's Random<op>: stock's coin (``torch.rand(1).item() < p``), then one of the
    policies' colour ops on the kernel where that is faster than Pillow (``_pipeline.on_kernel``),
    else stock's PIL op."""

    #: (the op's name in the policies, the kernel, stock's functional op, its arguments' attributes)
    _op: tuple[str, Any, Any, tuple[str, ...]]

    def _nanopatch_run(self, px: Pixels) -> Any:
        if not torch.rand(1).item() < self.p:
            return px
        name, kernel, stock_op, attributes = self._op
        args = [getattr(self, attribute) for attribute in attributes]
        if on_kernel(name, px):
            return on_array(px, kernel, stock_op, *args)
        return pillow(px, stock_op, *args)


@entry
class RandomInvert(_RandomColourOp, stock_class(_tv, "RandomInvert")):
    _op = ("Invert", fn.invert, F.invert, ())


@entry
class RandomPosterize(_RandomColourOp, stock_class(_tv, "RandomPosterize")):
    _op = ("Posterize", fn.posterize, F.posterize, ("bits",))


@entry
class RandomSolarize(_RandomColourOp, stock_class(_tv, "RandomSolarize")):
    _op = ("Solarize", fn.solarize, F.solarize, ("threshold",))


@entry
class RandomAdjustSharpness(_RandomColourOp, stock_class(_tv, "RandomAdjustSharpness")):
    _op = ("Sharpness", fn.adjust_sharpness, F.adjust_sharpness, ("sharpness_factor",))


@entry
class RandomAutocontrast(_RandomColourOp, stock_class(_tv, "RandomAutocontrast")):
    _op = ("AutoContrast", fn.autocontrast, F.autocontrast, ())


@entry
class RandomEqualize(_RandomColourOp, stock_class(_tv, "RandomEqualize")):
    _op = ("Equalize", fn.equalize, F.equalize, ())


# --- to tensor -----------------------------------------------------------------------------


@entry
class ToTensor(Fast, stock_class(_tv, "ToTensor")):
    def _takes_array(self, arr: np.ndarray) -> bool:
        # stock's torch.from_numpy warns on a read-only array and refuses negative strides: stock's then
        return arr.flags.writeable and min(arr.strides, default=0) >= 0

    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.get_default_dtype() != torch.float32:
            return self._stock_call(px.output())
        return fn.to_tensor(px.array())


@entry
class PILToTensor(Fast, stock_class(_tv, "PILToTensor")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return fn.pil_to_tensor(px.array())


@entry
class Normalize(Fast, stock_class(_tv, "Normalize")):
    # Normalize works on tensors only (stock raises TypeError otherwise); after ToTensor in a
    # Compose the two fuse into one pass.

    def _nanopatch_run(self, px: Pixels) -> Any:
        return self._stock_call(px.output())


# --- containers ----------------------------------------------------------------------------


@entry
class RandomApply(Fast, stock_class(_tv, "RandomApply")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        if self.p < torch.rand(1):
            return px
        return run_steps(self.transforms, px)


@entry
class RandomOrder(Fast, stock_class(_tv, "RandomOrder")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        order = list(range(len(self.transforms)))
        random.shuffle(order)
        return run_steps([self.transforms[i] for i in order], px)


@entry
class RandomChoice(Fast, stock_class(_tv, "RandomChoice")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        step = random.choices(self.transforms, weights=self.p)[0]
        return run_step(step, px)


class ResizeCenterCrop:
    """A Resize followed by a CenterCrop, as one step that resizes only the part of the image
    the crop keeps (``resize_center_crop_pixels``); the two steps one by one wherever that
    does not apply."""

    def __init__(self, resize: Resize, center_crop: CenterCrop) -> None:
        self.steps = [resize, center_crop]

    def _nanopatch_run(self, px: Pixels) -> Any:
        resize, center_crop = self.steps
        out = resize._output_size(px)
        if out is not None and list(px.dims()[1:]) != out:
            done = resize_center_crop_pixels(px, out, resize.interpolation, center_crop.size)
            if done is not None:
                if resize.antialias is False and px.domain == "pil":
                    warn_antialias_ignored()
                return done
        return run_steps(self.steps, px)


_ConvertImageDtype = stock_class(_tv, "ConvertImageDtype")


@entry
class Compose(Planned, Fast, stock_class(_tv, "Compose")):
    # Compose with a plan: see the module docstring.

    def _fuse(self, steps: list[Any], i: int) -> tuple[Any, int] | None:
        step = steps[i]
        if type(step) is Resize and i + 1 < len(steps) and type(steps[i + 1]) is CenterCrop:
            return ResizeCenterCrop(step, steps[i + 1]), 2
        if isinstance(step, ToTensor) and i + 1 < len(steps) and isinstance(steps[i + 1], Normalize):
            return FusedToFloat(steps[i : i + 2]), 2
        if (
            isinstance(step, PILToTensor)
            and i + 2 < len(steps)
            and isinstance(steps[i + 1], _ConvertImageDtype)
            and steps[i + 1].dtype == torch.float32
            and isinstance(steps[i + 2], Normalize)
        ):
            return FusedToFloat(steps[i : i + 3]), 3
        return None


# --- auto-augment policies -----------------------------------------------------------------


def _augment_op(px: Pixels, op_name: str, magnitude: float, interpolation, fill) -> Pixels:
    """torchvision's ``autoaugment._apply_op`` on Pixels: the colour ops on the kernels where
    they are faster (``_pipeline.augment_kernel``), the rest on stock's own function."""
    if op_name == "Identity":
        return px
    done = augment_kernel(px, op_name, magnitude)
    if done is not None:
        return done
    return px.with_pil(_tv_autoaugment._apply_op(px.pil(), op_name, magnitude, interpolation, fill))


@entry
class AutoAugment(Fast, stock_class(_tv_autoaugment, "AutoAugment")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        transform_id, probs, signs = self.get_params(len(self.policies))
        op_meta = self._augmentation_space(10, (height, width))
        for i, (op_name, p, magnitude_id) in enumerate(self.policies[transform_id]):
            if probs[i] <= p:
                magnitudes, signed = op_meta[op_name]
                magnitude = float(magnitudes[magnitude_id].item()) if magnitude_id is not None else 0.0
                if signed and signs[i] == 0:
                    magnitude *= -1.0
                px = _augment_op(px, op_name, magnitude, self.interpolation, self.fill)
        return px


@entry
class RandAugment(Fast, stock_class(_tv_autoaugment, "RandAugment")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        op_meta = self._augmentation_space(self.num_magnitude_bins, (height, width))
        for _ in range(self.num_ops):
            op_index = int(torch.randint(len(op_meta), (1,)).item())
            op_name = list(op_meta.keys())[op_index]
            magnitudes, signed = op_meta[op_name]
            magnitude = float(magnitudes[self.magnitude].item()) if magnitudes.ndim > 0 else 0.0
            if signed and torch.randint(2, (1,)):
                magnitude *= -1.0
            px = _augment_op(px, op_name, magnitude, self.interpolation, self.fill)
        return px


@entry
class TrivialAugmentWide(Fast, stock_class(_tv_autoaugment, "TrivialAugmentWide")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        op_meta = self._augmentation_space(self.num_magnitude_bins)
        op_index = int(torch.randint(len(op_meta), (1,)).item())
        op_name = list(op_meta.keys())[op_index]
        magnitudes, signed = op_meta[op_name]
        magnitude = (
            float(magnitudes[torch.randint(len(magnitudes), (1,), dtype=torch.long)].item())
            if magnitudes.ndim > 0
            else 0.0
        )
        if signed and torch.randint(2, (1,)):
            magnitude *= -1.0
        return _augment_op(px, op_name, magnitude, self.interpolation, self.fill)
