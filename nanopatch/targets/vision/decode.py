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

``box=(top, left, height, width)`` asks for one box of the image only (a crop), decoded alone
where a region decoder loads: the one :mod:`._jpeg_region` compiles against the system's libjpeg
(``jpeg_crop_scanline``/``jpeg_skip_scanlines``, libjpeg-turbo >= 1.5; it reads the file only
down to the box's bottom), else libjpeg-turbo 3's TurboJPEG 3 API (``tj3SetCroppingRegion``, on
the library PyTurboJPEG loaded; it entropy-decodes the rest of the file to skip it). Either way
only the box's columns are inverse-transformed, upsampled and converted. libjpeg-turbo treats the
edges of such a partial decode as image edges (it replicates the chroma samples there instead of
interpolating with the neighbours), so the region decoded is the box widened by one iMCU on every
side that is not the image's own edge, and the box is cut from it in pixel space: every pixel of
the box is then computed from exactly the samples a full decode uses, and equals the same pixel
of a full decode (at the same DCT scale) bit for bit.
Progressive JPEGs (read whole before any output anyway, and their block smoothing reaches
further than one iMCU when scans are missing), files with markers inside the scan data (which
libjpeg might fail on below the box, where a region decode never looks), and every file where
no region decoder loads (no compiler or no ``jpeglib.h``, and a libturbojpeg 2.x, whose
TurboJPEG API has only a lossless crop that costs more than it saves) decode the whole image and
cut the box from it: the same pixels.
The region decoder proves itself against full decodes on first use, and is dropped (logged
once) if it cannot; ``NANOPATCH_CROP_DECODE=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import io
import logging
import os
import threading
from typing import Any

import numpy as np

from nanopatch.foundation import usage
from nanopatch.foundation.log import log_once, warnings_from

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
#: what a decode by each fast backend marks (:mod:`nanopatch.foundation.usage`)
_USED = {"turbojpeg": "decode-turbojpeg", "opencv": "decode-opencv"}
#: Environment variable: ``0`` turns the crop-aware (region) JPEG decode off (default: on where exact).
CROP_DECODE_VARIABLE = "NANOPATCH_CROP_DECODE"

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

        # PyTurboJPEG reports libjpeg's warnings (corrupt or truncated data) with warnings.warn
        # from its private ``__report_error``, and raises OSError for errors. Either way Pillow
        # decides what stock does, so where that method exists (PyTurboJPEG 1.x and 2.x) a
        # subclass makes every report an OSError, with no change to the warnings filters per
        # image; elsewhere a filter turns the module's warnings into errors around each call
        # (never warnings.catch_warnings(), which makes Python forget the warnings it has shown:
        # a warning the script raises once per step would then print on every step).
        self._strict = callable(getattr(TurboJPEG, "_TurboJPEG__report_error", None))
        cls = _strict_turbojpeg(TurboJPEG) if self._strict else TurboJPEG
        # PyTurboJPEG 2.x refuses libjpeg-turbo 2.x (RuntimeError): then OpenCV takes over.
        self._tj = cls(lib_path=os.environ.get(TURBOJPEG_LIB_VARIABLE) or None)

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``, or None where libjpeg warned or failed."""
        try:
            if self._strict:
                return method(*args, **kwargs)
            with warnings_from(r"turbojpeg\Z", "error"):  # libjpeg's report, raised as the warning
                return method(*args, **kwargs)
        except (OSError, Warning):
            return None

    def header(self, data) -> JpegHeader | None:
        found = self._call(self._tj.decode_header, data)
        if found is None or found[3] not in (_TJCS_YCBCR, _TJCS_GRAY):
            return None  # CMYK, YCCK, RGB-coded JPEGs and anything odd: Pillow decides
        width, height, _subsample, colorspace = found[:4]
        return JpegHeader(width, height, colorspace == _TJCS_GRAY)

    def decode(self, data, factor: int, gray: bool) -> np.ndarray | None:
        scaling = None if factor == 1 else (1, factor)
        pixel_format = _TJPF_GRAY if gray else _TJPF_RGB
        array = self._call(self._tj.decode, data, pixel_format=pixel_format, scaling_factor=scaling)
        if array is None:  # libjpeg warned (corrupt or truncated data) or failed: Pillow decides
            return None
        return array[:, :, 0] if gray else array


def _strict_turbojpeg(base: type) -> type:
    """``base`` (PyTurboJPEG's TurboJPEG) with every error report raised as OSError, libjpeg's
    warnings included (their message, as PyTurboJPEG would have warned it)."""

    class StrictTurboJPEG(base):  # type: ignore[misc, valid-type]
        def _TurboJPEG__report_error(self, handle: Any) -> None:
            try:
                message = self._TurboJPEG__get_error_string(handle)
            except Exception:
                message = "libjpeg-turbo reported an error"
            raise OSError(message)

    return StrictTurboJPEG


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


class _Once:
    """A value made by ``load()`` on first use, once per process, or again when ``key()`` (the
    environment variables that choose it) changes: a script or a test that sets
    ``NANOPATCH_DECODER`` gets the decoder it names at its next decode."""

    _UNLOADED: Any = object()

    def __init__(self, load: Any, key: Any) -> None:
        self._load = load
        self._key = key
        self._lock = threading.Lock()
        # (the key it was made for, the value), replaced as one: a thread never sees a value
        # half switched (no key equals the sentinel, so the first get() loads)
        self._made: tuple[Any, Any] = (self._UNLOADED, None)

    def get(self) -> Any:
        key = self._key()
        made_for, value = self._made
        if made_for != key:
            with self._lock:
                made_for, value = self._made
                if made_for != key:
                    value = self._load()
                    self._made = (key, value)
        return value


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


_backend = _Once(_load_backend, lambda: os.environ.get(DECODER_VARIABLE))  # None: no fast backend, Pillow decodes


def jpeg_backend() -> _Backend | None:
    """The JPEG backend in use in this process (None: Pillow)."""
    return _backend.get()


# --- region (crop-aware) decoding ----------------------------------------------------------

# TurboJPEG 3 parameters (tj3Get) and the iMCU size of each subsampling (tjMCUWidth/Height,
# indexed by TJSAMP_444, 422, 420, GRAY, 440, 411, 441).
_TJINIT_DECOMPRESS = 1
_TJPARAM_SUBSAMP = 4
_TJPARAM_JPEGWIDTH = 5
_TJPARAM_JPEGHEIGHT = 6
_TJPARAM_PRECISION = 7
_TJPARAM_COLORSPACE = 8
_TJPARAM_PROGRESSIVE = 12
_TJPARAM_LOSSLESS = 15
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)
_MCU_HEIGHT = (8, 8, 16, 8, 16, 8, 32)

Box = tuple[int, int, int, int]  # (top, left, height, width)


class _Region(ctypes.Structure):  # tjregion
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _Scaling(ctypes.Structure):  # tjscalingfactor
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padded_region(size: tuple[int, int], mcu: tuple[int, int], box: Box) -> Box:
    """The region (top, left, height, width) to decode for ``box`` in an image of ``size`` (h, w)
    whose iMCUs are ``mcu`` (h, w) pixels (all at the decoding scale): the box widened by one iMCU
    on each side, its left and top edges on the iMCU grid (where libjpeg-turbo can start), clamped
    to the image. Every pixel of the box is then at least one iMCU away from a region edge that is
    not an image edge, so the chroma upsampling (and the context rows after a skip) sees the same
    samples as in a full decode."""
    height, width = size
    mcu_h, mcu_w = mcu
    top, left, box_h, box_w = box
    y0 = max((top // mcu_h - 1) * mcu_h, 0)
    x0 = max((left // mcu_w - 1) * mcu_w, 0)
    y1 = min(top + box_h + mcu_h, height)
    x1 = min(left + box_w + mcu_w, width)
    return y0, x0, y1 - y0, x1 - x0


class _RegionDecoder:
    """libjpeg-turbo 3's partial decompression through its TurboJPEG 3 API (ctypes, on the very
    library PyTurboJPEG loaded): ``decode(data, factor, box, gray)`` is the box's pixels of the
    image decoded at 1/``factor``, or None when this file is not for it (then the whole image is
    decoded and the box cut from it)."""

    def __init__(self, lib_path: str) -> None:
        lib = ctypes.CDLL(lib_path)
        if not hasattr(lib, "tj3SetCroppingRegion"):
            raise RuntimeError(f"{lib_path} has no TurboJPEG 3 API (libjpeg-turbo < 3)")
        handle, buf, size = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t

        def bind(name, argtypes, restype=ctypes.c_int):
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = restype
            return function

        self._init = bind("tj3Init", [ctypes.c_int], ctypes.c_void_p)
        self._destroy = bind("tj3Destroy", [handle], None)
        self._header = bind("tj3DecompressHeader", [handle, buf, size])
        self._get = bind("tj3Get", [handle, ctypes.c_int])
        self._scaling = bind("tj3SetScalingFactor", [handle, _Scaling])
        self._cropping = bind("tj3SetCroppingRegion", [handle, _Region])
        self._decompress = bind("tj3Decompress8", [handle, buf, size, buf, ctypes.c_int, ctypes.c_int])
        self._local = threading.local()  # a TurboJPEG handle is for one thread at a time

    name = "libjpeg-turbo 3 (tj3SetCroppingRegion)"

    def _handle(self) -> int:
        owner = getattr(self._local, "owner", None)
        if owner is None:
            raw = self._init(_TJINIT_DECOMPRESS)
            if not raw:
                raise MemoryError("tj3Init failed")
            owner = self._local.owner = _HandleOwner(raw, self._destroy)
        return owner.raw

    def decode(self, data, factor: int, box: Box, gray: bool) -> np.ndarray | None:
        handle = self._handle()
        src = np.frombuffer(data, dtype=np.uint8)
        address = src.ctypes.data
        if self._header(handle, address, src.size) != 0:
            return None
        get = self._get
        subsamp = get(handle, _TJPARAM_SUBSAMP)
        if (
            not 0 <= subsamp < len(_MCU_WIDTH)
            or get(handle, _TJPARAM_PRECISION) != 8
            or get(handle, _TJPARAM_LOSSLESS) != 0
            or get(handle, _TJPARAM_PROGRESSIVE) != 0
            or get(handle, _TJPARAM_COLORSPACE) not in (_TJCS_YCBCR, _TJCS_GRAY)
        ):
            return None
        size = (_ceil_div(get(handle, _TJPARAM_JPEGHEIGHT), factor), _ceil_div(get(handle, _TJPARAM_JPEGWIDTH), factor))
        top, left, box_h, box_w = box
        if box_h <= 0 or box_w <= 0 or top < 0 or left < 0 or top + box_h > size[0] or left + box_w > size[1]:
            return None
        mcu = (_ceil_div(_MCU_HEIGHT[subsamp], factor), _ceil_div(_MCU_WIDTH[subsamp], factor))
        y, x, h, w = padded_region(size, mcu, box)
        if y + h < size[0] and not scan_is_clean(data):
            return None  # it would stop before data on which the whole decode might fail
        if self._scaling(handle, _Scaling(1, factor)) != 0 or self._cropping(handle, _Region(x, y, w, h)) != 0:
            return None
        channels = 1 if gray else 3
        out = np.empty((h, w, channels), dtype=np.uint8)
        pixel_format = _TJPF_GRAY if gray else _TJPF_RGB
        status = self._decompress(handle, address, src.size, out.ctypes.data, w * channels, pixel_format)
        self._cropping(handle, _Region(0, 0, 0, 0))  # the next header may be smaller
        if status != 0:  # an error, or a warning (corrupt data): the full decode decides
            return None
        out = out[top - y : top - y + box_h, left - x : left - x + box_w]
        return out[:, :, 0] if gray else out


class _HandleOwner:
    """Destroys a thread's TurboJPEG handle when the thread (its thread-local) goes away."""

    __slots__ = ("_destroy", "raw")

    def __init__(self, raw: int, destroy) -> None:
        self.raw = raw
        self._destroy = destroy

    def __del__(self) -> None:
        try:
            self._destroy(self.raw)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def scan_is_clean(data) -> bool:
    """Whether the entropy-coded data after the first SOS holds no marker but restart markers
    and fill bytes up to the final EOI: one scan, nothing on which libjpeg could fail after the
    rows a region decode stops at (corrupt entropy data there only warns, and a warning only
    changes pixels decoded after it). A region decode never reads past the box, so it takes only
    files whose whole decode cannot fail where it stops looking."""
    pos, size = 2, len(data)
    while True:  # walk the marker segments to the first scan
        if pos + 4 > size or data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in (0xD8, 0xD9) or 0xD0 <= marker <= 0xD7:
            return False
        pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
        if marker == 0xDA:
            break
    end = size
    while end > 0 and data[end - 1] == 0:  # zero padding after EOI (has_eoi allows it)
        end -= 1
    scan = np.frombuffer(data, dtype=np.uint8, count=max(end - 2 - pos, 0), offset=min(pos, end))
    marks = np.flatnonzero(scan[:-1] == 0xFF)
    after = scan[marks + 1]
    return bool(np.all((after == 0) | (after == 0xFF) | ((after >= 0xD0) & (after <= 0xD7))))


def _turbojpeg_lib_path(backend: _TurboJPEG) -> str | None:
    """The libturbojpeg PyTurboJPEG loaded: the configured one, else where PyTurboJPEG looks."""
    configured = os.environ.get(TURBOJPEG_LIB_VARIABLE)
    if configured:
        return configured
    finder = getattr(backend._tj, "_TurboJPEG__find_turbojpeg", None)
    try:
        return finder() if finder is not None else ctypes.util.find_library("turbojpeg")
    except Exception:
        return ctypes.util.find_library("turbojpeg")


def _region_boxes(size: tuple[int, int], rng: np.random.Generator, count: int) -> list[Box]:
    """Boxes inside an image of ``size`` (h, w): random ones, and ones touching each edge."""
    height, width = size
    boxes = [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, 1, 1)]
    for _ in range(count):
        box_h, box_w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        boxes.append((int(rng.integers(0, height - box_h + 1)), int(rng.integers(0, width - box_w + 1)), box_h, box_w))
    return boxes


