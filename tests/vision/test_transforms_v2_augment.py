"""torchvision.transforms.v2 RandomRotation, RandomAffine, AutoAugment, RandAugment and
TrivialAugmentWide under the vision patch: on a single PIL input the same random draws as stock
(the v2 classes' own ``make_params`` / the policies' torch calls), the same pixels and the same
types; tensors, tv_tensors and multi-input calls stay stock; AugMix and Lambda stay stock and
still work inside a patched v2 Compose."""

from __future__ import annotations

import pickle

import numpy as np
import PIL.Image
import pytest
import torch
import torchvision
import torchvision.transforms.v2 as v2
from torchvision import tv_tensors
from torchvision.transforms.v2 import AutoAugmentPolicy, InterpolationMode
from torchvision.transforms.v2.functional._geometry import _check_interpolation

import nanopatch
from nanopatch.targets.vision import _pipeline, transforms_v2
from nanopatch.targets.vision._pixels import Pixels

NEAREST, BILINEAR = InterpolationMode.NEAREST, InterpolationMode.BILINEAR
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
LEVEL = 1 / 255 / min(STD) + 1e-6  # one grey level after Normalize
NEW = ("RandomRotation", "RandomAffine", "AutoAugment", "RandAugment", "TrivialAugmentWide")
SIZES = [(375, 500), (33, 17), (64, 64), (101, 77)]


def by_name(name: str):
    """An interpolation by its string name, as torchvision >= 0.24 takes it (older versions, such
    as the 0.23 the ``ipex`` tox env runs, take InterpolationMode values only)."""
    try:
        _check_interpolation(name)
    except ValueError:
        return InterpolationMode(name)
    return name


@pytest.fixture
def patched():
    nanopatch.patch_torch(training=False, fast_decode=False)
    yield
    nanopatch.unpatch_torch()


