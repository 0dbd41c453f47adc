"""Run a command with nanopatch pointed at the libjpeg-turbo 3 bundled in the `turbojpeg` wheel.

Debian ships libjpeg-turbo 2.1, which PyTurboJPEG 2.x refuses; the `turbojpeg` wheel (another
binding) carries a libturbojpeg 3. tox's `turbojpeg2` env installs that wheel into a folder
of its own (both packages import as `turbojpeg`), and this script finds the library there,
sets NANOPATCH_TURBOJPEG_LIB and runs the command.

    python tests/helpers/run_with_libjpeg_turbo3.py LIBDIR pytest [args...]
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys


def main() -> int:
    libdir, *command = sys.argv[1:]
    found = sorted(glob.glob(os.path.join(libdir, "turbojpeg.libs", "libturbojpeg*.so*")))
    if not found:
        print(f"no libturbojpeg under {libdir}/turbojpeg.libs", file=sys.stderr)
        return 2
    os.environ["NANOPATCH_TURBOJPEG_LIB"] = found[0]
    print(f"NANOPATCH_TURBOJPEG_LIB={found[0]}", flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
