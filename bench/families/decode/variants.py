"""decode's variants: the stock loader, nanopatch's loader, its DCT-scaled and cropped decodes,
PyTurboJPEG, and the check that each decodes what stock does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from families.decode.dataset import MIN_SIZE, size_name

STOCK = "stock loader"
CROP = "nanopatch crop (RRC box)"
#: (variant, size) -> minimum ratio vs stock, from the issue. Printed, never asserted.
TARGETS = {
    ("nanopatch loader", (500, 375)): 2.0,
    ("nanopatch loader", (2400, 1800)): 4.0,
    ("nanopatch DCT-scaled (min 224)", (2400, 1800)): 8.0,
}


_BOXES: dict[Path, tuple[int, int, int, int]] = {}


def rrc_box(path: Path) -> tuple[int, int, int, int]:
    """A RandomResizedCrop(224) box (top, left, height, width) for ``path``: torchvision's own
    ``get_params`` under a seed from the file name, drawn once (outside the timed region)."""
    box = _BOXES.get(path)
    if box is None:
        import zlib

        import torch
        from PIL import Image
        from torchvision.transforms import RandomResizedCrop

        with Image.open(path) as img:
            width, height = img.size
        with torch.random.fork_rng():
            torch.manual_seed(zlib.crc32(Path(path).name.encode()))
            box = RandomResizedCrop.get_params(torch.empty(()).expand(3, height, width), (0.08, 1.0), (3 / 4, 4 / 3))
        box = _BOXES[path] = tuple(int(v) for v in box)
    return box


def variants() -> tuple[dict[str, Callable[[Path], Any]], dict[str, str]]:
    """The functions to time, after ``patch_torch()``, and what each one calls."""
    import cv2
    import numpy as np
    import torchvision.datasets.folder as folder
    from PIL import Image
    from turbojpeg import TJPF_RGB, TurboJPEG

    import nanopatch
    from nanopatch.targets.vision import datasets
    from nanopatch.targets.vision import decode as np_decode

    # torchvision's default_loader calls folder.pil_loader through its module globals, so under
    # the patch it is nanopatch's; the stock one is the original nanopatch saved at patch time.
    stock_loader = datasets.original("pil_loader")
    fast_loader = folder.pil_loader
    assert stock_loader.__module__ == "torchvision.datasets.folder", stock_loader.__module__
    assert fast_loader is datasets.pil_loader, f"patch not applied: folder.pil_loader is {fast_loader!r}"
    with nanopatch.unpatched():  # once, untimed: unpatched default_loader calls exactly stock_loader
        assert folder.pil_loader is stock_loader
    assert folder.pil_loader is fast_loader

    turbo = TurboJPEG(lib_path=os.environ.get(np_decode.TURBOJPEG_LIB_VARIABLE) or None)  # the library nanopatch uses
    rgb_flag = getattr(cv2, "IMREAD_COLOR_RGB", None)
    cv_flags = (rgb_flag if rgb_flag is not None else cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION

    def read(path: Path) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def pyturbojpeg(path: Path):
        return turbo.decode(read(path), pixel_format=TJPF_RGB)

    def opencv(path: Path):
        return cv2.imdecode(np.frombuffer(read(path), np.uint8), cv_flags)

    import torchvision.io as tio

    def torchvision_io(path: Path):
        # read_image on a JPEG: torchvision's own libjpeg-turbo, CHW uint8 tensor
        return tio.decode_jpeg(tio.read_file(str(path)))

    def dct_scaled(path: Path):
        return np_decode.decode(path, min_size=MIN_SIZE)

    def pillow_draft(path: Path):
        with open(path, "rb") as f:
            img = Image.open(f)
            width, height = img.size
            factor = np_decode.reduction_for((height, width), MIN_SIZE)
            img.draft("RGB", (width // factor, height // factor))  # Pillow picks exactly 1/factor
            return img.convert("RGB")

    def crop_box(path: Path):
        return rrc_box(path)

    def crop(path: Path):
        return np_decode.decode(path, box=crop_box(path))

    def where(fn: Callable[..., Any]) -> str:
        return f"{fn.__module__}.{fn.__qualname__}"

    funcs = {
        STOCK: stock_loader,
        "nanopatch loader": fast_loader,
        "PyTurboJPEG decode": pyturbojpeg,
        "OpenCV decode": opencv,
        "torchvision.io decode_jpeg": torchvision_io,
        "nanopatch DCT-scaled (min 224)": dct_scaled,
        "Pillow draft (min 224)": pillow_draft,
        CROP: crop,
    }
    flag_name = "IMREAD_COLOR_RGB" if rgb_flag is not None else "IMREAD_COLOR (BGR: no IMREAD_COLOR_RGB here)"
    region = np_decode.region_report()
    calls = {
        STOCK: f"{where(stock_loader)} (torchvision's, saved by nanopatch at patch time)",
        "nanopatch loader": f"torchvision.datasets.folder.pil_loader = {where(fast_loader)}",
        "PyTurboJPEG decode": f"open().read() + TurboJPEG().decode(data, pixel_format=TJPF_RGB) [{turbo.__module__}]",
        "OpenCV decode": f"open().read() + cv2.imdecode(buf, {flag_name} | IMREAD_IGNORE_ORIENTATION)",
        "torchvision.io decode_jpeg": "torchvision.io.decode_jpeg(torchvision.io.read_file(path)) (left stock)",
        "nanopatch DCT-scaled (min 224)": f"{where(np_decode.decode)}(path, min_size={MIN_SIZE})",
        "Pillow draft (min 224)": "Image.open(f); img.draft('RGB', (w // k, h // k)); img.convert('RGB')",
        CROP: f"{where(np_decode.decode)}(path, box=RandomResizedCrop box): "
        + (f"region decode ({region['reason']})" if region["used"] else "whole decode, box cut"),
    }
    return funcs, calls


def verify(funcs: dict[str, Callable[[Path], Any]], paths: dict) -> dict[str, Any]:
    """Assert what the comparison rests on; return what each variant outputs per size."""
    import numpy as np
    from PIL import Image

    from nanopatch.targets.vision import decode as np_decode

    outputs: dict[str, Any] = {}
    for size, files in paths.items():
        same: dict[str, bool] = {name: True for name in funcs}
        shapes: dict[str, set] = {name: set() for name in funcs}
        kinds: dict[str, str] = {}
        for path in files:
            got = {name: fn(path) for name, fn in funcs.items()}
            stock = np.asarray(got[STOCK])
            fast = got["nanopatch loader"]
            assert isinstance(fast, Image.Image) and fast.mode == "RGB", fast
            assert np.array_equal(np.asarray(fast), stock), f"nanopatch loader pixels differ from stock on {path}"
            # the loader must really take the fast path, not fall back to stock Pillow
            assert np_decode.decode_fast(np_decode.read_bytes(path)) is not None, f"{path} fell back to Pillow"
            scaled = got["nanopatch DCT-scaled (min 224)"]
            assert scaled.shape[0] >= MIN_SIZE[0] and scaled.shape[1] >= MIN_SIZE[1], (path, scaled.shape)
            draft = np.asarray(got["Pillow draft (min 224)"])
            assert draft.shape == scaled.shape, f"Pillow draft {draft.shape} != DCT-scaled {scaled.shape} on {path}"
            for name, value in got.items():
                # torchvision.io gives a CHW tensor: compare it as HWC pixels
                array = value.permute(1, 2, 0).numpy() if hasattr(value, "permute") else np.asarray(value)
                shapes[name].add(array.shape)
                kinds[name] = "PIL" if isinstance(value, Image.Image) else type(value).__name__
                reference = draft if name == "nanopatch DCT-scaled (min 224)" else stock
                if name == CROP:
                    top, left, box_h, box_w = rrc_box(path)
                    reference = stock[top : top + box_h, left : left + box_w]
                    assert np.array_equal(array, reference), f"crop decode != stock cut on {path}"
                if name != "Pillow draft (min 224)":
                    same[name] &= array.shape == reference.shape and bool(np.array_equal(array, reference))
        for name in funcs:
            (height, width, _), *_ = sorted(shapes[name])
            if name == "nanopatch DCT-scaled (min 224)":
                match = "= Pillow draft" if same[name] else "!= Pillow draft"
            elif name == "Pillow draft (min 224)":
                match = ""
            elif name == CROP:
                match = "= stock cut" if same[name] else "!= stock cut"
            else:
                match = "= stock" if same[name] else "!= stock"
            outputs.setdefault(name, {})[size_name(size)] = {
                "width": width,
                "height": height,
                "pixels": match,
                "type": kinds[name],
            }
    return outputs
