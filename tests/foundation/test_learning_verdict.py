"""nanopatch.learning.compare: each rule of "learns as stock", on hand-made step records."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from nanopatch.learning import Recorder, Step, Tolerance, compare, stock_noise

ALL = frozenset({"a.weight", "a.bias", "b.weight"})


def steps(losses, grads=ALL, updated=ALL, zero=frozenset(), nonfinite=frozenset(), optimizer="SGD"):
    return [Step(optimizer, loss, grads, updated, zero, nonfinite) for loss in losses]


def test_the_same_gradients_updates_and_loss_learn_as_stock():
    verdict = compare(steps([2.0, 1.8, 1.6, 1.5]), steps([2.0, 1.81, 1.6, 1.49]))
    assert verdict.learns and verdict.problems == []
    assert "learns as stock (4 steps" in verdict.summary()


def test_a_parameter_without_a_gradient_is_named_at_its_step():
    patched = steps([2.0]) + steps([1.8], grads=ALL - {"a.weight"})
    verdict = compare(steps([2.0, 1.8]), patched)
    assert not verdict.learns
    assert "at step 2, 1 of 3 parameters that got a gradient in stock got none patched (a.weight)" in verdict.summary()


def test_a_zero_gradient_at_one_step_is_rounding_but_zero_at_every_step_is_a_cut():
    """zero_grad(set_to_none=False) leaves a cut parameter with zeros, not None."""
    once = steps([2.0], zero=frozenset({"a.bias"})) + steps([1.8])
    assert compare(steps([2.0, 1.8]), once).learns
    always = steps([2.0, 1.8], zero=frozenset({"a.bias"}))
    verdict = compare(steps([2.0, 1.8]), always)
    assert "1 parameter(s) with a non-zero gradient in stock never got one patched (a.bias)" in verdict.summary()


def test_parameters_stock_updates_must_be_updated_and_no_others():
    verdict = compare(steps([2.0, 1.8]), steps([2.0, 1.8], updated=ALL - {"b.weight"}))
    assert "1 parameter(s) stock updates were never updated patched (b.weight)" in verdict.summary()
    frozen = steps([2.0, 1.8], grads=ALL - {"b.weight"}, updated=ALL - {"b.weight"})
    verdict = compare(frozen, steps([2.0, 1.8]))
    assert "stock never updates (nor gives a non-zero gradient) were updated patched (b.weight)" in verdict.summary()
    zero_in_stock = steps([2.0, 1.8], zero=frozenset({"b.weight"}), updated=ALL - {"b.weight"})
    assert not compare(zero_in_stock, steps([2.0, 1.8])).learns


def test_a_parameter_stock_moves_by_less_than_rounding_may_move_patched():
    """A convolution's bias before a batch norm: its gradient is zero but for rounding, which
    moves it by less than fp32's rounding in stock and by more in bf16."""
    verdict = compare(steps([2.0, 1.8], updated=ALL - {"b.weight"}), steps([2.0, 1.8]))
    assert verdict.learns, verdict.summary()


def test_inf_or_nan_where_stock_is_finite_does_not_learn():
    verdict = compare(steps([2.0, 1.8]), steps([2.0]) + steps([math.nan], nonfinite=frozenset({"a.weight"})))
    assert not verdict.learns
    assert "inf or nan in the gradient of a.weight" in verdict.summary()
    assert "infinitely far" in verdict.summary()


def test_the_final_loss_bound_is_5_percent_on_a_steady_run():
    stock = steps([2.0, 1.99, 1.98, 1.97, 1.96, 1.95])
    assert stock_noise(stock) < 0.01
    assert compare(stock, steps([2.0, 1.99, 1.98, 2.03, 2.02, 2.01])).learns  # 3.1% over the last 3
    verdict = compare(stock, steps([2.0, 1.99, 1.98, 2.09, 2.08, 2.07]))  # 6.2%
    assert not verdict.learns and "(more than 5%)" in verdict.summary()


def test_the_bounds_widen_to_stocks_own_step_to_step_noise():
    """A run whose loss leaps between steps moves apart from stock as far under bf16 written by
    hand; a run learning at another pace stays outside even then."""
    stock = steps([2.4, 1.9, 2.3, 1.7, 2.1, 1.5])
    assert stock_noise(stock) > 0.15
    assert compare(stock, steps([2.4, 2.0, 2.2, 1.9, 2.0, 1.7])).learns  # 10% apart, noise about 20%
    verdict = compare(stock, steps([2.4, 2.3, 2.4, 2.3, 2.4, 2.3]))  # barely learning
    assert not verdict.learns and "stock's own step-to-step noise" in verdict.summary()