def _region_matches_full(region: _RegionDecoder, backend: _Backend) -> bool:
    """Whether the region decoder gives the very pixels of the backend's full decode, cut, on the
    calibration JPEGs (every subsampling, DCT scales, boxes anywhere)."""
    rng = np.random.default_rng(4321)
    took = 0
    for data in _calibration_jpegs():
        header = backend.header(data)
        if header is None:
            return False
        for factor in (1, 2, 8):
            full = backend.decode(data, factor, header.gray)
            if full is None:
                return False
            for box in _region_boxes(full.shape[:2], rng, 12):
                got = region.decode(data, factor, box, header.gray)
                if got is None:
                    continue  # a file it declines (progressive): the full decode serves it
                top, left, box_h, box_w = box
                if not np.array_equal(got, full[top : top + box_h, left : left + box_w]):
                    return False
                took += 1
    return took > 0


def _region_candidates(backend: _Backend) -> tuple[list[Any], list[str]]:
    """The region decoders that load here, preferred first, and why the others do not: the
    compiled libjpeg one (any libjpeg-turbo >= 1.5; it stops at the box's bottom), then
    TurboJPEG 3's (on the library PyTurboJPEG loaded)."""
    from ._jpeg_region import CompiledRegion, functions

    found: list[Any] = []
    why: list[str] = []
    made, reason = functions()
    if made is not None:
        found.append(CompiledRegion(*made))
    else:
        why.append(f"libjpeg's: {reason}")
    if isinstance(backend, _TurboJPEG):
        try:
            path = _turbojpeg_lib_path(backend)
            if path:
                found.append(_RegionDecoder(path))
        except Exception as exc:
            why.append(f"TurboJPEG 3's: {type(exc).__name__}: {exc}")
    return found, why


