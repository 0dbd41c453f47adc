"""``--cuda-to-cpu``: scripts written for a CUDA GPU (tests/data/cuda_*.py) run on the CPU,
unedited, compute in bf16 there, and learn as the same script edited by hand for the CPU.

The machine has no GPU: every CUDA form the scripts use fails here without the patch."""

from __future__ import annotations

import io
import json
import os
import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest
import torch

import nanopatch
from nanopatch import engine
from nanopatch.cuda.standins import NoCpuEquivalent
from nanopatch.foundation import cpu
from nanopatch.learning import compare

from conftest import TESTS_DIR, child_env, run_python
from helpers.learning_oracle import ALWAYS_ALLOWED, accelerated, record

DATA = TESTS_DIR / "data"
AMP_LOOP = DATA / "cuda_amp_loop.py"
CHECKPOINT = DATA / "cuda_checkpoint.py"
DDP = DATA / "cuda_ddp.py"
NATIVE_BF16 = cpu.host_facts().native_bf16
NO_BF16 = f"this CPU has no native bf16 ({cpu.host_facts().bf16_reason}): CUDA autocast stays off here"


def _ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return proc


def _check_report(path: Path) -> dict:
    report = json.loads(path.read_text())
    _inputs, output, device = report["computed"]["conv1"]
    assert device == "cpu"
    if NATIVE_BF16:
        assert output == "torch.bfloat16", report["computed"]  # computed in bf16 on the CPU
    assert all(loss == loss for loss in report["losses"])  # finite
    return report


# --- the scripts run, unedited ------------------------------------------------------------


def test_the_amp_loop_runs_under_the_runner_in_bf16(tmp_path):
    report = tmp_path / "report.json"
    proc = _ok(run_python(["-m", "nanopatch", "--cuda-to-cpu", str(AMP_LOOP), "--report", str(report)], cwd=tmp_path))
    assert "peak memory" in proc.stdout and "nanopatch --cuda-to-cpu" in proc.stdout
    if not NATIVE_BF16:
        pytest.skip(NO_BF16)
    _check_report(report)


def test_without_the_patch_the_script_fails_here(tmp_path):
    proc = run_python([str(CHECKPOINT)], cwd=tmp_path)
    assert proc.returncode != 0  # no GPU: the script cannot run stock


def _gpu_checkpoint(path: Path) -> float:
    """A checkpoint as a GPU run writes it: every storage tagged ``cuda:0``."""
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    from torch import serialization

    stock = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(state, path)
    finally:
        serialization.location_tag = stock
    return float(sum(t.sum() for t in state.values()))


def test_the_checkpoint_script_runs_with_the_environment_variable(tmp_path):
    gpu = tmp_path / "gpu.pt"
    total = _gpu_checkpoint(gpu)
    env = child_env(NANOPATCH_CUDA_TO_CPU="1")
    proc = _ok(run_python(["-m", "nanopatch", str(CHECKPOINT), "--gpu-checkpoint", str(gpu)], cwd=tmp_path, env=env))
    assert "checkpoint round trip ok" in proc.stdout
    assert f"gpu checkpoint sum {total:.4f}" in proc.stdout
    assert f"gpu checkpoint default {total:.4f}" in proc.stdout


def test_the_amp_loop_runs_after_patch_torch_in_the_script(tmp_path):
    report = tmp_path / "report.json"
    script = tmp_path / "train.py"
    script.write_text(
        "import runpy, sys\n"
        "import nanopatch\n"
        "nanopatch.patch_torch(cuda_to_cpu=True)\n"
        f"sys.argv = [{str(AMP_LOOP)!r}, '--report', {str(report)!r}]\n"
        f"runpy.run_path({str(AMP_LOOP)!r}, run_name='__main__')\n"
    )
    _ok(run_python([str(script)], cwd=tmp_path))
    if not NATIVE_BF16:
        pytest.skip(NO_BF16)
    _check_report(report)


