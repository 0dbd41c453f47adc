"""Attention with dropout in bf16 products (nanopatch.targets.training.attention): the same attention as
torch's math path for the same mask, stock wherever it does not apply, gone after unpatch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nanopatch
from nanopatch.targets.training import attention, dropout


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


def _inputs(shape, keys=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    *batch, length, width = shape
    keys = length if keys is None else keys
    q = torch.randn(*batch, length, width, generator=g)
    k = torch.randn(*batch, keys, width, generator=g)
    v = torch.randn(*batch, keys, width, generator=g)
    return [t.requires_grad_() for t in (q, k, v)]


def _masks(batch, length, keys):
    """The masks scripts pass: a boolean key-padding mask with one query row that sees no key
    (stock's math path gives that row zeros), and an additive float mask."""
    padding = torch.ones(*batch[:1], 1, 1, keys, dtype=torch.bool)
    padding[..., keys // 2 :] = False
    rows = torch.ones(length, keys, dtype=torch.bool)
    rows[1] = False
    additive = torch.randn(length, keys) * 2
    return {"padding": padding & rows, "additive": additive}


def _reference(q, k, v, attn_mask, is_causal, keep, p):
    """The math path in float64, with the attention weights' keep mask ``keep``."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    length, keys = scores.shape[-2:]
    if is_causal:
        attn_mask = torch.ones(length, keys, dtype=torch.bool).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        additive = attn_mask.to(torch.bfloat16).double()  # autocast hands the mask over in bf16
        hidden = additive == float("-inf")  # as a fill, not a sum: no NaN gradient through a hidden row
        scores = (scores + additive.masked_fill(hidden, 0.0)).masked_fill(hidden, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)  # a row with no key: zeros, as stock's
    return (weights * keep.view(weights.shape) / (1 - p)) @ v


CASES = [
    ("causal", (2, 4, 48, 16), None),
    ("none", (2, 4, 48, 16), None),
    ("padding", (2, 4, 48, 16), None),
    ("additive", (2, 4, 48, 16), None),
    ("causal", (6, 40, 32), 56),  # three dimensions, more keys than queries
]


@pytest.mark.parametrize(("mask", "shape", "keys"), CASES)
def test_dropout_attention_is_the_math_paths_attention_for_the_same_mask(mask, shape, keys):
    p = 0.3
    q, k, v = _inputs(shape, keys)
    batch, length, keys = shape[:-2], shape[-2], k.shape[-2]
    attn_mask = _masks(batch, length, keys).get(mask)
    is_causal = mask == "causal"
    with nanopatch.patched(bf16=True, ipex=False):
        torch.manual_seed(5)
        with dropout.region() as region, torch.autocast("cpu", dtype=torch.bfloat16):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=p, is_causal=is_causal)
        assert region.fast, "the attention did not take nanopatch's path"
        torch.manual_seed(5)
        keep = dropout.keep_mask((torch.Size(batch).numel(), length, keys), 1 - p)
    assert out.dtype == torch.bfloat16 and out.shape == (*batch, length, v.shape[-1]) and out.is_contiguous()
    gradient = torch.randn(out.shape)
    grads = torch.autograd.grad(out, (q, k, v), gradient.to(out.dtype))
    reference = _reference(q, k, v, attn_mask, is_causal, keep, p)
    expected = torch.autograd.grad(reference, (q, k, v), gradient.double())
    assert_as_reference(out, grads, reference, expected)


@pytest.mark.parametrize(
    ("mask", "hides_a_row"),
    [
        ("padding", True),
        ("padding, every row sees a key", False),
        ("additive", False),
        ("additive, a row of -inf", True),
    ],
)
def test_the_safe_softmax_runs_only_where_the_mask_hides_a_whole_row(mask, hides_a_row):
    """Stock's math path zeroes a row of scores that is -inf throughout with its safe softmax
    (three more passes over the scores, one more in the backward); only a mask that hides every
    key from some query can make one, so the others take the plain softmax: the same values."""
    p, shape = 0.3, (2, 4, 48, 16)
    q, k, v = _inputs(shape)
    batch, length, keys = shape[:-2], shape[-2], shape[-2]
    masks = _masks(batch, length, keys)
    attn_mask = {
        "padding": masks["padding"],
        "padding, every row sees a key": masks["padding"] | torch.eye(length, keys, dtype=torch.bool),
        "additive": masks["additive"],
        "additive, a row of -inf": masks["additive"].index_fill(0, torch.tensor([3]), float("-inf")),
    }[mask]
    with nanopatch.patched(bf16=True, ipex=False):
        torch.manual_seed(5)
        with torch.profiler.profile() as prof:
            with dropout.region() as region, torch.autocast("cpu", dtype=torch.bfloat16):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=p)
            gradient = torch.randn(out.shape)
            grads = torch.autograd.grad(out, (q, k, v), gradient.to(out.dtype))
        assert region.fast, "the attention did not take nanopatch's path"
        torch.manual_seed(5)
        keep = dropout.keep_mask((torch.Size(batch).numel(), length, keys), 1 - p)
    ran = {event.name for event in prof.events()}
    assert ("aten::_safe_softmax" in ran) is hides_a_row, sorted(n for n in ran if "softmax" in n)
    reference = _reference(q, k, v, attn_mask, False, keep, p)
    if hides_a_row:
        assert not reference.isnan().any() and not out.isnan().any()
    expected = torch.autograd.grad(reference, (q, k, v), gradient.double())
    assert_as_reference(out, grads, reference, expected)


def assert_as_reference(out, grads, reference, expected):
    """``out`` and the gradients of q, k and v against the float64 reference's, within bf16's
    error."""
    torch.testing.assert_close(out.double(), reference, rtol=0.05, atol=0.05)
    for name, got, want in zip("qkv", grads, expected, strict=True):
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= 0.04 * scale, f"d{name}"


def _stock_call(args, kwargs, region=True, seed=3):
    """The call under bf16 autocast, from one seed, in a mask region (as inside a paired
    model's training forward) or not."""
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if not region:
            return F.scaled_dot_product_attention(*args, **kwargs)
        with dropout.region():
            return F.scaled_dot_product_attention(*args, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dropout_p": 0.0, "is_causal": True},  # no dropout: the fused kernel, stock's own
        {"dropout_p": 0.2, "enable_gqa": True},  # grouped keys
        {"dropout_p": 0.2, "is_causal": True, "float64": True},  # autocast leaves float64 as it is
    ],
)
def test_calls_it_does_not_take_are_autocasts_own(kwargs):
    kwargs = dict(kwargs)
    dtype = torch.float64 if kwargs.pop("float64", False) else torch.float32
    q, k, v = (t.detach().to(dtype) for t in _inputs((2, 4, 8, 16)))
    if kwargs.get("enable_gqa"):
        k, v = k[:, :2], v[:, :2]
    stock = _stock_call((q, k, v), kwargs)
    with nanopatch.patched(bf16=True, ipex=False):
        patched = _stock_call((q, k, v), kwargs)
    assert patched.dtype == stock.dtype
    torch.testing.assert_close(patched, stock, rtol=0, atol=0)


def test_a_bad_call_raises_what_stock_raises():
    q, k, v = (t.detach() for t in _inputs((2, 4, 8, 16)))
    mask = torch.zeros(8, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="attn_mask dtype") as stock:
        _stock_call((q, k, v, mask), {"dropout_p": 0.2})
    with nanopatch.patched(bf16=True, ipex=False), pytest.raises(RuntimeError) as patched:
        _stock_call((q, k, v, mask), {"dropout_p": 0.2})
    assert str(patched.value) == str(stock.value)


def test_outside_a_training_forward_the_attention_and_its_dropout_are_stocks():
    q, k, v = (t.detach() for t in _inputs((2, 4, 32, 16)))
    kwargs = {"dropout_p": 0.3, "is_causal": True}
    stock = _stock_call((q, k, v), kwargs, region=False)
    with nanopatch.patched(bf16=True, ipex=False):
        assert attention._installed
        patched = _stock_call((q, k, v), kwargs, region=False)
    torch.testing.assert_close(patched, stock, rtol=0, atol=0)


def test_unpatch_gives_autocast_its_own_kernel_back():
    q, k, v = (t.detach() for t in _inputs((2, 4, 32, 16)))
    kwargs = {"dropout_p": 0.3, "is_causal": True}
    before = _stock_call((q, k, v), kwargs)
    with nanopatch.patched(bf16=True, ipex=False):
        during = _stock_call((q, k, v), kwargs)
    assert not attention._installed
    after = _stock_call((q, k, v), kwargs)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert not torch.equal(during, before)  # it did take nanopatch's path while patched


def test_fast_dropout_off_leaves_attention_stock():
    q, k, v = (t.detach() for t in _inputs((2, 4, 32, 16)))
    kwargs = {"dropout_p": 0.3, "is_causal": True}
    stock = _stock_call((q, k, v), kwargs)
    with nanopatch.patched(bf16=True, ipex=False, fast_dropout=False):
        assert not attention._installed
        patched = _stock_call((q, k, v), kwargs)
    torch.testing.assert_close(patched, stock, rtol=0, atol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_multihead_self_attentions_projection_gives_stocks_tensors_and_gradients(bias):
    """The packed in-projection of self-attention, patched: the same query, key and value, and
    the same gradients, to the bit (``unbind`` instead of three slices of one tensor)."""
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(32, 4, bias=bias, batch_first=True)
    x = torch.randn(3, 10, 32, requires_grad=True)

    def run():
        module.zero_grad()
        x.grad = None
        out, _ = module(x, x, x, need_weights=False)
        out.pow(2).sum().backward()
        return [out.detach(), x.grad, *(p.grad for p in module.parameters())]

    stock = run()
    with nanopatch.patched(bf16=False, ipex=False, channels_last=False, fast_dropout=False):
        assert isinstance(F._in_projection_packed.__wrapped__, type(lambda: None))
        patched = run()
        q = torch.randn(5, 2, 32)
        shared = F._in_projection_packed(q, q, q, module.in_proj_weight, module.in_proj_bias)
        assert isinstance(shared, tuple) and all(t.is_contiguous() for t in shared)
    for got, want in zip(patched, stock, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not hasattr(F._in_projection_packed, "__wrapped__")  # unpatched


@pytest.mark.parametrize("bias", [True, False])
def test_an_accelerated_batch_first_projection_runs_in_the_layers_own_layout(monkeypatch, bias):
    """Inside an accelerated model's forward under nanopatch's bf16 autocast,
    ``nn.MultiheadAttention(batch_first=True)``'s self-attention is projected from its input as
    the layer got it, (batch, sequence): one product with the bias folded in, instead of a
    product over the transposed view and a separate add of the bias. Output and gradients are
    those of stock under bf16 autocast within bf16 rounding (the bias folded into the product is
    rounded once, not twice); without a bias there is nothing to fold, and the projection is
    stock's. Outside an accelerated forward (a script's own autocast) it is stock's to the bit."""

    class SelfAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(64, 4, bias=bias, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    model = SelfAttention()
    x = torch.randn(4, 24, 64)
    shapes = []
    real = F.linear

    def linear(t, weight, *rest):
        if weight is model.mha.in_proj_weight:
            shapes.append((tuple(t.shape), t.is_contiguous()))
        return real(t, weight, *rest)

    monkeypatch.setattr(F, "linear", linear)

    def step(optimizer=None, autocast=True):
        model.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = model(x)
        out.float().pow(2).sum().backward()
        if optimizer is not None:
            optimizer.step()
        return [out.detach().float(), *(p.grad.clone() for p in model.parameters())]

    stock = step()
    with nanopatch.patched(bf16=True, ipex=False, channels_last=False, fast_dropout=False):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # pairs the model; lr 0: weights unchanged
        step(optimizer, autocast=False)  # the first call, before the pairing
        shapes.clear()
        patched = step(autocast=False)  # nanopatch's own autocast
        accelerated = list(shapes)
        shapes.clear()
        with torch.autocast("cpu", torch.bfloat16):  # a script's own autocast, outside a paired model
            xt = x.transpose(0, 1)
            own = F._in_projection_packed(xt, xt, xt, model.mha.in_proj_weight, model.mha.in_proj_bias)
        outside = list(shapes)
    with torch.autocast("cpu", torch.bfloat16):
        stock_own = F._in_projection_packed(xt, xt, xt, model.mha.in_proj_weight, model.mha.in_proj_bias)
    assert outside == [((24, 4, 64), False)]
    for got, want in zip(own, stock_own, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert accelerated == [((4, 24, 64), True) if bias else ((24, 4, 64), False)], accelerated
    for got, want in zip(patched, stock, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7 * scale)


def test_registering_the_kernels_says_nothing_to_the_user():
    """Replacing autocast's own kernels is nanopatch's business: torch's one-time warning about
    overriding a kernel (a UserWarning on torch < 2.13) is not shown."""
    from conftest import run_python

    code = """
        import warnings
        warnings.simplefilter("always")
        import torch, nanopatch
        nanopatch.patch_torch()
        print("patched")
    """
    proc = run_python(code, check=True)
    assert proc.stdout.strip().endswith("patched")
    assert "Overriding a previously registered kernel" not in proc.stderr, proc.stderr
