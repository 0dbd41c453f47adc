"""Finding the model wherever its training forward runs (closures, outer modules' methods,
models built before patching, several regions), hook safety, output activations in fp32,
and status reporting what really ran. Framework code (Lightning, HF, timm) is in
test_frameworks.py; these use plain torch shaped like it."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch import NanopatchWarning
from nanopatch.foundation import cpu
from nanopatch.targets.training import discovery
from nanopatch.targets.training import patch as training

NATIVE = {"ipex": False, "bf16": True, "channels_last": True}


class Probe:
    """What a layer saw and computed in: (input channels-last, output dtype) per call."""

    def __init__(self, module: nn.Module) -> None:
        self.seen: list[tuple[bool, torch.dtype]] = []
        module.register_forward_hook(self._hook)

    def _hook(self, module, args, out) -> None:
        x = args[0]
        channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        self.seen.append((channels_last, out.dtype))


def cnn(classes: int = 4) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, classes),
    )


def details() -> list[dict]:
    return nanopatch.status()["targets"]["training"]["details"]


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    gc.collect()  # optimizers of earlier tests must not be found by the scan at patch time
    yield
    nanopatch.unpatch_torch()


class LitLike(nn.Module):
    """A LightningModule's shape: the framework calls ``training_step``, never ``__call__``."""

    def __init__(self) -> None:
        super().__init__()
        self.model = cnn()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, via_self: bool):
        x, y = batch
        out = self(x) if via_self else self.model(x)
        return F.cross_entropy(out, y)


@pytest.mark.parametrize("via_self", [False, True])
def test_the_forward_inside_step_closure_of_an_outer_modules_method_is_found(via_self):
    with nanopatch.patched(**NATIVE):
        torch.manual_seed(0)
        lit = LitLike()
        optimizer = torch.optim.SGD(lit.parameters(), lr=0.1)
        probe = Probe(lit.model[3])
        batch = (torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
        for _ in range(3):

            def closure():
                optimizer.zero_grad()
                loss = lit.training_step(batch, via_self)
                loss.backward()
                return loss

            loss = optimizer.step(closure)  # forward and backward run inside the step
        assert probe.seen and all(seen == (True, torch.bfloat16) for seen in probe.seen)
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        (entry,) = details()
        assert entry["model"] == ("LitLike" if via_self else "Sequential")  # the module really called
        assert entry["computed_in"] == "bfloat16" and entry["autocast"] == "nanopatch"
        assert entry["training_calls"] == 3


def test_status_lists_only_models_whose_forward_ran_in_training():
    with nanopatch.patched(**NATIVE):
        lit = LitLike()
        optimizer = torch.optim.SGD(lit.parameters(), lr=0.1)
        lit.train()  # the outer module is put in training mode, but never called
        loss = lit.training_step((torch.randn(2, 3, 8, 8), torch.tensor([0, 1])), via_self=False)
        loss.backward()
        optimizer.step()
        assert [d["model"] for d in details()] == ["Sequential"]


def test_a_users_step_hooks_and_gradient_clipping_coexist_with_a_closure_step():
    calls = {"pre": 0, "post": 0, "backward": 0, "state": 0}
    with nanopatch.patched(**NATIVE):
        model = cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        optimizer.register_step_pre_hook(lambda *a: calls.__setitem__("pre", calls["pre"] + 1))
        optimizer.register_step_post_hook(lambda *a: calls.__setitem__("post", calls["post"] + 1))
        model[-1].register_full_backward_hook(lambda *a: calls.__setitem__("backward", calls["backward"] + 1))
        model.register_state_dict_post_hook(lambda *a: calls.__setitem__("state", calls["state"] + 1))
        probe = Probe(model[3])
        x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])

        def closure():
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            return loss

        for _ in range(3):
            optimizer.step(closure)
        model.state_dict()
        assert calls == {"pre": 3, "post": 3, "backward": 3, "state": 1}
        assert probe.seen[-1] == (True, torch.bfloat16)


def test_models_and_optimizers_built_before_patching_are_found():
    model = cnn()
    optimizer = torch.optim.AdamW(model.parameters())
    probe = Probe(model[3])
    nanopatch.patch_torch(**NATIVE)
    out = model(torch.randn(2, 3, 8, 8))
    F.cross_entropy(out, torch.tensor([0, 1])).backward()
    optimizer.step()
    assert probe.seen == [(True, torch.bfloat16)] and out.dtype == torch.float32


