"""compile="auto": torch.compile only where the run's own steps measure it faster, eager otherwise
(a short script, a slower or failing compile, graph breaks), the choice remembered per machine."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

import nanopatch
from nanopatch.foundation import records
from nanopatch.targets.training import compile_choice
from nanopatch.targets.training import patch as training
from nanopatch.targets.training.plan import Plan

NATIVE = {"ipex": False}
RECORD = compile_choice.RECORD_FILE


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / compile_choice.RECORD_FILE


def drive(
    trial: compile_choice.CompileTrial,
    plan: Plan,
    eager_ms: float,
    compiled_ms: float,
    compile_s=5.0,
    limit=200,
    states: list | None = None,
):
    """Step ``plan`` through its trial with fixed iteration times; the modes each iteration ran
    (and, into ``states``, what ``status()`` said of the choice before each)."""
    plan.compile_trial = trial
    now, modes = 0.0, []
    trial.on_step(plan, now)  # the first step's end: nothing timed yet
    while plan.compile_trial is not None and len(modes) < limit:
        if states is not None:
            states.append(plan.describe()["compile_choice"])
        compiled = bool(plan.compile_mode)
        first = compiled and trial.phase == "compiling"
        modes.append("compile" if first else ("compiled" if compiled else "eager"))
        now += (compiled_ms if compiled else eager_ms) / 1e3 + (compile_s if first else 0.0)
        trial.on_step(plan, now)
    return modes


@pytest.mark.parametrize(("compiled_ms", "kept"), [(70, True), (130, False)])
def test_compiled_is_kept_only_where_it_measured_faster(cache, compiled_ms, kept):
    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key="k", prior_compile_s=0.95, min_steps=4)
    states = []
    modes = drive(trial, plan, eager_ms=100, compiled_ms=compiled_ms, states=states)
    # eager until the run has spent the expected compile time (and min_steps), then compile
    # once, then eager and compiled alternate until each has `rounds` timings
    assert modes[:10] == ["eager"] * 10 and modes[10] == "compile"
    # status() says "waiting" before the compile, "measuring" from it to the decision
    assert states == ["waiting"] * 10 + ["measuring"] * (len(modes) - 10)
    assert modes[11:] == ["eager", "compiled"] * 3
    assert trial.compile_s == pytest.approx(5.0 + (compiled_ms - 100) / 1e3)
    assert (plan.compile_mode == "default") is kept and plan.compile_trial is None
    choice = plan.describe()["compile_choice"]
    assert choice.startswith("compiled: measured faster" if kept else "eager: measured slower")
    assert f"compiled {compiled_ms} ms, eager 100 ms per step" in choice
    record = json.loads(cache.read_text())["k"]
    assert record["compiled"] is kept and record["eager_ms"] == 100 and record["compiled_ms"] == compiled_ms
    if not kept:
        assert plan.compiled is None


def test_a_short_run_never_compiles():
    """A 20-step script whose steps take a second: 20 s of eager steps is less than the compile
    time expected, so it never pays for compiling."""
    plan = Plan(name="M")
    plan.compile_trial = trial = compile_choice.CompileTrial(key=None)
    for step in range(21):
        trial.on_step(plan, float(step))
        assert plan.compile_mode is False
    assert plan.describe()["compile_choice"] == "waiting" and trial.phase == "eager"


def test_a_tie_within_the_noise_keeps_eager():
    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key=None, prior_compile_s=0.0, min_steps=1)
    modes = drive(trial, plan, eager_ms=100, compiled_ms=99.5)
    assert modes.count("compiled") == trial.max_rounds  # measured as long as allowed: 0.5% < the 2% margin
    assert plan.compile_mode is False
    assert plan.compile_choice.startswith("eager: not measured clearly faster")


def test_noisy_steps_need_a_clear_win(monkeypatch):
    """Compiled 5% faster at its fastest, but each mode's median is 8-10% above its fastest: eager."""
    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key=None, prior_compile_s=0.0, min_steps=1)
    plan.compile_trial = trial
    trial.on_step(plan, 0.0)
    now, eager, compiled = 0.0, iter([0.100, 0.112, 0.108] * 10), iter([0.095, 0.106, 0.1045] * 10)
    now += 0.1
    trial.on_step(plan, now)  # the eager step that reaches the threshold
    now += 5.0
    trial.on_step(plan, now)  # the compile
    while plan.compile_trial is not None:
        now += next(compiled) if plan.compile_mode else next(eager)
        trial.on_step(plan, now)
    assert plan.compile_mode is False and "noise of 10%" in plan.compile_choice  # compiled: (0.1045 - 0.095) / 0.095


