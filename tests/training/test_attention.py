"""Attention with dropout in bf16 products (nanopatch.targets.training.attention): the same attention as
torch's math path for the same mask, stock wherever it does not apply, gone after unpatch."""

from __future__ import annotations

import json

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


# --- attention without dropout: bf16 products where they measured faster than the fused kernel ---


@pytest.fixture
def choices(monkeypatch, tmp_path):
    """A fresh table of timed choices and no records of them, with the timing replaced:
    ``choices.products`` says whether the products win; ``choices.timed`` counts the timings."""

    class Choices:
        products = True
        timed = 0

    found = Choices()

    def time_both(*args, **kwargs):
        found.timed += 1
        return attention.Timing(found.products, 1.0, 2.0) if found.products else attention.Timing(False, 2.0, 1.0)

    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(attention, "_timings", {})
    monkeypatch.setattr(attention, "time_both", time_both)
    return found


def _plain_call(q, k, v, attn_mask=None, is_causal=False, gqa=False):
    """The call as a paired model's training forward makes it: in a mask region, under bf16
    autocast; with how many calls took the products."""
    before = attention.tls("attention_products", 0)
    with dropout.region(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, enable_gqa=gqa)
    return out, attention.tls("attention_products", 0) - before


PLAIN_CASES = [
    ("causal", (2, 4, 48, 16), None, 1),
    ("none", (2, 4, 48, 16), None, 1),
    ("padding", (2, 4, 48, 16), None, 1),
    ("additive", (2, 4, 48, 16), None, 1),
    ("causal", (6, 40, 32), 56, 1),  # three dimensions, more keys than queries
    ("causal", (2, 6, 40, 16), None, 3),  # grouped keys: 6 query heads share 2 key heads
    ("none", (2, 4, 40, 16), 56, 2),
]


