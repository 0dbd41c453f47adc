"""v2's ColorJitter on uint8 image tensors (torchvision's advised tensor path) under nanopatch:
v2's values (brightness and contrast equal, hue within one level on every colour), the same
random draws, stock's type, and stock's own kernels for every input the fast kernels do not take."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F2

import nanopatch
from nanopatch.targets.vision import _tensor_color


def all_colours(rows=slice(None)) -> torch.Tensor:
    """Every 24-bit colour as a (3, 4096, 4096) uint8 image (rows of it)."""
    c = np.arange(1 << 24, dtype=np.uint32).reshape(4096, 4096)[rows]
    return torch.from_numpy(np.ascontiguousarray(np.stack([c >> 16, (c >> 8) & 255, c & 255]).astype(np.uint8)))


def noise(shape, seed=0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


def levels_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.int() - b.int()).abs().max())


def test_hue_within_one_level_of_v2_on_every_colour():
    assert _tensor_color.hue_usable()
    for factor, rows in (
        (0.1, slice(0, 2048)),
        (-0.3, slice(2048, 4096)),
        (0.5, slice(0, 1024)),
        (-1e-9, slice(1024, 2048)),
    ):
        image = all_colours(rows)
        got = _tensor_color.adjust_hue(image, factor)
        expected = F2.adjust_hue_image(image, hue_factor=factor)
        assert levels_apart(got, expected) <= 1, factor
        assert (got != expected).float().mean() < 1e-3, factor  # a value at a level's edge, rarely


@pytest.mark.parametrize("shape", [(3, 224, 224), (3, 37, 53), (3, 5, 7), (3, 1, 1)])
@pytest.mark.parametrize("factor", [0.0, 0.6, 1.0, 1.37, 2.5])
def test_brightness_and_contrast_tables_equal_v2(shape, factor):
    image = noise(shape, seed=shape[1] * 7 + int(factor * 100))
    assert torch.equal(_tensor_color.adjust_brightness(image, factor), F2.adjust_brightness_image(image, factor))
    assert torch.equal(_tensor_color.adjust_contrast(image, factor), F2.adjust_contrast_image(image, factor))


def test_bad_factors_raise_what_v2_raises():
    image = noise((3, 8, 8))
    for kernel, stock in (
        (_tensor_color.adjust_brightness, F2.adjust_brightness_image),
        (_tensor_color.adjust_contrast, F2.adjust_contrast_image),
        (_tensor_color.adjust_hue, F2.adjust_hue_image),
    ):
        with pytest.raises(ValueError) as expected:
            stock(image, 0.9 if stock is F2.adjust_hue_image else -0.5)
        with pytest.raises(ValueError) as got:
            kernel(image, 0.9 if stock is F2.adjust_hue_image else -0.5)
        assert str(got.value) == str(expected.value)


@pytest.fixture
def patched_vision():
    with nanopatch.patched(training=False):
        yield


def jitter_both(make_input, seed: int, **kwargs):
    """Stock's and the patched ColorJitter's outputs for the same seed, and whether each left
    torch's generator in the same state."""
    with nanopatch.unpatched():
        stock = v2.ColorJitter(**kwargs)
        torch.manual_seed(seed)
        expected = stock(make_input())
        after_stock = torch.rand(3)
    torch.manual_seed(seed)
    fast = v2.ColorJitter(**kwargs)
    assert type(fast).__module__.startswith("nanopatch.")
    got = fast(make_input())
    return expected, got, torch.equal(after_stock, torch.rand(3))


@pytest.mark.parametrize("wrap", [lambda t: t, tv_tensors.Image], ids=["tensor", "tv_tensors.Image"])
def test_color_jitter_on_a_uint8_tensor_gives_v2s_values_type_and_draws(patched_vision, wrap):
    image = noise((3, 64, 48), seed=5)
    for seed in range(12):
        expected, got, same_draws = jitter_both(
            lambda: wrap(image), seed, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1
        )
        assert same_draws
        assert type(got) is type(expected) and got.dtype == torch.uint8 and got.shape == expected.shape
        assert got.is_contiguous()
        # hue's one level can grow by a later contrast or saturation factor above 1 (<= 1.4 each)
        assert levels_apart(got, expected) <= 2, seed
        assert (got != expected).float().mean() < 1e-3
    expected, got, _ = jitter_both(lambda: wrap(image), 3, hue=0.2)
    assert levels_apart(got, expected) <= 1
    expected, got, _ = jitter_both(lambda: wrap(image), 4, brightness=0.5, contrast=(0.2, 1.8))
    assert torch.equal(got, expected)


