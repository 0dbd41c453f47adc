"""Image bytes (or a path) -> HWC uint8 ndarray, through the fastest decoder that gives stock's
pixels.

JPEG (recognised by its magic bytes, whatever the file is called) goes to libjpeg-turbo
through PyTurboJPEG when the system library loads, else to OpenCV's bundled libjpeg-turbo.
Both decode with the accurate integer IDCT and fancy upsampling, exactly as Pillow does, so a
full-size decode equals ``Image.open(f).convert("RGB")`` bit for bit; each backend proves that
on first use against Pillow and is dropped (logged once) if it cannot.

Anything a fast backend is not sure to reproduce goes to Pillow, which *is* the stock path:
non-JPEG formats, CMYK/YCCK JPEGs, files without a final EOI marker (truncated), and any file
on which libjpeg-turbo reports even a warning. So a bad file fails with exactly the exception
stock torchvision raises, and an unusual one gets exactly stock's pixels.

``min_size=(h, w)`` asks for a DCT-scaled decode: the largest libjpeg-turbo reduction (1/2,
1/4, 1/8) whose result is still at least that size. That is what transforms use to fuse
decoding with the first resize or crop.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import threading
import warnings
from typing import Any

import numpy as np

from .._log import log_once
from . import _opencv

logger = logging.getLogger("nanopatch")

JPEG_MAGIC = b"\xff\xd8\xff"
_EOI = b"\xff\xd9"

#: DCT scaling reductions libjpeg-turbo does with SIMD, largest first.
_REDUCTIONS = (8, 4, 2)

# TurboJPEG constants, identical in PyTurboJPEG 1.x and 2.x (and libjpeg-turbo 2.x/3.x).
_TJPF_RGB = 0
_TJPF_GRAY = 6
_TJCS_YCBCR = 1
_TJCS_GRAY = 2

#: Environment variable that pins the JPEG backend: auto (default), turbojpeg, opencv or pil.
DECODER_VARIABLE = "NANOPATCH_DECODER"
#: Environment variable with the path of the libturbojpeg to load (default: the system's).
TURBOJPEG_LIB_VARIABLE = "NANOPATCH_TURBOJPEG_LIB"
_BACKENDS = ("auto", "turbojpeg", "opencv", "pil")

Source = Any  # str | os.PathLike | bytes | bytearray | memoryview | np.ndarray of uint8


@dataclasses.dataclass(frozen=True)
class JpegHeader:
    width: int
    height: int
    gray: bool  # single-component (grayscale) JPEG


def read_bytes(source: Source) -> bytes | memoryview:
    """The encoded bytes of ``source``: a path (read with ``open(path, "rb")``, so a missing
    file raises exactly what stock raises) or a bytes-like object (returned as is)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return source
    if isinstance(source, np.ndarray):
        return memoryview(np.ascontiguousarray(source, dtype=np.uint8)).cast("B")
    with open(source, "rb") as f:
        return f.read()


def is_jpeg(data: bytes | memoryview) -> bool:
    return bytes(data[:3]) == JPEG_MAGIC


def has_eoi(data: bytes | memoryview) -> bool:
    """Whether the JPEG ends with its EOI marker (allowing zero padding after it, as some
    cameras write). A truncated file does not; Pillow raises on those, libjpeg pads them."""
    end = len(data)
    while end > 0 and data[end - 1] == 0:
        end -= 1
    return end >= 2 and bytes(data[end - 2 : end]) == _EOI


