"""Every file of the corpus (good, bad and unusual) through stock and nanopatch, per decoder
backend: same pixels where stock succeeds, same exception (type and message) where it fails,
same DecompressionBombWarning for the 12000x9000 JPEG. Real files, real decoders."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from PIL import Image

import nanopatch
from nanopatch.targets.vision import datasets, decode

BACKENDS = ("turbojpeg", "opencv", "pil")

# JPEGs the fast path must take (YCbCr or grayscale, complete): if it quietly sent these to
# Pillow, the parity tests would pass and nothing would be faster.
FAST_JPEGS = {
    "jpeg-444-baseline",
    "jpeg-422-baseline",
    "jpeg-420-baseline",
    "jpeg-444-progressive",
    "jpeg-422-progressive",
    "jpeg-420-progressive",
    "jpeg-420-q75",
    "jpeg-420-q95",
    "jpeg-420-odd-161x117",
    "jpeg-tiny-7x3",
    "jpeg-tiny-1x1",
    "jpeg-restart-markers",
    "jpeg-icc-srgb",
    "jpeg-uppercase-ext",
    "jpeg-gray",
    "jpeg-exif-orientation-6",
    "jpeg-named-png",
    "jpeg-huge",
}
# Files the fast path must hand to Pillow (which then does exactly what stock does).
DECLINED = {
    "jpeg-cmyk",
    "jpeg-ycck",
    "jpeg-truncated",
    "jpeg-truncated-progressive",
    "jpeg-headers-only",
    "jpeg-corrupt-scan",
    "jpeg-corrupt-header",
}


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv(decode.DECODER_VARIABLE, request.param)
    chosen = decode.jpeg_backend()
    if request.param == "turbojpeg" and chosen is None:
        if os.environ.get("NANOPATCH_TEST_REQUIRE_TURBOJPEG"):  # set by tox: CI must test it
            pytest.fail("PyTurboJPEG with libturbojpeg is required here but did not load")
        pytest.skip("libturbojpeg is not installed here")  # the opencv and pil runs still cover this
    assert (chosen.name if chosen else "pil") == request.param
    yield request.param


@pytest.fixture(scope="module")
def stock_loader():
    import torchvision.datasets.folder as folder

    with nanopatch.unpatched():
        return folder.pil_loader


def outcome(load, path):
    """What loading ``path`` does: ("ok", mode, size, pixels) or ("raise", type, message), plus
    the DecompressionBombWarning messages issued."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            img = load(path)
            result = ("ok", img.mode, img.size, np.asarray(img))
        except Exception as exc:
            result = ("raise", type(exc), str(exc))
    bombs = [str(w.message) for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    return result, bombs


def assert_same(stock, ours, name):
    (s, s_bombs), (o, o_bombs) = stock, ours
    assert o[0] == s[0], f"{name}: stock {s[0]} {s[1:3]}, nanopatch {o[0]} {o[1:3]}"
    if s[0] == "ok":
        assert o[1:3] == s[1:3], name
        assert np.array_equal(o[3], s[3]), f"{name}: pixels differ (max {np.abs(o[3].astype(int) - s[3]).max()})"
    else:
        assert (o[1], o[2]) == (s[1], s[2]), name
    assert o_bombs == s_bombs, name


def test_loader_matches_stock_on_every_file(corpus, backend, stock_loader):
    for name, entry in corpus.items():
        assert_same(outcome(stock_loader, entry.path), outcome(datasets.pil_loader, entry.path), name)


def test_fast_path_takes_good_jpegs_and_declines_the_rest(corpus, backend):
    for name, entry in corpus.items():
        if entry.kind == "missing":
            continue
        data = decode.read_bytes(entry.path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            fast = decode.decode_fast(data)
        if backend != "pil" and name in FAST_JPEGS:
            assert fast is not None, f"{name} should take the fast path"
        if backend == "opencv" and name == "jpeg-corrupt-scan":
            # OpenCV cannot report libjpeg's warnings, so it decodes the corrupt scan, which is
            # harmless: Pillow ignores those warnings too, and the loader test above checks the
            # pixels are stock's. (OpenCV's libjpeg prints the warning to stderr; stock does not.)
            assert fast is not None
            continue
        if backend == "pil" or name in DECLINED or entry.kind != "jpeg":
            assert fast is None, f"{name} must go to Pillow"


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_decode_matches_pillow_convert(corpus, backend, mode):
    def stock(path):
        with open(path, "rb") as f:
            return np.array(Image.open(f).convert(mode))

    for name, entry in corpus.items():
        if entry.huge:
            continue  # covered by the loader test; a second 324 MB decode per mode adds nothing
        expected, _ = outcome(lambda p: Image.fromarray(stock(p)), entry.path)
        got, _ = outcome(lambda p: Image.fromarray(decode.decode(p, mode=mode)), entry.path)
        assert_same((expected, []), (got, []), f"{name} mode {mode}")
        if got[0] == "ok":
            assert got[3].shape == ((got[2][1], got[2][0], 3) if mode == "RGB" else (got[2][1], got[2][0]))


def test_dct_scaled_decode_equals_pillow_draft(corpus, backend):
    """A DCT-scaled decode is what Pillow's own draft mode gives at the same scale."""
    for name in sorted(FAST_JPEGS - {"jpeg-huge"}):
        path = corpus[name].path
        with Image.open(path) as img:
            width, height = img.size
        for factor in (1, 2, 4, 8):
            min_size = (-(-height // factor), -(-width // factor))
            got = decode.decode(path, min_size=min_size)
            assert got.shape[0] >= min_size[0] and got.shape[1] >= min_size[1]
            if backend == "pil":
                continue  # Pillow-only decoding is full size
            assert got.shape[:2] == min_size, (name, factor)
            if width // factor == 0 or height // factor == 0:
                continue  # draft() cannot ask for this scale of a tiny image
            with open(path, "rb") as f:
                img = Image.open(f)
                img.draft("RGB", (width // factor, height // factor))
                expected = np.array(img.convert("RGB"))
            assert np.array_equal(got, expected), (name, factor)
