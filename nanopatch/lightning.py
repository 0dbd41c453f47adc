"""The public path of :mod:`nanopatch.compat.lightning` (BigDL-Nano's Lightning ``Trainer``):
importing it gives that very module, so ``nanopatch.lightning.X is
nanopatch.compat.lightning.X`` for every name."""

import sys

from nanopatch.compat import lightning as _module

sys.modules[__name__] = _module
