"""Crop-aware JPEG decoding: ``decode.decode(..., box=...)`` and the region decoders behind it:
the compiled libjpeg one (``jpeg_crop_scanline`` and ``jpeg_skip_scanlines``, any libjpeg-turbo
>= 1.5) and, on libjpeg-turbo 3, TurboJPEG 3's (``tj3SetCroppingRegion``); one iMCU of margin,
the box cut in pixel space.

* The region decoder's box is the very pixels of the whole decode (at the same DCT scale) cut
  there, bit for bit: random boxes and boxes on every edge and corner, 4:4:4, 4:2:2, 4:2:0,
  4:4:0, 4:1:1 and grayscale, odd, thin and tiny sizes, restart markers, scales 1/1 to 1/8; and
  without the margin it would not be (the test can tell).
* It declines what it must not take (progressive files, a stray marker in the scan, corrupt
  entropy data in a box down to the image's bottom); ``decode(box=...)`` then cuts the whole
  decode.
* ``decode(box=...)`` does what the whole decode does on every file of the corpus and every
  backend: the same pixels cut, or the same exception.
* RandomResizedCrop pipelines (v1 and v2, fast decode on and off) over an ImageFolder give the
  same tensors with the region decoder as without it, draw from torch's RNG exactly as stock,
  and stay within the pipeline tolerance of stock.

Each region-decoder test runs on each kind. TurboJPEG 3's skip where libturbojpeg is 2.x (the
default Debian library; tox's ``turbojpeg2`` env runs them on libjpeg-turbo 3); the compiled
one's skip where it cannot be built (no compiler or no ``jpeglib.h``), except where
``NANOPATCH_TEST_REQUIRE_NATIVE`` is set (CI).
"""

from __future__ import annotations

import ctypes
import io
import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import nanopatch
from nanopatch.targets.vision import _jpeg_region, decode

from helpers.kernel_workers import run_in_workers

TJSAMP_440, TJSAMP_411 = 4, 5


def _photo(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth colour gradients, sharp chroma edges and noise: every block has chroma detail."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [
            np.sin(x / (6 + 3 * c)) * 60 + np.cos(y / (5 + 2 * c)) * 50 + 128 + 40 * ((x + 2 * y) % (23 + c) < 7)
            for c in range(3)
        ],
        -1,
    )
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def _pillow_jpeg(pixels: np.ndarray, **params) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", **params)
    return buf.getvalue()


SIZES = [(375, 500), (117, 161), (33, 17), (16, 16), (9, 200), (200, 9), (3, 7), (1, 1)]


def _baseline_jpegs(backend) -> list[tuple[str, bytes, bool]]:
    """(name, bytes, grayscale) of sequential JPEGs of every kind the region decoder takes."""
    out = []
    for i, (height, width) in enumerate(SIZES):
        pixels = _photo(height, width, i)
        quality = 60 + 5 * i
        for name, subsampling in (("444", 0), ("422", 1), ("420", 2)):
            out.append(
                (f"{width}x{height}-{name}", _pillow_jpeg(pixels, quality=quality, subsampling=subsampling), False)
            )
        out.append((f"{width}x{height}-gray", _pillow_jpeg(pixels[:, :, 1], quality=quality), True))
        if hasattr(backend, "_tj"):  # TurboJPEG's own encoder writes the subsamplings Pillow cannot
            for name, subsampling in (("440", TJSAMP_440), ("411", TJSAMP_411)):
                data = backend._tj.encode(pixels, quality=quality, pixel_format=0, jpeg_subsample=subsampling)
                out.append((f"{width}x{height}-{name}", bytes(data), False))
    pixels = _photo(150, 230, 99)
    try:
        out.append(("230x150-420-restart", _pillow_jpeg(pixels, quality=85, restart_marker_rows=1), False))
    except (TypeError, ValueError, OSError):  # pragma: no cover - Pillow < 10.2
        pass
    return out