def reduction_for(size: tuple[int, int], min_size: tuple[int, int] | None) -> int:
    """The largest DCT reduction (1, 2, 4 or 8) keeping ``size`` (h, w) at least ``min_size``."""
    if min_size is None:
        return 1
    height, width = size
    min_h, min_w = min_size
    for factor in _REDUCTIONS:
        if -(-height // factor) >= min_h and -(-width // factor) >= min_w:
            return factor
    return 1


# --- backends ----------------------------------------------------------------------------


class _Backend:
    """A JPEG decoder: ``header(data)`` and ``decode(data, factor, gray)``; ``None`` from either
    means "not for this file" (the caller then uses Pillow)."""

    name = "?"

    def header(self, data) -> JpegHeader | None:
        raise NotImplementedError

    def decode(self, data, factor: int, gray: bool) -> np.ndarray | None:
        raise NotImplementedError


class _TurboJPEG(_Backend):
    name = "turbojpeg"

    def __init__(self) -> None:
        from turbojpeg import TurboJPEG  # raises if PyTurboJPEG or libturbojpeg is missing

        # PyTurboJPEG 2.x refuses libjpeg-turbo 2.x (RuntimeError): then OpenCV takes over.
        self._tj = TurboJPEG(lib_path=os.environ.get(TURBOJPEG_LIB_VARIABLE) or None)

    def header(self, data) -> JpegHeader | None:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                width, height, _subsample, colorspace = self._tj.decode_header(data)[:4]
        except OSError:
            return None
        if caught or colorspace not in (_TJCS_YCBCR, _TJCS_GRAY):
            return None  # CMYK, YCCK, RGB-coded JPEGs and anything odd: Pillow decides
        return JpegHeader(width, height, colorspace == _TJCS_GRAY)

    def decode(self, data, factor: int, gray: bool) -> np.ndarray | None:
        scaling = None if factor == 1 else (1, factor)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                array = self._tj.decode(data, pixel_format=_TJPF_GRAY if gray else _TJPF_RGB, scaling_factor=scaling)
        except OSError:
            return None
        if caught:  # libjpeg warned (corrupt or truncated data): Pillow decides what stock does
            return None
        return array[:, :, 0] if gray else array


class _OpenCV(_Backend):
    name = "opencv"

    def __init__(self) -> None:
        cv2 = _opencv.cv2()
        ignore = cv2.IMREAD_IGNORE_ORIENTATION  # stock ignores EXIF orientation, so must we
        rgb = getattr(cv2, "IMREAD_COLOR_RGB", None)
        self._rgb = rgb
        self._flags = {
            (1, False): (rgb if rgb is not None else cv2.IMREAD_COLOR) | ignore,
            (2, False): cv2.IMREAD_REDUCED_COLOR_2 | ignore,
            (4, False): cv2.IMREAD_REDUCED_COLOR_4 | ignore,
            (8, False): cv2.IMREAD_REDUCED_COLOR_8 | ignore,
            (1, True): cv2.IMREAD_GRAYSCALE | ignore,
            (2, True): cv2.IMREAD_REDUCED_GRAYSCALE_2 | ignore,
            (4, True): cv2.IMREAD_REDUCED_GRAYSCALE_4 | ignore,
            (8, True): cv2.IMREAD_REDUCED_GRAYSCALE_8 | ignore,
        }

    def header(self, data) -> JpegHeader | None:
        return parse_jpeg_header(data)

    def decode(self, data, factor: int, gray: bool) -> np.ndarray | None:
        cv2 = _opencv.cv2()
        flags = self._flags[(factor, gray)]
        array = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
        if array is None:
            return None
        if not gray and (factor != 1 or self._rgb is None):
            array = cv2.cvtColor(array, cv2.COLOR_BGR2RGB)
        return array


def parse_jpeg_header(data) -> JpegHeader | None:
    """Width, height and component count from the SOF marker, for baseline/extended/progressive
    8-bit Huffman JPEGs with 1 (gray) or 3 (YCbCr) components; None for anything else (which
    then goes to Pillow)."""
    data = bytes(data[:65536]) if len(data) > 65536 else bytes(data)
    pos = 2
    adobe_transform = None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xEE and length >= 12 and data[pos + 4 : pos + 9] == b"Adobe":
            adobe_transform = data[pos + 15] if pos + 15 < len(data) else None
        if marker in (0xC0, 0xC1, 0xC2):
            if pos + 10 > len(data):
                return None
            precision = data[pos + 4]
            height = int.from_bytes(data[pos + 5 : pos + 7], "big")
            width = int.from_bytes(data[pos + 7 : pos + 9], "big")
            components = data[pos + 9]
            if precision != 8 or height == 0 or width == 0:
                return None
            if components == 1:
                return JpegHeader(width, height, True)
            if components == 3 and adobe_transform in (None, 1):
                return JpegHeader(width, height, False)
            return None  # CMYK/YCCK (4 components) or RGB-coded: Pillow decides
        if marker in (0xDA, 0xD9):  # scan or end before any frame header
            return None
        pos += 2 + length
    return None


_backend_lock = threading.Lock()
_UNLOADED: Any = object()
_backend: _Backend | None = _UNLOADED  # None: no fast backend, Pillow decodes


def _calibration_jpegs() -> list[bytes]:
    """Small photo-like JPEGs in the subsamplings that matter, encoded by Pillow."""
    from PIL import Image

    rng = np.random.default_rng(1234)
    y, x = np.mgrid[0:37, 0:53].astype(np.float32)
    base = np.stack([np.sin(x / (5 + c)) * 70 + np.cos(y / (4 + c)) * 50 + 128 for c in range(3)], -1)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    out = []
    for subsampling in (0, 1, 2):  # 4:4:4, 4:2:2, 4:2:0
        for progressive in (False, True):
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, "JPEG", quality=88, subsampling=subsampling, progressive=progressive)
            out.append(buf.getvalue())
    buf = io.BytesIO()
    Image.fromarray(pixels[:, :, 1]).save(buf, "JPEG", quality=88)
    out.append(buf.getvalue())
    return out


