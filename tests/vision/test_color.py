"""nanopatch.targets.vision._color against stock torchvision on PIL images: bit-exact for every function,
over randomized factors and images (1x1 to ~600 px, noise, gradients, flat, few levels, "L" and
"RGB", read-only and non-contiguous inputs), exhaustive over every colour where Pillow's
arithmetic is a table, and the fused color_jitter against stock calls in all 24 orders."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

from nanopatch.targets.vision import _color

SEED = 20240601


# ----------------------------------------------------------------------------------------------
# helpers


def to_pil(arr: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(arr[..., 0] if arr.shape[2] == 1 else arr))


def from_pil(img: Image.Image) -> np.ndarray:
    out = np.asarray(img)
    return out[..., None] if out.ndim == 2 else out


def stock(name: str, arr: np.ndarray, *args) -> np.ndarray:
    return from_pil(getattr(F, name)(to_pil(arr), *args))


def make_image(rng: np.random.Generator, h: int, w: int, c: int, kind: str) -> np.ndarray:
    if kind == "noise":
        return rng.integers(0, 256, (h, w, c), dtype=np.uint8)
    if kind == "flat":
        return np.full((h, w, c), rng.integers(0, 256, c), dtype=np.uint8)
    if kind == "levels":  # a handful of values: degenerate histograms, ties in HSV
        return rng.choice(np.array([0, 1, 127, 128, 254, 255], np.uint8), (h, w, c))
    if kind == "narrow":  # a small range somewhere: autocontrast and equalize stretch it
        lo = int(rng.integers(0, 250))
        return rng.integers(lo, lo + 6, (h, w, c)).astype(np.uint8)
    # smooth gradients with a little noise, like a photo
    y = np.linspace(0, 1, h)[:, None, None]
    x = np.linspace(0, 1, w)[None, :, None]
    phase = rng.uniform(0, 2 * np.pi, c)
    base = 127.5 + 127.5 * np.sin(3 * x + 2 * y * (1 + np.arange(c)) + phase)
    return np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)


SHAPES = [(1, 1), (1, 7), (9, 1), (2, 2), (3, 3), (2, 9), (37, 51), (64, 3), (101, 77), (224, 224), (17, 601)]
KINDS = ["noise", "smooth", "flat", "levels", "narrow"]


def images(seed: int, count: int, channels=(1, 3)) -> list[np.ndarray]:
    """``count`` images cycling through the shapes, contents and channel counts; some read-only,
    some non-contiguous views."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        h, w = SHAPES[i % len(SHAPES)]
        c = channels[i % len(channels)]
        kind = KINDS[(i // len(channels)) % len(KINDS)]
        arr = make_image(rng, h, w, c, kind)
        layout = (i // len(channels)) % 4  # every layout for each channel count
        if layout == 1:
            arr.setflags(write=False)
        elif layout == 2:  # a flipped view of a bigger buffer
            big = np.zeros((h, 2 * w, c), np.uint8)
            big[:, ::-2] = arr
            arr = big[:, ::-2]
        elif layout == 3 and c == 3:  # the RGB of an RGBA buffer, read-only
            rgba = np.dstack([arr, np.full((h, w, 1), 7, np.uint8)])
            rgba.setflags(write=False)
            arr = rgba[..., :3]
        out.append(arr)
    return out


def assert_matches(name: str, arr: np.ndarray, *args) -> None:
    before = arr.copy()
    ours = getattr(_color, name)(arr, *args)
    np.testing.assert_array_equal(arr, before, err_msg="input modified")
    expected = stock(name, arr, *args)
    assert ours.dtype == np.uint8 and ours.shape == expected.shape, (name, args, arr.shape, ours.shape)
    if not np.array_equal(ours, expected):
        diff = np.abs(ours.astype(int) - expected.astype(int))
        pytest.fail(f"{name}{args} on {arr.shape}: {np.count_nonzero(diff)} differ, max {diff.max()}")
    assert ours.flags.c_contiguous
    assert not np.shares_memory(ours, arr)


def assert_equal(got: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """np.testing.assert_array_equal without its cost on tens of megabytes."""
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    if not np.array_equal(got, expected):
        pytest.fail(f"{what}: {np.count_nonzero(got != expected)} of {got.size} values differ")


def same_error(ours, theirs) -> None:
    with pytest.raises(Exception) as expected:
        theirs()
    with pytest.raises(expected.type) as got:
        ours()
    assert str(got.value) == str(expected.value)


# ----------------------------------------------------------------------------------------------
# every function, randomized factors


def enhance_factors(rng: np.random.Generator) -> list[float]:
    fixed = [0.0, 1.0, 2.0, 0.5, 1.5, -0.5, 3.7, 0.999, 1e-3, 17.0]
    return fixed + [float(x) for x in rng.uniform(0, 2, 6)] + [float(x) for x in rng.uniform(-1, 4, 4)]


@pytest.mark.parametrize("name", ["adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_sharpness"])
def test_enhance(name):
    rng = np.random.default_rng([SEED, len(name)])
    factors = enhance_factors(rng)
    for i, arr in enumerate(images(len(name), 44)):
        for factor in (factors[i % len(factors)], factors[(7 * i + 3) % len(factors)]):
            assert_matches(name, arr, factor)


def ramps() -> list[np.ndarray]:
    """Images holding every level 0..255 (in each channel), as "L" and "RGB"."""
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16)
    rgb = np.dstack([levels, levels.T, levels[::-1]])
    return [levels[..., None], rgb, rgb[::2, :, ::-1], rgb[:5]]


# Decimal factors are where float and double arithmetic part ways: 0.7 * 10 is 7 in float32.
DECIMALS = [k / 10 for k in range(-10, 41)] + [k / 100 for k in range(55, 146, 3)] + [1 / 3, 2 / 3, 255 / 256]


@pytest.mark.parametrize("name", ["adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_sharpness"])
def test_enhance_every_level(name):
    rng = np.random.default_rng([SEED, 6])
    factors = DECIMALS + [float(x) for x in rng.uniform(0, 2, 20)]
    for arr in ramps():
        for factor in factors:
            assert_matches(name, arr, factor)


def test_contrast_mean_halves():
    """ImageStat's mean rounded with int(mean + 0.5): halves go up, unlike round()."""
    for values in ([0, 1], [10, 11], [2, 3, 2, 3], [254, 255], [100, 101, 102, 103]):
        grey = np.array(values, np.uint8).reshape(1, -1, 1)
        for factor in (0.0, 0.5, 1.7):
            assert_matches("adjust_contrast", grey, factor)
            assert_matches("adjust_contrast", np.repeat(grey, 3, axis=2), factor)
            assert_matches("adjust_contrast", np.repeat(grey, 3, axis=2).reshape(-1, 1, 3), factor)


def test_enhance_factor_types():
    arr = images(1, 8)[7]
    for factor in (1, 0, 2, True, np.float32(1.3), np.float64(0.7), np.int64(3)):
        for name in ("adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_sharpness"):
            assert_matches(name, arr, factor)


def test_hue():
    rng = np.random.default_rng([SEED, 1])
    factors = [0.0, 0.5, -0.5, 0.1, -0.1, 1 / 255, -1 / 255, 0.25, 0.4999]
    factors += [float(x) for x in rng.uniform(-0.5, 0.5, 12)]
    for i, arr in enumerate(images(2, 44)):
        for factor in (factors[i % len(factors)], factors[(5 * i + 2) % len(factors)]):
            assert_matches("adjust_hue", arr, factor)


@pytest.mark.parametrize("channels", [1, 3])
def test_grayscale(channels):
    for arr in images(4, 22):
        assert_matches("rgb_to_grayscale", arr, channels)


def test_point_ops():
    for i, arr in enumerate(images(5, 44)):
        assert_matches("invert", arr)
        assert_matches("posterize", arr, 1 + i % 8)
        assert_matches("autocontrast", arr)
        assert_matches("equalize", arr)
    thresholds = [0, 1, 128, 255, 256, 257, -3, 0.5, 127.5, 255.5, 1e9, float("inf"), float("-inf"), float("nan")]
    rng = np.random.default_rng([SEED, 3])
    thresholds += [int(x) for x in rng.integers(0, 257, 8)]
    for i, arr in enumerate(images(6, 22)):
        assert_matches("solarize", arr, thresholds[i % len(thresholds)])
        assert_matches("solarize", arr, thresholds[(3 * i + 1) % len(thresholds)])
    for arr in ramps():
        for threshold in thresholds:
            assert_matches("solarize", arr, threshold)
        for bits in range(1, 9):
            assert_matches("posterize", arr, bits)
        for name in ("invert", "autocontrast", "equalize", "rgb_to_grayscale"):
            assert_matches(name, arr)
            assert_matches(name, arr[3:9, 2:11])


def test_equalize_histogram_edges():
    rng = np.random.default_rng([SEED, 4])
    # A big last bin: the table runs past 255 and Image.point clips it.
    arr = np.full((40, 40, 3), 255, np.uint8)
    arr[:2, :, 0] = rng.integers(0, 255, (2, 40))
    arr[0, 0, 1] = 3
    assert_matches("equalize", arr)
    # Two pixels, two levels; one level; steps of 1.
    assert_matches("equalize", np.array([[[0], [255]]], np.uint8))
    assert_matches("equalize", np.array([[[9, 9, 9]]], np.uint8))
    assert_matches("equalize", np.arange(256 * 3, dtype=np.uint8).reshape(16, 16, 3))
    assert_matches("autocontrast", np.array([[[3, 3, 200], [4, 3, 100]]], np.uint8))


# ----------------------------------------------------------------------------------------------
# exhaustive: where Pillow's arithmetic reduces to tables, every input


def all_colours(rows=slice(None)) -> np.ndarray:
    """Every 24-bit colour, 4096 x 4096 (rows of it)."""
    c = np.arange(1 << 24, dtype=np.uint32).reshape(4096, 4096)[rows]
    return np.stack([c >> 16, (c >> 8) & 255, c & 255], axis=-1).astype(np.uint8)


def test_grayscale_every_colour():
    rgb = all_colours()
    expected = np.asarray(Image.fromarray(rgb).convert("L"))
    assert_equal(_color.rgb_to_grayscale(rgb)[..., 0], expected, "L")


def test_hsv_every_colour():
    """Pillow's RGB -> HSV for every colour, and HSV -> RGB for every (H, S, V) byte triple."""
    rgb = all_colours()
    hue, s, v = _color._hsv(rgb)
    expected = np.asarray(Image.fromarray(rgb).convert("HSV"))
    for name, got, i in (("H", hue, 0), ("S", s.astype(np.uint8), 1), ("V", v, 2)):
        assert_equal(got, expected[..., i], name)
    # The same bytes read as H, S, V.
    expected = np.asarray(Image.fromarray(rgb, "HSV").convert("RGB"))
    got = _color._hsv_to_rgb(rgb[..., 0].copy(), rgb[..., 1].astype(np.float32), rgb[..., 2].copy())
    assert_equal(got, expected, "HSV -> RGB")


def test_hue_every_colour():
    rgb = all_colours()
    for factor, rows in ((0.1, slice(0, 2048)), (-0.5, slice(2048, 4096))):
        assert_equal(_color.adjust_hue(rgb[rows], factor), stock("adjust_hue", rgb[rows], factor), f"hue {factor}")


def test_blend_every_pair():
    """Saturation's per-pixel blend for every (grey, level) pair the "L" image can pair up: each
    grey level with each value of one channel."""
    for factor in (0.37, 1.41, -0.6, 2.9):
        levels = np.arange(256, dtype=np.uint8)
        # Pixels (v, v, v) + a ramp on red cover every level and many greys.
        arr = np.stack(np.meshgrid(levels, levels, indexing="ij"), axis=-1)
        arr = np.dstack([arr[..., 0], arr[..., 1], arr[..., 1]])
        assert_matches("adjust_saturation", arr, factor)
        assert_matches("adjust_sharpness", arr, factor)


def test_smooth_every_sum():
    """SMOOTH for every kernel sum 0..3315: each target pixel in its own 3x3 block."""
    sums = np.arange(13 * 255 + 1)
    centre = np.minimum(sums // 5, 255)
    rest = sums - 5 * centre  # spread over the 8 neighbours, at most 255 each
    neighbours = np.minimum(rest[:, None] - np.arange(8)[None, :] * 255, 255).clip(0)
    blocks = np.zeros((len(sums), 3, 3), np.uint8)
    ring = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (2, 2)]
    for k, (y, x) in enumerate(ring):
        blocks[:, y, x] = neighbours[:, k]
    blocks[:, 1, 1] = centre
    assert np.array_equal(blocks.astype(int).sum(axis=(1, 2)) + 4 * centre, sums)
    arr = blocks.transpose(1, 0, 2).reshape(3, -1, 1)
    for factor in (0.0, 0.5, 2.0):
        assert_matches("adjust_sharpness", arr, factor)
        assert_matches("adjust_sharpness", np.repeat(arr, 3, axis=2), factor)


# ----------------------------------------------------------------------------------------------
# color_jitter


def jitter_stock(arr: np.ndarray, order, b, c, s, h) -> np.ndarray:
    img = to_pil(arr)
    for fn in order:
        if fn == 0 and b is not None:
            img = F.adjust_brightness(img, b)
        elif fn == 1 and c is not None:
            img = F.adjust_contrast(img, c)
        elif fn == 2 and s is not None:
            img = F.adjust_saturation(img, s)
        elif fn == 3 and h is not None:
            img = F.adjust_hue(img, h)
    return from_pil(img)


def test_color_jitter_all_orders():
    rng = np.random.default_rng([SEED, 5])
    arrs = images(7, 12)
    extremes = [(0.0, 2.0, 0.0, 0.5), (2.0, 0.0, 2.0, -0.5), (1.0, 1.0, 1.0, 0.0), (-0.3, 3.0, 1.7, 0.02)]
    for k, order in enumerate(itertools.permutations(range(4))):
        for j in range(3):
            arr = arrs[(3 * k + j) % len(arrs)]
            if j == 0:
                factors = extremes[k % len(extremes)]
            else:
                factors = (*(float(x) for x in rng.uniform(0.6, 1.4, 3)), float(rng.uniform(-0.1, 0.1)))
            if j == 2:  # some factors left out, as ColorJitter does for a zero range
                factors = tuple(None if rng.random() < 0.3 else f for f in factors)
            before = arr.copy()
            ours = _color.color_jitter(arr, order, *factors)
            np.testing.assert_array_equal(arr, before)
            expected = jitter_stock(arr, order, *factors)
            assert ours.shape == expected.shape and ours.dtype == np.uint8
            np.testing.assert_array_equal(ours, expected, err_msg=f"order {order}, factors {factors}, {arr.shape}")
            assert not np.shares_memory(ours, arr)


def test_color_jitter_like_torchvision():
    """ColorJitter's own parameters (fn_idx a tensor), against the transform itself."""
    import torch

    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    for i, arr in enumerate(images(8, 10)):
        torch.manual_seed(i)
        expected = from_pil(jitter(to_pil(arr)))
        torch.manual_seed(i)
        params = jitter.get_params(jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
        np.testing.assert_array_equal(_color.color_jitter(arr, *params), expected)


def test_color_jitter_edges():
    arr = images(9, 4)[3]
    out = _color.color_jitter(arr, [0, 1, 2, 3], None, None, None, None)
    np.testing.assert_array_equal(out, arr)
    assert not np.shares_memory(out, arr)
    # Unknown indices do nothing, as in ColorJitter.forward.
    expected = jitter_stock(arr, [3, 0], 1.2, 0.5, None, 0.1)
    np.testing.assert_array_equal(_color.color_jitter(arr, [3, 9, 0], 1.2, 0.5, None, 0.1), expected)
    same_error(
        lambda: _color.color_jitter(arr, [0, 3], 1.2, None, None, 0.7),
        lambda: jitter_stock(arr, [0, 3], 1.2, None, None, 0.7),
    )
    with pytest.raises(NotImplementedError):
        _color.color_jitter(arr, [0], float("nan"), None, None, None)


# ----------------------------------------------------------------------------------------------
# errors: stock's exception where stock raises one, NotImplementedError where we cannot follow


def test_stock_errors():
    arr = images(10, 2)[1]
    pil = to_pil(arr)
    for bad in (0.51, -0.6, float("nan"), float("inf")):
        same_error(lambda b=bad: _color.adjust_hue(arr, b), lambda b=bad: F.adjust_hue(pil, b))
    for bits in (-1, 0, 9):
        same_error(lambda b=bits: _color.posterize(arr, b), lambda b=bits: F.posterize(pil, b))
    for n in (0, 2, 4):
        same_error(lambda n=n: _color.rgb_to_grayscale(arr, n), lambda n=n: F.rgb_to_grayscale(pil, n))


@pytest.mark.parametrize(
    "call",
    [
        lambda a: _color.adjust_brightness(a, float("nan")),
        lambda a: _color.adjust_contrast(a, float("inf")),
        lambda a: _color.adjust_saturation(a, 1e39),  # infinite as a C float
        lambda a: _color.adjust_sharpness(a, -float("inf")),
        lambda a: _color.adjust_brightness(a, "1.5"),
        lambda a: _color.adjust_contrast(a, None),
        lambda a: _color.adjust_hue(a, 0.1j),
        lambda a: _color.posterize(a, 3.0),
        lambda a: _color.solarize(a, "128"),
    ],
)
def test_not_implemented_factors(call):
    with pytest.raises(NotImplementedError):
        call(images(11, 2)[1])


@pytest.mark.parametrize(
    "arr",
    [
        np.zeros((4, 4, 3), np.float32),
        np.zeros((4, 4, 3), np.uint16),
        np.zeros((4, 4), np.uint8),
        np.zeros((4, 4, 2), np.uint8),
        np.zeros((4, 4, 4), np.uint8),
        np.zeros((0, 4, 3), np.uint8),
        np.zeros((4, 0, 1), np.uint8),
        [[[1, 2, 3]]],
    ],
)
def test_not_implemented_arrays(arr):
    for name in _color.__all__:
        fn = getattr(_color, name)
        with pytest.raises(NotImplementedError):
            if name == "color_jitter":
                fn(arr, [0, 1, 2, 3], 1.1, 0.9, 1.2, 0.05)
            elif name in ("invert", "autocontrast", "equalize", "rgb_to_grayscale"):
                fn(arr)
            elif name == "adjust_hue":
                fn(arr, 0.1)
            else:
                fn(arr, 2)


def test_input_never_written():
    """Every function on a read-only array (the comparisons above also check the values)."""
    arr = images(12, 2)[1].copy()
    arr.setflags(write=False)
    calls = {
        "adjust_brightness": (1.3,),
        "adjust_contrast": (0.7,),
        "adjust_saturation": (1.0,),
        "adjust_sharpness": (1.0,),
        "adjust_hue": (0.2,),
        "rgb_to_grayscale": (1,),
        "posterize": (8,),
        "solarize": (300,),
        "invert": (),
        "autocontrast": (),
        "equalize": (),
    }
    assert set(calls) | {"color_jitter"} == set(_color.__all__)
    for name, args in calls.items():
        out = getattr(_color, name)(arr, *args)
        assert out.flags.writeable and not np.shares_memory(out, arr)