def _boxes(height: int, width: int, rng: np.random.Generator, count: int) -> list[tuple[int, int, int, int]]:
    """Boxes inside the image: its corners and edges, thin strips, then random ones."""
    boxes = [
        (0, 0, height, width),
        (0, 0, 1, 1),
        (height - 1, width - 1, 1, 1),
        (0, width - 1, height, 1),
        (height - 1, 0, 1, width),
        (height // 3, width // 3, max(height // 3, 1), max(width // 3, 1)),
    ]
    for _ in range(count):
        box_h, box_w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - box_h + 1)), int(rng.integers(0, width - box_w + 1))
        boxes.append((top, left, box_h, box_w))
    return boxes


def _has_turbojpeg3(backend) -> bool:
    path = decode._turbojpeg_lib_path(backend)
    return bool(path) and hasattr(ctypes.CDLL(path), "tj3SetCroppingRegion")


@pytest.fixture
def fresh_decoders(monkeypatch):
    monkeypatch.delenv(decode.CROP_DECODE_VARIABLE, raising=False)
    monkeypatch.delenv(decode.DECODER_VARIABLE, raising=False)
    yield


@pytest.fixture(params=["libjpeg", "turbojpeg3"])
def region(request, fresh_decoders):
    """(backend, region decoder), for each kind: the compiled libjpeg one (skips where it cannot be
    built, unless NANOPATCH_TEST_REQUIRE_NATIVE asks for it) and TurboJPEG 3's (skips where
    libturbojpeg is 2.x, the default Debian library)."""
    backend = decode.jpeg_backend()
    if backend is None:
        if os.environ.get("NANOPATCH_TEST_REQUIRE_TURBOJPEG"):
            pytest.fail("PyTurboJPEG with libturbojpeg is required here but did not load")
        pytest.skip("no fast JPEG backend here")
    if request.param == "libjpeg":
        made, why = _jpeg_region.functions()
        if made is None:
            if os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE"):
                pytest.fail(f"the compiled libjpeg region decoder is required here but did not load: {why}")
            pytest.skip(f"no compiled libjpeg region decoder here: {why}")
        return backend, _jpeg_region.CompiledRegion(*made)
    if not (isinstance(backend, decode._TurboJPEG) and _has_turbojpeg3(backend)):
        pytest.skip("no libjpeg-turbo 3 here: the TurboJPEG 3 region decoder is not there to test")
    return backend, decode._RegionDecoder(decode._turbojpeg_lib_path(backend))


def test_the_region_decoder_in_use_is_checked_and_preferred(fresh_decoders):
    """The compiled libjpeg decoder comes first where it loads (it stops at the box's bottom),
    then TurboJPEG 3's; --info names the one in use or says why there is none."""
    found = decode.region_decoder()
    report = decode.region_report()
    assert report["used"] is (found is not None)
    made, why = _jpeg_region.functions()
    if made is not None:
        assert isinstance(found, _jpeg_region.CompiledRegion)
        assert report["reason"] == found.name
    elif os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE"):
        pytest.fail(f"the compiled libjpeg region decoder is required here but did not load: {why}")
    else:
        assert found is None or isinstance(found, decode._RegionDecoder)
        assert found is not None or why in report["reason"]


def _cut(arr, box):
    top, left, height, width = box
    return arr[top : top + height, left : left + width]


def test_region_decode_is_the_whole_decode_cut(region):
    backend, found = region
    rng = np.random.default_rng(2024)
    checked = 0
    for name, data, gray in _baseline_jpegs(backend):
        for factor in (1, 2, 4, 8):
            whole = backend.decode(data, factor, gray)
            for box in _boxes(*whole.shape[:2], rng, 14):
                got = found.decode(data, factor, box, gray)
                assert got is not None, f"{name} 1/{factor} {box}: declined a sequential JPEG"
                want = _cut(whole, box)
                assert got.shape == want.shape, (name, factor, box)
                if not np.array_equal(got, want):
                    diff = np.abs(got.astype(int) - want)
                    pytest.fail(
                        f"{name} 1/{factor} box {box}: {int((diff > 0).sum())} values differ (max {diff.max()})"
                    )
                checked += 1
    assert checked > 2000


