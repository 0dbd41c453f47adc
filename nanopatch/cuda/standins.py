"""The public path of :mod:`nanopatch.targets.cuda.standins` (``NoCpuEquivalent`` and the CPU's
stand-ins for CUDA calls): importing it gives that very module, so ``nanopatch.cuda.standins.X
is nanopatch.targets.cuda.standins.X`` for every name."""

import sys

from nanopatch.targets.cuda import standins as _module

sys.modules[__name__] = _module
