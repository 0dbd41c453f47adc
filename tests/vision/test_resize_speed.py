"""The faster bilinear resize passes and the box-decoding CenterCrop give the very pixels of the
code they replace.

* torch's pass written straight into an HWC array (``_aa_into``, the ``out=`` form of the op
  ``interpolate`` calls) is ``interpolate`` + interleave, byte for byte;
* Pillow's vertical pass over "RGBX" pixels (``_pillow_rows_rgbx``) is the one over an "L"
  image (``_pillow_rows_l``), and its horizontal pass done as the vertical pass of the
  transposed pixels is Pillow's RGB image pass (``_pillow_columns``);
* so ``resize`` and ``resize_crop`` give what they gave with all three switched off (the code
  before), over many random sizes, crops, layouts (strided, read-only) and both pass orders
  (here with nanopatch's compiled passes off: with them on, those runs are Pillow's very pixels,
  tests/vision/test_native_resample.py);
* a ``CenterCrop`` first in a pipeline over an undecoded file decodes only its box
  (``Pixels.box``) and gives stock's tensors, v1 and v2, also where the crop pads.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import nanopatch
from nanopatch.targets.vision import _geometry as g
from nanopatch.targets.vision._pixels import Pixels

FAST_PATHS = ("_aa_into_usable", "_rgbx_rows_usable", "_axes_alike")


@pytest.fixture(autouse=True)
def no_compiled_passes(monkeypatch):
    """The passes this file compares run where the compiled ones are not used."""
    from nanopatch.targets.vision import native as _native

    monkeypatch.setattr(_native, "_loaded", {"fn": None, "columns_checked": None})


def _before(monkeypatch) -> None:
    """Switch the faster passes off: the code they replace (``interpolate`` + ``cv2.merge``,
    Pillow's "L" image down the rows, its RGB image along them)."""
    for name in FAST_PATHS:
        monkeypatch.setattr(g, name, lambda: False)


def test_the_fast_paths_are_taken_here():
    # each is checked against the path it replaces before it is used; on the pinned versions all hold
    assert [getattr(g, name)() for name in FAST_PATHS] == [True, True, True]


def _cases(seed: int, count: int):
    """(input array, (out_h, out_w), crop box inside the output) drawn at random: sizes from 2 to
    ~520, ImageNet's 224 outputs, one axis unchanged, contiguous / strided / read-only inputs."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        channels = 3 if rng.random() < 0.9 else 1
        in_h, in_w = (int(v) for v in rng.integers(2, 520, 2))
        out_h, out_w = (224, 224) if rng.random() < 0.4 else (int(v) for v in rng.integers(2, 300, 2))
        roll = rng.random()
        if roll < 0.1:
            out_h = in_h
        elif roll < 0.2:
            out_w = in_w
        full = rng.integers(0, 256, (in_h + 7, in_w + 9, channels), dtype=np.uint8)
        layout = int(rng.integers(0, 3))
        if layout == 0:
            arr = full[:in_h, :in_w].copy()
        elif layout == 1:
            arr = full[3 : 3 + in_h, 5 : 5 + in_w]
        else:
            arr = full[:in_h, :in_w].copy()
            arr.flags.writeable = False
        height, width = int(rng.integers(1, out_h + 1)), int(rng.integers(1, out_w + 1))
        box = (int(rng.integers(0, out_h - height + 1)), int(rng.integers(0, out_w - width + 1)), height, width)
        yield arr, (out_h, out_w), box


@pytest.mark.parametrize("seed", [0, 1])
def test_resize_is_bit_identical_to_the_code_before(seed, monkeypatch):
    cases = list(_cases(seed, 400))
    now = [(g.resize(arr, size), g.resize_crop(arr, size, *box)) for arr, size, box in cases]
    orders = {g._vertical_first(arr.shape[:2], size) for arr, size, _ in cases}
    assert orders == {True, False}  # both pass orders were drawn
    _before(monkeypatch)
    for (arr, size, box), (resized, cropped) in zip(cases, now, strict=True):
        want = g.resize(arr, size)
        assert resized.shape == want.shape and np.array_equal(resized, want), (arr.shape, size)
        want = g.resize_crop(arr, size, *box)
        assert cropped.shape == want.shape and np.array_equal(cropped, want), (arr.shape, size, box)


def test_imagenet_crops_are_bit_identical_to_the_code_before(monkeypatch):
    """RandomResizedCrop(224)'s boxes on 500x375 and 375x500 images, and Resize(256)'s sizes."""
    from torchvision import transforms as T

    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((375, 500, 3), (500, 375, 3))]
    torch.manual_seed(0)
    crop = T.RandomResizedCrop(224)
    cases = []
    for i in range(300):
        arr = images[i % 2]
        top, left, height, width = crop.get_params(torch.empty(3, *arr.shape[:2]), crop.scale, crop.ratio)
        cases.append((arr[top : top + height, left : left + width], (224, 224)))
    cases += [(images[0], (256, 341)), (images[1], (341, 256))]
    now = [g.resize(arr, size) for arr, size in cases]
    _before(monkeypatch)
    for (arr, size), got in zip(cases, now, strict=True):
        assert np.array_equal(got, g.resize(arr, size)), (arr.shape, size)


@pytest.mark.parametrize("row", [672, 671, 3, 1])
@pytest.mark.parametrize("span", [None, (2.5, 37.25)])
def test_rgbx_rows_are_the_l_image_rows(row, span):
    rng = np.random.default_rng(row)
    for in_h, out_h in ((40, 17), (40, 73), (40, 40)):
        pixels = rng.integers(0, 256, (in_h, row), dtype=np.uint8)
        want = g._pillow_rows_l(pixels, out_h, span)
        got = g._pillow_rows_rgbx(pixels, out_h, span)
        assert got.shape == want.shape == (out_h, row) and np.array_equal(got, want)
        strided = np.concatenate([pixels, pixels], axis=1)[:, :row]
        assert np.array_equal(g._pillow_rows_rgbx(strided, out_h, span), want)


def test_aa_into_is_interpolate_and_leaves_the_input_alone():
    rng = np.random.default_rng(8)
    for in_hw, out_hw in (((300, 300), (300, 224)), ((300, 300), (224, 300)), ((9, 5), (9, 40)), ((9, 5), (2, 5))):
        pixels = rng.integers(0, 256, (*in_hw, 3), dtype=np.uint8)
        before = pixels.copy()
        t = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
        out = np.empty((*out_hw, 3), np.uint8)
        g._aa_into(t, out)
        assert np.array_equal(out, g._aa_interpolate(t, out_hw))
        assert np.array_equal(pixels, before)


def test_a_single_pass_result_is_not_scratch_memory():
    """A one-axis resize returns torch's output itself: it must not be reused by the next call."""
    rng = np.random.default_rng(9)
    first = rng.integers(0, 256, (50, 40, 3), dtype=np.uint8)
    a = g.resize(first, (50, 30))
    kept = a.copy()
    g.resize(rng.integers(0, 256, (50, 40, 3), dtype=np.uint8), (50, 30))
    g.resize(rng.integers(0, 256, (60, 40, 3), dtype=np.uint8), (30, 33))
    assert np.array_equal(a, kept)


# --- CenterCrop on an undecoded file --------------------------------------------------------


def _jpeg(height: int, width: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([np.sin(x / (5 + c)) * 60 + np.cos(y / (7 + c)) * 50 + 128 for c in range(3)], -1)
    pixels = np.clip(base + rng.normal(0, 15, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=88)
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """JPEGs of odd and even sizes (the anchor rounds both ways), one smaller than the crop."""
    root = tmp_path_factory.mktemp("center-crop-folder")
    (root / "a").mkdir()
    for i, (height, width) in enumerate(((375, 500), (500, 375), (231, 227), (225, 300), (224, 224), (200, 260))):
        (root / "a" / f"{i}.jpg").write_bytes(_jpeg(height, width, i))
    return root


def _pipeline(version: str, size):
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    if version == "v1":
        from torchvision import transforms as T

        return T.Compose([T.CenterCrop(size), T.ToTensor(), T.Normalize(mean, std)])
    from torchvision.transforms import v2

    return v2.Compose(
        [v2.CenterCrop(size), v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    )


def _tensors(root, version: str, size) -> list[np.ndarray]:
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(root), transform=_pipeline(version, size))
    return [dataset[i][0].numpy().copy() for i in range(len(dataset))]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("size", [224, (223, 201), (230, 260)])
def test_center_crop_first_decodes_its_box_and_gives_stocks_tensors(folder, version, size, monkeypatch):
    with nanopatch.unpatched():
        stock = _tensors(folder, version, size)
    boxes = []
    original = Pixels.box

    def counted(self, box, min_size=None):
        boxes.append(box)
        return original(self, box, min_size)

    monkeypatch.setattr(Pixels, "box", counted)
    with nanopatch.patched(training=False):
        patched = _tensors(folder, version, size)
    assert len(patched) == len(stock) == 6
    for got, want in zip(patched, stock, strict=True):
        assert got.shape == want.shape and np.array_equal(got, want)  # a crop and a lookup: exact
    crop_h, crop_w = (size, size) if isinstance(size, int) else size
    sizes = ((375, 500), (500, 375), (231, 227), (225, 300), (224, 224), (200, 260))
    inside = [(h, w) for h, w in sizes if crop_h <= h and crop_w <= w]
    assert len(boxes) == len(inside)  # a crop that pads decodes the whole image
    for box, (h, w) in zip(boxes, inside, strict=True):
        assert box == (round((h - crop_h) / 2.0), round((w - crop_w) / 2.0), crop_h, crop_w)
