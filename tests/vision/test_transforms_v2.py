"""torchvision.transforms.v2 under the vision patch: the PIL path on nanopatch's kernels, the same
random draws, types and memory layout as stock; tensors and multi-input calls stay stock."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms.v2 as v2
from PIL import Image
from torchvision import tv_tensors

import nanopatch
from nanopatch.targets.vision import datasets

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
LEVEL = 1 / 255 / min(STD) + 1e-6  # one grey level after Normalize


@pytest.fixture
def patched():
    nanopatch.patch_torch(training=False, fast_decode=False)
    yield
    nanopatch.unpatch_torch()


def photo(h: int, w: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = 3 if mode == "RGB" else 1
    steps = rng.integers(-6, 7, (h, w, channels))
    arr = np.clip(np.cumsum(steps, axis=1) + 128, 0, 255).astype(np.uint8)
    return Image.fromarray(arr if mode == "RGB" else arr[:, :, 0])


def pipelines() -> dict[str, v2.Compose]:
    tail = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return {
        "train": v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), *tail]),
        "val": v2.Compose([v2.Resize(256), v2.CenterCrop(224), *tail]),
        "pil-to-tensor": v2.Compose([v2.Resize((96, 80)), v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)]),
        "gray": v2.Compose([v2.RandomGrayscale(0.5), v2.Grayscale(3), v2.RandomVerticalFlip(), v2.ToImage()]),
        "uint8": v2.Compose([v2.CenterCrop(100), v2.ToImage()]),
        "jitter-alone": v2.Compose([v2.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.ToImage()]),
        "lambda": v2.Compose([v2.Resize(50), v2.Lambda(lambda img: img.rotate(90)), v2.ToImage()]),
        "crop-pad-blur": v2.Compose(
            [
                v2.RandomCrop(40, padding=[3, 5], pad_if_needed=True, fill=17, padding_mode="constant"),
                v2.Pad([2, 4, 6, 1], padding_mode="reflect"),
                v2.RandomApply([v2.GaussianBlur(5, sigma=(0.5, 2.0))], p=0.7),
                v2.RandomChoice([v2.RandomCrop(30, padding_mode="edge", pad_if_needed=True), v2.CenterCrop(28)]),
                v2.RandomOrder(
                    [v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(), v2.Pad(1, padding_mode="symmetric")]
                ),
                v2.ToImage(),
            ]
        ),
    }


#: No resampling step (crops, flips, grayscale, the colour kernels): stock's values exactly.
EXACT_PIPELINES = {"gray", "uint8", "jitter-alone"}


def build(stock: bool) -> dict[str, v2.Compose]:
    if stock:
        with nanopatch.unpatched():
            built = pipelines()
        assert all(type(p).__module__.startswith("torchvision.") for p in built.values())
        return built
    built = pipelines()
    assert all(type(p).__module__ == "nanopatch.targets.vision.transforms_v2" for p in built.values())
    return built


@pytest.mark.parametrize("size", [(375, 500), (451, 600), (33, 17), (240, 240)])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_pipelines_match_stock_in_values_types_and_layout(patched, size, mode):
    img = photo(*size, seed=size[0], mode=mode)
    stock, ours = build(stock=True), build(stock=False)
    for name in stock:
        for seed in range(3):
            torch.manual_seed(seed)
            expected = stock[name](img)
            torch.manual_seed(seed)
            got = ours[name](img)
            assert type(got) is type(expected), name
            assert got.shape == expected.shape and got.dtype == expected.dtype, name
            assert got.stride() == expected.stride() or got.shape[0] == 1, name
            diff = (got.float() - expected.float()).abs()
            tolerance = LEVEL if got.is_floating_point() and name in ("train", "val") else 1 / 255 + 1e-6
            if not got.is_floating_point():
                tolerance = 1
            if name in EXACT_PIPELINES:
                tolerance = 0
            assert diff.max().item() <= tolerance, (name, seed, diff.max().item())
            assert diff.mean().item() <= 0.5 * tolerance + 1e-9, name


def test_random_stream_stays_in_sync_over_many_calls(patched):
    img = photo(300, 400, seed=3)
    stock, ours = build(stock=True)["train"], build(stock=False)["train"]
    torch.manual_seed(11)
    expected = [stock(img) for _ in range(12)]
    after_stock = torch.rand(1)
    torch.manual_seed(11)
    got = [ours(img) for _ in range(12)]
    assert torch.equal(torch.rand(1), after_stock)
    for a, b in zip(expected, got, strict=True):
        assert (a - b).abs().max().item() <= LEVEL


def test_a_lone_transform_keeps_the_pil_type(patched):
    img = photo(120, 90, seed=5)
    for make, tolerance in (
        (lambda: v2.Resize(64), 1),
        (lambda: v2.CenterCrop(50), 0),
        (lambda: v2.RandomHorizontalFlip(1.0), 0),
    ):
        with nanopatch.unpatched():
            stock = make()
        ours = make()
        assert type(ours).__module__ == "nanopatch.targets.vision.transforms_v2"
        expected, got = stock(img), ours(img)
        assert isinstance(got, Image.Image) and got.mode == expected.mode and got.size == expected.size
        assert np.abs(np.asarray(got, dtype=int) - np.asarray(expected, dtype=int)).max() <= tolerance


def test_tensors_and_multi_input_calls_run_stock_code(patched):
    image = tv_tensors.Image(torch.randint(0, 256, (3, 64, 80), dtype=torch.uint8))
    boxes = tv_tensors.BoundingBoxes([[5, 5, 40, 30]], format="XYXY", canvas_size=(64, 80))
    with nanopatch.unpatched():
        stock = v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip()])
    ours = v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip()])
    for inputs in ((image,), (image, boxes), ({"image": image, "boxes": boxes},)):
        torch.manual_seed(0)
        expected = stock(*inputs)
        torch.manual_seed(0)
        got = ours(*inputs)
        flat_expected = torch.utils._pytree.tree_flatten(expected)[0]
        flat_got = torch.utils._pytree.tree_flatten(got)[0]
        for a, b in zip(flat_expected, flat_got, strict=True):
            assert type(a) is type(b) and torch.equal(a, b)
    array = np.zeros((10, 10, 3), np.uint8)  # not an image to v2: stock's error either way
    with pytest.raises(TypeError, match="No image"):
        stock(array)
    with pytest.raises(TypeError, match="No image"):
        ours(array)


def test_errors_are_stocks(patched):
    rgba = photo(40, 40, seed=1).convert("RGBA")
    with nanopatch.unpatched():
        stock = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
        with pytest.raises(Exception) as stock_error:
            stock(rgba)  # 4 channels, 3 means
    ours = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    with pytest.raises(type(stock_error.value)):
        ours(rgba)
    zero_std = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, [0.2, 0.0, 0.2])])
    with pytest.raises(ValueError):
        zero_std(photo(8, 8, seed=2))
    with pytest.raises(TypeError):
        v2.Normalize(MEAN, STD)(photo(8, 8, seed=2))  # stock refuses PIL images too


def test_repr_pickle_and_classes(patched):
    for make in (lambda: v2.RandomResizedCrop(224, scale=(0.3, 1.0)), lambda: v2.ColorJitter(0.2, hue=0.1)):
        with nanopatch.unpatched():
            stock = make()
        ours = make()
        assert repr(ours) == repr(stock)
        assert isinstance(ours, type(stock))
        clone = pickle.loads(pickle.dumps(ours))
        assert type(clone) is type(ours) and repr(clone) == repr(ours)
    assert torchvision.transforms.v2.Resize is v2.Resize
    nanopatch.unpatch_torch()
    assert v2.Resize.__module__ == "torchvision.transforms.v2._geometry"
    nanopatch.patch_torch(training=False, fast_decode=False)


def test_image_folder_hands_v2_pipelines_the_file(patched, tmp_path):
    for i, size in enumerate([(375, 500), (451, 600)]):
        (tmp_path / "c").mkdir(exist_ok=True)
        photo(*size, seed=i).save(tmp_path / "c" / f"{i}.jpg", quality=90)
    ours = torchvision.datasets.ImageFolder(tmp_path, transform=build(stock=False)["train"])
    with nanopatch.unpatched():
        stock = torchvision.datasets.ImageFolder(tmp_path, transform=build(stock=True)["train"])
    seen = []
    probe = v2.Compose([v2.Lambda(lambda x: seen.append(type(x)) or x)])
    assert datasets.accepts_encoded(ours.transform) and datasets.accepts_encoded(probe)
    for i in range(len(stock)):
        torch.manual_seed(i)
        expected = stock[i][0]
        torch.manual_seed(i)
        got = ours[i][0]
        assert type(got) is type(expected) and (got - expected).abs().max().item() <= LEVEL
    ours.transform = probe
    ours[0]
    assert seen == [Image.Image] or issubclass(seen[0], Image.Image)  # a Lambda sees what stock passes


def test_fused_table_follows_changed_normalize_settings(patched):
    img = photo(12, 10, seed=9)
    norm = v2.Normalize(MEAN, STD)
    ours = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), norm])
    with nanopatch.unpatched():
        stock_norm = v2.Normalize(MEAN, STD)
        stock = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), stock_norm])
    assert torch.equal(ours(img), stock(img))
    norm.mean = stock_norm.mean = [0.1, 0.2, 0.3]  # changed after first use: a new table
    assert torch.equal(ours(img), stock(img))
