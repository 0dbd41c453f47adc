"""``nanopatch.lightning.Trainer``: BigDL-Nano's switches on real Lightning.

The end-to-end tests run tests/data/nano_trainer.py (a LightningModule wrapping a torchvision
ResNet-18, ``self.model(x)`` in ``training_step``) as a script, as a BigDL-Nano user runs it;
Lightning starts the second rank by running the script again."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings

import pytest
import torch

from nanopatch import NanopatchWarning
from nanopatch.compat import lightning as nano_lightning
from nanopatch.foundation import cpu, log
from nanopatch.runtime import tuning as runtime

from conftest import TESTS_DIR, child_env, run_python, run_rank_script
from helpers.learning_oracle import framework

SCRIPT = str(TESTS_DIR / "data" / "nano_trainer.py")
NATIVE_BF16 = cpu.host_facts().native_bf16
TWO_CORES = len(cpu.host_facts().cores) >= 2


def switches(**changed):
    base = {"num_processes": 1, "cpu_for_each_process": None, "use_ipex": False, "channels_last": False}
    return nano_lightning.check_switches(**{**base, "auto_lr": True, **changed})


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"num_processes": 0}, "num_processes must be a whole number >= 1"),
        ({"num_processes": "2"}, "num_processes must be a whole number >= 1"),
        ({"num_processes": True}, "num_processes must be a whole number >= 1"),
        ({"num_processes": 4096}, "num_processes=4096: "),
        ({"use_ipex": "yes"}, "use_ipex must be True or False"),
        ({"channels_last": 1}, "channels_last must be True or False"),
        ({"auto_lr": None}, "auto_lr must be True or False"),
        ({"num_processes": 2, "cpu_for_each_process": "0,1"}, "cpu_for_each_process must be a list of CPU lists"),
        ({"num_processes": 2, "cpu_for_each_process": [[0]]}, "gives 1 CPU list(s) but num_processes is 2"),
        ({"num_processes": 2, "cpu_for_each_process": [[0], []]}, "is not a non-empty list of CPU numbers"),
        ({"num_processes": 2, "cpu_for_each_process": [[0], ["1"]]}, "is not a non-empty list of CPU numbers"),
        ({"num_processes": 2, "cpu_for_each_process": [[0], [0]]}, "in more than one process's set"),
        ({"num_processes": 2, "cpu_for_each_process": [[0], [100000]]}, "not in this process's affinity mask"),
    ],
)
def test_a_bad_switch_raises_value_error_naming_it(changed, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        switches(**changed)


def test_cpu_sets_default_to_the_runners_split_and_can_be_given():
    assert switches() is None
    if TWO_CORES:
        facts = cpu.host_facts()
        assert switches(num_processes=2) == runtime.process_cpus(facts, 2)
        first, second = facts.cores[0][0], facts.cores[1][0]
        assert switches(num_processes=2, cpu_for_each_process=[[second], [first]]) == [(second,), (first,)]


def test_trainer_rejects_a_layout_beside_num_processes():
    framework("lightning.pytorch")
    Trainer = nano_lightning.trainer_class()
    for name, value in (("strategy", "ddp"), ("devices", 2), ("num_nodes", 1)):
        with pytest.raises(ValueError, match=f"num_processes=2 chooses {name}"):
            Trainer(num_processes=2, **{name: value})
    with pytest.raises(ValueError, match="num_processes"):
        Trainer(num_processes=-1)
    with pytest.raises(ValueError, match="trains on the CPU"):
        Trainer(num_processes=2, accelerator="gpu")


def test_import_nanopatch_imports_no_lightning():
    proc = run_python(
        ["-c", "import sys, nanopatch; print(sorted(m for m in sys.modules if 'lightning' in m))"],
        env=child_env(),
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_bf16_without_native_support_falls_back_with_one_warning(monkeypatch):
    facts = dataclasses.replace(cpu.host_facts(), native_bf16=False, bf16_reason="no avx512_bf16 or amx_bf16")
    monkeypatch.setattr(nano_lightning.cpu, "host_facts", lambda: facts)
    monkeypatch.setattr(log, "_said", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert nano_lightning.lightning_precision("bf16", use_ipex=False) == ("32-true", False)
        assert nano_lightning.lightning_precision("bf16", use_ipex=True) == ("32-true", False)
    said = [w for w in caught if issubclass(w.category, NanopatchWarning)]
    assert len(said) == 1 and "precision='bf16'" in str(said[0].message) and "fp32" in str(said[0].message)


def test_precision_mapping_on_a_bf16_cpu(monkeypatch):
    facts = dataclasses.replace(cpu.host_facts(), native_bf16=True)
    monkeypatch.setattr(nano_lightning.cpu, "host_facts", lambda: facts)
    assert nano_lightning.lightning_precision("bf16", use_ipex=False) == ("bf16-mixed", False)
    assert nano_lightning.lightning_precision("bf16", use_ipex=True) == ("bf16-mixed", True)  # and IPEX's bf16 weights
    assert nano_lightning.lightning_precision("32-true", use_ipex=True) == ("32-true", False)
    assert nano_lightning.lightning_precision(32, use_ipex=False) == (32, False)


def test_lr_warmup_covers_an_instance_level_step():
    """IPEX gives the optimizer a fused ``step`` of its own, which torch's step hooks never see:
    the warm-up covers it, and gives it back on detach."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    used = []

    def fused_step(closure=None):
        used.append(optimizer.param_groups[0]["lr"])

    optimizer.step = fused_step
    warmup = nano_lightning.LrWarmup(2)
    warmup.attach([optimizer], steps_per_epoch=2)
    for _ in range(3):
        optimizer.step()
    assert used == pytest.approx([0.15, 0.2, 0.2]) and optimizer.param_groups[0]["lr"] == 0.1
    warmup.detach()
    assert optimizer.step is fused_step


