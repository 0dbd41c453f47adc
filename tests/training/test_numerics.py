"""A patched bf16 run learns as well as stock fp32; checkpoints made under the patch load and
resume; the training patch works from the runner and whichever order things happen in."""

from __future__ import annotations

import copy
import io
import json
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import nanopatch
from nanopatch import NanopatchWarning
from nanopatch.targets.training import discovery

from conftest import run_python
from helpers.training_tasks import shifted_templates_task, small_net, train_and_score


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


def test_bf16_run_learns_as_well_as_fp32():
    data = shifted_templates_task()
    with nanopatch.unpatched():
        stock = train_and_score(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NanopatchWarning)  # bf16=True on a CPU without native bf16
        with nanopatch.patched(bf16=True, channels_last=True, ipex=False):
            patched = train_and_score(data)
            [plan] = nanopatch.status()["targets"]["training"]["details"]
            assert plan["bf16"] is True and plan["channels_last"] == "channels_last"
    assert stock > 60, f"the task is too hard to compare on ({stock:.1f}%)"
    assert abs(patched - stock) <= 1.0, f"bf16 {patched:.2f}% vs fp32 {stock:.2f}%"


def _run(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("make_optimizer", ["sgd", "adamw"])
def test_checkpoint_save_load_resume_under_the_patch(make_optimizer):
    def build():
        torch.manual_seed(0)
        model = small_net()
        if make_optimizer == "sgd":
            return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 1, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(5)]
    # bf16 and channels-last as asked: measured, each run would decide on its own first steps
    with nanopatch.patched(bf16=True, channels_last=True, ipex=False):
        model, optimizer = build()
        model.train()
        _run(model, optimizer, batches[:3])
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
        saved = copy.deepcopy(model)  # the model as saved (a copy runs the class's own forward)
        _run(model, optimizer, batches[3:])  # the run that was not interrupted

        buffer.seek(0)
        checkpoint = torch.load(buffer)
        for group in checkpoint["optimizer"]["param_groups"]:
            assert group["fused"] is None and group["foreach"] is None  # what stock saves
        resumed, resumed_opt = build()
        resumed.load_state_dict(checkpoint["model"])
        resumed_opt.load_state_dict(checkpoint["optimizer"])
        resumed.train()
        _run(resumed, resumed_opt, batches[3:])
        for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values(), strict=True):
            torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")

    # and the checkpoint loads into a stock model and optimizer: the model it was
    stock, stock_opt = build()
    stock.load_state_dict(checkpoint["model"])
    stock_opt.load_state_dict(checkpoint["optimizer"])
    stock.eval()
    saved.eval()
    with torch.no_grad():
        torch.testing.assert_close(stock(batches[0][0]), saved(batches[0][0]))
    stock.train()
    _run(stock, stock_opt, batches[3:4])


def _conv_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )


def _optimizer(name, model, **flags):
    if name == "sgd-fused-by-user":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True, **flags)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **flags)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, **flags)


def _conv_batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(n)]


