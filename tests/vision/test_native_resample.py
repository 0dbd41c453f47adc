"""nanopatch's compiled copy of Pillow's bilinear pass (nanopatch/targets/vision/native.py):
Pillow's very bytes on any shape, box and memory layout, built once into the cache folder, and
Pillow's own loop, said once, wherever it cannot be had."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from nanopatch.targets.vision import _geometry
from nanopatch.targets.vision import native as _native

from helpers.kernel_workers import noise_folder, run_in_workers

REQUIRED = os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE") == "1"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state where the kernel was never loaded, with an empty cache folder."""
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_why_not", None)
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(_native.VARIABLE, raising=False)
    monkeypatch.setattr("nanopatch.foundation.log._first_time", lambda key, about=None: True)
    return tmp_path


@pytest.fixture
def fn():
    kernel = _native.kernel()
    if kernel is None:
        if REQUIRED:
            pytest.fail(f"NANOPATCH_TEST_REQUIRE_NATIVE=1 but the kernel is not used: {_native.why_not()}")
        pytest.skip(f"no compiled kernel here: {_native.why_not()}")
    return kernel


def random_case(rng):
    in_h = int(rng.integers(1, 400))
    row = int(rng.integers(1, 700))
    out_h = int(rng.choice([rng.integers(1, 20), rng.integers(1, 500)]))
    span = None
    if rng.random() < 0.4:
        lo = float(rng.uniform(0, in_h * 0.6))
        hi = float(rng.uniform(lo + 0.01, in_h))
        span = (lo, hi)
    return in_h, row, out_h, span


def test_gives_pillows_bytes_on_random_shapes_and_boxes(fn):
    rng = np.random.default_rng(2026)
    for _ in range(300):
        in_h, row, out_h, span = random_case(rng)
        pixels = rng.integers(0, 256, (in_h, row), dtype=np.uint8)
        mine = _native.rows(fn, pixels, out_h, span)
        assert mine is not None
        expected = _geometry._pillow_rows_l(pixels, out_h, span)
        np.testing.assert_array_equal(mine, expected, err_msg=str((in_h, row, out_h, span)))


def test_extreme_reductions_and_flat_images(fn):
    rng = np.random.default_rng(3)
    for in_h, row, out_h in ((1800, 30, 1), (3000, 5, 2), (2, 40, 1000), (1, 1, 1)):
        for pixels in (rng.integers(0, 256, (in_h, row), dtype=np.uint8), np.full((in_h, row), 255, np.uint8)):
            np.testing.assert_array_equal(
                _native.rows(fn, pixels, out_h, None), _geometry._pillow_rows_l(pixels, out_h, None)
            )


def test_strided_and_read_only_views(fn):
    """A crop of an HWC image (lines further apart than their bytes) and a read-only array are
    read where they are, with the same bytes as their contiguous copies."""
    rng = np.random.default_rng(4)
    image = rng.integers(0, 256, (120, 90, 3), dtype=np.uint8)
    crop = image[7:101, 11:80]
    assert not crop.flags.c_contiguous
    frozen = image.copy()
    frozen.flags.writeable = False
    for arr in (crop, frozen, image[::2]):
        expected = _geometry._pillow_rows_l(np.ascontiguousarray(arr), 33, None)
        np.testing.assert_array_equal(_native.rows(fn, arr, 33, None), expected)
        np.testing.assert_array_equal(_geometry._pillow_rows(arr, 33, None), expected)


def test_resizes_without_the_kernel_stay_within_one_level(fn, monkeypatch):
    """Where the kernel is not used, whole bilinear resizes (torch's first pass, then Pillow's
    own loop) stay within one level of Pillow's resize; with it, these sizes are Pillow's."""
    rng = np.random.default_rng(5)
    cases = [((375, 500), (256, 341)), ((300, 380), (224, 224)), ((90, 70), (224, 224))]
    images = [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for hw, _ in cases]
    pillow = [
        np.asarray(Image.fromarray(a).resize(size[::-1], Image.BILINEAR))
        for a, (_, size) in zip(images, cases, strict=True)
    ]
    for a, (_, size), want in zip(images, cases, pillow, strict=True):
        np.testing.assert_array_equal(_geometry._bilinear(a, size), want)
    monkeypatch.setattr(_native, "_loaded", {"fn": None, "columns_checked": None})
    for a, (_, size), want in zip(images, cases, pillow, strict=True):
        assert np.abs(_geometry._bilinear(a, size).astype(int) - want).max() <= 1


