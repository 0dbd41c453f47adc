"""Command-line words: the runner's options with some left out, for the runs it starts itself
(``--compare``'s patched run, ``--nproc measure``'s trials)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def without(words: Sequence[str], valued: Collection[str] = (), flags: Collection[str] = ()) -> list[str]:
    """``words`` without the options in ``valued`` (and the value after each, or joined to it
    by ``=``) and the options in ``flags``."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in valued:
            skip = True
        elif word not in flags and word.split("=", 1)[0] not in valued:
            kept.append(word)
    return kept
