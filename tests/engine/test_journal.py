"""The patch engine's journal owns every change nanopatch makes, not only module and class
attributes: a model's instance ``forward`` (and its output activations'), an optimizer's step
flags and state-dict hooks, a DataLoader's sampler, torch's global hooks, OpenCV's thread
count. ``status()`` lists them while they are live; after ``unpatch_torch()`` none is left.

Real models, optimizers and loaders, trained for a few steps."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optimizer_mod
from torch.utils.data import DataLoader, TensorDataset

import nanopatch
from nanopatch import engine
from nanopatch.targets.parallel import patch as distributed
from nanopatch.targets.training import patch as training


@pytest.fixture(autouse=True)
def _clean():
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()
    training.plans.clear()


def global_hooks() -> dict[str, set[int]]:
    """The ids in torch's global hook dicts."""
    return {
        "forward_pre": set(module_mod._global_forward_pre_hooks),
        "forward": set(module_mod._global_forward_hooks),
        "step_pre": set(optimizer_mod._global_optimizer_pre_hooks),
        "step_post": set(optimizer_mod._global_optimizer_post_hooks),
    }


def nanopatch_attributes(obj) -> list[str]:
    return [name for name in vars(obj) if "nanopatch" in name.lower()]


def discriminator() -> nn.Module:
    """A model with an output activation (computed in fp32 while patched: its own forward)."""
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(1), nn.Sigmoid())


def train(model, optimizer, loader, steps=2):
    for _, (x, y) in zip(range(steps), loader, strict=False):
        optimizer.zero_grad()
        nn.functional.binary_cross_entropy(model(x).squeeze(1), y).backward()
        optimizer.step()


def test_unpatch_leaves_no_change_on_models_optimizers_and_torchs_hooks():
    data = TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,)).float())
    hooks_before = global_hooks()
    torch.manual_seed(0)
    model = discriminator()
    model(torch.randn(1, 3, 8, 8))  # the lazy layer gets its shape
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(data, batch_size=4, shuffle=True)
    flags_before = [{k: g[k] for k in ("fused", "foreach")} for g in optimizer.param_groups]

    nanopatch.patch_torch(training=True, vision=False, bf16=True, channels_last=True, ipex=False, compile=False)
    train(model, optimizer, loader)
    (plan,) = nanopatch.status()["targets"]["training"]["details"]
    assert plan["bf16"] and plan["fp32_heads"] == 1, plan
    changes = nanopatch.status()["targets"]["training"]["changes"]
    assert any(c.startswith("Sequential(") and c.endswith(".forward") for c in changes), changes
    assert any(c.startswith("Sigmoid(") and c.endswith(".forward") for c in changes), changes
    assert any(c.startswith("SGD(") and "step" in c for c in changes), changes
    assert any("global step hook" in c for c in changes), changes
    assert "forward" in vars(model) and "forward" in vars(model[-1])

    nanopatch.unpatch_torch()
    assert "forward" not in vars(model) and not any("forward" in vars(m) for m in model.modules())
    assert nanopatch_attributes(optimizer) == [] and nanopatch_attributes(model) == []
    assert [{k: g[k] for k in ("fused", "foreach")} for g in optimizer.param_groups] == flags_before
    assert not optimizer._optimizer_state_dict_post_hooks
    assert not optimizer._optimizer_load_state_dict_post_hooks
    assert global_hooks() == hooks_before
    assert engine.JOURNAL.changes() == [] and engine.JOURNAL.records() == []


def test_a_model_dropped_while_patched_is_not_kept_alive_by_the_journal():
    nanopatch.patch_torch(training=True, vision=False, bf16=True, channels_last=False, ipex=False, compile=False)
    model = discriminator()
    model(torch.randn(1, 3, 8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 3, 8, 8), torch.ones(8)), batch_size=4)
    train(model, optimizer, loader)
    assert any(c.where.endswith(".forward") for c in engine.JOURNAL.changes("training"))
    del model, optimizer, loader
    gc.collect()
    gc.collect()  # the model's cycle (it and its forward) first, then its head's
    left = [c.where for c in engine.JOURNAL.changes("training")]
    assert not any(where.endswith(".forward") or where.startswith("SGD(") for where in left), left


