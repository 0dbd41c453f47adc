"""torchvision datasets on the fast decoder, with stock return types.

* ``pil_loader`` (which ``default_loader``, ``ImageFolder``, ``DatasetFolder``, ``Food101``,
  ``Places365``, ``DTD``, ``EuroSAT``... all go through) decodes JPEGs with libjpeg-turbo and
  still returns an RGB ``PIL.Image``, because user code may call ``.size``, ``.convert`` or
  ``.show`` on it. Any file the fast path is not sure about goes to the stock loader itself.
* When a dataset's transform is a nanopatch pipeline (it says so with the
  ``__nanopatch_accepts_encoded__`` attribute), ``DatasetFolder`` hands it an
  :class:`EncodedImage` instead, so the pipeline can decode at the scale its first
  resize or crop needs, and the in-memory datasets (CIFAR, MNIST, SVHN, STL10) hand it their
  uint8 arrays (as a :class:`DecodedImage`) without the PIL detour. With any other transform,
  or none, they are stock.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from . import decode as _decode
from ._originals import original as _original

#: A transform that sets this attribute true accepts an EncodedImage or a uint8 ndarray
#: (HWC RGB, or HW for a grayscale dataset) wherever stock would pass it a PIL image.
ACCEPTS_ENCODED = "__nanopatch_accepts_encoded__"


def _folder():
    import torchvision.datasets.folder as folder

    return folder


def original(key: str) -> Any:
    """torchvision's own ``pil_loader``, ``default_loader`` or ``<Class>.__getitem__`` (class
    ``DatasetFolder`` or one in ``torchvision.datasets``), as the engine recorded it."""
    import torchvision.datasets as tv_datasets

    folder = _folder()
    if "." not in key:
        return _original(folder, key)
    cls_name, attr = key.split(".", 1)
    return _original(getattr(folder if cls_name == "DatasetFolder" else tv_datasets, cls_name), attr)


def accepts_encoded(transform: Any) -> bool:
    return transform is not None and bool(getattr(transform, ACCEPTS_ENCODED, False))


class EncodedImage:
    """An image file not decoded yet: what a dataset hands a nanopatch pipeline.

    ``size`` is the full-resolution (width, height), as ``PIL.Image.size``, read from the header
    alone; ``decode(min_size=(h, w))`` decodes, DCT-scaled when that is allowed; ``to_pil()``
    gives exactly what the stock loader would have returned. Pickles as its path.
    """

    __slots__ = ("_data", "_header", "_size", "path")

    def __init__(self, path: str | os.PathLike[str] | None = None, data: bytes | None = None) -> None:
        if (path is None) == (data is None):
            raise TypeError("EncodedImage needs a path or data, not both")
        self.path = path
        self._data = data
        self._size: tuple[int, int] | None = None
        self._header: _decode.JpegHeader | None = None  # parsed once, for size and decode

    @property
    def data(self) -> bytes | memoryview:
        if self._data is None:
            self._data = _decode.read_bytes(self.path)
        return self._data

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) at full resolution."""
        if self._size is None:
            self._header = _decode.jpeg_header(self.data)
            if self._header is None:
                with self._open_pil() as img:
                    self._size = img.size
            else:
                self._size = (self._header.width, self._header.height)
        return self._size

    def decode(
        self, min_size: tuple[int, int] | None = None, mode: str = "RGB", box: _decode.Box | None = None
    ) -> np.ndarray:
        """HWC RGB (or HW for ``mode="L"``) uint8 pixels; at least ``min_size`` (h, w) when a
        DCT-scaled decode is possible, else full size. ``box=(top, left, height, width)``, in
        full-resolution coordinates inside the image: that box only (see ``decode.decode``)."""
        fallback = self.path if self.path is not None else self.data
        return _decode.decode_data(
            self.data, fallback=fallback, min_size=min_size, mode=mode, header=self._header, box=box
        )

    def to_pil(self):
        """What ``torchvision.datasets.folder.pil_loader`` returns for this file (the bytes
        already read for ``size`` are reused, not read again)."""
        return _pil_rgb(self.data, self.path)

    def _open_pil(self):
        from PIL import Image

        return Image.open(io.BytesIO(bytes(self.data)))

    def __reduce__(self):
        return (EncodedImage, (self.path, None) if self.path is not None else (None, bytes(self.data)))

    def __repr__(self) -> str:
        what = f"path={os.fspath(self.path)!r}" if self.path is not None else f"{len(self.data)} bytes"
        return f"EncodedImage({what})"


