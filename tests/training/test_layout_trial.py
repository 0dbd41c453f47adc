"""Channels-last decided by measurement: where nanopatch chose it itself, the model's first
steps compare it with stock's layout (together with bf16 against fp32, where that is measured
too), switching the weights, their gradients and the optimizer's state together, and the
faster stays; a model it slows down trains in stock's layout."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch.foundation import cpu
from nanopatch.targets.training import discovery
from nanopatch.targets.training import patch as training
from nanopatch.targets.training.plan import Plan, Trial
from nanopatch.targets.training.plan import config as plan_config

needs_auto_layout = pytest.mark.skipif(
    not cpu.host_facts().avx2, reason="channels-last is nanopatch's own choice only on a CPU with AVX2"
)
BOTH = [(True, True), (True, False), (False, True), (False, False)]  # (bf16, channels-last), chosen first


def run_trial(ms: dict, *, bf16: bool = True, early: int | None = 2, plan: Plan | None = None):
    """Drive a trial with a clock that gives each mode its step time (``ms[mode]``: one figure,
    or a series taken in turn); returns the plan, the trial, the modes of the steps run and the
    layouts ``relayout`` was asked for."""
    switches: list[bool] = []
    plan = plan or Plan(name="M", amp_dtype=torch.bfloat16, rank=4)
    plan.trial = trial = Trial(early=early, measures_bf16=bf16, relayout=switches.append)
    now, modes, taken = 0.0, [], {}
    while plan.trial is not None:
        mode = trial.mode
        modes.append(mode)
        series = ms[mode] if isinstance(ms[mode], tuple) else (ms[mode],)
        now += series[taken.get(mode, 0) % len(series)] / 1e3 * (3 if mode not in trial.seen else 1)  # set-up steps
        if trial.steps > trial.warmup and mode in trial.seen:
            taken[mode] = taken.get(mode, 0) + 1
        trial.on_step(plan, now)
        assert len(modes) < 100
    return plan, trial, modes, switches


def test_every_mode_is_set_up_then_timed_in_turn_and_the_fastest_stays():
    plan, trial, modes, switches = run_trial(
        {(True, True): 10.0, (True, False): 9.0, (False, True): 10.5, (False, False): 10.2}
    )
    # the chosen mode's warm-up, each other mode's uncounted set-up step and a counted one, then in turn
    assert modes[:9] == [(True, True)] * 3 + [(True, False)] * 2 + [(False, True)] * 2 + [(False, False)] * 2
    assert modes[9:13] == [(True, True), (True, False), (False, True), (False, False)]
    assert all(len(trial.times[mode]) == 4 for mode in BOTH)  # 10% apart at most: no mode out early
    # bf16 in stock's layout was fastest: bf16 kept, channels-last off, the weights laid out so
    assert plan.amp_dtype is torch.bfloat16 and plan.rank is None and plan.layout_now() is None
    assert plan.bf16_measured.startswith("kept: measured bf16 9.0 ms, fp32 10.2 ms per step")
    assert plan.layout_measured.startswith(
        "off: measured slower than stock's layout for this model on this CPU (channels-last 10.0 ms, "
        "stock's layout 9.0 ms per step"
    )
    assert plan.describe()["channels_last"] is False and "channels-last off" in plan.summary()
    # a switch only where the layout changes, and the last one leaves stock's layout
    changes = [b[1] for a, b in itertools.pairwise(modes) if a[1] != b[1]]
    assert switches == changes + ([False] if modes[-1][1] else [])


@pytest.mark.parametrize(
    ("ms", "kept"),
    [
        ({(True, True): 6.0, (True, False): 7.0, (False, True): 12.0, (False, False): 13.0}, (True, True)),
        ({(True, True): 12.0, (True, False): 11.0, (False, True): 10.8, (False, False): 10.0}, (False, False)),
        ({(True, True): 12.0, (True, False): 11.0, (False, True): 9.0, (False, False): 10.0}, (False, True)),
    ],
)
def test_what_the_trial_keeps(ms, kept):
    plan, _, _, switches = run_trial(ms)
    assert (plan.amp_dtype is not None, plan.rank is not None) == kept
    assert plan.bf16_measured.startswith("kept" if kept[0] else "off") and plan.notes
    assert plan.layout_measured.startswith("kept" if kept[1] else "off")
    assert plan.describe()["bf16_measured"] == plan.bf16_measured
    assert plan.describe()["channels_last_measured"] == plan.layout_measured
    laid_out = [True, *switches][-1]  # the layout the weights were last given (channels-last at the start)
    assert laid_out is kept[1]


def test_a_clearly_slower_mode_is_not_run_again():
    """Where fp32 takes twice bf16's time, its two modes are timed twice each and left out: the
    trial goes on between the two layouts in bf16 only."""
    plan, trial, modes, _ = run_trial(
        {(True, True): 10.0, (True, False): (10.6, 10.8), (False, True): 20.0, (False, False): 21.0}
    )
    assert trial.out == {(False, True), (False, False)}
    assert len(trial.times[(False, True)]) == len(trial.times[(False, False)]) == 2
    assert modes[-1] in {(True, True), (True, False)} and len(trial.times[(True, True)]) >= trial.rounds
    assert plan.amp_dtype is torch.bfloat16 and plan.rank == 4
    assert plan.layout_measured.startswith("kept: measured channels-last 10.0 ms, stock's layout 10.6 ms")


def test_where_the_noise_never_clears_the_mode_nearest_stock_stays():
    """Steps as noisy as their differences: measured as long as allowed, then stock's layout and
    fp32, though channels-last in bf16 read fastest."""
    noisy = (9.0, 11.0, 11.0)
    plan, trial, _, switches = run_trial(
        {(True, True): noisy, (True, False): (9.5, 11.0), (False, True): (9.6, 11.0), (False, False): (10.0, 10.2)},
        early=None,
    )
    assert all(len(times) == trial.max_rounds for times in trial.times.values())
    assert plan.amp_dtype is None and plan.rank is None
    assert plan.bf16_measured.startswith("off: not measured clearly faster than fp32")
    assert plan.layout_measured.startswith("off: not measured clearly faster than stock's layout")
    assert "the steps' noise" in plan.layout_measured
    assert switches[-1] is False


def test_a_layout_only_trial_keeps_the_dtype_it_has():
    plan, trial, modes, _ = run_trial({(True, True): 5.0, (True, False): 3.0}, bf16=False)
    assert trial.modes == [(True, True), (True, False)] and {m[0] for m in modes} == {True}
    assert plan.amp_dtype is torch.bfloat16 and plan.bf16_measured is None and plan.rank is None
    assert plan.layout_measured.startswith("off: measured slower")


def test_a_layout_that_cannot_be_switched_stays_and_bf16_is_measured_alone():
    """A switch that fails (a DDP wrapper whose gradient buckets could not be laid out again
    raises after putting the weights back): the trial tries no other layout, keeps the one the
    weights have, measures bf16 in it, and says why the layout was not measured. ``between``
    runs after every step that switched no layout (a DDP wrapper records its gradients' order)."""
    tried, between = [], []

    def relayout(on):
        tried.append(on)
        raise RuntimeError("DistributedDataParallel did not lay its gradient buckets out again")

    plan = Plan(name="M", amp_dtype=torch.bfloat16, rank=4)
    plan.trial = trial = Trial(relayout=relayout, between=lambda: between.append(trial.steps))
    ms, now, modes = {(True, True): 10.0, (False, True): 12.0}, 0.0, []
    while plan.trial is not None:
        modes.append(trial.mode)
        now += ms[trial.mode] / 1e3
        trial.on_step(plan, now)
        assert len(modes) < 100
    assert tried == [False] and all(mode[1] for mode in modes)  # one try; channels-last throughout
    assert plan.rank == 4 and plan.amp_dtype is torch.bfloat16
    assert plan.bf16_measured.startswith("kept: measured bf16 10.0 ms, fp32 12.0 ms per step")
    assert plan.layout_measured == (
        "not measured: switching the layout failed "
        "(RuntimeError: DistributedDataParallel did not lay its gradient buckets out again)"
    )
    assert f"channels-last {plan.layout_measured}" in plan.notes
    assert len(between) == len(modes) - 2  # all but the failed switch's step and the deciding one


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)
        self.seen: list[bool] = []  # whether each call's input reached the convolution channels-last

    def forward(self, x):
        self.seen.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        return self.head(F.relu(self.conv(x)).mean((2, 3)))


def channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def train(model, optimizer, batches, check=None):
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if check is not None:
            check()


def data(steps: int):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(steps)]


@needs_auto_layout
@pytest.mark.parametrize("slower", ["channels-last", "stock's layout"])
@pytest.mark.parametrize("make", ["sgd", "adamw"])
def test_a_real_model_switches_weights_gradients_and_state_together_and_learns_as_stock(monkeypatch, slower, make):
    """The trial's clock made to read one layout slower: the model ends in the other one, its
    inputs, weights, gradients and optimizer state agreed on each step, and it learned what
    stock learns (fp32 here: the layouts give the same values within float rounding)."""
    real = Trial.on_step

    def on_step(self, plan, now=None):
        on_step.now += 0.010 + (0.005 if self.channels_last == (slower == "channels-last") else 0.0)
        return real(self, plan, on_step.now)

    on_step.now = 0.0
    monkeypatch.setattr(Trial, "on_step", on_step)

    def build():
        torch.manual_seed(0)
        model = ConvNet()
        opt = (
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            if make == "sgd"
            else torch.optim.AdamW(model.parameters(), lr=1e-2)
        )
        return model, opt

    batches = data(30)
    with nanopatch.unpatched():
        stock, stock_opt = build()
        train(stock, stock_opt, batches)
    layouts = []
    with nanopatch.patched(bf16=False, ipex=False):  # channels-last is nanopatch's choice: measured
        model, optimizer = build()

        def check():
            weight = model.conv.weight
            state = [v for v in optimizer.state[weight].values() if isinstance(v, torch.Tensor) and v.dim() == 4]
            plan = training.plans[model]
            layouts.append(channels_last(weight))
            assert state and all(channels_last(v) == layouts[-1] for v in state)
            if weight.grad is not None:
                assert channels_last(weight.grad) == layouts[-1]
            assert (plan.layout_now() is not None) == layouts[-1]  # the next call's inputs follow

        train(model, optimizer, batches, check)
        plan = training.plans[model]
        assert plan.trial is None and plan.layout_measured is not None
        kept = slower == "stock's layout"
        assert plan.layout_measured.startswith("kept" if kept else "off: measured slower") and layouts[-1] is kept
        assert (plan.rank is not None) is kept and (plan.layout is not None) is kept
        assert True in layouts and False in layouts  # it did run both
        # each forward's input had the layout the weights had when it ran
        assert model.seen[1:] == layouts[:-1]
        status = next(m for m in nanopatch.status()["targets"]["training"]["details"] if m["model"] == "ConvNet")
        assert status["channels_last_measured"] == plan.layout_measured
        assert status["channels_last"] == ("channels_last" if kept else False)
    assert not channels_last(model.conv.weight)  # unpatched: stock's layout, whatever was kept
    for (name, a), b in zip(model.state_dict().items(), stock.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@needs_auto_layout
@pytest.mark.parametrize(
    "given",
    [{"channels_last": True}, {"compile": "default"}],
    ids=["asked-for", "compiled"],
)
def test_channels_last_is_not_measured_where_the_user_asked_for_it_or_under_compile(given):
    cfg = nanopatch.patched(bf16=False, ipex=False, **given)
    with cfg:
        model = ConvNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        plan_cfg = plan_config()
        plan = Plan(name="ConvNet", rank=4, layout=object())
        assert discovery.layout_measured(plan_cfg, plan) is False
        if "compile" in given:
            return  # compiling this model is another test's cost
        train(model, optimizer, data(6))
        plan = training.plans[model]
        assert plan.trial is None and plan.layout_measured is None and plan.rank == 4
        assert channels_last(model.conv.weight)


@pytest.mark.parametrize("given", [{"channels_last": True}, {}], ids=["asked-for", "measured"])
def test_a_dropped_model_is_not_kept_alive_by_its_layout(given):
    """The journal's entry for channels-last weights, and the trial's switch, hold no reference
    to the model or its optimizer: a script that drops them (a model per fold, per trial of a
    search) frees them while patched."""
    import gc
    import weakref

    with nanopatch.patched(bf16=False, ipex=False, **given):
        model = ConvNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        train(model, optimizer, data(3))
        if given:
            assert channels_last(model.conv.weight)
        elif cpu.host_facts().avx2:  # in the middle of its measurement: the trial's switch is held
            assert training.plans[model].trial.relayout is not None
        refs = weakref.ref(model), weakref.ref(optimizer)
        del model, optimizer
        gc.collect()
        assert [ref() for ref in refs] == [None, None]
