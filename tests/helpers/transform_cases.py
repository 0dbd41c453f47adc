"""Seeded random transforms and images for the torchvision.transforms parity tests.

A :class:`Recipe` names a ``torchvision.transforms`` class and its constructor arguments (nested
recipes for containers); ``build(stock=True)`` makes torchvision's own object and
``build(stock=False)`` nanopatch's (the class ``torchvision.transforms`` holds while patched), so
both sides get identical arguments. Its ``repr`` is Python that builds the same transform, so
a failure message says exactly what to run.

Stock objects are built from the ``_nanopatch_stock`` class rather than under
``nanopatch.unpatched()`` (which undoes and reapplies the patch at every switch): torchvision's
v1 transforms never look a transform class up at call time, so a stock object runs stock code
whatever the patch state.
"""

from __future__ import annotations

import dataclasses
import enum
import random
import warnings
import zlib
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode

# --- what nanopatch replaces ---------------------------------------------------------------

REPLACED = [
    "Compose",
    "Resize",
    "CenterCrop",
    "RandomCrop",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "Pad",
    "ColorJitter",
    "Grayscale",
    "RandomGrayscale",
    "RandomRotation",
    "RandomAffine",
    "GaussianBlur",
    "ToTensor",
    "PILToTensor",
    "Normalize",
    "RandomApply",
    "RandomChoice",
    "RandomOrder",
    "AutoAugment",
    "RandAugment",
    "TrivialAugmentWide",
    "RandomInvert",
    "RandomPosterize",
    "RandomSolarize",
    "RandomAdjustSharpness",
    "RandomAutocontrast",
    "RandomEqualize",
]

#: The classes that resample (geometry): each gets one 4000x3000 case.
GEOMETRIC = [
    "Resize",
    "CenterCrop",
    "RandomCrop",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "Pad",
    "RandomRotation",
    "RandomAffine",
    "GaussianBlur",
]

#: Steps within one grey level of stock's rather than exact: blur (float32 sums in another
#: order) and the bilinear resizes (torch's 16-bit weights for one pass). Every other step,
#: replaced or stock, must give stock's pixels exactly: crops, flips, pads, the other filters,
#: the colour kernels (hue included), and rotations and affine warps (Pillow's own call).
INEXACT = {"GaussianBlur"}
#: The replaced resizing classes and the position of ``interpolation`` among their arguments.
RESIZERS = {"Resize": 1, "RandomResizedCrop": 3}

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

NEAREST, BILINEAR, BICUBIC = InterpolationMode.NEAREST, InterpolationMode.BILINEAR, InterpolationMode.BICUBIC
ALL_MODES = [
    NEAREST,
    InterpolationMode.NEAREST_EXACT,
    BILINEAR,
    BICUBIC,
    InterpolationMode.BOX,
    InterpolationMode.HAMMING,
    InterpolationMode.LANCZOS,
]
#: What Pillow's rotate/affine accept (stock raises for the others on a PIL image).
WARP_MODES = [NEAREST, BILINEAR, BICUBIC]


def stable_seed(*parts: object) -> int:
    """A seed from names (Python's hash() is salted per process)."""
    return zlib.crc32(repr(parts).encode())


# --- tolerances ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tol:
    """Per-channel bounds on |ours - stock| in grey levels (0..255)."""

    max: float
    mean: float | None

    def __add__(self, other: Tol) -> Tol:
        mean = None if self.mean is None or other.mean is None else self.mean + other.mean
        return Tol(self.max + other.max, mean)

    @property
    def exact(self) -> bool:
        return self.max == 0


EXACT_TOL = Tol(0, 0)
#: The issue's tolerance for geometric and colour transforms on uint8 images.
DEFAULT_TOL = Tol(1, 0.5)
#: Hue: torchvision's own tolerance for adjust_hue against PIL, ``tol=16.1, agg_method="max"`` in
#: pytorch/vision test/test_functional_tensor.py::test_adjust_hue and for ColorJitter(hue=...) in
#: test/test_transforms_tensor.py (TestColorJitter, ``_test_class_op(..., tol=16.1,
#: agg_method="max")``). It bounds the maximum only.
HUE_TOL = Tol(16.1, None)

