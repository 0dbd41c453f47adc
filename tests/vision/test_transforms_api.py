"""nanopatch's torchvision.transforms (v1) classes as API: what user code can see besides pixels.

* Every replaced class has stock's constructor signature, repr, docstring and name, is an
  instance of the stock class, pickles and deep-copies (``torch.jit.script``: see
  test_scripting.py).
* Bad arguments fail the way stock's fail: the same warning or exception type, at construction
  or at call as stock, also on the fused ToTensor + Normalize path inside a Compose.
* Inputs nanopatch does not take (tensors, other PIL modes, float arrays) get stock's result; a
  user's uint8 ndarray gets stock's outcome (its TypeError, or its result), see
  test_ndarray_inputs.py.
* Every import style sees the accelerated class after ``patch_torch()`` (DESIGN.md section 3),
  ``unpatch_torch()`` restores stock's classes by identity, a name bound before the patch stays
  stock (and ``status()`` says so); checked in fresh interpreters.
* DataLoader workers started by fork and spawn give stock's batches for the same loader seed.
"""

from __future__ import annotations

import copy
import inspect
import pickle
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import nanopatch

from conftest import run_python
from helpers import transform_cases as tc
from helpers import vision_examples as ex
from helpers.transform_cases import R, Recipe

NORMALIZE = ex.NORMALIZE
#: One construction per replaced class, with arguments away from the defaults.
EXAMPLES: dict[str, Recipe] = ex.V1

#: Where torchvision defines each class.
AUTOAUGMENT = {"AutoAugment", "RandAugment", "TrivialAugmentWide"}


@pytest.fixture
def patched():
    import torchvision.datasets  # noqa: F401 - the vision target applies at once

    with nanopatch.patched(training=False):
        yield


def build(name: str):
    """(stock, ours) for EXAMPLES[name], never stock twice."""
    recipe = EXAMPLES[name]
    stock, ours = recipe.build(stock=True), recipe.build(stock=False)
    assert type(ours).__module__ == "nanopatch.targets.vision.transforms" and not type(stock).__module__.startswith(
        "nano"
    )
    return stock, ours


def sample(name: str):
    """An input EXAMPLES[name] takes: a tensor for Normalize, else a PIL image."""
    img = tc.ImageSpec(47, 61, "RGB", "smooth", seed=3).pil()
    if name == "Normalize":
        return T.functional.to_tensor(img)
    return img


def same_output(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, Image.Image):
        return isinstance(b, Image.Image) and a.mode == b.mode and np.array_equal(np.asarray(a), np.asarray(b))
    return type(a) is type(b) and np.array_equal(a, b)


def behaves_alike(first, second, name: str, seeds=(0, 1, 2, 3)) -> None:
    """The two objects give identical results under the same seeds (ours against ours)."""
    for seed in seeds:
        a, b = tc.run(first, sample(name), seed), tc.run(second, sample(name), seed)
        assert a.error is None and b.error is None, (a.error, b.error)
        assert same_output(a.value, b.value), (name, seed)
        assert torch.equal(a.torch_state, b.torch_state) and a.random_state == b.random_state


# --- the class as API --------------------------------------------------------------------------


@pytest.mark.parametrize("name", tc.REPLACED)
def test_class_api_matches_stock(name, patched):
    stock, ours = build(name)
    ours_cls, stock_cls = type(ours), type(stock)
    assert ours_cls._nanopatch_stock is stock_cls
    assert isinstance(ours, stock_cls) and issubclass(ours_cls, stock_cls)
    assert inspect.signature(ours_cls) == inspect.signature(stock_cls)
    assert ours_cls.__name__ == stock_cls.__name__ and ours_cls.__qualname__ == stock_cls.__qualname__
    assert repr(ours) == repr(stock)
    if isinstance(stock, torch.nn.Module):
        assert list(ours.state_dict()) == list(stock.state_dict())
        assert [type(m).__name__ for m in ours.modules()] == [type(m).__name__ for m in stock.modules()]
        assert ours.training == stock.training


def test_docstrings_are_stocks(patched):
    """``help(torchvision.transforms.Resize)`` after the patch: still torchvision's documentation
    (a class's ``__doc__`` is not inherited, so a subclass without one shows nothing)."""
    differ = []
    for name in tc.REPLACED:
        stock, ours = build(name)
        if type(ours).__doc__ != type(stock).__doc__:
            differ.append(f"{name}: {(type(ours).__doc__ or 'None').strip().splitlines()[0][:60]!r}")
    assert not differ, "__doc__ differs from stock's:\n" + "\n".join(differ)


