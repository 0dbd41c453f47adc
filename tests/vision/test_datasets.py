"""torchvision datasets under the vision patch: stock types for stock transforms, the undecoded
file (or the raw array) for a nanopatch pipeline, and DataLoader workers in every start method."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

import nanopatch
from nanopatch.targets.vision import datasets, decode

from conftest import run_python


class EncodedProbe:
    """The receiving side of the hand-off, as a nanopatch pipeline implements it: records what
    it was given, decodes at the scale it needs and returns a tensor."""

    __nanopatch_accepts_encoded__ = True

    def __init__(self, min_size=None):
        self.min_size = min_size
        self.seen = []

    def __call__(self, sample):
        self.seen.append(sample)
        if isinstance(sample, datasets.EncodedImage):
            sample = sample.decode(min_size=self.min_size)
        elif isinstance(sample, datasets.DecodedImage):
            sample = sample.array
        return torch.from_numpy(np.array(sample))


@pytest.fixture
def image_folder(corpus, tmp_path):
    """An ImageFolder tree of the corpus's good images (JPEGs of every kind, PNGs, WebP...)."""
    picks = {
        "jpegs": ["jpeg-420-baseline", "jpeg-444-progressive", "jpeg-gray", "jpeg-cmyk", "jpeg-uppercase-ext"],
        "others": ["png-rgba", "png-palette", "webp-lossy", "bmp-rgb24", "jpeg-exif-orientation-6"],
    }
    for cls, names in picks.items():
        (tmp_path / cls).mkdir()
        for name in names:
            src = corpus[name].path
            shutil.copy(src, tmp_path / cls / src.name)
    return tmp_path


@pytest.fixture
def vision_patched():
    import torchvision.datasets  # noqa: F401  (the target applies at once)

    with nanopatch.patched():
        assert nanopatch.status()["targets"]["vision"]["state"] == "patched"
        yield


def test_image_folder_returns_stock_pil_images(image_folder, vision_patched):
    patched = torchvision.datasets.ImageFolder(image_folder)
    with nanopatch.unpatched():
        stock = torchvision.datasets.ImageFolder(image_folder)
        expected = [stock[i] for i in range(len(stock))]
    assert len(patched) == len(stock) == 10
    for i, (img, target) in enumerate(expected):
        got, got_target = patched[i]
        assert isinstance(got, Image.Image) and got.mode == "RGB" and got.size == img.size
        assert got_target == target
        assert np.array_equal(np.asarray(got), np.asarray(img)), patched.samples[i][0]


def test_image_folder_with_stock_transforms_gives_stock_tensors(image_folder, vision_patched):
    with nanopatch.unpatched():  # stock classes: the dataset must hand them what stock does
        transform = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])
    assert type(transform).__module__.startswith("torchvision.")
    patched = torchvision.datasets.ImageFolder(image_folder, transform=transform)
    with nanopatch.unpatched():
        stock = torchvision.datasets.ImageFolder(image_folder, transform=transform)
        expected = [stock[i][0] for i in range(len(stock))]
    for i, tensor in enumerate(expected):
        assert torch.equal(patched[i][0], tensor)


def test_nanopatch_pipeline_gets_the_undecoded_file(image_folder, vision_patched, corpus):
    probe = EncodedProbe(min_size=(20, 20))
    patched = torchvision.datasets.ImageFolder(image_folder, transform=probe)
    with nanopatch.unpatched():
        stock = torchvision.datasets.ImageFolder(image_folder)
        stock_images = [stock[i][0] for i in range(len(stock))]
    for i, stock_img in enumerate(stock_images):
        tensor, _ = patched[i]
        encoded = probe.seen[-1]
        assert isinstance(encoded, datasets.EncodedImage)
        assert encoded.path == patched.samples[i][0]
        assert encoded.size == stock_img.size  # full-resolution size, from the header
        full = encoded.decode()
        assert np.array_equal(full, np.asarray(stock_img))
        to_pil = encoded.to_pil()
        assert to_pil.mode == "RGB" and np.array_equal(np.asarray(to_pil), np.asarray(stock_img))
        assert tensor.shape[0] >= 20 and tensor.shape[1] >= 20
        assert pickle.loads(pickle.dumps(encoded)).decode().shape == full.shape
    # the 256x192 4:2:0 JPEG decodes DCT-scaled (1/8 gives 32x24, still >= 20x20)
    jpeg = next(i for i, (p, _) in enumerate(patched.samples) if p.endswith("jpeg-420-baseline.jpg"))
    assert tuple(patched[jpeg][0].shape) == (24, 32, 3)


