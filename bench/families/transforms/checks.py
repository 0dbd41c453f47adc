"""What transforms' variants really ran (nanopatch's patch states, the implementation of each step)
and the check that they output what stock does.
"""

from __future__ import annotations

import os
from typing import Any

from families.transforms.pipelines import (
    ALBU,
    CODEC,
    FAST,
    KORNIA,
    MAX_GREY_LEVELS,
    MEAN_TOLERANCE,
    NANOPATCH,
    SEED,
    STD,
    STOCK,
    TENSOR,
    TENSOR_NP,
    TOLERANCE,
    UNDER_NANOPATCH,
    reseed,
    size_name,
)


class PatchStates:
    """Puts the process in the patch state a variant runs in: nothing patched for ``stock`` and
    ``albumentations`` and the tensor path, ``patch_torch(training=False, fast_decode=...)`` for
    the nanopatch ones (freshly applied at each switch, so an option read at patch time takes
    effect)."""

    def __init__(self) -> None:
        self.current: str | None = STOCK

    def how(self, variant: str) -> str:
        if variant not in UNDER_NANOPATCH:
            return "nothing patched"
        return f"nanopatch.patch_torch(training=False, fast_decode={variant == FAST})"

    def enter(self, variant: str) -> None:
        if variant == self.current:
            return
        import nanopatch

        nanopatch.unpatch_torch()
        if variant in UNDER_NANOPATCH:
            nanopatch.patch_torch(training=False, fast_decode=variant == FAST)
        self.current = variant


def crop_decode_state() -> str:
    """Whether RandomResizedCrop decodes only its box here (and with what), and why not."""
    from nanopatch.targets.vision import decode as np_decode

    if os.environ.get(np_decode.CROP_DECODE_VARIABLE, "").strip().lower() in ("0", "false", "no", "off"):
        return f"off ({np_decode.CROP_DECODE_VARIABLE}=0): whole decode, box cut"
    if np_decode.region_decoder() is not None:
        return f"on: region decode with {np_decode.region_report()['reason']}, one-iMCU margin"
    return f"unavailable ({np_decode.region_report()['reason']}): whole decode, box cut"


def resize_kernel_state() -> str:
    """What runs bilinear resizes here: nanopatch's compiled kernels, or torch's and Pillow's (and why)."""
    from nanopatch.targets.vision import native as _native

    report = _native.report()
    if report["used"]:
        return f"nanopatch's C kernels, Pillow's pixels where both passes run on them ({report['reason']})"
    return f"torch's first pass, Pillow's second ({report['reason']})"


def where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def transform_classes(transform: Any) -> list[type]:
    """The pipeline's class and its steps' (a Compose's ``transforms``, an nn.Sequential's modules)."""
    inner = getattr(transform, "transforms", None)
    if inner is None and hasattr(transform, "children"):
        inner = list(transform.children())
    return [type(transform), *(type(t) for t in inner or [])]


def implementation(variant: str, datasets: dict[str, Any], states: PatchStates) -> dict[str, Any]:
    """What a variant really runs, found by class and function identity in its own patch state;
    asserts that stock is all torchvision and that the nanopatch variants go through nanopatch."""
    states.enter(variant)
    classes: dict[str, list[str]] = {}
    for dataset in datasets.values():
        for cls in transform_classes(dataset.transform):
            names = classes.setdefault(cls.__module__, [])
            if cls.__qualname__ not in names:
                names.append(cls.__qualname__)
    info: dict[str, Any] = {"state": states.how(variant), "transform_classes": classes}
    if variant == ALBU:
        info["reads"] = "cv2.imread(path) + cv2.cvtColor(BGR2RGB)"
        info["uses"] = "albumentations"
        return info
    if variant in (TENSOR, TENSOR_NP):
        info["reads"] = "torchvision.io.decode_jpeg(read_file(path), RGB) -> uint8 CHW tensor"
        info["uses"] = "transforms.v2 on uint8 tensors"
        return info
    if variant == CODEC:
        info["reads"] = "torchcodec.decoders.decode_image(path, mode='RGB') -> uint8 CHW tensor"
        info["uses"] = "TorchCodec + transforms.v2 on uint8 tensors"
        return info
    if variant == KORNIA:
        info["reads"] = "kornia.io.load_image(path, RGB8) -> float (1, C, H, W) in [0, 1]"
        info["uses"] = "kornia.augmentation on float tensors"
        return info

    import torchvision
    import torchvision.datasets.folder as folder

    import nanopatch
    from nanopatch.targets.vision import datasets as np_datasets

    encoded = {name: np_datasets.accepts_encoded(d.transform) for name, d in datasets.items()}
    loaders = {where(d.loader) for d in datasets.values()}
    info["getitem"] = where(folder.DatasetFolder.__dict__["__getitem__"])
    info["pipeline_gets_encoded_file"] = encoded
    info["loader"] = f"{' / '.join(sorted(loaders))} -> {where(folder.pil_loader)}"
    info["crop_decode"] = crop_decode_state()
    info["resize_kernel"] = resize_kernel_state()
    stock_classes = all(module.startswith("torchvision.") for module in classes)
    if variant == STOCK:
        for name, dataset in datasets.items():
            compose = type(dataset.transform)
            assert (
                compose is torchvision.transforms.Compose and compose.__module__ == "torchvision.transforms.transforms"
            ), f"stock {name} pipeline is a {where(compose)}, not torchvision's Compose"
        assert stock_classes, f"stock pipelines use non-torchvision classes: {classes}"
        assert not any(encoded.values()), "a stock pipeline claims to accept undecoded files"
        assert folder.pil_loader is np_datasets.original("pil_loader"), "stock state: pil_loader is not torchvision's"
        assert folder.DatasetFolder.__dict__["__getitem__"] is np_datasets.original("DatasetFolder.__getitem__")
        info["uses"] = "torchvision"
        return info
    vision = nanopatch.status()["targets"]["vision"]
    assert vision["state"] == "patched", (
        f"{variant}: nanopatch's vision target is {vision['state']}: {vision['detail']}"
    )
    for name in datasets:
        assert encoded[name] or folder.pil_loader is np_datasets.pil_loader, (
            f"{variant} {name}: neither a nanopatch pipeline nor nanopatch's loader; it would run stock"
        )
    if all(encoded.values()) and not stock_classes:
        info["uses"] = "nanopatch pipeline"
    elif stock_classes:
        info["uses"] = "tv transforms, np loader"
    else:
        info["uses"] = "mixed"  # some nanopatch classes, not all pipelines take the file undecoded
    return info