def test_graph_breaks_end_the_trial_with_eager(monkeypatch):
    graphs = iter(range(0, 100, 20))
    monkeypatch.setattr(compile_choice, "graph_count", lambda: next(graphs))
    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key=None, prior_compile_s=0.0, min_steps=1)
    drive(trial, plan, eager_ms=100, compiled_ms=50)
    assert plan.compile_mode is False and "made 20 graphs" in plan.compile_choice


def test_a_record_of_a_slower_compile_skips_the_trial_and_one_of_a_faster_sets_the_wait(cache):
    model = nn.Linear(4, 4)
    key = compile_choice.model_key(model, "default")
    records.write_record(
        key, {"compiled": False, "compile_s": 30, "compiled_ms": 12, "eager_ms": 10, "date": "d"}, RECORD
    )
    plan = Plan(name="Linear")
    compile_choice.start(plan, model)
    assert plan.compile_trial is None and plan.compile_mode is False
    assert plan.compile_choice.startswith("eager: an earlier run on this machine measured torch.compile slower")
    records.write_record(
        key, {"compiled": True, "compile_s": 7.5, "compiled_ms": 8, "eager_ms": 10, "date": "d"}, RECORD
    )
    plan = Plan(name="Linear")
    compile_choice.start(plan, model)
    assert plan.compile_trial.expected_compile_s() == 7.5
    assert compile_choice.model_key(nn.Linear(4, 5), "default") != key  # another shape, another record


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))


def train(model, optimizer, steps):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def fast_trial(monkeypatch):
    """A trial that tries compiling after 2 eager steps."""
    monkeypatch.setattr(compile_choice, "PRIOR_COMPILE_S", 0.0)
    monkeypatch.setattr(compile_choice, "MIN_STEPS", 2)


def test_auto_compiles_a_real_model_measures_it_and_learns(monkeypatch, caplog, cache):
    fast_trial(monkeypatch)
    caplog.set_level(logging.INFO, logger="nanopatch")
    with nanopatch.patched(bf16=False, compile="auto", **NATIVE):
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = train(model, optimizer, 2)
        plan = training.plans[model]
        assert plan.compiled is None and plan.compile_trial.phase == "eager"
        while plan.compiled is None and len(losses) < 8:  # 2 eager steps timed, then it compiles
            losses += train(model, optimizer, 1)
        assert plan.compile_trial is not None and plan.compiled is not None
        losses += train(model, optimizer, 2 * compile_choice.CompileTrial.max_rounds + 2)
        described = next(m for m in nanopatch.status()["targets"]["training"]["details"] if m["model"] == "Sequential")
    assert plan.compile_trial is None
    assert described["compile_choice"] == plan.compile_choice
    assert plan.compile_choice.split(":")[0] in ("compiled", "eager")
    assert described["compile"] == ("default" if plan.compile_choice.startswith("compiled") else False)
    assert any("compile=auto chose" in r.getMessage() for r in caplog.records)
    # the model's line says how many of its training calls ran compiled: the trial's, and after it
    # every one where compiled was kept
    calls = plan.seen.compiled_calls
    assert 0 < calls < plan.seen.training_calls
    assert f"torch.compile ({calls} of its training calls)" in plan.summary(), plan.summary()
    assert json.loads(cache.read_text())  # remembered
    assert losses[-1] < losses[0]


