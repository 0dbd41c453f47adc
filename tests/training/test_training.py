"""The training patch: finding model and optimizer, bf16 autocast with fp32 outputs,
channels-last, fused optimizer steps, fallbacks and exact undo, on real torch models."""

from __future__ import annotations

import collections
import copy
import dataclasses
import inspect
import logging
import socket
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch import NanopatchWarning
from nanopatch.foundation import cpu
from nanopatch.targets.training import amp, discovery, selfcheck
from nanopatch.targets.training import patch as training

from helpers.training_tasks import LeNet

torchvision = pytest.importorskip("torchvision")

NATIVE = {"ipex": False}  # the native path; the IPEX path has its own tests


def small_cnn(classes: int = 4) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, classes),
    )


class Probe:
    """Records, from inside the model, the dtype a submodule computes in (bf16 under our
    autocast) and whether its input was channels-last."""

    def __init__(self, module: nn.Module) -> None:
        self.dtypes: list[torch.dtype] = []
        self.channels_last: list[bool] = []
        module.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self.dtypes.append(output.dtype)
        x = inputs[0]
        self.channels_last.append(x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))

    def last(self) -> torch.dtype:
        return self.dtypes[-1]


def plan_of(model: nn.Module):
    return training.plans.get(model)


def train_steps(model, optimizer, x, y, steps=2, loss_fn=F.cross_entropy):
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        optimizer.step()
    return out, loss


@pytest.fixture(autouse=True)
def _clean_state():
    """Every test starts and ends unpatched."""
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


# --- finding the model ----------------------------------------------------------------


def test_resnet18_paired_at_train_runs_bf16_inside_and_returns_fp32():
    with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        model.train()
        probe = Probe(model.fc)
        x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
        out, loss = train_steps(model, optimizer, x, y)
        assert probe.last() == torch.bfloat16  # the model computed in bf16...
        assert out.dtype == torch.float32 and loss.dtype == torch.float32  # ...the user sees fp32
        assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
        assert not model.conv1.weight.is_contiguous()
        details = nanopatch.status()["targets"]["training"]["details"]
        assert [d["model"] for d in details] == ["ResNet"]
        assert details[0]["bf16"] is True and details[0]["channels_last"] == "channels_last"
        assert details[0]["optimizers"] == ["SGD"]
        # only the outermost module called counts: no child module got a plan of its own
        assert list(training.plans) == [model]
    # undone: the stock forward, stock strides, plain fp32
    assert "forward" not in model.__dict__
    assert model.conv1.weight.is_contiguous()
    out = model(x)
    assert probe.last() == torch.float32 and out.dtype == torch.float32


def test_optimizer_built_after_train_is_paired_at_the_first_forward():
    with nanopatch.patched(bf16=True, **NATIVE):
        model = small_cnn()
        model.train()
        optimizer = torch.optim.Adam(model.parameters())
        probe = Probe(model[0])
        assert discovery.search.hooks  # searching while the optimizer is unpaired
        out = model(torch.randn(2, 3, 8, 8))
        assert probe.last() == torch.bfloat16  # this very first call is accelerated
        assert out.dtype == torch.float32
        assert not amp.autocast_enabled()  # nothing leaks out of the call
        assert not discovery.search.hooks and not discovery.search.pending
        assert plan_of(model).optimizers == ["Adam"]
        out.sum().backward()
        optimizer.step()