@pytest.mark.parametrize("name", tc.REPLACED)
def test_pickle_and_deepcopy(name, patched):
    _, ours = build(name)
    tc.run(ours, sample(name), 0)  # a used object (a Compose has planned its steps) pickles too
    for clone in (pickle.loads(pickle.dumps(ours)), copy.deepcopy(ours), copy.copy(ours)):
        assert type(clone) is type(ours) and repr(clone) == repr(ours)
        behaves_alike(ours, clone, name)
    # an object pickled while patched still loads (and works) after unpatch_torch()
    data = pickle.dumps(ours)
    with nanopatch.unpatched():
        loaded = pickle.loads(data)
        assert type(loaded) is type(ours)
        behaves_alike(ours, loaded, name, seeds=(5,))


# --- bad arguments -----------------------------------------------------------------------------


def outcomes(recipe: Recipe, value, *, seed: int = 0):
    """(ours, stock) outcomes of ``recipe`` on ``value``: built and called the same way."""
    stock, ours = recipe.build(stock=True), recipe.build(stock=False)
    return tc.run(ours, value, seed), tc.run(stock, value, seed)


def assert_same_failure(recipe: Recipe, value, expected: type[BaseException]):
    """Ours raises ``expected`` where stock does."""
    ours = tc.run(recipe.build(stock=False), value, 0)
    stock = tc.run(recipe.build(stock=True), value, 0)
    assert isinstance(stock.error, expected), f"stock: {stock.error!r}"  # the premise
    assert type(ours.error) is type(stock.error), f"{recipe!r}: ours raised {ours.error!r}, stock {stock.error!r}"


def rgb(h=40, w=50):
    return tc.ImageSpec(h, w, "RGB", "smooth", seed=h * w).pil()


@pytest.mark.filterwarnings("ignore:Scale and ratio should be of kind")
def test_random_resized_crop_with_scale_upside_down_warns_as_stock(patched):
    for state in (nanopatch.unpatched(), nanopatch.patched(training=False)):
        with state, pytest.warns(UserWarning, match="Scale and ratio should be of kind"):
            T.RandomResizedCrop(224, scale=(1.0, 0.5))
    img = rgb()
    # at call stock's get_params raises; on an ndarray, stock's TypeError comes first
    for value, expected in [(img, RuntimeError), (np.asarray(img), TypeError)]:
        assert_same_failure(R("RandomResizedCrop", 224, scale=(1.0, 0.5)), value, expected)


@pytest.mark.parametrize("size", [-1, 0, (0, 3), (-5, 10)])
def test_resize_to_a_size_below_one_raises_stocks_value_error(size, patched):
    """Stock's constructor accepts these, its call on a PIL image raises ValueError ("height and
    width must be > 0", from Pillow); ours too, rather than a NotImplementedError from a kernel
    that declines a non-positive size escaping Resize."""
    img = rgb()
    for value, expected in [(img, ValueError), (np.asarray(img), TypeError)]:
        assert_same_failure(R("Resize", size), value, expected)
        assert_same_failure(R("Compose", [R("Resize", size), R("ToTensor")]), value, expected)


@pytest.mark.parametrize("mode", tc.ALL_MODES, ids=lambda m: m.name)
def test_resize_without_antialias_warns_as_often_as_stock(mode, patched):
    """Stock warns once that antialias=False is ignored for a PIL image; ours too, also for an
    interpolation its kernel lacks (NEAREST_EXACT): Resize hands that to stock's code, which
    warns, so Resize must not warn first."""
    img = rgb(262, 339)
    for recipe in [
        R("Resize", 64, interpolation=mode, antialias=False),
        R("Compose", [R("Resize", 64, interpolation=mode, antialias=False)]),
    ]:
        ours, stock = outcomes(recipe, img)
        assert ours.error is None and stock.error is None
        assert ours.warnings == stock.warnings, (
            f"{recipe!r}: {len(ours.warnings)} warnings, stock {len(stock.warnings)}"
        )


def test_resize_max_size_errors_are_stocks(patched):
    img = rgb()
    tensor = T.functional.pil_to_tensor(img)
    # on an ndarray stock raises TypeError, or ValueError where it checks the arguments first
    for value, expected in [(img, ValueError), (np.asarray(img), Exception), (tensor, ValueError)]:
        assert_same_failure(R("Resize", 32, max_size=32), value, expected)
        assert_same_failure(R("Resize", 32, max_size=20), value, expected)
        assert_same_failure(R("Resize", (32, 40), max_size=50), value, expected)
        assert_same_failure(R("Compose", [R("Resize", [32], max_size=31)]), value, expected)


