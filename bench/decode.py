"""Images/s of torchvision's JPEG loading, stock against nanopatch, beside the raw decoders.

On one pinned core (one thread everywhere), times these variants on a generated set of
photo-like JPEGs (500x375 and 2400x1800, quality 75-95, 4:2:0), every variant once per
round with the order rotated each round so that machine drift hits all of them alike, in a
few fresh processes one after another (Pillow's speed differs from process to process with
heap layout and glibc's malloc thresholds, so a single process is a single draw of that):

* ``stock loader``: torchvision's own ``pil_loader`` (what ``default_loader`` and
  ``ImageFolder`` call when nothing is patched): Pillow decode + ``convert("RGB")``.
* ``nanopatch loader``: ``torchvision.datasets.folder.pil_loader`` after
  ``nanopatch.patch_torch()``; returns a PIL image too, with identical pixels (checked).
* ``PyTurboJPEG decode`` and ``OpenCV decode``: the raw decoders (file read included).
* ``nanopatch DCT-scaled (min 224)``: ``nanopatch.targets.vision.decode.decode(path, min_size=(224, 224))``.
* ``Pillow draft (min 224)``: Pillow's own DCT scaling to the same reduction, for reference.
* ``nanopatch crop (RRC box)``: ``decode(path, box=...)`` of a RandomResizedCrop(224) box (one
  fixed box per file, drawn with torchvision's ``get_params`` under a seed from the file name):
  on libjpeg-turbo 3 only that region is decoded, else the whole image and the box cut. Its
  pixels must equal the stock loader's cut to the box (checked).

Patches are applied once per process (``nanopatch.patch_torch()``), and each process first
asserts that the stock and nanopatch loaders give identical pixels on every image. Reports
the median images/s over all rounds, the ratio to ``stock loader`` at the same size (and its
range over the processes) and the targets from the issue (printed, not asserted). The data set
is generated once into a cache directory (``--data`` to choose it); files are read from the
page cache. See bench/README.md for how to read the columns.

    PYTHONPATH=. python bench/decode.py [--quick] [--processes 6] [--rounds 4] [--small 24]
                                        [--large 6] [--data DIR] [--cpu N] [--malloc reuse] [--json]
"""

from __future__ import annotations

import sys

from families.decode.main import main as decode_main  # bench/ is this script's folder, first on sys.path


def main(argv: list[str] | None = None) -> int:
    return decode_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
