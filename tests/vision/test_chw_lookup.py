"""ToTensor (+ Normalize) as one compiled pass (``_chw``): interleaved uint8 pixels to float32
planes through a table per channel, the values numpy's indexing gives, on every layout it takes;
it declines the others (writing nothing), and where it cannot be built the OpenCV calls give the
same tensors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from nanopatch.targets.vision import _chw, _pixels

REQUIRED = os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE") == "1"


@pytest.fixture
def kernel():
    if _chw.function() is None:
        if REQUIRED:
            pytest.fail(f"the compiled lookup is required here but did not load: {_chw._loaded['made'][1]}")
        pytest.skip(f"no compiled lookup here: {_chw._loaded['made'][1]}")
    return _chw.function()


def _reference(arr, table):
    return np.stack([table[c][arr[:, :, c]] for c in range(arr.shape[2])])


def test_it_is_numpys_lookup_on_every_layout_it_takes(kernel):
    rng = np.random.default_rng(0)
    for _ in range(60):
        channels = int(rng.choice([1, 2, 3, 4]))
        height, width = int(rng.integers(1, 70)), int(rng.integers(1, 90))
        pad = int(rng.integers(0, 5))
        base = rng.integers(0, 256, (height + 3, width + pad, channels), dtype=np.uint8)
        arr = base[1 : 1 + height, :width]  # rows further apart than their pixels
        table = rng.standard_normal((channels, 256)).astype(np.float32)
        out = np.full((channels, height, width), np.nan, np.float32)
        assert _chw.lookup_into(arr, table, out)
        assert np.array_equal(out, _reference(arr, table))


def test_it_declines_other_layouts_and_writes_nothing(kernel):
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)
    table = rng.standard_normal((3, 256)).astype(np.float32)
    cases = [
        (arr[:, ::-1], table, (3, 8, 10), np.float32),  # mirrored pixels
        (arr[::-1], table, (3, 8, 10), np.float32),  # rows upwards
        (arr[:, ::2], table, (3, 8, 5), np.float32),  # every other pixel
        (arr.astype(np.int16), table, (3, 8, 10), np.float32),
        (arr, table.astype(np.float64), (3, 8, 10), np.float32),
        (arr, table[:2], (3, 8, 10), np.float32),
        (arr, table, (3, 8, 10), np.float64),
        (arr, table, (8, 10, 3), np.float32),
        (arr[:0], table, (3, 0, 10), np.float32),
    ]
    for src, tab, shape, dtype in cases:
        out = np.full(shape, 7, dtype)
        assert not _chw.lookup_into(src, tab, out)
        assert (out == 7).all()
    planes = np.full((3, 10, 8), 7, np.float32).transpose(0, 2, 1)  # not C-contiguous
    assert not _chw.lookup_into(arr, table, planes)
    assert (planes == 7).all()


@pytest.mark.parametrize("channels", [1, 3])
def test_to_tensor_normalize_is_the_same_with_and_without_it(kernel, monkeypatch, channels):
    rng = np.random.default_rng(2)
    arr = rng.integers(0, 256, (37, 53, channels), dtype=np.uint8)
    with_kernel = _pixels.to_tensor_normalize(arr, [0.485, 0.456, 0.406][:channels], [0.229, 0.224, 0.225][:channels])
    monkeypatch.setitem(_chw._loaded, "made", (None, "off for the test"))
    without = _pixels.to_tensor_normalize(arr, [0.485, 0.456, 0.406][:channels], [0.229, 0.224, 0.225][:channels])
    assert with_kernel.is_contiguous() and without.is_contiguous()
    assert torch.equal(with_kernel, without)
    stock = (torch.from_numpy(arr).permute(2, 0, 1).float() / 255).sub(
        torch.tensor([0.485, 0.456, 0.406][:channels])[:, None, None]
    ) / torch.tensor([0.229, 0.224, 0.225][:channels])[:, None, None]
    torch.testing.assert_close(with_kernel, stock, rtol=0, atol=1e-6)


def test_without_a_compiler_it_is_not_used_and_lookups_still_work(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(_chw, "_loaded", {})
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NANOPATCH_NATIVE", "0")
    monkeypatch.setattr("nanopatch.foundation.log._first_time", lambda key, about=None: True)
    with caplog.at_level("INFO", logger="nanopatch"):
        assert _chw.function() is None
    assert _chw._loaded["made"][1] == "NANOPATCH_NATIVE=0"
    assert _chw.report() == {"used": False, "reason": "NANOPATCH_NATIVE=0"}
    said = [r.getMessage() for r in caplog.records]
    assert said == ["nanopatch: ToTensor and Normalize write their planes with OpenCV's calls: NANOPATCH_NATIVE=0"]
    arr = np.random.default_rng(3).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    table = _pixels._lookup_table(3, None, None)
    out = np.zeros((3, 9, 11), np.float32)
    assert not _chw.lookup_into(arr, table, out)
    assert torch.equal(_pixels.lookup(arr, table), torch.from_numpy(_reference(arr, table)))