def test_normalize_with_a_zero_std_raises_value_error_also_when_fused(patched):
    bad = {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.0, 0.2]}
    img = rgb()
    assert_same_failure(R("Normalize", **bad), T.functional.to_tensor(img), ValueError)
    fused = R("Compose", [R("ToTensor"), R("Normalize", **bad)])  # ToTensor + Normalize run as one step
    assert_same_failure(fused, img, ValueError)
    assert_same_failure(fused, np.asarray(img), ValueError)
    pil_fused = R("Compose", [R("PILToTensor"), R("ConvertImageDtype", torch.float32), R("Normalize", **bad)])
    assert_same_failure(pil_fused, img, ValueError)
    assert_same_failure(R("Compose", [R("ToTensor"), R("Normalize", mean=[0.5], std=[0])]), img, ValueError)


def test_normalize_with_three_values_on_a_grey_image_fails_as_stock(patched):
    grey = tc.ImageSpec(30, 20, "L", "smooth", seed=1).pil()
    pipeline = R("Compose", [R("ToTensor"), NORMALIZE])
    ours, stock = outcomes(pipeline, grey)
    assert stock.error is not None and type(ours.error) is type(stock.error), (ours.error, stock.error)
    ours, stock = outcomes(pipeline, np.asarray(grey))
    assert type(ours.error) is type(stock.error)
    # and the other way round: one value broadcasts over three channels, as in stock
    ours, stock = outcomes(R("Compose", [R("ToTensor"), R("Normalize", mean=[0.5], std=[0.25])]), rgb())
    assert ours.error is None and torch.equal(ours.value, stock.value)


def test_type_errors_are_stocks(patched):
    img = rgb()
    tensor = T.functional.pil_to_tensor(img)
    assert_same_failure(R("ToTensor"), tensor, TypeError)
    assert_same_failure(R("Compose", [R("ToTensor"), NORMALIZE]), tensor, TypeError)
    assert_same_failure(R("PILToTensor"), np.asarray(img), TypeError)
    assert_same_failure(R("Compose", [R("PILToTensor")]), np.asarray(img), TypeError)
    assert_same_failure(
        R("Compose", [R("PILToTensor"), R("ConvertImageDtype", torch.float32), NORMALIZE]), np.asarray(img), TypeError
    )
    assert_same_failure(R("Normalize", mean=[0.5], std=[0.5]), img, TypeError)
    assert_same_failure(R("Normalize", mean=[0.5], std=[0.5]), np.asarray(img, dtype=np.float32), TypeError)
    assert_same_failure(R("Resize", 10), "not an image", TypeError)


def test_random_crop_larger_than_the_image_raises_value_error(patched):
    img = rgb(20, 30)
    for value, expected in [
        (img, ValueError),
        (np.asarray(img), TypeError),
        (T.functional.pil_to_tensor(img), ValueError),
    ]:
        assert_same_failure(R("RandomCrop", 25), value, expected)
        assert_same_failure(R("RandomCrop", (10, 31)), value, expected)
        assert_same_failure(R("Compose", [R("RandomCrop", 25), R("ToTensor")]), value, expected)
    # with enough padding it fits, as in stock
    ours, stock = outcomes(R("Compose", [R("RandomCrop", 25, padding=3)]), img)
    assert ours.error is None and np.array_equal(np.asarray(ours.value), np.asarray(stock.value))


def test_constructor_errors_are_stocks(patched):
    cases = [
        (lambda: T.ColorJitter(hue=0.6), ValueError),
        (lambda: T.ColorJitter(brightness=-0.1), ValueError),
        (lambda: T.Resize(2.5), TypeError),
        (lambda: T.Resize((1, 2, 3)), ValueError),
        (lambda: T.Resize({1, 2}), TypeError),
        (lambda: T.GaussianBlur(4), ValueError),
        (lambda: T.RandomRotation(-5), ValueError),
        (lambda: T.RandomAffine(0, translate=(2.0, 0.0)), ValueError),
        (lambda: T.Pad(2, padding_mode="wrap"), ValueError),
        (lambda: T.RandomChoice([T.RandomHorizontalFlip()], p=0.5), TypeError),
        (lambda: T.RandomOrder(T.RandomHorizontalFlip()), TypeError),
        (lambda: T.RandAugment(magnitude=40, num_magnitude_bins=31), None),  # accepted, fails at call
    ]
    for make, expected in cases:
        with nanopatch.unpatched():
            try:
                make()
                stock_error = None
            except Exception as exc:
                stock_error = exc
        try:
            make()
            ours_error = None
        except Exception as exc:
            ours_error = exc
        assert type(ours_error) is type(stock_error), (ours_error, stock_error)
        if expected is not None:
            assert isinstance(stock_error, expected), stock_error


