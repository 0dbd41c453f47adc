"""A script run with DataLoader workers of every start method, from an empty cache folder: what
the tests of nanopatch's compiled kernels (the resize passes, the region decoder, ColorJitter's
passes) share."""

from __future__ import annotations

from pathlib import Path


def run_in_workers(tmp_path: Path, script_text: str, images: Path, kernel_glob: str) -> None:
    """Run ``script_text`` (which prints "<method> ok" for fork, spawn and forkserver) on
    ``images`` with ``tmp_path / "cache"`` as nanopatch's cache folder; assert that it passed on
    every start method and left exactly one built library matching ``kernel_glob``."""
    from conftest import child_env, run_python

    script = tmp_path / "workers.py"
    script.write_text(script_text)
    env = child_env(NANOPATCH_CACHE_DIR=str(tmp_path / "cache"))
    proc = run_python([str(script), str(images)], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fork", "ok", "spawn", "ok", "forkserver", "ok"]
    assert len(list((tmp_path / "cache" / "kernels").glob(kernel_glob))) == 1


def noise_folder(root: Path, seed: int) -> Path:
    """An ImageFolder at ``root``: classes "a" and "b", three noise JPEGs of 40-89 pixels a side
    each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            noise = rng.integers(0, 256, (int(rng.integers(40, 90)), int(rng.integers(40, 90)), 3), dtype=np.uint8)
            Image.fromarray(noise).save(root / cls / f"{i}.jpg", quality=90)
    return root