def _matches_pillow(backend: _Backend) -> bool:
    from PIL import Image

    for data in _calibration_jpegs():
        header = backend.header(data)
        decoded = backend.decode(data, 1, False) if header is not None else None
        if decoded is None:
            return False
        expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        if decoded.shape != expected.shape or not np.array_equal(decoded, expected):
            return False
    return True


def _load_backend() -> _Backend | None:
    """The first backend that loads and reproduces Pillow's pixels (None: Pillow only)."""
    wanted = os.environ.get(DECODER_VARIABLE, "auto").strip().lower() or "auto"
    if wanted not in _BACKENDS:
        raise ValueError(f"{DECODER_VARIABLE}={wanted!r} is not allowed; use one of: {', '.join(_BACKENDS)}")
    for cls in (_TurboJPEG, _OpenCV):
        if wanted not in ("auto", cls.name):
            continue
        try:
            backend = cls()
        except Exception as exc:
            log_once(
                f"decoder-{cls.name}",
                "JPEG decoder %s unavailable (%s: %s); using the next one",
                cls.name,
                type(exc).__name__,
                exc,
            )
            continue
        if not _matches_pillow(backend):
            log_once(
                f"decoder-{cls.name}-mismatch",
                "JPEG decoder %s does not reproduce Pillow's pixels in this build; not used",
                cls.name,
                level=logging.WARNING,
            )
            continue
        log_once("decoder-chosen", "JPEG decoding with %s", backend.name)
        return backend
    log_once("decoder-chosen", "JPEG decoding with Pillow (no faster decoder available)")
    return None


def jpeg_backend() -> _Backend | None:
    """The JPEG backend in use in this process (None: Pillow)."""
    global _backend
    if _backend is _UNLOADED:
        with _backend_lock:
            if _backend is _UNLOADED:
                _backend = _load_backend()
    return _backend


def reset_backends() -> None:
    """Forget the chosen backend (tests switch ``NANOPATCH_DECODER``)."""
    global _backend
    with _backend_lock:
        _backend = _UNLOADED


# --- the public functions ----------------------------------------------------------------


