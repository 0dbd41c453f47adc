"""GELU written out as element-wise operators (Hugging Face's NewGELUActivation and its kin) on
torch's GELU kernel inside an accelerated model (nanopatch.targets.training.activations): which
modules, the same function, undone exactly, nothing of nanopatch in a copy of the model, and a
GPT-2 that learns as stock."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch.targets.training import activations
from nanopatch.targets.training import forward as fw
from nanopatch.targets.training import patch as training

from helpers.learning_oracle import framework, learns_as_stock


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


def _acts():
    return framework("transformers").activations


def test_the_modules_that_write_gelu_out_and_only_those_are_found():
    acts = _acts()
    found = {
        "NewGELUActivation": acts.NewGELUActivation(),
        "FastGELUActivation": acts.FastGELUActivation(),
        "AccurateGELUActivation": acts.AccurateGELUActivation(),
        "GELUTanh python": acts.GELUTanh(use_gelu_tanh_python=True),
        "GELUActivation python": acts.GELUActivation(use_gelu_python=True),
    }
    left = {
        "GELUTanh (F.gelu already)": acts.GELUTanh(),
        "GELUActivation (F.gelu already)": acts.GELUActivation(),
        "QuickGELUActivation (another function)": acts.QuickGELUActivation(),
        "nn.GELU": nn.GELU(approximate="tanh"),
        "a subclass": type("Mine", (acts.NewGELUActivation,), {})(),
    }
    with_own = acts.NewGELUActivation()
    with_own.forward = lambda x: x  # an instance forward of the script's own
    left["an instance forward"] = with_own
    assert {name: activations.approximation(m) for name, m in found.items()} == {
        "NewGELUActivation": "tanh",
        "FastGELUActivation": "tanh",
        "AccurateGELUActivation": "tanh",
        "GELUTanh python": "tanh",
        "GELUActivation python": "none",
    }
    assert {name: activations.approximation(m) for name, m in left.items()} == dict.fromkeys(left)


def test_a_listed_class_whose_forward_computes_something_else_keeps_it(monkeypatch):
    class NotGelu(nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(0.8 * (x + 0.05 * x**3)))  # other constants

    monkeypatch.setitem(activations.KNOWN, (NotGelu.__module__, "NotGelu"), "tanh")
    monkeypatch.setattr(activations, "_checked", {})
    assert activations.approximation(NotGelu()) is None
    assert activations.same_function(_acts().NewGELUActivation(), "tanh")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_gives_the_written_out_function(dtype):
    module = _acts().NewGELUActivation()
    x = (torch.randn(4, 64, 96) * 3).to(dtype)
    forward = fw.GeluForward(module, "tanh")
    ours, theirs = forward(x), type(module).forward(module, x)
    assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape
    exact = F.gelu(x.double(), approximate="tanh")
    if dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    else:  # one rounding to bf16 where the chain rounds eight times: no farther from the exact value
        assert (ours.double() - exact).abs().max() <= (theirs.double() - exact).abs().max()
    with pytest.raises(TypeError, match="approximate"):  # anything else: the module's own forward, as stock
        forward(x, approximate="none")
    assert torch.equal(fw.GeluForward(module, "tanh")(torch.arange(3)), type(module).forward(module, torch.arange(3)))


def _gpt2(transformers, dropout: float = 0.0):
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=128,
        n_positions=32,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return transformers.GPT2LMHeadModel(config)


def test_a_gpt2_gets_the_kernel_while_patched_and_its_own_forward_back_after(monkeypatch):
    transformers = framework("transformers")
    calls = []
    real = F.gelu
    monkeypatch.setattr(
        F, "gelu", lambda x, approximate="none": calls.append(approximate) or real(x, approximate=approximate)
    )
    torch.manual_seed(0)
    model = _gpt2(transformers)
    gelus = [block.mlp.act for block in model.transformer.h]
    tokens = torch.randint(0, 128, (2, 16))
    with nanopatch.patched(ipex=False, compile=False):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            optimizer.zero_grad()
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
        assert calls.count("tanh") >= 2 * len(gelus)  # each block's activation, in every forward
        assert all(isinstance(act.__dict__["forward"], fw.GeluForward) for act in gelus)
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["gelu_kernel"] == len(gelus) == 2
        assert f"GELU on torch's kernel ({len(gelus)} modules)" in training.plans[model].summary()
        clone = copy.deepcopy(model)
        assert all("forward" not in block.mlp.act.__dict__ for block in clone.transformer.h)
        restored = pickle.loads(pickle.dumps(model))
        assert all("forward" not in block.mlp.act.__dict__ for block in restored.transformer.h)
    assert all("forward" not in act.__dict__ for act in gelus)  # the class's forward again, exactly
    calls.clear()
    model(input_ids=tokens)
    assert not calls


def test_a_gpt2_with_its_gelu_on_the_kernel_learns_as_stock():
    transformers = framework("transformers")
    tokens = torch.randint(0, 128, (6, 4, 24), generator=torch.Generator().manual_seed(3))

    def train():
        model = _gpt2(transformers, dropout=0.1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for batch in tokens:
            optimizer.zero_grad()
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()

    outcome = learns_as_stock(train, {"ipex": False, "compile": False}, min_steps=len(tokens))
    assert [m["gelu_kernel"] for m in outcome.models] == [2]