def test_a_decorated_training_function_is_accelerated_on_every_call_with_fresh_objects():
    @nanopatch.patched(**NATIVE)
    def train(model, optimizer, x, y):
        for _ in range(2):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    for _ in range(2):
        model = cnn()  # built outside the patched region, fresh each time
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        probe = Probe(model[3])
        train(model, optimizer, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
        assert probe.seen == [(True, torch.bfloat16)] * 2
        assert "forward" not in model.__dict__ and model[0].weight.is_contiguous()  # undone after the call


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = cnn(classes=8)
        self.text = nn.Linear(5, 8)
        self.head = nn.Linear(16, 2)

    def forward(self, image, text, *, scale=1.0):
        return self.head(torch.cat([self.image(image), self.text(text)], dim=1)) * scale


def test_a_model_with_several_inputs_and_keyword_arguments():
    with nanopatch.patched(**NATIVE):
        model = TwoInputs()
        optimizer = torch.optim.Adam(model.parameters())
        probe = Probe(model.image[3])
        for _ in range(2):
            optimizer.zero_grad()
            out = model(image=torch.randn(2, 3, 8, 8), text=torch.randn(2, 5), scale=0.5)
            F.cross_entropy(out, torch.tensor([0, 1])).backward()
            optimizer.step()
        assert out.dtype == torch.float32 and probe.seen[-1] == (True, torch.bfloat16)
        assert [d["model"] for d in details()] == ["TwoInputs"]


def test_a_gan_accelerates_both_models():
    with nanopatch.patched(**NATIVE):
        torch.manual_seed(0)
        gen = nn.Sequential(nn.Linear(8, 3 * 8 * 8), nn.Unflatten(1, (3, 8, 8)), nn.Conv2d(3, 3, 3, padding=1))
        disc = nn.Sequential(cnn(classes=1), nn.Sigmoid())
        opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
        opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
        probe_g, probe_d = Probe(gen[2]), Probe(disc[0][3])
        for _ in range(2):
            fake = gen(torch.randn(4, 8))
            opt_d.zero_grad()
            d_loss = F.binary_cross_entropy(disc(torch.randn(4, 3, 8, 8)), torch.ones(4, 1))
            d_loss = d_loss + F.binary_cross_entropy(disc(fake.detach()), torch.zeros(4, 1))
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss = F.binary_cross_entropy(disc(fake), torch.ones(4, 1))
            g_loss.backward()
            opt_g.step()
        assert probe_g.seen[-1][1] == torch.bfloat16 and probe_d.seen[-1] == (True, torch.bfloat16)
        assert sorted(d["model"] for d in details()) == ["Sequential", "Sequential"]
        assert [d["fp32_heads"] for d in details()] == [0, 1] or [d["fp32_heads"] for d in details()] == [1, 0]
        assert all(d["computed_in"] == "bfloat16" for d in details())  # probed in the layers


def test_a_sigmoid_head_feeding_bce_computes_in_fp32():
    """In bf16, sigmoid(8) rounds to exactly 1.0 and BCE with target 0 sees log(0)."""
    torch.manual_seed(0)

    def head() -> nn.Module:
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
        with torch.no_grad():
            model[2].bias.fill_(8.0)  # a confident logit
        return model

    x, target = torch.randn(8, 4), torch.zeros(8, 1)
    stock_model = head()
    stock_loss = F.binary_cross_entropy(stock_model(x), target)
    assert torch.bfloat16 == torch.sigmoid(torch.tensor(8.0, dtype=torch.bfloat16)).dtype
    assert torch.sigmoid(torch.tensor(8.0, dtype=torch.bfloat16)).item() == 1.0  # the failure nanopatch avoids
    with nanopatch.patched(**NATIVE):
        model = head()
        model.load_state_dict(stock_model.state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        probe = Probe(model[2])
        loss = F.binary_cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        assert probe.seen[-1][1] == torch.bfloat16  # the layers still compute in bf16
        assert details()[0]["fp32_heads"] == 1
    # bf16 layers move the logit a little; the probabilities near 1 are what must survive
    assert torch.isfinite(loss) and loss.item() < 50
    torch.testing.assert_close(loss, stock_loss, rtol=0.05, atol=0.0)


def test_the_heads_fp32_forward_is_undone_and_not_pickled(tmp_path):
    with nanopatch.patched(**NATIVE):
        model = nn.Sequential(nn.Linear(4, 3), nn.LogSoftmax(dim=1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        F.nll_loss(model(torch.randn(2, 4)), torch.tensor([0, 1])).backward()
        optimizer.step()
        assert "forward" in model[1].__dict__
        torch.save(model, tmp_path / "m.pt")
        assert b"nanopatch" not in (tmp_path / "m.pt").read_bytes()
    assert "forward" not in model[1].__dict__ and "forward" not in model.__dict__


def test_a_users_own_autocast_is_reported_as_the_frameworks_and_not_doubled():
    with nanopatch.patched(**NATIVE):
        model = cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        probe = Probe(model[3])
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(torch.randn(2, 3, 8, 8))
            assert out.dtype == torch.bfloat16  # as stock under the user's autocast
            F.cross_entropy(out.float(), torch.tensor([0, 1])).backward()
            optimizer.step()
        assert probe.seen[-1] == (True, torch.bfloat16)
        (entry,) = details()
        assert entry["autocast"] == "framework" and entry["computed_in"] == "bfloat16"


def test_no_warning_for_an_accelerated_model_and_the_search_hooks_end():
    from torch.nn.modules import module as module_mod

    with nanopatch.patched(**NATIVE), warnings.catch_warnings():
        warnings.simplefilter("error", NanopatchWarning)
        model = cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        assert discovery.search.hooks
        for _ in range(5):
            optimizer.zero_grad()
            F.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([0, 1])).backward()
            optimizer.step()
        assert not discovery.search.hooks and not discovery.search.pending
        assert not module_mod._global_forward_pre_hooks and not module_mod._global_forward_hooks
    assert training.summary() == []  # unpatched: nothing is accelerated now


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {"strategy": "ddp", "devices": 2, "num_nodes": 1}),
        ({"max_epochs": 1, "accelerator": "cpu"}, {"strategy": "ddp", "devices": 2, "num_nodes": 1}),
        ({"strategy": "ddp_spawn"}, {"strategy": "ddp_spawn"}),  # the script's own choice stands
        ({"devices": 1}, {"devices": 1}),
    ],
)
def test_a_lightning_trainer_in_a_nproc_process_gets_lightnings_ddp(monkeypatch, given, expected):
    from nanopatch.targets.parallel import lightning
    from nanopatch.targets.parallel import patch as distributed

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    options = lightning.trainer_options(dict(given))
    assert {k: options[k] for k in expected} == expected
    assert {k: options[k] for k in given} == {**given, **{k: v for k, v in expected.items() if k in given}}


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.rnn = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 50)

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0])


