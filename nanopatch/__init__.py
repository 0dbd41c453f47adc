"""nanopatch: faster PyTorch training on CPUs for unmodified scripts.

    import nanopatch
    nanopatch.patch_torch()

or run a script with ``python -m nanopatch train.py``. Importing nanopatch is cheap: it
imports neither torchvision nor OpenCV; patches for a library are applied when that library
is imported (or at once if it already is).
"""

from nanopatch import targets as _targets  # noqa: F401  (registers nanopatch's own targets with the engine)
from nanopatch.engine import is_patched, patch_torch, patched, status, unpatch_torch, unpatched
from nanopatch.foundation.log import NanopatchWarning

__version__ = "0.1.0"

__all__ = [
    "NanopatchWarning",
    "TorchNano",
    "__version__",
    "is_patched",
    "nano",
    "patch_torch",
    "patched",
    "status",
    "unpatch_torch",
    "unpatched",
]


def __getattr__(name: str) -> object:
    # BigDL-Nano's custom-loop APIs, imported on first use (``import nanopatch`` stays cheap)
    if name in ("TorchNano", "nano"):
        from nanopatch.compat import torch_nano

        return getattr(torch_nano, name)
    raise AttributeError(f"module 'nanopatch' has no attribute {name!r}")
