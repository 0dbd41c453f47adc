"""``python -m nanopatch._stock``: the stock run of ``--compare`` and ``--verify``; its code is
nanopatch/runner/_stock.py."""

import sys

from nanopatch.runner.stock import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