def test_auto_falls_back_to_eager_on_a_compile_error_without_a_warning(monkeypatch, recwarn):
    fast_trial(monkeypatch)

    def failing_compile(fn, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("backend exploded")

        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    plan, _, losses = train_auto(8)
    assert plan.compile_mode is False and plan.compile_trial is None
    assert plan.compile_choice == "eager: torch.compile failed (RuntimeError: backend exploded)"
    assert not [w for w in recwarn if "torch.compile" in str(w.message)]
    assert plan.seen.compiled_calls == 0 and "torch.compile" not in plan.summary()
    assert losses[-1] < losses[0]


def test_a_real_20_step_script_is_not_compiled():
    plan, described, losses = train_auto(20)
    assert plan.compiled is None and plan.compile_mode is False
    assert described["compile_choice"] == "waiting"
    assert losses[-1] < losses[0]


def train_auto(steps: int):
    """``small_model`` trained ``steps`` steps under compile="auto": its plan, what ``status()``
    said of it before unpatching, and its losses."""
    with nanopatch.patched(bf16=False, compile="auto", **NATIVE):
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = train(model, optimizer, steps)
        plan = training.plans[model]
        return plan, plan.describe(), losses


@pytest.mark.parametrize(
    ("first", "second", "margin", "verdict"),
    [
        ([1.0, 1.0], [2.0, 2.0], 0.0, "faster"),  # no noise: any difference counts
        ([2.0, 2.0], [1.0, 1.0], 0.0, "slower"),
        ([1.0, 1.0], [1.0, 1.0], 0.0, "within"),
        ([0.9, 1.5, 1.5], [1.0, 1.0, 1.0], 0.0, "within"),  # 10% faster, but its own spread is 67%
        ([0.9, 0.9, 0.9], [1.0, 1.0, 1.0], 0.2, "within"),  # 10% faster, under the 20% margin
        ([0.7, 0.7, 0.7], [1.0, 1.0, 1.0], 0.2, "faster"),
    ],
)
def test_the_bf16_and_compile_measurements_share_one_noise_rule(first, second, margin, verdict):
    from nanopatch.targets.training.plan import beyond_noise, spread

    said, noise = beyond_noise(first, second, margin)
    assert said == verdict
    assert noise == max(spread(first), spread(second), margin)


# --- data-parallel: every rank agrees ---------------------------------------------------------


def test_data_parallel_ranks_compile_at_the_same_step_and_decide_from_the_slowest_ranks_times():
    """Under DDP each step's time goes through ``agree`` (the ranks' maxima): this rank's own
    steps say compiled is faster, the slowest rank's say it is slower, and eager stays with the
    agreed figures; every step of the trial asks, with no failure to report."""
    asked = []

    def agree(values):  # the other rank: eager 100 ms, compiled 130 ms
        asked.append(values)
        took, failed = values
        other = 0.130 if plan.compile_mode else 0.100
        return [max(took, other), failed]

    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key="k", prior_compile_s=0.95, min_steps=4, agree=agree)
    modes = drive(trial, plan, eager_ms=100, compiled_ms=70)
    assert modes[10] == "compile" and plan.compile_mode is False
    assert plan.compile_choice.startswith("eager: measured slower: compiled 130 ms, eager 100 ms per step")
    assert len(asked) == len(modes) and {failed for _, failed in asked} == {0.0}


@pytest.mark.parametrize("where", ["here", "another rank"])
def test_a_compile_failure_on_any_rank_ends_every_ranks_trial_at_the_same_step(where):
    """A rank whose compile fails runs eagerly and reports it at the step's end (it does not end
    its trial alone, which would leave the others waiting in the all-reduce); a failure on
    another rank ends this one's trial at the same step, eager."""
    asked = []

    def agree(values):
        asked.append(values)
        failed = 1.0 if where == "another rank" and plan.compile_mode else values[1]
        return [values[0], failed]

    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key="k", prior_compile_s=0.0, min_steps=2, agree=agree)
    plan.compile_trial = trial
    now = 0.0
    for _ in range(3):  # the first step's end, then two eager steps: compiling is next
        now += 0.1
        trial.on_step(plan, now)
    assert plan.compile_mode == "default" and trial.phase == "compiling"
    if where == "here":
        trial.fail(plan, "torch.compile failed (RuntimeError: boom)")
        assert plan.compile_trial is trial and plan.compile_mode is False  # eager until the step's end
    trial.on_step(plan, now + 0.1)
    assert plan.compile_trial is None and plan.compile_mode is False
    why = "torch.compile failed (RuntimeError: boom)" if where == "here" else "torch.compile failed on another rank"
    assert plan.compile_choice == f"eager: {why}"
    assert asked[-1][1] == (1.0 if where == "here" else 0.0)


@pytest.mark.parametrize("records", [(True, True), (True, False), (False, True)])
def test_every_rank_runs_the_compile_trial_or_none_does(records):
    """A rank whose own record of an earlier run skipped the trial (another CPU, other threads)
    makes every rank skip it: one all-reduce as the model is set up, on every rank."""
    here, other = records  # whether each rank's record left it a trial
    calls = []

    def agree(values):
        calls.append(values)
        return [max(values[0], 0.0 if other else 1.0)]

    plan = Plan(name="M")
    plan.compile_trial = trial = compile_choice.CompileTrial(key="k") if here else None
    compile_choice.agree_ranks(plan, agree)
    assert calls == [[0.0 if here else 1.0]]
    if here and other:
        assert plan.compile_trial is trial and trial.agree is agree
    elif here:
        assert plan.compile_trial is None and plan.compile_mode is False
        assert plan.compile_choice == "eager: another rank's record of an earlier run measured torch.compile slower"
    else:
        assert plan.compile_trial is None


