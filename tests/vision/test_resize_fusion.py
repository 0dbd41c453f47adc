"""Resizing only what a crop keeps (``functional.resize_crop``) and the Resize + CenterCrop step
a Compose plans from it: the very pixels of the full resize followed by the crop.

* ``resize_crop`` equals ``crop(resize(...))`` bit for bit over random sizes, crops and both
  pass orders, and the full resize it reproduces stays within one grey level of Pillow;
* the one-axis Pillow pass (a vertical pass run as one "L" image of W * C columns, a box along
  the axis) is Pillow's own RGB pass;
* ``_pillow_coefficients`` is Pillow's arithmetic: the source lines it says an output reads are
  the ones Pillow's result depends on;
* the planned Compose step gives the unfused steps' result (and stock's within tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from nanopatch.targets.vision import _geometry as G
from nanopatch.targets.vision import functional as fn
from nanopatch.targets.vision import transforms as nt


def _noise(rng, height, width):
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def _pillow(arr, height, width):
    return np.asarray(Image.fromarray(arr).resize((width, height), Image.BILINEAR))


def _cases(seed, count):
    """(input h, w, output h, w, crop top, left, h, w): short side to 256 (the val pipeline's
    resize, where the second pass can take a Pillow box) and arbitrary sizes, centred and
    arbitrary crops, tall images (Pillow resamples rows first), single-axis resizes."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        in_h, in_w = (int(v) for v in rng.integers(2, 640, 2))
        if i % 7 == 0:
            in_h = in_w * 4 + int(rng.integers(0, 50))  # rows shrink most: vertical pass first
        if i % 3 == 0:
            if in_h <= in_w:
                out_h, out_w = 256, max(2, int(256 * in_w / in_h))
            else:
                out_h, out_w = max(2, int(256 * in_h / in_w)), 256
        elif i % 11 == 0:
            out_h, out_w = in_h, int(rng.integers(2, 400))
        elif i % 13 == 0:
            out_h, out_w = int(rng.integers(2, 400)), in_w
        else:
            out_h, out_w = (int(v) for v in rng.integers(2, 400, 2))
        crop_h, crop_w = int(rng.integers(1, out_h + 1)), int(rng.integers(1, out_w + 1))
        if i % 2:
            top, left = int(rng.integers(0, out_h - crop_h + 1)), int(rng.integers(0, out_w - crop_w + 1))
        else:
            top, left = round((out_h - crop_h) / 2.0), round((out_w - crop_w) / 2.0)
        yield in_h, in_w, out_h, out_w, top, left, crop_h, crop_w


@pytest.mark.parametrize("seed", range(4))
def test_resize_crop_is_the_full_resize_cropped(seed):
    rng = np.random.default_rng(100 + seed)
    boxed = vertical_first = 0
    for in_h, in_w, out_h, out_w, top, left, crop_h, crop_w in _cases(seed, 60):
        arr = _noise(rng, in_h, in_w)
        full = fn.resize(arr, (out_h, out_w))
        assert np.abs(full.astype(int) - _pillow(arr, out_h, out_w)).max() <= 1
        got = fn.resize_crop(arr, (out_h, out_w), top, left, crop_h, crop_w)
        case = (in_h, in_w, out_h, out_w, top, left, crop_h, crop_w)
        assert np.array_equal(got, full[top : top + crop_h, left : left + crop_w]), case
        if G._vertical_first((in_h, in_w), (out_h, out_w)):
            vertical_first += 1
            boxed += G._second_pass_plan(in_w, out_w, left, crop_w) is not None
        elif out_h != in_h and out_w != in_w:
            boxed += G._second_pass_plan(in_h, out_h, top, crop_h) is not None
    assert boxed >= 5 and vertical_first >= 3  # the cases reach both orders and the boxed path


def test_resize_crop_box_as_wide_as_its_output():
    """A boxed second pass whose source lines are as many as its outputs (here an upscale, 5
    columns -> 5) is still a resample, not a copy."""
    rng = np.random.default_rng(0)
    arr = _noise(rng, 538, 374)
    assert G._second_pass_plan(374, 390, 192, 5)[1] - G._second_pass_plan(374, 390, 192, 5)[0] == 5
    got = fn.resize_crop(arr, (157, 390), 2, 192, 154, 5)
    assert np.array_equal(got, fn.resize(arr, (157, 390))[2:156, 192:197])


