"""Fast paths that check themselves (nanopatch/training/selfcheck.py): each probe agrees with
stock on the running torch (every tox env runs this file), and a fast path whose probe
disagrees turns itself off, says so once, shows in status(), and the run learns as stock."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

import nanopatch
from nanopatch import NanopatchWarning
from nanopatch.engine import config
from nanopatch.foundation import cpu, learning
from nanopatch.targets.training import amp, dropout, replay, selfcheck

from helpers.learning_oracle import learns_as_stock
from helpers.training_tasks import STEPS, ResidualMLP, TransformerLM, lm_batches, lm_loss, loop


@pytest.fixture(autouse=True)
def _fresh(fresh_log_once):
    nanopatch.unpatch_torch()
    selfcheck.forget()
    yield
    nanopatch.unpatch_torch()
    selfcheck.forget()


# --- every probe agrees with stock on this torch ------------------------------------------


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_fast_dropout_probe_agrees_with_stock_here(dtype):
    with nanopatch.patched():  # registers the mask kernel and the checkpointing hooks
        assert selfcheck.probe_fast_dropout(dtype) is None
        assert selfcheck.probe_replay(dtype) is None


@pytest.mark.parametrize("rank", [None, 4], ids=["as-is", "channels-last"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_forward_probe_agrees_with_stock_here(dtype, rank):
    assert selfcheck.probe_forward(dtype, rank) is None


@pytest.mark.parametrize(
    "cls, settings",
    [
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        (torch.optim.Adam, {"lr": 1e-3, "amsgrad": True}),
        (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.05}),
        (torch.optim.Adagrad, {"lr": 0.1}),
        (torch.optim.RMSprop, {"lr": 1e-3, "momentum": 0.5}),
    ],
)
def test_the_step_probe_agrees_with_stock_here(cls, settings):
    from nanopatch.targets.training import optim

    flag = optim.choose_flag(cls([torch.zeros(1, requires_grad=True)], **settings))
    assert flag in ("fused", "foreach")
    assert selfcheck.probe_step(cls, settings, flag) is None


def test_the_ipex_probe_agrees_with_stock_here():
    ok, why = config.ipex_compatibility()
    if not ok:
        if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") == "1":
            pytest.fail(f"the ipex env must test IPEX, but {why}")
        pytest.skip(f"IPEX: {why}")
    # IPEX's bf16 weight prepack needs avx512 or avx_ne_convert: not on a CPU without native bf16
    for bf16 in (False, True) if cpu.host_facts().native_bf16 else (False,):
        for cls, settings in ((torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}), (torch.optim.Adam, {"lr": 1e-3})):
            assert selfcheck.probe_ipex(cls, settings, bf16) is None, (cls, bf16)


# --- how a check runs ----------------------------------------------------------------------


def test_a_check_runs_once_leaves_the_rng_alone_and_its_steps_are_not_the_users():
    calls = []

    def probe():
        calls.append(1)
        model = nn.Linear(4, 4)  # draws from the global RNG
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        return None

    torch.manual_seed(0)
    before = torch.get_rng_state()
    with learning.Recorder() as recorder:
        assert selfcheck.check("demo", "demo/key", probe, "a demo fast path")
        assert selfcheck.check("demo", "demo/key", probe, "a demo fast path")
    assert calls == [1]
    assert torch.equal(torch.get_rng_state(), before)
    assert recorder.steps == []  # the probe's step is nanopatch's own, not the run's
    assert selfcheck.results() == [
        {"fast_path": "demo", "key": "demo/key", "passed": True, "detail": "agrees with stock"}
    ]


def test_a_probe_runs_clear_of_the_callers_autocast_and_checkpoint_hooks():
    seen = {}

    def probe():
        seen["autocast"] = amp.autocast_enabled()
        seen["grad"] = torch.is_grad_enabled()
        x = torch.randn(3, requires_grad=True)
        (x * 2).sum().backward()  # a caller's saved-tensor hooks would see this
        return None

    packed = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
            assert selfcheck.check("demo", "demo/clear", probe, "a demo fast path")
    assert seen == {"autocast": False, "grad": True}
    assert packed == []


def test_a_probe_that_raises_turns_its_fast_path_off_with_one_warning():
    def probe():
        raise RuntimeError("an operator this torch does not have")

    with pytest.warns(
        NanopatchWarning, match=r"demo fast path turned off: on torch .*\(the probe failed: RuntimeError"
    ):
        assert not selfcheck.check("demo", "demo/raises", probe, "the demo fast path")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not selfcheck.check("demo", "demo/raises", probe, "the demo fast path")


# --- a fast path that disagrees turns itself off, and the run learns as stock -------------------


def train_lm():
    model = TransformerLM()
    loop(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_batches(), lm_loss)


def _failed(fast_path: str) -> list[dict]:
    return [r for r in selfcheck.results() if r["fast_path"] == fast_path and not r["passed"]]


def train_checkpointed():
    model = ResidualMLP("non-reentrant")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randn(64, 128, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(3)]
    loop(model, optimizer, batches, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))


def test_masks_whose_checkpointing_replay_diverges_are_turned_off(monkeypatch):
    """A torch where checkpointing's replay no longer runs in the forward's state (the hooks
    reach nothing): the first checkpointed forward in a mask region finds the replay's gradients
    differ, and every mask is stock from then on, that forward's included."""
    monkeypatch.setattr(replay, "restored", lambda state: replay.contextlib.nullcontext())
    outcome = learns_as_stock(
        train_checkpointed,
        # bf16 pinned: left to nanopatch, its measurement may choose fp32 here; IPEX's bf16 weight
        # prepack needs avx512 or avx_ne_convert, which a CPU without native bf16 lacks
        options={"bf16": True, **({} if cpu.host_facts().native_bf16 else {"ipex": False})},
        min_steps=STEPS,
        expect_warnings=("fast dropout masks turned off: .*checkpointing changes its gradients",),
    )
    assert _failed("fast_dropout") and dropout.disabled[0]
    [model] = outcome.models
    assert model["computed_in"] == "bfloat16" and not model["fast_dropout"]
    with nanopatch.patched():
        checks = nanopatch.status()["targets"]["training"]["self_checks"]
    assert any(c["key"].startswith("fast_dropout/replay") and not c["passed"] for c in checks)


