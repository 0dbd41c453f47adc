"""Start-up hook for processes launched under ``python -m nanopatch`` (see __init__.py here)."""

import os
import sys


def _nanopatch_bootstrap():
    try:
        try:
            import nanopatch.runner._bootstrap as boot
        except ImportError:
            # nanopatch runs from a checkout that is not installed: the folder three levels up
            # (above nanopatch/runner/_bootstrap) holds the package.
            here = os.path.dirname(os.path.abspath(__file__))
            sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(here))))
            import nanopatch.runner._bootstrap as boot
    except Exception as exc:
        sys.stderr.write(f"nanopatch: this process runs unpatched: {type(exc).__name__}: {exc}\n")
        return
    boot.start_child()
    boot.chain_sitecustomize()


_nanopatch_bootstrap()
del _nanopatch_bootstrap