def _load_region_decoder() -> Any:
    global _region_why
    raw = os.environ.get(CROP_DECODE_VARIABLE, "").strip().lower()
    if raw in ("0", "false", "no", "off"):
        _region_why = f"{CROP_DECODE_VARIABLE}=0"
        return None
    backend = jpeg_backend()
    if backend is None:
        _region_why = "no fast JPEG decoder (Pillow decodes)"
        return None
    found, why = _region_candidates(backend)
    for region in found:
        if _region_matches_full(region, backend):
            log_once("decoder-region", "crop-aware JPEG decode with %s", region.name)
            _region_why = region.name
            return region
        log_once(
            f"decoder-region-mismatch-{type(region).__name__}",
            "crop-aware JPEG decode with %s does not reproduce the full decode's pixels here; not used",
            region.name,
            level=logging.WARNING,
        )
        why.append(f"{region.name} does not reproduce the full decode's pixels")
    _region_why = "; ".join(why) or "no region decoder"
    log_once("decoder-region", "crop-aware JPEG decode unavailable (%s)", _region_why)
    return None


#: what :func:`region_report` says: the region decoder in use, or why there is none
_region_why = "not asked yet"


# None: boxes are cut from whole decodes
_region = _Once(_load_region_decoder, lambda: (os.environ.get(DECODER_VARIABLE), os.environ.get(CROP_DECODE_VARIABLE)))


