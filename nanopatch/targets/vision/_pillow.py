"""Pillow's own bilinear passes on ndarrays: the references nanopatch's faster passes are checked
against before they are used (``_geometry``'s Pillow-backed loops, ``native``'s compiled ones)."""

from __future__ import annotations

import numpy as np

from ._pixels import from_pil, to_pil

#: (source lines, bytes a line, output lines, box) of the noise images on which a vertical pass
#: other than Pillow's own "L" one is checked before it is used: shrinking, enlarging, with and
#: without a box, lines a whole number of 4-byte pixels or not
ROWS_CHECKS = (
    (37, 36, 20, None),
    (37, 35, 20, None),
    (13, 22, 31, None),
    (300, 672, 224, None),
    (60, 30, 40, (3.5, 55.25)),
    (60, 33, 23, (0.0, 41.0)),
)


def columns(arr: np.ndarray, out_w: int, span: tuple[float, float] | None) -> np.ndarray:
    """Pillow's bilinear horizontal pass of (H, W, C) pixels to ``out_w`` columns, on Pillow's
    own "L"/"RGB" image."""
    from PIL import Image

    in_h, in_w = arr.shape[:2]
    box = (0, 0, in_w, in_h) if span is None else (span[0], 0, span[1], in_h)
    return from_pil(to_pil(arr).resize((out_w, in_h), Image.BILINEAR, box))


def rows_l(arr: np.ndarray, out_h: int, span: tuple[float, float] | None) -> np.ndarray:
    """Pillow's bilinear vertical pass of the bytes of ``arr`` (each row's bytes, whatever its
    shape past the first axis) to ``out_h`` rows, as one "L" image shared with the array:
    (out_h, row bytes) uint8."""
    from PIL import Image

    arr = np.ascontiguousarray(arr)
    in_h, row = arr.shape[0], arr.size // max(arr.shape[0], 1)
    flat = Image.frombuffer("L", (row, in_h), arr, "raw", "L", 0, 1)
    box = (0, 0, row, in_h) if span is None else (0, span[0], row, span[1])
    return np.asarray(flat.resize((row, out_h), Image.BILINEAR, box))
