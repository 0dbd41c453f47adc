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
from torch import nn

import nanopatch
from nanopatch import NanopatchWarning
from nanopatch.engine import config
from nanopatch.targets.training import ipex as ipex_mod
from nanopatch.targets.training import patch as training

from helpers.training_tasks import shifted_templates_task, small_net, train_and_score

COMPATIBLE, WHY = config.ipex_compatibility()
if not COMPATIBLE:
    if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") == "1":
        raise RuntimeError(f"the ipex env must test IPEX, but {WHY}")
    pytest.skip(f"IPEX path: {WHY}", allow_module_level=True)

torchvision = pytest.importorskip("torchvision")

# IPEX's bf16 needs instructions some CPUs lack (an AMD EPYC with AVX2 alone): there nanopatch
# uses IPEX in fp32 only, and the tests of the IPEX path run it in fp32
IPEX_BF16_WHY_NOT = ipex_mod.bf16_cpu_why_not()
IPEX_BF16 = IPEX_BF16_WHY_NOT is None
needs_ipex_bf16 = pytest.mark.skipif(not IPEX_BF16, reason=f"IPEX bf16: {IPEX_BF16_WHY_NOT}")
IPEX_DTYPE = torch.bfloat16 if IPEX_BF16 else torch.float32


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    # An IPEX bf16 model cannot be un-optimized; unpatch says so once per model.
    with pytest.warns(NanopatchWarning) if _ipex_bf16_models() else _nothing():
        nanopatch.unpatch_torch()
    training.plans.clear()


def _ipex_bf16_models() -> bool:
    return any(plan.ipex and plan.installed and plan.amp_dtype is not None for plan in training.plans.values())


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
    nanopatch.patch_torch(bf16=IPEX_BF16, ipex=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    seen = []  # inside the model, after the first convolution (which IPEX swaps for its own)
    model.bn1.register_forward_hook(
        lambda m, i, o: seen.append((o.dtype, i[0].is_contiguous(memory_format=torch.channels_last)))
    )
    out = _steps(model, optimizer, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)), 2)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    [plan] = nanopatch.status()["targets"]["training"]["details"]
    assert plan["ipex"] is True and plan["bf16"] is IPEX_BF16
    assert type(model.conv1).__module__.startswith("intel_extension_for_pytorch"), type(model.conv1)
    assert seen == [(IPEX_DTYPE, True)] * 2, seen  # IPEX lays convolutions out channels-last
    # IPEX's master weights come back as fp32 in the user's state_dict
    assert model.state_dict()["conv1.weight"].dtype == torch.float32


def test_ipex_checkpoint_loads_into_stock_and_resumes_under_the_patch():
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 1, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(4)]

    def build():
        torch.manual_seed(0)
        model = small_net()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    nanopatch.patch_torch(bf16=IPEX_BF16, ipex=True)
    model, optimizer = build()
    model.train()
    for x, y in batches[:2]:
        _steps(model, optimizer, x, y, 1)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    model.eval()
    with torch.no_grad():
        saved_out = model(batches[0][0])  # the model as saved (IPEX's bf16 weights under autocast)
    model.train()
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
        stock.eval()
        with torch.no_grad():  # the model it was, in fp32 (bf16's tolerance: the saved run computed in bf16)
            torch.testing.assert_close(stock(batches[0][0]), saved_out, rtol=0.05, atol=0.05)
        stock.train()
        _steps(stock, stock_opt, *batches[2], 1)


@needs_ipex_bf16
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


