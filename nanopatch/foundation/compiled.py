"""C built once per machine into nanopatch's cache folder and loaded with ctypes: what
nanopatch's compiled kernels (the exact resize passes of :mod:`nanopatch.targets.vision.native`,
the crop-aware JPEG decode of ``nanopatch.targets.vision._jpeg_region``) are made with.

:func:`compiled` builds ``source`` with this machine's C compiler (``$CC``, else ``cc``, ``gcc``
or ``clang``; ``-O3``, no floating-point contraction or fast-math, ``-mavx2`` where the CPU has
AVX2) into ``kernels/<name>-<hash>.so`` under the cache folder (``NANOPATCH_CACHE_DIR``, else
``$XDG_CACHE_HOME/nanopatch``, else ``~/.cache/nanopatch``; the hash covers the source, the
compiler, the flags and the machine), once: a later process loads the file. A build writes
beside the file and renames it into place, so processes building at once never load half a
file; a file that does not load is built again. It never raises: where ``NANOPATCH_NATIVE=0``,
there is no compiler, the build fails or the cache folder cannot be used, it says why, and the
caller runs what it ran before.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

#: ``0`` turns every compiled kernel off.
VARIABLE = "NANOPATCH_NATIVE"


def compiler() -> str | None:
    """The C compiler to build with, or None."""
    given = os.environ.get("CC")
    if given:
        return shutil.which(given.split()[0]) and given
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def flags() -> list[str]:
    """The flags to build with on this machine."""
    from nanopatch.foundation import cpu

    flags = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]
    try:
        avx2 = "avx2" in cpu.host_facts().flags
    except Exception:
        avx2 = False
    if avx2:
        flags.append("-mavx2")
    return flags


def library_path(compiler: str, flags: list[str], name: str, source: str) -> Path:
    """Where the library ``name`` built from ``source`` by ``compiler`` with ``flags`` is kept."""
    from nanopatch.foundation.records import cache_dir

    key = hashlib.sha256("\0".join([source, compiler, *flags, platform.machine()]).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{name}-{key}.so"


def _build(compiler: str, flags: list[str], path: Path, source: str, libraries: tuple[str, ...] = ()) -> None:
    """Compile ``source`` into ``path`` (written beside it, then renamed into place, so that
    processes building at once never load a half-written file), linked with ``libraries``
    (``-l`` options). Raises OSError or CalledProcessError/TimeoutExpired."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source_file = path.with_name(f".{path.stem}.{os.getpid()}.c")
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.so")
    try:
        source_file.write_text(source)
        subprocess.run(
            [*compiler.split(), *flags, "-o", str(temporary), str(source_file), *libraries],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(temporary, path)
    finally:
        for leftover in (source_file, temporary):
            try:
                leftover.unlink()
            except OSError:
                pass


def _open(compiler: str, flags: list[str], path: Path, source: str, libraries: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The library at ``path``, built there first where it is missing or does not load (a file
    damaged since it was built is built again)."""
    if path.exists():
        try:
            return ctypes.CDLL(str(path))
        except OSError:
            pass
    _build(compiler, flags, path, source, libraries)
    return ctypes.CDLL(str(path))


def compiled(name: str, source: str, libraries: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """``source`` built once into the cache folder as ``name`` (linked with ``libraries``) and
    loaded: (the library, where it is kept), or (None, why not) where it is off
    (``NANOPATCH_NATIVE=0``), there is no compiler, the build fails or the file cannot be
    written or loaded. Never raises."""
    if os.environ.get(VARIABLE, "").strip().lower() in ("0", "false", "no", "off"):
        return None, f"{VARIABLE}=0"
    found = compiler()
    if found is None:
        return None, "no C compiler (cc, gcc or clang) on PATH"
    options = flags()
    path = None
    try:
        path = library_path(found, [*options, *libraries], name, source)
        return _open(found, options, path, source, libraries), f"compiled by {found}, kept in {path}"
    except subprocess.CalledProcessError as exc:
        return None, f"{found} could not build it: {(exc.stderr or '').strip()[-300:] or exc}"
    except Exception as exc:  # no cache folder, a read-only or noexec one, a timeout: not used
        return None, f"could not build or load {path or 'the kernel'}: {exc}"
