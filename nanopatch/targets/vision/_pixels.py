"""The image a nanopatch pipeline carries between steps, and the conversions it needs.

PIL image <-> (H, W, C) uint8 array (``from_pil``, ``to_pil``), and array -> tensor as stock's
``pil_to_tensor`` and ``to_tensor`` (+ ``Normalize``, fused into one float32 table lookup,
bit-identical) give it.

A :class:`Pixels` holds one of: a PIL image, an :class:`~nanopatch.targets.vision.datasets.EncodedImage`
(a file not decoded yet), or a (H, W, C) uint8 array, and converts between them only when
something asks. It also remembers the *domain*: ``"pil"`` when stock torchvision would hold a
PIL image at this point (the input was a PIL image, a file from a dataset, or a dataset's
in-memory pixels), ``"array"`` when the user passed an ndarray. Only a step that takes an
ndarray as stock's does (``ToTensor``) runs on an ``"array"`` Pixels; for the others stock's code
gets the user's ndarray itself (see ``_pipeline.Fast._takes_array``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from . import _chw
from ._opencv import cv2

PIL_MODES = ("L", "RGB")


# --- conversions ---------------------------------------------------------------------------


def from_pil(img) -> np.ndarray:
    """The pixels of an "L" or "RGB" PIL image as (H, W, C) uint8 (a fresh array)."""
    arr = np.asarray(img)
    return arr[:, :, None] if arr.ndim == 2 else arr


def to_pil(arr: np.ndarray):
    """An "L" (C == 1) or "RGB" (C == 3) PIL image of ``arr``."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(arr[:, :, 0] if arr.shape[2] == 1 else arr))


def checked(arr: object) -> np.ndarray:
    """``arr`` as a C-contiguous (H, W, 1 or 3) uint8 array with pixels, else NotImplementedError
    (the kernels' check of their input)."""
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in (1, 3):
        raise NotImplementedError("expected an (H, W, 1 or 3) uint8 array")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise NotImplementedError("empty image")
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def contiguous(arr: np.ndarray) -> np.ndarray:
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


# --- to tensor -----------------------------------------------------------------------------


def pil_to_tensor(arr: np.ndarray):
    """``F.pil_to_tensor``: uint8 (C, H, W), a channels-last view of HWC memory as stock's is."""
    import torch

    out = torch.empty(arr.shape, dtype=torch.uint8)
    out.numpy()[...] = arr
    return out.permute(2, 0, 1)


def lookup(arr: np.ndarray, table: np.ndarray, *, channels_last: bool = False):
    """A float32 tensor (C, H, W) holding ``table[c][arr[..., c]]`` (``table`` is (C, 256)
    float32): C-contiguous as ToTensor's is, or with ``channels_last`` a view of HWC memory as
    stock's ``pil_to_tensor`` + float conversion (or v2's ``ToImage`` + ``ToDtype``) leaves it."""
    import torch

    in_h, in_w, channels = arr.shape
    if arr.size == 0:
        empty = torch.empty(arr.shape, dtype=torch.float32)
        return empty.permute(2, 0, 1) if channels_last else empty.permute(2, 0, 1).contiguous()
    if channels_last:
        out = cv2().LUT(contiguous(arr), np.ascontiguousarray(table.T).reshape(1, 256, channels))
        return torch.from_numpy(out[:, :, None] if out.ndim == 2 else out).permute(2, 0, 1)
    out = torch.empty((channels, in_h, in_w), dtype=torch.float32)
    planes = out.numpy()
    if _chw.lookup_into(arr, table, planes):  # one compiled pass, where it was built
        return out
    if channels == 1:
        cv2().LUT(contiguous(arr[:, :, 0]), table[0], dst=planes[0])
    else:  # one LUT per plane, written straight into the CHW planes
        for c, plane in enumerate(cv2().split(contiguous(arr))):
            cv2().LUT(plane, table[c], dst=planes[c])
    return out


