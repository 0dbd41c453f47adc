"""The public path of :mod:`nanopatch.foundation.learning` (what "learns as stock" means):
importing it gives that very module, so ``nanopatch.learning.X is
nanopatch.foundation.learning.X`` for every name."""

import sys

from nanopatch.foundation import learning as _module

sys.modules[__name__] = _module