def test_script_that_never_calls_train_is_paired_in_grad_mode_only():
    with nanopatch.patched(bf16=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.no_grad():
            model(torch.randn(2, 3, 8, 8))  # e.g. a model summary: not training
        assert plan_of(model) is None
        probe = Probe(model[-1])
        train_steps(model, optimizer, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
        assert plan_of(model) is not None and probe.dtypes == [torch.bfloat16, torch.bfloat16]


def test_search_ends_at_the_first_step_when_no_model_is_found_and_says_so_once():
    with nanopatch.patched(**NATIVE):
        weight = nn.Parameter(torch.randn(3))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        with pytest.warns(NanopatchWarning, match="accelerated no model for SGD: no module holding its parameters"):
            (weight * 2).sum().backward()
            optimizer.step()
        assert not discovery.search.pending and not discovery.search.hooks
        entry = nanopatch.status()["targets"]["training"]["details"][-1]
        assert entry["model"] is None and entry["optimizers"] == ["SGD"] and "no module" in entry["stock"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            optimizer.step()  # said once


def test_a_model_trained_around_its_accelerated_forward_is_reported():
    with nanopatch.patched(bf16=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
        train_steps(model, optimizer, x, y, steps=1)  # found and accelerated
        with pytest.warns(NanopatchWarning, match="did not run in the last 3 steps of SGD"):
            for _ in range(4):  # the class's forward called directly: stock
                optimizer.zero_grad()
                F.cross_entropy(nn.Sequential.forward(model, x), y).backward()
                optimizer.step()


def test_gan_two_models_two_optimizers():
    with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
        torch.manual_seed(0)
        gen = nn.Sequential(nn.Linear(8, 3 * 8 * 8), nn.Unflatten(1, (3, 8, 8)), nn.Conv2d(3, 3, 3, padding=1))
        disc = small_cnn(classes=1)
        gen_probe, disc_probe = Probe(gen[2]), Probe(disc[0])
        opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
        opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
        gen.train()
        disc.train()
        real = torch.randn(4, 3, 8, 8)
        for _ in range(2):
            fake = gen(torch.randn(4, 8))
            assert fake.dtype == torch.float32
            d_loss = F.binary_cross_entropy_with_logits(
                disc(real), torch.ones(4, 1)
            ) + F.binary_cross_entropy_with_logits(disc(fake.detach()), torch.zeros(4, 1))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = F.binary_cross_entropy_with_logits(disc(fake), torch.ones(4, 1))
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
        assert torch.isfinite(g_loss) and torch.isfinite(d_loss)
        assert plan_of(gen).optimizers == ["Adam"] and plan_of(disc).optimizers == ["Adam"]
        assert len(training.plans) == 2
        # inside both models: bf16 computation; the discriminator's images arrive channels-last
        # (the generator's input is a 2-D noise vector: nothing to convert)
        assert set(gen_probe.dtypes) == {torch.bfloat16} and set(disc_probe.dtypes) == {torch.bfloat16}
        assert set(disc_probe.channels_last) == {True} and len(disc_probe.channels_last) == 6


def test_transformer_models_get_bf16_and_channels_last_only_with_convolutions():
    with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
        encoder = nn.Sequential(nn.Embedding(50, 32), nn.TransformerEncoder(layer, num_layers=2), nn.Linear(32, 50))
        optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-3)
        encoder.train()
        tokens = torch.randint(0, 50, (2, 16))
        out, loss = train_steps(
            encoder, optimizer, tokens, tokens, loss_fn=lambda o, t: F.cross_entropy(o.reshape(-1, 50), t.reshape(-1))
        )
        assert out.dtype == torch.float32 and torch.isfinite(loss)
        assert plan_of(encoder).describe()["channels_last"] is False

        vit = torchvision.models.VisionTransformer(
            image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
        )
        opt_vit = torch.optim.AdamW(vit.parameters(), lr=1e-3)
        vit.train()
        probe = Probe(vit.heads)
        out, _ = train_steps(vit, opt_vit, torch.randn(2, 3, 32, 32), torch.tensor([1, 2]))
        assert out.dtype == torch.float32 and probe.last() == torch.bfloat16
        assert plan_of(vit).describe()["channels_last"] == "channels_last"  # its patch embedding


def test_3d_convolutions_get_channels_last_3d():
    with nanopatch.patched(channels_last=True, **NATIVE):
        model = nn.Sequential(nn.Conv3d(2, 4, 3), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        seen = []
        model[0].register_forward_pre_hook(
            lambda m, i: seen.append(i[0].is_contiguous(memory_format=torch.channels_last_3d))
        )
        train_steps(model, optimizer, torch.randn(2, 2, 5, 5, 5), torch.tensor([0, 1]), steps=1)
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
        assert seen == [True]  # the 5-D input was converted at the forward boundary
    assert model[0].weight.is_contiguous()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_ddp_steps_as_stock(ddp, model):
    """A step through ``ddp`` (one process) gives ``model`` the gradients a copy of it gets on
    its own, with no stride mismatch warning (where the weights' strides differ from DDP's
    buckets, torch misplaces the averaged gradients' elements)."""
    reference = copy.deepcopy(model)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for net in (ddp, reference):
            net.zero_grad()
            F.cross_entropy(net(x), y).backward()
    for mine, stock in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, stock.grad)


def test_model_wrapped_in_distributed_data_parallel():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with nanopatch.patched(bf16=True, channels_last=True, **NATIVE), warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. DDP's "grad strides do not match bucket view strides"
            model = small_cnn()
            ddp = nn.parallel.DistributedDataParallel(model)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            ddp.train()
            probe, first = Probe(model[-1]), Probe(model[0])
            out, loss = train_steps(ddp, optimizer, torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
            assert out.dtype == torch.float32 and probe.last() == torch.bfloat16 and torch.isfinite(loss)
            assert first.channels_last == [True, True] and set(first.dtypes) == {torch.bfloat16}
            described = plan_of(ddp).describe()
            # made channels-last before DDP laid its buckets out: no stride mismatch warning
            assert described["model"] == "DistributedDataParallel" and described["channels_last"] == "channels_last"
            assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert model[0].weight.is_contiguous()  # undone, and DDP's buckets laid out again for it:
        assert_ddp_steps_as_stock(ddp, model)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not cpu.host_facts().avx2, reason="channels-last is nanopatch's own choice only with AVX2")
@pytest.mark.parametrize("why", ["find_unused_parameters", "comm_hook"])
def test_a_ddp_that_cannot_lay_its_buckets_out_again_keeps_its_channels_last_weights(caplog, why):
    """DDP with ``find_unused_parameters=True`` never rebuilds its gradient buckets, and one
    with a communication hook of the script's must not (PowerSGD keeps state per bucket): the
    channels-last nanopatch gave the model before the wrap is not measured (its notes say why),
    at unpatch the weights stay so (said in a warning), and its steps after are right (with the
    weights back to stock's strides torch would misplace the averaged gradients' elements)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with nanopatch.patched(bf16=True, **NATIVE):  # channels-last: nanopatch's own choice
            model = small_cnn()
            ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=why == "find_unused_parameters")
            if why == "comm_hook":
                ddp.register_comm_hook(None, default_hooks.allreduce_hook)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            ddp.train()
            train_steps(ddp, optimizer, torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
            described = plan_of(ddp).describe()
            assert described["channels_last"] == "channels_last" and described["channels_last_measured"] is None
            reason = "looks for unused parameters" if why == "find_unused_parameters" else "communication hook"
            assert any(n.startswith("channels-last given before") and reason in n for n in described["notes"])
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last) and not model[0].weight.is_contiguous()
        assert any("keeps its channels-last weights" in r.getMessage() for r in caplog.records)
        assert_ddp_steps_as_stock(ddp, model)
    finally:
        dist.destroy_process_group()


def test_a_set_up_that_fails_in_a_ddp_leaves_its_layout_to_the_unpatch(monkeypatch):
    """A model set up inside a script's DDP, whose set-up fails after it took the channels-last
    layout given at the wrap: the model runs stock, its weights stay as DDP's buckets have them
    (no re-layout, no rebuild on one rank alone), and the unpatch restores them, buckets too."""
    import torch.distributed as dist

    from nanopatch.targets.training import forward as fw

    def broken(module, plan):
        raise RuntimeError("set-up broke")

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
            model = small_cnn()
            ddp = nn.parallel.DistributedDataParallel(model)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            ddp.train()
            monkeypatch.setattr(fw, "install", broken)
            train_steps(ddp, optimizer, torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
            assert "set-up broke" in plan_of(ddp).stock
            assert model in discovery.search.converted
            assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
            assert_ddp_steps_as_stock(ddp, model)
        assert model[0].weight.is_contiguous()
        assert_ddp_steps_as_stock(ddp, model)
    finally:
        dist.destroy_process_group()


def test_model_wrapped_in_data_parallel():
    with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
        model = small_cnn()
        wrapped = nn.DataParallel(model)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        wrapped.train()
        first = Probe(model[0])
        out, _ = train_steps(wrapped, optimizer, torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
        assert out.dtype == torch.float32 and plan_of(wrapped) is not None
        assert set(first.dtypes) == {torch.bfloat16} and first.channels_last == [True, True]


# --- outputs --------------------------------------------------------------------------


Pair = collections.namedtuple("Pair", "logits features")


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    extra: dict
    count: int = 3


@dataclasses.dataclass(frozen=True)
class FrozenOutput:
    logits: torch.Tensor


class ModelOutputLike(collections.OrderedDict):
    """What Hugging Face models return: a dict whose items are also attributes."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        object.__setattr__(self, key, value)


class Heads(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        y = self.linear(x)
        if self.kind == "tuple":
            return y, [y * 2, 7], None
        if self.kind == "namedtuple":
            return Pair(y, y.detach())
        if self.kind == "dict":
            return {"logits": y, "nested": {"a": (y,)}, "index": torch.arange(3)}
        if self.kind == "dataclass":
            return Output(y, {"z": y})
        if self.kind == "frozen":
            return FrozenOutput(y)
        if self.kind == "modeloutput":
            out = ModelOutputLike()
            out["logits"] = y
            return out
        raise AssertionError(self.kind)


def floating_dtypes(value, found=None):
    found = [] if found is None else found
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            found.append(value.dtype)
    elif isinstance(value, (list, tuple)):
        for v in value:
            floating_dtypes(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            floating_dtypes(v, found)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            floating_dtypes(getattr(value, f.name), found)
    return found


@pytest.mark.parametrize("kind", ["tuple", "namedtuple", "dict", "dataclass", "frozen", "modeloutput"])
def test_nested_outputs_come_back_in_fp32_with_their_types(kind):
    with nanopatch.patched(bf16=True, **NATIVE):
        model = Heads(kind)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        probe = Probe(model.linear)
        out = model(torch.randn(2, 4))
        assert probe.last() == torch.bfloat16
        stock = Heads(kind)(torch.randn(2, 4))
        assert type(out) is type(stock)
        dtypes = floating_dtypes(out)
        assert dtypes and set(dtypes) == {torch.float32}
        if kind == "tuple":
            assert out[1][1] == 7 and out[2] is None
        if kind == "dict":
            assert out["index"].dtype == torch.int64
        if kind == "modeloutput":
            assert out.logits is out["logits"] and out.logits.dtype == torch.float32
        optimizer.zero_grad()


class Slotted:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class SlottedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return Slotted(self.linear(x))


def test_an_output_nanopatch_cannot_cast_turns_autocast_off_for_that_model(caplog):
    caplog.set_level(logging.WARNING, logger="nanopatch")
    with nanopatch.patched(bf16=True, **NATIVE):
        model = SlottedModel()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841 - kept alive: it is what pairs
        model.train()
        probe = Probe(model.linear)
        model(torch.randn(2, 4))
        second = model(torch.randn(2, 4))
        assert probe.dtypes == [torch.bfloat16, torch.float32]  # stock from the second call on
        assert second.value.dtype == torch.float32
        said = [r for r in caplog.records if "cannot cast back to fp32" in r.getMessage()]
        assert len(said) == 1
        assert any("autocast off" in note for note in plan_of(model).notes)


def test_the_users_own_autocast_keeps_working():
    with nanopatch.patched(bf16=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(2, 3, 8, 8))
        assert out.dtype == torch.bfloat16  # what stock gives under the user's autocast
        F.cross_entropy(out.float(), torch.tensor([0, 1])).backward()
        optimizer.step()


@pytest.mark.parametrize("bf16_eval", [True, False])
def test_eval_mode_keeps_autocast_unless_switched_off(bf16_eval):
    with nanopatch.patched(bf16=True, bf16_eval=bf16_eval, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841 - kept alive: it is what pairs
        model.train()
        probe = Probe(model[-1])
        model(torch.randn(2, 3, 8, 8))  # a training call finds the model
        model.eval()
        with torch.no_grad():
            out = model(torch.randn(2, 3, 8, 8))
        assert out.dtype == torch.float32
        assert probe.last() == (torch.bfloat16 if bf16_eval else torch.float32)
        model.train()
        model(torch.randn(2, 3, 8, 8))
        assert probe.last() == torch.bfloat16


def test_a_cpu_without_native_bf16_trains_in_fp32_and_says_why(machine):
    machine("xeon_skylake_4c.cpuinfo")
    with nanopatch.patched(**NATIVE):
        status = nanopatch.status()
        assert status["options"]["bf16"]["value"] is False
        assert "no native bf16" in status["options"]["bf16"]["reason"]
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        probe = Probe(model[-1])
        out, _ = train_steps(model, optimizer, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
        assert probe.last() == torch.float32 and out.dtype == torch.float32
        described = plan_of(model).describe()
        assert described["bf16"] is False and described["channels_last"] == "channels_last"


class ChosenDtypes(nn.Module):
    """A body the script cast to ``dtype``, and a head in ``head`` (fp32: an adapter's place)."""

    def __init__(self, dtype: torch.dtype, head: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16)).to(dtype)
        self.head = nn.Linear(16, 4).to(head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.to(self.body[0].weight.dtype)).to(self.head.weight.dtype))


@pytest.mark.parametrize("weights", ["bf16", "bf16-base-fp32-head", "fp16", "fp64-by-default"])
def test_a_model_the_script_gave_its_own_weight_dtypes_computes_in_them(weights, monkeypatch):
    """``model.to(torch.bfloat16)`` (or a bf16 base with an fp32 head): stock's outputs are bf16
    and its layer norm computes in bf16. Under autocast they were fp32 (an ``assert out.dtype ==
    torch.bfloat16`` failed); now autocast stays off for it, with a note, and the rest (the fused
    step) applies. ``torch.set_default_dtype(torch.float64)``: the self-checks, which built their
    probes in the default dtype, failed and the model ran stock whole; now they probe in fp32."""
    dtype = {"fp16": torch.float16, "fp64-by-default": torch.float64}.get(weights, torch.bfloat16)
    head = torch.float32 if weights == "bf16-base-fp32-head" else dtype
    if weights == "fp64-by-default":
        monkeypatch.setattr(selfcheck, "_results", {})  # probed afresh under this default
        torch.set_default_dtype(torch.float64)  # restored in the finally
    try:
        x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
        stock_model = ChosenDtypes(dtype, head)
        stock_norm = Probe(stock_model.body[1])
        stock = stock_model(x)
        with nanopatch.patched(bf16=True, **NATIVE):
            model = ChosenDtypes(dtype, head)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            norm = Probe(model.body[1])
            out, _ = train_steps(model, optimizer, x, y, loss_fn=lambda o, t: F.cross_entropy(o.float(), t))
            plan = plan_of(model)
            assert plan is not None and plan.stock is None and plan.amp_dtype is None
            assert out.dtype == stock.dtype == head and norm.last() == stock_norm.last() == dtype
            assert "AdamW: fused step" in plan.notes
            (note,) = (n for n in plan.notes if n.startswith("bf16 autocast off"))
            assert "the script chose its weights' dtypes" in note and str(dtype).removeprefix("torch.") in note
            assert torch.get_default_dtype() == (torch.float64 if weights == "fp64-by-default" else torch.float32)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_a_model_the_script_casts_after_training_computes_in_its_new_dtype(dtype):
    """``model.to(torch.float16)`` to serve it after training: under the autocast set up for its
    fp32 training an fp16 layer norm raised ("mixed dtype (CPU)") and bf16 outputs came back fp32.
    Now the forward sees the cast and computes as stock would; cast back, it is accelerated again."""
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    with nanopatch.patched(bf16=True, **NATIVE):
        model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        norm = Probe(model[1])
        train_steps(model, optimizer, x, y)
        assert norm.last() == torch.bfloat16 and plan_of(model).amp_dtype == torch.bfloat16
        model.eval().to(dtype)
        with torch.no_grad():
            out = model(x.to(dtype))
        assert out.dtype == dtype and norm.last() == dtype
        probe = Probe(model[0])
        model.float()
        with torch.no_grad():
            assert model(x).dtype == torch.float32 and probe.last() == torch.bfloat16


# --- fallbacks ------------------------------------------------------------------------


def test_lbfgs_runs_stock(caplog):
    caplog.set_level(logging.INFO, logger="nanopatch")
    with nanopatch.patched(bf16=True, **NATIVE):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        optimizer = torch.optim.LBFGS(model.parameters(), max_iter=5)
        model.train()
        probe = Probe(model)
        x, y = torch.randn(16, 3), torch.randn(16, 1)

        def closure():
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        optimizer.step(closure)
        assert set(probe.dtypes) == {torch.float32}
        assert "LBFGS" in plan_of(model).stock and "forward" not in model.__dict__
    assert any("runs stock" in r.getMessage() and "LBFGS" in r.getMessage() for r in caplog.records)


class SparseRecommender(nn.Module):
    """A recommender's shape: a sparse embedding bag (its gradients are sparse tensors) and an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(50, 8, mode="sum", sparse=True)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(ids)).squeeze(1)


@pytest.mark.parametrize("groups", ["one", "two"])
def test_a_model_with_sparse_gradients_is_accelerated_with_torchs_step_for_them(groups):
    """A model with an ``Embedding(sparse=True)`` ran stock whole; it is accelerated now, and an
    optimizer group whose parameters get sparse gradients goes back to torch's default step at
    its first step (the fused one raises on them): the other groups keep the fast one."""
    g = torch.Generator().manual_seed(0)
    ids, target = torch.randint(0, 50, (16, 3), generator=g), torch.randn(16, generator=g)
    with nanopatch.patched(bf16=True, **NATIVE):
        model = SparseRecommender()
        params = (
            model.parameters()
            if groups == "one"
            else [{"params": model.embed.parameters()}, {"params": model.mlp.parameters()}]
        )
        optimizer = torch.optim.SGD(params, lr=0.1)
        model.train()
        for _ in range(3):
            optimizer.zero_grad()
            F.mse_loss(model(ids), target).backward()
            assert model.embed.weight.grad.is_sparse
            optimizer.step()
        plan = plan_of(model)
        assert plan.stock is None and plan.installed
        assert optimizer.param_groups[0].get("fused") is None and optimizer.param_groups[0].get("foreach") is None
        fast = [note for note in plan.notes if note.startswith("SGD: ")]
        if groups == "one":
            assert fast == []
        elif fast:  # this torch has a fast step for SGD: the dense group keeps it
            flag = fast[0].split()[1]
            assert fast == [f"SGD: {flag} step but for its groups with sparse gradients"]
            assert optimizer.param_groups[1][flag] is True
        state = optimizer.state_dict()
    assert all(group.get("fused") is None and group.get("foreach") is None for group in state["param_groups"])
    assert all(group.get("fused") is None and group.get("foreach") is None for group in optimizer.param_groups)


def _relaid_by_the_script(how: str, make_optimizer) -> list[torch.Tensor]:
    """Five steps of a conv net in which the script lays a weight or a gradient out contiguously
    itself after the second step: Lookahead's ``p.data = slow.clone()``, or a gradient set by
    hand (per-sample gradients averaged, DP-SGD's way)."""
    torch.manual_seed(0)
    model = nn.Sequential(  # (no bias before the norm: its gradient is rounding alone, which Adam magnifies)
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )
    optimizer = make_optimizer(model.parameters())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)
    model.train()
    for step in range(5):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if how == "grad" and step >= 2:
            for p in model.parameters():
                p.grad = torch.stack([p.grad.clone(memory_format=torch.contiguous_format)] * 2).mean(0)
        optimizer.step()
        if how == "weights" and step == 2:
            for p in model.parameters():
                p.data = p.detach().clone(memory_format=torch.contiguous_format)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("how", ["weights", "grad"])
@pytest.mark.parametrize(
    "make_optimizer",
    [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: torch.optim.AdamW(ps, lr=1e-2)],
    ids=["sgd-momentum", "adamw"],
)
def test_a_weight_or_gradient_the_script_lays_out_keeps_the_fused_step_exact(how, make_optimizer):
    """torch's fused CPU steps walk a weight, its gradient and its state as flat memory: under
    nanopatch's channels-last weights, a contiguous weight or gradient the script made beside
    channels-last momentum got the wrong elements added, silently (0.45 off after two steps in
    the reproduction). The step's guard lays them out alike first: the same weights as stock."""
    stock = _relaid_by_the_script(how, make_optimizer)
    with nanopatch.patched(bf16=False, channels_last=True, **NATIVE):
        patched = _relaid_by_the_script(how, make_optimizer)
        plan = next(iter(training.plans.values()))
        assert plan.rank == 4 and any(note.endswith(": fused step") for note in plan.notes)
    for s, p in zip(stock, patched, strict=True):
        torch.testing.assert_close(p, s, rtol=1e-4, atol=1e-5)


def test_a_failing_setup_leaves_the_model_stock(monkeypatch):
    def broken(model, rank, *more):
        raise RuntimeError("boom")

    monkeypatch.setattr(discovery.mf, "convert_model", broken)
    with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        out, _ = train_steps(model, optimizer, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
        assert "boom" in plan_of(model).stock and "forward" not in model.__dict__
        assert out.dtype == torch.float32


# --- optimizer steps ------------------------------------------------------------------


def test_fused_step_only_where_the_user_left_it_unset_and_checkpoints_stay_stock():
    with nanopatch.patched(**NATIVE):
        model = small_cnn()
        default = torch.optim.SGD(model.parameters(), lr=0.1)
        chosen = torch.optim.Adam(model.parameters(), foreach=False)
        model(torch.randn(2, 3, 8, 8))  # the first training call finds the model
        flag = discovery.optim.choose_flag(default)
        assert flag in ("fused", "foreach")
        assert default.param_groups[0][flag] is True
        assert chosen.param_groups[0]["foreach"] is False and chosen.param_groups[0]["fused"] is None
        assert default.state_dict()["param_groups"][0][flag] is None  # as stock would save it
        default.load_state_dict(default.state_dict())
        assert default.param_groups[0][flag] is True  # re-applied after loading
    assert default.param_groups[0][flag] is None  # undone


def test_third_party_optimizer_subclasses_are_found():
    class Lion(torch.optim.Optimizer):  # a third-party optimizer: a plain subclass
        def __init__(self, params, lr=1e-4):
            super().__init__(params, {"lr": lr})
            self.built = True  # the subclass finishes after Optimizer.__init__ returns

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(torch.sign(p.grad), alpha=-group["lr"])

    with nanopatch.patched(bf16=True, **NATIVE):
        model = small_cnn()
        optimizer = Lion(model.parameters())
        model.train()
        out, _ = train_steps(model, optimizer, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
        assert plan_of(model).optimizers == ["Lion"] and out.dtype == torch.float32


# --- undo, copies, signatures ---------------------------------------------------------


def test_trained_under_patched_then_used_under_unpatched_is_plain_fp32_and_comes_back():
    nanopatch.patch_torch(bf16=True, channels_last=True, **NATIVE)
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    probe = Probe(model[-1])
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    train_steps(model, optimizer, x, y)
    with nanopatch.unpatched():
        assert "forward" not in model.__dict__ and model[0].weight.is_contiguous()
        model.eval()
        out = model(x)
        assert probe.last() == torch.float32 and out.dtype == torch.float32
    model.train()  # back under the patch: accelerated again
    train_steps(model, optimizer, x, y, steps=1)
    assert probe.last() == torch.bfloat16
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_deepcopies_and_pickles_carry_nothing_of_nanopatch(tmp_path):
    with nanopatch.patched(bf16=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
        train_steps(model, optimizer, x, y)
        assert isinstance(model.__dict__["forward"], nanopatch.targets.training.forward.AcceleratedForward)
        ema = copy.deepcopy(model)
        assert "forward" not in ema.__dict__  # a plain copy: the class's forward
        ema_probe = Probe(ema[-1])
        assert ema(x).dtype == torch.float32 and ema_probe.last() == torch.float32
        path = tmp_path / "model.pt"
        torch.save(model, path)
        loaded = torch.load(path, weights_only=False)
        assert "forward" not in loaded.__dict__
        torch.testing.assert_close(loaded.eval()(x), nn.Sequential.forward(model.eval(), x))
        assert inspect.signature(model.forward) == inspect.signature(small_cnn().forward)
        assert b"nanopatch" not in path.read_bytes()
        with torch.serialization.safe_globals(
            [nn.Sequential, nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Linear]
        ):
            torch.load(path, weights_only=True)  # what stock needs, and nothing more
    assert "forward" not in model.__dict__


def test_safetensors_saves_the_channels_last_weights_as_stock_does(tmp_path):
    """``save_file(model.state_dict(), path)`` raised "You are trying to save a non contiguous
    tensor" on the weights nanopatch laid out channels-last; stock saves them. Now its savers get
    them in stock's strides, the same values; a tensor the script laid out itself still raises,
    as in stock, and the savers are safetensors' own again after unpatch."""
    st = pytest.importorskip("safetensors.torch")
    stock_save_file, stock_save = st.save_file, st.save
    with nanopatch.patched(bf16=False, channels_last=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        train_steps(model, optimizer, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
        assert not model[0].weight.is_contiguous()  # channels-last, as trained
        for on in (False, True):  # the layout trial's switches (which once raised on the weights' record)
            discovery.mf.relayout(model, 4, on, [optimizer])
        state = model.state_dict()
        st.save_file(state, tmp_path / "file.safetensors")
        st.save_model(model, tmp_path / "model.safetensors")
        blob = st.save(tensors=state)
        for loaded in (st.load_file(tmp_path / "file.safetensors"), st.load_file(tmp_path / "model.safetensors")):
            assert loaded.keys() == state.keys()
            assert all(torch.equal(loaded[k], v) for k, v in state.items())
        assert st.load(blob)["0.weight"].equal(state["0.weight"])
        assert not model[0].weight.is_contiguous()  # the model's own weights are left as they are
        own = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
        with pytest.raises(ValueError, match="non contiguous"):
            st.save_file({"own": own}, tmp_path / "own.safetensors")
    assert st.save_file is stock_save_file and st.save is stock_save


@pytest.mark.parametrize("how", ["jit.trace", "export"])
def test_an_artifact_traced_from_a_trained_model_is_stocks(tmp_path, how):
    """``torch.export.export(model, ...)`` after training under nanopatch raised AttributeError
    (it reads ``model.forward.__code__``), and ``torch.jit.trace`` recorded nanopatch's bf16
    autocast into the artifact (2.2e-3 from stock's outputs). An artifact outlives the process:
    tracing (and the trace's check, which runs the model again) now gets the model's own forward,
    and the artifact computes what stock's does."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        train_steps(model, optimizer, x, y)
        model.eval()
        probe = Probe(model[-1])
        with torch.no_grad():
            assert model(x).dtype == torch.float32 and probe.last() == torch.bfloat16  # eval keeps bf16
            stock = nn.Sequential.forward(model, x)
        assert model.forward.__code__ is nn.Sequential.forward.__code__
        assert not hasattr(model.forward, "__func__")  # not a bound method: accelerate wraps it as a callable
        with warnings.catch_warnings():
            # trace's own check runs the model again: as the trace (it warned of a mismatch)
            warnings.simplefilter("error", torch.jit.TracerWarning)
            if how == "jit.trace":
                torch.jit.trace(model, x).save(tmp_path / "model.pt")
                artifact = torch.jit.load(tmp_path / "model.pt")
            else:
                torch.export.save(torch.export.export(model, (x,)), tmp_path / "model.pt2")
                artifact = torch.export.load(tmp_path / "model.pt2").module()
        assert probe.last() == torch.float32  # traced in fp32
        with torch.no_grad():
            out = artifact(x)
        assert out.dtype == torch.float32 and torch.equal(out, stock)
        assert "forward" in model.__dict__  # still accelerated for the calls that train it


def test_a_models_own_instance_forward_is_kept_and_restored():
    model = small_cnn()
    calls = []

    def custom(x):
        calls.append(x.shape)
        return nn.Sequential.forward(model, x)

    model.forward = custom
    with nanopatch.patched(bf16=True, **NATIVE):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841 - kept alive: it is what pairs
        model.train()
        out = model(torch.randn(2, 3, 8, 8))
        assert out.dtype == torch.float32 and len(calls) == 1
    assert model.forward is custom


def test_training_hooks_are_exactly_undone():
    stock_init = torch.optim.Optimizer.__dict__["__init__"]
    stock_train = nn.Module.__dict__["train"]
    nanopatch.patch_torch(**NATIVE)
    nanopatch.patch_torch(**NATIVE)  # idempotent
    assert torch.optim.Optimizer.__dict__["__init__"] is not stock_init
    nanopatch.unpatch_torch()
    nanopatch.unpatch_torch()
    assert torch.optim.Optimizer.__dict__["__init__"] is stock_init
    assert nn.Module.__dict__["train"] is stock_train
    assert not discovery.search.hooks and not discovery.search.pending


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    def failing_compile(fn, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("backend exploded")

        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    with nanopatch.patched(bf16=True, compile="default", **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
        with pytest.warns(NanopatchWarning, match="torch.compile of Sequential failed"):
            out, _ = train_steps(model, optimizer, x, y)
        assert out.dtype == torch.float32
        assert plan_of(model).compile_mode is False
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            train_steps(model, optimizer, x, y, steps=1)  # said once


def test_a_models_own_errors_are_raised_as_stock_raises_them():
    with nanopatch.patched(bf16=True, **NATIVE):
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841 - kept alive: it is what pairs
        model.train()
        with pytest.raises(RuntimeError) as ours:
            model(torch.randn(2, 5, 8, 8))  # wrong channel count
    with pytest.raises(RuntimeError) as stock:
        small_cnn()(torch.randn(2, 5, 8, 8))
    assert type(ours.value) is type(stock.value)
    assert not amp.autocast_enabled()


def test_real_compile_matches_eager():
    with nanopatch.patched(bf16=False, compile="default", **NATIVE):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        reference = copy.deepcopy(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841 - kept alive: it is what pairs
        x = torch.randn(4, 8)
        model(x)  # the first training call finds the model; the next ones run compiled
        out = model(x)
        assert plan_of(model).compiled is not None
        assert plan_of(model).compile_mode == "default"
    torch.testing.assert_close(out, nn.Sequential.forward(reference, x), rtol=1e-5, atol=1e-5)


# --- code that nanopatch's changes would make fail (rescue.py) -----------------------------


def _lenet_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, calls: int = 1) -> None:
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        for _ in range(calls):
            F.cross_entropy(
                model(torch.randn(8, 3, 32, 32, generator=g)), torch.randint(0, 4, (8,), generator=g)
            ).backward()
        optimizer.step()


@pytest.mark.parametrize("calls", [1, 2], ids=["one-call-a-step", "two-calls-before-the-first-step"])
def test_a_view_that_channels_last_strides_do_not_allow_turns_channels_last_off(calls):
    """It raised at the model's first call (the LeNet of countless scripts; torchvision's Keypoint
    R-CNN loss). The first calls run with the view copying; the first step lays the weights,
    gradients and momentum out as stock's again, and the model trains on in stock's layout."""
    with nanopatch.patched(channels_last=True, **NATIVE):
        model = LeNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        _lenet_steps(model, optimizer, 1, calls)
        plan = plan_of(model)
        assert plan.stock is None and plan.rank is None and plan.layout is None
        assert model.c1.weight.is_contiguous() and optimizer.state[model.c1.weight]["momentum_buffer"].is_contiguous()
        assert any(
            note.startswith("channels-last off: its forward views a convolution's output") for note in plan.notes
        )
        _lenet_steps(model, optimizer, 3, calls)
        status = nanopatch.status()["targets"]["training"]["details"][-1]
        assert status["channels_last"] is False and status["channels_last_measured"].startswith(
            "off: its forward views"
        )


def test_a_view_that_fails_only_in_eval_is_rescued_there():
    """A later call (validation) meets the failing view: it runs again with the view copying,
    and channels-last goes off at the next step."""
    with nanopatch.patched(channels_last=True, **NATIVE):
        model = LeNet(views_in_eval_only=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        _lenet_steps(model, optimizer, 2)
        assert plan_of(model).rank is not None and not model.c1.weight.is_contiguous()  # channels-last trains
        model.eval()
        with torch.no_grad():
            out = model(torch.randn(8, 3, 32, 32))
        assert out.shape == (8, 4) and out.dtype == torch.float32
        _lenet_steps(model, optimizer, 1)
        assert plan_of(model).rank is None and model.c1.weight.is_contiguous()


class HandMixedDtypes(nn.Module):
    """A router written for fp32 alone: each expert's output, scaled by its weight, is
    ``index_add_``-ed into an fp32 tensor (under bf16 autocast the products are bf16)."""

    def __init__(self, width: int = 16, experts: int = 3) -> None:
        super().__init__()
        self.route = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.route(x).argmax(-1)
        out = torch.zeros(x.shape, dtype=torch.float32)
        for i, expert in enumerate(self.experts):
            rows = (choice == i).nonzero().squeeze(1)
            out.index_add_(0, rows, expert(x[rows]))
        return self.head(out + x)


def test_a_forward_that_mixes_dtypes_by_hand_runs_and_turns_bf16_off():
    """It raised under bf16 autocast at the model's first call; the failing op runs again in
    fp32 and the model computes in fp32 from its next call, with a note saying why."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 16, generator=g), torch.randint(0, 2, (32,), generator=g)
    with nanopatch.patched(bf16=True, **NATIVE):
        model = HandMixedDtypes()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model.train()
        for _ in range(3):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        plan = plan_of(model)
        assert plan.stock is None and plan.amp_dtype is None
        assert plan.bf16_failed is not None and "same scalar type" in plan.bf16_failed
        assert any(note.startswith("bf16 autocast off: its forward fails under it") for note in plan.notes)


class HandMixedMatmul(torch.autograd.Function):
    """``x @ w`` written as a Function without ``torch.amp.custom_bwd``: under bf16 autocast
    its forward computes in bf16 and its backward gets a bf16 gradient beside the fp32 ``w``."""

    backwards = 0  # how many times its backward ran
    forward_dtypes: list[torch.dtype] = []

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        out = x @ w
        HandMixedMatmul.forward_dtypes.append(out.dtype)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        HandMixedMatmul.backwards += 1
        x, w = ctx.saved_tensors
        return grad @ w.T, x.T @ grad


class WithAFunction(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.w = nn.Parameter(torch.randn(width, width) * 0.2)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(HandMixedMatmul.apply(torch.relu(self.inner(x)), self.w)))


def _train_with_a_function(steps: int) -> tuple[nn.Module, list[float]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 16, generator=g), torch.randint(0, 2, (64,), generator=g)
    model = WithAFunction()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    return model, [train_steps(model, optimizer, x, y, steps=1)[1].item() for _ in range(steps)]


def test_a_custom_functions_backward_that_mixes_dtypes_runs_its_failing_ops_in_fp32(monkeypatch):
    """Its backward raised in ``loss.backward()`` (a bf16 gradient beside an fp32 weight); it
    runs again with the failing op in fp32, its later backwards so from the start, and the model
    keeps computing in bf16 (its Function's forward too), with a note saying so."""
    monkeypatch.setattr(HandMixedMatmul, "forward_dtypes", [])
    _, stock = _train_with_a_function(4)
    assert HandMixedMatmul.forward_dtypes == [torch.float32] * 4
    with nanopatch.patched(bf16=True, **NATIVE):
        monkeypatch.setattr(HandMixedMatmul, "backwards", 0)
        monkeypatch.setattr(HandMixedMatmul, "forward_dtypes", [])
        model, patched = _train_with_a_function(4)
        plan = plan_of(model)
        assert plan.amp_dtype == torch.bfloat16 and plan.stock is None
        assert HandMixedMatmul.forward_dtypes == [torch.bfloat16] * 4
        assert HandMixedMatmul.backwards == 5  # the first backward twice (failed, then rescued), then once each
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
        (note,) = (n for n in plan.notes if n.startswith("custom autograd Function"))
        assert "HandMixedMatmul" in note and "same dtype" in note and "run in fp32" in note
    assert patched == pytest.approx(stock, rel=2e-2)


def test_a_custom_functions_own_backward_error_is_raised_as_stock_raises_it():
    """Only a dtype error the rescue cures is cured; a backward's own errors come out as they were,
    under nanopatch as stock, and with no model in bf16 the backward runs as it is."""

    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx, grad: torch.Tensor):
            raise RuntimeError("no backward here: expected dtype float")

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Broken.apply(self.fc(x))

    for options in ({"bf16": True}, {"bf16": False}):
        with nanopatch.patched(**options, **NATIVE):
            model = Model()
            torch.optim.SGD(model.parameters(), lr=0.1)
            model.train()
            with pytest.raises(RuntimeError, match="no backward here"):
                model(torch.randn(3, 4)).sum().backward()


def test_the_backward_wrapper_is_undone_exactly():
    original = torch.autograd.function.BackwardCFunction.__dict__["apply"]
    with nanopatch.patched(bf16=True, **NATIVE):
        assert torch.autograd.function.BackwardCFunction.__dict__["apply"] is not original
    assert torch.autograd.function.BackwardCFunction.__dict__["apply"] is original


class HandsToNumpy(nn.Module):
    """A gate decided in numpy on an intermediate (bf16 under autocast, which numpy lacks)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.score = nn.Linear(16, 1)
        self.body = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.score(x).squeeze(1).detach()
        values = s.numpy() if self.how == "numpy()" else np.asarray(s)
        keep = torch.from_numpy(np.nonzero(values > np.median(values))[0])
        return self.body(x[keep])


@pytest.mark.parametrize("how", ["numpy()", "np.asarray"])
def test_a_forward_that_hands_an_intermediate_to_numpy_runs_and_turns_bf16_off(how):
    """``Tensor.numpy()`` of a bf16 intermediate raised TypeError at the first call; it runs again
    on the fp32 tensor stock has, and the model computes in fp32 from its next call."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 16, generator=g)
    with nanopatch.patched(bf16=True, **NATIVE):
        torch.manual_seed(0)  # a fixed model: a first call's bf16 scores can tie at the median
        model = HandsToNumpy(how)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        for _ in range(3):
            optimizer.zero_grad()
            out = model(x)
            assert out.shape == (16, 2) and out.dtype == torch.float32
            out.square().mean().backward()
            optimizer.step()
        plan = plan_of(model)
        assert plan.stock is None
        try:
            torch.zeros(1, dtype=torch.bfloat16).numpy()
        except TypeError:
            assert plan.amp_dtype is None and "unsupported ScalarType BFloat16" in plan.bf16_failed
        else:  # IPEX, once imported, converts bf16 to numpy itself (as fp32): nothing fails, bf16 stays
            assert plan.amp_dtype == torch.bfloat16 and plan.bf16_failed is None


def test_an_error_of_the_models_own_is_raised_as_stock_raises_it():
    """The rescue cures only what nanopatch's changes make fail: any other error comes out."""

    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).view(3, 7)  # no layout gives 3 x 7

    with nanopatch.patched(bf16=True, channels_last=True, **NATIVE):
        model = Broken()
        torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        with pytest.raises(RuntimeError, match="is invalid for input of size"):
            model(torch.randn(2, 3, 8, 8))
