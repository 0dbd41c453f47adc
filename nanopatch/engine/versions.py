"""The torch versions nanopatch is tested on, and which tests run on each.

Read by ``python -m nanopatch --info``, which says when the installed torch is outside them.
tox.ini pins the same pairs (tests/runner/test_info.py checks that they agree).
"""

from __future__ import annotations

import dataclasses

from . import config

FULL = "the full suite"
LEARNING = "the learning oracle"


@dataclasses.dataclass(frozen=True)
class Tested:
    """One torch/torchvision pair that a tox env tests, and what runs on it."""

    torch: str
    torchvision: str
    tests: str  # FULL or LEARNING
    env: str  # the tox env
    extra: str = ""  # what else the env adds, e.g. "IPEX 2.8"

    @property
    def minor(self) -> tuple[int, ...]:
        return config._major_minor(self.torch)


#: Oldest first. The full suite on the oldest (with IPEX's last release), on the pair the
#: README's figures come from, and on the newest on PyPI; the learning tests on each minor
#: between them, so every minor from the oldest to the newest is tested.
TESTED: tuple[Tested, ...] = (
    Tested("2.8.0", "0.23.0", FULL, "ipex", extra="IPEX 2.8"),
    Tested("2.9.1", "0.24.1", LEARNING, "between"),
    Tested("2.10.0", "0.25.0", LEARNING, "between"),
    Tested("2.11.0", "0.26.0", LEARNING, "between"),
    Tested("2.12.1", "0.27.1", LEARNING, "between"),
    Tested("2.13.0", "0.28.0", FULL, "py"),
    Tested("2.14.1", "0.29.1", LEARNING, "between"),
    Tested("2.15.0", "0.29.2", FULL, "newest"),
)


def supported(*distributions: str) -> dict[str, str]:
    """The version floors a target declares (its ``supported``): the oldest tested pair's, for
    ``torch`` and ``torchvision`` (pyproject.toml requires the same; tests/engine/test_versions.py
    checks it)."""
    oldest = TESTED[0]
    floors = {
        "torch": f">={_minor_text(oldest.minor)}",
        "torchvision": f">={_minor_text(config._major_minor(oldest.torchvision))}",
    }
    return {name: floors[name] for name in distributions}


#: What an untested torch means for a user, in one line.
UNTESTED_MEANING = (
    "nanopatch's self-checks turn off any fast path that does not learn as stock on it; "
    "`python -m nanopatch --verify script.py` checks a script"
)


def _minor_text(minor: tuple[int, ...]) -> str:
    return ".".join(map(str, minor))


def tested_range() -> str:
    """The tested torch minors as a range: "2.8 to 2.15"."""
    return f"{_minor_text(TESTED[0].minor)} to {_minor_text(TESTED[-1].minor)}"


def summary() -> str:
    """Which tests run on which torch, in one line."""
    parts = []
    for tests in (FULL, LEARNING):
        entries = [t for t in TESTED if t.tests == tests]
        if entries:
            versions = ", ".join(_minor_text(t.minor) + (f" (+ {t.extra})" if t.extra else "") for t in entries)
            parts.append(f"{tests} on {versions}")
    return f"{tested_range()}: " + "; ".join(parts)


@dataclasses.dataclass(frozen=True)
class TorchSupport:
    """Whether a torch version is one nanopatch is tested on, and what that means."""

    version: str | None  # None: torch is not installed
    tested: Tested | None  # the tested pair of the same minor, if any
    message: str

    @property
    def is_tested(self) -> bool:
        return self.tested is not None

    def as_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "tested": self.is_tested,
            "message": self.message,
            "meaning": None if self.is_tested or self.version is None else UNTESTED_MEANING,
            "range": tested_range(),
            "summary": summary(),
            "versions": [dataclasses.asdict(t) for t in TESTED],
        }


def torch_support(version: str | None = None) -> TorchSupport:
    """Whether ``version`` (default: the installed torch, from package metadata, without
    importing it) is tested. A minor counts as tested when one of its releases is: patch
    releases fix bugs only."""
    if version is None:
        version = config.distribution_version("torch")
    if version is None:
        return TorchSupport(None, None, "torch is not installed")
    minor = config._major_minor(version)
    for entry in TESTED:
        if entry.minor == minor:
            how = entry.tests + (f" with {entry.extra}" if entry.extra else "")
            if entry.torch != version.split("+")[0]:
                how += f", on {entry.torch} of the same minor"
            return TorchSupport(version, entry, f"torch {version} is tested: {how} (tox -e {entry.env})")
    if TESTED[0].minor <= minor <= TESTED[-1].minor:
        where = f"is not tested (inside the tested range, {tested_range()}, but not tested itself)"
    else:
        where = f"is outside the tested range ({tested_range()})"
    return TorchSupport(version, None, f"torch {version} {where}")
