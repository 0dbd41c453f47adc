"""The IPEX path of the training patch, on the real intel-extension-for-pytorch.

These run in the ``ipex`` tox env (torch 2.8 + IPEX 2.8), which sets
``NANOPATCH_TEST_REQUIRE_IPEX=1`` so that a missing or mismatched IPEX fails there instead
of skipping; elsewhere they skip."""

from __future__ import annotations

import io
import os

import pytest
import torch
import torch.nn.functional as F
from test_training_numerics import shifted_templates_task, small_net, train_and_score

import nanopatch
from nanopatch import NanopatchWarning, config
from nanopatch.training import patch as training

COMPATIBLE, WHY = config.ipex_compatibility()
if not COMPATIBLE:
    if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") == "1":
        raise RuntimeError(f"the ipex env must test IPEX, but {WHY}")
    pytest.skip(f"IPEX path: {WHY}", allow_module_level=True)

torchvision = pytest.importorskip("torchvision")


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    # An IPEX bf16 model cannot be un-optimized; unpatch says so once per model.
    with pytest.warns(NanopatchWarning) if _ipex_models() else _nothing():
        nanopatch.unpatch_torch()
    training.plans.clear()


def _ipex_models() -> bool:
    return any(plan.ipex and plan.installed for plan in training.plans.values())


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _steps(model, optimizer, x, y, n):
    for _ in range(n):
        optimizer.zero_grad()
        out = model(x)
        F.cross_entropy(out, y).backward()
        optimizer.step()
    return out


def test_auto_detection_turns_ipex_on():
    cfg = config.resolve()
    assert cfg.ipex is True and cfg.sources["ipex"] == "auto", cfg.reasons["ipex"]


def test_resnet18_is_ipex_optimized_with_its_optimizer():
    nanopatch.patch_torch(bf16=True, ipex=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    out = _steps(model, optimizer, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)), 2)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    [plan] = nanopatch.status()["targets"]["training"]["details"]
    assert plan["ipex"] is True and plan["bf16"] is True
    # IPEX's master weights come back as fp32 in the user's state_dict
    assert model.state_dict()["conv1.weight"].dtype == torch.float32


def test_ipex_checkpoint_loads_into_stock_and_resumes_under_the_patch():
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 1, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(4)]

    def build():
        torch.manual_seed(0)
        model = small_net()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    nanopatch.patch_torch(bf16=True, ipex=True)
    model, optimizer = build()
    model.train()
    for x, y in batches[:2]:
        _steps(model, optimizer, x, y, 1)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    for x, y in batches[2:]:
        _steps(model, optimizer, x, y, 1)

    buffer.seek(0)
    checkpoint = torch.load(buffer)
    assert all(t.dtype == torch.float32 for t in checkpoint["model"].values() if t.is_floating_point())
    resumed, resumed_opt = build()  # the usual resume: load, then train
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    resumed.train()
    for x, y in batches[2:]:
        _steps(resumed, resumed_opt, x, y, 1)
    assert training.plans[resumed].ipex
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values(), strict=True):
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3, msg=lambda m, name=name: f"{name}: {m}")

    with nanopatch.unpatched():
        stock, stock_opt = build()
        stock.load_state_dict(checkpoint["model"])
        stock_opt.load_state_dict(checkpoint["optimizer"])
        _steps(stock, stock_opt, *batches[2], 1)


def test_an_ipex_model_keeps_working_after_unpatch():
    nanopatch.patch_torch(bf16=True, ipex=True)
    model = small_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    x, y = torch.randn(4, 1, 16, 16), torch.tensor([0, 1, 2, 3])
    _steps(model, optimizer, x, y, 1)
    with pytest.warns(NanopatchWarning, match="cannot be undone"):
        nanopatch.unpatch_torch()
    out = model(x)  # its weights are bf16: a plain fp32 forward would fail
    assert out.dtype == torch.float32
    model.eval()
    assert model(x).dtype == torch.float32


def test_optimizers_ipex_cannot_fuse_take_the_native_path():
    nanopatch.patch_torch(bf16=True, ipex=True)
    model = small_net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    out = _steps(model, optimizer, torch.randn(4, 1, 16, 16), torch.tensor([0, 1, 2, 3]), 2)
    plan = training.plans[model]
    assert not plan.ipex and out.dtype == torch.float32
    assert any("IPEX cannot fuse AdamW" in note for note in plan.notes)
    nanopatch.unpatch_torch()  # a native model: undone without a word
    assert "forward" not in model.__dict__


def test_ipex_bf16_run_learns_as_well_as_fp32():
    data = shifted_templates_task()
    stock = train_and_score(data)
    nanopatch.patch_torch(bf16=True, ipex=True)
    patched = train_and_score(data)
    assert any(plan.ipex for plan in training.plans.values())
    assert abs(patched - stock) <= 1.0, f"IPEX bf16 {patched:.2f}% vs fp32 {stock:.2f}%"