def _assert_same(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("when", ["before-the-first-step", "after-a-step"])
@pytest.mark.parametrize("make_optimizer", ["sgd", "adamw", "sgd-fused-by-user"])
def test_a_stock_checkpoint_resumes_under_the_patch_as_stock_goes_on(make_optimizer, when):
    """A checkpoint written by a stock run (momentum and moments laid out as the contiguous
    weights were) resumed under nanopatch, whose channels-last weights and fused step (nanopatch's
    or the user's) would read that state's elements in another order: the state is given the
    weights' layout, at the conversion and at the first step after ``load_state_dict``, and
    training goes on as the stock run did."""
    batches = _conv_batches(7)
    with nanopatch.unpatched():
        stock = _conv_net()
        stock_opt = _optimizer(make_optimizer, stock)
        _run(stock, stock_opt, batches[:3])
        checkpoint = copy.deepcopy({"model": stock.state_dict(), "optimizer": stock_opt.state_dict()})
        _run(stock, stock_opt, batches[3:])
    with nanopatch.patched(bf16=False, channels_last=True, ipex=False):
        model = _conv_net()
        optimizer = _optimizer(make_optimizer, model)
        if when == "after-a-step":  # trained a step under the patch (channels-last, fused), then resumed
            _run(model, optimizer, batches[6:])
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        _run(model, optimizer, batches[3:])
        weight = model[0].weight
        assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
        assert optimizer.param_groups[0]["fused"] in (True, None)
        assert all(v.stride() == weight.stride() for v in optimizer.state[weight].values() if v.dim() == 4)
    _assert_same(model, stock)


def test_a_users_fused_optimizer_goes_on_as_stock_after_unpatch():
    """Weights nanopatch made channels-last go back to stock's strides at unpatch, and with them
    the optimizer's state, which a fused step the user asked for reads as flat memory."""
    batches = _conv_batches(6)
    with nanopatch.unpatched():
        stock = _conv_net()
        stock_opt = _optimizer("sgd", stock, fused=True)
        _run(stock, stock_opt, batches)
    with nanopatch.patched(bf16=False, channels_last=True, ipex=False):
        model = _conv_net()
        optimizer = _optimizer("sgd", model, fused=True)
        _run(model, optimizer, batches[:3])
        assert not model[0].weight.is_contiguous()
    _run(model, optimizer, batches[3:])  # stock again
    assert model[0].weight.is_contiguous() and optimizer.state[model[0].weight]["momentum_buffer"].is_contiguous()
    _assert_same(model, stock)


def test_optimizer_built_before_patch_torch_is_found():
    script = """
        import json, torch
        from torch import nn
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
        model(torch.randn(1, 3, 6, 6))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        import nanopatch
        nanopatch.patch_torch(bf16=True, ipex=False)
        model.train()
        out = model(torch.randn(2, 3, 6, 6))
        print(json.dumps({"dtype": str(out.dtype), "plans": nanopatch.status()["targets"]["training"]["details"]}))
    """
    proc = run_python(script, check=True)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["dtype"] == "torch.float32"
    assert [p["model"] for p in seen["plans"]] == ["Sequential"] and seen["plans"][0]["bf16"] is True


TRAIN_SCRIPT = """
import json, sys, torch
import torch.nn.functional as F
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
probe = []
model[-1].register_forward_hook(lambda m, i, o: probe.append(str(o.dtype)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    model.train()
    out = model(torch.randn(4, 3, 8, 8))
    loss = F.cross_entropy(out, torch.tensor([0, 1, 0, 1]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
import nanopatch
print(json.dumps({"argv": sys.argv[1:], "out": str(out.dtype), "inside": probe,
                  "plans": nanopatch.status()["targets"]["training"].get("details", [])}))
"""


@pytest.mark.parametrize("options", [[], ["--no-training"], ["--no-bf16"]])
def test_runner_trains_an_unmodified_script(tmp_path, options):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN_SCRIPT))
    proc = run_python(["-m", "nanopatch", "--no-ipex", "--bf16", *options, str(script), "--epochs", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["argv"] == ["--epochs", "2"] and seen["out"] == "torch.float32"
    if options == ["--no-training"]:
        assert seen["plans"] == [] and set(seen["inside"]) == {"torch.float32"}
    elif options == ["--no-bf16"]:
        assert seen["plans"][0]["bf16"] is False and set(seen["inside"]) == {"torch.float32"}
    else:
        assert seen["plans"][0]["model"] == "Sequential" and set(seen["inside"]) == {"torch.bfloat16"}


def test_discovery_hooks_do_not_outlive_the_search():
    from torch.nn.modules import module as module_mod

    with nanopatch.patched(ipex=False):
        model = small_net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        assert module_mod._global_forward_pre_hooks  # searching: the optimizer is unpaired
        _run(model, optimizer, [(torch.randn(2, 1, 16, 16), torch.tensor([0, 1]))])
        assert not module_mod._global_forward_pre_hooks and not module_mod._global_forward_hooks
        assert not discovery.search.pending
