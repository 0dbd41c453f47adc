"""One construction of every transform class nanopatch replaces, v1 and v2, with arguments away
from the defaults, and the checks that hold for each of them: ``torch.jit.script`` compiles ours
exactly when it compiles stock's (same exception type otherwise) and the compiled modules compute
the same; a user's ndarray gets stock's outcome (stock's exception, or stock's result).

Imported by the test modules and by fresh interpreters (the import-order checks), so it builds
stock objects from the ``_nanopatch_stock`` classes, never by switching the patch off.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2 as v2
from torchvision.transforms import AutoAugmentPolicy, InterpolationMode

from helpers import transform_cases as tc
from helpers.transform_cases import R, Recipe

MEAN, STD = list(tc.IMAGENET_MEAN), list(tc.IMAGENET_STD)
NORMALIZE = R("Normalize", mean=MEAN, std=STD)
AFFINE = {
    "translate": (0.1, 0.2),
    "scale": (0.9, 1.1),
    "shear": (1, 2, 3, 4),
    "interpolation": InterpolationMode.BILINEAR,
    "fill": (1, 2, 3),
    "center": (5, 6),
}

#: v1: one recipe per replaced class (``Recipe.build(stock=...)`` makes either side).
V1: dict[str, Recipe] = {
    "Compose": R("Compose", [R("Resize", 40), R("CenterCrop", 32), R("ToTensor"), NORMALIZE]),
    "Resize": R("Resize", 40, interpolation=InterpolationMode.BICUBIC, max_size=60, antialias=True),
    "CenterCrop": R("CenterCrop", (30, 20)),
    "RandomCrop": R("RandomCrop", 28, padding=4, pad_if_needed=True, fill=(1, 2, 3), padding_mode="reflect"),
    "RandomResizedCrop": R(
        "RandomResizedCrop", 32, scale=(0.2, 0.9), ratio=(0.5, 2.0), interpolation=InterpolationMode.NEAREST
    ),
    "RandomHorizontalFlip": R("RandomHorizontalFlip", p=0.3),
    "RandomVerticalFlip": R("RandomVerticalFlip", p=0.7),
    "Pad": R("Pad", (1, 2, 3, 4), fill=7, padding_mode="edge"),
    "ColorJitter": R("ColorJitter", 0.4, (0.5, 1.5), 0.2, (-0.1, 0.2)),
    "Grayscale": R("Grayscale", 3),
    "RandomGrayscale": R("RandomGrayscale", 0.4),
    "RandomRotation": R(
        "RandomRotation", (-20, 30), interpolation=InterpolationMode.BILINEAR, expand=True, center=(3, 4), fill=9
    ),
    "RandomAffine": R("RandomAffine", 10, **AFFINE),
    "GaussianBlur": R("GaussianBlur", (3, 5), sigma=(0.5, 1.5)),
    "ToTensor": R("ToTensor"),
    "PILToTensor": R("PILToTensor"),
    "Normalize": R("Normalize", mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3], inplace=False),
    "RandomApply": R("RandomApply", [R("ColorJitter", 0.3), R("RandomHorizontalFlip")], p=0.6),
    "RandomChoice": R("RandomChoice", [R("RandomVerticalFlip"), R("Grayscale", 3)], p=[0.3, 0.7]),
    "RandomOrder": R("RandomOrder", [R("RandomVerticalFlip"), R("ColorJitter", 0.2)]),
    "AutoAugment": R(
        "AutoAugment", AutoAugmentPolicy.CIFAR10, interpolation=InterpolationMode.BILINEAR, fill=[1, 2, 3]
    ),
    "RandAugment": R("RandAugment", num_ops=3, magnitude=5, num_magnitude_bins=11, fill=4),
    "TrivialAugmentWide": R("TrivialAugmentWide", num_magnitude_bins=21, interpolation=InterpolationMode.BILINEAR),
    "RandomInvert": R("RandomInvert", p=0.4),
    "RandomPosterize": R("RandomPosterize", 3, p=0.6),
    "RandomSolarize": R("RandomSolarize", 100.5, p=0.6),
    "RandomAdjustSharpness": R("RandomAdjustSharpness", 1.7, p=0.6),
    "RandomAutocontrast": R("RandomAutocontrast", p=0.6),
    "RandomEqualize": R("RandomEqualize", p=0.6),
}
assert sorted(V1) == sorted(tc.REPLACED)

#: v1 constructions torchscript takes (a container's steps in a ModuleList, a sequence size):
#: the scripting checks run these besides V1.
V1_SCRIPTABLE: dict[str, Recipe] = {
    "Resize[list]": R("Resize", [40]),
    "RandomApply[ModuleList]": R(
        "RandomApply", tc.ModuleListOf([R("ColorJitter", 0.3), R("RandomHorizontalFlip")]), p=0.6
    ),
}

#: v2: one builder per replaced class, given ``cls(name)`` (stock's class or the patched one).
V2: dict[str, Callable[[Callable[[str], type]], Any]] = {
    "AutoAugment": lambda c: c("AutoAugment")(
        AutoAugmentPolicy.CIFAR10, interpolation=InterpolationMode.BILINEAR, fill=[1, 2, 3]
    ),
    "CenterCrop": lambda c: c("CenterCrop")((30, 20)),
    "ColorJitter": lambda c: c("ColorJitter")(0.4, (0.5, 1.5), 0.2, (-0.1, 0.2)),
    "Compose": lambda c: c("Compose")(
        [c("Resize")([40]), c("CenterCrop")(32), c("ToImage")(), c("ToDtype")(torch.float32, scale=True)]
    ),
    "GaussianBlur": lambda c: c("GaussianBlur")((3, 5), sigma=(0.5, 1.5)),
    "Grayscale": lambda c: c("Grayscale")(3),
    "Normalize": lambda c: c("Normalize")(mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3]),
    "PILToTensor": lambda c: c("PILToTensor")(),
    "Pad": lambda c: c("Pad")((1, 2, 3, 4), fill=7, padding_mode="edge"),
    "RandAugment": lambda c: c("RandAugment")(num_ops=3, magnitude=5, num_magnitude_bins=11, fill=4),
    "RandomAffine": lambda c: c("RandomAffine")(10, **AFFINE),
    "RandomApply": lambda c: c("RandomApply")(
        torch.nn.ModuleList([c("ColorJitter")(0.3), c("RandomHorizontalFlip")()]), p=0.6
    ),
    "RandomChoice": lambda c: c("RandomChoice")([c("RandomVerticalFlip")(), c("Grayscale")(3)], p=[0.3, 0.7]),
    "RandomCrop": lambda c: c("RandomCrop")(28, padding=4, pad_if_needed=True, fill=(1, 2, 3), padding_mode="reflect"),
    "RandomGrayscale": lambda c: c("RandomGrayscale")(0.4),
    "RandomHorizontalFlip": lambda c: c("RandomHorizontalFlip")(p=0.3),
    "RandomOrder": lambda c: c("RandomOrder")([c("RandomVerticalFlip")(), c("ColorJitter")(0.2)]),
    "RandomResizedCrop": lambda c: c("RandomResizedCrop")(
        32, scale=(0.2, 0.9), ratio=(0.5, 2.0), interpolation=InterpolationMode.NEAREST
    ),
    "RandomRotation": lambda c: c("RandomRotation")(
        (-20, 30), interpolation=InterpolationMode.BILINEAR, expand=True, center=(3, 4), fill=9
    ),
    "RandomVerticalFlip": lambda c: c("RandomVerticalFlip")(p=0.7),
    "Resize": lambda c: c("Resize")([40], interpolation=InterpolationMode.BICUBIC, max_size=60, antialias=True),
    "ToDtype": lambda c: c("ToDtype")(torch.float32, scale=True),
    "ToImage": lambda c: c("ToImage")(),
    "TrivialAugmentWide": lambda c: c("TrivialAugmentWide")(
        num_magnitude_bins=21, interpolation=InterpolationMode.BILINEAR
    ),
}

#: v2 constructions torchscript takes where V2's does not (stock scripts a scalar fill only).
V2_SCRIPTABLE: dict[str, Callable[[Callable[[str], type]], Any]] = {
    "RandomCrop[scalar fill]": lambda c: c("RandomCrop")(28, padding=4, pad_if_needed=True, fill=7),
    "Pad[scalar fill]": lambda c: c("Pad")((1, 2, 3, 4), fill=7),
}


#: what the scripting checks run, and where nanopatch's classes live, per version
SCRIPTING = {"v1": [*V1, *V1_SCRIPTABLE], "v2": [*V2, *V2_SCRIPTABLE]}
MODULE = {"v1": "nanopatch.targets.vision.transforms", "v2": "nanopatch.targets.vision.transforms_v2"}


def stock_of(cls: type) -> type:
    """torchvision's class for ``cls`` (itself when it is not nanopatch's)."""
    return cls.__dict__.get("_nanopatch_stock", cls)


def build_v1(name: str, *, stock: bool) -> Any:
    recipe = V1[name] if name in V1 else V1_SCRIPTABLE[name]
    return recipe.build(stock=stock)


def build_v2(name: str, *, stock: bool) -> Any:
    """V2[name] made of stock's classes, or of what ``torchvision.transforms.v2`` holds now."""
    return (V2[name] if name in V2 else V2_SCRIPTABLE[name])(
        lambda cls: stock_of(getattr(v2, cls)) if stock else getattr(v2, cls)
    )


