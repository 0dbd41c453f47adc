"""v2's RandomResizedCrop [+ flips] + ToDtype(float32, scale=True) [+ Normalize] on a uint8 image
tensor (torchvision's advised tensor path) fused under nanopatch: the box resized by v2's own
kernel from an interleaved copy, stock's values, type, memory layout and random draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F2
from torchvision.transforms.v2.functional import _geometry as F2_geometry

import nanopatch
from nanopatch.targets.vision import _tensor_geometry, transforms_v2

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
#: whether this torchvision resizes uint8 images with torch's uint8 kernel on this CPU (0.23 does
#: only where the capability reads "AVX2", not "AVX512": elsewhere it computes in float, and
#: nanopatch leaves its steps alone)
NATIVE = transforms_v2._native_uint8_bilinear()


def noise(shape, seed=0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


LAYOUTS = {
    "decoded": lambda: noise((45, 52, 3), seed=3).permute(2, 0, 1),  # torchvision.io.decode_jpeg's
    "chw": lambda: noise((3, 45, 52), seed=3),
}


@pytest.fixture
def patched_vision():
    with nanopatch.patched(training=False):
        yield


@pytest.fixture
def fused_calls(monkeypatch):
    """The boxes the fused resize really computed."""
    _tensor_geometry.usable()  # checked before the spy: its own calls are not the pipeline's
    calls = []
    real = _tensor_geometry.resized_crop

    def spy(image, top, left, height, width, size):
        calls.append((top, left, height, width))
        return real(image, top, left, height, width, size)

    monkeypatch.setattr(_tensor_geometry, "resized_crop", spy)
    return calls


def both(build, make_input, seed):
    """Stock's and the patched pipeline's outputs for the same seed, and whether both left torch's
    generator in the same state."""
    with nanopatch.unpatched():
        stock = build()
        torch.manual_seed(seed)
        expected = stock(make_input())
        after_stock = torch.rand(3)
    fast = build()
    torch.manual_seed(seed)
    got = fast(make_input())
    return expected, got, torch.equal(after_stock, torch.rand(3))


def train(size=32, **kwargs):
    return lambda: v2.Compose(
        [
            v2.RandomResizedCrop(size, antialias=True, **kwargs),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def test_the_fast_resize_is_checked_usable_where_v2_resizes_uint8():
    assert _tensor_geometry.usable() is NATIVE


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("wrap", [lambda t: t, tv_tensors.Image], ids=["tensor", "tv_tensors.Image"])
def test_train_pipeline_gives_stocks_values_layout_type_and_draws(patched_vision, fused_calls, layout, wrap):
    """Many draws, flipped and not: boxes inside the image (stock's result planar), and whole rows
    of it (RandomResizedCrop's fallback for ratios wider than the image: for a decoded image,
    dense channels-last memory, which stock's result keeps)."""
    layouts = set()
    for build in (train(), train(scale=(0.9, 1.0), ratio=(1.3, 1.5))):
        for seed in range(20):
            expected, got, same_draws = both(build, lambda: wrap(LAYOUTS[layout]()), seed)
            assert same_draws, seed
            assert type(got) is type(expected) and got.dtype == torch.float32
            assert got.stride() == expected.stride(), seed
            assert torch.equal(got, expected), seed
            layouts.add(expected.stride())
    assert len(layouts) == (2 if layout == "decoded" else 1)  # both of stock's layouts met
    if not NATIVE:
        assert fused_calls == []
        return
    assert len(fused_calls) == 40  # the fused resize computed every one
    assert any(box[1] == 0 and box[3] == 52 for box in fused_calls)  # whole rows among them


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_both_flips_non_square_outputs_and_no_normalize(patched_vision, fused_calls, layout):
    build = lambda: v2.Compose(  # noqa: E731
        [
            v2.RandomResizedCrop((20, 61), scale=(0.3, 1.0), antialias=True),
            v2.RandomVerticalFlip(p=0.7),
            v2.RandomHorizontalFlip(p=0.3),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )
    for seed in range(12):
        expected, got, same_draws = both(build, LAYOUTS[layout], seed)
        assert same_draws and got.stride() == expected.stride() and torch.equal(got, expected), seed
    assert len(fused_calls) == (12 if NATIVE else 0)


def test_a_box_of_the_output_size_runs_stocks_steps_after_the_draw(patched_vision, fused_calls):
    """RandomResizedCrop whose box is the output size: v2 hands back the box itself."""
    build = train(size=(45, 52), scale=(1.0, 1.0), ratio=(52 / 45, 52 / 45))
    for seed in range(3):
        expected, got, same_draws = both(build, LAYOUTS["decoded"], seed)
        assert same_draws and got.stride() == expected.stride() and torch.equal(got, expected)
    assert fused_calls == []


@pytest.mark.parametrize(
    "build, make_input",
    [
        (train(), lambda: noise((50, 60, 3), seed=1).permute(2, 0, 1)[:, 2:47, 3:55]),  # a crop: not dense
        (train(), lambda: noise((3, 45, 52)).float() / 255),  # float
        (train(), lambda: noise((2, 3, 45, 52))),  # a batch
        (train(), lambda: noise((1, 45, 52))),  # one channel
        (
            lambda: v2.Compose([v2.RandomResizedCrop(32, antialias=False), v2.ToDtype(torch.float32, scale=True)]),
            LAYOUTS["decoded"],
        ),
        (train(interpolation=v2.InterpolationMode.NEAREST), LAYOUTS["decoded"]),
    ],
    ids=["crop", "float", "batch", "grey", "no antialias", "nearest"],
)
def test_what_the_fast_resize_does_not_take_runs_stocks_steps(patched_vision, fused_calls, build, make_input):
    for seed in range(3):
        expected, got, same_draws = both(build, make_input, seed)
        assert same_draws and type(got) is type(expected) and got.stride() == expected.stride()
        assert torch.equal(got, expected)
    assert fused_calls == []


def test_where_v2_resizes_uint8_in_float_its_steps_run(patched_vision, fused_calls, monkeypatch):
    """v2 computes a uint8 bilinear resize in float where torch's uint8 kernel is not its choice
    (a CPU without AVX2): other values, so stock's steps."""
    monkeypatch.setattr(F2_geometry, "_do_native_uint8_resize_on_cpu", lambda interpolation: False, raising=False)
    for seed in range(3):
        expected, got, same_draws = both(train(), LAYOUTS["decoded"], seed)
        assert same_draws and torch.equal(got, expected)
    assert fused_calls == []


@pytest.mark.skipif(not NATIVE, reason="this torchvision resizes uint8 in float on this CPU")
def test_resized_crop_kernel_equals_v2_for_every_box_kind():
    for layout, make in LAYOUTS.items():
        image = make()
        for box in ((0, 0, 45, 52), (4, 0, 30, 52), (0, 6, 45, 40), (7, 9, 21, 30), (44, 51, 1, 1)):
            for size in ((16, 16), (50, 70)):
                stock = F2.resized_crop(image, *box, list(size), antialias=True)
                mine = _tensor_geometry.resized_crop(image, *box, size)
                assert torch.equal(mine, stock), (layout, box, size)
                interleaved = stock.stride(0) == 1
                assert _tensor_geometry.stock_interleaved(image, *box) == interleaved, (layout, box)