def test_a_sharded_loader_gets_its_own_sampler_back(tmp_path, monkeypatch):
    """Data-parallel training shards a DataLoader by replacing its sampler and batch sampler,
    which DataLoader refuses after ``__init__``; unpatch gives it back its own."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        monkeypatch.setattr(distributed._state, "started", True)  # as if nanopatch started the group
        loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, shuffle=True)
        sampler, batches = loader.sampler, loader.batch_sampler
        nanopatch.patch_torch(training=True, data_parallel=True, vision=False, bf16=False, ipex=False)
        assert distributed.shard(loader)
        assert isinstance(loader.sampler, distributed.EpochDistributedSampler)
        assert any(c.endswith(".sampler") for c in nanopatch.status()["targets"]["distributed"]["changes"])
        nanopatch.unpatch_torch()
        assert loader.sampler is sampler and loader.batch_sampler is batches
        assert nanopatch_attributes(loader) == [] and sorted(x.item() for (b,) in loader for x in b) == list(range(8))
    finally:
        dist.destroy_process_group()


def test_opencv_gets_the_users_thread_count_back():
    cv2 = pytest.importorskip("cv2")
    pytest.importorskip("torchvision")  # the vision target applies once torchvision is imported
    from nanopatch.targets.vision import _opencv

    cv2.setNumThreads(2)
    _opencv._configured_in = None  # as in a process where nanopatch has not used OpenCV yet
    with nanopatch.patched(vision=True, training=False):
        _opencv.cv2()
        assert cv2.getNumThreads() == 1
        assert any("cv2.setNumThreads(1)" in c for c in nanopatch.status()["targets"]["vision"]["changes"])
    assert cv2.getNumThreads() == 2
    assert _opencv._configured_in is None


def test_unpatch_from_another_thread_while_a_discovered_call_runs():
    """The model's first training call is found by a global pre-hook, which enters bf16
    autocast for it; its post-hook leaves it. Unpatch from another thread during that call must
    neither remove the post-hook under it (the calling thread would stay in autocast) nor leave
    the hooks behind once the call ends."""
    import threading

    entered, release = threading.Event(), threading.Event()

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            entered.set()
            release.wait(30)
            return self.lin(x)

    hooks_before = global_hooks()
    nanopatch.patch_torch(training=True, vision=False, bf16=True, channels_last=False, ipex=False, compile=False)
    model = Slow()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {}

    def first_step():
        out = model(torch.randn(2, 4))
        seen["autocast after the call"] = torch.is_autocast_enabled("cpu")
        seen["computed in"] = model.lin.weight.dtype, out.dtype
        out.sum().backward()
        optimizer.step()

    worker = threading.Thread(target=first_step)
    worker.start()
    assert entered.wait(30)
    nanopatch.unpatch_torch()
    release.set()
    worker.join(30)
    assert seen["autocast after the call"] is False, seen
    assert global_hooks() == hooks_before
    assert engine.JOURNAL.changes() == [] and "forward" not in vars(model)


@pytest.mark.parametrize("by_hand", [False, True], ids=["stock-layout", "users-channels-last"])
def test_unpatch_gives_the_weights_the_layout_the_user_gave_them(by_hand):
    """nanopatch's channels-last weights are undone at unpatch; weights the user made
    channels-last themself stay so (unpatch undoes only what nanopatch did)."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 3, 8, 8))
    if by_hand:
        model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    nanopatch.patch_torch(training=True, vision=False, bf16=False, channels_last=True, ipex=False, compile=False)
    loader = DataLoader(TensorDataset(torch.randn(8, 3, 8, 8), torch.ones(8)), batch_size=4)
    for x, _ in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert any("channels-last weights" in c for c in nanopatch.status()["targets"]["training"]["changes"]) != by_hand
    nanopatch.unpatch_torch()
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last) == by_hand
    assert model[0].weight.is_contiguous() != by_hand