def test_a_model_with_sparse_gradients_takes_the_native_path():
    """IPEX's fused SGD does not take the sparse gradients of an ``EmbeddingBag(sparse=True)``."""
    nanopatch.patch_torch(bf16=True, ipex=True)
    model = nn.Sequential(nn.EmbeddingBag(50, 8, mode="sum", sparse=True), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    _steps(model, optimizer, torch.randint(0, 50, (4, 3)), torch.tensor([0, 1, 2, 3]), 2)
    plan = training.plans[model]
    assert not plan.ipex and plan.stock is None
    assert any("IPEX not used: EmbeddingBag(sparse=True) makes sparse gradients" in note for note in plan.notes)
    nanopatch.unpatch_torch()
    assert "forward" not in model.__dict__


@needs_ipex_bf16
def test_ipex_bf16_run_learns_as_well_as_fp32():
    data = shifted_templates_task()
    stock = train_and_score(data)
    nanopatch.patch_torch(bf16=True, ipex=True)
    patched = train_and_score(data)
    assert any(plan.ipex for plan in training.plans.values())
    assert abs(patched - stock) <= 1.0, f"IPEX bf16 {patched:.2f}% vs fp32 {stock:.2f}%"


TRAINER_SCRIPT = """
import json, sys
import lightning as L, torch, torchvision
from nanopatch.lightning import Trainer
from nanopatch.targets.training import patch as training

class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = torchvision.models.resnet18(num_classes=4)
        self.seen, self.lines, self.hooked = [], [], False

    def probe(self, module, inputs, output):
        self.seen.append((inputs[0].is_contiguous(memory_format=torch.channels_last), output.dtype == torch.bfloat16))

    def training_step(self, batch, _):
        if not self.hooked:  # on the convolution that runs: IPEX swaps in its own
            self.hooked = bool(self.model.conv1.register_forward_hook(self.probe))
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.lines = training.summary()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 4, (16,)))
module = Classifier()
trainer = Trainer(use_ipex=True, precision=sys.argv[1], channels_last=True, max_epochs=1, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
print("RESULT " + json.dumps({"seen": module.seen, "lines": module.lines}))
"""


@pytest.mark.parametrize("precision", ["bf16", "32"])
def test_lightning_trainer_use_ipex_optimizes_the_module_before_lightnings_closure(precision):
    """Lightning runs the forward inside optimizer.step(closure), where the search cannot apply
    IPEX: the Trainer applies it to the LightningModule once its optimizers exist."""
    if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") != "1":
        pytest.importorskip("lightning")
    import json

    from conftest import child_env, run_python

    proc = run_python(["-c", TRAINER_SCRIPT, precision], env=child_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    (line,) = result["lines"]
    assert "IPEX" in line and "IPEX not used" not in line and "channels-last" in line, line
    # without native bf16 the Trainer runs precision="bf16" in fp32 (BigDL-Nano's fallback)
    bf16 = precision == "bf16" and nanopatch.foundation.cpu.host_facts().native_bf16
    assert ("computed in bfloat16" in line) == bf16, line
    assert len(result["seen"]) == 2 and all(channels_last for channels_last, _ in result["seen"])
    assert all(seen_bf16 == bf16 for _, seen_bf16 in result["seen"])


NANO_SCRIPT = """
import json, sys
import torch, torchvision
import nanopatch
from nanopatch.targets.training import patch as training

class Loop(nanopatch.TorchNano):
    def train(self):
        model = torchvision.models.resnet18(num_classes=4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        data = torch.utils.data.TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 4, (16,)))
        model, optimizer, loader = self.setup(model, optimizer, torch.utils.data.DataLoader(data, batch_size=8))
        for x, y in loader:
            optimizer.zero_grad()
            self.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
        return training.summary()

if __name__ == "__main__":
    print("RESULT " + json.dumps(Loop(use_ipex=True, precision="bf16", channels_last=True).train()))
"""


def test_torchnano_use_ipex_optimizes_the_model_before_fabric_wraps_it(tmp_path):
    if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") != "1":
        pytest.importorskip("lightning")
    import json

    from conftest import child_env, run_python

    script = tmp_path / "loop.py"
    script.write_text(NANO_SCRIPT)
    proc = run_python([str(script)], env=child_env(), timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert "IPEX" in line and "IPEX not used" not in line, line
    # without native bf16 TorchNano runs precision="bf16" in fp32 (BigDL-Nano's fallback)
    assert ("computed in bfloat16" in line) == nanopatch.foundation.cpu.host_facts().native_bf16, line
    assert "use_ipex=True, but IPEX optimized no model" not in proc.stderr


@pytest.mark.skipif(IPEX_BF16, reason="this CPU has what IPEX's bf16 needs")
def test_a_bf16_model_takes_the_native_path_where_ipex_has_no_bf16_and_fp32_keeps_ipex():
    """On a CPU without the instructions IPEX's bf16 weight prepack needs, ``ipex.optimize`` in
    bf16 fails: nanopatch does not try it (its self-check would fail on IPEX's assertion), the
    model computes in bf16 on torch's own kernels, and the note says why."""
    x, y = torch.randn(4, 1, 16, 16), torch.tensor([0, 1, 2, 3])
    nanopatch.patch_torch(bf16=True, ipex=True)
    model = small_net()
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    out = _steps(model, torch.optim.SGD(model.parameters(), lr=0.05), x, y, 2)
    plan = training.plans[model]
    assert not plan.ipex and plan.amp_dtype == torch.bfloat16 and seen == [torch.bfloat16] * 2, seen
    assert out.dtype == torch.float32 and all(p.grad is not None for p in model.parameters())
    assert any("IPEX not used: its bf16 weight prepack needs avx512bw" in note for note in plan.notes), plan.notes
    nanopatch.unpatch_torch()
    nanopatch.patch_torch(bf16=False, ipex=True)
    model = small_net()
    _steps(model, torch.optim.SGD(model.parameters(), lr=0.05), x, y, 1)
    assert training.plans[model].ipex


TWO_CORES = len(nanopatch.foundation.cpu.host_facts().cores) >= 2


@pytest.mark.skipif(not TWO_CORES, reason="two processes need two physical cores")
@pytest.mark.parametrize("api", ["trainer", "torchnano", "decorated", "torchnano-no-fabric", "decorated-no-fabric"])
def test_use_ipex_with_two_processes(tmp_path, api):
    """``use_ipex`` with ``num_processes=2``: IPEX optimizes the model and its optimizer in each
    process before DDP wraps it (Lightning's DDP, Fabric's, or nanopatch's own), in bf16, and the
    ranks still train one model with the warmed-up learning rate."""
    if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") != "1":
        pytest.importorskip("lightning")
    from conftest import TESTS_DIR, run_rank_script

    bf16 = nanopatch.foundation.cpu.host_facts().native_bf16
    args = ["--num-processes", "2", "--precision", "bf16", "--channels-last", "--use-ipex"]
    out = tmp_path / "out"
    if api == "trainer":
        ranks = run_rank_script(str(TESTS_DIR / "data" / "nano_trainer.py"), out, *args, cwd=tmp_path, timeout=600)
        lrs = [r["step_lrs"] for r in ranks.values()]
        expected = [0.015, 0.02, 0.02, 0.02]  # 0.01 warmed up to 2x over the first epoch's 2 steps
    else:
        name, _, no_fabric = api.partition("-")
        args += ["--no-fabric"] if no_fabric else []
        script = str(TESTS_DIR / "data" / "nano_loop.py")
        ranks = run_rank_script(script, out, name, *args, cwd=tmp_path, timeout=600)
        lrs = [r["lrs"] for r in ranks.values()]
        expected = [0.0625, 0.075, 0.0875] + [0.1] * 5  # 0.05 warmed up to 2x over 4 steps
    output = (out / "output.txt").read_text()
    assert "IPEX optimized no model" not in output and "IPEX not used" not in output, output
    assert sorted(ranks) == [0, 1]
    for report in ranks.values():
        assert report["first_conv"].startswith("intel_extension_for_pytorch."), report["first_conv"]
        assert set(report["dtypes"]) == {"torch.bfloat16" if bf16 else "torch.float32"}
        assert set(report["channels_last"]) == {True}
        if api != "trainer":
            assert report["shared"] == []  # each process trains weights of its own
    for used in lrs:
        assert used == pytest.approx(expected)
    for key, value in ranks[0]["weights"].items():
        if "running_" not in key and "num_batches" not in key:
            assert torch.equal(value, ranks[1]["weights"][key]), key
    if api == "trainer":
        # IPEX gives fp32 master weights back from the module it optimized (the LightningModule),
        # not from its children; Lightning's checkpoint (rank 0's, one) is the former's
        (checkpoint,) = (out / "ckpt").iterdir()
        state = torch.load(checkpoint, weights_only=False)["state_dict"]
        assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.float32}
        stock = torchvision.models.resnet18(num_classes=4)
        stock.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    else:
        assert {v.dtype for v in ranks[0]["weights"].values() if v.is_floating_point()} == {torch.float32}


def test_the_breakdown_times_ipexs_own_step_and_unpatch_gives_it_back():
    """``ipex.optimize`` gives the optimizer a fused step of its own, past torch's step hooks:
    the breakdown times it all the same, and unpatch leaves IPEX's step on the optimizer."""
    nanopatch.patch_torch(bf16=False, ipex=True, breakdown=True)
    model = small_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(32, 1, 16, 16), torch.randint(0, 10, (32,)))
    model.train()
    for x, y in torch.utils.data.DataLoader(data, batch_size=4):
        _steps(model, optimizer, x, y, 1)
        if not training.plans[model].ipex:
            break
    assert training.plans[model].ipex
    timed = optimizer.__dict__["step"]
    assert timed.__module__ == "nanopatch.targets.training.optim", timed
    report = nanopatch.status()["breakdown"]
    assert report["steps"] == 8 and report["samples"] == 28 and report["optimizer_s"] > 0, report
    nanopatch.unpatch_torch()
    own = optimizer.__dict__["step"]
    assert own is not timed and own.__module__.startswith("intel_extension_for_pytorch"), own
    _steps(model, optimizer, x, y, 1)  # IPEX's step, as IPEX left it