class DecodedImage:
    """Pixels a dataset would have wrapped in a PIL image (an "L" image for a 2-D array, "RGB"
    for HWC): what the in-memory datasets hand a nanopatch pipeline instead. Read-only."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def to_pil(self):
        from PIL import Image

        return Image.fromarray(np.ascontiguousarray(self.array))

    def __repr__(self) -> str:
        return f"DecodedImage(shape={self.array.shape})"


# --- loaders -------------------------------------------------------------------------------


def pil_loader(path):
    """Drop-in for ``torchvision.datasets.folder.pil_loader``: an RGB ``PIL.Image`` with the
    same pixels, decoded by libjpeg-turbo when the file allows, else by the stock loader."""
    return _pil_rgb(_decode.read_bytes(path), path)


def _pil_rgb(data, path):
    """An RGB PIL image of ``data``: fast-decoded, else by the stock loader for ``path`` (so
    pixels and errors are stock's), else (bytes only) by Pillow directly."""
    from PIL import Image

    array = _decode.decode_fast(data)
    if array is not None:
        return Image.fromarray(array)
    if path is not None:
        return _original(_folder(), "pil_loader")(path)
    with Image.open(io.BytesIO(bytes(data))) as img:
        return img.convert("RGB")


def _standard_loader(loader: Callable[..., Any]) -> bool:
    """Whether ``loader`` is torchvision's own image loading (so handing the pipeline the
    undecoded file changes nothing the user asked for)."""
    folder = _folder()
    if (
        loader is not pil_loader
        and loader is not folder.default_loader
        and loader is not _original(folder, "pil_loader")
    ):
        return False
    from torchvision import get_image_backend

    return get_image_backend() == "PIL"


def dataset_folder_getitem(self, index: int):
    """``DatasetFolder.__getitem__``: stock, except that a nanopatch pipeline gets the file."""
    if accepts_encoded(self.transform) and _standard_loader(self.loader):
        path, target = self.samples[index]
        sample = self.transform(EncodedImage(path))
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target
    return _original(_folder().DatasetFolder, "__getitem__")(self, index)


# --- in-memory datasets --------------------------------------------------------------------


def _readonly(array: np.ndarray) -> np.ndarray:
    """A view the pipeline cannot write through into the dataset's own storage."""
    view = array.view()
    view.flags.writeable = False
    return view


def _cifar(self, index):
    return self.data[index], self.targets[index]


def _mnist(self, index):
    return self.data[index].numpy(), int(self.targets[index])


def _qmnist(self, index):
    target = self.targets[index]
    return self.data[index].numpy(), int(target[0]) if self.compat else target


def _svhn(self, index):
    return np.transpose(self.data[index], (1, 2, 0)), int(self.labels[index])


def _stl10(self, index):
    target = int(self.labels[index]) if self.labels is not None else None
    return np.transpose(self.data[index], (1, 2, 0)), target


#: class name in torchvision.datasets -> how its stock __getitem__ gets (pixels, target)
IN_MEMORY: dict[str, Callable[[Any, int], tuple[np.ndarray, Any]]] = {
    "CIFAR10": _cifar,
    "MNIST": _mnist,
    "QMNIST": _qmnist,
    "SVHN": _svhn,
    "STL10": _stl10,
}


@functools.cache  # the same function object every time: re-patching installs an identical one
def in_memory_getitem(name: str) -> Callable[[Any, int], Any]:
    """``__getitem__`` for the in-memory dataset ``name``: stock unless the transform is a
    nanopatch pipeline, which then gets the uint8 array instead of a PIL image."""
    extract = IN_MEMORY[name]

    def __getitem__(self, index: int):
        if not accepts_encoded(self.transform):
            import torchvision.datasets as tv_datasets

            return _original(getattr(tv_datasets, name), "__getitem__")(self, index)
        pixels, target = extract(self, index)
        sample = self.transform(DecodedImage(_readonly(pixels)))
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    __getitem__.__qualname__ = f"{name}.__getitem__"
    __getitem__.__doc__ = f"``{name}.__getitem__`` with the PIL detour skipped for nanopatch pipelines."
    return __getitem__
