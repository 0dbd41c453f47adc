"""Drop-in ``torchvision.transforms.v2`` classes for the PIL path.

v2 transforms run on tensors, ``tv_tensors`` and PIL images. On a uint8 tensor v2's geometry is
already fast (torch kernels), so tensor inputs, and every call with several inputs (an image with
its boxes or masks), run stock's code unchanged, but for a lone uint8 RGB image tensor:
ColorJitter's float colour ops (hue above all) run on ``_tensor_color``'s tables and OpenCV's
HSV with v2's values (hue within one level), about 3x faster; a Compose runs ``ToDtype(float32,
scale=True)`` [+ ``Normalize``] as one lookup, and ``RandomResizedCrop`` [+ flips] before it
with it, the box resized from an interleaved copy (``_tensor_geometry``: v2's values, faster
than torch on the box in place). What nanopatch takes over besides is the common
``ImageFolder`` case: a single PIL image (or the undecoded file a dataset hands a nanopatch
pipeline), which stock v2 processes with Pillow until ``ToImage``. Parameters come from the
class's own ``make_params`` (the same ``torch`` draws as stock), pixels from the same kernels
as the v1 classes, and ``ToImage``/``PILToTensor`` + ``ToDtype(float32, scale=True)`` [+
``Normalize``] fuse into one table lookup whose table is computed by stock's own functional
ops, so the values are bit-identical and the result is the same type (``tv_tensors.Image``)
with the same memory layout.

Rotations, affine warps and the auto-augment policies' geometric ops run stock's own v2 code
on a PIL image; the policies' colour ops run nanopatch's exact kernels where they are faster
(one rule with v1: ``_pipeline.on_kernel``). AugMix (which works on tensors inside) and Lambda
stay stock.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import PIL.Image
import torch
import torchvision.transforms.v2 as _v2
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F2
from torchvision.transforms.v2._auto_augment import _AutoAugmentBase
from torchvision.transforms.v2._utils import _get_fill
from torchvision.transforms.v2.functional import _geometry as _F2_geometry

from . import _pipeline, _tensor_color, _tensor_geometry
from . import functional as fn
from ._pipeline import Fast, FusedToFloat, Planned, entry, on_array, run_step, run_steps, stock_class
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


def _random_apply(transform) -> bool:
    """``_RandomApplyTransform``'s coin: the same ``torch.rand(1)`` draw as stock."""
    return not bool(torch.rand(1) >= transform.p)