def test_no_hand_off_when_it_would_change_what_the_user_asked_for(image_folder, vision_patched):
    probe = EncodedProbe()
    custom = torchvision.datasets.ImageFolder(
        image_folder, transform=probe, loader=lambda p: Image.open(p).convert("L")
    )
    custom[0]
    assert isinstance(probe.seen[-1], Image.Image) and probe.seen[-1].mode == "L"  # their loader ran
    with nanopatch.unpatched():
        unpatched = torchvision.datasets.ImageFolder(image_folder, transform=probe)
        unpatched[0]
    assert isinstance(probe.seen[-1], Image.Image)  # no patch, no hand-off
    no_transform = torchvision.datasets.ImageFolder(image_folder)
    assert isinstance(no_transform[0][0], Image.Image)


def test_encoded_image_from_bytes_and_bad_files(corpus):
    data = corpus["png-palette"].path.read_bytes()
    encoded = datasets.EncodedImage(data=data)
    with Image.open(corpus["png-palette"].path) as img:
        assert encoded.size == img.size
        assert np.array_equal(encoded.decode(), np.asarray(img.convert("RGB")))
        assert np.array_equal(encoded.decode(mode="L"), np.asarray(img.convert("L")))
    assert pickle.loads(pickle.dumps(encoded)).size == encoded.size
    from PIL import UnidentifiedImageError

    with pytest.raises(UnidentifiedImageError):
        _ = datasets.EncodedImage(corpus["text-jpg"].path).size
    with pytest.raises(OSError, match="truncated"):
        datasets.EncodedImage(corpus["jpeg-truncated"].path).decode()
    with pytest.raises(FileNotFoundError):
        datasets.EncodedImage(corpus["missing"].path).decode()
    with pytest.raises(TypeError):
        datasets.EncodedImage()


def test_pil_loader_works_without_the_patch(corpus):
    """A pickled reference to nanopatch's loader may reach an unpatched worker process."""
    path = corpus["jpeg-420-baseline"].path
    with nanopatch.unpatched():
        img = datasets.pil_loader(path)
        with Image.open(path) as stock:
            assert np.array_equal(np.asarray(img), np.asarray(stock.convert("RGB")))
        with pytest.raises(OSError):
            datasets.pil_loader(corpus["jpeg-truncated"].path)


# --- in-memory datasets ----------------------------------------------------------------------


def make_in_memory(name):
    """A real dataset class instance with small generated data (the constructors only load files;
    __getitem__, which is what the patch replaces, runs for real)."""
    rng = np.random.default_rng(7)
    cls = getattr(torchvision.datasets, name)
    ds = cls.__new__(cls)
    ds.transform = ds.target_transform = None
    if name in ("CIFAR10", "CIFAR100"):
        ds.data = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
        ds.targets = [3, 1, 4, 1]
    elif name in ("MNIST", "FashionMNIST", "QMNIST"):
        ds.data = torch.from_numpy(rng.integers(0, 256, (4, 28, 28), dtype=np.uint8))
        ds.targets = torch.tensor([[5, 0], [2, 1], [7, 2], [9, 3]]) if name == "QMNIST" else torch.tensor([5, 2, 7, 9])
        ds.compat = True
    else:  # SVHN, STL10: CHW storage
        ds.data = rng.integers(0, 256, (4, 3, 24, 24), dtype=np.uint8)
        ds.labels = np.array([1, 2, 3, 4])
    return ds


IN_MEMORY = ["CIFAR10", "CIFAR100", "MNIST", "FashionMNIST", "QMNIST", "SVHN", "STL10"]


