"""ColorJitter's compiled passes (``_jitter``): saturation, hue and the "L" sums contrast needs,
each one pass through the pending brightness/contrast table. They give the numpy/OpenCV path's
bytes (which tests/vision/test_color.py holds to Pillow's) on images that cross the passes'
1024-pixel blocks, with and without a pending table, for every colour, and through
``color_jitter`` in all 24 orders; where they cannot be built, the numpy path runs with the same
results, and only it keeps OpenCV's remap limit."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torchvision.transforms.functional as F
from PIL import Image

from nanopatch.foundation import usage
from nanopatch.foundation.compiled import compiler
from nanopatch.targets.vision import _color, _jitter

from helpers.kernel_workers import noise_folder, run_in_workers

REQUIRED = os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE") == "1"


@pytest.fixture
def kernels():
    made = _color._kernels()
    if made is None:
        if REQUIRED:
            pytest.fail(f"the compiled colour passes are required here but did not load: {_jitter._loaded['made'][1]}")
        pytest.skip(f"no compiled colour passes here: {_jitter._loaded['made'][1]}")
    return made


@pytest.fixture
def without(monkeypatch):
    """Turns the compiled passes off for ``_color`` (as where they cannot be built)."""

    def off():
        monkeypatch.setitem(_jitter._loaded, "made", (None, "off for the test"))

    return off


def _images(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for h, w in ((1, 1), (1, 1023), (1, 1025), (37, 61), (48, 64), (3, 2000)):
        out.append(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        y = np.linspace(0, 1, h)[:, None, None]
        x = np.linspace(0, 1, w)[None, :, None]
        smooth = 127.5 + 127.5 * np.sin(3 * x + 2 * y * np.arange(1, 4) + rng.uniform(0, 6, 3))
        out.append(np.clip(smooth + rng.normal(0, 3, smooth.shape), 0, 255).astype(np.uint8))
    return out


def test_each_pass_is_the_numpy_path(kernels):
    rng = np.random.default_rng(1)
    tables = _color._hue_tables()
    for arr in _images(2):
        lut = rng.integers(0, 256, 256, dtype=np.uint8)
        for table in (None, lut, np.arange(256, dtype=np.uint8)):
            through = arr if table is None else table[arr]
            assert kernels.luma_sum(arr, table) == _color._luma_sum_numpy(through)
            for alpha in (0.0, 0.37, 1.0, 1.41, -0.6, 2.9, 40.0):
                alpha = np.float32(alpha)
                got, total = kernels.saturation(arr, alpha, table, True)
                want = _color._saturation_numpy(through, alpha)
                np.testing.assert_array_equal(got, want, err_msg=f"saturation {alpha}, {arr.shape}")
                assert total == _color._luma_sum_numpy(want)
                assert kernels.saturation(arr, alpha, table, False)[1] == 0
            for shift in (0, 1, 25, 128, 231, 255):
                got, total = kernels.hue(arr, shift, tables, table, True)
                want = _color._hue_numpy(through, shift)
                np.testing.assert_array_equal(got, want, err_msg=f"hue {shift}, {arr.shape}")
                assert total == _color._luma_sum_numpy(want)


def test_hue_is_the_numpy_path_for_every_colour(kernels):
    c = np.arange(1 << 24, dtype=np.uint32).reshape(4096, 4096)
    rgb = np.stack([c >> 16, (c >> 8) & 255, c & 255], axis=-1).astype(np.uint8)
    tables = _color._hue_tables()
    for shift, rows in ((26, slice(0, 2048)), (128, slice(2048, 4096))):
        part = np.ascontiguousarray(rgb[rows])
        np.testing.assert_array_equal(kernels.hue(part, shift, tables)[0], _color._hue_numpy(part, shift))


def test_they_read_any_layout_and_refuse_other_arrays(kernels):
    arr = _images(3)[6]
    flipped = arr[:, ::-1]
    np.testing.assert_array_equal(
        kernels.saturation(flipped, np.float32(0.5))[0], _color._saturation_numpy(flipped, np.float32(0.5))
    )
    for bad in (arr[..., :1], arr.astype(np.int16), arr[0]):
        with pytest.raises(ValueError):
            kernels.hue(bad, 3, _color._hue_tables())


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_color_jitter_is_the_same_with_and_without_them(kernels, without, order):
    rng = np.random.default_rng([7, *order])
    arrs = _images(4)
    cases = [(0.0, 2.0, 0.0, 0.5), (2.0, 0.0, 2.0, -0.5), (1.0, 1.0, 1.0, 0.0), (1.3, 0.7, None, 0.05)]
    cases += [tuple(float(x) for x in (*rng.uniform(0.6, 1.4, 3), rng.uniform(-0.1, 0.1))) for _ in range(3)]
    with_them = [[_color.color_jitter(arr, order, *f) for f in cases] for arr in arrs]
    without()
    for arr, outs in zip(arrs, with_them, strict=True):
        for factors, out in zip(cases, outs, strict=True):
            np.testing.assert_array_equal(
                out, _color.color_jitter(arr, order, *factors), err_msg=f"{order} {factors} {arr.shape}"
            )


def test_color_jitter_marks_their_use(kernels):
    arr = _images(5)[3]
    usage._marked.discard("jitter-kernel")
    _color.color_jitter(arr, [0, 1], 1.2, 0.8, None, None)  # tables only: no pass of theirs
    assert "jitter-kernel" not in usage._marked
    _color.color_jitter(arr, [0, 1, 2, 3], 1.2, 0.8, 1.3, 0.1)
    assert "jitter-kernel" in usage._marked


def test_hue_past_opencvs_remap_limit(kernels, without):
    """Only the numpy path remaps with OpenCV, whose maps stop at 32767 pixels a side."""
    arr = np.random.default_rng(6).integers(0, 256, (2, _color._REMAP_LIMIT + 5, 3), dtype=np.uint8)
    want = np.asarray(F.adjust_hue(Image.fromarray(arr), 0.2))
    np.testing.assert_array_equal(_color.adjust_hue(arr, 0.2), want)
    np.testing.assert_array_equal(
        _color.color_jitter(arr, [3, 1], None, 0.8, None, 0.2),
        np.asarray(F.adjust_contrast(F.adjust_hue(Image.fromarray(arr), 0.2), 0.8)),
    )
    without()
    with pytest.raises(NotImplementedError):
        _color.adjust_hue(arr, 0.2)
    with pytest.raises(NotImplementedError):
        _color.color_jitter(arr, [3, 1], None, 0.8, None, 0.2)


def test_without_a_compiler_they_are_not_used_and_jitter_still_works(monkeypatch, tmp_path, caplog):
    """Where the passes cannot be built: logged once, --info says why, the numpy path computes."""
    monkeypatch.setattr(_jitter, "_loaded", {})
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NANOPATCH_NATIVE", "0")
    monkeypatch.setattr("nanopatch.foundation.log._first_time", lambda key, about=None: True)
    with caplog.at_level("INFO", logger="nanopatch"):
        assert _color._kernels() is None
    assert _jitter._loaded["made"][1] == "NANOPATCH_NATIVE=0"
    assert _color.jitter_report() == {"used": False, "reason": "NANOPATCH_NATIVE=0"}
    said = [r.getMessage() for r in caplog.records]
    assert said == ["nanopatch: ColorJitter's saturation and hue run on numpy and OpenCV: NANOPATCH_NATIVE=0"]
    assert not list(tmp_path.glob("kernels/*.so"))
    arr = _images(8)[7]
    img = Image.fromarray(arr)
    want = np.asarray(F.adjust_hue(F.adjust_saturation(F.adjust_contrast(img, 1.3), 0.6), -0.07))
    np.testing.assert_array_equal(_color.color_jitter(arr, [1, 2, 3], None, 1.3, 0.6, -0.07), want)


WORKER_SCRIPT = """
import sys, torch, torchvision, nanopatch
import torchvision.transforms as T
from nanopatch.targets.vision import _jitter
nanopatch.patch_torch()