def photo(h: int, w: int, seed: int, mode: str = "RGB") -> PIL.Image.Image:
    """A smooth random-walk picture (the colour ops' statistics vary with it)."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(-6, 7, (h, w, 3))
    arr = np.clip(np.cumsum(steps, axis=1) + rng.integers(60, 190, 3), 0, 255).astype(np.uint8)
    return PIL.Image.fromarray(arr if mode == "RGB" else arr[:, :, 0])


def stock_and_ours(make):
    with nanopatch.unpatched():
        stock = make()
    ours = make()
    assert type(stock).__module__.startswith("torchvision."), type(stock)
    assert type(ours).__module__ == "nanopatch.targets.vision.transforms_v2", type(ours)
    return stock, ours


def run_seeded(transform, seed: int, *inputs):
    """(result or the exception raised, the next torch draw): what a call leaves behind."""
    torch.manual_seed(seed)
    try:
        result = transform(*inputs)
    except Exception as error:  # compared with stock's below
        result = error
    return result, torch.rand(1).item()


def pixel_diff(got: PIL.Image.Image, expected: PIL.Image.Image) -> np.ndarray:
    return np.abs(np.asarray(got, dtype=np.int16) - np.asarray(expected, dtype=np.int16))


def assert_same_calls(stock, ours, img, seeds, *, exact: bool) -> dict[str, int]:
    """Stock and patched under the same seeds: the same type, mode and size, pixels within one
    level (mean within half of one; ``exact``: identical), the same next random draw, and the
    same error where stock raises one. Returns counts of what happened."""
    seen = {"calls": 0, "exact": 0, "errors": 0}
    for seed in seeds:
        expected, stock_next = run_seeded(stock, seed, img)
        got, ours_next = run_seeded(ours, seed, img)
        assert ours_next == stock_next, f"random stream out of step (seed {seed})"
        seen["calls"] += 1
        if isinstance(expected, Exception):
            assert type(got) is type(expected) and str(got) == str(expected), (seed, got, expected)
            seen["errors"] += 1
            continue
        assert type(got) is type(expected), (seed, type(got), type(expected))
        assert got.mode == expected.mode and got.size == expected.size, seed
        diff = pixel_diff(got, expected)
        if exact:
            assert diff.max() == 0, (seed, int(diff.max()))
        assert diff.max() <= 1 and diff.mean() <= 0.5, (seed, int(diff.max()), float(diff.mean()))
        seen["exact"] += int(diff.max() == 0)
    return seen


# --- RandomRotation / RandomAffine ---------------------------------------------------------

ROTATIONS = {
    "default": lambda: v2.RandomRotation(30),
    "range-bilinear": lambda: v2.RandomRotation((-40, 70), interpolation=BILINEAR),
    "bilinear-string": lambda: v2.RandomRotation(15, interpolation=by_name("bilinear")),
    "expand": lambda: v2.RandomRotation(50, expand=True),
    "expand-bilinear-fill": lambda: v2.RandomRotation(180, interpolation=BILINEAR, expand=True, fill=77),
    "center": lambda: v2.RandomRotation(90, center=(3, 7), fill=200),
    "center-expand": lambda: v2.RandomRotation((10, 80), center=[20.5, 4], expand=True, fill=9),
    "fill-rgb": lambda: v2.RandomRotation(45, fill=(10, 20, 30)),  # an "L" image: stock's ValueError
    "fill-dict": lambda: v2.RandomRotation(45, fill={PIL.Image.Image: 140, "others": 3}),
    "right-angle": lambda: v2.RandomRotation((90, 90), expand=True),
}

AFFINES = {
    "degrees-only": lambda: v2.RandomAffine(25),
    "everything": lambda: v2.RandomAffine(
        20, translate=(0.1, 0.2), scale=(0.7, 1.3), shear=(-5, 5, -10, 10), interpolation=BILINEAR, fill=7
    ),
    "shear-number": lambda: v2.RandomAffine(0, shear=12, fill=(1, 2, 3)),
    "shear-pair-center": lambda: v2.RandomAffine(10, shear=(2, 8), center=(10, 5), interpolation=by_name("bilinear")),
    "translate-scale": lambda: v2.RandomAffine((-5, 5), translate=(0.3, 0.3), scale=(0.5, 0.9)),
    "fill-dict-nearest": lambda: v2.RandomAffine(
        30, scale=(1.1, 1.4), interpolation=NEAREST, fill={PIL.Image.Image: 250, "others": 0}
    ),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("case", sorted(ROTATIONS))
def test_random_rotation_matches_stock(patched, case, mode, size):
    stock, ours = stock_and_ours(ROTATIONS[case])
    img = photo(*size, seed=size[1], mode=mode)
    seen = assert_same_calls(stock, ours, img, range(6), exact=True)  # stock's own Pillow warp
    assert seen["errors"] == (6 if case == "fill-rgb" and mode == "L" else 0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("case", sorted(AFFINES))
def test_random_affine_matches_stock(patched, case, mode, size):
    stock, ours = stock_and_ours(AFFINES[case])
    img = photo(*size, seed=size[0], mode=mode)
    seen = assert_same_calls(stock, ours, img, range(6), exact=True)
    assert seen["errors"] == (6 if case == "shear-number" and mode == "L" else 0)


def test_rotation_and_affine_draw_with_their_make_params(patched, monkeypatch):
    """The parameters are the v2 class's own make_params, given the image (or its size)."""
    img = photo(40, 60, seed=1)
    for make in (ROTATIONS["center-expand"], AFFINES["everything"]):
        _, ours = stock_and_ours(make)
        calls: list = []
        stock_make_params = type(ours).make_params

        def spy(self, flat_inputs, stock_make_params=stock_make_params, calls=calls):
            params = stock_make_params(self, flat_inputs)
            calls.append((flat_inputs, params))
            return params

        monkeypatch.setattr(type(ours), "make_params", spy)
        ours(img)
        assert len(calls) == 1 and calls[0][0] == [img] and "angle" in calls[0][1]
        monkeypatch.undo()


# --- auto-augment policies -----------------------------------------------------------------