def region_decoder() -> Any:
    """The crop-aware decoder in use in this process (None: boxes are cut from full decodes)."""
    return _region.get()


def region_report() -> dict[str, Any]:
    """For ``--info``: whether boxes are decoded alone, with what, or why not."""
    found = region_decoder()
    return {"used": found is not None, "reason": found.name if found is not None else _region_why}


def scaled_box(box: Box, full_size: tuple[int, int], scaled_size: tuple[int, int]) -> Box:
    """A box in full-resolution coordinates on an image decoded at ``scaled_size`` (h, w) of its
    ``full_size``: rounded to the scaled pixel grid, at least one pixel, inside the image."""
    if scaled_size == full_size:
        return box
    top, left, height, width = box
    sy, sx = scaled_size[0] / full_size[0], scaled_size[1] / full_size[1]
    y0, y1 = round(top * sy), round((top + height) * sy)
    x0, x1 = round(left * sx), round((left + width) * sx)
    y0, x0 = min(max(y0, 0), scaled_size[0] - 1), min(max(x0, 0), scaled_size[1] - 1)
    return y0, x0, max(min(y1, scaled_size[0]) - y0, 1), max(min(x1, scaled_size[1]) - x0, 1)


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
    data,
    *,
    min_size: tuple[int, int] | None = None,
    mode: str = "RGB",
    header: JpegHeader | None = None,
    box: Box | None = None,
) -> np.ndarray | None:
    """Decode JPEG bytes with the fast backend, or return None when stock Pillow must decide.

    Returns (H, W, 3) RGB, or (H, W) for ``mode="L"``: a grayscale JPEG's own samples, and for
    a colour JPEG Pillow's RGB->L conversion of the RGB decode (libjpeg's luma is not that).
    ``header``: :func:`jpeg_header` of ``data`` when the caller has read it already.
    ``box``: (top, left, height, width) inside the image, in full-resolution coordinates: only
    that box (mapped onto the decoded scale by :func:`scaled_box`), the very pixels of the whole
    decode cut there; decoded alone where libjpeg-turbo 3 allows it (see the module's notes)."""
    backend = jpeg_backend()
    if backend is None or not is_jpeg(data) or not has_eoi(data):
        return None
    if header is None:
        header = backend.header(data)
    if header is None:
        return None
    _decompression_bomb_check(header.width, header.height)
    full_size = (header.height, header.width)
    factor = reduction_for(full_size, min_size)
    gray = mode == "L" and header.gray
    array = None
    if box is not None:
        scaled_size = (_ceil_div(header.height, factor), _ceil_div(header.width, factor))
        box = scaled_box(box, full_size, scaled_size)
        region = region_decoder()
        if region is not None:
            array = region.decode(data, factor, box, gray)
            if array is not None:
                usage.record("decode-region")
    if array is None:
        array = backend.decode(data, factor, gray)
        if array is not None and box is not None:
            top, left, height, width = box
            array = array[top : top + height, left : left + width]
    if array is not None and mode == "L" and not gray:
        array = rgb_to_l(array)
    if array is not None:
        usage.record(_USED.get(backend.name, "decode"))
    return array