def test_without_the_margin_the_edges_would_differ(region, monkeypatch):
    """The margin is what makes it exact: a region that starts at the box's own iMCU and ends at
    its edge gets libjpeg-turbo's edge replication, which the test above would catch."""
    backend, found = region

    def tight(size, mcu, box):
        top, left, height, width = box
        y0, x0 = top // mcu[0] * mcu[0], left // mcu[1] * mcu[1]
        return y0, x0, top + height - y0, left + width - x0

    monkeypatch.setattr(decode, "padded_region", tight)  # TurboJPEG 3's
    monkeypatch.setattr(found, "margin", 0, raising=False)  # the compiled one's
    data = _pillow_jpeg(_photo(120, 160, 5), quality=90, subsampling=2)
    whole = backend.decode(data, 1, False)
    rng = np.random.default_rng(8)
    differ = sum(
        not np.array_equal(found.decode(data, 1, box, False), _cut(whole, box)) for box in _boxes(120, 160, rng, 40)
    )
    assert differ >= 5


def test_region_decoder_declines_what_it_must_not_take(region):
    _, found = region
    pixels = _photo(96, 128, 3)
    box = (8, 8, 40, 40)
    progressive = _pillow_jpeg(pixels, quality=90, progressive=True)
    assert found.decode(progressive, 1, box, False) is None
    assert found.decode(progressive, 1, (40, 8, 56, 40), False) is None  # down to the bottom: no scan check
    baseline = _pillow_jpeg(pixels, quality=90, subsampling=2)
    assert found.decode(baseline, 1, box, False) is not None
    # a stray marker in the scan (libjpeg fails on it after the rows a region decode reads)
    start = baseline.index(b"\xff\xda")
    stray = bytearray(baseline)
    at = len(stray) - 40
    stray[at : at + 2] = b"\xff\x01"
    assert not decode.scan_is_clean(bytes(stray)) and decode.scan_is_clean(baseline)
    assert found.decode(bytes(stray), 1, box, False) is None
    # corrupt entropy data above the box's bottom: libjpeg warns, the region decoder declines
    corrupt = bytearray(baseline)
    scan = start + 14
    corrupt[scan + 20 : scan + 60] = bytes(range(40))
    assert decode.scan_is_clean(bytes(corrupt))
    assert found.decode(bytes(corrupt), 1, (0, 0, 96, 128), False) is None
    # boxes outside the image
    assert found.decode(baseline, 1, (90, 0, 10, 10), False) is None
    assert found.decode(baseline, 1, (0, 0, 0, 5), False) is None


def test_the_decoder_follows_its_variable_when_it_changes(fresh_decoders, monkeypatch):
    """NANOPATCH_DECODER set after a first decode (by a script, or a test) chooses the next one:
    the choice is kept per value of the variables, not once per process."""
    monkeypatch.setenv(decode.DECODER_VARIABLE, "pil")
    assert decode.jpeg_backend() is None
    assert decode.region_decoder() is None
    monkeypatch.setenv(decode.DECODER_VARIABLE, "opencv")
    assert decode.jpeg_backend().name == "opencv"
    monkeypatch.setenv(decode.DECODER_VARIABLE, "pil")
    assert decode.jpeg_backend() is None


def test_switch_turns_the_region_decoder_off(fresh_decoders, monkeypatch):
    monkeypatch.setenv(decode.CROP_DECODE_VARIABLE, "0")
    assert decode.region_decoder() is None


def _reloaded_region(monkeypatch):
    """A process state where the region decoder was never chosen (the libjpeg one never built)."""
    monkeypatch.setattr(_jpeg_region, "_loaded", {})
    once = decode._Once(decode._load_region_decoder, decode._region._key)
    monkeypatch.setattr(decode, "_region", once)
    monkeypatch.setattr("nanopatch.foundation.log._first_time", lambda key, about=None: True)


