"""Drop-in ``torchvision.transforms`` (v1) classes that run on ndarrays.

Each class here subclasses the stock class of the same name, so constructors, defaults,
argument checks, ``repr``, ``get_params`` and pickling are stock's own; only the call differs:

* on a PIL image ("L"/"RGB") or an undecoded dataset file, the parameters are drawn with the
  same ``torch``/``random`` calls stock makes (torchvision's own ``get_params``), then the pixels
  go through :mod:`nanopatch.vision.functional`; the result is the type stock returns;
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

import math
import os
import random
import warnings
from typing import Any

import numpy as np
import torch
import torchvision.transforms.functional as F
from torchvision.transforms import autoaugment as _tv_autoaugment
from torchvision.transforms import transforms as _tv

from .. import _patching, config
from . import functional as fn
from ._pixels import Pixels
from .datasets import ACCEPTS_ENCODED

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
    "ToTensor",
    "TrivialAugmentWide",
]


def stock_class(module, name: str) -> type:
    """torchvision's own class ``name``, also when ``module`` already holds nanopatch's."""
    cls = module.__dict__[name]
    return cls.__dict__.get("_nanopatch_stock", cls) if cls.__module__.startswith("nanopatch.") else cls


def fast_decode_enabled() -> bool:
    """The ``fast_decode`` option in force (the environment's, in a process never patched)."""
    active = _patching._active
    if active is not None:
        return active.fast_decode
    raw = os.environ.get(config.env_name("fast_decode"), "").strip()
    return True if not raw else config.parse_value("fast_decode", raw, " (from the environment)")


# --- running steps on Pixels -------------------------------------------------------------


def run_step(step: Any, value: Any) -> Any:
    """One pipeline step on the value so far (a Pixels, or whatever a stock step returned)."""
    if isinstance(value, Pixels):
        run = getattr(step, "_nanopatch_run", None)
        if run is not None:
            return run(value)
        return step(value.output())
    if not callable(step):  # a plan step fused from several, after a stock step: them one by one
        return run_steps(step.steps, value)
    return step(value)


def run_steps(steps, value: Any) -> Any:
    """Steps one after the other on the value so far."""
    for step in steps:
        value = run_step(step, value)
    return value


def finish(value: Any) -> Any:
    """What the caller gets: the type stock returns."""
    return value.output() if isinstance(value, Pixels) else value


def _pillow(px: Pixels, stock_op, *args, **kwargs) -> Pixels:
    """Stock's own PIL op. Used for rotate and affine: nanopatch's exact ndarray versions of
    Pillow's nearest and bilinear warps (``functional.affine``/``rotate``) are slower than
    Pillow's C loops, even counting the conversion to a PIL image and back."""
    return px.with_pil(stock_op(px.pil(), *args, **kwargs))


def on_array(px: Pixels, kernel, stock_op, *args, **kwargs) -> Pixels:
    """``kernel(array, *args)`` on the pixels, or stock's PIL op when the kernel declines."""
    try:
        return px.with_array(kernel(px.array(), *args, **kwargs))
    except NotImplementedError:
        return px.with_pil(stock_op(px.pil(), *args, **kwargs))


class _Fast:
    """Mixin of every nanopatch transform: the entry point and the stock fallback."""

    _nanopatch_stock: type
    #: run the ndarray kernels for a lone call on a PIL image (where they beat Pillow)
    _pil_alone = True

    def _nanopatch_run(self, px: Pixels) -> Any:  # pragma: no cover - every class overrides it
        raise NotImplementedError

    def _takes_array(self, arr: np.ndarray) -> bool:
        """Whether this step runs nanopatch's kernels on a user's ndarray. Stock's classes refuse
        one (``TypeError``), or hand it back untouched when a random draw skips the step; only
        the ndarray-taking ToTensor says yes. (Inside a Compose the pixels travel as ndarrays
        between nanopatch's steps whatever this says: the caller gave a PIL image or a file.)"""
        return False

    def _nanopatch_call(self, *args, **kwargs):
        px = Pixels.accept(args[0]) if len(args) == 1 and not kwargs else None
        if (
            px is None
            or (px.is_pil_image and not self._pil_alone)
            or (px.domain == "array" and not self._takes_array(args[0]))
        ):
            return self._stock_call(*args, **kwargs)
        return finish(self._nanopatch_run(px))

    def _stock_call(self, *args, **kwargs):
        stock = self._nanopatch_stock
        call = stock.forward if issubclass(stock, torch.nn.Module) else stock.__call__
        return call(self, *args, **kwargs)

    def __prepare_scriptable__(self):
        """``torch.jit.script`` compiles the stock class: a copy of this object as one."""
        stock = self._nanopatch_stock
        clone = stock.__new__(stock)
        clone.__dict__.update(self.__dict__)
        return clone


# datasets may hand a nanopatch transform an undecoded file (see datasets.ACCEPTS_ENCODED)
setattr(_Fast, ACCEPTS_ENCODED, True)


def bind_stock(cls) -> type:
    """Record the torchvision class ``cls`` stands in for (its first non-nanopatch base) and
    give ``cls`` its documentation, so help() shows torchvision's."""
    stock = next(base for base in cls.__mro__[1:] if not base.__module__.startswith("nanopatch."))
    cls._nanopatch_stock = stock
    cls.__doc__ = stock.__doc__
    return stock


def _entry(cls):
    """Route calls of ``cls`` (a nn.Module's ``forward`` or a plain class's ``__call__``)."""
    if issubclass(bind_stock(cls), torch.nn.Module):
        cls.forward = _Fast._nanopatch_call
    else:
        cls.__call__ = _Fast._nanopatch_call
    return cls


# --- geometry ------------------------------------------------------------------------------


def scaled_decode(px: Pixels, need_hw: tuple[int, int]) -> tuple[np.ndarray, float, float]:
    """The pixels, DCT-scaled down as far as keeps the whole image at least ``need_hw`` when
    the file is still encoded and fast decode is on; with the (y, x) scale of what came back."""
    if not px.encoded or not fast_decode_enabled():
        return px.array(), 1.0, 1.0
    _, full_h, full_w = px.dims()
    arr = px.array(min_size=need_hw)
    return arr, arr.shape[0] / full_h, arr.shape[1] / full_w


def resize_pixels(px: Pixels, out, interpolation) -> Pixels | None:
    """``px`` resized to ``out`` (h, w), an undecoded JPEG decoded DCT-scaled when allowed;
    None when stock must do it (a filter or a size nanopatch does not reproduce)."""
    if fn._mode_value(interpolation) not in fn._PIL_FILTERS:
        return None
    arr, _, _ = scaled_decode(px, (out[0], out[1]))
    try:
        return px.with_array(fn.resize(arr, out, interpolation))
    except NotImplementedError:
        return None


def warn_antialias_ignored() -> None:
    """torchvision's warning for ``antialias=False`` on a PIL image."""
    warnings.warn(
        "Anti-alias option is always applied for PIL Image input. Argument antialias is ignored.", stacklevel=3
    )


def resize_center_crop_pixels(px: Pixels, out, interpolation, crop_size) -> Pixels | None:
    """``px`` resized to ``out`` (h, w), then centre-cropped to ``crop_size`` (h, w) as
    ``F.center_crop`` does, resizing only what the crop keeps (the same pixels as the two steps:
    ``functional.resize_crop``); an undecoded JPEG is decoded DCT-scaled when allowed. None when
    the steps must run one by one (a crop that pads, a filter nanopatch does not reproduce)."""
    out_h, out_w = int(out[0]), int(out[1])
    crop_h, crop_w = int(crop_size[0]), int(crop_size[1])
    if crop_h > out_h or crop_w > out_w or fn._mode_value(interpolation) not in fn._PIL_FILTERS:
        return None
    arr, _, _ = scaled_decode(px, (out_h, out_w))
    top, left = round((out_h - crop_h) / 2.0), round((out_w - crop_w) / 2.0)
    try:
        return px.with_array(fn.resize_crop(arr, (out_h, out_w), top, left, crop_h, crop_w, interpolation))
    except NotImplementedError:
        return None


@_entry
class Resize(_Fast, stock_class(_tv, "Resize")):
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


@_entry
class CenterCrop(_Fast, stock_class(_tv, "CenterCrop")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        return px.with_array(fn.center_crop(px.array(), self.size))


def _scaled_box(top, left, height, width, sy, sx, shape) -> tuple[int, int, int, int]:
    """A crop box in full-resolution coordinates, on an image decoded at (sy, sx) of it."""
    y0, y1 = round(top * sy), round((top + height) * sy)
    x0, x1 = round(left * sx), round((left + width) * sx)
    y0, x0 = min(max(y0, 0), shape[0] - 1), min(max(x0, 0), shape[1] - 1)
    return y0, x0, max(min(y1, shape[0]) - y0, 1), max(min(x1, shape[1]) - x0, 1)


def resized_crop_pixels(px: Pixels, top: int, left: int, height: int, width: int, size, interpolation) -> Pixels:
    """Crop a box given in full-resolution coordinates and resize it to ``size`` (h, w); an
    undecoded JPEG is decoded DCT-scaled as far as keeps the box at least ``size``."""
    out_h, out_w = size
    _, full_h, full_w = px.dims()
    need = (math.ceil(out_h * full_h / max(height, 1)), math.ceil(out_w * full_w / max(width, 1)))
    arr, sy, sx = scaled_decode(px, need)
    if (sy, sx) != (1.0, 1.0):
        top, left, height, width = _scaled_box(top, left, height, width, sy, sx, arr.shape)
    try:
        return px.with_array(fn.resized_crop(arr, top, left, height, width, [out_h, out_w], interpolation))
    except NotImplementedError:
        img = px.pil() if (sy, sx) == (1.0, 1.0) else fn.to_pil(arr)
        return px.with_pil(F.resized_crop(img, top, left, height, width, list(size), interpolation))


@_entry
class RandomResizedCrop(_Fast, stock_class(_tv, "RandomResizedCrop")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        # parameters in full-resolution coordinates: the same crop whatever scale decodes
        top, left, height, width = self.get_params(px.proxy(), self.scale, self.ratio)
        return resized_crop_pixels(px, top, left, height, width, self.size, self.interpolation)


@_entry
class RandomCrop(_Fast, stock_class(_tv, "RandomCrop")):
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


@_entry
class RandomHorizontalFlip(_Fast, stock_class(_tv, "RandomHorizontalFlip")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.rand(1) < self.p:
            return px.with_array(fn.hflip(px.array()))
        return px


@_entry
class RandomVerticalFlip(_Fast, stock_class(_tv, "RandomVerticalFlip")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.rand(1) < self.p:
            return px.with_array(fn.vflip(px.array()))
        return px


@_entry
class Pad(_Fast, stock_class(_tv, "Pad")):
    _pil_alone = False

    def _nanopatch_run(self, px: Pixels) -> Any:
        return on_array(px, fn.pad, F.pad, self.padding, self.fill, self.padding_mode)


@_entry
class RandomRotation(_Fast, stock_class(_tv, "RandomRotation")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        angle = self.get_params(self.degrees)
        return _pillow(px, F.rotate, angle, self.interpolation, self.expand, self.center, self.fill)


@_entry
class RandomAffine(_Fast, stock_class(_tv, "RandomAffine")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        _, height, width = px.dims()
        params = self.get_params(self.degrees, self.translate, self.scale, self.shear, [width, height])
        return _pillow(px, F.affine, *params, interpolation=self.interpolation, fill=self.fill, center=self.center)


@_entry
class GaussianBlur(_Fast, stock_class(_tv, "GaussianBlur")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        sigma = self.get_params(self.sigma[0], self.sigma[1])
        return on_array(px, fn.gaussian_blur, F.gaussian_blur, self.kernel_size, [sigma, sigma])


# --- colour --------------------------------------------------------------------------------


@_entry
class ColorJitter(_Fast, stock_class(_tv, "ColorJitter")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        order, brightness, contrast, saturation, hue = self.get_params(
            self.brightness, self.contrast, self.saturation, self.hue
        )
        return jitter_pixels(px, order, (brightness, contrast, saturation, hue))


def jitter_pixels(px: Pixels, order, factors) -> Pixels:
    """ColorJitter's adjustments (brightness, contrast, saturation, hue ``factors``, None for
    one left out) in ``order``; stock's PIL ops when the fused kernel declines."""
    order = [int(i) for i in order]
    try:
        return px.with_array(fn.color_jitter(px.array(), order, *factors))
    except NotImplementedError:
        img = px.pil()
        ops = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
        for index in order:
            if factors[index] is not None:
                img = ops[index](img, factors[index])
        return px.with_pil(img)


@_entry
class Grayscale(_Fast, stock_class(_tv, "Grayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return on_array(px, fn.rgb_to_grayscale, F.rgb_to_grayscale, num_output_channels=self.num_output_channels)


@_entry
class RandomGrayscale(_Fast, stock_class(_tv, "RandomGrayscale")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        channels = px.dims()[0]
        if torch.rand(1) < self.p:
            return on_array(px, fn.rgb_to_grayscale, F.rgb_to_grayscale, num_output_channels=channels)
        return px


# --- to tensor -----------------------------------------------------------------------------


@_entry
class ToTensor(_Fast, stock_class(_tv, "ToTensor")):
    def _takes_array(self, arr: np.ndarray) -> bool:
        # stock's torch.from_numpy warns on a read-only array and refuses negative strides: stock's then
        return arr.flags.writeable and min(arr.strides, default=0) >= 0

    def _nanopatch_run(self, px: Pixels) -> Any:
        if torch.get_default_dtype() != torch.float32:
            return self._stock_call(px.output())
        return fn.to_tensor(px.array())


@_entry
class PILToTensor(_Fast, stock_class(_tv, "PILToTensor")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        return fn.pil_to_tensor(px.array())


@_entry
class Normalize(_Fast, stock_class(_tv, "Normalize")):
    # Normalize works on tensors only (stock raises TypeError otherwise); after ToTensor in a
    # Compose the two fuse into one pass.

    def _nanopatch_run(self, px: Pixels) -> Any:
        return self._stock_call(px.output())


def _levels_image(channels: int):
    """A 256x2 "L" or "RGB" PIL image holding each of the 256 levels in every channel."""
    from PIL import Image

    levels = np.tile(np.arange(256, dtype=np.uint8), (2, 1))
    return Image.fromarray(levels if channels == 1 else np.repeat(levels[:, :, None], 3, axis=2))


class FusedToFloat:
    """A conversion to tensor (ToTensor, PILToTensor, v2's ToImage) and the elementwise float
    steps after it (ConvertImageDtype / ToDtype(float32, scale=True), Normalize) as one table
    lookup per pixel.

    The table, the result's type (tensor or ``tv_tensors.Image``) and its memory layout come
    from stock's own steps run once on an image of the 256 levels, so every value is what stock
    computes. When that run does not give a float32 image of the input's shape (a std of zero,
    3 means for 1 channel, another default dtype) the steps run unfused, with stock's errors.
    """

    _SETTINGS = ("dtype", "scale", "mean", "std")

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self._references: dict[tuple, tuple[np.ndarray, bool, type] | None] = {}

    def _reference(self, channels: int) -> tuple[np.ndarray, bool, type] | None:
        # keyed by the steps' settings too, so a user who changes them later gets a new table
        settings = tuple(repr(getattr(step, name, None)) for step in self.steps for name in self._SETTINGS)
        key = (channels, torch.get_default_dtype(), settings)
        if key in self._references:
            return self._references[key]
        found = None
        try:
            value = self.steps[0]._stock_call(_levels_image(channels))
            for step in self.steps[1:]:
                value = step(value)
        except Exception:  # stock's error is raised again by the unfused steps
            value = None
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.shape == (channels, 2, 256):
            table = value[:, 0, :].numpy().astype(np.float32, copy=True)
            found = (table, channels > 1 and not value.is_contiguous(), type(value))
        self._references[key] = found
        return found

    def _nanopatch_run(self, px: Pixels) -> Any:
        found = self._reference(px.dims()[0])
        if found is None:
            return run_steps(self.steps, px)
        table, channels_last, kind = found
        out = fn.lookup(px.array(), table, channels_last=channels_last)
        return out if kind is torch.Tensor else out.as_subclass(kind)


# --- containers ----------------------------------------------------------------------------


@_entry
class RandomApply(_Fast, stock_class(_tv, "RandomApply")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        if self.p < torch.rand(1):
            return px
        return run_steps(self.transforms, px)


@_entry
class RandomOrder(_Fast, stock_class(_tv, "RandomOrder")):
    def _nanopatch_run(self, px: Pixels) -> Any:
        order = list(range(len(self.transforms)))
        random.shuffle(order)
        return run_steps([self.transforms[i] for i in order], px)


@_entry
class RandomChoice(_Fast, stock_class(_tv, "RandomChoice")):
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


class Planned:
    """A Compose that plans its steps once (again only when its list of steps changes): the
    subclass's ``_fuse(steps, i)`` says how many steps from ``i`` fuse into one, and into what."""

    transforms: Any

    def _fuse(self, steps: list[Any], i: int) -> tuple[Any, int] | None:  # pragma: no cover - overridden
        return None

    def _plan(self) -> list[Any]:
        key = tuple(map(id, self.transforms))
        cached = self.__dict__.get("_nanopatch_plan")
        if cached is not None and cached[0] == key:
            return cached[1]
        steps = list(self.transforms)
        plan: list[Any] = []
        i = 0
        while i < len(steps):
            fused = self._fuse(steps, i)
            if fused is None:
                plan.append(steps[i])
                i += 1
            else:
                plan.append(fused[0])
                i += fused[1]
        self.__dict__["_nanopatch_plan"] = (key, plan)
        return plan

    def _nanopatch_run(self, px: Pixels) -> Any:
        return run_steps(self._plan(), px)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_nanopatch_plan", None)  # rebuilt on first use
        return state


@_entry
class Compose(Planned, _Fast, stock_class(_tv, "Compose")):
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
    """torchvision's ``autoaugment._apply_op`` on Pixels: the same functional op with the same
    arguments, on the ndarray kernels (stock's PIL op when a kernel declines)."""
    if op_name in ("ShearX", "ShearY", "TranslateX", "TranslateY"):
        shear = math.degrees(math.atan(magnitude))
        kwargs = {"angle": 0.0, "translate": [0, 0], "scale": 1.0, "shear": [0.0, 0.0]}
        kwargs.update(interpolation=interpolation, fill=fill)
        if op_name == "ShearX":
            kwargs.update(shear=[shear, 0.0], center=[0, 0])
        elif op_name == "ShearY":
            kwargs.update(shear=[0.0, shear], center=[0, 0])
        elif op_name == "TranslateX":
            kwargs.update(translate=[int(magnitude), 0])
        else:
            kwargs.update(translate=[0, int(magnitude)])
        return _pillow(px, F.affine, **kwargs)
    if op_name == "Rotate":
        return _pillow(px, F.rotate, magnitude, interpolation=interpolation, fill=fill)
    factor_ops = {
        "Brightness": (fn.adjust_brightness, F.adjust_brightness),
        "Color": (fn.adjust_saturation, F.adjust_saturation),
        "Contrast": (fn.adjust_contrast, F.adjust_contrast),
        "Sharpness": (fn.adjust_sharpness, F.adjust_sharpness),
    }
    if op_name in factor_ops:
        return on_array(px, *factor_ops[op_name], 1.0 + magnitude)
    if op_name == "Posterize":
        return on_array(px, fn.posterize, F.posterize, int(magnitude))
    if op_name == "Solarize":
        return on_array(px, fn.solarize, F.solarize, magnitude)
    plain_ops = {"AutoContrast": (fn.autocontrast, F.autocontrast), "Equalize": (fn.equalize, F.equalize)}
    plain_ops["Invert"] = (fn.invert, F.invert)
    if op_name in plain_ops:
        return on_array(px, *plain_ops[op_name])
    if op_name == "Identity":
        return px
    raise ValueError(f"The provided operator {op_name} is not recognized.")


@_entry
class AutoAugment(_Fast, stock_class(_tv_autoaugment, "AutoAugment")):
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


@_entry
class RandAugment(_Fast, stock_class(_tv_autoaugment, "RandAugment")):
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


@_entry
class TrivialAugmentWide(_Fast, stock_class(_tv_autoaugment, "TrivialAugmentWide")):
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