def test_noise_is_taken_per_optimizer():
    """A GAN's discriminator and generator losses alternate: they are two streams, not noise."""
    stock = []
    for loss_d, loss_g in ((1.4, 0.7), (1.38, 0.71), (1.36, 0.72)):
        stock += steps([loss_d], optimizer="Adam") + steps([loss_g], optimizer="Adam#2")
    assert stock_noise(stock) < 0.05


def test_a_loss_near_zero_is_compared_against_a_tenth_of_the_first():
    stock = steps([2.0, 0.5, 0.05, 0.02, 0.01])
    assert compare(stock, steps([2.0, 0.5, 0.05, 0.03, 0.02]), Tolerance(noise=0)).learns


def test_the_recorder_records_a_plain_loop_and_labels_a_second_optimizer_of_a_class():
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(4, 4), nn.Linear(4, 1)
    opt_g = torch.optim.Adam(generator.parameters())
    opt_d = torch.optim.Adam(discriminator.parameters())
    losses = []
    with Recorder() as recorder:
        for _ in range(2):
            opt_d.zero_grad()
            loss_d = discriminator(torch.randn(3, 4)).mean()
            loss_d.backward()
            opt_d.step()
            losses.append(loss_d.item())
            opt_g.zero_grad()
            loss_g = discriminator(generator(torch.randn(3, 4))).mean()
            loss_g.backward()
            opt_g.step()
            losses.append(loss_g.item())
    assert [s.optimizer for s in recorder.steps] == ["Adam", "Adam#2", "Adam", "Adam#2"]
    assert [s.loss for s in recorder.steps] == losses
    # each step names the parameters of its own optimizer's model: the generator's step, the generator's
    assert recorder.steps[1].grads == {"weight", "bias"} and recorder.steps[1].optimizer == "Adam#2"
    assert set(recorder.named_parameters()) == {"weight", "bias", "[Adam#2] weight", "[Adam#2] bias"}
    assert all(s.updated == s.grads for s in recorder.steps)


def test_the_recorder_leaves_an_lr_scheduler_s_step_mark_in_place():
    """An LR scheduler makes the optimizer's ``step`` an instance wrapper of its own, which the
    recorder wraps in turn: the scheduler must still find its mark there, or every
    ``scheduler.step()`` warns that the optimizer's step was overridden (as ``--verify`` did on
    the demo script), and each step is still recorded once."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Recorder() as recorder:
            for _ in range(3):
                optimizer.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                optimizer.step()
                scheduler.step()
    assert len(recorder.steps) == 3
    assert optimizer.param_groups[0]["lr"] == 0.0


def test_an_update_is_a_move_larger_than_fp32_rounding():
    """A weight of 1.0 whose update is a unit in its last place (a norm behind a zero-initialised
    residual branch, say) is rounding's, not learning: a bf16 run may make it where stock did not.
    A weight at 0 moved by anything, and a bf16 weight moved by one of its own units, are updates."""
    one_ulp = torch.finfo(torch.float32).eps
    cases = {
        "norm_at_one": (torch.ones(4), torch.full((4,), one_ulp), False),
        "norm_at_one_moved": (torch.ones(4), torch.tensor([0.0, 0.0, 0.0, 1e-5]), True),
        "bias_at_zero": (torch.zeros(4), torch.full((4,), 1e-30), True),
        "bf16_weight": (torch.ones(4, dtype=torch.bfloat16), torch.full((4,), 2.0**-7), True),
        "untouched": (torch.randn(4), torch.zeros(4), False),
    }
    module = torch.nn.Module()
    for name, (value, _, _) in cases.items():
        module.register_parameter(name, torch.nn.Parameter(value.clone()))
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    with Recorder([module]) as recorder:
        for name, (_, move, _) in cases.items():
            getattr(module, name).grad = -move.to(getattr(module, name).dtype)
        optimizer.step()
    [step] = recorder.steps
    assert step.updated == {name for name, (_, _, updated) in cases.items() if updated}