# A target transform (it runs after the image's): whether this worker's jitter ran on the passes.
class Probe:
    def __call__(self, label):
        return torch.tensor([_jitter._loaded.get("made", (None,))[0] is not None])

def loader(method, target_transform=None):
    pipeline = T.Compose([T.Resize(37), T.CenterCrop(33), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor()])
    ds = torchvision.datasets.ImageFolder(sys.argv[1], transform=pipeline, target_transform=target_transform)
    torch.manual_seed(0)  # the workers' seeds, so their jitter draws, as stock's
    return torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context=method)

if __name__ == "__main__":
    with nanopatch.unpatched():  # stock's tensors, drawn in forked workers as stock's
        expected = torch.cat([images for images, _ in loader("fork")])
    for method in ("fork", "spawn", "forkserver"):
        _jitter._loaded.clear()  # never loaded here: each worker loads (or builds) them itself
        batches = list(loader(method, Probe()))
        assert torch.equal(torch.cat([images for images, _ in batches]), expected), method
        assert torch.cat([probe for _, probe in batches]).all(), method
        print(method, "ok")
"""


@pytest.mark.py_only  # worker processes of each start method
def test_dataloader_workers_build_and_use_them(tmp_path):
    """DataLoader workers of every start method, from an empty cache folder (the first two build
    the passes at once), jitter on them, with stock's very tensors under the same seeds."""
    if compiler() is None and not REQUIRED:
        pytest.skip("no C compiler here")
    run_in_workers(tmp_path, WORKER_SCRIPT, noise_folder(tmp_path / "images", 9), "jitter-*.so")


def test_passes_that_differ_from_numpy_are_not_used(kernels, monkeypatch, caplog):
    monkeypatch.setattr(_jitter, "_loaded", {})
    monkeypatch.setattr("nanopatch.foundation.log._first_time", lambda key, about=None: True)
    wrong = _jitter.Kernels.hue

    def off_by_one(self, arr, shift, tables, lut=None, want_sum=False):
        out, total = wrong(self, arr, shift, tables, lut, want_sum)
        out[0, 0, 0] ^= 1
        return out, total

    monkeypatch.setattr(_jitter.Kernels, "hue", off_by_one)
    with caplog.at_level("INFO", logger="nanopatch"):
        assert _color._kernels() is None
    assert _color.jitter_report() == {
        "used": False,
        "reason": "the compiled colour passes do not give numpy's values on this machine",
    }
    assert any("run on numpy and OpenCV: the compiled colour passes" in r.getMessage() for r in caplog.records)
    arr = _images(10)[7]
    want = np.asarray(F.adjust_hue(F.adjust_saturation(Image.fromarray(arr), 1.3), 0.05))
    np.testing.assert_array_equal(_color.color_jitter(arr, [2, 3], None, None, 1.3, 0.05), want)
