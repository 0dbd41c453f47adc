"""A user's numpy image handed to a patched transform gets stock's outcome.

Stock's v1 classes (but ToTensor) take no ndarray: they raise ``TypeError``, or hand it back
untouched where a random draw skips the step (a flip, RandomApply); v2 passes it through or
raises ``TypeError`` ("No image"). nanopatch's classes do the same, rather than run their
kernels on it and return an ndarray. Inside a patched Compose the pixels still travel as
ndarrays between fused steps: the caller gave a PIL image or a file there, and gets what stock
returns.

Every replaced class, v1 and v2, on an (H, W, 3) and an (H, W) uint8 array under several seeds:
the same exception (type and message) or the same result, the input itself back exactly when
stock's comes back, the generators left where stock leaves them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nanopatch

from helpers import vision_examples as ex


@pytest.fixture(scope="module", autouse=True)
def patched():
    with nanopatch.patched(training=False):
        yield


@pytest.mark.parametrize("ndim", [3, 2])
@pytest.mark.parametrize(("version", "name"), [*(("v1", name) for name in ex.V1), *(("v2", name) for name in ex.V2)])
def test_every_replaced_class(version, name, ndim):
    stock, ours = ex.build(version, name, stock=True), ex.build(version, name, stock=False)
    problem = ex.ndarray_problem(stock, ours, ex.sample_array(ndim))
    assert problem is None, problem


@pytest.mark.parametrize("name", ["Resize", "CenterCrop", "RandomHorizontalFlip", "ColorJitter"])
def test_the_reported_classes_raise_stocks_type_error(name):
    """The four classes the issue names: stock raises TypeError on an ndarray (a flip when it
    flips), and a patched one called alone must too, with stock's message."""
    arr = ex.sample_array()
    recipe = ex.V1[name] if name != "RandomHorizontalFlip" else ex.R(name, p=1.0)
    for stock in (True, False):
        with pytest.raises(TypeError, match=r"(?i)(pil image|unexpected type|tensor)"):
            recipe.build(stock=stock)(arr)


def test_to_tensor_takes_an_ndarray_with_stocks_values_and_stocks_refusals():
    """ToTensor takes an ndarray as stock's does, and gives stock's tensor (nanopatch's kernel on a
    writeable one); one with negative strides gets stock's ValueError."""
    for arr in (ex.sample_array(3), ex.sample_array(2), np.ascontiguousarray(ex.sample_array(3)[:, ::2])):
        problem = ex.ndarray_problem(ex.build_v1("ToTensor", stock=True), ex.build_v1("ToTensor", stock=False), arr)
        assert problem is None, problem
    flipped = ex.sample_array()[::-1]
    for stock in (True, False):
        with pytest.raises(ValueError, match="negative"):
            ex.build_v1("ToTensor", stock=stock)(flipped)


def test_pipelines_on_ndarrays():
    """A Compose on a user's ndarray runs its steps as stock's does: the first step that takes
    no ndarray raises stock's TypeError; ToTensor first, and the rest get tensors."""
    arr = ex.sample_array()
    cases = {
        "train": ex.R("Compose", [ex.R("RandomResizedCrop", 24), ex.R("RandomHorizontalFlip"), ex.R("ToTensor")]),
        "flip-first": ex.R("Compose", [ex.R("RandomHorizontalFlip"), ex.R("ToTensor"), ex.NORMALIZE]),
        "to-tensor-first": ex.R("Compose", [ex.R("ToTensor"), ex.R("CenterCrop", 20), ex.NORMALIZE]),
    }
    outcomes = {}
    for name, recipe in cases.items():
        stock, ours = recipe.build(stock=True), recipe.build(stock=False)
        problem = ex.ndarray_problem(stock, ours, arr)
        assert problem is None, f"{name}: {problem}"
        outcomes[name] = [type(ex.tc.run(stock, arr, seed).value) for seed in range(6)]
    # the premises: stock refuses the first, the coin decides the second, the third works
    assert outcomes["train"] == [type(None)] * 6
    assert set(outcomes["flip-first"]) == {type(None), torch.Tensor}
    assert outcomes["to-tensor-first"] == [torch.Tensor] * 6