#: A pipeline's maximum where ColorJitter (without, with hue) follows a step within one level of
#: stock's: its blends amplify that level (derived in test_transforms_parity.py,
#: JITTER_PIPELINE_TOL).
AMPLIFIED_MAX = {False: 8, True: 1 + HUE_TOL.max}

#: The mean bound is a statistic: below this many pixels per channel a single pixel off by one
#: decides it, so only the maximum is checked there.
MEAN_MIN_PIXELS = 100


# --- images --------------------------------------------------------------------------------


def make_array(rng: np.random.Generator, height: int, width: int, mode: str, content: str) -> np.ndarray:
    """uint8 pixels: (H, W) for "L", (H, W, 3) for "RGB"; "noise" or "smooth" (photo-like:
    low-frequency shading with a few hard edges)."""
    channels = 3 if mode == "RGB" else 1
    if content == "noise":
        arr = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    else:
        small_h, small_w = max(2, height // 24 + 2), max(2, width // 24 + 2)
        coarse = rng.integers(0, 256, (small_h, small_w, channels), dtype=np.uint8)
        planes = [
            np.asarray(Image.fromarray(coarse[:, :, c]).resize((width, height), Image.BICUBIC)) for c in range(channels)
        ]
        arr = np.stack(planes, axis=2)
        for _ in range(2):  # hard edges: a flat rectangle
            y0, x0 = int(rng.integers(0, height)), int(rng.integers(0, width))
            y1, x1 = y0 + int(rng.integers(1, height + 1)), x0 + int(rng.integers(1, width + 1))
            arr[y0:y1, x0:x1] = rng.integers(0, 256, channels, dtype=np.uint8)
        # a little sensor noise keeps it from being piecewise flat
        arr = np.clip(arr.astype(np.int16) + rng.integers(-3, 4, arr.shape), 0, 255).astype(np.uint8)
    return arr[:, :, 0] if channels == 1 else arr


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    height: int
    width: int
    mode: str = "RGB"
    content: str = "smooth"
    seed: int = 0

    def array(self) -> np.ndarray:
        return make_array(np.random.default_rng(self.seed), self.height, self.width, self.mode, self.content)

    def pil(self) -> Image.Image:
        img = Image.fromarray(self.array())
        assert img.mode == self.mode
        return img

    def __repr__(self) -> str:
        return f"ImageSpec({self.height}, {self.width}, {self.mode!r}, {self.content!r}, seed={self.seed})"


def random_hw(rng: np.random.Generator) -> tuple[int, int]:
    """Mostly small sizes, odd ones, 1x1, 1xN and Nx1, now and then a few hundred pixels."""
    pick = rng.random()
    if pick < 0.06:
        return 1, 1
    if pick < 0.14:
        return 1, int(rng.integers(2, 400))
    if pick < 0.22:
        return int(rng.integers(2, 400)), 1
    if pick < 0.30:
        return int(rng.integers(2, 6)), int(rng.integers(2, 6))
    if pick < 0.90:
        return int(rng.integers(5, 80)), int(rng.integers(5, 80))
    return int(rng.integers(100, 420)), int(rng.integers(100, 420))


def random_image(rng: np.random.Generator, modes=("RGB", "L")) -> ImageSpec:
    height, width = random_hw(rng)
    mode = modes[int(rng.integers(len(modes)))]
    content = "noise" if rng.random() < 0.4 else "smooth"
    return ImageSpec(height, width, mode, content, int(rng.integers(2**31)))


# --- recipes -------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, enum.Enum):  # InterpolationMode, AutoAugmentPolicy
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, list):
        return f"[{', '.join(map(_fmt, value))}]"
    if isinstance(value, tuple):
        return f"({', '.join(map(_fmt, value))}{',' if len(value) == 1 else ''})"
    return repr(value)