POLICIES = {
    "aa-imagenet": lambda: v2.AutoAugment(),
    "aa-cifar10-bilinear-fill": lambda: v2.AutoAugment(
        AutoAugmentPolicy.CIFAR10, interpolation=BILINEAR, fill=[1, 2, 3]
    ),
    "aa-svhn-fill": lambda: v2.AutoAugment(AutoAugmentPolicy.SVHN, fill=100),
    "ra-default": lambda: v2.RandAugment(),
    "ra-many-ops": lambda: v2.RandAugment(
        num_ops=4, magnitude=5, num_magnitude_bins=11, fill=4, interpolation=by_name("bilinear")
    ),
    "ra-top-magnitude": lambda: v2.RandAugment(num_ops=3, magnitude=30, fill={PIL.Image.Image: 60, "others": 0}),
    "ta-default": lambda: v2.TrivialAugmentWide(),
    "ta-bilinear-fill": lambda: v2.TrivialAugmentWide(num_magnitude_bins=21, interpolation=BILINEAR, fill=(9, 8, 7)),
    "ta-nearest-string": lambda: v2.TrivialAugmentWide(
        num_magnitude_bins=5, interpolation=by_name("nearest"), fill=250
    ),
}
RGB_FILL_ONLY = {"aa-cifar10-bilinear-fill", "ta-bilinear-fill"}  # 3 fill values: stock fails on "L"


@pytest.mark.parametrize("size", [(375, 500), (33, 17), (200, 301)])
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("case", sorted(POLICIES))
def test_auto_augment_policies_match_stock(patched, case, mode, size):
    stock, ours = stock_and_ours(POLICIES[case])
    img = photo(*size, seed=size[0] + len(case), mode=mode)
    seen = assert_same_calls(stock, ours, img, range(24), exact=True)  # the colour kernels are bit-exact
    if case in RGB_FILL_ONLY and mode == "L":
        assert seen["errors"] > 0  # the first geometric op raises stock's ValueError
    else:
        assert seen["errors"] == 0