def test_without_the_compiled_decoder_boxes_still_come_out_right(fresh_decoders, monkeypatch, tmp_path, caplog):
    """Where the libjpeg decoder cannot be had (here: NANOPATCH_NATIVE=0 on an empty cache
    folder), TurboJPEG 3's is used where it loads, else none; --info says why; boxes are the
    whole decode cut either way."""
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NANOPATCH_NATIVE", "0")
    _reloaded_region(monkeypatch)
    backend = decode.jpeg_backend()
    with caplog.at_level("INFO", logger="nanopatch"):
        found = decode.region_decoder()
    assert not isinstance(found, _jpeg_region.CompiledRegion)
    if found is None:
        assert "libjpeg's: NANOPATCH_NATIVE=0" in decode.region_report()["reason"]
        assert any("crop-aware JPEG decode unavailable" in r.getMessage() for r in caplog.records)
    else:
        assert isinstance(backend, decode._TurboJPEG) and _has_turbojpeg3(backend)
    assert not list(tmp_path.glob("kernels/*.so"))
    data = _pillow_jpeg(_photo(117, 161, 4), quality=85, subsampling=2)
    whole = decode.decode(data)
    assert np.array_equal(decode.decode(data, box=(10, 20, 50, 70)), _cut(whole, (10, 20, 50, 70)))


def test_a_compiler_that_cannot_build_it_leaves_a_reason_and_no_file(monkeypatch, tmp_path):
    """No jpeglib.h (or any build error): the reason names the compiler's complaint."""
    from nanopatch.foundation import compiled

    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NANOPATCH_NATIVE", raising=False)
    if compiled.compiler() is None:
        pytest.skip("no C compiler here")
    lib, why = compiled.compiled("missing-header", "#include <nanopatch_no_such_header.h>\nint x;\n")
    assert lib is None
    assert "could not build it" in why and "nanopatch_no_such_header.h" in why
    assert not [p for p in (tmp_path / "kernels").iterdir() if p.suffix in (".so", ".c")]


def test_a_compiled_decoder_that_differs_from_the_whole_decode_is_not_used(fresh_decoders, monkeypatch, caplog):
    made, why = _jpeg_region.functions()
    if made is None:
        pytest.skip(f"no compiled libjpeg region decoder here: {why}")
    _reloaded_region(monkeypatch)
    original = _jpeg_region.CompiledRegion.decode

    def off_by_one(self, data, factor, box, gray):
        got = original(self, data, factor, box, gray)
        if got is not None:
            got = got.copy()
            got[0, 0] ^= 1
        return got

    monkeypatch.setattr(_jpeg_region.CompiledRegion, "decode", off_by_one)
    with caplog.at_level("WARNING", logger="nanopatch"):
        found = decode.region_decoder()
    assert not isinstance(found, _jpeg_region.CompiledRegion)
    assert any("does not reproduce the full decode's pixels" in r.getMessage() for r in caplog.records)