@functools.lru_cache(maxsize=64)
def _lookup_table(channels: int, mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> np.ndarray:
    """(channels, 256) float32: value / 255, then (x - mean) / std, each step in float32 as
    ToTensor's ``div(255)`` and Normalize's ``sub_``/``div_`` compute it."""
    levels = np.arange(256, dtype=np.float32) / np.float32(255)
    table = np.repeat(levels[None], channels, axis=0)
    if mean is not None:
        m = np.broadcast_to(np.asarray(mean, np.float32), (channels,))[:, None]
        s = np.broadcast_to(np.asarray(std, np.float32), (channels,))[:, None]
        table = (table - m) / s
    table.flags.writeable = False
    return table


def to_tensor_normalize(arr: np.ndarray, mean: Sequence[float] | None = None, std: Sequence[float] | None = None):
    """ToTensor (uint8 HWC -> float32 CHW in [0, 1]), then Normalize when ``mean`` and ``std``
    are given, in one pass; bit-identical to the two stock steps. ``mean``/``std`` must have 1
    or C entries (as Normalize broadcasts them)."""
    channels = arr.shape[2]
    key_mean = None if mean is None else tuple(float(v) for v in mean)
    key_std = None if std is None else tuple(float(v) for v in std)
    if key_mean is not None and (len(key_mean) not in (1, channels) or len(key_std) not in (1, channels)):
        raise NotImplementedError("mean/std do not broadcast over the channels")
    return lookup(arr, _lookup_table(channels, key_mean, key_std))


def to_tensor(arr: np.ndarray):
    """``F.to_tensor`` of a uint8 image: float32 CHW in [0, 1]."""
    return to_tensor_normalize(arr)


# --- the image a pipeline carries ---------------------------------------------------------


class Pixels:
    __slots__ = ("_arr", "_enc", "_pil", "domain", "flat")

    def __init__(self, *, arr=None, pil=None, enc=None, domain: str = "pil", flat: bool = False) -> None:
        self._arr = arr
        self._pil = pil
        self._enc = enc
        self.domain = domain
        self.flat = flat  # the user's ndarray was 2-D: give 2-D back

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def accept(cls, img) -> Pixels | None:
        """A Pixels for an input nanopatch can run on (an "L"/"RGB" PIL image, an encoded or
        decoded dataset image, a uint8 HW/HWC ndarray with 1 or 3 channels), else None."""
        from .datasets import DecodedImage, EncodedImage

        if isinstance(img, EncodedImage):
            return cls(enc=img)
        if isinstance(img, DecodedImage):
            arr = img.array
            return cls(arr=arr[:, :, None] if arr.ndim == 2 else arr)
        if isinstance(img, np.ndarray):
            if img.dtype != np.uint8:
                return None
            if img.ndim == 2:
                return cls(arr=img[:, :, None], domain="array", flat=True)
            if img.ndim == 3 and img.shape[2] in (1, 3):
                return cls(arr=img, domain="array")
            return None
        from PIL import Image

        if isinstance(img, Image.Image) and img.mode in PIL_MODES:
            return cls(pil=img)
        return None

    def with_array(self, arr: np.ndarray) -> Pixels:
        """The result of a kernel: same domain, new pixels."""
        return Pixels(arr=arr, domain=self.domain, flat=self.flat)

    def with_pil(self, img) -> Pixels:
        """The result of a stock PIL op run as a fallback."""
        if img.mode not in PIL_MODES:  # pragma: no cover - the ops we call keep the mode
            raise TypeError(f"unexpected PIL mode {img.mode!r}")
        return Pixels(pil=img, domain=self.domain, flat=self.flat)

    # --- what is inside -----------------------------------------------------------------------

    @property
    def is_pil_image(self) -> bool:
        """A PIL image nothing has converted yet."""
        return self._pil is not None and self._arr is None

    @property
    def encoded(self) -> bool:
        """Still an undecoded file (a DCT-scaled decode is still possible)."""
        return self._arr is None and self._pil is None

    def dims(self) -> tuple[int, int, int]:
        """(C, H, W) at full resolution, without decoding."""
        if self._arr is not None:
            h, w, c = self._arr.shape
            return c, h, w
        if self._pil is not None:
            w, h = self._pil.size
            return (1 if self._pil.mode == "L" else 3), h, w
        w, h = self._enc.size
        return 3, h, w

    def proxy(self):
        """What a torchvision ``get_params`` is given: the PIL image when there is one (as stock
        passes), else a zero-size-in-memory tensor of the image's (C, H, W), which is all
        ``F.get_dimensions`` reads."""
        if self._pil is not None:
            return self._pil
        import torch

        return torch.empty(()).expand(*self.dims())

    def array(self, min_size: tuple[int, int] | None = None) -> np.ndarray:
        """(H, W, C) uint8. An encoded file is decoded now: at least ``min_size`` (h, w) when
        given (DCT-scaled, the fast decode), else at full resolution."""
        if self._arr is None:
            if self._pil is not None:
                self._arr = from_pil(self._pil)
            else:
                arr = self._enc.decode(min_size=min_size)
                if min_size is not None:
                    return arr  # maybe DCT-scaled: not the full-resolution image to keep
                self._arr = arr
        return self._arr

    def box(self, box: tuple[int, int, int, int], min_size: tuple[int, int] | None = None) -> np.ndarray:
        """(h, w, C) uint8: the pixels of ``box`` = (top, left, height, width), full-resolution
        coordinates inside the image. Pixels in hand are cut (a view); an encoded file decodes
        that box only (DCT-scaled to keep the whole image at least ``min_size`` when given, the
        box then mapped onto that scale), the same pixels as the whole decode cut there, and
        nothing is kept: it is not the image."""
        if self._arr is None and self._pil is None:
            arr = self._enc.decode(min_size=min_size, box=box)
            return arr[:, :, None] if arr.ndim == 2 else arr
        top, left, height, width = box
        return self.array()[top : top + height, left : left + width]

    def pil(self):
        """The PIL image stock would hold here (the stock loader's, for an encoded file)."""
        if self._pil is None:
            self._pil = self._enc.to_pil() if self._arr is None else to_pil(self._arr)
        return self._pil

    def output(self):
        """The object stock would have at this point: a PIL image, or the user's ndarray type."""
        if self.domain == "pil":
            return self.pil()
        arr = self.array()
        return arr[:, :, 0] if self.flat and arr.shape[2] == 1 else arr
