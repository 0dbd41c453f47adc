"""nanopatch.targets.vision._geometry against torchvision.transforms.functional on PIL images.

pad must be bit-exact; gaussian_blur must stay within 1 grey level (mean difference <= 0.5 per
channel) and differ on a tiny fraction of values (resize, crops and flips:
test_transforms_parity.py and test_resize_fusion.py). Every call also checks
that the input is left alone (it is made read-only) and that the result is a fresh
(H, W, C) uint8 array.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torchvision.transforms.functional as F
from PIL import Image

from nanopatch.targets.vision import _geometry as G
from nanopatch.targets.vision._opencv import cv2

SMALL_SIZES = [(1, 1), (1, 9), (7, 1), (2, 2), (2, 3), (5, 8), (13, 13), (31, 17), (17, 64), (64, 64), (100, 37)]


# --- helpers -----------------------------------------------------------------------------------


def make_image(rng: np.random.Generator, height: int, width: int, channels: int, kind: str = "noise") -> np.ndarray:
    """noise, smooth (an upsampled random grid) or flat (constant blocks: exact-integer cases)."""
    if kind == "noise":
        return rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    grid = rng.integers(0, 256, (4, 5, channels), dtype=np.uint8)
    if kind == "smooth":
        out = cv2().resize(grid, (width, height), interpolation=cv2().INTER_CUBIC)
    else:
        out = cv2().resize(grid, (width, height), interpolation=cv2().INTER_NEAREST)
    return out.reshape(height, width, channels)


def stock(fn, arr: np.ndarray, *args, **kwargs) -> np.ndarray:
    image = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
    out = np.asarray(fn(image, *args, **kwargs))
    return out[:, :, None] if out.ndim == 2 else out


def ours(fn, arr: np.ndarray, *args, **kwargs) -> np.ndarray:
    """Call a kernel on a read-only input and check it is untouched and the result well-formed."""
    frozen = arr.copy()
    frozen.setflags(write=False)
    out = fn(frozen, *args, **kwargs)
    assert np.array_equal(frozen, arr), "input modified"
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim == 3
    assert out.shape[2] == arr.shape[2]
    assert not np.shares_memory(out, frozen)
    return out


def assert_exact(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != stock {ref.shape}"
    if not np.array_equal(out, ref):
        diff = np.abs(out.astype(np.int16) - ref)
        pytest.fail(f"{what}: {int((diff > 0).sum())} values differ from stock (max {int(diff.max())})")


def assert_close(out: np.ndarray, ref: np.ndarray, what: str) -> int:
    """Within 1 everywhere and mean <= 0.5 per channel; returns the number of differing values."""
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != stock {ref.shape}"
    diff = np.abs(out.astype(np.int16) - ref)
    assert diff.max(initial=0) <= 1, f"{what}: max diff {int(diff.max())}"
    assert (diff.reshape(-1, diff.shape[2]).mean(axis=0) <= 0.5).all(), f"{what}: mean diff too large"
    return int((diff > 0).sum())


def random_size(rng: np.random.Generator, large: bool = False) -> tuple[int, int]:
    if large:
        return int(rng.integers(600, 1000)), int(rng.integers(600, 1000))
    if rng.random() < 0.4:
        return SMALL_SIZES[int(rng.integers(len(SMALL_SIZES)))]
    return int(rng.integers(1, 130)), int(rng.integers(1, 130))


def random_fill(rng: np.random.Generator, channels: int):
    choice = int(rng.integers(7))
    if choice == 0:
        return None
    if choice == 1:
        return int(rng.integers(0, 256))
    if choice == 2:
        return float(rng.uniform(-10, 300))  # stock truncates with int() and Pillow clamps
    if choice == 3:
        return [int(rng.integers(0, 256))]
    if choice == 4:
        return tuple(int(v) for v in rng.integers(-20, 280, channels))
    if choice == 5:
        return [float(v) for v in rng.uniform(0, 255, channels)]
    return 0


# --- layouts and threads --------------------------------------------------------


def test_non_contiguous_inputs():
    rng = np.random.default_rng(32)
    base = make_image(rng, 40, 60, 3)
    views = [base[:, ::-1], base[::2, 1::3], np.asfortranarray(base), base[:, :, :1], base.transpose(1, 0, 2)]
    for arr in views:
        for fn, stock_fn, args in (
            (G.pad, F.pad, ([3, 1, 0, 2], 0, "symmetric")),
            (G.pad, F.pad, ([2, 0, 4, 1], (9, 8, 7)[: arr.shape[2]], "constant")),
        ):
            assert_exact(ours(fn, arr, *args), stock(stock_fn, np.ascontiguousarray(arr), *args), fn.__name__)
        blur = ([5, 3], [1.5, 0.7])
        assert_close(ours(G.gaussian_blur, arr, *blur), stock(F.gaussian_blur, arr, *blur), "gaussian_blur")


def test_scratch_memory_is_per_thread():
    """gaussian_blur writes into a per-thread work array: threads blurring at once do not mix."""
    rng = np.random.default_rng(33)
    jobs = [(make_image(rng, 40 + 7 * i, 60 - 5 * i, 3 if i % 2 else 1), [2 * (i % 3) + 3, 5]) for i in range(8)]
    expected = [G.gaussian_blur(arr, size, [1.1, 0.9]) for arr, size in jobs]
    failures = []

    def work(offset: int) -> None:
        for round_ in range(4):
            for i in range(len(jobs)):
                k = (i + offset + round_) % len(jobs)
                if not np.array_equal(G.gaussian_blur(jobs[k][0], jobs[k][1], [1.1, 0.9]), expected[k]):
                    failures.append((offset, i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


# --- arguments that go back to stock ------------------------------------------------------------


def expect_fallback(fn, stock_fn, arr, *args, stock_fails: bool, **kwargs) -> None:
    with pytest.raises(NotImplementedError):
        fn(arr, *args, **kwargs)
    if stock_fails:
        with pytest.raises(Exception):  # noqa: B017 - stock's own error, whichever it is
            stock(stock_fn, arr, *args, **kwargs)


# --- gaussian_blur -------------------------------------------------------------------------------


def test_gaussian_blur_within_one_level():
    rng = np.random.default_rng(51)
    differing = total = 0
    for case in range(80):
        height, width = random_size(rng)
        channels = int(rng.choice([1, 3]))
        arr = make_image(rng, height, width, channels, str(rng.choice(["noise", "smooth", "flat"])))
        kx, ky = (int(k) for k in rng.integers(0, 8, 2) * 2 + 1)
        kx, ky = min(kx, 2 * width - 1), min(ky, 2 * height - 1)  # stock's reflect padding needs k // 2 < side
        sigma = float(rng.uniform(0.1, 5.0))
        sigma_pair = [sigma, sigma] if rng.random() < 0.7 else [sigma, float(rng.uniform(0.1, 5.0))]
        args = ([kx, ky], sigma_pair)
        ref = stock(F.gaussian_blur, arr, *args)
        differing += assert_close(ours(G.gaussian_blur, arr, *args), ref, f"case {case}: {arr.shape} {args}")
        total += ref.size
    # Only float32 summation-order ties: about 1e-5 of the values in practice.
    assert differing <= max(5, total // 2000), f"{differing} of {total} values differ"


def test_gaussian_blur_argument_forms_and_identity():
    rng = np.random.default_rng(52)
    arr = make_image(rng, 33, 47, 3, "smooth")
    assert_exact(ours(G.gaussian_blur, arr, [1, 1], [2.0, 2.0]), arr, "1x1 kernel")
    for args in (([5, 5], [1.5, 1.5]), (5, 1.5), ([5, 5], [1.5]), ([7, 3], None), ([3, 9], 2)):
        assert_close(ours(G.gaussian_blur, arr, *args), stock(F.gaussian_blur, arr, *args), f"{args}")


def test_gaussian_blur_large_image():
    rng = np.random.default_rng(53)
    arr = make_image(rng, 3000, 4000, 1, "smooth")
    arr[::7, ::5] = rng.integers(0, 256, arr[::7, ::5].shape, dtype=np.uint8)  # some texture
    args = ([5, 3], [1.2, 0.8])
    assert_close(ours(G.gaussian_blur, arr, *args), stock(F.gaussian_blur, arr, *args), "3000x4000")


def test_gaussian_blur_fallbacks():
    rng = np.random.default_rng(54)
    arr = make_image(rng, 3, 10, 3)
    expect_fallback(G.gaussian_blur, F.gaussian_blur, arr, [3, 7], [1.0, 1.0], stock_fails=True)  # 7 // 2 >= 3
    expect_fallback(G.gaussian_blur, F.gaussian_blur, arr, [4, 3], [1.0, 1.0], stock_fails=True)
    expect_fallback(G.gaussian_blur, F.gaussian_blur, arr, [3, 3], [0.0, 1.0], stock_fails=True)
    expect_fallback(G.gaussian_blur, F.gaussian_blur, arr, [3, 3, 3], [1.0, 1.0], stock_fails=True)
    expect_fallback(G.gaussian_blur, F.gaussian_blur, arr, [3, 3], [1.0, 1.0, 1.0], stock_fails=True)
    assert_close(ours(G.gaussian_blur, arr, [3, 5], 1.0), stock(F.gaussian_blur, arr, [3, 5], 1.0), "5 // 2 < 3")


# --- pad -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_pad_is_bit_exact(mode):
    rng = np.random.default_rng([61, len(mode)])
    checked = 0
    for _ in range(150):
        height, width = random_size(rng) if rng.random() < 0.5 else tuple(int(v) for v in rng.integers(1, 6, 2))
        channels = int(rng.choice([1, 3]))
        arr = make_image(rng, height, width, channels)
        form = int(rng.integers(5))
        low = -4 if rng.random() < 0.3 else 0  # negative padding crops
        if form == 0:
            padding = int(rng.integers(low, 25))
        elif form == 1:
            padding = [int(rng.integers(low, 25))]
        elif form == 2:
            padding = [int(rng.integers(low, 25)), int(rng.integers(low, 25))]
        else:
            padding = tuple(int(v) for v in rng.integers(low, 25, 4))
        fill = random_fill(rng, channels)
        args = (padding, 0 if fill is None else fill, mode)
        try:
            ref = stock(F.pad, arr, *args)
        except ValueError:
            expect_fallback(G.pad, F.pad, arr, *args, stock_fails=False)
            continue
        if ref.size == 0:
            expect_fallback(G.pad, F.pad, arr, *args, stock_fails=False)
            continue
        assert_exact(ours(G.pad, arr, *args), ref, f"{arr.shape} pad{args}")
        checked += 1
    assert checked > 100


def test_pad_wider_than_the_image():
    # numpy.pad reflects over and over when the pad exceeds the image; OpenCV's borders agree.
    rng = np.random.default_rng(62)
    for height, width in ((1, 1), (1, 2), (2, 3), (3, 1)):
        arr = make_image(rng, height, width, 3)
        for mode in ("edge", "reflect", "symmetric", "constant"):
            args = ([11, 0, 7, 13], (1, 2, 3), mode)
            assert_exact(ours(G.pad, arr, *args), stock(F.pad, arr, *args), f"{arr.shape} {args}")


def test_pad_large_image():
    rng = np.random.default_rng(63)
    arr = make_image(rng, 3000, 4000, 3)
    for args in ((16, (1, 2, 3), "constant"), ([3, -5, 0, 9], 0, "symmetric")):
        assert_exact(ours(G.pad, arr, *args), stock(F.pad, arr, *args), f"{args}")


def test_pad_fallbacks():
    rng = np.random.default_rng(64)
    arr = make_image(rng, 4, 5, 3)
    expect_fallback(G.pad, F.pad, arr, [-6, 0, 0, 0], 0, "reflect", stock_fails=True)  # crop past the image
    expect_fallback(G.pad, F.pad, arr, [-6, 0, 0, 0], 0, "constant", stock_fails=True)
    expect_fallback(G.pad, F.pad, arr, [1, 2, 3], 0, "constant", stock_fails=True)
    expect_fallback(G.pad, F.pad, arr, 2, 0, "wrap", stock_fails=True)
    expect_fallback(G.pad, F.pad, arr, 2, (1, 2), "constant", stock_fails=True)
    expect_fallback(G.pad, F.pad, arr, 2.5, 0, "edge", stock_fails=True)
    expect_fallback(G.pad, F.pad, arr, [-5, 0, 0, 0], 0, "edge", stock_fails=False)  # stock: an empty image
    # fill is ignored outside constant mode, as stock ignores it
    assert_exact(ours(G.pad, arr, 2, (1, 2), "edge"), stock(F.pad, arr, 2, (1, 2), "edge"), "edge ignores fill")