@pytest.mark.skipif(not cpu.host_facts().native_bf16, reason="bf16 is auto-on only on a CPU with native bf16")
def test_a_recurrent_model_keeps_bf16_only_if_it_measured_faster():
    from nanopatch.targets.training.plan import Trial

    with nanopatch.patched(ipex=False, channels_last=True):  # bf16 left to nanopatch: measured
        model = Recurrent()
        optimizer = torch.optim.Adam(model.parameters())
        probe = Probe(model.head)
        tokens = torch.randint(0, 50, (4, 8))
        # 3 warm-up steps, fp32's uncounted set-up step, then at least Trial.rounds timed steps in
        # each mode (a recurrent model is never decided early); where other work shares the cores
        # the steps' noise can keep it measuring, up to Trial.max_rounds, and no further
        plan = None
        for _ in range(3 + 1 + 2 * Trial.max_rounds):
            optimizer.zero_grad()
            F.cross_entropy(model(tokens).reshape(-1, 50), tokens.reshape(-1)).backward()
            optimizer.step()
            plan = training.plans[model]
            if plan.trial is None:
                break
        dtypes = [dtype for _, dtype in probe.seen]
        assert dtypes[:4] == [torch.bfloat16] * 3 + [torch.float32]
        timed = dtypes[4:]
        assert timed == ([torch.float32, torch.bfloat16] * Trial.max_rounds)[: len(timed)]
        assert Trial.rounds <= timed.count(torch.bfloat16) <= Trial.max_rounds
        assert plan.trial is None, "still measuring after Trial.max_rounds steps in each mode"
        # decided, and it says so: kept (measured faster) or off (measured slower, or not clearly
        # faster than the steps' noise: fp32, stock's dtype)
        assert plan.bf16_measured.startswith("kept: measured" if plan.amp_dtype else "off: ")
        assert any(note.startswith("bf16 autocast") for note in plan.notes)
        optimizer.zero_grad()
        model(tokens).sum().backward()
        expected = torch.float32 if plan.amp_dtype is None else torch.bfloat16
        assert probe.seen[-1][1] == expected  # the decision holds from then on