def outputs(variant: str, dataset: Any, states: PatchStates):
    """The variant's output tensor for every image, under torch.manual_seed(SEED + index)."""
    import torch

    states.enter(variant)
    got = []
    for index in range(len(dataset)):
        reseed(variant, dataset, SEED + index)
        tensor, _ = dataset[index]
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32, (variant, type(tensor))
        assert tuple(tensor.shape) == (3, 224, 224), (variant, tuple(tensor.shape))
        got.append(tensor.numpy().copy())
    return got


def grey_levels(a: list, b: list):
    """|a - b| in 0..255 grey levels (Normalize undone) for every value of every image."""
    import numpy as np

    scale = np.asarray(STD, np.float32)[:, None, None] * 255
    return np.concatenate([(np.abs(x - y) * scale).ravel() for x, y in zip(a, b, strict=True)])


def verify(sets: dict, paths: dict, states: PatchStates) -> dict[str, Any]:
    """Assert what the comparison rests on; return the output differences per pipeline and size."""
    import numpy as np

    from nanopatch.targets.vision import decode as np_decode

    for files in paths.values():  # nanopatch's loader must take its fast path, not fall back to Pillow
        for path in files:
            assert np_decode.decode_fast(np_decode.read_bytes(path)) is not None, f"{path} fell back to Pillow"
    checks: dict[str, Any] = {}
    for (pipeline, size), by_variant in sets.items():
        got = {variant: outputs(variant, dataset, states) for variant, dataset in by_variant.items()}
        stock, same = got[STOCK], got[NANOPATCH]
        diffs = np.concatenate([np.abs(x - y).ravel() for x, y in zip(stock, same, strict=True)])
        max_diff, mean_diff = float(diffs.max()), float(diffs.mean())
        allowed = MAX_GREY_LEVELS[pipeline] * TOLERANCE
        assert max_diff <= allowed and mean_diff <= MEAN_TOLERANCE, (
            f"{pipeline} {size_name(size)}: nanopatch differs from stock by up to {max_diff:.4f} (allowed {allowed:.4f}"
            f" = {MAX_GREY_LEVELS[pipeline]} grey level(s)), mean {mean_diff:.5f} (allowed {MEAN_TOLERANCE:.5f})"
        )
        fast = grey_levels(stock, got[FAST])
        check = {
            "images": len(stock),
            "nanopatch_max_abs_diff": max_diff,
            "nanopatch_mean_abs_diff": mean_diff,
            "tolerance": allowed,
            "fast_decode_mean_grey_levels": float(fast.mean()),
            "fast_decode_p99_grey_levels": float(np.percentile(fast, 99)),
            "fast_decode_max_grey_levels": float(fast.max()),
        }
        if ALBU in got and pipeline == "val":  # deterministic: comparable pixel by pixel
            albu = grey_levels(stock, got[ALBU])
            check["albumentations_mean_grey_levels"] = float(albu.mean())
            check["albumentations_p99_grey_levels"] = float(np.percentile(albu, 99))
        if TENSOR in got:
            # v2 draws its crops from torch's generator as v1 does: every pipeline comparable
            tensor = grey_levels(stock, got[TENSOR])
            check["tensor_path_mean_grey_levels"] = float(tensor.mean())
            check["tensor_path_p99_grey_levels"] = float(np.percentile(tensor, 99))
            check["tensor_path_max_grey_levels"] = float(tensor.max())
            # under nanopatch the tensor path must give the tensor path's values
            under = np.concatenate([np.abs(x - y).ravel() for x, y in zip(got[TENSOR], got[TENSOR_NP], strict=True)])
            assert float(under.max()) <= allowed and float(under.mean()) <= MEAN_TOLERANCE, (
                f"{pipeline} {size_name(size)}: the tensor path under nanopatch differs from it stock by up to "
                f"{float(under.max()):.4f}"
            )
            check["tensor_path_nanopatch_max_abs_diff"] = float(under.max())
        if CODEC in got:  # the same v2 pipeline and draws on TorchCodec's decode
            codec = grey_levels(stock, got[CODEC])
            check["torchcodec_mean_grey_levels"] = float(codec.mean())
            check["torchcodec_p99_grey_levels"] = float(np.percentile(codec, 99))
            check["torchcodec_max_grey_levels"] = float(codec.max())
        if KORNIA in got and pipeline == "val":  # Kornia draws its crops its own way: val only
            kornia = grey_levels(stock, got[KORNIA])
            check["kornia_mean_grey_levels"] = float(kornia.mean())
            check["kornia_p99_grey_levels"] = float(np.percentile(kornia, 99))
        checks[f"{pipeline}|{size_name(size)}"] = check
    return checks