@entry
class Resize(Fast, stock_class(_v2, "Resize")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        out = _F2_geometry._compute_resized_output_size((height, width), size=self.size, max_size=self.max_size)
        if (out[0], out[1]) != (height, width):
            resized = _pipeline.resize_pixels(px, out, _F2_geometry._check_interpolation(self.interpolation))
            if resized is None:  # stock's pixels, errors and warnings
                return px.with_pil(self._stock_call(px.output()))
            px = resized
        if self.antialias is False:  # v2 warns for PIL input even when the size is unchanged
            _pipeline.warn_antialias_ignored()
        return px


@entry
class CenterCrop(Fast, stock_class(_v2, "CenterCrop")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _pipeline.center_crop_pixels(px, self.size)


@entry
class RandomResizedCrop(Fast, stock_class(_v2, "RandomResizedCrop")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        params = self.make_params([px.proxy()])
        if self.antialias is False:
            _pipeline.warn_antialias_ignored()
        interpolation = _F2_geometry._check_interpolation(self.interpolation)
        box = params["top"], params["left"], params["height"], params["width"]
        return _pipeline.resized_crop_pixels(px, *box, self.size, interpolation)


@entry
class RandomHorizontalFlip(Fast, stock_class(_v2, "RandomHorizontalFlip")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return px.with_array(fn.hflip(px.array())) if _random_apply(self) else px


@entry
class RandomVerticalFlip(Fast, stock_class(_v2, "RandomVerticalFlip")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return px.with_array(fn.vflip(px.array())) if _random_apply(self) else px


def _pad(px: Pixels, transform, padding) -> Pixels:
    fill = _get_fill(transform._fill, PIL.Image.Image)
    return on_array(px, fn.pad, F2.pad, padding=padding, fill=fill, padding_mode=transform.padding_mode)


@entry
class Pad(Fast, stock_class(_v2, "Pad")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _pad(px, self, self.padding)


@entry
class RandomCrop(Fast, stock_class(_v2, "RandomCrop")):
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


@entry
class RandomRotation(Fast, stock_class(_v2, "RandomRotation")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _with_stock_transform(px, self, self.make_params([px.proxy()]))


@entry
class RandomAffine(Fast, stock_class(_v2, "RandomAffine")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _with_stock_transform(px, self, self.make_params([px.proxy()]))


@entry
class GaussianBlur(Fast, stock_class(_v2, "GaussianBlur")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        sigma = self.make_params([px.proxy()])["sigma"]
        return on_array(px, fn.gaussian_blur, F2.gaussian_blur, self.kernel_size, sigma)


@entry
class RandomApply(Fast, stock_class(_v2, "RandomApply")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.rand(1) >= self.p:
            return px
        return run_steps(self.transforms, px)


@entry
class RandomChoice(Fast, stock_class(_v2, "RandomChoice")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        idx = int(torch.multinomial(torch.tensor(self.p), 1))
        return run_step(self.transforms[idx], px)


@entry
class RandomOrder(Fast, stock_class(_v2, "RandomOrder")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return run_steps([self.transforms[i] for i in torch.randperm(len(self.transforms))], px)


def _tensor_image(value: Any) -> bool:
    """A lone uint8 RGB image tensor ``_tensor_color``'s kernels and lookup read (plain or
    ``tv_tensors.Image``; planar or channels-last, or a crop of either)."""
    return type(value) in (torch.Tensor, tv_tensors.Image) and _tensor_color.accepts(value)


@entry
class ColorJitter(Fast, stock_class(_v2, "ColorJitter")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        params = self.make_params([px.proxy()])
        factors = [params[k] for k in ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")]
        return _pipeline.jitter_pixels(px, params["fn_idx"], factors)

    def _nanopatch_tensor(self, image: torch.Tensor) -> Any:
        """A lone uint8 RGB image tensor (plain or ``tv_tensors.Image``): the same draws as stock
        (``make_params``), v2's values from ``_tensor_color``'s kernels, stock's type back."""
        if not _tensor_image(image):
            return NotImplemented
        _check_inputs(self, image)  # stock's forward checks its inputs first
        params = self.make_params([image])
        plain = image.as_subclass(torch.Tensor)
        out = _tensor_color.color_jitter(
            plain,
            params["fn_idx"],
            params["brightness_factor"],
            params["contrast_factor"],
            params["saturation_factor"],
            params["hue_factor"],
        )
        if out is plain:
            return image  # nothing applied: stock hands the input back
        return tv_tensors.wrap(out, like=image) if isinstance(image, tv_tensors.Image) else out


def _grayscale(px: Pixels, channels: int) -> Pixels:
    return on_array(px, fn.rgb_to_grayscale, F2.rgb_to_grayscale, num_output_channels=channels)


@entry
class Grayscale(Fast, stock_class(_v2, "Grayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _grayscale(px, self.num_output_channels)


@entry
class RandomGrayscale(Fast, stock_class(_v2, "RandomGrayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        if not _random_apply(self):
            return px
        return _grayscale(px, self.make_params([px.proxy()])["num_input_channels"])


@entry
class ToImage(Fast, stock_class(_v2, "ToImage")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return tv_tensors.Image(fn.pil_to_tensor(px.array()))


@entry
class PILToTensor(Fast, stock_class(_v2, "PILToTensor")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return fn.pil_to_tensor(px.array())


@entry
class ToDtype(Fast, stock_class(_v2, "ToDtype")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return self._stock_call(px.output())  # ToDtype passes PIL images through: stock


@entry
class Normalize(Fast, stock_class(_v2, "Normalize")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return self._stock_call(px.output())  # Normalize refuses PIL images: stock's error


class FusedTensorToFloat:
    """v2's ``ToDtype(float32, scale=True)`` [+ ``Normalize``] on a uint8 image tensor as one
    table lookup per plane. The table is stock's own steps run once on the 256 levels (each op
    elementwise: the very values), per input type (the result's type is what stock gives)."""

    _SETTINGS = ("dtype", "scale", "mean", "std", "inplace")

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self._tables: dict[tuple, np.ndarray | None] = {}
        self._fields = _pipeline.settings_of(steps, self._SETTINGS)

    def _table(self, kind: type) -> np.ndarray | None:
        settings = _pipeline.settings_key(self._fields)
        key = (kind, torch.get_default_dtype(), settings)
        if key not in self._tables:
            levels = torch.arange(256, dtype=torch.uint8).repeat(3, 1).reshape(3, 1, 256)
            value: Any = levels if kind is torch.Tensor else tv_tensors.Image(levels)
            try:
                for step in self.steps:
                    value = step._stock_call(value)
            except Exception:  # stock's error is raised again by the unfused steps
                value = None
            ok = (
                type(value) is kind
                and value.dtype == torch.float32
                and value.shape == (3, 1, 256)
                and value.is_contiguous()
            )
            self._tables[key] = value.as_subclass(torch.Tensor).reshape(3, 256).numpy().copy() if ok else None
        return self._tables[key]

    def __call__(self, value: Any) -> Any:
        if _tensor_image(value) and (table := self._table(type(value))) is not None:
            plain = value.as_subclass(torch.Tensor)
            out = torch.empty_like(plain, dtype=torch.float32)  # stock's layout: what ToDtype's .to() allocates
            if _tensor_color.lookup(plain, table, out):
                return out if type(value) is torch.Tensor else tv_tensors.wrap(out, like=value)
        for step in self.steps:  # another input or layout: stock's steps
            value = step(value)
        return value


class FusedTensorResizedCrop:
    """v2's ``RandomResizedCrop`` (bilinear, antialiased), its flips, then ``ToDtype(float32,
    scale=True)`` [+ ``Normalize``] on a lone uint8 RGB image tensor (plain or
    ``tv_tensors.Image``, planar or ``decode_jpeg``'s channels-last memory): the same draws as
    stock (the crop's ``make_params``, each flip's coin), the box resized by v2's own kernel
    from an interleaved copy (``_tensor_geometry``: the same values, faster), flipped there,
    and the float table written straight into the layout stock's steps give their result.
    The very values and layout of stock's steps; any other input, or a crop the fast resize
    does not take, runs stock's steps (after the draw, with the drawn box)."""

    #: the flips it takes, and the dimension each flips
    FLIPS = {RandomHorizontalFlip: -1, RandomVerticalFlip: -2}

    def __init__(self, crop: Any, flips: list[Any], to_float: FusedTensorToFloat) -> None:
        self.crop, self.flips, self.to_float = crop, flips, to_float

    def _table(self, value: Any) -> np.ndarray | None:
        """The float table, where the fast steps take ``value``; else None."""
        crop = self.crop
        if not (
            _tensor_image(value)
            and _tensor_geometry.dense_image(value)
            and crop.antialias is True
            and _F2_geometry._check_interpolation(crop.interpolation) == InterpolationMode.BILINEAR
            and _native_uint8_bilinear()
            and _tensor_geometry.usable()
        ):
            return None
        return self.to_float._table(type(value))

    def __call__(self, value: Any) -> Any:
        table = self._table(value)
        if table is None:
            return self.to_float(run_steps([self.crop, *self.flips], value))
        crop = self.crop
        _check_inputs(crop, value)
        params = crop.make_params([value])
        top, left, height, width = params["top"], params["left"], params["height"], params["width"]
        size = tuple(int(v) for v in crop.size)
        if (height, width) == size:  # v2 hands back the box itself: stock's steps from here
            return self.to_float(run_steps(self.flips, crop.transform(value, params)))
        plain = value.as_subclass(torch.Tensor)
        interleaved = _tensor_geometry.stock_interleaved(plain, top, left, height, width)
        image = _tensor_geometry.resized_crop(plain, top, left, height, width, size)
        for flip in self.flips:
            _check_inputs(flip, image)
            if _random_apply(flip):
                image = image.flip(self.FLIPS[type(flip)])
        if interleaved:  # stock's float image keeps the resize's layout
            out = torch.empty((*size, 3), dtype=torch.float32).permute(2, 0, 1)
        else:
            out = torch.empty((3, *size), dtype=torch.float32)
        if not _tensor_color.lookup(image, table, out):  # pragma: no cover - both dense
            raise NotImplementedError(f"a table lookup from strides {image.stride()} into {out.stride()}")
        return out if type(value) is torch.Tensor else tv_tensors.wrap(out, like=value)


def _check_inputs(transform: Any, value: Any) -> None:
    """What stock's ``forward`` does before its draw: the transform's input check (torchvision
    versions that have one)."""
    check = getattr(transform, "check_inputs", None)
    if check is not None:
        check([value])


def _native_uint8_bilinear() -> bool:
    """Whether v2 resizes uint8 images with torch's uint8 kernel here (else it computes in float)."""
    native = getattr(_F2_geometry, "_do_native_uint8_resize_on_cpu", None)
    return native is not None and bool(native(InterpolationMode.BILINEAR))


@entry
class Compose(Planned, Fast, stock_class(_v2, "Compose")):
    def _nanopatch_tensor(self, image: torch.Tensor) -> Any:
        """A lone image tensor: the steps as stock's Compose runs them, ``ToDtype(float32,
        scale=True)`` [+ ``Normalize``] fused into one lookup where the value reaching them is a
        uint8 RGB image tensor; NotImplemented (stock's call) where nothing fuses."""
        plan = self._plan(self._fuse_tensor, "_nanopatch_tensor_plan")
        if type(image) not in (torch.Tensor, tv_tensors.Image) or not any(
            isinstance(step, (FusedTensorToFloat, FusedTensorResizedCrop)) for step in plan
        ):
            return NotImplemented
        return run_steps(plan, image)

    @staticmethod
    def _fuse_tensor(steps: list[Any], i: int) -> tuple[Any, int] | None:
        """On a tensor: ``ToDtype(float32, scale=True)`` [+ ``Normalize``] as one lookup, and
        ``RandomResizedCrop`` [+ flips] before them with it (``FusedTensorResizedCrop``)."""
        step = steps[i]
        if isinstance(step, ToDtype) and step.dtype is torch.float32 and step.scale:
            length = 2 if i + 1 < len(steps) and isinstance(steps[i + 1], Normalize) else 1
            return FusedTensorToFloat(steps[i : i + length]), length
        if type(step) is RandomResizedCrop:
            end = i + 1
            while end < len(steps) and type(steps[end]) in FusedTensorResizedCrop.FLIPS:
                end += 1
            tail = Compose._fuse_tensor(steps, end) if end < len(steps) else None
            if tail is not None and isinstance(tail[0], FusedTensorToFloat):
                return FusedTensorResizedCrop(step, steps[i + 1 : end], tail[0]), end - i + tail[1]
        return None

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


def _augment(policy, px: Pixels, op: str, magnitude: float) -> Pixels:
    """``_apply_image_or_video_transform`` on Pixels: the colour ops on the kernels where they
    are faster (``_pipeline.augment_kernel``), the rest (geometry, unknown names, every op of a
    subclass that overrides the method) on the policy's own method."""
    if type(policy)._apply_image_or_video_transform is _AutoAugmentBase._apply_image_or_video_transform:
        if op == "Identity":
            return px
        # a PIL image's Solarize bound is 255.0: the kernel takes the threshold in levels
        done = _pipeline.augment_kernel(px, op, 255.0 * magnitude if op == "Solarize" else magnitude)
        if done is not None:
            return done
    image = policy._apply_image_or_video_transform(
        px.pil(), op, magnitude, interpolation=policy.interpolation, fill=policy._fill
    )
    return px.with_pil(image)


def _signed(magnitude: float, signed: bool) -> float:
    """The magnitude with stock's random sign: one ``torch.rand(())`` draw for a signed op."""
    if signed and torch.rand(()) <= 0.5:
        return -magnitude
    return magnitude


@entry
class AutoAugment(Fast, stock_class(_v2, "AutoAugment")):
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


@entry
class RandAugment(Fast, stock_class(_v2, "RandAugment")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        for _ in range(self.num_ops):
            op, (magnitudes_fn, signed) = self._get_random_item(self._AUGMENTATION_SPACE)
            magnitudes = magnitudes_fn(self.num_magnitude_bins, height, width)
            magnitude = 0.0 if magnitudes is None else _signed(float(magnitudes[self.magnitude]), signed)
            px = _augment(self, px, op, magnitude)
        return px


@entry
class TrivialAugmentWide(Fast, stock_class(_v2, "TrivialAugmentWide")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        op, (magnitudes_fn, signed) = self._get_random_item(self._AUGMENTATION_SPACE)
        magnitudes = magnitudes_fn(self.num_magnitude_bins, height, width)
        if magnitudes is None:
            magnitude = 0.0
        else:
            magnitude = _signed(float(magnitudes[int(torch.randint(self.num_magnitude_bins, ()))]), signed)
        return _augment(self, px, op, magnitude)