def build(version: str, name: str, *, stock: bool) -> Any:
    """The example ``name`` of ``version`` ("v1" or "v2"), stock's or ours (checked to be ours)."""
    made = (build_v1 if version == "v1" else build_v2)(name, stock=stock)
    assert (type(made).__module__ == MODULE[version]) != stock, (version, name, stock, type(made))
    return made


def sample_tensor(name: str) -> torch.Tensor:
    """What a scripted transform is called on: a uint8 image, a float one for Normalize."""
    image = torch.from_numpy(tc.ImageSpec(47, 61, "RGB", "smooth", seed=3).array()).permute(2, 0, 1).contiguous()
    return image.float() / 255 if name.startswith("Normalize") else image


def sample_array(ndim: int = 3) -> np.ndarray:
    """A user's uint8 ndarray: (H, W, 3), or (H, W)."""
    return tc.ImageSpec(47, 61, "RGB" if ndim == 3 else "L", "smooth", seed=5).array()


def script(obj: Any) -> tuple[Any, BaseException | None]:
    """``torch.jit.script(obj)``, or the exception it raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in torch 2.13
        try:
            return torch.jit.script(obj), None
        except Exception as exc:
            return None, exc


def outcome_problem(ours: tc.Outcome, stock: tc.Outcome, value: Any = None) -> str | None:
    """None when two calls ended alike: the same exception (type and message), or equal results
    of one type (the input itself exactly when stock's is), and the RNGs left in one place."""
    if type(ours.error) is not type(stock.error) or (stock.error is not None and str(ours.error) != str(stock.error)):
        return f"raised {ours.error!r:.300}; stock {stock.error!r:.300}"
    if not torch.equal(ours.torch_state, stock.torch_state) or ours.random_state != stock.random_state:
        return "the random generators out of step with stock"
    got, want = ours.value, stock.value
    if stock.error is not None:
        return None
    if type(got) is not type(want):
        return f"returned {type(got).__name__}; stock {type(want).__name__}"
    if value is not None and (got is value) != (want is value):
        return f"returned {'the input itself' if got is value else 'a new object'}; stock did not"
    if isinstance(want, torch.Tensor):
        same = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    else:
        same = np.array_equal(np.asarray(got), np.asarray(want))
    return None if same else f"returned other values than stock ({got!r:.80} vs {want!r:.80})"


def scripting_problem(stock: Any, ours: Any, tensor: torch.Tensor, seeds=(0, 4)) -> str | None:
    """None when ``torch.jit.script`` treats ours as stock's: both fail with one exception type,
    or both compile and the compiled modules compute the same under each seed."""
    scripted_stock, stock_error = script(stock)
    scripted_ours, ours_error = script(ours)
    if type(ours_error) is not type(stock_error):
        return f"scripting raised {ours_error!r:.300}; stock's {stock_error!r:.300}"
    if stock_error is not None:
        return None
    for seed in seeds:
        problem = outcome_problem(
            tc.run(scripted_ours, tensor.clone(), seed), tc.run(scripted_stock, tensor.clone(), seed)
        )
        if problem:
            return f"the scripted module, seed {seed}: {problem}"
    return None


def ndarray_problem(stock: Any, ours: Any, arr: np.ndarray, seeds=range(6)) -> str | None:
    """None when a user's ndarray gets stock's outcome under each seed (stock's exception, or
    stock's result), and neither side changed it."""
    before = arr.copy()
    for seed in seeds:
        problem = outcome_problem(tc.run(ours, arr, seed), tc.run(stock, arr, seed), arr)
        if problem:
            return f"seed {seed}: {problem}"
    return None if np.array_equal(arr, before) else "the input ndarray changed"


def v1_classes_of_v2() -> dict[str, type | None]:
    """Every v2 transform class of torchvision (stock's, also where nanopatch replaces it) and
    the v1 class it scripts as and checks itself against (``_v1_transform_cls``)."""
    found = {}
    for name in dir(v2):
        cls = getattr(v2, name)
        if isinstance(cls, type) and issubclass(cls, v2.Transform):
            found[name] = stock_of(cls)._v1_transform_cls
    return found


def v1_link_problems(links: dict[str, type | None]) -> list[str]:
    """The v2 classes whose ``_v1_transform_cls`` is not torchvision's own v1 class."""
    import torchvision.transforms as T

    problems = []
    for name, v1 in links.items():
        if v1 is not None and v1 is not stock_of(getattr(T, v1.__name__, v1)):
            problems.append(f"v2.{name}._v1_transform_cls is {v1.__module__}.{v1.__qualname__}")
    return problems