def test_built_once_into_the_cache_folder(fresh, monkeypatch):
    if _native._compiler() is None:
        pytest.skip("no C compiler here")
    assert _native.kernel() is not None, _native.why_not()
    built = list((fresh / "kernels").glob("resample-*.so"))
    assert len(built) == 1 and not [p for p in (fresh / "kernels").iterdir() if p.name.startswith(".")]
    report = _native.report()
    assert report["used"] and str(built[0]) in report["reason"]

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiling)
    monkeypatch.setattr(_native, "_loaded", {})
    assert _native.kernel() is not None  # loaded from the cache folder


def test_turned_off_by_the_variable(fresh, monkeypatch, caplog):
    monkeypatch.setenv(_native.VARIABLE, "0")
    with caplog.at_level(logging.INFO, logger="nanopatch"):
        assert _native.kernel() is None
        assert _native.kernel() is None
    assert _native.why_not() == "NANOPATCH_NATIVE=0"
    said = [r.getMessage() for r in caplog.records if "resizes run on torch's" in r.getMessage()]
    assert said == ["nanopatch: bilinear resizes run on torch's and Pillow's kernels: NANOPATCH_NATIVE=0"]
    assert not (fresh / "kernels").exists()
    pixels = np.random.default_rng(6).integers(0, 256, (50, 60, 3), dtype=np.uint8)
    expected = np.asarray(Image.fromarray(pixels).resize((40, 30), Image.BILINEAR))
    assert np.abs(_geometry._bilinear(pixels, (30, 40)).astype(int) - expected).max() <= 1