def test_color_jitter_that_adjusts_nothing_hands_the_input_back(patched_vision):
    image = noise((3, 16, 16))
    assert v2.ColorJitter()(image) is image


@pytest.mark.parametrize(
    "make",
    [
        lambda: noise((3, 32, 32)).float() / 255,  # float
        lambda: noise((2, 3, 32, 32)),  # a batch
        lambda: noise((1, 32, 32)),  # one channel
        lambda: noise((3, 32, 64))[:, :, ::2],  # not contiguous
    ],
    ids=["float", "batch", "grey", "strided"],
)
def test_inputs_the_kernels_do_not_take_run_v2s_own(patched_vision, make):
    expected, got, same_draws = jitter_both(make, 7, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    assert same_draws and type(got) is type(expected) and torch.equal(got, expected)


# ----------------------------------------------------------------------------------------------
# ToDtype(float32, scale=True) [+ Normalize] fused in a v2 Compose on a uint8 tensor

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def tensor_pipelines():
    """(name, builder) of v2 Composes as the tensor path writes them, and ones that must not fuse."""
    tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return {
        "train": lambda: v2.Compose([v2.RandomResizedCrop(32, antialias=True), v2.RandomHorizontalFlip(), *tail]),
        "no normalize": lambda: v2.Compose([v2.CenterCrop(24), v2.ToDtype(torch.float32, scale=True)]),
        "jitter first": lambda: v2.Compose([v2.ColorJitter(0.4, 0.4, 0.4, 0.1), *tail]),
        "float64": lambda: v2.Compose([v2.ToDtype(torch.float64, scale=True), v2.Normalize(MEAN, STD)]),
        "unscaled": lambda: v2.Compose([v2.ToDtype(torch.float32), v2.Normalize(MEAN, STD)]),
        "geometry only": lambda: v2.Compose([v2.RandomHorizontalFlip(), v2.CenterCrop(20)]),
        # resizes, crops, flips and the jitter before the conversion; steps that do not fuse
        "val": lambda: v2.Compose([v2.Resize(34, antialias=True), v2.CenterCrop(30), *tail]),
        "resize max_size": lambda: v2.Compose([v2.Resize(20, max_size=25, antialias=True), *tail]),
        "flips and jitter": lambda: v2.Compose(
            [
                v2.RandomVerticalFlip(),
                v2.RandomResizedCrop((28, 33), antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ColorJitter(0.4, 0.4, 0.4, 0.1),
                *tail,
            ]
        ),
        "enlarging crop": lambda: v2.Compose([v2.CenterCrop(50), v2.RandomResizedCrop(64, antialias=True), *tail]),
        "bicubic": lambda: v2.Compose([v2.RandomResizedCrop(32, interpolation=v2.InterpolationMode.BICUBIC), *tail]),
        "a Lambda inside": lambda: v2.Compose(
            [v2.RandomResizedCrop(32, antialias=True), v2.Lambda(lambda t: t), *tail]
        ),
    }


@pytest.mark.parametrize("name", list(tensor_pipelines()))
@pytest.mark.parametrize("wrap", [lambda t: t, tv_tensors.Image], ids=["tensor", "tv_tensors.Image"])
@pytest.mark.parametrize("layout", ["chw", "decoded"])
def test_fused_to_float_on_tensors_equals_v2(patched_vision, name, wrap, layout):
    """The same values, type and memory layout as stock's steps, for a CHW tensor and for what
    ``torchvision.io.decode_jpeg`` returns (a channels-last view of HWC memory, kept by v2's
    resizes and crops)."""
    build = tensor_pipelines()[name]
    if layout == "chw":
        image = noise((3, 40, 36), seed=11)
    else:
        image = noise((40, 36, 3), seed=11).permute(2, 0, 1)
    for seed in range(4):
        with nanopatch.unpatched():
            stock = build()
            torch.manual_seed(seed)
            expected = stock(wrap(image))
            after_stock = torch.rand(2)
        fast = build()
        torch.manual_seed(seed)
        got = fast(wrap(image))
        assert torch.equal(after_stock, torch.rand(2))
        assert type(got) is type(expected) and got.dtype == expected.dtype
        assert got.stride() == expected.stride(), (name, layout)
        if name in ("jitter first", "flips and jitter"):  # the hue's one level, over std after Normalize
            assert float((got - expected).abs().max()) <= 2 / 255 / min(STD) + 1e-6
        else:
            assert torch.equal(got, expected), name


def test_fused_to_float_takes_decode_jpeg_layouts(patched_vision, monkeypatch):
    """The lookup really runs (a spy on OpenCV's LUT) for a decoded image's layouts: a
    channels-last image resized (channels-last out), and a crop of it (contiguous CHW out)."""
    calls = []
    real = _tensor_color.cv2

    class Spy:
        def __getattr__(self, name):
            if name == "LUT":
                calls.append(name)
            return getattr(real(), name)

    monkeypatch.setattr(_tensor_color, "cv2", lambda: Spy())
    decoded = noise((40, 36, 3), seed=4).permute(2, 0, 1)
    tensor_pipelines()["resize max_size"]()(decoded)
    assert calls == ["LUT"]  # one interleaved lookup
    calls.clear()
    tensor_pipelines()["val"]()(decoded)
    assert calls in (["LUT"], ["LUT"] * 3)


def test_fused_to_float_leaves_other_inputs_to_v2(patched_vision):
    build = tensor_pipelines()["train"]
    for make in (lambda: noise((3, 40, 36)).float() / 255, lambda: noise((2, 3, 40, 36)), lambda: noise((1, 40, 36))):
        with nanopatch.unpatched():
            torch.manual_seed(0)
            expected = build()(make())
        torch.manual_seed(0)
        assert torch.equal(build()(make()), expected)


def test_fused_compose_pickles_and_follows_a_changed_normalize(patched_vision):
    import pickle

    compose = tensor_pipelines()["no normalize"]()
    image = noise((3, 30, 30), seed=2)
    first = compose(image)
    again = pickle.loads(pickle.dumps(compose))
    assert "_nanopatch_tensor_plan" not in again.__dict__ and torch.equal(again(image), first)
    compose.transforms.append(v2.Normalize(MEAN, STD))  # a new list of steps: planned anew
    with nanopatch.unpatched():
        expected = v2.Compose([v2.CenterCrop(24), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])(
            image
        )
    assert torch.equal(compose(image), expected)


# ----------------------------------------------------------------------------------------------
# ColorJitter on every layout a tensor pipeline hands it

LAYOUTS = {
    "chw": lambda: noise((3, 40, 36), seed=21),
    "decoded": lambda: noise((40, 36, 3), seed=21).permute(2, 0, 1),  # torchvision.io.decode_jpeg's
    "decoded crop": lambda: noise((48, 44, 3), seed=21).permute(2, 0, 1)[:, 3:43, 5:41],  # CenterCrop's view
    "chw crop": lambda: noise((3, 48, 44), seed=21)[:, 3:43, 5:41],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(
    "kwargs",
    [
        {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
        {"brightness": 0.5, "contrast": (0.2, 1.8)},
        {"hue": 0.3},
        {"saturation": 0.6},
    ],
    ids=["all", "tables", "hue", "saturation"],
)
def test_color_jitter_keeps_v2s_layout_on_every_layout(patched_vision, layout, kwargs):
    """Values as v2's (tables equal, hue within one level, grown by a later factor) and the
    very strides v2's ops give (the tables keep the input's dimension order, hue ends
    contiguous), for planar and channels-last tensors and crops of them."""
    make = LAYOUTS[layout]
    assert _tensor_color.accepts(make())
    for seed in range(6):
        expected, got, same_draws = jitter_both(make, seed, **kwargs)
        assert same_draws and type(got) is type(expected)
        assert got.stride() == expected.stride(), (layout, seed)
        if "hue" in kwargs:
            assert levels_apart(got, expected) <= 2
        else:
            assert torch.equal(got, expected)