@pytest.mark.parametrize(("mask", "shape", "keys", "groups"), PLAIN_CASES)
def test_attention_without_dropout_as_products_is_the_math_paths_attention(choices, mask, shape, keys, groups):
    """A training call without dropout, where the products measured faster: the attention of
    the float64 math path for the same mask (grouped keys and values as ``enable_gqa`` repeats
    them), its gradients too, within bf16's error; contiguous, in bf16, as the fused kernel's."""
    q, k, v = _inputs(shape, keys)
    if groups > 1:
        k, v = (t.detach()[:, : shape[1] // groups].clone().requires_grad_() for t in (k, v))
    batch, length, keys = shape[:-2], shape[-2], k.shape[-2]
    attn_mask = _masks(batch, length, keys).get(mask)
    with nanopatch.patched(bf16=True, ipex=False):
        out, products = _plain_call(q, k, v, attn_mask, mask == "causal", gqa=groups > 1)
    assert products == 1 and choices.timed == 1, "the attention did not take the products"
    assert out.dtype == torch.bfloat16 and out.shape == (*batch, length, v.shape[-1]) and out.is_contiguous()
    gradient = torch.randn(out.shape)
    grads = torch.autograd.grad(out, (q, k, v), gradient.to(out.dtype))
    wide_k, wide_v = (t.repeat_interleave(groups, dim=1) for t in (k, v)) if groups > 1 else (k, v)
    keep = torch.ones(torch.Size(batch).numel(), length, keys)
    reference = _reference(q, wide_k, wide_v, attn_mask, mask == "causal", keep, 0.0)
    expected = torch.autograd.grad(reference, (q, k, v), gradient.double())
    assert_as_reference(out, grads, reference, expected)


def test_attention_without_dropout_keeps_the_fused_kernel_where_the_products_do_not_pay(choices):
    choices.products = False
    q, k, v = _inputs((2, 4, 48, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stock = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with nanopatch.patched(bf16=True, ipex=False):
        out, products = _plain_call(q, k, v, is_causal=True)
        again, _ = _plain_call(q, k, v, is_causal=True)
        timings = attention.timings()
    assert products == 0 and choices.timed == 1  # timed once for the shape
    torch.testing.assert_close(out, stock, rtol=0, atol=0)
    torch.testing.assert_close(again, stock, rtol=0, atol=0)
    assert timings == [
        "query [2, 4, 48, 16], causal: torch's fused kernel "
        "(products 2.0 ms, fused kernel 1.0 ms, forward and backward)"
    ]


@pytest.mark.parametrize(
    "why", ["no grad", "inputs need no grad", "outside a training forward", "too large", "dropout"]
)
def test_attention_without_dropout_stays_stocks_where_no_backward_or_no_training_forward(choices, monkeypatch, why):
    """The products pay in the backward: a call that has none (no_grad, inputs without grad), a
    call outside a paired model's training forward (no mask region), and one with more weights
    than :data:`PLAIN_MAX_SCORES` keep the fused kernel, untimed; with dropout, the call takes
    the dropout path."""
    q, k, v = _inputs((2, 4, 48, 16))
    if why == "inputs need no grad":
        q, k, v = (t.detach() for t in (q, k, v))
    if why == "too large":
        monkeypatch.setattr(attention, "PLAIN_MAX_SCORES", 2 * 4 * 48 * 48 - 1)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        stock = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with nanopatch.patched(bf16=True, ipex=False):
        before = attention.tls("attention_products", 0)
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(why != "no grad"):
            if why == "outside a training forward":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                with dropout.region() as region:
                    p = 0.25 if why == "dropout" else 0.0
                    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
                assert region.fast is (why == "dropout")
        products = attention.tls("attention_products", 0) - before
    assert products == 0 and choices.timed == 0
    if why != "dropout":
        torch.testing.assert_close(out.detach(), stock, rtol=0, atol=0)


def test_the_choice_is_timed_once_per_shape_and_kept_for_later_runs(monkeypatch, tmp_path):
    """The first call of a shape times both ways for real (forward and backward, not the run's
    backward passes) and files the choice in ``attention.json``; a later process (here: the
    table cleared) reads it back instead of timing again."""
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(attention, "_timings", {})
    q, k, v = _inputs((2, 4, 64, 16))
    with nanopatch.patched(bf16=True, ipex=False):
        _, products = _plain_call(q, k, v, is_causal=True)
        (signature, timing), *rest = attention._timings.items()
    assert not rest and timing.products_ms > 0 and timing.fused_ms > 0
    assert timing.products == (timing.products_ms <= attention.PLAIN_WINS_BELOW * timing.fused_ms)
    assert products == int(timing.products)
    assert all(t.grad is None for t in (q, k, v))  # the timing ran on tensors of its own
    kept = json.loads((tmp_path / "attention.json").read_text())
    assert [key.endswith(repr(signature)) for key in kept] == [True]
    assert next(iter(kept.values())) == timing._asdict()

    def never(*args):
        raise AssertionError("timed again")

    monkeypatch.setattr(attention, "time_both", never)
    monkeypatch.setattr(attention, "_timings", {})
    with nanopatch.patched(bf16=True, ipex=False):
        _, again = _plain_call(q, k, v, is_causal=True)
    assert again == products and attention._timings == {signature: timing}


def test_a_failed_timing_keeps_the_fused_kernel_and_files_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(attention, "_timings", {})

    def broken(*args, **kwargs):
        raise RuntimeError("no memory")

    monkeypatch.setattr(attention, "plain_attention", broken)
    q, k, v = _inputs((2, 4, 48, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stock = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with nanopatch.patched(bf16=True, ipex=False):
        out, products = _plain_call(q, k, v, is_causal=True)
    assert products == 0 and list(attention._timings.values()) == [attention.Timing(False, None, None)]
    torch.testing.assert_close(out, stock, rtol=0, atol=0)
    assert not (tmp_path / "attention.json").exists()


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_first_timing_inside_activation_checkpointing_leaves_the_checkpoint_as_it_is(
    monkeypatch, tmp_path, reentrant
):
    """The timing runs a forward and backward of its own inside the model's forward (or, with
    reentrant checkpointing, whose forward runs without grad, inside its replay in the
    backward); inside activation checkpointing, whose saved-tensor hooks would take its
    tensors, they are kept as they are: the checkpointed attention replays and gives the
    gradients of the same attention without checkpointing."""
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(attention, "_timings", {})
    q, k, v = _inputs((2, 4, 64, 16))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with nanopatch.patched(bf16=True, ipex=False):
        with dropout.region(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.utils.checkpoint.checkpoint(attend, q, k, v, use_reentrant=reentrant)
        out.float().sum().backward()  # reentrant checkpointing takes no autograd.grad
        grads = [t.grad for t in (q, k, v)]
        assert len(attention._timings) == 1
        with dropout.region(), torch.autocast("cpu", dtype=torch.bfloat16):
            plain = attend(q, k, v)
        expected = torch.autograd.grad(plain.float().sum(), (q, k, v))
    if not reentrant:  # the reentrant forward ran without grad: torch's kernel, whatever the choice
        torch.testing.assert_close(out, plain, rtol=0, atol=0)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_learned_additive_mask_gets_its_gradient_from_the_products(choices):
    """A mask that is a parameter (Swin's relative position bias, T5's): the products give it
    the gradient the float64 math path gives it, as stock's math path does."""
    q, k, v = _inputs((2, 4, 48, 16))
    bias = (torch.randn(4, 48, 48, generator=torch.Generator().manual_seed(2)) * 0.5).requires_grad_()
    with nanopatch.patched(bf16=True, ipex=False):
        out, products = _plain_call(q, k, v, bias)
    assert products == 1
    gradient = torch.randn(out.shape)
    got = torch.autograd.grad(out, (q, k, v, bias), gradient.to(out.dtype))
    reference = _reference(q, k, v, bias, False, torch.ones(8, 48, 48), 0.0)
    want = torch.autograd.grad(reference, (q, k, v, bias), gradient.double())
    assert_as_reference(out, got[:3], reference, want[:3])
    assert got[3].dtype == torch.float32
    assert (got[3].double() - want[3]).abs().max().item() <= 0.04 * want[3].abs().max().item()


def test_shapes_past_the_timed_limit_keep_the_fused_kernel_untimed(choices, monkeypatch):
    """A run whose sequences are padded to each batch's longest makes a new shape per length:
    after :data:`MAX_TIMED` timings in the process, a shape not on record keeps the fused kernel
    without being timed, and ``status()`` says how many did."""
    monkeypatch.setattr(attention, "MAX_TIMED", 1)
    with nanopatch.patched(bf16=True, ipex=False):
        taken = []
        for length in (48, 56, 64):
            q, k, v = _inputs((2, 4, length, 16))
            taken.append(_plain_call(q, k, v, is_causal=True)[1])
        lines = attention.timings()
    assert taken == [1, 0, 0] and choices.timed == 1
    assert lines[0].startswith("query [2, 4, 48, 16], causal: bf16 products")
    assert lines[1:] == ["2 more shapes not timed (past 1 timed, or the timing failed): torch's fused kernel"]
