"""A warning the user's script raises in its training loop prints as often patched as stock.

Python shows a warning with the default action once per place in the code; it keeps that record
per module and forgets it whenever the warnings filters change. A decoder that catches libjpeg's
corrupt-data warnings inside ``warnings.catch_warnings()``, per image, changes them, so a
warning the script raises every step would print every step patched and once stock. Each run
here decodes JPEGs through an ImageFolder (a clean one and one whose scan is corrupt, which
libjpeg warns about) with the JPEG decoders nanopatch has here.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from nanopatch.targets.vision import decode

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
        from nanopatch.targets.vision import decode
        assert decode._backend._made[0] is not decode._backend._UNLOADED  # the loop decoded with it
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


def run(tmp_path, *runner, script_text=SCRIPT, **env):
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    script = tmp_path / "train.py"
    script.write_text(script_text)
    proc = run_python([*runner, str(script), str(root)], env=child_env(env), cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.py_only  # a whole script's warnings, printed by Python's own machinery
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


LOADER_SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
    from torchvision import transforms as T

    root = sys.argv[1]
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (48, 1100, 3), dtype=np.uint8)).save(f"{root}/a/{i}.jpg")
    # a shrink of one axis of lines wider than the compiled pass takes, 3 channels: nanopatch's
    # resize checks torch's kernel on the first image, after the loader's first iterator has
    # warned (pin_memory without an accelerator)
    dataset = torchvision.datasets.ImageFolder(root, T.Compose([T.Resize((48, 1000)), T.PILToTensor()]))
    train = torch.utils.data.DataLoader(dataset, batch_size=2, pin_memory=True)
    test = torch.utils.data.DataLoader(dataset, batch_size=2, pin_memory=True)
    for epoch in range(2):
        for images, labels in train:
            warnings.warn("this old API is deprecated", FutureWarning)
        for images, labels in test:
            pass
    torch.library.Library("nanopatch_test", "FRAGMENT")  # dropout's kernel is registered by now
    if "nanopatch" in sys.modules:
        from nanopatch.targets.vision import _geometry
        print("KERNEL CHECKED", _geometry._aa_into_usable.cache_info().misses)
    """
)


@pytest.mark.py_only  # a whole script's warnings, printed by Python's own machinery
def test_nanopatchs_own_probes_leave_pythons_record_of_shown_warnings(tmp_path):
    """nanopatch's probes that turn warnings into errors or ignore them (the resize kernel's
    check, the kernel registrations) leave Python's record of the warnings already shown alone:
    the loader's pin_memory warning and the loop's warning print once, as stock."""
    stock = run(tmp_path / "stock", script_text=LOADER_SCRIPT)
    patched = run(tmp_path / "patched", "-m", "nanopatch", script_text=LOADER_SCRIPT)
    assert "KERNEL CHECKED 1" in patched.stdout, patched.stdout
    for text in ("FutureWarning: this old API is deprecated", "UserWarning: 'pin_memory' argument is set as true"):
        assert stock.stderr.count(text) == 1, stock.stderr
        assert patched.stderr.count(text) == 1, patched.stderr


def test_warnings_from_acts_on_its_module_and_forgets_nothing():
    import warnings

    from nanopatch.foundation.log import warnings_from

    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as shown:  # the test's own record
        warnings.simplefilter("default")
        for _ in range(3):
            warnings.warn("once per place", FutureWarning, stacklevel=1)
            with pytest.raises(UserWarning, match="made an error"), warnings_from(rf"{__name__}\Z", "error"):
                warnings.warn("made an error", stacklevel=1)
            with warnings_from(rf"{__name__}\Z", "ignore", "quiet"):
                warnings.warn("quiet, please", stacklevel=1)
            with warnings_from(r"elsewhere\Z", "ignore"):
                warnings.warn("not from elsewhere", stacklevel=1)
    assert [str(w.message) for w in shown] == ["once per place", "not from elsewhere"]
    with warnings.catch_warnings():
        pass
    assert warnings.filters == filters
    with pytest.raises(ValueError, match="action must be"):
        with warnings_from("x", "always"):
            pass
