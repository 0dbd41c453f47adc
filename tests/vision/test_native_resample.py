"""nanopatch's compiled copy of Pillow's bilinear pass (nanopatch/targets/vision/_native.py):
Pillow's very bytes on any shape, box and memory layout, built once into the cache folder, and
Pillow's own loop, said once, wherever it cannot be had."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

from nanopatch.targets.vision import _geometry, _native

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


def test_resizes_match_pillow_as_before(fn, monkeypatch):
    """Whole bilinear resizes (torch's first pass, then the exact one) give the same pixels with
    the kernel as with Pillow's own loop, and stay within one level of Pillow's resize."""
    rng = np.random.default_rng(5)
    cases = [((375, 500), (256, 341)), ((300, 380), (224, 224)), ((40, 300), (10, 30)), ((90, 70), (224, 224))]
    with_kernel = [_geometry._bilinear(rng.integers(0, 256, (*hw, 3), dtype=np.uint8), size) for hw, size in cases]
    rng = np.random.default_rng(5)
    monkeypatch.setattr(_native, "_loaded", {"fn": None})
    for (hw, size), mine in zip(cases, with_kernel, strict=True):
        pixels = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
        np.testing.assert_array_equal(mine, _geometry._bilinear(pixels, size))
        pillow = np.asarray(Image.fromarray(pixels).resize(size[::-1], Image.BILINEAR))
        assert np.abs(mine.astype(int) - pillow).max() <= 1


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
    said = [r.getMessage() for r in caplog.records if "exact pass runs on Pillow" in r.getMessage()]
    assert said == ["nanopatch: bilinear resizes' exact pass runs on Pillow: NANOPATCH_NATIVE=0"]
    assert not (fresh / "kernels").exists()
    pixels = np.random.default_rng(6).integers(0, 256, (50, 60, 3), dtype=np.uint8)
    expected = np.asarray(Image.fromarray(pixels).resize((40, 30), Image.BILINEAR))
    assert np.abs(_geometry._bilinear(pixels, (30, 40)).astype(int) - expected).max() <= 1


def test_no_compiler_falls_back(fresh, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(_native.shutil, "which", lambda name: None)
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
from nanopatch.targets.vision import _native
nanopatch.patch_torch()

# A target transform: whether the worker that loads the sample resized on the compiled kernel.
class Probe:
    def __call__(self, label):
        return torch.tensor([_native.kernel() is not None])

if __name__ == "__main__":
    root = sys.argv[1]
    pipeline = lambda: T.Compose([T.Resize(37), T.CenterCrop(33), T.ToTensor()])
    _native._loaded["fn"] = None  # the expected tensors from Pillow's own loop
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
    two build it at once), resize on the kernel, with the bytes of Pillow's own loop."""
    if _native._compiler() is None and not REQUIRED:
        pytest.skip("no C compiler here")
    from conftest import child_env, run_python

    rng = np.random.default_rng(8)
    for cls in ("a", "b"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for i in range(3):
            noise = rng.integers(0, 256, (int(rng.integers(40, 90)), int(rng.integers(40, 90)), 3), dtype=np.uint8)
            Image.fromarray(noise).save(tmp_path / "images" / cls / f"{i}.jpg", quality=90)
    script = tmp_path / "workers.py"
    script.write_text(WORKER_SCRIPT)
    env = child_env(NANOPATCH_CACHE_DIR=str(tmp_path / "cache"))
    proc = run_python([str(script), str(tmp_path / "images")], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fork", "ok", "spawn", "ok", "forkserver", "ok"]
    assert len(list((tmp_path / "cache" / "kernels").glob("resample-*.so"))) == 1