def decode(
    source: Source, *, min_size: tuple[int, int] | None = None, mode: str = "RGB", box: Box | None = None
) -> np.ndarray:
    """Decode an image file or its bytes to a C-contiguous uint8 ndarray (a view for a ``box``).

    ``mode="RGB"``: (H, W, 3), the pixels of ``Image.open(f).convert("RGB")``.
    ``mode="L"``: (H, W), the pixels of ``Image.open(f).convert("L")``.
    ``min_size=(h, w)``: allow a DCT-scaled JPEG decode that is at least that size (other
    formats, and JPEGs only Pillow can read, come back full size).
    ``box=(top, left, height, width)``: that box only (full-resolution coordinates, inside the
    image; on a DCT-scaled decode the box mapped onto its scale by :func:`scaled_box`), a view
    that may not be C-contiguous; the same pixels as the whole decode cut there.
    Errors are Pillow's: ``PIL.UnidentifiedImageError`` for data that is no image, ``OSError``
    for a truncated or broken one, ``FileNotFoundError`` for a missing path.
    """
    return decode_data(read_bytes(source), fallback=source, min_size=min_size, mode=mode, box=box)


def decode_data(
    data,
    *,
    fallback: Source,
    min_size: tuple[int, int] | None = None,
    mode: str = "RGB",
    header: JpegHeader | None = None,
    box: Box | None = None,
) -> np.ndarray:
    """:func:`decode` for bytes already read; ``fallback`` (the path, when there is one) is what
    Pillow opens if the fast path declines, so its errors name the file as stock's do.
    ``header``: :func:`jpeg_header` of ``data`` when the caller has read it already."""
    if mode not in ("RGB", "L"):
        raise ValueError(f"decode(): mode must be 'RGB' or 'L', not {mode!r}")
    array = decode_fast(data, min_size=min_size, mode=mode, header=header, box=box)
    if array is not None:
        return array
    array = pil_decode(fallback, mode)
    if box is not None:  # Pillow decodes at full resolution: the box as given
        top, left, height, width = box
        array = array[top : top + height, left : left + width]
    return array


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