def _decompression_bomb_check(width: int, height: int) -> None:
    """Pillow's own check, so a huge image warns or fails exactly as ``Image.open`` would."""
    from PIL import Image

    check = getattr(Image, "_decompression_bomb_check", None)
    if check is not None:
        check((width, height))


def jpeg_header(data) -> JpegHeader | None:
    """The header of a JPEG the fast path can decode, or None."""
    backend = jpeg_backend()
    if backend is None or not is_jpeg(data):
        return None
    return backend.header(data)


def decode_fast(
    data, *, min_size: tuple[int, int] | None = None, mode: str = "RGB", header: JpegHeader | None = None
) -> np.ndarray | None:
    """Decode JPEG bytes with the fast backend, or return None when stock Pillow must decide.

    Returns (H, W, 3) RGB, or (H, W) for ``mode="L"``: a grayscale JPEG's own samples, and for
    a colour JPEG Pillow's RGB->L conversion of the RGB decode (libjpeg's luma is not that).
    ``header``: :func:`jpeg_header` of ``data`` when the caller has read it already."""
    backend = jpeg_backend()
    if backend is None or not is_jpeg(data) or not has_eoi(data):
        return None
    if header is None:
        header = backend.header(data)
    if header is None:
        return None
    _decompression_bomb_check(header.width, header.height)
    factor = reduction_for((header.height, header.width), min_size)
    gray = mode == "L" and header.gray
    array = backend.decode(data, factor, gray)
    if array is not None and mode == "L" and not gray:
        array = rgb_to_l(array)
    return array


def decode(source: Source, *, min_size: tuple[int, int] | None = None, mode: str = "RGB") -> np.ndarray:
    """Decode an image file or its bytes to a C-contiguous uint8 ndarray.

    ``mode="RGB"``: (H, W, 3), the pixels of ``Image.open(f).convert("RGB")``.
    ``mode="L"``: (H, W), the pixels of ``Image.open(f).convert("L")``.
    ``min_size=(h, w)``: allow a DCT-scaled JPEG decode that is at least that size (other
    formats, and JPEGs only Pillow can read, come back full size).
    Errors are Pillow's: ``PIL.UnidentifiedImageError`` for data that is no image, ``OSError``
    for a truncated or broken one, ``FileNotFoundError`` for a missing path.
    """
    return decode_data(read_bytes(source), fallback=source, min_size=min_size, mode=mode)


def decode_data(
    data,
    *,
    fallback: Source,
    min_size: tuple[int, int] | None = None,
    mode: str = "RGB",
    header: JpegHeader | None = None,
) -> np.ndarray:
    """:func:`decode` for bytes already read; ``fallback`` (the path, when there is one) is what
    Pillow opens if the fast path declines, so its errors name the file as stock's do.
    ``header``: :func:`jpeg_header` of ``data`` when the caller has read it already."""
    if mode not in ("RGB", "L"):
        raise ValueError(f"decode(): mode must be 'RGB' or 'L', not {mode!r}")
    array = decode_fast(data, min_size=min_size, mode=mode, header=header)
    return array if array is not None else pil_decode(fallback, mode)


def rgb_to_l(rgb: np.ndarray) -> np.ndarray:
    """Pillow's RGB -> L conversion (ITU-R 601-2 luma in 16-bit fixed point), bit-exact."""
    r, g, b = (rgb[:, :, i].astype(np.uint32) for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)


def pil_decode(source: Source, mode: str = "RGB") -> np.ndarray:
    """The stock path: Pillow opens (a path with ``open(path, "rb")``, as torchvision's
    ``pil_loader`` does) and converts."""
    from PIL import Image

    if isinstance(source, (bytes, bytearray, memoryview, np.ndarray)):
        with Image.open(io.BytesIO(bytes(read_bytes(source)))) as img:
            return np.array(img.convert(mode))
    with open(source, "rb") as f:
        img = Image.open(f)
        return np.array(img.convert(mode))
