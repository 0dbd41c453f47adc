"""Dropout masks in the graphs nanopatch compiles (``compile=``) are nanopatch's fast masks
(hashed inside the kernels from keys an operator of its own draws, or drawn by that operator),
not Inductor's per-element Philox draws: the masks' distribution, forward and backward agreeing,
two dropouts of one tensor drawing two masks, a script's own ``torch.compile`` left to Inductor,
and the decomposition tables restored exactly at unpatch. Each test compiles once (tens of
seconds on two cores)."""

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


def _record_keys(monkeypatch):
    """The keys nanopatch::mask_key gives the compiled graphs, in order."""
    keys = []
    real = compiled_masks._mask_key
    monkeypatch.setattr(compiled_masks, "_mask_key", lambda like, site: keys.append(real(like, site)) or keys[-1])
    return keys


def _train_two_drops(model, x, steps=3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(steps):  # the first step finds the model; the next ones run it compiled
        optimizer.zero_grad()
        xg = x.clone().requires_grad_(True)
        a, b, c = model(xg)
        (a.sum() + b.sum() + c.sum()).backward()
        optimizer.step()
    return xg, a, b, c


def _assert_masks_used(model, x, xg, a, b, c, masks):
    """The outputs are the inputs through ``masks`` (scaled), and the backward multiplied by the
    same masks: d(c)/dx = 2 * mask / 0.5 on x's own path, and the linear's path through a and b."""
    keep_a, keep_b, keep_c = masks
    assert torch.equal(keep_a, a != 0) and torch.equal(keep_b, b != 0) and torch.equal(keep_c, c != 0)
    assert abs(keep_a.float().mean().item() - 0.75) < 0.02 and abs(keep_c.float().mean().item() - 0.5) < 0.02
    assert not torch.equal(keep_a, keep_b)  # two dropouts of one tensor: two masks
    h = model.linear(x).detach()
    torch.testing.assert_close(a.detach(), torch.where(keep_a, h / 0.75, 0.0))
    expected = (keep_a.float() / 0.75 + keep_b.float() / 0.75) @ model.linear.weight + keep_c.float() * 4
    torch.testing.assert_close(xg.grad, expected, rtol=1e-4, atol=1e-4)


def test_compiled_dropout_hashes_nanopatchs_masks_in_its_kernels_and_the_backward_hashes_the_same(monkeypatch):
    before = [table.get(aten.native_dropout.default) for table in _tables()]
    keys = _record_keys(monkeypatch)
    monkeypatch.setattr(dropout, "keep_mask", lambda *a: pytest.fail("a mask drawn outside the kernels"))
    model = TwoDrops()
    x = torch.randn(256, 128)
    with nanopatch.patched(bf16=False, ipex=False, compile="default"):
        xg, a, b, c = _train_two_drops(model, x)
        assert compiled_masks.installed()
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["fast_dropout"] is True and plan["compile"] not in (False, None)
        assert plan["dropout_words"].startswith("hashed inside the compiled kernels"), plan["dropout_words"]
        [line] = training.summary()
        assert "fast dropout masks (hashed inside the compiled kernels)" in line, line
    assert [table.get(aten.native_dropout.default) for table in _tables()] == before  # restored
    assert all(
        now is was for now, was in zip([t.get(aten.native_dropout.default) for t in _tables()], before, strict=True)
    )
    assert not compiled_masks.installed()
    from torch._inductor import config as inductor_config

    assert inductor_config.joint_custom_pre_pass is None  # the cache-key pass removed
    # each compiled step keyed three masks from torch's generator; the kernels' masks are the
    # hash of those keys as torch's own int32 operators compute it, forward and backward alike
    assert len(keys) >= 3 and all(key.dtype == torch.int32 and key.shape == (2,) for key in keys)
    masks = [
        compiled_masks.hashed_keep((256, 128), p, key) for p, key in zip((0.75, 0.75, 0.5), keys[-3:], strict=True)
    ]
    _assert_masks_used(model, x, xg, a, b, c, masks)


def test_masks_too_large_for_the_index_or_turned_off_are_drawn_by_keep_mask(monkeypatch):
    drawn = []
    real = dropout.keep_mask
    monkeypatch.setattr(dropout, "keep_mask", lambda shape, p, g=None: drawn.append(real(shape, p)) or drawn[-1])
    monkeypatch.setattr(compiled_masks, "HASHED_MAX_ELEMENTS", 256 * 128)  # the 256x128 masks are too large
    model = TwoDrops()
    x = torch.randn(256, 128)
    with nanopatch.patched(bf16=False, ipex=False, compile="default"):
        xg, a, b, c = _train_two_drops(model, x)
        [line] = training.summary()
        assert "fast dropout masks" in line and "compiled kernels" not in line, line
    assert [tuple(mask.shape) for mask in drawn[-3:]] == [(256, 128)] * 3
    _assert_masks_used(model, x, xg, a, b, c, drawn[-3:])


def test_hashed_masks_have_the_distribution_of_stocks():
    """Each element kept with probability p (rounded to 1/65536), independently of its
    neighbours, of the same element under another key, and of where it sits."""
    key = torch.tensor([12345, -678], dtype=torch.int32)
    for p in (0.1, 0.5, 0.9, 1 - 1 / 1024):
        keep = compiled_masks.hashed_keep((1 << 20,), p, key)
        assert abs(keep.float().mean().item() - round(p * 65536) / 65536) < 4 * (p * (1 - p) / (1 << 20)) ** 0.5 + 1e-6
    keep = compiled_masks.hashed_keep((1024, 1024), 0.5, key).float()
    other = compiled_masks.hashed_keep((1024, 1024), 0.5, torch.tensor([12346, -678], dtype=torch.int32)).float()
    for a, b in ((keep[:, 1:], keep[:, :-1]), (keep[1:], keep[:-1]), (keep, other)):
        both = (a * b).mean().item()
        assert abs(both - 0.25) < 0.003, both  # P(both kept) = P(kept)^2: no correlation
    for part in (keep[:, ::2], keep[::512], keep[:, 1000:]):  # 4.5 standard deviations of the mean
        assert abs(part.mean().item() - 0.5) < 4.5 * (0.25 / part.numel()) ** 0.5, part.shape
    lanes = compiled_masks.hashed_lanes((1 << 16,), key)
    assert lanes.dtype == torch.int32 and lanes.min() >= -32768 and lanes.max() <= 32767
    assert lanes.unique().numel() > 0.6 * 65536  # uniform over the lanes: about 63% of values hit


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


def test_the_compiled_graph_saves_mask_keys_no_masks_and_attends_in_bf16():
    """Inductor's CPU kernels read and write bool tensors an element at a time: nanopatch's
    compiled graphs save each dropout mask's two int32 keys and hash the mask again in the
    backward's kernel, and recompute a ReLU's ``output <= 0`` there instead of saving it; the
    attention's products and saved weights are bf16 (stock's math path would cast them to fp32)."""
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
    assert torch.bool not in dtypes and torch.uint8 not in dtypes, saved
    # the keys of four masks: the attention's, its output's, the feed-forward's and its output's
    assert saved.count((torch.int32, (2,))) == 4, saved
    weights = (8 * 4, 128, 128)  # batch x heads, queries, keys
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
    keys = _record_keys(monkeypatch)
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
    assert keys
    keep = compiled_masks.hashed_keep((8, 48, 48), 1 - p, keys[-1])
    reference = _reference(q, k, v, attn_mask, mask == "causal", keep, p)
    expected = torch.autograd.grad(reference, (q, k, v), gradient.double())
    assert_as_reference(out.detach(), (model.q.grad, model.k.grad, model.v.grad), reference, expected)


def test_a_step_under_a_dispatch_mode_runs_eagerly_and_the_next_ones_compiled_again():
    """One step under ``FlopCounterMode`` (a script counting its FLOPs for an MFU figure): that
    call runs eagerly (dynamo failed to compile the frame under the mode and then skipped it for
    good: every later step ran eagerly while nanopatch said compiled), the next ones compiled."""
    from torch.utils.flop_counter import FlopCounterMode

    model = TwoDrops()
    x = torch.randn(256, 128)
    with nanopatch.patched(bf16=False, ipex=False, compile="default"):
        _train_two_drops(model, x)
        [plan] = training.plans.values()
        before, calls = compiled_masks.hashed(), plan.seen.compiled_calls
        counter = FlopCounterMode(display=False)
        with counter:
            _train_two_drops(model, x, steps=1)
        assert counter.get_total_flops() >= 3 * 2 * 256 * 128 * 128  # the linear's forward and backward
        assert compiled_masks.hashed() == before and plan.seen.compiled_calls == calls  # eager
        _train_two_drops(model, x, steps=2)
        assert compiled_masks.hashed() == before + 6 and plan.seen.compiled_calls == calls + 2  # compiled
        [line] = training.summary()
        assert "torch.compile (4 of its training calls)" in line, line