def test_a_ddp_script_for_two_gpus_runs_under_nproc_2_on_gloo(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = _ok(
        run_python(
            ["-m", "nanopatch", "--nproc", "2", "--cuda-to-cpu", str(DDP), "--out", str(out)], cwd=tmp_path, timeout=300
        )
    )
    assert "epoch 1 loss" in proc.stdout
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key


@pytest.mark.py_only
def test_compare_and_verify_run_the_stock_side_redirected(tmp_path):
    proc = _ok(run_python(["-m", "nanopatch", "--compare", "--cuda-to-cpu", str(CHECKPOINT)], cwd=tmp_path))
    assert "== stock: -m nanopatch._stock --cuda-to-cpu --breakdown" in proc.stdout
    assert proc.stdout.count("checkpoint round trip ok") == 2
    proc = _ok(run_python(["-m", "nanopatch", "--verify", "6", "--cuda-to-cpu", str(AMP_LOOP)], cwd=tmp_path))
    assert "verdict: learns as stock" in proc.stdout
    assert "accelerated: yes" in proc.stdout


# --- it learns as the script edited by hand for the CPU -----------------------------------


def _run(path: Path, monkeypatch, device: str, *args: str):
    def train():
        monkeypatch.setattr(sys, "argv", [str(path), *args])
        runpy.run_path(str(path), run_name="__main__")

    monkeypatch.setenv("CUDA_SCRIPT_DEVICE", device)
    monkeypatch.setenv("CUDA_SCRIPT_BF16", "1" if NATIVE_BF16 else "0")
    return train


def test_it_learns_as_the_hand_edited_cpu_script_and_gets_the_cpu_acceleration(monkeypatch, tmp_path):
    computed: list[torch.dtype] = []

    def probe(module, inputs, output):
        if "Conv" in type(module).__name__ and isinstance(output, torch.Tensor):  # IPEX's own conv class too
            computed.append(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(probe)
    try:
        by_hand, _, _, _ = record(_run(AMP_LOOP, monkeypatch, "cpu", "--epochs", "1"), {"vision": False})
        computed.clear()
        redirected, _, models, said = record(
            _run(AMP_LOOP, monkeypatch, "cuda", "--epochs", "1"), {"vision": False, "cuda_to_cpu": True}
        )
    finally:
        handle.remove()
    verdict = compare(by_hand, redirected)
    assert verdict.learns, verdict.summary()
    assert len(redirected) == len(by_hand) == 6
    for s, p in zip(by_hand, redirected, strict=True):
        assert s.grads == p.grads and s.updated == p.updated
        assert abs(s.loss - p.loss) <= 0.02 * abs(s.loss)
    assert redirected[0].grads  # every parameter got a gradient: the same set as by hand
    assert accelerated(models), models  # the training target paired with the redirected model
    assert any(m.get("channels_last") for m in models), models
    if NATIVE_BF16:
        assert computed and set(computed) == {torch.bfloat16}
    assert not [text for text in said if not any(re.search(allowed, text) for allowed in ALWAYS_ALLOWED)]


# --- the patch contract ---------------------------------------------------------------------


@pytest.fixture
def redirected():
    nanopatch.unpatch_torch()
    nanopatch.patch_torch(cuda_to_cpu=True, vision=False, training=False)
    yield
    nanopatch.unpatch_torch()


def _cuda_records() -> list:
    return [r for r in engine.JOURNAL.records() if r.target in ("cuda_to_cpu", "cuda_extensions")]


def test_unpatch_restores_every_attribute_exactly():
    import torch.utils.cpp_extension  # its target applies too

    nanopatch.unpatch_torch()
    watched = {
        (torch, "zeros"),
        (torch, "load"),
        (torch.Tensor, "to"),
        (torch.Tensor, "cuda"),
        (torch.nn.Module, "to"),
        (torch.nn.Module, "cuda"),
        (torch.cuda, "is_available"),
        (torch.cuda, "synchronize"),
        (torch.cuda, "Stream"),
        (torch.cuda, "CUDAGraph"),
        (torch.amp.grad_scaler.GradScaler, "__init__"),
        (torch.amp.autocast_mode.autocast, "__init__"),
    }
    before = {(owner, name): engine.raw_attribute(owner, name) for owner, name in watched}
    looked_up = {(owner, name): getattr(owner, name) for owner, name in watched}
    nanopatch.patch_torch(cuda_to_cpu=True, vision=False, training=False)
    records = _cuda_records()
    assert {r.target for r in records} == {"cuda_to_cpu", "cuda_extensions"}
    seen = {(r.owner, r.name) for r in records}
    assert watched <= seen
    for owner, name in watched:
        assert getattr(owner, name) is not looked_up[(owner, name)], (owner, name)
    nanopatch.unpatch_torch()
    for entry in records:
        now = engine.raw_attribute(entry.owner, entry.name)
        assert now is entry.original, entry.where
    for key, value in before.items():
        assert engine.raw_attribute(*key) is value
        assert getattr(*key) is looked_up[key] or key[1] == "__init__"  # a class's function binds anew
    assert torch.cuda.is_available() is False


def test_patching_twice_is_a_no_op_and_status_lists_the_target(redirected):
    first = [(r.owner, r.name, r.replacement) for r in _cuda_records()]
    nanopatch.patch_torch(cuda_to_cpu=True, vision=False, training=False)
    assert [(r.owner, r.name, r.replacement) for r in _cuda_records()] == first
    status = nanopatch.status()
    target = status["targets"]["cuda_to_cpu"]
    assert target["state"] == "patched" and target["option"] == "cuda_to_cpu"
    assert "torch.cuda.is_available" in target["attributes"]
    assert target["details"]["is_available"] is True
    assert status["options"]["cuda_to_cpu"]["value"] is True


def test_the_option_is_off_by_default_and_reads_the_environment(monkeypatch):
    from nanopatch.engine import config

    assert config.resolve({}, environ={}).cuda_to_cpu is False
    assert config.resolve({}, environ={"NANOPATCH_CUDA_TO_CPU": "1"}).cuda_to_cpu is True
    assert config.resolve({"cuda_to_cpu": False}, environ={"NANOPATCH_CUDA_TO_CPU": "1"}).cuda_to_cpu is False


def test_devices_and_factories_land_on_the_cpu(redirected):
    model = torch.nn.Linear(3, 2).cuda().to("cuda:0").to(torch.device("cuda"))
    x = torch.randn(4, 3, device="cuda").cuda(non_blocking=True).to(device="cuda", dtype=torch.float32)
    assert x.device.type == "cpu" and next(model.parameters()).device.type == "cpu"
    for made in (
        torch.zeros(2, device="cuda"),
        torch.tensor([1.0], device=torch.device("cuda", 0)),
        torch.arange(3, device=0),
        torch.ones_like(x, device="cuda"),
        x.new_zeros(2, device="cuda"),
        torch.nn.Linear(2, 2, device="cuda").weight,
    ):
        assert made.device.type == "cpu"
    assert torch.device("cuda").type == "cuda"  # the name stays: scripts branch on it
    with torch.device("cuda"):
        assert torch.empty(1).device.type == "cpu"
    lazy = torch.nn.LazyLinear(2).to("cuda")  # uninitialised parameters are left as they are
    assert lazy(torch.ones(1, 3)).shape == (1, 2)
    assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    torch.cuda.set_device(0)
    assert torch.cuda.current_device() == 0
    torch.backends.cudnn.benchmark = True


def test_torch_itself_keeps_the_machines_answer(redirected):
    stock = engine.JOURNAL.original("cuda_to_cpu", torch.cuda, "is_available")()
    namespace = {"__name__": "torch.somewhere", "torch": torch}
    exec("answer = torch.cuda.is_available(), torch.cuda.device_count()", namespace)
    assert namespace["answer"] == (stock, engine.JOURNAL.original("cuda_to_cpu", torch.cuda, "device_count")())
    assert torch.cuda.is_available() is True


def test_process_level_calls(redirected):
    torch.cuda.synchronize()
    torch.cuda.manual_seed_all(0)
    torch.cuda.manual_seed(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated() > 10 * 2**20
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    assert "nanopatch --cuda-to-cpu" in torch.cuda.get_device_name()
    state = torch.cuda.get_rng_state()
    torch.cuda.set_rng_state(state)
    with torch.random.fork_rng():
        torch.randn(3)
    stream = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        torch.ones(8).sum()
        end.record()
    torch.cuda.current_stream().wait_stream(stream)
    assert start.elapsed_time(end) >= 0


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: torch.cuda.CUDAGraph(), "torch.cuda.CUDAGraph"),
        (lambda: torch.cuda.graph(None), "torch.cuda.graph"),
        (lambda: torch.cuda.make_graphed_callables(lambda x: x, (torch.ones(1),)), "torch.cuda.make_graphed_callables"),
        (lambda: torch.cuda.Stream(priority=-1), "torch.cuda.Stream(priority=...)"),
        (
            lambda: __import__("torch.utils.cpp_extension").utils.cpp_extension.load("k", ["kernel.cu"]),
            "torch.utils.cpp_extension.load with CUDA sources",
        ),
        (
            lambda: __import__("torch.utils.cpp_extension").utils.cpp_extension.load_inline(
                "k", cpp_sources="", cuda_sources="__global__ void k() {}"
            ),
            "torch.utils.cpp_extension.load_inline with cuda_sources",
        ),
    ],
    ids=["CUDAGraph", "graph", "make_graphed_callables", "stream-priority", "load", "load_inline"],
)
def test_calls_with_no_cpu_meaning_raise_one_clear_error(redirected, call, named):
    with pytest.raises(NoCpuEquivalent, match="nanopatch --cuda-to-cpu: ") as caught:
        call()
    assert str(caught.value).startswith(f"nanopatch --cuda-to-cpu: {named} has no CPU equivalent")
    assert isinstance(caught.value, RuntimeError)