def test_no_compiler_falls_back(fresh, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert _native.kernel() is None
    assert _native.why_not() == "no C compiler (cc, gcc or clang) on PATH"
    assert _native.report() == {"used": False, "reason": "no C compiler (cc, gcc or clang) on PATH"}
    pixels = np.random.default_rng(7).integers(0, 256, (64, 48), dtype=np.uint8)
    np.testing.assert_array_equal(_geometry._pillow_rows(pixels, 20, None), _geometry._pillow_rows_l(pixels, 20, None))


def test_a_failing_build_falls_back(fresh, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a "compiler" that exits 1
    assert _native.kernel() is None
    assert _native.why_not().startswith("false could not build it")
    assert not list((fresh / "kernels").iterdir())  # nothing half-written left behind


def test_a_kernel_that_differs_from_pillow_is_not_used(fresh, monkeypatch):
    def wrong(src, src_stride, row, in_h, in0, in1, out_h, ksize, out, out_stride, scratch, tmp):
        ctypes.memset(out, 0, out_h * out_stride)
        return 0

    monkeypatch.setattr(_native, "_load", lambda: wrong)
    assert _native.kernel() is None
    assert _native.why_not() == "the compiled kernel does not give Pillow's bytes on this machine"


def test_inputs_the_kernel_does_not_take_go_to_pillow(fn):
    assert _native.rows(fn, np.zeros((0, 5), np.uint8), 3, None) is None
    assert _native.rows(fn, np.zeros((4, 5), np.float32), 3, None) is None
    empty_rows = _native.rows(fn, np.zeros((4, 0), np.uint8), 3, None)
    assert empty_rows is not None and empty_rows.shape == (3, 0)


WORKER_SCRIPT = """
import sys, torch, torchvision, nanopatch
import torchvision.transforms as T
from nanopatch.targets.vision import native as _native
nanopatch.patch_torch()

# A target transform: whether the worker that loads the sample resized on the compiled kernel.
class Probe:
    def __call__(self, label):
        return torch.tensor([_native.kernel() is not None])

if __name__ == "__main__":
    root = sys.argv[1]
    pipeline = lambda: T.Compose([T.Resize(37), T.CenterCrop(33), T.ToTensor()])
    with nanopatch.unpatched():  # stock's tensors: small images resize exactly on the kernel
        ds = torchvision.datasets.ImageFolder(root, transform=pipeline())
        expected = torch.stack([ds[i][0] for i in range(len(ds))])
    for method in ("fork", "spawn", "forkserver"):
        _native._loaded.clear()  # never loaded here: each worker loads (or builds) it itself
        ds = torchvision.datasets.ImageFolder(root, transform=pipeline(), target_transform=Probe())
        loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context=method)
        batches = list(loader)
        assert torch.equal(torch.cat([images for images, _ in batches]), expected), method
        assert torch.cat([probe for _, probe in batches]).all(), method
        print(method, "ok")
"""


@pytest.mark.py_only  # worker processes of each start method
def test_dataloader_workers_build_and_use_it(tmp_path):
    """DataLoader workers of every start method, starting from an empty cache folder (the first
    two build it at once), resize on the kernel, with stock's very tensors."""
    if _native._compiler() is None and not REQUIRED:
        pytest.skip("no C compiler here")
    run_in_workers(tmp_path, WORKER_SCRIPT, noise_folder(tmp_path / "images", 8), "resample-*.so")


def test_resizes_are_pillows_pixels_where_both_passes_are_compiled(fn):
    """``resize`` and ``resize_crop`` (a resize computing only a crop of its output) give
    Pillow's very pixels wherever the first pass runs on the compiled kernel too (lines of up to
    1024 RGB pixels shrunk at most 4x, or a first pass down the columns), and stay within one
    level where torch's kernel does it (wider lines)."""
    rng = np.random.default_rng(10)
    exact_cases = 0
    for _ in range(250):
        channels = 3 if rng.random() < 0.85 else 1
        in_h, in_w = int(rng.integers(2, 400)), int(rng.integers(2, 700))
        out_h, out_w = (224, 224) if rng.random() < 0.3 else (int(rng.integers(2, 300)), int(rng.integers(2, 300)))
        arr = rng.integers(0, 256, (in_h + 4, in_w + 6, channels), dtype=np.uint8)[2 : 2 + in_h, 3 : 3 + in_w]
        pillow_in = Image.fromarray(np.ascontiguousarray(arr[:, :, 0] if channels == 1 else arr))
        pillow = np.asarray(pillow_in.resize((out_w, out_h), Image.BILINEAR)).reshape(out_h, out_w, channels)
        height, width = int(rng.integers(1, out_h + 1)), int(rng.integers(1, out_w + 1))
        top, left = int(rng.integers(0, out_h - height + 1)), int(rng.integers(0, out_w - width + 1))
        resized = _geometry.resize(arr, (out_h, out_w))
        cropped = _geometry.resize_crop(arr, (out_h, out_w), top, left, height, width)
        box = pillow[top : top + height, left : left + width]
        compiled_first = (
            _geometry._columns_pay(in_w, out_w, channels)
            or in_w == out_w
            or _geometry._vertical_first((in_h, in_w), (out_h, out_w))
        )
        if compiled_first:
            exact_cases += 1
            np.testing.assert_array_equal(resized, pillow, err_msg=str((arr.shape, out_h, out_w)))
            np.testing.assert_array_equal(cropped, box, err_msg=str((arr.shape, out_h, out_w, top, left)))
        else:
            assert np.abs(resized.astype(int) - pillow).max() <= 1
            assert np.abs(cropped.astype(int) - box).max() <= 1
    assert exact_cases > 100


@pytest.fixture
def columns_fn(fn):
    kernel = _native.columns_kernel()
    assert kernel is not None  # checked against Pillow like the vertical pass
    return kernel


def test_the_horizontal_pass_gives_pillows_bytes(columns_fn):
    """On random widths (multiples of 16 bytes and not), heights (whole tiles of 16 lines and
    not), channels, boxes and strided lines."""
    rng = np.random.default_rng(12)
    for _ in range(300):
        h, w, c = int(rng.integers(1, 70)), int(rng.integers(1, 400)), int(rng.choice([1, 3]))
        out_w = int(rng.integers(1, 500))
        span = None
        if rng.random() < 0.3:
            lo = float(rng.uniform(0, w * 0.6))
            span = (lo, float(rng.uniform(lo + 0.01, w)))
        pixels = rng.integers(0, 256, (h, w + 5, c), dtype=np.uint8)
        arr = pixels[:, :w] if rng.random() < 0.3 else np.ascontiguousarray(pixels[:, :w])
        expected = _geometry._pillow_columns(np.ascontiguousarray(arr), out_w, span)
        np.testing.assert_array_equal(
            _native.columns(columns_fn, arr, out_w, span), expected, err_msg=str((h, w, c, out_w, span))
        )


def test_a_horizontal_pass_that_differs_is_not_used(fn, monkeypatch):
    def wrong(src, src_stride, h, in_w, channels, in0, in1, out_w, ksize, out, out_stride, *scratch):
        ctypes.memset(out, 7, h * out_stride)
        return 0

    monkeypatch.setattr(_native, "_loaded", {"fn": fn, "columns": wrong})
    assert _native.columns_kernel() is None
    assert _native.kernel() is fn  # the vertical pass stays in use
    pixels = np.random.default_rng(13).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    want = np.asarray(Image.fromarray(pixels).resize((30, 20), Image.BILINEAR))
    assert np.abs(_geometry._bilinear(pixels, (20, 30)).astype(int) - want).max() <= 1


def test_a_damaged_kernel_file_is_built_again(fresh):
    if _native._compiler() is None:
        pytest.skip("no C compiler here")
    path = _native.library_path(_native._compiler(), _native._flags())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared object")
    assert _native.kernel() is not None, _native.why_not()
    assert path.read_bytes()[:4] == b"\x7fELF"


def test_an_unusable_cache_folder_falls_back(fresh, monkeypatch):
    (fresh / "kernels").write_text("a file where the folder should be")
    assert _native.kernel() is None
    assert _native.why_not().startswith("could not build or load")