def test_the_compiled_scan_check_is_the_python_one(small_corpus):
    """nanopatch_scan_is_clean (what the compiled decoder asks before it stops above the bottom)
    says what decode.scan_is_clean says: on every JPEG of the corpus, and on stray markers,
    restart markers, fill bytes and zero padding put into a clean file."""
    made, why = _jpeg_region.functions()
    if made is None:
        pytest.skip(f"no compiled libjpeg region decoder here: {why}")
    found = _jpeg_region.CompiledRegion(*made)
    files = [entry.path.read_bytes() for entry in small_corpus.values() if entry.path.exists()]
    files = [data for data in files if decode.is_jpeg(data)]
    clean = _pillow_jpeg(_photo(64, 80, 2), quality=90)
    start = clean.index(b"\xff\xda") + 14
    for at in (start + 5, len(clean) // 2, len(clean) - 3):
        for marker in (b"\xff\x01", b"\xff\xd3", b"\xff\xff", b"\xff\x00", b"\xff\xd9", b"\xff\xc4"):
            files.append(clean[:at] + marker + clean[at + 2 :])
    files += [clean, clean + b"\0\0\0", clean[:-2], clean[:40], b"\xff\xd8\xff"]
    outcomes = set()
    for data in files:
        want = decode.scan_is_clean(data)
        assert found.scan_is_clean(data) is want, data[:16]
        outcomes.add(want)
    assert outcomes == {True, False}


# --- decode(box=...) on every backend ---------------------------------------------------------


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    from data.make_corpus import build

    return {entry.name: entry for entry in build(tmp_path_factory.mktemp("crop-corpus"), huge=False)}


def _outcome(call):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's bomb and palette warnings: not what is tested
            return ("ok", np.array(call()))
    except Exception as exc:
        return ("raise", type(exc), str(exc))


@pytest.mark.parametrize("backend_name", ["auto", "opencv", "pil"])
def test_decode_box_is_the_whole_decode_cut_on_every_file(small_corpus, backend_name, fresh_decoders, monkeypatch):
    """Stock's pixels cut, or stock's exception, for every file: good, odd, corrupt, not JPEG."""
    monkeypatch.setenv(decode.DECODER_VARIABLE, backend_name)
    rng = np.random.default_rng(31)
    for name, entry in small_corpus.items():
        whole = _outcome(lambda entry=entry: decode.pil_decode(entry.path))
        if whole[0] == "raise":
            got = _outcome(lambda entry=entry: decode.decode(entry.path, box=(0, 0, 1, 1)))
            assert got == whole, name
            continue
        height, width = whole[1].shape[:2]
        for box in _boxes(height, width, rng, 4):
            got = _outcome(lambda entry=entry, box=box: decode.decode(entry.path, box=box))
            assert got[0] == "ok", (name, box, got)
            assert np.array_equal(got[1], _cut(whole[1], box)), (name, box)
        gray = decode.decode(entry.path, mode="L")
        box = (height // 4, width // 4, max(height // 2, 1), max(width // 2, 1))
        assert np.array_equal(decode.decode(entry.path, mode="L", box=box), _cut(gray, box)), name
        if decode.decode_fast(decode.read_bytes(entry.path)) is None:
            # Pillow decodes the whole file (at full size). A region above corrupt data decodes
            # without a warning, so with a DCT scale it may come back scaled: fast decode's pixels.
            continue
        min_size = ((height + 3) // 4, (width + 3) // 4)
        scaled = decode.decode(entry.path, min_size=min_size)
        for box in _boxes(height, width, rng, 3):
            got = decode.decode(entry.path, min_size=min_size, box=box)
            want = _cut(scaled, decode.scaled_box(box, (height, width), scaled.shape[:2]))
            assert np.array_equal(got, want), (name, box)


# --- the pipelines --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder tree: photo-like JPEGs of several kinds and sizes, one PNG."""
    root = tmp_path_factory.mktemp("crop-folder")
    (root / "a").mkdir()
    kinds = [
        ((375, 500), {"quality": 90, "subsampling": 2}),
        ((500, 375), {"quality": 75, "subsampling": 2}),
        ((161, 117), {"quality": 95, "subsampling": 0}),
        ((240, 321), {"quality": 88, "subsampling": 1}),
        ((300, 400), {"quality": 85, "progressive": True}),
        ((600, 800), {"quality": 80, "subsampling": 2}),
    ]
    for i, ((height, width), params) in enumerate(kinds):
        (root / "a" / f"{i}.jpg").write_bytes(_pillow_jpeg(_photo(height, width, 40 + i), **params))
    (root / "a" / "gray.jpg").write_bytes(_pillow_jpeg(_photo(200, 260, 9)[:, :, 0], quality=90))
    Image.fromarray(_photo(90, 120, 7)).save(root / "a" / "p.png")
    return root


def _pipeline(version: str):
    if version == "v1":
        from torchvision import transforms as T

        steps = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()]
        return T.Compose([*steps, T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )


def _samples(root, version: str, seed: int, rounds: int = 2):
    """Every image ``rounds`` times under one seed: the tensors and torch's RNG state after each."""
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(root), transform=_pipeline(version))
    torch.manual_seed(seed)
    out = []
    for _ in range(rounds):
        for index in range(len(dataset)):
            tensor, _ = dataset[index]
            out.append((tensor.numpy().copy(), torch.get_rng_state().numpy().copy()))
    return out


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("fast_decode", [False, True])
def test_pipelines_are_the_same_with_and_without_crop_decode(folder, version, fast_decode, fresh_decoders, monkeypatch):
    with nanopatch.unpatched():
        stock = _samples(folder, version, 7)
    regions = []

    def counting(original):
        def counted(self, data, factor, box, gray):
            got = original(self, data, factor, box, gray)
            regions.append(got is not None)
            return got

        return counted

    for kind in (decode._RegionDecoder, _jpeg_region.CompiledRegion):
        monkeypatch.setattr(kind, "decode", counting(kind.decode))
    outputs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(decode.CROP_DECODE_VARIABLE, switch)
        before = len(regions)
        with nanopatch.patched(training=False, fast_decode=fast_decode):
            outputs[switch] = _samples(folder, version, 7)
        if switch == "0" or decode.region_decoder() is None:
            assert len(regions) == before
        else:
            assert sum(regions[before:]) >= 10  # the baseline JPEGs were decoded by region
    std = np.asarray([0.229, 0.224, 0.225], np.float32)[:, None, None]
    for (with_crop, rng_a), (without, rng_b), (want, rng_stock) in zip(outputs["1"], outputs["0"], stock, strict=True):
        assert np.array_equal(with_crop, without)
        assert np.array_equal(rng_a, rng_stock) and np.array_equal(rng_b, rng_stock)  # the same draws as stock
        if not fast_decode:  # full-resolution pixels: stock's within one grey level
            grey = np.abs(with_crop - want) * std * 255
            assert grey.max() <= 1 + 1e-3 and grey.mean() <= 0.5


WORKER_SCRIPT = """
import functools, os, sys, torch, torchvision, nanopatch
import torchvision.transforms as T
from nanopatch.targets.vision import _jpeg_region, decode
nanopatch.patch_torch(training=False)

# A target transform: whether the worker that loads the sample had the compiled region decoder.
class Probe:
    def __call__(self, label):
        return torch.tensor([isinstance(decode.region_decoder(), _jpeg_region.CompiledRegion)])

def crop_decode(switch, worker_id):  # in the worker: a forkserver's workers get its own environment
    os.environ["NANOPATCH_CROP_DECODE"] = switch

def batches(root, method, switch):
    pipeline = T.Compose([T.RandomResizedCrop(48), T.ToTensor()])
    ds = torchvision.datasets.ImageFolder(root, transform=pipeline, target_transform=Probe())
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=2, multiprocessing_context=method,
        generator=torch.Generator().manual_seed(5), worker_init_fn=functools.partial(crop_decode, switch),
    )
    got = list(loader)
    return torch.cat([images for images, _ in got]), torch.cat([probe for _, probe in got])

if __name__ == "__main__":
    root = sys.argv[1]
    for method in ("fork", "spawn", "forkserver"):
        _jpeg_region._loaded.clear()  # never loaded here: each worker loads (or builds) it itself
        whole, probe_off = batches(root, method, "0")
        boxes, probe_on = batches(root, method, "1")
        assert torch.equal(boxes, whole), method
        assert probe_on.all() and not probe_off.any(), method
        print(method, "ok")
"""


@pytest.mark.py_only  # worker processes of each start method
def test_dataloader_workers_build_and_use_the_compiled_decoder(tmp_path):
    """DataLoader workers of every start method, from an empty cache folder (the first two build
    it at once), decode RandomResizedCrop's boxes with the compiled decoder: the same tensors as
    whole decodes cut, under the same seeds."""
    made, why = _jpeg_region.functions()
    if made is None and not os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE"):
        pytest.skip(f"no compiled libjpeg region decoder here: {why}")
    for cls in ("a", "b"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for i in range(3):
            pixels = _photo(90 + 17 * i, 120 - 9 * i, i + (cls == "b") * 3)
            (tmp_path / "images" / cls / f"{i}.jpg").write_bytes(_pillow_jpeg(pixels, quality=85, subsampling=2))
    run_in_workers(tmp_path, WORKER_SCRIPT, tmp_path / "images", "jpeg-region-*.so")
