"""``python -m nanopatch``: the runner's entry point; the runner is nanopatch/runner/cli.py."""

import sys

from nanopatch.runner.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
