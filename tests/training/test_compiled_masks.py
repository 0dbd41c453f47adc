"""Dropout masks in the graphs nanopatch compiles (``compile=``) come from nanopatch's fast
masks (an operator of its own in the graph), not Inductor's per-element Philox draws: the
masks' distribution, forward and backward agreeing, two dropouts of one tensor drawing two
masks, a script's own ``torch.compile`` left to Inductor, and the decomposition tables restored
exactly at unpatch. Each test compiles once (tens of seconds on two cores)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_fast_paths import marker_task, train_transformer
from torch import nn

import nanopatch
from nanopatch.targets.training import compiled_masks, dropout
from nanopatch.targets.training import patch as training

from conftest import AUTO_COMPUTE

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "compile") or not torch._dynamo.is_dynamo_supported(), reason="no torch.compile here"
)
aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    torch._dynamo.reset()
    yield
    nanopatch.unpatch_torch()
    torch._dynamo.reset()


class TwoDrops(nn.Module):
    """Two dropouts of one tensor (their masks must differ) and one of another."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(128, 128)

    def forward(self, x):
        h = self.linear(x)
        return F.dropout(h, 0.25, True), F.dropout(h, 0.25, True), F.dropout(x * 2, 0.5, True)


def _tables():
    from torch._inductor import decomposition

    return [decomposition.fast_random_decomps(), decomposition.decompositions]