def test_autocast_forms_become_cpu_bf16_or_nothing(redirected):
    model = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)
    expected = torch.bfloat16 if NATIVE_BF16 else torch.float32
    for scope in (
        lambda: torch.cuda.amp.autocast(),
        lambda: torch.autocast("cuda"),
        lambda: torch.autocast(device_type="cuda", dtype=torch.float16),
        lambda: torch.amp.autocast("cuda", enabled=True),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp's own deprecation notice
            with scope():
                assert model(x).dtype == expected
    with torch.autocast("cuda", enabled=False):
        assert model(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the CPU's own autocast is untouched
        assert model(x).dtype == torch.bfloat16


def test_a_cuda_grad_scaler_passes_through_with_its_api(redirected):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for make in (lambda: torch.amp.GradScaler("cuda", init_scale=1024.0), lambda: torch.cuda.amp.GradScaler(1024.0)):
        scaler = make()
        assert isinstance(scaler, torch.amp.GradScaler)
        loss = model(torch.ones(2, 3)).sum()
        assert scaler.scale(loss) is loss  # unscaled: bf16 needs no loss scaling
        loss.backward()
        scaler.unscale_(optimizer)
        before = model.weight.detach().clone()
        scaler.step(optimizer)
        scaler.update()
        assert not torch.equal(before, model.weight)  # the step ran
        assert scaler.get_scale() == 1.0 and scaler.is_enabled()
        state = scaler.state_dict()
        assert state == {
            "scale": 1024.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            "_growth_tracker": 0,
        }
        other = torch.amp.GradScaler("cuda")
        other.load_state_dict({**state, "scale": 8.0, "_growth_tracker": 5})
        assert other.state_dict()["scale"] == 8.0 and other.state_dict()["_growth_tracker"] == 5
        other.set_growth_factor(3.0)
        assert other.get_growth_factor() == 3.0
        buffer = io.BytesIO()
        torch.save(other.state_dict(), buffer)
        buffer.seek(0)
        again = torch.cuda.amp.GradScaler()
        again.load_state_dict(torch.load(buffer, map_location="cuda:0"))
        assert again.state_dict() == other.state_dict()
        optimizer.zero_grad()
    off = torch.amp.GradScaler("cuda", enabled=False)
    assert not off.is_enabled() and off.state_dict() == {}
    cpu_scaler = torch.amp.GradScaler("cpu")  # a CPU scaler stays torch's own
    assert cpu_scaler.state_dict()["scale"] == 2.0**16


@pytest.mark.parametrize(
    "where",
    ["cuda:0", torch.device("cuda"), {"cuda:0": "cpu"}, {"cuda:0": "cuda:1"}, lambda s, loc: s.cuda(0), None, "cuda"],
    ids=["string", "device", "dict-to-cpu", "dict-to-cuda", "callable", "none", "plain-cuda"],
)
def test_map_location_forms_load_a_gpu_checkpoint_on_the_cpu(redirected, tmp_path, where):
    path = tmp_path / "gpu.pt"
    total = _gpu_checkpoint(path)
    state = torch.load(path, map_location=where, weights_only=True)
    assert all(t.device.type == "cpu" for t in state.values())
    assert float(sum(t.sum() for t in state.values())) == total


def test_ddp_device_ids_and_nccl_are_taken_to_the_cpu(redirected, tmp_path):
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(backend="nccl", store=store, rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo"
        model = torch.nn.Linear(2, 2).cuda(0)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], output_device=0)
        ddp(torch.ones(1, 2)).sum().backward()
        dist.barrier(device_ids=[0])
        assert model.weight.grad is not None
    finally:
        dist.destroy_process_group()


def test_data_parallel_wraps_the_cpu_model(redirected):
    model = torch.nn.Linear(2, 2).cuda()
    wrapped = torch.nn.DataParallel(model, device_ids=[0])
    assert wrapped(torch.ones(3, 2)).shape == (3, 2)


def test_refused_classes_stay_classes_for_annotations_and_isinstance(redirected):
    """Libraries annotate with ``torch.cuda.CUDAGraph | None`` at import (transformers does)."""
    assert isinstance(torch.cuda.CUDAGraph, type) and isinstance(torch.cuda.graph, type)
    assert (torch.cuda.CUDAGraph | None) is not None
    assert not isinstance(object(), torch.cuda.CUDAGraph)


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_framework_scripts_written_for_a_gpu_take_their_gpu_path_here(tmp_path, framework):
    """Lightning (automatic accelerator, 16-mixed when CUDA is there) and the HF Trainer
    (``fp16=True``, which refuses to start without CUDA) see a GPU, and run on the CPU in bf16."""
    from helpers.learning_oracle import framework as require

    require("lightning.pytorch" if framework == "lightning" else "transformers")
    out = tmp_path / "report.json"
    _ok(
        run_python(
            ["-m", "nanopatch", "--cuda-to-cpu", str(DATA / "cuda_frameworks.py"), framework, str(out)],
            cwd=tmp_path,
            timeout=300,
        )
    )
    report = json.loads(out.read_text())
    assert report["device"].startswith("cuda")  # the framework took its GPU path
    losses = report["losses"]
    assert len(losses) >= 8 and all(loss == loss for loss in losses)
    assert sum(losses[-4:]) < sum(losses[:4])  # it learns
    if NATIVE_BF16:
        assert report["computed"] == ["torch.bfloat16"]