def test_lr_warmup_scales_each_step_and_gives_the_scheduler_its_own_value():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    used = []
    warmup = nano_lightning.LrWarmup(4)
    warmup.attach([optimizer], steps_per_epoch=3)
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    for _ in range(5):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
    # factor 2, 3, 4 over the first epoch's 3 steps (linear to 4, as --nproc's auto_lr), then 4; the
    # scheduler halves its own value each step
    assert used == pytest.approx([0.1 * 2, 0.05 * 3, 0.025 * 4, 0.0125 * 4, 0.00625 * 4])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**5)
    warmup.detach()
    before = optimizer.param_groups[0]["lr"]
    optimizer.step()
    assert used[-1] == before  # detached: no scaling


def run_script(tmp_path, *args):
    out = tmp_path / "out"
    return out, run_rank_script(SCRIPT, out, *args, cwd=tmp_path)


def assert_accelerated(report):
    assert set(report["dtypes"]) == ({"torch.bfloat16"} if NATIVE_BF16 else {"torch.float32"}), report["dtypes"]
    assert set(report["channels_last"]) == {True}


def assert_loads_into_a_stock_model(checkpoint, weights):
    import torchvision

    state = torch.load(checkpoint, weights_only=False)["state_dict"]
    stock = torchvision.models.resnet18(num_classes=4)
    stock.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    x = torch.randn(2, 3, 32, 32)
    trained = torchvision.models.resnet18(num_classes=4)
    trained.load_state_dict(weights)
    stock.eval()
    trained.eval()
    assert torch.equal(stock(x), trained(x))


def test_one_process_bf16_and_channels_last_inside_the_model(tmp_path):
    framework("lightning.pytorch")
    out, reports = run_script(tmp_path, "--precision", "bf16", "--channels-last")
    assert list(reports) == [0]
    assert_accelerated(reports[0])
    assert reports[0]["world"] == 1 and set(reports[0]["step_lrs"]) == {0.01}  # no warm-up for one process
    (checkpoint,) = (out / "ckpt").iterdir()
    assert_loads_into_a_stock_model(checkpoint, reports[0]["weights"])


def test_plain_trainer_changes_nothing(tmp_path):
    framework("lightning.pytorch")
    _, reports = run_script(tmp_path)
    assert set(reports[0]["dtypes"]) == {"torch.float32"} and set(reports[0]["channels_last"]) == {False}