def test_compiled_dropout_draws_nanopatchs_masks_and_the_backward_uses_them(monkeypatch):
    before = [table.get(aten.native_dropout.default) for table in _tables()]
    drawn = []
    real = dropout.keep_mask
    monkeypatch.setattr(
        dropout, "keep_mask", lambda shape, p, g=None: drawn.append((tuple(shape), p)) or real(shape, p)
    )
    model = TwoDrops()
    x = torch.randn(256, 128)
    with nanopatch.patched(bf16=False, ipex=False, compile="default"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(3):  # the first step finds the model; the next ones run it compiled
            optimizer.zero_grad()
            xg = x.clone().requires_grad_(True)
            a, b, c = model(xg)
            (a.sum() + b.sum() + c.sum()).backward()
            optimizer.step()
        assert compiled_masks.installed()
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["fast_dropout"] is True and plan["compile"] not in (False, None)
    assert [table.get(aten.native_dropout.default) for table in _tables()] == before  # restored
    assert all(
        now is was for now, was in zip([t.get(aten.native_dropout.default) for t in _tables()], before, strict=True)
    )
    assert not compiled_masks.installed()
    from torch._inductor import config as inductor_config

    assert inductor_config.joint_custom_pre_pass is None  # the cache-key pass removed
    # the compiled steps drew three masks each through nanopatch's generator
    assert drawn[-3:] == [((256, 128), 0.75), ((256, 128), 0.75), ((256, 128), 0.5)]
    keep_a, keep_b, keep_c = (a != 0), (b != 0), (c != 0)
    assert abs(keep_a.float().mean().item() - 0.75) < 0.02 and abs(keep_c.float().mean().item() - 0.5) < 0.02
    assert not torch.equal(keep_a, keep_b)  # two dropouts of one tensor: two masks
    h = model.linear(x).detach()
    torch.testing.assert_close(a.detach(), torch.where(keep_a, h / 0.75, 0.0))
    # the backward multiplied by the forward's masks: d(c)/dx = 2 * mask / 0.5 on x's own path
    # (and the linear's path through a and b), so where c dropped an element, only the linear's
    expected = (keep_a.float() / 0.75 + keep_b.float() / 0.75) @ model.linear.weight + keep_c.float() * 4
    torch.testing.assert_close(xg.grad, expected, rtol=1e-4, atol=1e-4)


def test_a_joint_pass_of_the_scripts_own_leaves_the_masks_to_inductor():
    from torch._inductor import config as inductor_config

    mine = object()
    inductor_config.joint_custom_pre_pass = mine  # not monkeypatch: its undo deletes a config entry
    try:
        with nanopatch.patched(bf16=False, ipex=False, compile="default"):
            assert not compiled_masks.install()
            assert inductor_config.joint_custom_pre_pass is mine
    finally:
        inductor_config.joint_custom_pre_pass = None


def test_a_scripts_own_torch_compile_keeps_inductors_masks(monkeypatch):
    drawn = []
    monkeypatch.setattr(dropout, "keep_mask", lambda *a: drawn.append(1) or pytest.fail("ours drawn"))
    with nanopatch.patched(bf16=False, ipex=False, compile="default"):
        assert compiled_masks.install()  # as after nanopatch's first compile
        f = torch.compile(lambda x: F.dropout(x, 0.5, True))
        out = f(torch.ones(64, 64))
        assert set(out.unique().tolist()) <= {0.0, 2.0}
    assert drawn == []


def test_a_compiled_transformer_with_dropout_learns_as_stock():
    """The fast-paths test's transformer task (dropout in its attention and feed-forward),
    trained compiled by nanopatch (its masks drawn in the graph by nanopatch) against stock eager,
    in the precision nanopatch gives it on this CPU."""
    data = marker_task()
    with nanopatch.unpatched():
        stock = train_transformer(data)
    before = compiled_masks.drawn()
    with nanopatch.patched(bf16=AUTO_COMPUTE == "bfloat16", ipex=False, compile="default"):
        patched = train_transformer(data)
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["fast_dropout"] is True and plan["compile"] == "default"
        assert not any("compile failed" in note for note in plan["notes"])
        # -v's line says it ran compiled: every training call after the first (which ran
        # before the optimizer paired the model)
        [line] = training.summary()
        [calls] = [plan.seen for plan in training.plans.values()]
        assert calls.compiled_calls == calls.training_calls - 1, line
        assert f"torch.compile ({calls.compiled_calls} of its training calls), fast dropout masks" in line, line
    assert compiled_masks.drawn() > before, "no mask was drawn in the compiled graph"
    assert stock > 70, f"the task is too hard to compare on ({stock:.1f}%)"
    assert abs(patched - stock) <= 1.0 or patched > stock, f"compiled {patched:.2f}% vs stock {stock:.2f}%"


def _saved_by(step):
    """The (dtype, shape) of every tensor autograd saved for the backward during ``step()``."""
    saved = []

    def pack(tensor):
        saved.append((tensor.dtype, tuple(tensor.shape)))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = step()
    out.float().sum().backward()
    return saved


def test_the_compiled_graph_saves_byte_masks_no_bool_tensors_and_attends_in_bf16():
    """Inductor's CPU kernels read and write bool tensors an element at a time: nanopatch's
    compiled graphs keep their dropout masks as uint8 and recompute a ReLU's ``output <= 0`` in
    the backward instead of saving it; the attention's products and saved weights are bf16
    (stock's math path would cast them to fp32)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=True)
    model = nn.Sequential(nn.Linear(32, 64), layer, nn.Linear(64, 10))
    x = torch.randn(8, 128, 32)
    with nanopatch.patched(bf16=True, ipex=False, compile="default"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            optimizer.zero_grad()
            model(x).float().sum().backward()
            optimizer.step()
        saved = _saved_by(lambda: model(x))
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["compile"] == "default" and plan["fast_dropout"] is True
        assert not any("compile failed" in note for note in plan["notes"])
    dtypes = {dtype for dtype, _ in saved}
    assert torch.bool not in dtypes, saved
    weights = (8 * 4, 128, 128)  # batch x heads, queries, keys
    assert (torch.uint8, weights) in saved and (torch.uint8, (8, 128, 256)) in saved  # attention's, feed-forward's
    assert (torch.bfloat16, weights) in saved and (torch.float32, weights) not in saved


def test_a_scripts_own_compile_saves_what_it_saves_unpatched():
    def f(x):
        return F.dropout(torch.relu(x), 0.5, True) * 3

    x = torch.randn(64, 256, requires_grad=True)
    stock = _saved_by(lambda: torch.compile(f)(x))
    torch._dynamo.reset()
    with nanopatch.patched(bf16=False, ipex=False, compile="default"):
        assert compiled_masks.install()
        patched = _saved_by(lambda: torch.compile(f)(x))
    assert sorted(patched, key=str) == sorted(stock, key=str)


class Attend(nn.Module):
    """Attention over its own query, key and value (parameters, so that training finds it)."""

    def __init__(self, q, k, v, attn_mask, is_causal, p):
        super().__init__()
        self.q, self.k, self.v = (nn.Parameter(t.detach().clone()) for t in (q, k, v))
        self.attn_mask, self.is_causal, self.p = attn_mask, is_causal, p

    def forward(self, scale):
        q = self.q * scale
        return F.scaled_dot_product_attention(
            q, self.k, self.v, self.attn_mask, dropout_p=self.p, is_causal=self.is_causal
        )


@pytest.mark.parametrize("mask", ["causal", "padding", "none"])
def test_compiled_attention_with_dropout_is_the_math_paths_for_its_mask(monkeypatch, mask):
    from test_attention import _inputs, _masks, _reference, assert_as_reference

    p, shape = 0.3, (2, 4, 48, 16)
    q, k, v = _inputs(shape)
    attn_mask = _masks(shape[:-2], shape[-2], shape[-2]).get(mask)
    drawn = []
    real = compiled_masks._keep_mask

    def keep_mask(like, p, site):
        drawn.append(real(like, p, site))
        return drawn[-1]

    monkeypatch.setattr(compiled_masks, "_keep_mask", keep_mask)
    model = Attend(q, k, v, attn_mask, mask == "causal", p)
    one = torch.ones(())
    with nanopatch.patched(bf16=True, ipex=False, compile="default"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(3):
            optimizer.zero_grad()
            out = model(one)
            gradient = torch.randn(out.shape)
            (out.float() * gradient).sum().backward()
            optimizer.step()
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["compile"] == "default" and not any("compile failed" in n for n in plan["notes"])
    assert drawn and drawn[-1].dtype == torch.uint8 and drawn[-1].shape == (8, 48, 48)
    reference = _reference(q, k, v, attn_mask, mask == "causal", drawn[-1].bool(), p)
    expected = torch.autograd.grad(reference, (q, k, v), gradient.double())
    assert_as_reference(out.detach(), (model.q.grad, model.k.grad, model.v.grad), reference, expected)
