"""The machinery the v1 (``transforms``) and v2 (``transforms_v2``) classes share.

* :class:`Fast`, the mixin of every nanopatch transform: a lone PIL image, a dataset's file or
  in-memory pixels run the class's ``_nanopatch_run`` on :class:`~._pixels.Pixels`; anything else
  (tensors, several inputs, other PIL modes, a user's ndarray unless the class takes one) runs
  stock's own call. :func:`entry` routes a class's calls through it.
* Running steps on Pixels (:func:`run_step`, :func:`run_steps`, :func:`finish`), and the
  operations both versions call: resize and resized crop with the DCT-scaled decode, colour
  jitter, a kernel with stock's PIL op as its fallback (:func:`on_array`).
* :class:`Planned`, a Compose that plans its steps once, and :class:`FusedToFloat`, a conversion
  to tensor and the float steps after it as one table lookup.
* The auto-augment policies' colour ops on the kernels, one table and one rule for v1 and v2.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np
import torch
import torchvision.transforms.functional as F

from nanopatch.engine import config
from nanopatch.foundation import usage

from . import decode as _decode
from . import functional as fn
from ._originals import context, original
from ._pixels import Pixels
from .datasets import ACCEPTS_ENCODED


def stock_class(module, name: str) -> type:
    """torchvision's own class ``name`` of ``module`` (the engine's record when it is replaced)."""
    return original(module, name)


def fast_decode_enabled() -> bool:
    """The ``fast_decode`` option in force (the environment's, in a process never patched)."""
    ctx = context()
    if ctx is not None and ctx.config is not None:  # the vision target is applied (or applying)
        return ctx.config.fast_decode
    raw = os.environ.get(config.env_name("fast_decode"), "").strip()
    return True if not raw else config.parse_value("fast_decode", raw, " (from the environment)")


# --- the mixin -----------------------------------------------------------------------------


class Fast:
    """Mixin of every nanopatch transform: the entry point and the stock fallback."""

    #: the torchvision class this one subclasses (its first base outside nanopatch, set by :func:`entry`)
    _nanopatch_stock: type
    #: run the ndarray kernels for a lone call on a PIL image (where they beat Pillow)
    _pil_alone = True

    def _nanopatch_run(self, px: Pixels) -> Any:  # pragma: no cover - every class overrides it
        raise NotImplementedError

    def _takes_array(self, arr: np.ndarray) -> bool:
        """Whether this step runs nanopatch's kernels on a user's ndarray. Stock's classes refuse
        one (v1: ``TypeError``) or pass it through (v2), or hand it back untouched when a random
        draw skips the step; only v1's ndarray-taking ToTensor says yes. (Inside a Compose the
        pixels travel as ndarrays whatever this says: the caller gave a PIL image or a file.)"""
        return False

    def _nanopatch_tensor(self, image: torch.Tensor) -> Any:
        """The step on a lone image tensor, where a class has faster kernels with stock's values
        for it (v2's ColorJitter on uint8); NotImplemented runs stock's call."""
        return NotImplemented

    def _nanopatch_call(self, *args, **kwargs):
        if args and isinstance(args[0], torch.Tensor):  # no Pixels for a tensor: straight on
            run = type(self)._nanopatch_tensor
            if len(args) == 1 and not kwargs and run is not Fast._nanopatch_tensor:
                done = run(self, args[0])
                if done is not NotImplemented:
                    usage.record("transforms")
                    return done
            return self._stock_call(*args, **kwargs)
        px = Pixels.accept(args[0]) if len(args) == 1 and not kwargs else None
        if (
            px is None
            or (px.is_pil_image and not self._pil_alone)
            or (px.domain == "array" and not self._takes_array(args[0]))
        ):
            return self._stock_call(*args, **kwargs)
        usage.record("transforms")
        return finish(self._nanopatch_run(px))

    def _stock_call(self, *args, **kwargs):
        stock = self._nanopatch_stock
        call = stock.forward if issubclass(stock, torch.nn.Module) else stock.__call__
        return call(self, *args, **kwargs)

    def __prepare_scriptable__(self):
        """``torch.jit.script`` compiles stock: v2's own answer (the v1 transform it scripts
        as), for v1 a copy of this object as the stock class."""
        stock = self._nanopatch_stock
        prepare = getattr(stock, "__prepare_scriptable__", None)
        if prepare is not None:
            return prepare(self)
        clone = stock.__new__(stock)
        clone.__dict__.update(self.__dict__)
        return clone


# datasets may hand a nanopatch transform an undecoded file (see datasets.ACCEPTS_ENCODED)
setattr(Fast, ACCEPTS_ENCODED, True)


def entry(cls):
    """Bind ``cls`` to the torchvision class it stands in for (its first base outside nanopatch:
    class structure, not a store of originals), give it that class's documentation, and route
    its calls (an nn.Module's ``forward``, a plain class's ``__call__``) through the mixin."""
    stock = next(base for base in cls.__mro__[1:] if not base.__module__.startswith("nanopatch."))
    cls._nanopatch_stock = stock
    cls.__doc__ = stock.__doc__
    if issubclass(stock, torch.nn.Module):
        cls.forward = Fast._nanopatch_call
    else:
        cls.__call__ = Fast._nanopatch_call
    return cls


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


def pillow(px: Pixels, stock_op, *args, **kwargs) -> Pixels:
    """Stock's own op on the PIL image stock would hold here (rotations, affine warps, and the
    colour ops where Pillow is faster)."""
    return px.with_pil(stock_op(px.pil(), *args, **kwargs))


def on_array(px: Pixels, kernel, stock_op, *args, **kwargs) -> Pixels:
    """``kernel(array, *args)`` on the pixels, or stock's PIL op when the kernel declines."""
    try:
        return px.with_array(kernel(px.array(), *args, **kwargs))
    except NotImplementedError:
        return px.with_pil(stock_op(px.pil(), *args, **kwargs))


# --- resize --------------------------------------------------------------------------------


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
    if not fn.is_pil_filter(interpolation):
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


def center_crop_pixels(px: Pixels, size) -> Pixels:
    """``F.center_crop`` of ``px`` to ``size`` (h, w). On an undecoded file a crop inside the
    image decodes its box only (``Pixels.box``: the very pixels of the whole decode cut there;
    it saves work where the crop-aware decoder is on, libjpeg-turbo 3), at stock's anchor
    ``int(round((side - crop) / 2.0))``; a crop that pads goes through ``fn.center_crop``."""
    _, height, width = px.dims()
    crop_h, crop_w = int(size[0]), int(size[1])
    if px.encoded and 0 < crop_h <= height and 0 < crop_w <= width:
        top, left = round((height - crop_h) / 2.0), round((width - crop_w) / 2.0)
        return px.with_array(px.box((top, left, crop_h, crop_w)))
    return px.with_array(fn.center_crop(px.array(), size))


def resized_crop_pixels(px: Pixels, top: int, left: int, height: int, width: int, size, interpolation) -> Pixels:
    """Crop a box given in full-resolution coordinates and resize it to ``size`` (h, w); an
    undecoded JPEG is decoded DCT-scaled as far as keeps the box at least ``size`` (when fast
    decode is on), and only the box is decoded where the decoder can (``decode.decode``'s
    ``box``: the very pixels of the whole decode cut there, so this is exact either way)."""
    out_h, out_w = size
    _, full_h, full_w = px.dims()
    need = (math.ceil(out_h * full_h / max(height, 1)), math.ceil(out_w * full_w / max(width, 1)))
    box = (int(top), int(left), int(height), int(width))
    if (
        px.encoded
        and fn.is_pil_filter(interpolation)
        and box[2] > 0
        and box[3] > 0
        and box[0] >= 0
        and box[1] >= 0
        and box[0] + box[2] <= full_h
        and box[1] + box[3] <= full_w
    ):
        pixels = px.box(box, need if fast_decode_enabled() else None)
        try:
            return px.with_array(fn.resize(pixels, [out_h, out_w], interpolation))
        except NotImplementedError:
            pass  # the steps below decide (and decode again: a size the kernels do not take)
    arr, sy, sx = scaled_decode(px, need)
    if (sy, sx) != (1.0, 1.0):
        top, left, height, width = _decode.scaled_box((top, left, height, width), (full_h, full_w), arr.shape[:2])
    try:
        return px.with_array(fn.resized_crop(arr, top, left, height, width, [out_h, out_w], interpolation))
    except NotImplementedError:
        img = px.pil() if (sy, sx) == (1.0, 1.0) else fn.to_pil(arr)
        return px.with_pil(F.resized_crop(img, top, left, height, width, list(size), interpolation))


# --- colour --------------------------------------------------------------------------------


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


#: The auto-augment policies' colour ops on nanopatch's kernels: op -> (kernel, its arguments
#: from the magnitude as v1's ``_apply_op`` passes it; v2 scales Solarize's to levels first).
AUGMENT_KERNELS = {
    "Brightness": (fn.adjust_brightness, lambda m: (1.0 + m,)),
    "Color": (fn.adjust_saturation, lambda m: (1.0 + m,)),
    "Contrast": (fn.adjust_contrast, lambda m: (1.0 + m,)),
    "Sharpness": (fn.adjust_sharpness, lambda m: (1.0 + m,)),
    "Posterize": (fn.posterize, lambda m: (int(m),)),
    "Solarize": (fn.solarize, lambda m: (m,)),
    "AutoContrast": (fn.autocontrast, lambda m: ()),
    "Equalize": (fn.equalize, lambda m: ()),
    "Invert": (fn.invert, lambda m: ()),
}
_NEVER = 1 << 62
_SMALL = 160 * 160
#: On a PIL image not converted yet (a lone call, or after a step that left one), Pillow beats
#: the kernel plus the conversions to an ndarray and back below this many pixels, for an "L"
#: and an "RGB" image. On pixels already in an ndarray (inside a Compose) the kernels run.
_PILLOW_BELOW = {
    "Brightness": (_NEVER, _NEVER),
    "Color": (_NEVER, _NEVER),
    "Contrast": (256 * 256, 256 * 256),
    "Sharpness": (_SMALL, 96 * 96),
    "Posterize": (192 * 192, 0),
    "Solarize": (_SMALL, 0),
    "AutoContrast": (_SMALL, 0),
    "Equalize": (0, _NEVER),
    "Invert": (_SMALL, 0),
}


def on_kernel(op: str, px: Pixels) -> bool:
    """Whether the policies' ``op`` runs on nanopatch's kernel for these pixels (where it is
    faster than Pillow)."""
    if op not in AUGMENT_KERNELS:
        return False
    if not px.is_pil_image:
        return True
    channels, height, width = px.dims()
    return height * width >= _PILLOW_BELOW[op][channels == 3]


def augment_kernel(px: Pixels, op: str, magnitude: float) -> Pixels | None:
    """An auto-augment colour op on nanopatch's kernel; None where the policy's stock op runs
    instead: another op, a PIL image on which Pillow is faster, or a kernel that declines."""
    if not on_kernel(op, px):
        return None
    kernel, arguments = AUGMENT_KERNELS[op]
    try:
        return px.with_array(kernel(px.array(), *arguments(magnitude)))
    except NotImplementedError:
        return None


# --- fused conversion to float -------------------------------------------------------------


def _levels_image(channels: int):
    """A 256x2 "L" or "RGB" PIL image holding each of the 256 levels in every channel."""
    from PIL import Image

    levels = np.tile(np.arange(256, dtype=np.uint8), (2, 1))
    return Image.fromarray(levels if channels == 1 else np.repeat(levels[:, :, None], 3, axis=2))


def settings_of(steps: list[Any], names: tuple[str, ...]) -> list[tuple[Any, str]]:
    """The (step, setting name) pairs of ``names`` each step has, found once (looking a missing
    one up on a module raises and catches an AttributeError inside, at every call)."""
    return [(step, name) for step in steps for name in names if hasattr(step, name)]


def _setting(value: Any) -> Any:
    """A step's setting as part of a cache key, compared by value: plain values as they are,
    a list of numbers (Normalize's mean and std) as a tuple, anything else by its repr."""
    if value is None or isinstance(value, (bool, int, float, torch.dtype)):
        return value
    if isinstance(value, (list, tuple)) and all(type(v) in (int, float) for v in value):
        return tuple(value)
    return repr(value)


def settings_key(fields: list[tuple[Any, str]]) -> tuple:
    """The current values of :func:`settings_of`'s settings, as a cache key: a user who changes
    a step's settings later gets a new table."""
    return tuple(_setting(getattr(step, name)) for step, name in fields)


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
        self._fields = settings_of(steps, self._SETTINGS)

    def _reference(self, channels: int) -> tuple[np.ndarray, bool, type] | None:
        # keyed by the steps' settings too, so a user who changes them later gets a new table
        settings = settings_key(self._fields)
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


class Planned:
    """A Compose that plans its steps once (again only when its list of steps changes): the
    subclass's ``_fuse(steps, i)`` says how many steps from ``i`` fuse into one, and into what."""

    transforms: Any

    def _fuse(self, steps: list[Any], i: int) -> tuple[Any, int] | None:  # pragma: no cover - overridden
        return None

    def _plan(self, fuse=None, slot: str = "_nanopatch_plan") -> list[Any]:
        """The steps with runs of them fused by ``fuse(steps, i)`` (default: ``self._fuse``),
        cached in the instance's ``slot`` until the list of steps changes."""
        fuse = self._fuse if fuse is None else fuse
        key = tuple(map(id, self.transforms))
        cached = self.__dict__.get(slot)
        if cached is not None and cached[0] == key:
            return cached[1]
        steps = list(self.transforms)
        plan: list[Any] = []
        i = 0
        while i < len(steps):
            fused = fuse(steps, i)
            if fused is None:
                plan.append(steps[i])
                i += 1
            else:
                plan.append(fused[0])
                i += fused[1]
        self.__dict__[slot] = (key, plan)
        return plan

    def _nanopatch_run(self, px: Pixels) -> Any:
        return run_steps(self._plan(), px)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_nanopatch_plan", None)  # rebuilt on first use
        state.pop("_nanopatch_tensor_plan", None)
        return state