@pytest.mark.skipif(not TWO_CORES, reason="two processes need two physical cores")
@pytest.mark.parametrize("auto_lr", [True, False], ids=["auto_lr", "no_auto_lr"])
def test_two_pinned_processes_train_one_model(tmp_path, auto_lr):
    framework("lightning.pytorch")
    args = ["--num-processes", "2", "--precision", "bf16", "--channels-last"]
    out, reports = run_script(tmp_path, *args, *([] if auto_lr else ["--no-auto-lr"]))
    assert sorted(reports) == [0, 1] and {r["world"] for r in reports.values()} == {2}
    assert reports[0]["pid"] != reports[1]["pid"]
    groups = runtime.process_cpus(cpu.host_facts(), 2)
    allowed = sorted(os.sched_getaffinity(0))
    for rank, report in reports.items():
        assert_accelerated(report)
        assert report["affinity"] == sorted(groups[rank]) and report["threads"] == 1
    # every parameter identical on both ranks (BatchNorm's running statistics are each rank's own,
    # as in any DDP run)
    params = [k for k in reports[0]["weights"] if "running_" not in k and "num_batches" not in k]
    for key in params:
        assert torch.equal(reports[0]["weights"][key], reports[1]["weights"][key]), key
    # 4 batches of 8 over 2 ranks: 2 steps per epoch, 2 epochs
    expected = [0.015, 0.02, 0.02, 0.02] if auto_lr else [0.01] * 4
    for report in reports.values():
        assert report["step_lrs"] == pytest.approx(expected)
    (checkpoint,) = (out / "ckpt").iterdir()  # one checkpoint, from rank 0
    assert_loads_into_a_stock_model(checkpoint, reports[0]["weights"])
    # validate after fit runs on both ranks again, and agrees (sync_dist)
    assert reports[0]["val_loss"] == pytest.approx(reports[1]["val_loss"])
    # the script's own process: its CPUs and threads as before, rank 0's weights and validation loss
    main = json.loads((out / "main.json").read_text())
    assert main["affinity"] == allowed and main["weights_equal_rank0"]
    assert main["val_loss"] == pytest.approx(reports[0]["val_loss"])


# --- Trainer.compile -------------------------------------------------------------------------------


def quiet_trainer(tmp_path, **kwargs):
    Trainer = nano_lightning.trainer_class()
    options = {
        "max_epochs": 3,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(tmp_path),
        "enable_checkpointing": False,
    }
    return Trainer(**{**options, **kwargs})


def blobs(n=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=generator)
    x = torch.randn(n, 4, generator=generator) + 2.0 * y[:, None]
    return x, y


def loader(*tensors, batch_size=16):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*tensors), batch_size=batch_size)


def test_compile_trains_validates_tests_and_predicts_a_plain_module(tmp_path):
    framework("lightning.pytorch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x, y = blobs()
    module = nano_lightning.trainer_class().compile(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    trainer = quiet_trainer(tmp_path)
    before = trainer.validate(module, loader(x, y))[0]["val_loss"]
    trainer.fit(module, loader(x, y), loader(x, y))
    after = trainer.validate(module, loader(x, y))[0]["val_loss"]
    assert after < 0.7 * before
    assert trainer.test(module, loader(x, y))[0]["test_loss"] == pytest.approx(after, rel=1e-5)
    with torch.no_grad():
        expected = model(x)
    predicted = torch.cat(trainer.predict(module, loader(x, y)))  # (x, y) batches: the target is left out
    assert torch.allclose(predicted, expected, atol=1e-6)
    assert torch.allclose(torch.cat(trainer.predict(module, loader(x))), expected, atol=1e-6)  # (x,) batches


def test_compile_with_factories_a_scheduler_and_two_inputs(tmp_path):
    framework("lightning.pytorch")
    torch.manual_seed(0)

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

        def forward(self, x1, x2):
            return self.a(x1) + self.b(x2)

    model = TwoInputs()
    x, y = blobs()
    module = nano_lightning.trainer_class().compile(
        model,
        torch.nn.functional.cross_entropy,
        lambda params: torch.optim.Adam(params, lr=0.05),
        lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
    )
    trainer = quiet_trainer(tmp_path)
    trainer.fit(module, loader(x, x * 0.5, y))
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**3)
    assert trainer.validate(module, loader(x, x * 0.5, y))[0]["val_loss"] < 0.5


def test_compiled_checkpoints_hold_the_plain_modules_state_dict(tmp_path):
    framework("lightning.pytorch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    x, y = blobs()
    Trainer = nano_lightning.trainer_class()
    module = Trainer.compile(model, torch.nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, lr=0.1))
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(module, loader(x, y))
    path = tmp_path / "one.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["state_dict"]
    assert list(state) == list(model.state_dict())  # the plain module's own keys
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    fresh.load_state_dict(state)
    fresh.eval()
    model.eval()
    assert torch.equal(fresh(x), model(x))
    # and Lightning resumes from it
    fresh.train()
    again = Trainer.compile(fresh, torch.nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, lr=0.1))
    resumed = quiet_trainer(tmp_path, max_epochs=2)
    resumed.fit(again, loader(x, y), ckpt_path=str(path))
    assert resumed.current_epoch == 2


