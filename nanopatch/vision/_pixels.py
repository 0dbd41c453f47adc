"""The image a nanopatch pipeline carries between steps, and what stock would hold there.

A :class:`Pixels` holds one of: a PIL image, an :class:`~nanopatch.vision.datasets.EncodedImage`
(a file not decoded yet), or a (H, W, C) uint8 array, and converts between them only when
something asks. It also remembers the *domain*: ``"pil"`` when stock torchvision would hold a
PIL image at this point (the input was a PIL image, a file from a dataset, or a dataset's
in-memory pixels), ``"array"`` when the user passed an ndarray. Only a step that takes an
ndarray as stock's does (``ToTensor``) runs on an ``"array"`` Pixels; for the others stock's code
gets the user's ndarray itself (see ``transforms._Fast._takes_array``).
"""

from __future__ import annotations

import numpy as np

from . import functional as _fn

PIL_MODES = ("L", "RGB")


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
                self._arr = _fn.from_pil(self._pil)
            else:
                arr = self._enc.decode(min_size=min_size)
                if min_size is not None:
                    return arr  # maybe DCT-scaled: not the full-resolution image to keep
                self._arr = arr
        return self._arr

    def pil(self):
        """The PIL image stock would hold here (the stock loader's, for an encoded file)."""
        if self._pil is None:
            self._pil = self._enc.to_pil() if self._arr is None else _fn.to_pil(self._arr)
        return self._pil

    def output(self):
        """The object stock would have at this point: a PIL image, or the user's ndarray type."""
        if self.domain == "pil":
            return self.pil()
        arr = self.array()
        return arr[:, :, 0] if self.flat and arr.shape[2] == 1 else arr