@pytest.mark.parametrize("given", [{"bf16": True}, {"compile": "default"}])
def test_bf16_is_not_measured_where_the_user_chose_it_or_under_compile(given):
    """An explicit bf16=True is honoured as asked (and a seed reproduces the run); under
    compile=, flipping autocast would recompile the graph."""
    if given.get("bf16") and not cpu.host_facts().native_bf16:
        pytest.skip("torch's oneDNN has no bf16 LSTM kernel on a CPU without native bf16")
    with nanopatch.patched(ipex=False, **given):
        model = Recurrent()
        optimizer = torch.optim.Adam(model.parameters())
        optimizer.zero_grad()
        model(torch.randint(0, 50, (4, 8))).sum().backward()
        optimizer.step()
        plan = training.plans[model]
        assert plan.trial is None and plan.describe()["bf16_measured"] is None


BF16, FP32 = (True, True), (False, True)  # a bf16 trial's modes: (bf16, the layout the model has)


@pytest.mark.parametrize(
    ("bf16_ms", "fp32_ms", "kept", "counted"),
    [(10, 20, True, 2), (20, 10, False, 2), (10.4, 10, False, 4), (9.9, 10, True, 4), (8.5, 10, True, 4)],
)
def test_the_trials_decision(bf16_ms, fp32_ms, kept, counted):
    """bf16 stays only where it was not slower than fp32; a clear-cut answer (bf16 below 0.8x
    fp32, or fp32 below 0.8x bf16) comes after 2 timings of each mode instead of 4."""
    from nanopatch.targets.training.plan import Plan, Trial

    plan = Plan(name="M", amp_dtype=torch.bfloat16)
    plan.trial = trial = Trial()
    now, modes = 0.0, []
    while plan.trial is not None:
        modes.append(trial.bf16)
        now += (bf16_ms if trial.bf16 else fp32_ms) / 1e3 * (3 if len(modes) == 4 else 1)  # fp32's set-up step
        trial.on_step(plan, now)
    assert (plan.amp_dtype is not None) is kept
    assert plan.bf16_measured.startswith("kept: " if kept else "off: ") and plan.describe()["bf16_measured"]
    assert trial.times[BF16] == pytest.approx([bf16_ms / 1e3] * counted)
    assert trial.times[FP32] == pytest.approx([fp32_ms / 1e3] * counted)  # the slow set-up step is not counted
    assert modes == [True] * 3 + [False] + [False, True] * counted


def test_a_data_parallel_trial_decides_from_the_slowest_ranks_times():
    """Under DDP every rank's step time goes through ``agree`` (the slowest rank's, an
    all-reduce) at every step the trial times, the set-up steps included, so that every rank
    calls it equally often and records the same times: here this rank's own steps say bf16 is
    faster, the slowest rank's say it is not, and the trial keeps fp32 with the agreed figures."""
    from nanopatch.targets.training.plan import Plan, Trial

    asked = []

    def slowest(seconds):  # the other rank: bf16 20 ms, fp32 10 ms
        asked.append(seconds)
        return max(seconds, 0.020 if seconds < 0.0095 else 0.010)

    plan = Plan(name="M", amp_dtype=torch.bfloat16)
    plan.trial = trial = Trial(agree=slowest)
    now, steps = 0.0, 0
    while plan.trial is not None:
        now += 0.009 if trial.bf16 else 0.0098  # this rank: bf16 9 ms, fp32 9.8 ms
        trial.on_step(plan, now)
        steps += 1
    assert plan.amp_dtype is None and plan.bf16_measured.startswith("off: measured slower than fp32")
    assert "bf16 20.0 ms, fp32 10.0 ms" in plan.bf16_measured
    assert trial.times[BF16] == pytest.approx([0.020, 0.020]) and trial.times[FP32] == pytest.approx([0.010, 0.010])
    assert len(asked) == steps - trial.warmup - 1  # every step after the warm-up, counted or not


@pytest.mark.parametrize(
    ("bf16_ms", "fp32_ms", "kept", "counted"),
    [
        ((9.0, 11.0, 11.0), (10.0, 10.0, 10.2), False, 8),  # 10% apart at the fastest, 11-22% noise: never clear
        ((9.0, 9.1, 9.2), (10.0, 10.1, 10.2), True, 4),  # 10% apart, 1% noise: clear at the usual count
        ((10.5, 10.6, 10.7), (10.0, 10.1, 10.0), False, 4),
    ],
)
def test_the_trial_measures_until_the_difference_clears_the_noise(bf16_ms, fp32_ms, kept, counted):
    """Noisy steps (other work on the cores) keep the trial going, up to 8 timings of each mode;
    a difference that never clears their noise keeps fp32, stock's dtype."""
    from nanopatch.targets.training.plan import Plan, Trial

    plan = Plan(name="M", amp_dtype=torch.bfloat16)
    plan.trial = trial = Trial(early=None)
    now, seen = 0.0, {True: 0, False: 0}
    while plan.trial is not None:
        mode = trial.bf16
        series = bf16_ms if mode else fp32_ms
        now += series[seen[mode] % len(series)] / 1e3
        if trial.steps > trial.warmup and trial.mode in trial.seen:
            seen[mode] += 1
        trial.on_step(plan, now)
    assert (plan.amp_dtype is not None) is kept
    assert min(len(v) for v in trial.times.values()) == counted
    if counted == 8:
        assert plan.bf16_measured.startswith("off: not measured clearly faster than fp32")