@pytest.mark.parametrize("name", IN_MEMORY)
def test_in_memory_datasets_skip_the_pil_detour_for_pipelines_only(name, vision_patched):
    ds = make_in_memory(name)
    with nanopatch.unpatched():
        stock = [ds[i] for i in range(4)]  # PIL images, stock targets
        ds.transform = T.ToTensor()
        stock_tensors = [ds[i][0] for i in range(4)]
    ds.transform = None
    for i, (img, target) in enumerate(stock):
        got, got_target = ds[i]
        assert isinstance(got, Image.Image) and got.mode == img.mode and got_target == target
    ds.transform = T.ToTensor()
    for i, tensor in enumerate(stock_tensors):
        assert torch.equal(ds[i][0], tensor)
    probe = EncodedProbe()
    ds.transform = probe
    ds.target_transform = lambda t: ("target", t)
    for i, (img, target) in enumerate(stock):
        _, got_target = ds[i]
        assert isinstance(probe.seen[-1], datasets.DecodedImage)
        raw = probe.seen[-1].array
        assert isinstance(raw, np.ndarray) and raw.dtype == np.uint8
        assert np.array_equal(raw, np.asarray(img))  # HWC RGB, or HW for the "L" datasets
        assert not raw.flags.writeable  # the pipeline cannot scribble on the dataset
        assert np.array_equal(np.asarray(probe.seen[-1].to_pil()), np.asarray(img))
        assert got_target == ("target", target)


def test_torchvision_io_is_left_stock_and_agrees_with_the_decoder(corpus, vision_patched):
    """torchvision.io already decodes with its own libjpeg-turbo at the same speed (see the
    closing note of the Vision I/O issue), so nanopatch leaves it alone; its pixels agree with
    nanopatch's decoder on every JPEG it can read, so mixing the two is safe."""
    import torchvision.io as tio

    assert tio.decode_jpeg.__module__.startswith("torchvision")
    for name in ["jpeg-420-baseline", "jpeg-422-progressive", "jpeg-444-baseline", "jpeg-420-odd-161x117"]:
        path = corpus[name].path
        ours = decode.decode(path)
        theirs = tio.decode_jpeg(tio.read_file(str(path))).permute(1, 2, 0).numpy()
        assert np.array_equal(ours, theirs), name


# --- DataLoader workers ----------------------------------------------------------------------

WORKER_SCRIPT = """
import sys, torch, torchvision, nanopatch
import torchvision.transforms as T
nanopatch.patch_torch()

# A target transform: what the worker that loads the sample runs with (the images keep their own
# transform, whose decode nanopatch fuses; one loader per start method, since each spawned worker
# imports torch, torchvision and nanopatch again).
class Probe:
    def __call__(self, label):
        import cv2
        from nanopatch.targets.vision import decode
        return torch.tensor([cv2.getNumThreads(), decode.jpeg_backend() is not None])

if __name__ == "__main__":
    root = sys.argv[1]
    with nanopatch.unpatched():
        ds = torchvision.datasets.ImageFolder(root, transform=T.Compose([T.CenterCrop(16), T.ToTensor()]))
        expected = torch.stack([ds[i][0] for i in range(len(ds))])
    for method in ("fork", "spawn", "forkserver"):
        transform = T.Compose([T.CenterCrop(16), T.ToTensor()])
        ds = torchvision.datasets.ImageFolder(root, transform=transform, target_transform=Probe())
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=method)
        batches = list(loader)
        assert torch.equal(torch.cat([images for images, _ in batches]), expected), method
        stats = torch.cat([probe for _, probe in batches])
        assert (stats[:, 0] == 1).all(), (method, stats)  # one OpenCV thread per worker
        assert (stats[:, 1] == 1).all(), (method, stats)  # the fast decoder is in use there
        print(method, "ok")
"""


@pytest.mark.py_only  # worker processes of each start method (test_transforms_api's fork and spawn run everywhere)
def test_decoding_in_dataloader_workers_of_every_start_method(image_folder, tmp_path):
    script = tmp_path / "workers.py"
    script.write_text(WORKER_SCRIPT)
    from conftest import child_env

    env = child_env(NANOPATCH_DECODER="opencv")  # the backend that uses OpenCV's thread pool
    proc = run_python([str(script), str(image_folder)], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fork", "ok", "spawn", "ok", "forkserver", "ok"]