# --- a step under a dispatch mode (FlopCounterMode) is no step of the trial -----------------------


def test_a_step_under_a_dispatch_mode_is_not_timed_in_any_phase():
    """A script counting its FLOPs once (``FlopCounterMode``, an MFU figure) runs that step
    eagerly and slowly, whatever the trial's phase: it was timed as an eager step, as the
    compile (the compile then came at the next step and was timed as a compiled one) or as a
    compiled step of the duel. Each such step is left out and the same forward runs again."""
    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key=None, prior_compile_s=0.35, min_steps=2)
    plan.compile_trial = trial
    now, ran = 0.0, []
    trial.on_step(plan, now)
    odd_steps = {2, 5, 7}  # one while eager, the one due to compile, one of the duel
    while plan.compile_trial is not None and len(ran) < 40:
        odd = len(ran) in odd_steps
        compiled = bool(plan.compile_mode) and not odd  # under the mode the forward runs eagerly
        first = compiled and trial.phase == "compiling"
        ran.append(("odd " if odd else "") + ("compile" if first else "compiled" if compiled else "eager"))
        plan.odd_step = odd
        now += 1.0 if odd else (0.070 if compiled else 0.100) + (5.0 if first else 0.0)
        trial.on_step(plan, now)
        assert not plan.odd_step  # read once, at the step's end
    assert ran[:8] == ["eager", "eager", "odd eager", "eager", "eager", "odd eager", "compile", "odd eager"]
    assert trial.eager_steps == 4 and trial.compile_s == pytest.approx(5.0 - 0.030)
    assert ran[8:] == ["eager", "compiled"] * 3
    assert trial.times[True] == pytest.approx([0.070] * 3) and trial.times[False] == pytest.approx([0.100] * 3)
    assert plan.compile_mode == "default" and plan.compile_choice.startswith("compiled: measured faster")


def test_a_step_another_rank_ran_under_a_dispatch_mode_is_left_out_on_every_rank():
    """Ranks agree through the all-reduce's maximum: a rank whose step ran under a dispatch mode
    reports it as untimed, so every rank leaves that step out together."""
    from nanopatch.targets.training.plan import UNTIMED

    asked = []

    def agree(values):  # the other rank counted FLOPs on its third step
        asked.append(values)
        return [UNTIMED if len(asked) == 3 else values[0], values[1]]

    plan = Plan(name="M")
    trial = compile_choice.CompileTrial(key=None, prior_compile_s=0.0, min_steps=4, agree=agree)
    plan.compile_trial = trial
    for step in range(6):
        trial.on_step(plan, step * 0.1)
    assert trial.eager_steps == 4 and len(asked) == 5  # 5 steps timed, one of them left out


def test_the_bf16_trial_leaves_a_step_under_a_dispatch_mode_out():
    from nanopatch.targets.training.plan import Trial

    plan = Plan(name="M", amp_dtype=torch.bfloat16)
    plan.trial = trial = Trial()
    now, steps = 0.0, 0
    while plan.trial is not None:
        steps += 1
        plan.odd_step = steps == 6  # the first timed fp32 step after its set-up
        now += 1.0 if plan.odd_step else (0.010 if trial.bf16 else 0.020)
        trial.on_step(plan, now)
    assert trial.times[(True, True)] == pytest.approx([0.010] * 2)
    assert trial.times[(False, True)] == pytest.approx([0.020] * 2)  # the 1 s step is not among them
    assert plan.amp_dtype is torch.bfloat16


def test_a_training_call_under_a_dispatch_mode_marks_its_step_and_the_step_clears_it():
    from torch.utils.flop_counter import FlopCounterMode

    with nanopatch.patched(**NATIVE, bf16=False, compile="auto"):
        model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 16)

        def step():
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()

        step()
        [plan] = training.plans.values()
        trial = plan.compile_trial
        assert trial is not None and trial.phase == "eager"
        step()
        timed = trial.eager_steps
        with FlopCounterMode(display=False):
            model(x).sum().backward()
            assert plan.odd_step
            optimizer.step()
        assert not plan.odd_step and trial.eager_steps == timed  # not timed
        step()
        assert trial.eager_steps == timed + 1