@dataclasses.dataclass
class Recipe:
    """``T.<name>(*args, **kwargs)``, with any Recipe inside the arguments built the same way.

    ``args`` may hold a ``ModuleListOf`` marker: a list of recipes built into a ModuleList."""

    name: str
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)

    def build(self, *, stock: bool) -> Any:
        import torchvision.transforms as T

        cls = getattr(T, self.name, None)
        if cls is None:
            from torchvision.transforms import autoaugment

            cls = getattr(autoaugment, self.name)
        if stock:
            cls = cls.__dict__.get("_nanopatch_stock", cls)
            assert not cls.__module__.startswith("nanopatch"), cls
        elif self.name in REPLACED:
            assert cls.__module__ == "nanopatch.targets.vision.transforms", f"{self.name} is not patched: {cls}"
        args = [_build(a, stock) for a in self.args]
        kwargs = {k: _build(v, stock) for k, v in self.kwargs.items()}
        return cls(*args, **kwargs)

    def children(self) -> list[Recipe]:
        found = []
        for value in [*self.args, *self.kwargs.values()]:
            found.extend(_recipes_in(value))
        return found

    def tolerance(self) -> Tol:
        """How far ours may be from stock on uint8 pixels: a step's own tolerance; for a
        container, the sum over its steps (each inexact step may add its own rounding), except
        that a ColorJitter after an inexact step amplifies that step's difference: the maximum
        is then ``AMPLIFIED_MAX`` (the mean bound stays the sum of the steps' own)."""
        kids = self.children()
        if not kids:
            return DEFAULT_TOL if self.name in INEXACT or self._bilinear() else EXACT_TOL
        total = EXACT_TOL
        hue = None  # whether a ColorJitter (with hue) follows an inexact step
        for kid in kids:
            if not total.exact and kid.jitters() is not None:
                hue = bool(hue) or kid.jitters()
            total = total + kid.tolerance()
        if self.name not in ("Compose", "RandomApply") and not total.exact and self.jitters() is not None:
            hue = self.jitters()  # RandomOrder, RandomChoice: any order
        return total if hue is None else Tol(AMPLIFIED_MAX[hue], total.mean)

    def _bilinear(self) -> bool:
        if self.name not in RESIZERS:
            return False
        position = RESIZERS[self.name]
        mode = self.kwargs.get("interpolation", self.args[position] if len(self.args) > position else BILINEAR)
        return mode in (BILINEAR, 2)

    def jitters(self) -> bool | None:
        """None without a ColorJitter in it, else whether one of them shifts hue."""
        if self.name == "ColorJitter":
            return _hue_on(self.kwargs.get("hue", self.args[3] if len(self.args) > 3 else 0))
        found = [kid.jitters() for kid in self.children()]
        found = [f for f in found if f is not None]
        return any(found) if found else None

    def levels(self, tensor: torch.Tensor) -> torch.Tensor:
        """A float output of this pipeline back in grey levels (undoing a final Normalize)."""
        last = self
        while last.name == "Compose" and last.args and last.args[0]:
            last = last.args[0][-1]
        t = tensor.double()
        if last.name == "Normalize":
            args = dict(zip(("mean", "std"), last.args, strict=False)) | last.kwargs
            mean = torch.as_tensor(args["mean"], dtype=torch.double)
            std = torch.as_tensor(args["std"], dtype=torch.double)
            t = t * std.view(-1, 1, 1) + mean.view(-1, 1, 1)
        return t * 255 if tensor.is_floating_point() else t

    def __repr__(self) -> str:
        parts = [_fmt(a) for a in self.args] + [f"{k}={_fmt(v)}" for k, v in self.kwargs.items()]
        return f"T.{self.name}({', '.join(parts)})"


class ModuleListOf(list):
    """A list of recipes to be built into a ``torch.nn.ModuleList``."""

    def __repr__(self) -> str:
        return f"torch.nn.ModuleList([{', '.join(map(repr, self))}])"


