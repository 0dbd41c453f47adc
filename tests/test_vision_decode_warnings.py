"""A warning the user's script raises in its training loop prints as often patched as stock.

Python shows a warning with the default action once per place in the code; it keeps that record
per module and forgets it whenever the warnings filters change. Decoding inside
``warnings.catch_warnings()`` (how libjpeg's corrupt-data warnings were once caught, per image)
changes them, so a warning the script raised every step printed every step under nanopatch and
once stock. Each run here decodes JPEGs through an ImageFolder (a clean one and one whose scan
is corrupt, which libjpeg warns about) with the JPEG decoders nanopatch has here.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from nanopatch.vision import decode

from conftest import child_env, run_python

SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    import numpy as np
    from PIL import Image
    import torchvision

    root = sys.argv[1]
    rng = np.random.default_rng(0)
    for i in range(3):
        pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(f"{root}/a/{i}.jpg", quality=90)
    good = open(f"{root}/a/0.jpg", "rb").read()
    start = good.index(b"\\xff\\xda") + 20  # inside the scan: libjpeg warns, Pillow decodes on
    bad = bytearray(good)
    for i in range(start, start + 40):
        bad[i] = 0x55 if bad[i] != 0x55 else 0x33
    open(f"{root}/a/9.jpg", "wb").write(bytes(bad))

    dataset = torchvision.datasets.ImageFolder(root)
    for epoch in range(4):
        for image, label in dataset:
            warnings.warn("this old API is deprecated", FutureWarning)
    if "nanopatch" in sys.modules:
        from nanopatch.vision import decode
        assert decode._backend._value is not decode._backend._UNLOADED  # the loop decoded with it
        backend = decode.jpeg_backend()
        print("BACKEND", backend.name if backend is not None else "pillow")
    """
)


def backends():
    """The JPEG decoders nanopatch can use here."""
    found = ["opencv"]
    try:
        decode._TurboJPEG()
        found.insert(0, "turbojpeg")
    except Exception as exc:
        if os.environ.get("NANOPATCH_TEST_REQUIRE_TURBOJPEG") == "1":
            pytest.fail(f"PyTurboJPEG with libturbojpeg is required here: {exc}")
    return found


def run(tmp_path, *runner, **env):
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = run_python([*runner, str(script), str(root)], env=child_env(env), cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("backend", backends())
def test_a_warning_in_the_loop_prints_as_often_as_stock(tmp_path, backend):
    stock = run(tmp_path / "stock")
    patched = run(tmp_path / "patched", "-m", "nanopatch", NANOPATCH_DECODER=backend)
    assert f"BACKEND {backend}" in patched.stdout  # the images were decoded by it
    assert stock.stderr.count("FutureWarning: this old API is deprecated") == 1
    assert patched.stderr.count("FutureWarning: this old API is deprecated") == 1, patched.stderr


def test_strict_turbojpeg_raises_libjpegs_warning_as_oserror(corpus):
    try:
        backend = decode._TurboJPEG()
    except Exception:
        pytest.skip("no PyTurboJPEG with libturbojpeg here")
    assert backend._strict  # PyTurboJPEG 1.x and 2.x both report through __report_error
    data = corpus["jpeg-corrupt-scan"].path.read_bytes()
    with pytest.raises(OSError, match="Corrupt JPEG data"):
        backend._tj.decode(data)
    assert backend.decode(data, 1, False) is None  # Pillow decides, as stock
