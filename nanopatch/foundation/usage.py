"""Which parts of nanopatch a run really used, across all its processes.

A patch that is applied is not yet a patch that ran: a script that imports torchvision but loads
no image has its decoding patched and never decoded a file through it, and the images of a
DataLoader are decoded in worker processes the parent cannot see into. Where ``--compare`` asks
for it (``NANOPATCH_USAGE``: a folder), each process marks the first use of each part with an
empty file of that name there; ``--compare``'s summary reads the folder when the run ends. The
mark costs one set lookup per call after the first, and nothing at all without the variable."""

from __future__ import annotations

import os

#: the folder each process of a run marks the parts it used in (set by ``--compare``)
VARIABLE = "NANOPATCH_USAGE"

_marked: set[str] = set()


def record(part: str) -> None:
    """Mark ``part`` (a plain name: ``transforms``, ``decode-turbojpeg``) as used in this run."""
    if part in _marked:
        return
    _marked.add(part)
    folder = os.environ.get(VARIABLE)
    if not folder:
        return
    try:
        with open(os.path.join(folder, part), "a"):
            pass
    except OSError:  # a folder gone or read-only: the run itself must not notice
        pass


def used(folder: str) -> set[str]:
    """The parts the processes of a run marked in ``folder``."""
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()