def _build(value: Any, stock: bool) -> Any:
    if isinstance(value, Recipe):
        return value.build(stock=stock)
    if isinstance(value, ModuleListOf):
        return torch.nn.ModuleList([_build(v, stock) for v in value])
    if isinstance(value, list):
        return [_build(v, stock) for v in value]
    return value


def _recipes_in(value: Any) -> list[Recipe]:
    if isinstance(value, Recipe):
        return [value]
    if isinstance(value, list):
        return [r for v in value for r in _recipes_in(v)]
    return []


def _hue_on(hue) -> bool:
    if isinstance(hue, (tuple, list)):
        return tuple(hue) != (0, 0)
    return hue != 0


def R(name: str, *args: Any, **kwargs: Any) -> Recipe:
    return Recipe(name, args, kwargs)


# --- random constructor arguments ------------------------------------------------------------


def _choice(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _p(rng: np.random.Generator) -> float:
    """A Random*'s probability: often the edges, often one half."""
    return _choice(rng, [0.0, 0.5, 0.5, 0.5, 1.0, _u(rng, 0, 1)])


def _u(rng: np.random.Generator, low: float, high: float, digits: int = 3) -> float:
    return round(float(rng.uniform(low, high)), digits)


def _interpolation(rng: np.random.Generator, modes) -> Any:
    mode = _choice(rng, modes)
    if rng.random() < 0.1:  # the old int codes (stock converts them)
        codes = {NEAREST: 0, BILINEAR: 2, BICUBIC: 3}
        return codes.get(mode, mode)
    return mode


def _fill(rng: np.random.Generator) -> Any:
    pick = rng.random()
    if pick < 0.4:
        return 0
    if pick < 0.7:
        return int(rng.integers(0, 256))
    if pick < 0.9:
        return tuple(int(v) for v in rng.integers(0, 256, 3))
    return [int(rng.integers(0, 256))]


def _size(rng: np.random.Generator, low: int = 1, high: int = 48) -> Any:
    pick = rng.random()
    if pick < 0.45:
        return int(rng.integers(low, high))
    if pick < 0.9:
        return (int(rng.integers(low, high)), int(rng.integers(low, high)))
    return [int(rng.integers(low, high))]


def _padding(rng: np.random.Generator) -> Any:
    pick = rng.random()
    if pick < 0.4:
        return int(rng.integers(0, 12))
    if pick < 0.7:
        return (int(rng.integers(0, 12)), int(rng.integers(0, 12)))
    return [int(v) for v in rng.integers(0, 12, 4)]


def _factor(rng: np.random.Generator, *, hue: bool = False) -> Any:
    pick = rng.random()
    if hue:
        if pick < 0.3:
            return 0
        if pick < 0.7:
            return _u(rng, 0.0, 0.5)
        low = _u(rng, -0.5, 0.5)
        return (low, _u(rng, low, 0.5))
    if pick < 0.25:
        return 0
    if pick < 0.7:
        return _u(rng, 0.0, 1.0)
    low = _u(rng, 0.0, 1.5)
    return (low, _u(rng, low, 2.0))


def _degrees(rng: np.random.Generator) -> Any:
    if rng.random() < 0.5:
        return _u(rng, 0, 180, 2)
    low = _u(rng, -180, 180, 2)
    return (low, _u(rng, low, 180, 2))


def _center(rng: np.random.Generator) -> Any:
    return None if rng.random() < 0.6 else [int(rng.integers(-5, 40)), int(rng.integers(-5, 40))]


def _odd(rng: np.random.Generator, high: int = 15) -> int:
    return int(rng.integers(0, high // 2 + 1)) * 2 + 1


def random_recipe(name: str, rng: np.random.Generator) -> Recipe:
    """Random constructor arguments for the class ``name`` (any argument stock accepts; a call
    may still raise, in which case ours must raise the same exception type)."""
    if name == "Resize":
        size = _size(rng, 1, 80)
        kwargs: dict[str, Any] = {"interpolation": _interpolation(rng, ALL_MODES)}
        if rng.random() < 0.3 and not (isinstance(size, tuple)):
            short = size if isinstance(size, int) else size[0]
            kwargs["max_size"] = short + int(rng.integers(1, 40))
        if rng.random() < 0.15:
            kwargs["antialias"] = bool(rng.random() < 0.5)
        return R("Resize", size, **kwargs)
    if name == "CenterCrop":
        return R("CenterCrop", _size(rng, 1, 90))
    if name == "RandomCrop":
        kwargs = {}
        if rng.random() < 0.5:
            kwargs["padding"] = _padding(rng)
        if rng.random() < 0.6:
            kwargs["pad_if_needed"] = True
        if rng.random() < 0.5:
            kwargs["fill"] = _fill(rng)
        kwargs["padding_mode"] = _choice(rng, ["constant", "edge", "reflect", "symmetric"])
        return R("RandomCrop", _size(rng, 1, 60), **kwargs)
    if name == "RandomResizedCrop":
        kwargs = {"interpolation": _interpolation(rng, ALL_MODES)}
        if rng.random() < 0.6:
            low = _u(rng, 0.02, 1.0)
            kwargs["scale"] = (low, _u(rng, low, 1.0))
        if rng.random() < 0.5:
            low = _u(rng, 0.3, 1.5)
            kwargs["ratio"] = (low, _u(rng, low, 3.0))
        return R("RandomResizedCrop", _size(rng, 1, 64), **kwargs)
    if name in ("RandomHorizontalFlip", "RandomVerticalFlip", "RandomGrayscale"):
        return R(name, p=_p(rng))
    if name in ("RandomInvert", "RandomAutocontrast", "RandomEqualize"):
        return R(name, p=_p(rng))
    if name == "RandomPosterize":  # 0 and 9: stock's error when the coin says go
        return R(name, int(rng.integers(0, 10)), p=_p(rng))
    if name == "RandomSolarize":
        threshold = _choice(rng, [0, 128, 255, 256, -3, _u(rng, 0, 300, 1), int(rng.integers(1, 255))])
        return R(name, threshold, p=_p(rng))
    if name == "RandomAdjustSharpness":
        return R(name, _choice(rng, [0.0, 1.0, 2.0, _u(rng, 0, 4)]), p=_p(rng))
    if name == "Pad":
        return R(
            "Pad",
            _padding(rng),
            fill=_fill(rng),
            padding_mode=_choice(rng, ["constant", "edge", "reflect", "symmetric"]),
        )
    if name == "ColorJitter":
        return R(
            "ColorJitter",
            brightness=_factor(rng),
            contrast=_factor(rng),
            saturation=_factor(rng),
            hue=_factor(rng, hue=True),
        )
    if name == "Grayscale":
        return R("Grayscale", num_output_channels=_choice(rng, [1, 3]))
    if name == "RandomRotation":
        kwargs = {"interpolation": _interpolation(rng, WARP_MODES), "expand": bool(rng.random() < 0.4)}
        kwargs["center"] = _center(rng)
        kwargs["fill"] = _fill(rng)
        return R("RandomRotation", _degrees(rng), **kwargs)
    if name == "RandomAffine":
        kwargs = {"interpolation": _interpolation(rng, WARP_MODES), "fill": _fill(rng)}
        if rng.random() < 0.5:
            kwargs["translate"] = (_u(rng, 0, 0.5), _u(rng, 0, 0.5))
        if rng.random() < 0.5:
            low = _u(rng, 0.4, 1.5)
            kwargs["scale"] = (low, _u(rng, low, 2.0))
        pick = rng.random()
        if pick < 0.25:
            kwargs["shear"] = _u(rng, 0, 45, 2)
        elif pick < 0.45:
            low = _u(rng, -40, 40, 2)
            kwargs["shear"] = (low, _u(rng, low, 45, 2))
        elif pick < 0.65:
            a, c = _u(rng, -30, 30, 2), _u(rng, -30, 30, 2)
            kwargs["shear"] = (a, _u(rng, a, 40, 2), c, _u(rng, c, 40, 2))
        kwargs["center"] = _center(rng)
        return R("RandomAffine", _degrees(rng), **kwargs)
    if name == "GaussianBlur":
        kernel = _odd(rng) if rng.random() < 0.5 else (_odd(rng), _odd(rng))
        if rng.random() < 0.5:
            sigma: Any = _u(rng, 0.1, 5.0)
        else:
            low = _u(rng, 0.1, 3.0)
            sigma = (low, _u(rng, low, 5.0))
        return R("GaussianBlur", kernel, sigma=sigma)
    if name in ("ToTensor", "PILToTensor"):
        return R(name)
    if name == "Normalize":
        channels = _choice(rng, [1, 3])
        mean = [_u(rng, 0, 1) for _ in range(channels)]
        std = [_u(rng, 0.05, 1) for _ in range(channels)]
        return R("Normalize", mean=mean, std=std, inplace=bool(rng.random() < 0.3))
    if name == "AutoAugment":
        from torchvision.transforms import AutoAugmentPolicy

        kwargs = {"policy": _choice(rng, list(AutoAugmentPolicy)), "interpolation": _choice(rng, [NEAREST, BILINEAR])}
        if rng.random() < 0.5:
            kwargs["fill"] = _choice(rng, [None, int(rng.integers(0, 256)), [int(v) for v in rng.integers(0, 256, 3)]])
        return R("AutoAugment", **kwargs)
    if name == "RandAugment":
        bins = int(rng.integers(2, 32))
        kwargs = {
            "num_ops": int(rng.integers(1, 4)),
            "magnitude": int(rng.integers(0, bins)),
            "num_magnitude_bins": bins,
            "interpolation": _choice(rng, [NEAREST, BILINEAR]),
        }
        if rng.random() < 0.5:
            kwargs["fill"] = _choice(rng, [None, int(rng.integers(0, 256)), [int(v) for v in rng.integers(0, 256, 3)]])
        return R("RandAugment", **kwargs)
    if name == "TrivialAugmentWide":
        kwargs = {"num_magnitude_bins": int(rng.integers(2, 32)), "interpolation": _choice(rng, [NEAREST, BILINEAR])}
        if rng.random() < 0.5:
            kwargs["fill"] = _choice(rng, [None, int(rng.integers(0, 256)), [int(v) for v in rng.integers(0, 256, 3)]])
        return R("TrivialAugmentWide", **kwargs)
    if name in ("RandomApply", "RandomChoice", "RandomOrder"):
        steps = [_leaf(rng) for _ in range(int(rng.integers(1, 4)))]
        if name == "RandomApply":
            listing: Any = ModuleListOf(steps) if rng.random() < 0.3 else steps
            return R("RandomApply", listing, p=_choice(rng, [0.0, 0.5, 1.0, _u(rng, 0, 1)]))
        if name == "RandomChoice":
            weights = [_u(rng, 0.1, 1.0) for _ in steps] if rng.random() < 0.5 else None
            return R("RandomChoice", steps, p=weights)
        return R("RandomOrder", steps)
    if name == "Compose":
        return random_pipeline(rng)
    raise KeyError(name)


#: Steps for containers and pipelines: each works on any "L"/"RGB" image of any size.
def _leaf(rng: np.random.Generator) -> Recipe:
    name = _choice(
        rng,
        [
            "RandomHorizontalFlip",
            "RandomVerticalFlip",
            "ColorJitter",
            "Grayscale",
            "RandomGrayscale",
            "Resize",
            "CenterCrop",
            "RandomResizedCrop",
            "GaussianBlur",
            "RandomRotation",
            "Pad",
            "RandomAffine",
        ],
    )
    recipe = random_recipe(name, rng)
    if name == "Grayscale":  # keep the mode (so a following step sees what it expects)
        recipe = R("Grayscale", num_output_channels=3)
    return recipe


def random_pipeline(rng: np.random.Generator) -> Recipe:
    """A Compose as people write them: crops and flips (exact), at most one resampling step, maybe
    a colour step, maybe a container, then maybe ToTensor (+ Normalize) or PILToTensor +
    ConvertImageDtype (+ Normalize)."""
    exact = ["RandomHorizontalFlip", "RandomVerticalFlip", "CenterCrop", "Pad"]
    steps = [random_recipe(_choice(rng, exact), rng) for _ in range(int(rng.integers(0, 3)))]
    if rng.random() < 0.8:
        resampler = _choice(rng, ["Resize", "RandomResizedCrop", "RandomRotation", "RandomAffine", "GaussianBlur"])
        steps.insert(int(rng.integers(0, len(steps) + 1)), random_recipe(resampler, rng))
    if rng.random() < 0.4:
        steps.append(random_recipe(_choice(rng, ["ColorJitter", "RandomGrayscale"]), rng))
    if rng.random() < 0.2:
        steps.append(random_recipe(_choice(rng, ["RandomApply", "RandomChoice", "RandomOrder"]), rng))
    tail = rng.random()
    if tail < 0.25:
        steps.append(R("ToTensor"))
    elif tail < 0.55:
        steps += [R("ToTensor"), R("Normalize", mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD))]
    elif tail < 0.7:
        steps += [
            R("PILToTensor"),
            R("ConvertImageDtype", torch.float32),
            R("Normalize", mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25]),
        ]
    return R("Compose", steps)


def needs_rgb(recipe: Recipe) -> bool:
    """A pipeline whose Normalize has three values: meant for RGB images."""
    if recipe.name == "Normalize":
        return len(recipe.kwargs.get("mean", [])) == 3
    return any(needs_rgb(kid) for kid in recipe.children())


# --- running and comparing -----------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None
    warnings: list = dataclasses.field(default_factory=list)
    torch_state: torch.Tensor | None = None
    random_state: Any = None


def run(transform: Any, value: Any, seed: int) -> Outcome:
    """``transform(value)`` after seeding torch and random with ``seed``: the result (or the
    exception), the warnings it gave and the RNG states after."""
    torch.manual_seed(seed)
    random.seed(seed)
    out = Outcome()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out.value = transform(value)
        except Exception as exc:
            out.error = exc
    out.warnings = [(w.category, str(w.message)) for w in caught]
    out.torch_state = torch.get_rng_state()
    out.random_state = random.getstate()
    return out


def pixels(value: Any) -> np.ndarray:
    """(H, W, C) of a PIL image or ndarray."""
    arr = np.asarray(value)
    return arr[:, :, None] if arr.ndim == 2 else arr


def diff_report(got: np.ndarray, expected: np.ndarray, tol: Tol) -> str | None:
    """None when every channel of ``got`` is within ``tol`` of ``expected`` ((H, W, C) arrays of
    grey levels: uint8, or floats carried back from tensors), else what is off."""
    if got.shape != expected.shape:
        return f"shape {got.shape} != stock's {expected.shape}"
    if got.size == 0 or (got.dtype == expected.dtype and np.array_equal(got, expected)):
        return None
    if got.dtype == expected.dtype == np.uint8:
        diff = np.maximum(got, expected) - np.minimum(got, expected)  # |got - expected| without overflow
        slack = 0.0
    else:
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        slack = 1e-3  # float outputs carried back to grey levels
    flat = diff.reshape(-1, diff.shape[-1])
    worst = flat.max(axis=0).astype(np.float64)
    mean = flat.mean(axis=0, dtype=np.float64)
    problems = []
    if (worst > tol.max + slack).any():
        where = np.unravel_index(int(diff.argmax()), diff.shape)
        problems.append(
            f"max |diff| per channel {worst.round(3).tolist()} > {tol.max} "
            f"(first worst at {tuple(map(int, where))}: ours {got[where]} stock {expected[where]})"
        )
    if tol.mean is not None and flat.shape[0] >= MEAN_MIN_PIXELS and (mean > tol.mean + slack).any():
        problems.append(f"mean |diff| per channel {mean.round(3).tolist()} > {tol.mean}")
    return "; ".join(problems) or None


def compare(
    ours: Outcome,
    stock: Outcome,
    recipe: Recipe,
    *,
    input_kind: str,
    check_warnings: bool = True,
    tol: Tol | None = None,
) -> str | None:
    """None when ``ours`` is what stock gives (same type, mode, size, pixels within the recipe's
    tolerance, same exception type, same RNG draws), else a description."""
    if stock.error is not None or ours.error is not None:
        if stock.error is None:
            return f"raised {ours.error!r}; stock returned {type(stock.value).__name__}"
        if ours.error is None:
            return f"returned {type(ours.value).__name__}; stock raised {stock.error!r}"
        if type(ours.error) is not type(stock.error):
            return f"raised {ours.error!r}; stock raised {stock.error!r}"
        return None
    problems = []
    nanopatch_warnings = [w for w in ours.warnings if w[0].__module__.startswith("nanopatch")]
    if nanopatch_warnings:
        problems.append(f"nanopatch warned {nanopatch_warnings}")
    if check_warnings and [w[0] for w in ours.warnings] != [w[0] for w in stock.warnings]:
        problems.append(f"warnings {ours.warnings} != stock's {stock.warnings}")
    if ours.torch_state is not None and not torch.equal(ours.torch_state, stock.torch_state):
        problems.append("torch RNG out of step with stock")
    if ours.random_state is not None and ours.random_state != stock.random_state:
        problems.append("random RNG out of step with stock")
    got, expected = ours.value, stock.value
    tol = recipe.tolerance() if tol is None else tol
    if isinstance(expected, Image.Image):
        if not isinstance(got, Image.Image):
            return f"returned {type(got).__name__}, stock a PIL image"
        if got.mode != expected.mode:
            return f"mode {got.mode} != stock's {expected.mode}"
        if got.size != expected.size:
            return f"size {got.size} != stock's {expected.size}"
        problem = diff_report(pixels(got), pixels(expected), tol)
        if problem:
            problems.append(problem)
    elif isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"returned {type(got).__name__}, stock a tensor"
        if got.dtype != expected.dtype or got.shape != expected.shape:
            return f"tensor {got.dtype} {tuple(got.shape)} != stock's {expected.dtype} {tuple(expected.shape)}"
        if tol.exact or input_kind == "tensor":
            if not torch.equal(got, expected):
                d = (got.double() - expected.double()).abs().max().item() if got.numel() else 0
                problems.append(f"tensor differs from stock's (max |diff| {d})")
        elif got.ndim == 3:
            problem = diff_report(
                recipe.levels(got).permute(1, 2, 0).numpy(), recipe.levels(expected).permute(1, 2, 0).numpy(), tol
            )
            if problem:
                problems.append(problem)
    elif isinstance(expected, np.ndarray):
        if not isinstance(got, np.ndarray) or got.dtype != expected.dtype or got.shape != expected.shape:
            return f"returned {got!r:.80}, stock an ndarray {expected.dtype} {expected.shape}"
        problem = diff_report(pixels(got), pixels(expected), tol)
        if problem:
            problems.append(problem)
    elif type(got) is not type(expected):
        problems.append(f"returned {type(got).__name__}, stock {type(expected).__name__}")
    return "; ".join(problems) or None


def grey_levels_of(tensor: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """A normalized (C, H, W) float tensor back in grey levels, (H, W, C)."""
    t = tensor.double() * torch.tensor(std, dtype=torch.double).view(-1, 1, 1)
    t = t + torch.tensor(mean, dtype=torch.double).view(-1, 1, 1)
    return (t * 255).permute(1, 2, 0).numpy()
