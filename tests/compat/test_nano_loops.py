"""BigDL-Nano's custom loops on nanopatch: ``TorchNano`` and ``@nano``.

The end-to-end tests run tests/data/nano_loop.py as a script (spawned processes import it again,
as they would a user's script)."""

from __future__ import annotations

import json

import pytest
import torch

import nanopatch
from nanopatch.compat import torch_nano
from nanopatch.foundation import cpu
from nanopatch.runtime import tuning as runtime

from conftest import TESTS_DIR, run_rank_script
from helpers.learning_oracle import framework

SCRIPT = str(TESTS_DIR / "data" / "nano_loop.py")
NATIVE_BF16 = cpu.host_facts().native_bf16
TWO_CORES = len(cpu.host_facts().cores) >= 2


def test_both_are_reached_from_the_package_and_check_their_switches():
    assert nanopatch.TorchNano is torch_nano.TorchNano and nanopatch.nano is torch_nano.nano
    for bad, message in (
        ({"precision": "fp16"}, "precision must be one of"),
        ({"precision": 16}, "precision must be one of"),
        ({"num_processes": 0}, "num_processes must be a whole number"),
        ({"channels_last": "yes"}, "channels_last must be True or False"),
        ({"use_ipex": 1}, "use_ipex must be True or False"),
        ({"auto_lr": "no"}, "auto_lr must be True or False"),
        ({"num_processes": 2, "cpu_for_each_process": [[0]]}, "gives 1 CPU list"),
    ):
        with pytest.raises(ValueError, match=message):
            nanopatch.TorchNano(**bad)
        with pytest.raises(ValueError, match=message):
            nanopatch.nano(**bad)


def test_train_must_be_written():
    with pytest.raises(NotImplementedError, match="write train"):
        nanopatch.TorchNano().train()


def test_without_lightning_one_process_runs_on_nanopatchs_engine(monkeypatch):
    monkeypatch.setattr(torch_nano, "fabric_available", lambda: False)
    seen = []

    class Loop(nanopatch.TorchNano):
        def train(self, steps):
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
            model[0].register_forward_hook(
                lambda m, i, o: seen.append((o.dtype, i[0].is_contiguous(memory_format=torch.channels_last)))
            )
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3, 8, 8)), batch_size=4)
            ready = self.setup(model, optimizer, loader)
            assert ready[0] is model and ready[1] is optimizer and ready[2] is loader
            for _ in range(steps):
                for (x,) in loader:
                    optimizer.zero_grad()
                    self.backward(model(x).sum())
                    optimizer.step()
            return self.world_size

    assert Loop(precision="bf16", channels_last=True).train(2) == 1
    assert set(seen) == {(torch.bfloat16 if NATIVE_BF16 else torch.float32, True)}
    assert not nanopatch.is_patched()  # the engine was on while train ran, and only then


def test_nano_needs_exactly_one_model():
    @nanopatch.nano()
    def train(a, b):
        return 1

    with pytest.raises(ValueError, match="exactly one model"):
        train(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="exactly one model"):
        train(torch.nn.CrossEntropyLoss(), 2)


def test_nano_takes_a_loss_module_beside_the_model():
    """BigDL-Nano's guide passes ``loss_func=nn.CrossEntropyLoss()`` beside the model."""
    model = torch.nn.Linear(2, 2)

    @nanopatch.nano()
    def train(model, optimizer, loss_func):
        loss = loss_func(model(torch.ones(4, 2)), torch.zeros(4, dtype=torch.long))
        loss.backward()
        optimizer.step()
        return loss.item()

    before = model.weight.clone()
    assert train(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.CrossEntropyLoss()) > 0
    assert not torch.equal(before, model.weight)


def run_script(tmp_path, api, *args):
    out = tmp_path / "out"
    ranks = run_rank_script(SCRIPT, out, api, *args, cwd=tmp_path)
    return json.loads((out / "main.json").read_text()), ranks


@pytest.mark.parametrize("backend", ["fabric", "nanopatch"])
@pytest.mark.parametrize("api", ["torchnano", "decorated"])
# one process: py only (the two-process runs, everywhere, take the same path and DDP)
@pytest.mark.parametrize("processes", [pytest.param(1, marks=pytest.mark.py_only), 2])
def test_custom_loops_train_accelerated_on_n_processes(tmp_path, api, processes, backend):
    """On Lightning Fabric, and (``--no-fabric``: as if Lightning were not installed) on
    nanopatch's own spawned processes and data-parallel engine."""
    if backend == "fabric":
        framework("lightning.fabric")
    if processes == 2 and not TWO_CORES:
        pytest.skip("two processes need two physical cores")
    args = ["--num-processes", str(processes), "--precision", "bf16", "--channels-last"]
    main, ranks = run_script(tmp_path, api, *args, *(["--no-fabric"] if backend == "nanopatch" else []))
    assert sorted(ranks) == list(range(processes))
    assert main["returned"]["rank"] == 0  # rank 0's return value
    steps = 2 * 64 // (8 * processes)  # 2 epochs of 64 samples in batches of 8, sharded
    assert main["returned"]["steps"] == steps
    for rank, report in ranks.items():
        assert set(report["dtypes"]) == {"torch.bfloat16" if NATIVE_BF16 else "torch.float32"}
        assert set(report["channels_last"]) == {True}
        assert report["shared"] == []  # the weights are this process's own
        if processes == 2:
            assert report["affinity"] == sorted(runtime.process_cpus(cpu.host_facts(), 2)[rank])
            assert report["threads"] == 1
            # warmed up to 2x over the first epoch's 4 steps, as --nproc's auto_lr
            assert report["lrs"] == pytest.approx([0.0625, 0.075, 0.0875] + [0.1] * (steps - 3))
        else:
            assert report["lrs"] == pytest.approx([0.05] * steps)
    if processes == 2:
        assert ranks[0]["pid"] != ranks[1]["pid"]
        for key, value in ranks[0]["weights"].items():
            if "running_" not in key and "num_batches" not in key:
                assert torch.equal(value, ranks[1]["weights"][key]), key
    if api == "decorated":
        assert main["changed"] and main["equals_rank0"]  # the caller's model has the trained weights


def test_a_spawned_process_trains_weights_of_its_own():
    """torch.multiprocessing hands a spawned process the tensors it pickles in shared memory;
    the model's weights and buffers and the optimizer's state get copies of the process's own
    (else every process's step lands in every process's weights), with the same values and the
    same Parameter objects; other tensors (data) stay shared."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    model.share_memory()
    for state in optimizer.state.values():
        state["momentum_buffer"].share_memory_()
    data = torch.randn(4).share_memory_()
    params = list(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    momenta = [state["momentum_buffer"].clone() for state in optimizer.state.values()]

    nano = torch_nano._FunctionNano(lambda: None, num_processes=2)
    torch_nano._own_copies(nano.__dict__, ([model], {"opt": optimizer}, data), {})

    assert list(model.parameters()) == params
    assert not any(t.is_shared() for t in (*model.parameters(), *model.buffers()))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not any(state["momentum_buffer"].is_shared() for state in optimizer.state.values())
    assert all(torch.equal(s["momentum_buffer"], m) for s, m in zip(optimizer.state.values(), momenta, strict=True))
    assert data.is_shared()
