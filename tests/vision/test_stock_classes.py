"""The v1 classes nanopatch leaves stock, and the six random colour ops it runs on its colour
kernels (RandomInvert, RandomPosterize, RandomSolarize, RandomAdjustSharpness,
RandomAutocontrast, RandomEqualize), inside a patched Compose.

Each runs between nanopatch steps (a crop and a flip before it, to-tensor steps where it takes
a tensor), and the pipeline must give stock's outcome: the same types (a tuple of PIL images
for FiveCrop/TenCrop, PIL images, tensors), the same pixels exactly (every other step of these
pipelines is exact), and the torch and random generators left where stock leaves them.
"""

from __future__ import annotations

import random

import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import nanopatch

from helpers import transform_cases as tc
from helpers.transform_cases import R

HEAD = [R("CenterCrop", 48), R("RandomHorizontalFlip")]

#: name -> (the stock step, what comes before it, what comes after it)
CASES = {
    "FiveCrop": (R("FiveCrop", 20), HEAD, []),
    "TenCrop": (R("TenCrop", 20, vertical_flip=True), HEAD, []),
    "RandomInvert": (R("RandomInvert", p=0.6), HEAD, [R("ToTensor")]),
    "RandomPosterize": (R("RandomPosterize", 3, p=0.6), HEAD, [R("PILToTensor")]),
    "RandomSolarize": (R("RandomSolarize", 100, p=0.6), HEAD, [R("RandomVerticalFlip")]),
    "RandomAdjustSharpness": (R("RandomAdjustSharpness", 2.0, p=0.6), HEAD, [R("ToTensor")]),
    "RandomAutocontrast": (R("RandomAutocontrast", p=0.6), HEAD, [R("Pad", 2)]),
    "RandomEqualize": (R("RandomEqualize", p=0.6), HEAD, [R("ToTensor")]),
    "ElasticTransform": (R("ElasticTransform", alpha=20.0), HEAD, [R("ToTensor")]),
    "AugMix": (R("AugMix", severity=2), HEAD, [R("RandomVerticalFlip"), R("ToTensor")]),
    "ToPILImage": (R("ToPILImage"), [*HEAD, R("ToTensor")], [R("RandomVerticalFlip")]),
    "LinearTransformation": (
        R("LinearTransformation", torch.eye(3 * 8 * 8).flip(0), torch.zeros(3 * 8 * 8)),
        [R("CenterCrop", 8), R("RandomHorizontalFlip"), R("ToTensor")],
        [],
    ),
    "RandomPerspective": (R("RandomPerspective", 0.4, p=0.7), HEAD, [R("ToTensor")]),
    "RandomErasing": (R("RandomErasing", p=0.7), [*HEAD, R("ToTensor")], [R("RandomVerticalFlip", p=0.3)]),
}


#: The six random colour ops: nanopatch's classes (parity of each alone: test_transforms_parity.py).
ACCELERATED = {
    "RandomAdjustSharpness",
    "RandomAutocontrast",
    "RandomEqualize",
    "RandomInvert",
    "RandomPosterize",
    "RandomSolarize",
}


@pytest.fixture(scope="module", autouse=True)
def patched():
    with nanopatch.patched(training=False):
        yield


def images() -> list[Image.Image]:
    return [tc.ImageSpec(61, 83, "RGB", "smooth", seed=7).pil(), tc.ImageSpec(70, 64, "RGB", "noise", seed=8).pil()]


def outcomes(transform, seed: int) -> list[tuple[object, object, object]]:
    """(value, torch state, random state) after each call, seeded once for the stream."""
    torch.manual_seed(seed)
    random.seed(seed)
    found = []
    for img in images() * 3:
        found.append((transform(img), torch.get_rng_state(), random.getstate()))
    return found


def assert_same(got, want, what: str) -> None:
    assert type(got) is type(want), f"{what}: {type(got).__name__}, stock {type(want).__name__}"
    if isinstance(want, tuple):
        assert len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{what}[{i}]")
    elif isinstance(want, Image.Image):
        assert (got.mode, got.size) == (want.mode, want.size), what
        assert got.tobytes() == want.tobytes(), f"{what}: pixels differ from stock's"
    else:
        assert isinstance(want, torch.Tensor), what
        assert got.dtype == want.dtype and torch.equal(got, want), f"{what}: values differ from stock's"


@pytest.mark.parametrize("name", sorted(CASES))
def test_inside_a_patched_compose(name):
    step, before, after = CASES[name]
    recipe = R("Compose", [*before, step, *after])
    stock, ours = recipe.build(stock=True), recipe.build(stock=False)
    assert type(ours).__module__ == "nanopatch.targets.vision.transforms"
    step_type = type(ours.transforms[len(before)])
    assert step_type is getattr(T, name)
    if name in ACCELERATED:
        assert step_type.__module__ == "nanopatch.targets.vision.transforms" and step_type.__bases__[-1] is type(
            stock.transforms[len(before)]
        )
    else:  # stock's own class, also while patched
        assert not step_type.__module__.startswith("nanopatch")
    for seed in (0, 1):
        for i, (got, want) in enumerate(zip(outcomes(ours, seed), outcomes(stock, seed), strict=True)):
            what = f"{recipe!r}, seed {seed}, call {i}"
            assert_same(got[0], want[0], what)
            assert torch.equal(got[1], want[1]), f"{what}: torch RNG out of step with stock"
            assert got[2] == want[2], f"{what}: random RNG out of step with stock"