def test_the_replay_probe_runs_only_where_checkpointing_is_used():
    """A script that never checkpoints does not pay for nanopatch's check of checkpointing's
    replays (which runs checkpointed forwards and backwards)."""
    from conftest import run_python

    code = """
        import torch, nanopatch
        from torch import nn
        nanopatch.patch_torch()
        model = nn.Sequential(nn.Linear(64, 256), nn.Dropout(0.2), nn.Linear(256, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(64, 64)).float().sum().backward()
            optimizer.step()
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        keys = [c["key"] for c in nanopatch.status()["targets"]["training"]["self_checks"]]
        probed = f"fast_dropout/{'bf16' if plan['computed_in'] == 'bfloat16' else 'fp32'}" in keys
        print(plan["fast_dropout"], probed, any(k.startswith("fast_dropout/replay") for k in keys))
    """
    proc = run_python(code, check=True)
    assert proc.stdout.split()[-3:] == ["True", "True", "False"], proc.stdout + proc.stderr


def test_masks_that_cut_the_gradient_are_turned_off(monkeypatch):
    """The mask kernel of a broken fast path: every mask all zeros."""
    monkeypatch.setattr(dropout, "fill_bernoulli", lambda tensor, p, generator=None: tensor.zero_())
    outcome = learns_as_stock(train_lm, min_steps=STEPS, expect_warnings=("fast dropout masks turned off",))
    assert "all zeros" in _failed("fast_dropout")[0]["detail"]
    assert not outcome.models[0]["fast_dropout"]


def test_a_forward_that_cuts_the_graph_is_turned_off_and_the_model_runs_stock(monkeypatch):
    real = amp.to_fp32

    def detached(value, dtype=torch.bfloat16):
        out = real(value, dtype)
        return out.detach() if isinstance(out, torch.Tensor) else out

    monkeypatch.setattr(amp, "to_fp32", detached)
    outcome = learns_as_stock(
        train_lm,
        {"bf16": True},
        min_steps=STEPS,
        require_acceleration=False,
        expect_warnings=("accelerated forward turned off",),
    )
    [model] = outcome.models
    assert "self-check" in model["stock"]


def test_a_fused_step_that_does_not_update_is_turned_off(monkeypatch):
    if not hasattr(torch, "_fused_adamw_"):
        pytest.skip("this torch has no fused AdamW")
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *args, **kwargs: None)
    outcome = learns_as_stock(train_lm, min_steps=STEPS, expect_warnings=("the fused AdamW step turned off",))
    assert not any("fused step" in note for note in outcome.models[0]["notes"])
