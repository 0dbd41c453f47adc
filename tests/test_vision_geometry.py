"""nanopatch.vision._geometry against torchvision.transforms.functional on PIL images.

affine, rotate and pad must be bit-exact; gaussian_blur must stay within 1 grey level (mean
difference <= 0.5 per channel) and differ on a tiny fraction of values. Every call also checks
that the input is left alone (it is made read-only) and that the result is a fresh
(H, W, C) uint8 array.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torchvision.transforms.functional as F
from PIL import Image
from torchvision.transforms import InterpolationMode

from nanopatch.vision import _geometry as G
from nanopatch.vision._opencv import cv2

NEAREST = InterpolationMode.NEAREST
BILINEAR = InterpolationMode.BILINEAR
BICUBIC = InterpolationMode.BICUBIC

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


def random_angle(rng: np.random.Generator) -> float:
    choices = [0, 90, 180, 270, -90, -180, 360, 45, 30.5, -0.25, 1e-3]
    if rng.random() < 0.35:
        return choices[int(rng.integers(len(choices)))]
    return float(rng.uniform(-360, 360))


# --- affine ------------------------------------------------------------------------------------


def affine_case(rng: np.random.Generator, interpolation, large: bool = False):
    height, width = random_size(rng, large)
    channels = int(rng.choice([1, 3]))
    arr = make_image(rng, height, width, channels, str(rng.choice(["noise", "smooth", "flat"])))
    angle = random_angle(rng)
    if rng.random() < 0.5:
        translate = [int(rng.integers(-width, width + 1)), int(rng.integers(-height, height + 1))]
    else:
        translate = [float(rng.uniform(-20, 20)), float(rng.uniform(-20, 20))]
    scale = float(rng.choice([1.0, 0.5, 2.0, rng.uniform(0.5, 2.0)]))
    shear_kind = int(rng.integers(4))
    if shear_kind == 0:
        shear = 0.0
    elif shear_kind == 1:
        shear = float(rng.uniform(-40, 40))
    elif shear_kind == 2:
        shear = [float(rng.uniform(-40, 40))]
    else:
        shear = [float(rng.uniform(-40, 40)), float(rng.uniform(-40, 40))]
    center = None
    if rng.random() < 0.4:
        center = [int(rng.integers(0, width)), int(rng.integers(0, height))]
        if rng.random() < 0.5:
            center = [center[0] + 0.5, center[1] - 0.25]
    fill = random_fill(rng, channels)
    args = (angle, translate, scale, shear, interpolation, fill, center)
    return arr, args


@pytest.mark.parametrize("interpolation", [NEAREST, BILINEAR, InterpolationMode.NEAREST_EXACT, 0, 2])
def test_affine_is_bit_exact(interpolation):
    rng = np.random.default_rng([11, interpolation if isinstance(interpolation, int) else len(str(interpolation))])
    for case in range(90):
        arr, args = affine_case(rng, interpolation)
        what = f"case {case}: {arr.shape} affine{args}"
        assert_exact(ours(G.affine, arr, *args), stock(F.affine, arr, *args), what)


@pytest.mark.parametrize("interpolation", [NEAREST, BILINEAR])
def test_affine_large_images(interpolation):
    rng = np.random.default_rng(12)
    for case in range(2):
        arr, args = affine_case(rng, interpolation, large=True)
        assert_exact(ours(G.affine, arr, *args), stock(F.affine, arr, *args), f"case {case}: {arr.shape} {args}")


def spy(monkeypatch, name: str) -> list:
    calls = []
    original = getattr(G, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(G, name, wrapper)
    return calls


@pytest.mark.parametrize(
    ("path", "params"),
    [
        # No rotation or shear: Pillow's scale loop (accumulated doubles per row and column).
        ("_scale_tables", dict(angle=0.0, translate=[3, -2], scale=1.7, shear=0.0)),
        ("_scale_tables", dict(angle=0.0, translate=[0.5, 0.25], scale=0.6, shear=0.0)),
        ("_scale_tables", dict(angle=0.0, translate=[-7, 4], scale=1 / 3, shear=0.0)),
        # The usual case: 16.16 fixed point.
        ("_fixed_tables", dict(angle=33.3, translate=[2, 1], scale=1.1, shear=[5.0, -3.0])),
        ("_fixed_tables", dict(angle=90.0, translate=[0, 0], scale=1.0, shear=0.0)),
        # Coordinates beyond fixed point: accumulated doubles along the rows.
        ("_accumulated_tables", dict(angle=12.0, translate=[40000, 3], scale=1.0, shear=4.0)),
        ("_accumulated_tables", dict(angle=-70.0, translate=[0, 0], scale=0.0002, shear=[1.0, 2.0])),
    ],
)
def test_affine_nearest_follows_each_pillow_loop(monkeypatch, path, params):
    calls = spy(monkeypatch, path)
    rng = np.random.default_rng(13)
    for height, width, channels in [(57, 91, 3), (120, 33, 1), (1, 40, 3), (40, 1, 1)]:
        arr = make_image(rng, height, width, channels)
        kwargs = dict(params, interpolation=NEAREST, fill=(7, 8, 9) if channels == 3 else 5)
        assert_exact(ours(G.affine, arr, **kwargs), stock(F.affine, arr, **kwargs), f"{arr.shape} {kwargs}")
    assert len(calls) == 4


def test_affine_bilinear_pure_translation_and_identity():
    # Integer shifts give fractions of exactly 0: Pillow's lerps return the tap unchanged.
    rng = np.random.default_rng(14)
    for translate in ([0, 0], [3, -5], [0.5, 0.5], [-0.25, 7.75]):
        for channels in (1, 3):
            arr = make_image(rng, 45, 62, channels, "flat")
            args = (0.0, translate, 1.0, 0.0, BILINEAR, 17)
            assert_exact(ours(G.affine, arr, *args), stock(F.affine, arr, *args), f"{translate}")


# --- rotate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("interpolation", [NEAREST, BILINEAR])
def test_rotate_is_bit_exact(interpolation):
    rng = np.random.default_rng([21, len(str(interpolation))])
    for case in range(110):
        height, width = random_size(rng)
        if rng.random() < 0.15:
            width = height  # square: Pillow transposes 90/270 even without expand
        channels = int(rng.choice([1, 3]))
        arr = make_image(rng, height, width, channels, str(rng.choice(["noise", "smooth", "flat"])))
        angle = random_angle(rng)
        expand = bool(rng.random() < 0.5)
        center = None
        if rng.random() < 0.35:
            center = [int(rng.integers(0, width)), int(rng.integers(0, height))]
            if rng.random() < 0.3:
                center = [0, 0]  # truthy: no transpose shortcut in Pillow
        fill = random_fill(rng, channels)
        args = (angle, interpolation, expand, center, fill)
        assert_exact(ours(G.rotate, arr, *args), stock(F.rotate, arr, *args), f"case {case}: {arr.shape} {args}")


@pytest.mark.parametrize("interpolation", [NEAREST, BILINEAR])
def test_rotate_large_image(interpolation):
    rng = np.random.default_rng(22)
    arr = make_image(rng, 750, 1000, 3, "smooth")
    for angle, expand in ((17.25, True), (-123.0, False)):
        args = (angle, interpolation, expand, None, (10, 20, 30))
        assert_exact(ours(G.rotate, arr, *args), stock(F.rotate, arr, *args), f"{args}")


def test_rotate_transposes_match_for_any_supported_filter():
    rng = np.random.default_rng(23)
    for height, width in ((1, 1), (1, 6), (5, 5), (9, 4)):
        for channels in (1, 3):
            arr = make_image(rng, height, width, channels)
            for angle in (0, 360, 90, -90, 180, 270, 450.0):
                for expand in (False, True):
                    if angle % 180 and not expand and height != width:
                        continue  # Pillow's general path, which BICUBIC would need
                    args = (angle, BICUBIC, expand)
                    assert_exact(ours(G.rotate, arr, *args), stock(F.rotate, arr, *args), f"{arr.shape} {args}")


# --- internals: blocks, fallbacks, threads --------------------------------------------------------


@pytest.mark.parametrize("interpolation", [NEAREST, BILINEAR])
def test_geometry_exact_in_small_blocks_and_fallbacks(monkeypatch, interpolation):
    # Many row blocks (and blocks of one row), fresh arrays instead of scratch, and NumPy's
    # gather instead of OpenCV's remap must not change a pixel.
    monkeypatch.setattr(G, "_BLOCK_PIXELS", 50)
    monkeypatch.setattr(G, "_SCRATCH_LIMIT", 64)
    monkeypatch.setattr(G, "_REMAP_LIMIT", 20 if interpolation == NEAREST else G._REMAP_LIMIT)
    rng = np.random.default_rng(31)
    for case in range(25):
        arr, args = affine_case(rng, interpolation)
        assert_exact(ours(G.affine, arr, *args), stock(F.affine, arr, *args), f"case {case}: {arr.shape} {args}")
    for path, params in (("translate", dict(angle=0.0, translate=[40000, 0])), ("scale", dict(angle=5.0, scale=0.003))):
        arr = make_image(rng, 30, 70, 3)
        kwargs = dict(dict(translate=[0, 0], scale=1.0, shear=0.0), **params, interpolation=interpolation)
        assert_exact(ours(G.affine, arr, **kwargs), stock(F.affine, arr, **kwargs), path)


def test_nearest_beyond_opencv_remap_limits():
    # OpenCV's remap takes images under 32767 pixels a side; wider ones use NumPy's gather.
    rng = np.random.default_rng(34)
    for shape in ((2, 33000, 3), (33000, 2, 1)):
        arr = make_image(rng, *shape)
        for args in ((0.01, [3, 0], 1.0, 0.0), (0.0, [-2, 1], 1.5, 0.0), (0.0, [40000, 0], 1.0, 0.0)):
            assert_exact(ours(G.affine, arr, *args, fill=9), stock(F.affine, arr, *args, fill=9), f"{shape} {args}")


def test_non_contiguous_inputs():
    rng = np.random.default_rng(32)
    base = make_image(rng, 40, 60, 3)
    views = [base[:, ::-1], base[::2, 1::3], np.asfortranarray(base), base[:, :, :1], base.transpose(1, 0, 2)]
    for arr in views:
        for fn, stock_fn, args in (
            (G.affine, F.affine, (20.0, [1, 2], 1.1, [3.0, 1.0], BILINEAR)),
            (G.rotate, F.rotate, (33.0, NEAREST, True)),
            (G.pad, F.pad, ([3, 1, 0, 2], 0, "symmetric")),
        ):
            assert_exact(ours(fn, arr, *args), stock(stock_fn, np.ascontiguousarray(arr), *args), fn.__name__)
        blur = ([5, 3], [1.5, 0.7])
        assert_close(ours(G.gaussian_blur, arr, *blur), stock(F.gaussian_blur, arr, *blur), "gaussian_blur")


def test_scratch_memory_is_per_thread():
    rng = np.random.default_rng(33)
    jobs = [affine_case(rng, [NEAREST, BILINEAR][i % 2]) for i in range(8)]
    expected = [stock(F.affine, arr, *args) for arr, args in jobs]
    failures = []

    def work(offset: int) -> None:
        for round_ in range(4):
            for i in range(len(jobs)):
                arr, args = jobs[(i + offset + round_) % len(jobs)]
                if not np.array_equal(G.affine(arr, *args), expected[(i + offset + round_) % len(jobs)]):
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


def test_affine_and_rotate_fallbacks():
    rng = np.random.default_rng(41)
    rgb, gray = make_image(rng, 20, 30, 3), make_image(rng, 20, 30, 1)
    expect_fallback(G.affine, F.affine, rgb, 10.0, [0, 0], 1.0, 0.0, BICUBIC, stock_fails=False)
    expect_fallback(G.affine, F.affine, rgb, 10.0, [0, 0], 1.0, 0.0, InterpolationMode.BOX, stock_fails=True)
    expect_fallback(G.affine, F.affine, rgb, 10.0, [0, 0], 1.0, 0.0, InterpolationMode.LANCZOS, stock_fails=True)
    expect_fallback(G.affine, F.affine, rgb, 10.0, [0, 0], 0.0, 0.0, stock_fails=True)
    expect_fallback(G.affine, F.affine, rgb, 10.0, [0], 1.0, 0.0, stock_fails=True)
    expect_fallback(G.affine, F.affine, rgb, 10.0, [0, 0], 1.0, [1.0, 2.0, 3.0], stock_fails=True)
    expect_fallback(G.affine, F.affine, rgb, 10.0, [0, 0], 1.0, 0.0, fill=(1, 2), stock_fails=True)
    expect_fallback(G.affine, F.affine, gray, 10.0, [0, 0], 1.0, 0.0, fill=(1, 2, 3), stock_fails=True)
    expect_fallback(G.affine, F.affine, rgb, "10", [0, 0], 1.0, 0.0, stock_fails=True)
    expect_fallback(G.rotate, F.rotate, rgb, 10.0, BICUBIC, stock_fails=False)
    expect_fallback(G.rotate, F.rotate, rgb, 10.0, InterpolationMode.HAMMING, stock_fails=True)
    expect_fallback(G.rotate, F.rotate, rgb, 10.0, fill=[1, 2], stock_fails=True)
    expect_fallback(G.rotate, F.rotate, rgb, 10.0, center=5, stock_fails=True)
    with pytest.raises(NotImplementedError):
        G.affine(rgb.astype(np.float32), 10.0, [0, 0], 1.0, 0.0)
    with pytest.raises(NotImplementedError):
        G.rotate(np.zeros((4, 4, 2), np.uint8), 10.0)
    with pytest.raises(NotImplementedError):
        G.rotate(np.zeros((4, 4), np.uint8), 10.0)


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
