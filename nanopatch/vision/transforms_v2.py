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
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import PIL.Image
import torch
import torchvision.transforms.v2 as _v2
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F2
from torchvision.transforms.v2._utils import _get_fill
from torchvision.transforms.v2.functional import _geometry as _F2_geometry

from . import functional as fn
from ._pixels import Pixels
from .datasets import ACCEPTS_ENCODED
from .transforms import Planned, _scaled_decode, finish, resized_crop_pixels, run_step, stock_class

__all__ = [
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "GaussianBlur",
    "Grayscale",
    "Normalize",
    "PILToTensor",
    "Pad",
    "RandomApply",
    "RandomChoice",
    "RandomCrop",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomOrder",
    "RandomResizedCrop",
    "RandomVerticalFlip",
    "Resize",
    "ToDtype",
    "ToImage",
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
                return finish(self._nanopatch_run(px), inputs[0])
        return self._nanopatch_stock.forward(self, *inputs)

    def _nanopatch_run(self, px: Pixels) -> Any:  # pragma: no cover - every class overrides it
        raise NotImplementedError

    def _stock_step(self, px: Pixels) -> Any:
        """Stock's own forward on what stock would hold here (a PIL image)."""
        return self._nanopatch_stock.forward(self, px.output())


setattr(_FastV2, ACCEPTS_ENCODED, True)


def _entry(cls):
    cls._nanopatch_stock = next(base for base in cls.__mro__[1:] if not base.__module__.startswith("nanopatch."))
    cls.__doc__ = cls._nanopatch_stock.__doc__
    return cls


def _random_apply(transform) -> bool:
    """``_RandomApplyTransform``'s coin: the same ``torch.rand(1)`` draw as stock."""
    return not bool(torch.rand(1) >= transform.p)


@_entry
class Resize(_FastV2, stock_class(_v2, "Resize")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        out = _F2_geometry._compute_resized_output_size((height, width), size=self.size, max_size=self.max_size)
        interpolation = _F2_geometry._check_interpolation(self.interpolation)
        if (out[0], out[1]) != (height, width):
            if fn._mode_value(interpolation) not in fn._PIL_FILTERS:
                return px.with_pil(self._stock_step(px))
            arr, _, _ = _scaled_decode(px, (out[0], out[1]))
            try:
                resized = fn.resize(arr, out, interpolation)
            except NotImplementedError:  # a size Pillow refuses: stock's error (and warnings)
                return px.with_pil(self._stock_step(px))
            px = px.with_array(resized)
        if self.antialias is False:  # v2 warns for PIL input even when the size is unchanged
            warnings.warn(
                "Anti-alias option is always applied for PIL Image input. Argument antialias is ignored.", stacklevel=2
            )
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
            warnings.warn(
                "Anti-alias option is always applied for PIL Image input. Argument antialias is ignored.", stacklevel=2
            )
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


@_entry
class ColorJitter(_FastV2, stock_class(_v2, "ColorJitter")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        params = self.make_params([px.proxy()])
        order = [int(i) for i in params["fn_idx"]]
        factors = [params[k] for k in ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")]
        try:
            return px.with_array(fn.color_jitter(px.array(), order, *factors))
        except NotImplementedError:
            img = px.pil()
            ops = (F2.adjust_brightness, F2.adjust_contrast, F2.adjust_saturation, F2.adjust_hue)
            for index in order:
                if factors[index] is not None:
                    img = ops[index](img, factors[index])
            return px.with_pil(img)


def _pad(px: Pixels, transform, padding) -> Pixels:
    fill = _get_fill(transform._fill, PIL.Image.Image)
    try:
        return px.with_array(fn.pad(px.array(), padding, fill, transform.padding_mode))
    except NotImplementedError:
        return px.with_pil(F2.pad(px.pil(), padding=padding, fill=fill, padding_mode=transform.padding_mode))


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


@_entry
class GaussianBlur(_FastV2, stock_class(_v2, "GaussianBlur")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        sigma = self.make_params([px.proxy()])["sigma"]
        try:
            return px.with_array(fn.gaussian_blur(px.array(), self.kernel_size, sigma))
        except NotImplementedError:
            return px.with_pil(F2.gaussian_blur(px.pil(), self.kernel_size, sigma))


def _run_all(steps, px: Pixels) -> Any:
    value: Any = px
    for step in steps:
        value = run_step(step, value)
    return value


@_entry
class RandomApply(_FastV2, stock_class(_v2, "RandomApply")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.rand(1) >= self.p:
            return px
        return _run_all(self.transforms, px)


@_entry
class RandomChoice(_FastV2, stock_class(_v2, "RandomChoice")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        idx = int(torch.multinomial(torch.tensor(self.p), 1))
        return run_step(self.transforms[idx], px)


@_entry
class RandomOrder(_FastV2, stock_class(_v2, "RandomOrder")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return _run_all([self.transforms[i] for i in torch.randperm(len(self.transforms))], px)


def _grayscale(px: Pixels, channels: int) -> Pixels:
    try:
        return px.with_array(fn.rgb_to_grayscale(px.array(), channels))
    except NotImplementedError:
        return px.with_pil(F2.rgb_to_grayscale(px.pil(), num_output_channels=channels))


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
        return self._stock_step(px)  # ToDtype passes PIL images through: stock


@_entry
class Normalize(_FastV2, stock_class(_v2, "Normalize")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return self._stock_step(px)  # Normalize refuses PIL images: stock's error


class _FusedToFloat:
    """``ToImage``/``PILToTensor`` + ``ToDtype(torch.float32, scale=True)`` [+ ``Normalize``]
    as one lookup. The table is stock's functional ops applied to the 256 levels, so every value
    is what stock computes; the output has stock's type and channels-last layout."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self._tables: dict[tuple, np.ndarray] = {}

    def _table(self, channels: int) -> np.ndarray | None:
        # keyed by the steps' settings too, so a user who changes them later gets a new table
        names = ("dtype", "scale", "mean", "std")
        settings = tuple(repr(getattr(step, name, None)) for step in self.steps for name in names)
        key = (channels, settings)
        table = self._tables.get(key)
        if table is None:
            levels = torch.arange(256, dtype=torch.uint8).expand(channels, 1, 256)
            value: Any = tv_tensors.Image(levels.clone())
            try:
                for step in self.steps[1:]:
                    value = step(value)
            except Exception:  # stock's error is raised again by the unfused steps
                return None
            if tuple(value.shape) != (channels, 1, 256) or value.dtype != torch.float32:
                return None  # stock broadcasts (3 means on 1 channel) or converts otherwise: unfused
            table = value.reshape(channels, 256).numpy().astype(np.float32, copy=True)
            self._tables[key] = table
        return table

    def _nanopatch_run(self, px: Pixels) -> Any:
        table = self._table(px.dims()[0]) if px.domain == "pil" else None
        if table is None:
            value: Any = px
            for step in self.steps:
                value = run_step(step, value)
            return value
        out = fn.lookup(px.array(), table)
        return tv_tensors.Image(out) if isinstance(self.steps[0], ToImage) else out


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
            return _FusedToFloat(steps[i : i + length]), length
        return None