def test_a_first_training_call_that_raises_raises_the_users_error_and_the_next_one_is_accelerated():
    """torch runs always-call forward hooks while handling a forward's exception by iterating
    its global hook dict itself: the search removes no hook there (it would turn the user's
    error into "OrderedDict mutated during iteration")."""

    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.fail = True

        def forward(self, x):
            if self.fail:
                raise ValueError("the user's own error")
            return self.linear(x)

    from torch.nn.modules import module as module_mod

    hooks_before = len(module_mod._global_forward_hooks)
    with nanopatch.patched(bf16=True):
        model = Flaky()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ValueError, match="the user's own error"):
            model(torch.randn(2, 8))
        model.fail = False
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(2, 8)).float().sum().backward()
            optimizer.step()
        [plan] = [p for p in nanopatch.status()["targets"]["training"]["details"] if p["model"] == "Flaky"]
        assert plan["computed_in"] == "bfloat16" and plan["training_calls"] >= 1
    assert len(module_mod._global_forward_hooks) == hooks_before


def test_training_inside_an_except_block_is_observed_as_anywhere_else():
    """An exception some outer frame handles (a retry after an error, say) is not the
    forward's own: the calls are observed and the search's hooks go as soon as they are done."""
    from torch.nn.modules import module as module_mod

    class Plain(nn.Sequential):
        pass

    class Handled(nn.Sequential):
        pass

    def train(model, steps=3):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(2, 8)).float().sum().backward()
            optimizer.step()
        return len(module_mod._global_forward_hooks)

    hooks_before = len(module_mod._global_forward_hooks)
    with nanopatch.patched(bf16=True):
        models = [Plain(nn.Linear(8, 8)), Handled(nn.Linear(8, 8))]  # alive while status() is read
        hooks = {"Plain": train(models[0])}
        try:
            raise KeyError("handled by the script")
        except KeyError:
            hooks["Handled"] = train(models[1])
        details = nanopatch.status()["targets"]["training"]["details"]
        plans = {p["model"]: p for p in details if p["model"] in hooks}
    assert hooks == {"Plain": hooks_before, "Handled": hooks_before}
    assert plans["Handled"]["training_calls"] == plans["Plain"]["training_calls"] == 3
    assert plans["Handled"]["computed_in"] == plans["Plain"]["computed_in"]


COMPILED_SCRIPT = """
    import sys, warnings
    import torch, nanopatch

    warnings.simplefilter("ignore", UserWarning)  # torch: compile with global module hooks

    def train(compile):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
        optimizer = torch.optim.AdamW(layer.parameters())
        compiled = torch.compile(layer) if compile else layer
        x = torch.randn(2, 8, 32)
        for _ in range(2):
            optimizer.zero_grad()
            compiled(x).float().pow(2).mean().backward()
            optimizer.step()
        return sorted(name for name, p in layer.named_parameters() if p.grad is not None)

    with nanopatch.unpatched():
        stock = train(compile=False)
    with nanopatch.patched(bf16=True, ipex=False):
        patched = train(compile=True)
        [plan] = nanopatch.status()["targets"]["training"]["details"]
    print(plan["computed_in"], len(stock), patched == stock, "intel_extension_for_pytorch" in sys.modules)
"""


def test_a_model_the_user_compiled_trains_and_is_accelerated():
    """``torch.compile(model)`` by the user, while an optimizer waits for its model: the
    discovery hooks are not traced into the graph (dynamo failed on them), and the compiled
    module is paired, computes in bf16 and its parameters all get gradients, as the stock eager
    model's do (one compile, not two: Inductor's C++ build is most of this test's time). In a
    process of its own: where IPEX 2.8 has been imported, a compiled model gets no gradients,
    stock too."""
    from conftest import run_python

    proc = run_python(COMPILED_SCRIPT, check=True, timeout=300)
    assert proc.stdout.split()[-4:] == ["bfloat16", "12", "True", "False"], proc.stdout + proc.stderr[-2000:]