def test_a_float64_default_dtype_gives_stocks_float64_tensors(patched):
    img = rgb()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for recipe in [R("ToTensor"), R("Compose", [R("CenterCrop", 20), R("ToTensor"), NORMALIZE])]:
            ours, stock = outcomes(recipe, img)
            assert ours.value.dtype == stock.value.dtype == torch.float64
            assert torch.equal(ours.value, stock.value)
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("mode", ["RGBA", "P", "1", "I", "F", "LA", "CMYK", "I;16"])
def test_other_pil_modes_get_stocks_result(mode, patched):
    """nanopatch takes "L" and "RGB"; any other mode runs stock's code, so gives stock's result."""
    img = (
        rgb(24, 30).convert(mode)
        if mode != "I;16"
        else Image.fromarray(np.arange(720, dtype=np.uint16).reshape(24, 30))
    )
    for recipe in [
        R("Resize", 17),
        R("RandomHorizontalFlip", p=1.0),
        R("CenterCrop", 20),
        R("ToTensor"),
        R("PILToTensor"),
        R("Compose", [R("RandomResizedCrop", 16), R("RandomHorizontalFlip"), R("ToTensor")]),
        R("Compose", [R("Pad", 2), R("ToTensor"), R("Normalize", mean=[0.5], std=[0.5])]),
    ]:
        ours, stock = outcomes(recipe, img, seed=3)
        assert type(ours.error) is type(stock.error), (recipe, ours.error, stock.error)
        if stock.error is None:
            assert same_output(ours.value, stock.value), recipe


def test_tensors_and_other_arrays_get_stocks_result(patched):
    img = rgb()
    inputs = [
        T.functional.pil_to_tensor(img),  # uint8 CHW
        T.functional.to_tensor(img),  # float CHW
        T.functional.pil_to_tensor(img)[None].expand(2, -1, -1, -1),  # a batch
        np.asarray(img).astype(np.float32) / 255,  # float HWC: ToTensor keeps floats, as stock
        np.zeros((5, 6, 4), np.uint8),  # four channels
    ]
    for value in inputs:
        for recipe in [R("ToTensor"), R("RandomHorizontalFlip", p=1.0), R("Resize", 20), R("CenterCrop", 10)]:
            ours, stock = outcomes(recipe, value)
            assert type(ours.error) is type(stock.error), (recipe, type(value), ours.error, stock.error)
            if stock.error is None:
                assert same_output(ours.value, stock.value), (recipe, type(value))


def test_compose_notices_when_its_steps_change(patched):
    """A Compose plans its steps once; replacing, appending or reconfiguring a step afterwards
    must still give what stock's gives."""
    recipe = R("Compose", [R("CenterCrop", 30), R("ToTensor"), NORMALIZE])
    stock, ours = recipe.build(stock=True), recipe.build(stock=False)
    img = rgb()
    assert torch.equal(ours(img), stock(img))
    for compose in (stock, ours):
        compose.transforms[0].size = (12, 14)
        compose.transforms[2].mean = [0.1, 0.2, 0.3]
    assert torch.equal(ours(img), stock(img))
    stock.transforms.insert(0, type(stock.transforms[0])(20))
    ours.transforms.insert(0, T.CenterCrop(20))
    assert torch.equal(ours(img), stock(img))
    stock.transforms[-1] = type(stock.transforms[-1])([0.5], [0.5])
    ours.transforms[-1] = T.Normalize([0.5], [0.5])
    assert torch.equal(ours(img), stock(img))
    stock.transforms.pop()
    ours.transforms.pop()
    assert torch.equal(ours(img), stock(img))


# --- import styles (fresh interpreters) --------------------------------------------------------

NAMES = repr(tc.REPLACED)
AUTO_NAMES = repr(sorted(AUTOAUGMENT))