@pytest.mark.parametrize("name", ["AutoAugment", "RandAugment", "TrivialAugmentWide"])
def test_every_op_of_a_policy_runs_and_matches_stock(patched, name, monkeypatch):
    """Over enough seeds every op of the policy's space comes up, through the kernels and
    through stock's method alike, and still matches stock."""
    stock, ours = stock_and_ours(lambda: getattr(v2, name)())
    ran: dict[tuple[str, bool], int] = {}
    augment = transforms_v2._augment

    def recording(policy, px, op, magnitude):
        out = augment(policy, px, op, magnitude)
        key = (op, out is not px and not out.is_pil_image)  # True: a kernel made the pixels
        ran[key] = ran.get(key, 0) + 1
        return out

    monkeypatch.setattr(transforms_v2, "_augment", recording)
    for img in (photo(300, 400, seed=3), photo(300, 400, seed=4, mode="L"), photo(30, 40, seed=5, mode="L")):
        assert_same_calls(stock, ours, img, range(60), exact=True)
    ops = {op for op, _ in ran}
    expected = set(stock._AUGMENTATION_SPACE)
    if name == "AutoAugment":  # the ImageNet policy uses a subset of the space
        expected = {op for pair in stock._policies for op, _, _ in pair}
    assert ops == expected
    on_kernels = {op for op, kernel in ran if kernel}
    assert on_kernels and on_kernels <= set(_pipeline.AUGMENT_KERNELS)
    assert not on_kernels & {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"}


def test_colour_ops_pick_the_faster_route():
    """Kernels for pixels already in an ndarray; on a PIL image, Pillow where it is faster
    (Brightness, Color, Equalize on RGB, small images), the kernels elsewhere; warps always Pillow."""
    big_rgb = Pixels.accept(photo(375, 500, seed=1))
    small_l = Pixels.accept(photo(28, 28, seed=1, mode="L"))
    as_array = Pixels.accept(photo(28, 28, seed=1, mode="L"))
    as_array.array()  # converted: no longer a PIL image alone
    on_kernel = _pipeline.on_kernel
    for op in ("Posterize", "Solarize", "AutoContrast", "Invert", "Sharpness", "Contrast"):
        assert on_kernel(op, big_rgb), op
    for op in ("Brightness", "Color", "Equalize", "Rotate", "ShearX", "TranslateY", "Identity"):
        assert not on_kernel(op, big_rgb), op
    for op in _pipeline.AUGMENT_KERNELS:
        assert on_kernel(op, small_l) is (op == "Equalize"), op  # Equalize: the kernel on "L" at any size
        assert on_kernel(op, as_array), op


def test_a_subclass_that_overrides_the_op_method_is_honoured(patched):
    """A subclass's own ``_apply_image_or_video_transform`` gets every op (Identity too), as in stock."""

    def recording(base):
        class Recording(base):
            def _apply_image_or_video_transform(self, image, transform_id, magnitude, interpolation, fill):
                self.calls.append(transform_id)
                return super()._apply_image_or_video_transform(image, transform_id, magnitude, interpolation, fill)

        transform = Recording()
        transform.calls = []
        return transform

    with nanopatch.unpatched():
        stock = recording(v2.TrivialAugmentWide)
    ours = recording(v2.TrivialAugmentWide)
    assert isinstance(ours, transforms_v2.TrivialAugmentWide)
    img = photo(120, 160, seed=2)
    assert_same_calls(stock, ours, img, range(40), exact=True)
    assert ours.calls == stock.calls and len(ours.calls) == 40  # one op per call
    assert {"Identity", "Brightness", "Posterize", "Rotate"} <= set(ours.calls)


def test_policy_errors_are_stocks(patched):
    img = photo(32, 32, seed=1)
    stock, ours = stock_and_ours(lambda: v2.RandAugment(magnitude=40, num_magnitude_bins=31))
    expected, stock_next = run_seeded(stock, 0, img)
    got, ours_next = run_seeded(ours, 0, img)
    assert isinstance(expected, IndexError) and type(got) is type(expected) and str(got) == str(expected)
    assert ours_next == stock_next


# --- types, stock paths, API ---------------------------------------------------------------

ALL_NEW = {
    "RandomRotation": ROTATIONS["expand-bilinear-fill"],
    "RandomAffine": AFFINES["everything"],
    "AutoAugment": POLICIES["aa-svhn-fill"],
    "RandAugment": POLICIES["ra-many-ops"],
    "TrivialAugmentWide": POLICIES["ta-nearest-string"],
}


@pytest.mark.parametrize("name", NEW)
def test_patched_names_and_exact_undo(name, patched):
    stock_cls = transforms_v2.__dict__[name]._nanopatch_stock
    assert getattr(v2, name) is transforms_v2.__dict__[name]
    assert getattr(torchvision.transforms.v2, name) is getattr(v2, name)
    nanopatch.unpatch_torch()
    assert getattr(v2, name) is stock_cls
    nanopatch.patch_torch(training=False, fast_decode=False)


@pytest.mark.parametrize("name", NEW)
def test_repr_pickle_and_class_match_stock(name, patched):
    stock, ours = stock_and_ours(ALL_NEW[name])
    assert repr(ours) == repr(stock)
    assert isinstance(ours, type(stock))
    assert type(ours).__doc__ == type(stock).__doc__
    clone = pickle.loads(pickle.dumps(ours))
    assert type(clone) is type(ours) and repr(clone) == repr(ours)
    img = photo(50, 70, seed=4)
    for seed in range(4):
        a, _ = run_seeded(clone, seed, img)
        b, _ = run_seeded(stock, seed, img)
        assert isinstance(a, PIL.Image.Image) and pixel_diff(a, b).max() == 0


@pytest.mark.parametrize("name", NEW)
def test_tensors_tv_tensors_and_multi_input_calls_run_stock_code(name, patched):
    stock, ours = stock_and_ours(ALL_NEW[name])
    image = tv_tensors.Image(torch.randint(0, 256, (3, 48, 64), dtype=torch.uint8))
    inputs = [(image,), (image.as_subclass(torch.Tensor),), ({"image": image, "label": 3},)]
    if name in ("RandomRotation", "RandomAffine"):
        boxes = tv_tensors.BoundingBoxes([[5, 5, 40, 30]], format="XYXY", canvas_size=(48, 64))
        inputs.append((image, boxes))
    for call in inputs:
        expected, stock_next = run_seeded(stock, 0, *call)
        got, ours_next = run_seeded(ours, 0, *call)
        assert ours_next == stock_next
        flat_expected = torch.utils._pytree.tree_flatten(expected)[0]
        flat_got = torch.utils._pytree.tree_flatten(got)[0]
        assert len(flat_got) == len(flat_expected)
        for a, b in zip(flat_expected, flat_got, strict=True):
            assert type(a) is type(b)
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    rgba = photo(20, 30, seed=1).convert("RGBA")  # a mode nanopatch leaves to stock (stock may fail on it)
    seen = assert_same_calls(stock, ours, rgba, range(4), exact=True)
    assert seen["calls"] == 4


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_lone_call_keeps_the_pil_type(name, mode, patched):
    make = ALL_NEW[name] if mode == "RGB" else (lambda: getattr(v2, name)(**_grey_safe(name)))
    stock, ours = stock_and_ours(make)
    img = photo(61, 83, seed=7, mode=mode)
    for seed in range(5):
        expected, _ = run_seeded(stock, seed, img)
        got, _ = run_seeded(ours, seed, img)
        assert isinstance(expected, PIL.Image.Image)
        assert type(got) is type(expected) and got.mode == expected.mode == mode
        assert got.size == expected.size


def _grey_safe(name: str) -> dict:
    """Constructor arguments with a single fill value (three fail on "L" images, as stock)."""
    return {"degrees": 30} if name in ("RandomRotation", "RandomAffine") else {"fill": 5}


#: The pipelines of ``_pipelines`` with a bilinear resize: within one level of stock's.
RESAMPLED = {"rotation", "affine"}


def _pipelines(mode: str) -> dict[str, v2.Compose]:
    """Policies come after exact steps only (crops, flips, nearest resizes): a bilinear resize is
    within one level of stock's, and Posterize/Solarize/Equalize can turn one level into more."""
    mean, std = (MEAN, STD) if mode == "RGB" else (MEAN[:1], STD[:1])
    tail = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    fill = 0 if mode == "L" else (10, 20, 30)
    return {
        "rotation": v2.Compose([v2.RandomResizedCrop(96), v2.RandomRotation(20, fill=fill), *tail]),
        "affine": v2.Compose(
            [v2.Resize(80), v2.RandomAffine(15, translate=(0.1, 0.1), interpolation=BILINEAR), v2.CenterCrop(64), *tail]
        ),
        "autoaugment": v2.Compose(
            [v2.RandomCrop(64, padding=4, pad_if_needed=True), v2.RandomHorizontalFlip(), v2.AutoAugment(), *tail]
        ),
        "randaugment": v2.Compose([v2.RandomResizedCrop(72, interpolation=NEAREST), v2.RandAugment(num_ops=3), *tail]),
        "trivialaugment": v2.Compose([v2.RandomHorizontalFlip(), v2.TrivialAugmentWide(), *tail]),
        "augmix": v2.Compose(
            [v2.RandomResizedCrop(64, interpolation=NEAREST), v2.AugMix(severity=2), v2.RandomRotation(10), *tail]
        ),
        "lambda": v2.Compose(
            [
                v2.Resize(70, interpolation=NEAREST),
                v2.RandAugment(),
                v2.Lambda(lambda img: img.transpose(PIL.Image.Transpose.ROTATE_90)),
                v2.RandomAffine(10, scale=(0.9, 1.1)),
                *tail,
            ]
        ),
        "pil-out": v2.Compose([v2.CenterCrop(60), v2.TrivialAugmentWide(), v2.RandomRotation(25)]),
    }


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("size", [(375, 500), (47, 63)])
def test_inside_a_patched_compose_with_to_image_to_dtype_normalize(patched, mode, size):
    with nanopatch.unpatched():
        stock = _pipelines(mode)
    ours = _pipelines(mode)
    assert type(ours["augmix"].transforms[1]).__module__.startswith("torchvision.")  # AugMix stays stock
    assert type(ours["lambda"].transforms[2]).__module__.startswith("torchvision.")  # so does Lambda
    img = photo(*size, seed=size[0], mode=mode)
    for name in stock:
        assert type(ours[name]).__module__ == "nanopatch.targets.vision.transforms_v2"
        for seed in range(5):
            expected, stock_next = run_seeded(stock[name], seed, img)
            got, ours_next = run_seeded(ours[name], seed, img)
            assert ours_next == stock_next, (name, seed)
            assert type(got) is type(expected), (name, type(got), type(expected))
            level = LEVEL if name in RESAMPLED else 0.0  # the others: crops, flips, nearest resizes, exact ops
            if isinstance(expected, PIL.Image.Image):
                assert got.size == expected.size and got.mode == expected.mode
                assert pixel_diff(got, expected).max() <= (1 if name in RESAMPLED else 0), name
                continue
            assert got.shape == expected.shape and got.dtype == expected.dtype, name
            assert got.stride() == expected.stride() or got.shape[0] == 1, name
            diff = (got - expected).abs()
            assert diff.max().item() <= level and diff.mean().item() <= level / 2, (name, seed, diff.max().item())


def test_a_lambda_after_a_policy_sees_a_pil_image(patched):
    seen = []
    pipeline = v2.Compose(
        [v2.RandomCrop(40), v2.RandAugment(num_ops=4), v2.Lambda(lambda x: seen.append(type(x)) or x), v2.ToImage()]
    )
    torch.manual_seed(0)
    out = pipeline(photo(60, 60, seed=1))
    assert seen == [PIL.Image.Image] and type(out) is tv_tensors.Image


def test_image_folder_hands_the_file_to_a_policy_pipeline(patched, tmp_path):
    (tmp_path / "c").mkdir()
    for i, size in enumerate([(375, 500), (97, 131)]):
        photo(*size, seed=i).save(tmp_path / "c" / f"{i}.jpg", quality=90)

    def pipeline():
        return v2.Compose(
            [
                v2.RandAugment(num_ops=3),
                v2.RandomRotation(15),
                v2.Resize(64),
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(MEAN, STD),
            ]
        )

    ours = torchvision.datasets.ImageFolder(tmp_path, transform=pipeline())
    with nanopatch.unpatched():
        stock = torchvision.datasets.ImageFolder(tmp_path, transform=pipeline())
    for i in range(len(stock)):
        for seed in range(4):
            torch.manual_seed(seed)
            expected = stock[i][0]
            torch.manual_seed(seed)
            got = ours[i][0]
            assert type(got) is type(expected) and got.shape == expected.shape
            assert (got - expected).abs().max().item() <= LEVEL


def test_fused_plan_steps_after_a_stock_step_run_as_their_steps(patched):
    """A Compose fuses ToImage+ToDtype+Normalize (v1: ToTensor+Normalize, Resize+CenterCrop)
    into one plan step; after a stock step (a Lambda, AugMix) hands it a PIL image, the fused
    step runs its steps one by one instead of failing."""
    import torchvision.transforms as T

    img = photo(90, 120, seed=8)

    def pipelines():
        return [
            v2.Compose(
                [v2.Lambda(lambda x: x), v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
            ),
            v2.Compose([v2.AugMix(), v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)]),
            T.Compose([T.Lambda(lambda x: x), T.ToTensor(), T.Normalize(MEAN, STD)]),
            T.Compose([T.Lambda(lambda x: x), T.Resize(64), T.CenterCrop(48), T.ToTensor()]),
        ]

    with nanopatch.unpatched():
        stock = pipelines()
    ours = pipelines()
    for s, o in zip(stock, ours, strict=True):
        assert type(o).__module__.startswith("nanopatch.")
        expected, _ = run_seeded(s, 3, img)
        got, _ = run_seeded(o, 3, img)
        assert type(got) is type(expected) and got.shape == expected.shape
        assert (got - expected).abs().max().item() <= LEVEL