def test_compile_rejects_what_it_cannot_train(tmp_path):
    pl = framework("lightning.pytorch")
    Trainer = nano_lightning.trainer_class()
    model = torch.nn.Linear(4, 2)

    class Own(pl.LightningModule):
        pass

    own = Own()
    assert Trainer.compile(own) is own
    with pytest.raises(ValueError, match="brings its own loss"):
        Trainer.compile(own, torch.nn.MSELoss())
    with pytest.raises(ValueError, match=r"must be a torch\.nn\.Module"):
        Trainer.compile(lambda x: x)
    with pytest.raises(ValueError, match="loss must be callable"):
        Trainer.compile(model, "mse")
    with pytest.raises(ValueError, match="optimizer must be an optimizer"):
        Trainer.compile(model, torch.nn.MSELoss(), "sgd")
    with pytest.raises(ValueError, match="a scheduler needs an optimizer"):
        Trainer.compile(model, torch.nn.MSELoss(), None, lambda o: None)
    x, y = blobs()
    with pytest.raises(ValueError, match="got no loss"):
        quiet_trainer(tmp_path).fit(
            Trainer.compile(model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1)), loader(x, y)
        )
    with pytest.raises(ValueError, match="got no optimizer"):
        quiet_trainer(tmp_path).fit(Trainer.compile(model, torch.nn.functional.cross_entropy), loader(x, y))
    with pytest.raises(ValueError, match=r"a batch must be \(x, y\)"):
        quiet_trainer(tmp_path).fit(
            Trainer.compile(model, torch.nn.functional.cross_entropy, lambda p: torch.optim.SGD(p, lr=0.1)), loader(x)
        )


def test_compiled_cnn_trains_in_bf16_and_channels_last(tmp_path):
    framework("lightning.pytorch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 2),
    )
    seen = []
    model[0].register_forward_hook(
        lambda m, inputs, out: (
            seen.append((out.dtype, inputs[0].is_contiguous(memory_format=torch.channels_last))) if m.training else None
        )
    )
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 2, (32,))
    module = nano_lightning.trainer_class().compile(
        model, torch.nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, lr=0.1)
    )
    trainer = quiet_trainer(tmp_path, max_epochs=1, precision="bf16", channels_last=True)
    trainer.fit(module, loader(x, y, batch_size=8))
    assert set(seen) == {(torch.bfloat16 if NATIVE_BF16 else torch.float32, True)}
    assert not nanopatch_is_patched()  # the engine is on during fit only


def nanopatch_is_patched():
    import nanopatch

    return nanopatch.is_patched()


def test_use_ipex_without_a_usable_ipex_warns_once_and_trains(tmp_path, monkeypatch):
    framework("lightning.pytorch")
    from nanopatch.engine import config

    ok, why = config.ipex_compatibility()
    if ok:
        pytest.skip("IPEX is usable here: tests/training/test_ipex.py covers the IPEX path")
    monkeypatch.setattr(log, "_said", set())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,))
    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            module = nano_lightning.trainer_class().compile(model, torch.nn.CrossEntropyLoss(), sgd)
            trainer = quiet_trainer(tmp_path, max_epochs=1, use_ipex=True, channels_last=True)
            trainer.fit(module, loader(x, y, batch_size=8))
    said = [str(w.message) for w in caught if issubclass(w.category, NanopatchWarning)]
    assert len(said) == 1 and "ipex was requested" in said[0] and why in said[0], said


PL_SCRIPT = """
import pytorch_lightning as pl
import torch

from nanopatch.lightning import Trainer

assert issubclass(Trainer, pl.Trainer) and "lightning.pytorch" not in __import__("sys").modules
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
seen = []
model[0].register_forward_hook(lambda m, i, o: seen.append(i[0].is_contiguous(memory_format=torch.channels_last)))
module = Trainer.compile(model, torch.nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, lr=0.1))
assert isinstance(module, pl.LightningModule)
data = torch.utils.data.TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,)))
trainer = Trainer(max_epochs=1, channels_last=True, logger=False, enable_checkpointing=False, enable_progress_bar=False)
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
print("RESULT", all(seen) and len(seen) == 2)
"""


def test_a_script_on_pytorch_lightning_gets_its_trainer():
    framework("pytorch_lightning")
    proc = run_python(["-c", PL_SCRIPT], env=child_env(), timeout=300)
    assert proc.returncode == 0 and "RESULT True" in proc.stdout, proc.stdout + proc.stderr