PATCH_FIRST = f"""
import sys
import nanopatch
assert "torchvision" not in sys.modules
nanopatch.patch_torch(training=False)
import torchvision  # imported only after patch_torch(): the post-import hook patches it
import torchvision.transforms as T
import torchvision.transforms.transforms as TT
from torchvision.transforms import autoaugment as AA
from torchvision.transforms import Resize
names, auto = {NAMES}, {AUTO_NAMES}
for name in names:
    ours = getattr(T, name)
    assert ours.__module__ == "nanopatch.targets.vision.transforms", (name, ours)
    assert getattr(torchvision.transforms, name) is ours
    assert getattr(AA if name in auto else TT, name) is ours, name
assert Resize is T.Resize
assert type(T.Resize(8)).__module__ == "nanopatch.targets.vision.transforms"
stock = {{name: getattr(T, name)._nanopatch_stock for name in names}}
nanopatch.unpatch_torch()
for name in names:
    assert getattr(T, name) is stock[name], name
    assert getattr(AA if name in auto else TT, name) is stock[name], name
    assert stock[name].__module__.startswith("torchvision.transforms"), stock[name]
nanopatch.patch_torch(training=False)
assert T.Resize.__module__ == "nanopatch.targets.vision.transforms" and T.Resize._nanopatch_stock is stock["Resize"]
nanopatch.unpatch_torch()
nanopatch.unpatch_torch()  # twice: a no-op
assert T.Resize is stock["Resize"]
print("patch-first ok")
"""

IMPORT_FIRST = f"""
import torchvision
import torchvision.transforms as T
import torchvision.transforms.transforms as TT
from torchvision.transforms import autoaugment as AA
from torchvision.transforms import Resize as EarlyResize
names, auto = {NAMES}, {AUTO_NAMES}
stock = {{name: getattr(T, name) for name in names}}
import nanopatch
nanopatch.patch_torch(training=False)
from torchvision.transforms import Resize, Compose
assert Resize.__module__ == "nanopatch.targets.vision.transforms" and Compose is T.Compose
for name in names:
    ours = getattr(T, name)
    assert ours.__module__ == "nanopatch.targets.vision.transforms" and ours._nanopatch_stock is stock[name], name
    assert getattr(torchvision.transforms, name) is ours
    assert getattr(AA if name in auto else TT, name) is ours, name
# a name bound before the patch stays stock (documented), and status() says so
assert EarlyResize is stock["Resize"] and type(EarlyResize(8)).__module__.startswith("torchvision")
assert any("EarlyResize" in w for w in nanopatch.status()["warnings"]), nanopatch.status()["warnings"]
nanopatch.patch_torch(training=False)  # twice: a no-op
nanopatch.unpatch_torch()
for name in names:
    assert getattr(T, name) is stock[name], name
    assert getattr(torchvision.transforms, name) is stock[name], name
    assert getattr(AA if name in auto else TT, name) is stock[name], name
print("import-first ok")
"""


def test_import_styles_in_fresh_interpreters():
    with ThreadPoolExecutor(2) as pool:  # two interpreters at once: each spends seconds importing torch
        procs = list(pool.map(lambda code: run_python(textwrap.dedent(code)), [PATCH_FIRST, IMPORT_FIRST]))
    for proc, expected in zip(procs, ["patch-first ok", "import-first ok"], strict=True):
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected


def test_unpatch_restores_identity_in_this_process():
    import torchvision.transforms.autoaugment as AA
    import torchvision.transforms.transforms as TT

    with nanopatch.unpatched():
        stock = {name: getattr(T, name) for name in tc.REPLACED}
    for _ in range(2):  # patch, unpatch, patch again
        with nanopatch.patched(training=False):
            for name in tc.REPLACED:
                assert getattr(T, name).__module__ == "nanopatch.targets.vision.transforms"
                assert getattr(T, name)._nanopatch_stock is stock[name]
        with nanopatch.unpatched():
            for name in tc.REPLACED:
                home = AA if name in AUTOAUGMENT else TT
                assert getattr(T, name) is stock[name] and getattr(home, name) is stock[name], name


# --- DataLoader workers ------------------------------------------------------------------------