def test_resize_crop_other_filters_and_crops_that_pad():
    rng = np.random.default_rng(5)
    arr = _noise(rng, 90, 120)
    for mode in (fn.NEAREST, fn.BICUBIC):
        want = fn.crop(fn.resize(arr, (50, 70), mode), 3, 4, 40, 60)
        assert np.array_equal(fn.resize_crop(arr, (50, 70), 3, 4, 40, 60, mode), want)
    want = fn.crop(fn.resize(arr, (50, 70)), -2, -3, 56, 74)  # zeros around, as Pillow pads
    assert np.array_equal(fn.resize_crop(arr, (50, 70), -2, -3, 56, 74), want)
    gray = rng.integers(0, 256, (90, 120, 1), dtype=np.uint8)
    assert np.array_equal(fn.resize_crop(gray, (50, 70), 5, 5, 40, 60), fn.resize(gray, (50, 70))[5:45, 5:65])


def test_val_resize_takes_the_boxed_path():
    """Resize(256) + CenterCrop(224) of a 500x375 image: the second pass (375 -> 256 rows) runs
    on the 224 kept rows and columns only, from the source rows they read."""
    first, last, span = G._second_pass_plan(375, 256, 16, 224)
    assert (first, last) == (23, 352)
    assert span == (0.4375, 328.5625)
    assert G._box_is_pillows()


@pytest.mark.parametrize(("in_hw", "out_hw"), [((83, 61), (40, 61)), ((83, 61), (83, 30)), ((9, 300), (4, 300))])
def test_one_axis_pillow_pass_is_pillows(in_hw, out_hw):
    rng = np.random.default_rng(7)
    arr = _noise(rng, *in_hw)
    vertical = out_hw[1] == in_hw[1]
    assert np.array_equal(G._pillow_pass(arr, out_hw, vertical=vertical), _pillow(arr, *out_hw))
    view = _noise(rng, in_hw[0], in_hw[1] + 5)[:, 2 : 2 + in_hw[1]]  # a strided view
    want = _pillow(np.ascontiguousarray(view), *out_hw)
    assert np.array_equal(G._pillow_pass(view, out_hw, vertical=vertical), want)


@pytest.mark.parametrize(("in_size", "out_size"), [(375, 256), (500, 341), (100, 37), (37, 100), (64, 63)])
def test_coefficient_bounds_are_the_lines_pillow_reads(in_size, out_size):
    """Changing a source row outside an output row's [first, first + count) never changes
    Pillow's value for that row, and changing the rows at its ends does (a gradient probe)."""
    xmin, count, fixed = G._pillow_coefficients(in_size, 0.0, float(in_size), out_size)
    assert fixed.shape[0] == out_size
    sums = fixed.sum(axis=1)
    assert np.all(np.abs(sums - (1 << 22)) <= fixed.shape[1])  # normalised weights
    rng = np.random.default_rng(3)
    base = rng.integers(60, 196, (in_size, 4), dtype=np.uint8)
    want = np.asarray(Image.fromarray(base).resize((4, out_size), Image.BILINEAR)).astype(int)
    for row in rng.choice(in_size, size=min(in_size, 12), replace=False):
        probe = base.copy()
        probe[row] = 255 - probe[row] // 4 * 3  # a large change on one source row
        got = np.asarray(Image.fromarray(probe).resize((4, out_size), Image.BILINEAR)).astype(int)
        changed = np.any(got != want, axis=1)
        reads = (xmin <= row) & (row < xmin + count)
        assert not np.any(changed & ~reads), (row, np.nonzero(changed & ~reads))


@pytest.mark.parametrize("size", [(375, 500), (500, 375), (256, 256), (300, 200), (1200, 250)])
def test_compose_plans_resize_and_center_crop_as_one_step(size):
    pipeline = nt.Compose([nt.Resize(256), nt.CenterCrop(224), nt.ToTensor()])
    plan = pipeline._plan()
    assert isinstance(plan[0], nt.ResizeCenterCrop) and len(plan) == 2
    rng = np.random.default_rng(sum(size))
    img = Image.fromarray(_noise(rng, *size))
    unfused = nt.ToTensor()(nt.CenterCrop(224)(nt.Resize(256)(img)))
    stock = T.ToTensor()(T.CenterCrop(224)(T.Resize(256)(img)))
    got = pipeline(img)
    assert torch.equal(got, unfused)
    assert (got - stock).abs().max() <= 1 / 255 + 1e-6


def test_fused_step_falls_back_where_the_crop_pads():
    """A crop larger than the resized image pads: the steps run one by one (same result)."""
    rng = np.random.default_rng(9)
    img = Image.fromarray(_noise(rng, 60, 80))
    pipeline = nt.Compose([nt.Resize(50), nt.CenterCrop(64)])
    stock = T.Compose([T.Resize(50), T.CenterCrop(64)])
    assert np.array_equal(np.asarray(pipeline(img)), np.asarray(nt.CenterCrop(64)(nt.Resize(50)(img))))
    assert np.abs(np.asarray(pipeline(img)).astype(int) - np.asarray(stock(img))).max() <= 1
