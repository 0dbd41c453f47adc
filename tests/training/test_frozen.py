"""Frozen weights cast to bf16 once (nanopatch.targets.training.frozen): the same values as
autocast's cast in every forward (bit for bit), a copy made once and again only when its
parameter changes, the parameters and their state_dict untouched, a LoRA model through peft."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch.targets.training import forward as fw
from nanopatch.targets.training import frozen
from nanopatch.targets.training import patch as training

from helpers.learning_oracle import framework


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch):
    # these models' frozen weights are tiny: the copies are kept whatever the mode costs, so that
    # what they change (nothing but the casts) is tested; the decision has tests of its own
    monkeypatch.setattr(frozen, "MARGIN", 0.0)
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


class Backbone(nn.Module):
    """A frozen convolution and linear layer (with a tied use of the linear weight through
    ``F.linear`` and ``@``), a trainable head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        for module in (self.conv, self.body):
            module.requires_grad_(False)

    def forward(self, x):
        h = F.relu(self.conv(x)).mean((2, 3))
        h = F.relu(self.body(h)) + (h @ self.body.weight.t()) * 0.5
        return self.head(h)


_CAST_ONCE = fw._cast_once


def _cast_once(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(fw, "_cast_once", _CAST_ONCE if on else (lambda plan: contextlib.nullcontext()))


def _train(model, steps: int, seed: int = 0) -> list[float]:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 3, 10, 10, generator=generator)
        target = torch.randint(0, 4, (4,), generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("channels_last", [False, True])
def test_frozen_weights_give_autocasts_values_bit_for_bit_and_are_cast_once(monkeypatch, channels_last):
    results = {}
    for on in (False, True):
        _cast_once(monkeypatch, on)
        torch.manual_seed(0)
        model = Backbone()
        with nanopatch.patched(bf16=True, ipex=False, channels_last=channels_last, compile=False):
            losses = _train(model, 4)
            plan = training.plans[model]
            assert plan.seen.computed_in == "bfloat16"
            results[on] = (losses, [p.detach().clone() for p in model.parameters()], plan.frozen)
    assert results[True][0] == results[False][0]  # the same losses, bit for bit
    for a, b in zip(results[True][1], results[False][1], strict=True):
        assert torch.equal(a, b)
    copies = results[True][2]
    # the frozen weights and biases the products took (conv, body): made once in four steps
    assert copies.made == 4
    assert results[False][2].made == 0  # without the mode, nothing was copied


def test_parameters_and_state_dict_stay_stocks():
    torch.manual_seed(0)
    model = Backbone()
    params = {name: p for name, p in model.named_parameters()}
    with nanopatch.patched(bf16=True, ipex=False, compile=False):
        _train(model, 2)
        plan = training.plans[model]
        assert plan.frozen.count() == 4
        assert {name: p for name, p in model.named_parameters()} == params  # the same objects
        assert all(type(p) is nn.Parameter and p.dtype == torch.float32 for p in model.parameters())
        assert all(v.dtype == torch.float32 for v in model.state_dict().values())
        assert not model.conv.weight.requires_grad and model.head.weight.requires_grad
    assert plan.frozen is None  # the copies are let go with the model's acceleration


@pytest.mark.parametrize(
    "change",
    [
        "load_state_dict",
        "copy_under_no_grad",
        "data_assigned",
        "to_double_and_back",
    ],
)
def test_a_changed_frozen_weight_is_copied_again(change):
    torch.manual_seed(0)
    model = Backbone()
    x = torch.randn(2, 3, 10, 10)
    with nanopatch.patched(bf16=True, ipex=False, channels_last=False, compile=False):
        _train(model, 2)
        copies = training.plans[model].frozen
        made = copies.made
        new = torch.randn_like(model.body.weight)
        if change == "load_state_dict":
            state = model.state_dict()
            state["body.weight"] = new
            model.load_state_dict(state)
        elif change == "copy_under_no_grad":
            with torch.no_grad():
                model.body.weight.copy_(new)
        elif change == "data_assigned":
            model.body.weight.data = new.clone()
        else:  # new storage, the same values
            model.body.double()
            model.body.float()
        model.train()
        out = model(x)
        assert copies.made > made
        # what autocast computes from the new weight, outside nanopatch
        with nanopatch.unpatched(), torch.autocast("cpu", dtype=torch.bfloat16):
            expected = Backbone.forward(model, x).float()
        assert torch.equal(out, expected)


def test_an_unfrozen_weight_gets_its_gradient_and_a_disabled_autocast_its_fp32_weight():
    class Mixed(Backbone):
        def forward(self, x):
            h = F.relu(self.conv(x)).mean((2, 3))
            with torch.autocast("cpu", enabled=False):  # an fp32 section inside the forward
                fp32 = F.linear(h.float(), self.body.weight)
            assert fp32.dtype == torch.float32
            return self.head(F.relu(self.body(h)) + fp32)

    torch.manual_seed(0)
    model = Mixed()
    with nanopatch.patched(bf16=True, ipex=False, compile=False):
        _train(model, 2)
        model.body.requires_grad_(True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        before = model.body.weight.detach().clone()
        optimizer.zero_grad()
        model(torch.randn(2, 3, 10, 10)).sum().backward()
        assert model.body.weight.grad is not None and model.body.weight.grad.abs().sum() > 0
        optimizer.step()
        assert not torch.equal(model.body.weight, before)


def test_a_copy_is_used_only_for_bf16_products_of_the_models_own_frozen_parameters():
    torch.manual_seed(0)
    model = Backbone()
    copies = frozen.Copies(model)
    other = nn.Parameter(torch.randn(3, 3), requires_grad=False)
    assert copies.swap(other) is other  # not the model's
    assert copies.swap(model.head.weight) is model.head.weight  # trainable
    assert copies.swap(model.body.weight.detach()) is not model.body.weight  # a plain tensor: as it is
    copy = copies.swap(model.body.weight)
    assert copy.dtype == torch.bfloat16 and torch.equal(copy, model.body.weight.to(torch.bfloat16))
    assert copies.swap(model.body.weight) is copy
    assert F.layer_norm not in frozen.PRODUCTS  # autocast runs it in fp32: never a bf16 weight there


def test_lora_through_peft_casts_its_base_once_and_learns_bit_for_bit(monkeypatch):
    transformers = framework("transformers")
    peft = framework("peft")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    runs = {}
    for on in (False, True):
        _cast_once(monkeypatch, on)
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"], fan_in_fan_out=True)
        model = peft.get_peft_model(model, lora)
        with nanopatch.patched(bf16=True, ipex=False, compile=False):
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
            losses = []
            for _ in range(3):
                optimizer.zero_grad()
                loss = model(input_ids=tokens, labels=tokens).loss
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            plan = training.plans[model]
            assert plan.seen.computed_in == "bfloat16"
            runs[on] = (losses, plan.frozen.made, plan.frozen.count(), plan.describe())
    assert runs[True][0] == runs[False][0]
    made, count, described = runs[True][1:]
    # the base's products (c_attn inside LoRA, c_proj, c_fc, mlp c_proj, lm_head's tied wte): once each
    assert made == count and count >= 2 * 8 + 1
    assert runs[False][1] == 0
    assert described["frozen_weights"].startswith(f"{count} frozen weights cast to bf16 once")


@pytest.mark.parametrize(
    ("cast_ms", "calls", "call_us", "kept"),
    [(80.0, 600, 5.0, True), (1.0, 600, 5.0, False), (6.1, 600, 5.0, True), (5.9, 600, 5.0, False)],
)
def test_the_copies_stay_only_where_the_casts_they_save_cost_more_than_the_modes_calls(
    monkeypatch, cast_ms, calls, call_us, kept
):
    monkeypatch.setattr(frozen, "MARGIN", 2.0)
    monkeypatch.setattr(frozen, "call_cost", lambda: call_us / 1e6)
    model = Backbone()
    copies = frozen.Copies(model)
    copies.swap(model.body.weight)
    copies.cast_seconds, copies.calls = cast_ms / 1e3, calls
    copies.decide()
    assert copies.on is kept
    assert copies.verdict.startswith("kept: " if kept else "off: ")
    assert f"the casts {cast_ms:.2f} ms a forward, the mode {calls * call_us / 1e3:.2f} ms ({calls} calls)" in (
        copies.verdict
    )
    assert copies.count() == (1 if kept else 0)  # copies that do not pay are let go


def test_a_model_whose_copies_do_not_pay_keeps_autocasts_casts_and_says_so(monkeypatch):
    monkeypatch.setattr(frozen, "MARGIN", 1e9)  # no cast saves a billion times the mode's calls
    torch.manual_seed(0)
    model = Backbone()
    with nanopatch.patched(bf16=True, ipex=False, compile=False):
        _train(model, 3)
        plan = training.plans[model]
        copies = plan.frozen
        assert not copies.on and copies.count() == 0
        made = copies.made
        _train(model, 2)
        assert copies.made == made  # decided off: no mode, no copies
        described = plan.describe()["frozen_weights"]
        assert described.startswith("cast in every forward, as autocast does: copies made once would not pay")
        assert "frozen weights cast once" not in plan.summary()


def test_call_cost_is_measured_once():
    frozen._call_cost.clear()
    first = frozen.call_cost()
    assert first >= 0.0 and frozen.call_cost() == first