LOADER_SCRIPT = """
import multiprocessing
import os
import sys
import time

import torch
import torchvision
import torchvision.datasets
import torchvision.transforms as T
from PIL import Image

import nanopatch

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def batches(root, context, timeout):
    # the train pipeline, looked up now: stock before patch_torch(), nanopatch's after
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(root, transform=transform)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, shuffle=True, num_workers=2, multiprocessing_context=context,
        generator=torch.Generator().manual_seed(0), timeout=timeout,
    )
    return [(x, y) for x, y in loader]


def levels(x):
    return (x.double() * torch.tensor(STD).view(-1, 1, 1) + torch.tensor(MEAN).view(-1, 1, 1)) * 255


if __name__ == "__main__":  # spawn workers import this file again
    root, scenario = sys.argv[1], sys.argv[2]
    if scenario.startswith("after-main-process-"):
        nanopatch.patch_torch(training=False, fast_decode=False)
        path = torchvision.datasets.ImageFolder(root).samples[0][0]
        if scenario == "after-main-process-transform":
            # what users do before training: look at a transformed sample in the main process
            T.Compose([T.GaussianBlur(5), T.ColorJitter(0.4, 0.4, 0.4, 0.1)])(Image.open(path).convert("RGB"))
        else:  # their own OpenCV code in the main process (stock torchvision never uses OpenCV)
            import cv2

            cv2.GaussianBlur(cv2.imread(path), (5, 5), 1.0)
        time.sleep(0.5)
        try:
            got = batches(root, "fork", 5)
        except RuntimeError as exc:
            print(f"fork: {exc}", flush=True)
            for worker in multiprocessing.active_children():  # hung: no point in a polite shutdown
                worker.kill()
            os._exit(1)
        assert [tuple(x.shape) for x, _ in got] == [(2, 3, 224, 224)] * 3
        print("fork: ok")
        sys.exit(0)
    want = batches(root, "fork", 60)  # stock: nothing patched yet
    nanopatch.patch_torch(training=False, fast_decode=False)
    assert T.Compose.__module__ == "nanopatch.targets.vision.transforms"
    for context in ["fork", "spawn"]:
        got = batches(root, context, 60)
        assert len(got) == len(want) == 3, (len(got), len(want))
        worst = []
        for (gx, gy), (wx, wy) in zip(got, want):
            assert torch.equal(gy, wy) and gx.shape == wx.shape == (2, 3, 224, 224), (gy, wy, gx.shape)
            diff = (levels(gx) - levels(wx)).abs()
            worst.append((diff.amax(dim=(2, 3)).max().item(), diff.mean(dim=(2, 3)).max().item()))
        max_diff, mean_diff = max(w[0] for w in worst), max(w[1] for w in worst)
        print(f"{context}: max {max_diff:.3f} mean {mean_diff:.3f}")
        assert max_diff <= 1 + 1e-3 and mean_diff <= 0.5, (context, worst)
"""


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    for i, (w, h) in enumerate([(500, 375), (600, 451), (375, 500), (500, 375), (600, 451), (451, 600)]):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(exist_ok=True)
        tc.ImageSpec(h, w, "RGB", "smooth", seed=50 + i).pil().save(folder / f"{i}.jpg", quality=90)
    (root / "loader_script.py").write_text(LOADER_SCRIPT)
    return root


def run_loader_script(folder, scenario):
    return run_python([str(folder / "loader_script.py"), str(folder), scenario], timeout=240)


def test_dataloader_workers_fork_and_spawn_give_stocks_batches(small_folder):
    """The same loader seed gives the same crops and flips in patched workers as in stock ones
    (an ImageFolder with the train pipeline, two workers, shuffled by a seeded generator), with
    fork and with spawn (which pickles the dataset and nanopatch's transforms to the workers).
    In a fresh interpreter: a forked worker inherits whatever the test process did before."""
    proc = run_loader_script(small_folder, "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == ["fork", "spawn"]


@pytest.mark.parametrize("before", ["transform", "cv2"])
def test_fork_workers_after_the_main_process_used_opencv(small_folder, before):
    """Pinned: once the main process has used OpenCV's thread pool, a forked DataLoader worker
    that touches OpenCV's threading hangs (the pool does not survive fork). Two ways the main
    process gets there: a nanopatch transform run on one image (GaussianBlur + ColorJitter, as
    when looking at a sample before training), where the worker would hang in
    ``cv2.setNumThreads(1)`` in nanopatch/vision/_opencv.py; and the user's own OpenCV call
    (``cv2.GaussianBlur(cv2.imread(path), (5, 5), 1.0)``), where the worker's first nanopatch
    kernel would hang in ``cv2.getNumThreads()``/``setNumThreads(1)``, while stock torchvision
    never touches OpenCV. The loader's timeout turns a hang into "DataLoader timed out". (On a
    busy machine the hang does not always happen: this test may pass by luck, never fail
    wrongly.)"""
    proc = run_loader_script(small_folder, f"after-main-process-{before}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
