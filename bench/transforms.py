"""Images/s of torchvision transform pipelines over an ImageFolder: stock, nanopatch, albumentations.

On one pinned core (one thread everywhere), times ``dataset[i]`` over a torchvision
``ImageFolder`` of generated photo-like JPEGs (500x375 and 2400x1800, the generator of
bench/decode.py; files read from the page cache) whose transform is one of three pipelines,
written exactly as users write them with ``torchvision.transforms``:

* ``train``: RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet)
* ``val``: Resize(256), CenterCrop(224), ToTensor(), Normalize(ImageNet)
* ``train+jitter``: ``train`` with ColorJitter(0.4, 0.4, 0.4, 0.1) after the flip

in these variants:

* ``stock``: torchvision as installed, nothing patched.
* ``nanopatch``: the same code after ``nanopatch.patch_torch(training=False, fast_decode=False)``
  (full-resolution decode: same pixels as stock, checked).
* ``nanopatch fast decode``: after ``patch_torch(training=False, fast_decode=True)`` (DCT-scaled
  decode where the pipeline allows it).

Both nanopatch variants decode only RandomResizedCrop's box where a region decoder loads (the
one nanopatch compiles against the system's libjpeg, or libjpeg-turbo 3's TurboJPEG API; exact:
the same pixels as the whole decode cut; the report says which is on). To time them without it,
run with ``NANOPATCH_CROP_DECODE=0``.
* ``albumentations``: the equivalent albumentations pipelines on ``cv2.imread`` + BGR2RGB over the
  same files (left out, with a note, when albumentations is not installed).
* ``tv tensors``: torchvision's tensor path, as its docs advise: ``torchvision.io.decode_jpeg`` to a
  uint8 CHW tensor, then the same pipelines in ``transforms.v2`` (antialiased resizes,
  ``ToDtype(float32, scale=True)``, ``Normalize``); ``tv tensors, nanopatch``: the same under
  ``patch_torch(training=False)``, checked to leave its values as they are.
* ``torchcodec``: that path decoded by TorchCodec's ``decode_image`` (what torchvision 0.29's
  deprecation of its decoders points to); ``kornia``: ``kornia.io.load_image`` and
  ``kornia.augmentation`` on a float batch of one. Each left out, with a note, where it does not
  import.

Every variant builds its own pipelines and ImageFolder in its own patch state (stock ones with
nothing patched, nanopatch ones after ``patch_torch()``) and runs in that state: the state is
switched before each sample, outside the timed region. That matters: torchvision's
``default_loader`` looks ``pil_loader`` up at call time, so a stock ImageFolder called while
patched would load through nanopatch. Each process prints which classes and loader every variant
really uses (and asserts that stock is all torchvision and that the nanopatch variants really go
through nanopatch), then, under the same ``torch.manual_seed`` per image, asserts that
``nanopatch`` gives stock's tensors within 1/255/min(std) and measures how far the fast decode
is from stock in grey levels. Every variant is timed once per round, the order rotated each
round, in several fresh processes one after another. Reports medians, ratios to ``stock`` (and
their range over the processes) and the targets from the issue, printed, never asserted. See
bench/README.md for how to read the columns.

    PYTHONPATH=. python bench/transforms.py [--quick] [--processes 5] [--rounds 4] [--small 24] [--large 6]
                                            [--pipelines train,val,train+jitter] [--clock wall|cpu] [--data DIR]
                                            [--cpu N] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # families/: when imported from elsewhere

from families.transforms.main import main as transforms_main  # bench/ is this script's folder, first on sys.path


def main(argv: list[str] | None = None) -> int:
    return transforms_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
