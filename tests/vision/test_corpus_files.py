"""Self-checks of the test-data generator, not of nanopatch: the corpus generator
(tests/data/make_corpus.py) makes files that really have the property each entry's note claims,
deterministically, from the module and from the command line. nanopatch's decoding of the corpus
is tested in test_corpus.py.

Where CI requires libturbojpeg (``NANOPATCH_TEST_REQUIRE_TURBOJPEG=1``), a check that needs it
fails instead of skipping."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import warnings

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps, JpegImagePlugin, UnidentifiedImageError

from conftest import TESTS_DIR
from data import make_corpus
from data.make_corpus import HUGE_SIZE, app_segments, build, jpeg_segments, photo, scan_range

pytestmark = pytest.mark.selfcheck

DATA_DIR = TESTS_DIR / "data"
SOF_BASELINE, SOF_PROGRESSIVE = 0xC0, 0xC2


def need(corpus, name: str) -> None:
    """Skip when the generator left an optional entry out (this Pillow cannot write it)."""
    if name not in corpus:
        pytest.skip(f"{name} not in the corpus: this Pillow cannot write it")


def turbojpeg_or_skip():
    """A PyTurboJPEG decoder; a skip without one, a failure where CI requires it."""
    try:
        import turbojpeg

        return turbojpeg.TurboJPEG(lib_path=os.environ.get("NANOPATCH_TURBOJPEG_LIB") or None)
    except (ImportError, OSError, RuntimeError) as e:
        if os.environ.get("NANOPATCH_TEST_REQUIRE_TURBOJPEG") == "1":
            pytest.fail(f"PyTurboJPEG with libturbojpeg is required here (NANOPATCH_TEST_REQUIRE_TURBOJPEG=1): {e}")
        pytest.skip(f"libturbojpeg not loadable: {e}")


def data(corpus, name: str) -> bytes:
    return corpus[name].path.read_bytes()


def opened(corpus, name: str) -> Image.Image:
    im = Image.open(corpus[name].path)
    im.load()
    return im


def rgb(corpus, name: str) -> np.ndarray:
    return np.asarray(opened(corpus, name).convert("RGB")).astype(np.int32)


def sof(raw: bytes) -> tuple[int, int, int, int, list[tuple[int, int, int]]]:
    """(SOF marker, height, width, number of components, [(id, h sampling, v sampling)])."""
    for marker, off, _ in jpeg_segments(raw):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            _, height, width, n = struct.unpack(">BHHB", raw[off + 4 : off + 10])
            comps = [(raw[off + 10 + 3 * i], raw[off + 11 + 3 * i] >> 4, raw[off + 11 + 3 * i] & 15) for i in range(n)]
            return marker, height, width, n, comps
    raise AssertionError("no SOF segment")


def adobe_transform(raw: bytes) -> int:
    (payload,) = app_segments(raw, 0xEE)
    assert payload[:5] == b"Adobe" and len(payload) == 12
    return payload[11]


def png_ihdr(raw: bytes) -> tuple[int, int, int, int, int]:
    """(width, height, bit depth, colour type, interlace method)."""
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", raw[16:29])
    return width, height, depth, colour, interlace


def png_chunks(raw: bytes) -> list[bytes]:
    out, pos = [], 8
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        out.append(raw[pos + 4 : pos + 8])
        pos += length + 12
    return out


# --------------------------------------------------------------------------------------------
# The corpus as a whole


def test_entries_are_well_formed(corpus):
    entries = list(corpus.values())
    assert len(entries) == len({e.path for e in entries})
    assert all(e.kind in make_corpus.KINDS for e in entries)
    assert all(e.note and "\n" not in e.note and "|" not in e.note for e in entries)
    assert [e.name for e in entries if e.huge] == ["jpeg-huge"]
    assert [e.name for e in entries if e.kind == "missing"] == ["missing"]
    assert entries[-1].name == "missing" and not corpus["missing"].path.exists()
    for e in entries[:-1]:
        assert e.path.is_file(), e.name
    small = sum(e.path.stat().st_size for e in entries if not e.huge and e.path.exists())
    assert small < 3_000_000


def test_every_image_entry_opens_as_its_kind(corpus):
    """Every entry whose kind is an image format is that format to PIL, whatever its extension."""
    formats = {"jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "webp": "WEBP", "gif": "GIF", "tiff": "TIFF"}
    for e in corpus.values():
        if e.kind in formats and not e.huge:
            with Image.open(e.path) as im:
                assert im.format == formats[e.kind], e.name
                im.load()


def test_bad_entries_fail_in_stock_pil_except_the_corrupt_scan(corpus):
    """Stock torchvision's loader is Image.open(f).convert("RGB"): it raises on every "bad" file
    except jpeg-corrupt-scan, which libjpeg decodes (garbled, with warnings)."""
    decodes = set()
    for e in corpus.values():
        if e.kind != "bad":
            continue
        try:
            with Image.open(e.path) as im:
                im.convert("RGB")
        except OSError:
            continue
        decodes.add(e.name)
    assert decodes == {"jpeg-corrupt-scan"}
    with pytest.raises(FileNotFoundError):
        Image.open(corpus["missing"].path)


def test_images_look_like_photos(corpus):
    """Not flat colour: broad tonal spread and fine detail between neighbouring pixels."""
    for name in ("jpeg-420-baseline", "jpeg-420-odd-161x117", "png-rgb", "webp-lossless", "tiff-rgb", "bmp-rgb24"):
        a = rgb(corpus, name)
        assert a.std() > 30, name
        assert np.abs(np.diff(a, axis=1)).mean() > 3, name
        assert len(np.unique(a.reshape(-1, 3), axis=0)) > 1000, name


def test_photo_is_seeded():
    assert np.array_equal(photo(33, 21, seed=5), photo(33, 21, seed=5))
    assert not np.array_equal(photo(33, 21, seed=5), photo(33, 21, seed=6))


# --------------------------------------------------------------------------------------------
# JPEG: ordinary


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
@pytest.mark.parametrize("sub,tag,sampling", [("4:4:4", "444", 0), ("4:2:2", "422", 1), ("4:2:0", "420", 2)])
def test_jpeg_progressive_and_subsampling(corpus, progressive, sub, tag, sampling):
    name = f"jpeg-{tag}-{'progressive' if progressive else 'baseline'}"
    im = opened(corpus, name)
    assert bool(im.info.get("progressive")) is progressive
    assert bool(im.info.get("progression")) is progressive
    assert JpegImagePlugin.get_sampling(im) == sampling
    marker, height, width, n, comps = sof(data(corpus, name))
    assert marker == (SOF_PROGRESSIVE if progressive else SOF_BASELINE)
    assert (width, height, n) == (256, 192, 3)
    luma = {"444": (1, 1), "422": (2, 1), "420": (2, 2)}[tag]
    assert [c[1:] for c in comps] == [luma, (1, 1), (1, 1)]
    assert im.mode == "RGB"


def test_jpeg_quality_ladder(corpus):
    """q75 < q90 < q95: the luminance quantisation table shrinks as quality rises."""
    q = [sum(opened(corpus, n).quantization[0]) for n in ("jpeg-420-q75", "jpeg-420-baseline", "jpeg-420-q95")]
    assert q[0] > q[1] > q[2]
    sizes = [corpus[n].path.stat().st_size for n in ("jpeg-420-q75", "jpeg-420-baseline", "jpeg-420-q95")]
    assert sizes[0] < sizes[1] < sizes[2]
    for name in ("jpeg-420-q75", "jpeg-420-q95"):
        assert JpegImagePlugin.get_sampling(opened(corpus, name)) == 2


@pytest.mark.parametrize(
    "name,size", [("jpeg-420-odd-161x117", (161, 117)), ("jpeg-tiny-7x3", (7, 3)), ("jpeg-tiny-1x1", (1, 1))]
)
def test_jpeg_odd_and_tiny_sizes(corpus, name, size):
    im = opened(corpus, name)
    assert im.size == size
    assert JpegImagePlugin.get_sampling(im) == 2
    assert im.mode == "RGB"


def test_jpeg_restart_markers(corpus):
    need(corpus, "jpeg-restart-markers")
    raw = data(corpus, "jpeg-restart-markers")
    (dri,) = app_segments(raw, 0xDD)
    (interval,) = struct.unpack(">H", dri)
    assert interval == 256 // 16  # one MCU row of a 4:2:0 picture 256 px wide
    start, end = scan_range(raw)
    scan = raw[start:end]
    rst = [scan.count(bytes([0xFF, 0xD0 + i])) for i in range(8)]
    assert sum(rst) == 192 // 16 - 1  # one between each pair of MCU rows
    assert all(rst)  # RST0..RST7 all used, cycling
    assert b"\xff\xdd" not in data(corpus, "jpeg-420-baseline")
    assert np.abs(rgb(corpus, "jpeg-restart-markers") - rgb(corpus, "jpeg-420-baseline")).max() == 0


def test_jpeg_icc_profile(corpus):
    need(corpus, "jpeg-icc-srgb")
    ImageCms = pytest.importorskip("PIL.ImageCms")
    raw = data(corpus, "jpeg-icc-srgb")
    payloads = app_segments(raw, 0xE2)
    assert len(payloads) == 1 and payloads[0].startswith(b"ICC_PROFILE\0\x01\x01")
    icc = opened(corpus, "jpeg-icc-srgb").info["icc_profile"]
    assert icc == payloads[0][14:]
    profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    assert "srgb" in ImageCms.getProfileDescription(profile).lower()
    assert "icc_profile" not in opened(corpus, "jpeg-420-baseline").info


def test_jpeg_uppercase_extension(corpus):
    e = corpus["jpeg-uppercase-ext"]
    assert e.path.suffix == ".JPEG"
    assert opened(corpus, "jpeg-uppercase-ext").format == "JPEG"


def test_jpeg_gray(corpus):
    im = opened(corpus, "jpeg-gray")
    assert im.mode == "L"
    assert sof(data(corpus, "jpeg-gray"))[3] == 1


def test_jpeg_cmyk(corpus):
    raw = data(corpus, "jpeg-cmyk")
    im = opened(corpus, "jpeg-cmyk")
    assert im.mode == "CMYK"
    assert sof(raw)[3] == 4
    assert adobe_transform(raw) == 0 == im.info["adobe_transform"]
    k = np.asarray(im)[..., 3]
    assert k.min() < 30 and k.max() > 120  # real black generation, not K = 0 everywhere


# Bound for the YCCK picture against the CMYK one (mean absolute difference over R, G, B, 0-255).
# Both are q90 4:4:4 encodings of the same CMYK pixels, and each is ~2.5-3.5 levels away from the
# source photo (JPEG loss, plus for YCCK one more rounding through YCbCr). Their difference is
# ~2.8 here; 6 leaves room for other libjpeg versions. A misread file is nowhere near: the very
# same bytes decoded with the transform byte set back to 0 (YCC samples taken as CMYK ink) come
# out ~60 levels off, which the test also checks, so the bound separates right from garbage.
YCCK_MAX_MAD = 6.0
YCCK_GARBAGE_MIN_MAD = 30.0


def test_jpeg_ycck(corpus):
    raw = data(corpus, "jpeg-ycck")
    im = opened(corpus, "jpeg-ycck")
    assert im.mode == "CMYK"
    assert sof(raw)[3] == 4
    assert adobe_transform(raw) == 2 == im.info["adobe_transform"]
    ycck_rgb = rgb(corpus, "jpeg-ycck")
    cmyk_rgb = rgb(corpus, "jpeg-cmyk")
    assert np.abs(ycck_rgb - cmyk_rgb).mean() < YCCK_MAX_MAD
    assert ycck_rgb.std() > 30
    patched = bytearray(raw)
    adobe = next(off for m, off, _ in jpeg_segments(raw) if m == 0xEE)
    patched[adobe + 15] = 0
    with Image.open(io.BytesIO(bytes(patched))) as wrong:
        misread = np.asarray(wrong.convert("RGB")).astype(np.int32)
    assert np.abs(misread - cmyk_rgb).mean() > YCCK_GARBAGE_MIN_MAD


def test_jpeg_exif_orientation_6(corpus):
    im = opened(corpus, "jpeg-exif-orientation-6")
    assert im.getexif()[0x0112] == 6
    assert len(app_segments(data(corpus, "jpeg-exif-orientation-6"), 0xE1)) == 1
    assert im.size == (240, 160)
    assert ImageOps.exif_transpose(im).size == (160, 240)
    # non-symmetric: no flip or half turn maps the picture onto itself
    a = np.asarray(im.convert("RGB")).astype(np.int32)
    for other in (a[::-1], a[:, ::-1], a[::-1, ::-1]):
        assert np.abs(a - other).mean() > 20


# --------------------------------------------------------------------------------------------
# JPEG: damaged


@pytest.mark.parametrize(
    "name,whole", [("jpeg-truncated", "jpeg-420-baseline"), ("jpeg-truncated-progressive", "jpeg-420-progressive")]
)
def test_jpeg_truncated(corpus, name, whole):
    raw, full = data(corpus, name), data(corpus, whole)
    assert full.startswith(raw) and len(raw) == len(full) * 6 // 10
    assert not raw.endswith(b"\xff\xd9")
    assert scan_range(raw)[0] < len(raw)  # some scan data survives
    with Image.open(corpus[name].path) as im:
        assert im.size == (256, 192)
        with pytest.raises(OSError, match="truncated"):
            im.load()


def test_jpeg_headers_only(corpus):
    raw = data(corpus, "jpeg-headers-only")
    assert data(corpus, "jpeg-420-baseline").startswith(raw)
    assert jpeg_segments(raw)[-1][0] == 0xDA
    assert scan_range(raw) == (len(raw), len(raw))  # ends exactly after the SOS header
    with Image.open(corpus["jpeg-headers-only"].path) as im:
        assert im.size == (256, 192)
        with pytest.raises(OSError):
            im.load()


def test_jpeg_corrupt_scan(corpus):
    raw, good = data(corpus, "jpeg-corrupt-scan"), data(corpus, "jpeg-420-baseline")
    assert len(raw) == len(good)
    diff = [i for i in range(len(raw)) if raw[i] != good[i]]
    start, end = scan_range(good)
    assert len(diff) == 48 and start < diff[0] and diff[-1] < end
    assert all(good[i] != 0xFF and raw[i] != 0xFF and good[i - 1] != 0xFF for i in diff)
    assert jpeg_segments(raw) == jpeg_segments(good) and scan_range(raw) == (start, end)
    # stock PIL decodes it without an exception, but the picture is damaged
    assert np.abs(rgb(corpus, "jpeg-corrupt-scan") - rgb(corpus, "jpeg-420-baseline")).mean() > 10
    # and libjpeg-turbo reports it as corrupt data (a warning, not an error)
    tj = turbojpeg_or_skip()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tj.decode(raw)
    assert any("Corrupt JPEG data" in str(w.message) for w in caught)


def test_jpeg_corrupt_header(corpus):
    raw = data(corpus, "jpeg-corrupt-header")
    assert raw[:3] == b"\xff\xd8\xff" and len(raw) == 2003
    with pytest.raises(UnidentifiedImageError):
        Image.open(corpus["jpeg-corrupt-header"].path)


def test_empty_and_text(corpus):
    assert corpus["empty-jpg"].path.suffix == ".jpg" and data(corpus, "empty-jpg") == b""
    text = data(corpus, "text-jpg")
    assert corpus["text-jpg"].path.suffix == ".jpg" and text.startswith(b"This is not an image")
    assert all(32 <= c < 127 or c == 10 for c in text)
    for name in ("empty-jpg", "text-jpg"):
        with pytest.raises(UnidentifiedImageError):
            Image.open(corpus[name].path)


def test_wrong_extensions(corpus):
    assert corpus["png-named-jpg"].path.suffix == ".jpg"
    assert data(corpus, "png-named-jpg") == data(corpus, "png-rgb")
    assert corpus["jpeg-named-png"].path.suffix == ".png"
    assert data(corpus, "jpeg-named-png")[:3] == b"\xff\xd8\xff"
    assert opened(corpus, "jpeg-named-png").format == "JPEG"


# --------------------------------------------------------------------------------------------
# PNG


@pytest.mark.parametrize(
    "name,mode,depth,colour,interlace",
    [
        ("png-rgb", "RGB", 8, 2, 0),
        ("png-named-jpg", "RGB", 8, 2, 0),
        ("png-rgba", "RGBA", 8, 6, 0),
        ("png-palette", "P", 8, 3, 0),
        ("png-palette-trns", "P", 8, 3, 0),
        ("png-gray", "L", 8, 0, 0),
        ("png-gray-alpha", "LA", 8, 4, 0),
        ("png-1bit", "1", 1, 0, 0),
        ("png-gray16", "I;16", 16, 0, 0),
        ("png-rgb16", "RGB", 16, 2, 0),
        ("png-interlaced", "RGB", 8, 2, 1),
    ],
)
def test_png_header_and_mode(corpus, name, mode, depth, colour, interlace):
    raw = data(corpus, name)
    im = opened(corpus, name)
    assert png_ihdr(raw)[2:] == (depth, colour, interlace)
    assert png_ihdr(raw)[:2] == im.size
    assert im.mode == mode
    assert (b"tRNS" in png_chunks(raw)) is (name == "png-palette-trns")


def test_png_rgba_alpha_varies(corpus):
    alpha = np.asarray(opened(corpus, "png-rgba"))[..., 3]
    assert alpha.min() == 0 and alpha.max() == 255 and (alpha == 128).sum() > 1000
    assert len(np.unique(alpha)) > 100


def test_png_palette_transparency(corpus):
    im = opened(corpus, "png-palette-trns")
    assert im.info["transparency"] == bytes([0, 64, 128, 192])
    used = set(np.unique(np.asarray(im)).tolist())
    assert {0, 1, 2, 3} <= used  # the translucent entries are actually on the picture
    assert "transparency" not in opened(corpus, "png-palette").info
    assert len(opened(corpus, "png-palette").getpalette()) // 3 >= 64


def test_png_gray16(corpus):
    a = np.asarray(opened(corpus, "png-gray16"))
    assert a.dtype == np.uint16 and a.max() > 255
    assert len(np.unique(a & 0xFF)) == 256  # the low bytes carry information


def test_png_rgb16_is_rgb_not_bgr(corpus):
    a = cv2.imread(str(corpus["png-rgb16"].path), cv2.IMREAD_UNCHANGED)
    assert a.dtype == np.uint16 and a.shape == (150, 200, 3)
    rgb16 = a[..., ::-1]
    assert np.array_equal((rgb16 >> 8).astype(np.int32), rgb(corpus, "png-rgb"))  # OpenCV's BGR undone
    assert len(np.unique(rgb16 & 0xFF)) == 256
    assert np.array_equal(rgb(corpus, "png-rgb16"), rgb(corpus, "png-rgb"))  # PIL keeps the high bytes


def test_png_interlaced_is_real_adam7(corpus):
    """Both PIL and OpenCV de-interlace it to exactly the picture that was encoded."""
    source = photo(131, 97, seed=12)
    assert opened(corpus, "png-interlaced").info.get("interlace") == 1
    assert np.array_equal(rgb(corpus, "png-interlaced"), source)
    assert np.array_equal(cv2.imread(str(corpus["png-interlaced"].path))[..., ::-1], source)


# --------------------------------------------------------------------------------------------
# Other formats


def test_bmp_24bit(corpus):
    raw = data(corpus, "bmp-rgb24")
    assert raw[:2] == b"BM"
    width, height, _, bpp, compression = struct.unpack("<iiHHI", raw[18:34])
    assert (width, height, bpp, compression) == (161, 121, 24, 0)  # height > 0: bottom-up
    assert opened(corpus, "bmp-rgb24").mode == "RGB"


@pytest.mark.parametrize("name,fourcc", [("webp-lossy", b"VP8 "), ("webp-lossless", b"VP8L")])
def test_webp(corpus, name, fourcc):
    raw = data(corpus, name)
    assert raw[:4] == b"RIFF" and raw[8:12] == b"WEBP" and raw[12:16] == fourcc
    assert opened(corpus, name).mode == "RGB"


def test_webp_lossless_is_lossless(corpus):
    assert np.array_equal(rgb(corpus, "webp-lossless"), rgb(corpus, "tiff-rgb"))


def test_gif_animated(corpus):
    with Image.open(corpus["gif-animated"].path) as im:
        assert im.is_animated and im.n_frames == 3
        frames = []
        for i in range(3):
            im.seek(i)
            frames.append(np.asarray(im.convert("RGB")).astype(np.int32))
    for i in range(3):
        for j in range(i):
            assert np.abs(frames[i] - frames[j]).mean() > 20


@pytest.mark.parametrize("name,mode,photometric", [("tiff-rgb", "RGB", 2), ("tiff-cmyk", "CMYK", 5)])
def test_tiff(corpus, name, mode, photometric):
    im = opened(corpus, name)
    assert im.mode == mode
    assert im.tag_v2[262] == photometric
    assert im.tag_v2[259] == 1  # no compression


# --------------------------------------------------------------------------------------------
# The huge file


def test_huge_jpeg(corpus):
    e = corpus["jpeg-huge"]
    assert e.huge and e.kind == "jpeg" and e.path.name == "jpeg-huge-12000x9000.jpg"
    width, height = HUGE_SIZE
    assert Image.MAX_IMAGE_PIXELS < width * height < 2 * Image.MAX_IMAGE_PIXELS  # a warning, not an error
    with pytest.warns(Image.DecompressionBombWarning), Image.open(e.path) as im:
        assert im.size == (width, height)
        assert JpegImagePlugin.get_sampling(im) == 2 and not im.info.get("progressive")
        im.draft("RGB", (width // 8, height // 8))  # DCT-scaled decode: quick look at the content
        small = np.asarray(im.convert("RGB")).astype(np.int32)
    assert small.shape == (height // 8, width // 8, 3)
    assert small.std() > 30
    assert e.path.stat().st_size < 40_000_000


# --------------------------------------------------------------------------------------------
# Determinism, command line, README


def assert_same_files(corpus, entries):
    expected = [e for e in corpus.values() if not e.huge]
    assert [(e.name, e.path.name, e.kind, e.note) for e in entries] == [
        (e.name, e.path.name, e.kind, e.note) for e in expected
    ]
    for mine, theirs in zip(entries, expected, strict=True):
        if theirs.kind != "missing":
            assert mine.path.read_bytes() == theirs.path.read_bytes(), mine.name


def test_build_is_deterministic(corpus, tmp_path):
    entries = build(tmp_path, huge=False)
    assert not any(e.huge for e in entries)
    assert_same_files(corpus, entries)
    (tmp_path / "missing.jpg").write_bytes(b"stale")
    again = build(tmp_path, huge=False)  # a rebuild in place rewrites, and removes the "missing" path
    assert_same_files(corpus, again)
    assert not (tmp_path / "missing.jpg").exists()


def test_command_line(corpus, tmp_path):
    out = tmp_path / "out"
    script = DATA_DIR / "make_corpus.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(out), "--no-huge"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "jpeg-huge" not in proc.stdout and f"{len(corpus) - 1} entries" in proc.stdout
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(e.path.name for e in corpus.values() if not e.huge and e.kind != "missing")
    for e in corpus.values():
        if not e.huge and e.kind != "missing":
            assert (out / e.path.name).read_bytes() == e.path.read_bytes(), e.name


def test_readme_lists_every_entry(corpus):
    """The README's table is make_corpus.py's own (``--table``): regenerate it when entries change."""
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    for row in make_corpus.markdown_table(list(corpus.values())).splitlines():
        assert row in readme
