"""Deterministic generator of the image-file corpus used for stock-vs-nanopatch loader parity.

Usable as a script::

    python tests/data/make_corpus.py OUTDIR [--no-huge] [--table]

and as a module (``tests/`` on ``sys.path``)::

    from data.make_corpus import build
    entries = build(tmp_path, huge=False)

Every call rewrites every file from scratch; the bytes depend only on the seeds below (and on the
versions of numpy, Pillow, libjpeg-turbo, libwebp, zlib and OpenCV doing the encoding), so two
builds on one machine give identical files. Nothing here is checked in: tests build the corpus
into a temporary folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import pathlib
import struct
import sys
import zlib
from collections.abc import Callable

import cv2
import numpy as np
from PIL import Image

try:  # Pillow built without littlecms: no ICC entry
    from PIL import ImageCms
except ImportError:  # pragma: no cover
    ImageCms = None

__all__ = [
    "HUGE_SIZE",
    "KINDS",
    "Entry",
    "app_segments",
    "build",
    "jpeg_segments",
    "main",
    "markdown_table",
    "photo",
    "scan_range",
]

HUGE_SIZE = (12000, 9000)  # width, height: 108,000,000 px > PIL's MAX_IMAGE_PIXELS (89,478,485)
KINDS = ("jpeg", "png", "bmp", "webp", "gif", "tiff", "bad", "missing")


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str  # unique id, e.g. "jpeg-420-progressive"
    path: pathlib.Path  # the file (for "missing": a path that does not exist)
    kind: str  # "jpeg" | "png" | "bmp" | "webp" | "gif" | "tiff" | "bad" | "missing"
    note: str  # one line: what is special about it
    huge: bool = False


# --------------------------------------------------------------------------------------------
# Content: photo-like pixels (smooth gradients + shapes with sharp chroma edges + fine texture).


def photo(width: int, height: int, seed: int, *, noise: int = 8, shapes: int = 7) -> np.ndarray:
    """An RGB uint8 array (height, width, 3) that compresses like a photo, not like flat colour:
    low-frequency colour gradients, a few saturated discs/rectangles/lines (chroma edges that
    cross MCU boundaries at odd positions), a fine oblique texture and seeded integer noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u = x / max(width - 1, 1)
    v = y / max(height - 1, 1)
    ph = rng.uniform(0.0, 2.0 * np.pi, size=6)
    img = np.empty((height, width, 3), dtype=np.float64)
    img[..., 0] = 120 + 80 * np.sin(2.1 * u + 1.3 * v + ph[0]) + 30 * np.cos(5.0 * u * v + ph[1])
    img[..., 1] = 110 + 70 * np.sin(1.7 * v - 0.8 * u + ph[2]) + 25 * np.cos(3.3 * u + ph[3])
    img[..., 2] = 130 + 90 * np.cos(1.2 * u + 2.4 * v + ph[4]) + 20 * np.sin(4.1 * v + ph[5])
    for i in range(shapes):
        colour = rng.integers(0, 256, size=3).astype(np.float64)
        colour[i % 3] = 255 if rng.random() < 0.5 else 0  # push towards saturated: strong chroma edges
        cx, cy = rng.uniform(0.0, 1.0, size=2)
        size = rng.uniform(0.08, 0.3)
        if i % 3 == 0:  # disc
            mask = (u - cx) ** 2 + ((v - cy) * height / max(width, 1)) ** 2 < size**2
        elif i % 3 == 1:  # rectangle
            mask = (np.abs(u - cx) < size) & (np.abs(v - cy) < size * 0.6)
        else:  # a thin slanted line, 1-3 px wide
            a, b = rng.uniform(-1.0, 1.0, size=2)
            dist = np.abs(a * (x - cx * width) + b * (y - cy * height)) / max(np.hypot(a, b), 1e-6)
            mask = dist < rng.uniform(0.5, 1.5)
        alpha = rng.uniform(0.7, 0.95)
        img[mask] = (1 - alpha) * img[mask] + alpha * colour
    img += (10 * np.sin(1.9 * x + 0.7 * y) * np.cos(0.45 * x - 1.3 * y))[..., None]  # fine texture
    if noise:
        img += rng.integers(-noise, noise + 1, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _asymmetric(width: int, height: int, seed: int) -> np.ndarray:
    """A photo with a big white "L" near the top-left corner and a red bar along the top edge,
    so any rotation or flip is obvious."""
    a = photo(width, height, seed)
    t = max(3, min(width, height) // 12)
    x0, y0 = width // 10, height // 10
    a[y0 : y0 + height // 2, x0 : x0 + t] = 250  # vertical stroke of the L
    a[y0 + height // 2 - t : y0 + height // 2, x0 : x0 + width // 3] = 250  # its foot
    a[:t, width // 2 :] = (230, 20, 20)  # red bar: top edge, right half
    return a


def _to_cmyk(rgb: np.ndarray) -> np.ndarray:
    """RGB -> CMYK with full grey-component replacement (K = 255 - max(R, G, B)); the inverse of
    Pillow's CMYK->RGB (R = (255 - K) * (255 - C) / 255), so convert("RGB") gives ``rgb`` back."""
    f = rgb.astype(np.float64)
    k = 255.0 - f.max(axis=-1)
    nk = np.maximum(255.0 - k, 1e-9)
    cmy = 255.0 * (1.0 - f / nk[..., None])
    cmyk = np.concatenate([cmy, k[..., None]], axis=-1)
    return np.clip(np.rint(cmyk), 0, 255).astype(np.uint8)


def _rgb_to_ycc(rgb: np.ndarray) -> np.ndarray:
    """JFIF (full-range BT.601) RGB -> YCbCr, as libjpeg's encoder computes it."""
    f = rgb.astype(np.float64)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    yy = 0.299 * r + 0.587 * g + 0.114 * b
    cb = -0.168735892 * r - 0.331264108 * g + 0.5 * b + 128
    cr = 0.5 * r - 0.418687589 * g - 0.081312411 * b + 128
    return np.clip(np.rint(np.stack([yy, cb, cr], axis=-1)), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# Byte-level helpers (also used by the tests).


def jpeg_segments(data: bytes) -> list[tuple[int, int, int]]:
    """The marker segments of a JPEG up to and including the first SOS, as
    (marker, offset of the 0xFF, total length including the 2 marker bytes)."""
    if data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no SOI)")
    out = [(0xD8, 0, 2)]
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise ValueError(f"expected a marker at offset {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        (seglen,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        out.append((marker, pos, seglen + 2))
        pos += seglen + 2
        if marker == 0xDA:
            break
    return out


def app_segments(data: bytes, marker: int) -> list[bytes]:
    """Payloads (after the 2 length bytes) of every segment with this marker before the scan."""
    return [data[off + 4 : off + length] for m, off, length in jpeg_segments(data) if m == marker]


def scan_range(data: bytes) -> tuple[int, int]:
    """(start, end) of the entropy-coded data of the first scan: just after the first SOS header,
    up to the next marker that is neither a stuffed 0xFF00 nor a restart marker RST0-RST7."""
    _, off, length = jpeg_segments(data)[-1]
    start = end = off + length
    while end + 1 < len(data):
        if data[end] == 0xFF and data[end + 1] != 0x00 and not 0xD0 <= data[end + 1] <= 0xD7:
            break
        end += 1
    return start, end


def _png_with_adam7(rgb: np.ndarray) -> bytes:
    """A real Adam7-interlaced 8-bit RGB PNG (Pillow and OpenCV can read but not write one):
    seven reduced images, each scanline with filter type 0, zlib-compressed into one IDAT."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    height, width = rgb.shape[:2]
    raw = bytearray()
    for x0, y0, dx, dy in (
        (0, 0, 8, 8),
        (4, 0, 8, 8),
        (0, 4, 4, 8),
        (2, 0, 4, 4),
        (0, 2, 2, 4),
        (1, 0, 2, 2),
        (0, 1, 1, 2),
    ):
        sub = rgb[y0::dy, x0::dx]
        if sub.size == 0:  # empty pass: no scanlines at all, not even filter bytes
            continue
        for row in sub:
            raw += b"\x00" + row.tobytes()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1)  # 8-bit, truecolour, interlace 1
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b"")
    )


def _encode(im: Image.Image, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **params)
    return buf.getvalue()


def _jpeg(arr: np.ndarray, *, quality: int = 90, subsampling: str = "4:2:0", **params) -> bytes:
    return _encode(Image.fromarray(arr), "JPEG", quality=quality, subsampling=subsampling, **params)


def _srgb_icc() -> bytes:
    """Little CMS's built-in sRGB profile, with its creation date pinned (lcms stamps the current
    time into header bytes 24-35, which would make builds differ)."""
    icc = bytearray(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    icc[24:36] = struct.pack(">6H", 2024, 1, 1, 0, 0, 0)
    return bytes(icc)


def _ycck_jpeg(cmyk: np.ndarray, quality: int) -> bytes:
    """A YCCK JPEG (Adobe APP14 transform 2) whose decoded CMYK approximates ``cmyk``.

    libjpeg decodes YCCK as C = 255 - R, M = 255 - G, Y = 255 - B (R, G, B from the stored
    Y/Cb/Cr) and K = stored K; Pillow then inverts all four (Adobe CMYK, rawmode "CMYK;I"). So the
    stored samples must be YCbCr(C, M, Y) and 255 - K in Pillow's CMYK terms. Pillow itself
    inverts all four channels when it writes CMYK, so it is handed 255 - stored; the encoded
    image is a plain 4:4:4 Adobe CMYK JPEG whose transform byte is then patched from 0 to 2."""
    stored = np.concatenate([_rgb_to_ycc(cmyk[..., :3]), 255 - cmyk[..., 3:]], axis=-1)
    data = bytearray(_encode(Image.fromarray(255 - stored, "CMYK"), "JPEG", quality=quality, subsampling="4:4:4"))
    adobe = [(off, length) for m, off, length in jpeg_segments(bytes(data)) if m == 0xEE]
    if len(adobe) != 1 or data[adobe[0][0] + 4 : adobe[0][0] + 9] != b"Adobe":
        raise RuntimeError("Pillow wrote a CMYK JPEG without exactly one Adobe APP14 segment")
    off, length = adobe[0]
    if length != 16 or data[off + 15] != 0:
        raise RuntimeError("unexpected Adobe APP14 layout")
    data[off + 15] = 2  # transform: 0 = none (CMYK), 1 = YCbCr, 2 = YCCK
    return bytes(data)


def _corrupt_scan(data: bytes, seed: int, *, run: int = 48) -> bytes:
    """Overwrite a run of entropy-coded bytes in the middle of the scan with random values,
    leaving every 0xFF and the byte after it alone (so no marker is made or broken)."""
    start, end = scan_range(data)
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    pos = (start + end) // 2
    changed = 0
    while changed < run and pos < end - 2:
        if out[pos] != 0xFF and out[pos - 1] != 0xFF:
            new = int(rng.integers(0, 255))  # 0..254: never 0xFF
            if new == out[pos]:
                new ^= 0x55
            out[pos] = new
            changed += 1
        pos += 1
    return bytes(out)


def _write_huge(path: pathlib.Path, seed: int) -> None:
    """12000x9000 4:2:0 JPEG, quality 85: one 400x300 photo tile repeated, plus separable
    row/column colour gradients so no two tiles are equal. Pasted band by band into one Pillow
    image (~430 MB: Pillow keeps RGB at 4 bytes per pixel), encoded straight to the file."""
    width, height = HUGE_SIZE
    tile = photo(400, 300, seed, noise=3).astype(np.int16)
    reps = -(-width // tile.shape[1])
    row_tile = np.tile(tile, (1, reps, 1))[:, :width]
    cols = np.linspace(0.0, 1.0, width)[:, None]
    rows = np.linspace(0.0, 1.0, height)[:, None]
    col_grad = np.rint(np.hstack([40 * cols - 20, 30 * np.sin(3 * cols), -40 * cols + 20])).astype(np.int16)
    row_grad = np.rint(np.hstack([30 * np.cos(2 * rows), 40 * rows - 20, 25 * np.sin(5 * rows)])).astype(np.int16)
    im = Image.new("RGB", (width, height))
    th = tile.shape[0]
    for y0 in range(0, height, th):
        n = min(th, height - y0)
        band = row_tile[:n] + col_grad[None] + row_grad[y0 : y0 + n, None]
        im.paste(Image.fromarray(np.clip(band, 0, 255).astype(np.uint8)), (0, y0))
    im.save(path, "JPEG", quality=85, subsampling="4:2:0")


# --------------------------------------------------------------------------------------------
# The corpus.


def _specs(huge: bool) -> list[tuple[str, str, str, str, Callable[[pathlib.Path], None], bool]]:
    """(name, file name, kind, note, writer, huge) for every entry, in order. Writers get the path."""
    specs: list[tuple[str, str, str, str, Callable[[pathlib.Path], None], bool]] = []

    def add(name, filename, kind, note, make: Callable[[], bytes] | None, *, writer=None, is_huge=False):
        def write(path: pathlib.Path, make=make) -> None:
            path.write_bytes(make())

        specs.append((name, filename, kind, note, writer or write, is_huge))

    base = photo(256, 192, seed=1)
    sub_names = {"4:4:4": "444", "4:2:2": "422", "4:2:0": "420"}

    # --- JPEG: the ordinary ones
    for progressive in (False, True):
        for sub, tag in sub_names.items():
            flavour = "progressive" if progressive else "baseline"
            add(
                f"jpeg-{tag}-{flavour}",
                f"jpeg-{tag}-{flavour}.jpg",
                "jpeg",
                f"{flavour} {sub} quality 90, 256x192",
                lambda sub=sub, progressive=progressive: _jpeg(base, subsampling=sub, progressive=progressive),
            )
    for q in (75, 95):
        add(
            f"jpeg-420-q{q}",
            f"jpeg-420-q{q}.jpg",
            "jpeg",
            f"baseline 4:2:0 quality {q}, 256x192",
            lambda q=q: _jpeg(base, quality=q),
        )
    odd = photo(161, 117, seed=2)
    add(
        "jpeg-420-odd-161x117",
        "jpeg-420-odd-161x117.jpg",
        "jpeg",
        "4:2:0 with odd size 161x117: partial MCUs on the right and bottom edges",
        lambda: _jpeg(odd),
    )
    add(
        "jpeg-tiny-7x3",
        "jpeg-tiny-7x3.jpg",
        "jpeg",
        "4:2:0, 7x3 pixels: smaller than one MCU",
        lambda: _jpeg(photo(7, 3, seed=3, shapes=0)),
    )
    add(
        "jpeg-tiny-1x1",
        "jpeg-tiny-1x1.jpg",
        "jpeg",
        "4:2:0, a single pixel",
        lambda: _jpeg(np.array([[[200, 60, 30]]], dtype=np.uint8)),
    )
    if _pillow_has_restart():
        add(
            "jpeg-restart-markers",
            "jpeg-restart-markers.jpg",
            "jpeg",
            "baseline 4:2:0 with a DRI segment and an RST0-RST7 marker after every MCU row",
            lambda: _jpeg(base, restart_marker_rows=1),
        )
    if ImageCms is not None:
        add(
            "jpeg-icc-srgb",
            "jpeg-icc-srgb.jpg",
            "jpeg",
            "4:2:0 with an embedded sRGB ICC profile (APP2 ICC_PROFILE)",
            lambda: _jpeg(base, icc_profile=_srgb_icc()),
        )
    add(
        "jpeg-uppercase-ext",
        "jpeg-uppercase-ext.JPEG",
        "jpeg",
        "ordinary 4:2:0 JPEG with an upper-case .JPEG extension (ImageNet style)",
        lambda: _jpeg(photo(200, 150, seed=4)),
    )
    add(
        "jpeg-gray",
        "jpeg-gray.jpg",
        "jpeg",
        "grayscale (mode L, one component)",
        lambda: _encode(Image.fromarray(base).convert("L"), "JPEG", quality=90),
    )

    cmyk = _to_cmyk(photo(200, 150, seed=5))
    add(
        "jpeg-cmyk",
        "jpeg-cmyk.jpg",
        "jpeg",
        "4-component Adobe CMYK (APP14 transform 0, inverted samples), 200x150",
        lambda: _encode(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=90, subsampling="4:4:4"),
    )
    add(
        "jpeg-ycck",
        "jpeg-ycck.jpg",
        "jpeg",
        "4-component Adobe YCCK (APP14 transform 2), same picture as jpeg-cmyk",
        lambda: _ycck_jpeg(cmyk, 90),
    )

    def exif6() -> bytes:
        exif = Image.Exif()
        exif[0x0112] = 6  # Orientation: rotate 90 CW to display
        return _jpeg(_asymmetric(240, 160, seed=6), exif=exif)

    add(
        "jpeg-exif-orientation-6",
        "jpeg-exif-orientation-6.jpg",
        "jpeg",
        "EXIF Orientation=6 on a non-symmetric 240x160 picture (stock torchvision does not rotate)",
        exif6,
    )

    # --- JPEG: damaged
    good = _jpeg(base)
    good_progressive = _jpeg(base, progressive=True)
    add(
        "jpeg-truncated",
        "jpeg-truncated.jpg",
        "bad",
        "baseline 4:2:0 JPEG cut to 60% of its bytes (no EOI)",
        lambda: good[: len(good) * 6 // 10],
    )
    add(
        "jpeg-truncated-progressive",
        "jpeg-truncated-progressive.jpg",
        "bad",
        "progressive 4:2:0 JPEG cut to 60% of its bytes (no EOI)",
        lambda: good_progressive[: len(good_progressive) * 6 // 10],
    )
    add(
        "jpeg-headers-only",
        "jpeg-headers-only.jpg",
        "bad",
        "JPEG cut right after the SOS header: every header, no entropy-coded data",
        lambda: good[: scan_range(good)[0]],
    )
    add(
        "jpeg-corrupt-scan",
        "jpeg-corrupt-scan.jpg",
        "bad",
        "baseline JPEG with 48 entropy-coded bytes randomised mid-scan (markers intact): decodes with warnings",
        lambda: _corrupt_scan(good, seed=7),
    )
    add(
        "jpeg-corrupt-header",
        "jpeg-corrupt-header.jpg",
        "bad",
        "JPEG signature FF D8 FF followed by 2000 random bytes",
        lambda: b"\xff\xd8\xff" + np.random.default_rng(8).integers(0, 256, 2000, dtype=np.uint8).tobytes(),
    )

    # --- wrong content for the name
    add("empty-jpg", "empty.jpg", "bad", "zero-byte file named .jpg", lambda: b"")
    add(
        "text-jpg",
        "text.jpg",
        "bad",
        "plain text file named .jpg",
        lambda: b"This is not an image.\nJust a text file with a .jpg name.\n",
    )
    png_rgb = photo(200, 150, seed=9)
    add(
        "png-named-jpg",
        "png-named-jpg.jpg",
        "png",
        "8-bit RGB PNG named .jpg",
        lambda: _encode(Image.fromarray(png_rgb), "PNG"),
    )
    add("jpeg-named-png", "jpeg-named-png.png", "jpeg", "4:2:0 JPEG named .png", lambda: _jpeg(png_rgb))

    # --- PNG
    add("png-rgb", "png-rgb.png", "png", "8-bit RGB (colour type 2)", lambda: _encode(Image.fromarray(png_rgb), "PNG"))

    def rgba() -> bytes:
        h, w = png_rgb.shape[:2]
        yy, xx = np.mgrid[0:h, 0:w]
        alpha = (xx * 255 // (w - 1)).astype(np.uint8)  # 0 on the left edge .. 255 on the right
        alpha[(xx - w // 2) ** 2 + (yy - h // 2) ** 2 < (h // 4) ** 2] = 128
        return _encode(Image.fromarray(np.dstack([png_rgb, alpha])), "PNG")

    add("png-rgba", "png-rgba.png", "png", "8-bit RGBA (colour type 6), alpha ramps 0..255 with a 128 disc", rgba)
    palette = Image.fromarray(png_rgb).quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    add(
        "png-palette",
        "png-palette.png",
        "png",
        "palette (mode P, colour type 3), 64 colours, no tRNS",
        lambda: _encode(palette, "PNG"),
    )
    add(
        "png-palette-trns",
        "png-palette-trns.png",
        "png",
        "palette with a tRNS chunk: per-entry alpha 0, 64, 128, 192, then opaque",
        lambda: _encode(palette, "PNG", transparency=bytes([0, 64, 128, 192])),
    )
    add(
        "png-gray",
        "png-gray.png",
        "png",
        "8-bit grayscale (mode L, colour type 0)",
        lambda: _encode(Image.fromarray(png_rgb).convert("L"), "PNG"),
    )

    def gray_alpha() -> bytes:
        lum = np.asarray(Image.fromarray(png_rgb).convert("L"))
        alpha = np.tile(np.linspace(255, 0, lum.shape[0]).astype(np.uint8)[:, None], (1, lum.shape[1]))
        return _encode(Image.fromarray(np.dstack([lum, alpha])), "PNG")

    add("png-gray-alpha", "png-gray-alpha.png", "png", "8-bit grayscale + alpha (mode LA, colour type 4)", gray_alpha)
    add(
        "png-1bit",
        "png-1bit.png",
        "png",
        "1-bit black and white (mode 1, bit depth 1), Floyd-Steinberg dithered",
        lambda: _encode(Image.fromarray(png_rgb).convert("1"), "PNG"),
    )

    def gray16() -> bytes:
        lum = np.asarray(Image.fromarray(png_rgb).convert("L")).astype(np.uint16)
        low = np.random.default_rng(10).integers(0, 256, lum.shape, dtype=np.uint16)
        return _encode(Image.fromarray(lum * 256 + low), "PNG")

    add("png-gray16", "png-gray16.png", "png", "16-bit grayscale (mode I;16, bit depth 16), low bytes random", gray16)

    def rgb16() -> bytes:
        low = np.random.default_rng(11).integers(0, 256, png_rgb.shape, dtype=np.uint16)
        rgb = png_rgb.astype(np.uint16) * 256 + low
        ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))  # OpenCV writes BGR
        if not ok:
            raise RuntimeError("cv2.imencode failed on a uint16 3-channel array")
        return buf.tobytes()

    add(
        "png-rgb16",
        "png-rgb16.png",
        "png",
        "16-bit RGB (48 bits per pixel, written by OpenCV); high bytes = png-rgb, low bytes random",
        rgb16,
    )
    odd_png = photo(131, 97, seed=12)
    add(
        "png-interlaced",
        "png-interlaced.png",
        "png",
        "Adam7-interlaced 8-bit RGB, 131x97 (hand-written: Pillow and OpenCV cannot write interlaced PNG)",
        lambda: _png_with_adam7(odd_png),
    )

    # --- other formats
    small = photo(160, 120, seed=13)
    add(
        "bmp-rgb24",
        "bmp-rgb24.bmp",
        "bmp",
        "24-bit uncompressed BMP (bottom-up rows, padded to 4 bytes), 161x121",
        lambda: _encode(Image.fromarray(photo(161, 121, seed=14)), "BMP"),
    )
    add(
        "webp-lossy",
        "webp-lossy.webp",
        "webp",
        "lossy WebP (VP8), quality 80",
        lambda: _encode(Image.fromarray(png_rgb), "WEBP", quality=80, method=4),
    )
    add(
        "webp-lossless",
        "webp-lossless.webp",
        "webp",
        "lossless WebP (VP8L)",
        lambda: _encode(Image.fromarray(small), "WEBP", lossless=True, quality=80, method=4),
    )

    def gif() -> bytes:
        frames = [
            Image.fromarray(photo(160, 120, seed=20 + i)).quantize(colors=128, method=Image.Quantize.MEDIANCUT)
            for i in range(3)
        ]
        return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)

    add(
        "gif-animated",
        "gif-animated.gif",
        "gif",
        "animated GIF, 3 frames with different pictures (loaders use frame 0)",
        gif,
    )
    add(
        "tiff-rgb",
        "tiff-rgb.tiff",
        "tiff",
        "uncompressed 8-bit RGB TIFF (photometric 2)",
        lambda: _encode(Image.fromarray(small), "TIFF"),
    )
    add(
        "tiff-cmyk",
        "tiff-cmyk.tiff",
        "tiff",
        "uncompressed 8-bit CMYK TIFF (photometric 5, separated)",
        lambda: _encode(Image.fromarray(_to_cmyk(small), "CMYK"), "TIFF"),
    )

    if huge:
        w, h = HUGE_SIZE
        add(
            "jpeg-huge",
            f"jpeg-huge-{w}x{h}.jpg",
            "jpeg",
            f"{w}x{h} 4:2:0 quality 85: {w * h:,} px > Image.MAX_IMAGE_PIXELS, PIL warns DecompressionBombWarning",
            None,
            writer=lambda path: _write_huge(path, seed=30),
            is_huge=True,
        )
    return specs


def _pillow_has_restart() -> bool:
    """Whether this Pillow's JPEG writer knows restart_marker_rows (Pillow >= 10.2)."""
    try:
        data = _encode(Image.new("RGB", (32, 32)), "JPEG", restart_marker_rows=1)
    except (TypeError, ValueError, OSError):  # pragma: no cover
        return False
    return b"\xff\xdd" in data


MISSING_NAME = "missing.jpg"


def build(outdir, *, huge: bool = True) -> list[Entry]:
    """Write the corpus into ``outdir`` (created if needed; every file rewritten, deterministic
    bytes) and return its entries in a fixed order. The "missing" entry's path is removed if a
    file of that name exists."""
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, filename, kind, note, write, is_huge in _specs(huge):
        path = outdir / filename
        write(path)
        entries.append(Entry(name, path, kind, note, is_huge))
    missing = outdir / MISSING_NAME
    missing.unlink(missing_ok=True)
    entries.append(Entry("missing", missing, "missing", "path that does not exist (FileNotFoundError)"))
    names = [e.name for e in entries]
    assert len(set(names)) == len(names), "entry names must be unique"
    assert all(e.kind in KINDS for e in entries)
    return entries


def markdown_table(entries: list[Entry]) -> str:
    """The README table: one row per entry."""
    rows = ["| name | file | kind | note |", "| --- | --- | --- | --- |"]
    rows += [f"| `{e.name}` | `{e.path.name}` | {e.kind} | {e.note} |" for e in entries]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=pathlib.Path, help="folder to write the files into (created if needed)")
    parser.add_argument("--no-huge", action="store_true", help="skip the 12000x9000 JPEG (several seconds, ~MBs)")
    parser.add_argument("--table", action="store_true", help="print the README's markdown table instead of a listing")
    args = parser.parse_args(argv)
    entries = build(args.outdir, huge=not args.no_huge)
    if args.table:
        print(markdown_table(entries))
        return 0
    total = 0
    for e in entries:
        size = e.path.stat().st_size if e.path.exists() else None
        total += size or 0
        print(f"{e.name:28} {e.kind:8} {'-' if size is None else size:>10}  {e.path}")
    print(f"{len(entries)} entries, {total:,} bytes in {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
