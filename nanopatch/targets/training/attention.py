"""Attention with dropout inside an accelerated model's training forward, as bf16 matrix products.

On CPU, ``scaled_dot_product_attention`` takes its fused (flash) kernel only without dropout;
with ``dropout_p > 0`` (``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` in
training, Hugging Face's SDPA attention in training) it takes its math path, which computes in
fp32 even when autocast handed it bf16 inputs.

While the patch is on, nanopatch registers a kernel for ``aten::scaled_dot_product_attention``
at the ``AutocastCPU`` dispatch key, so it sees every call made under CPU autocast, from Python
or from torch's C++ operators. Inside a mask region of :mod:`.dropout` (a paired model's
training forward, and its checkpointing replays) under bf16 autocast, an eligible call with
dropout is computed as the math path computes it, in bf16 products with fp32 accumulation:
the scores by ``baddbmm`` (scale and mask folded in), the softmax (fp32 inside), the dropout
mask drawn fast as a byte mask with stock's distribution, the product with the values, and
``1 / (1 - p)`` applied to that product. Autograd differentiates these operators as it does
stock's.

While torch.compile traces a forward nanopatch compiles (``compile=``, with its fast masks:
:mod:`.compiled_masks`), the same call gets the same operators for the graph: bf16 products, the
softmax, then ``F.dropout`` (which the graph draws with nanopatch's masks and Inductor fuses with
the softmax and its backward), then the product with the values. Stock's math path there casts
query, key and value to fp32 and multiplies them in fp32: on the bench's transformer (2-core
AMX Xeon, three alternating processes each) the compiled step went from 634-726 ms to 583-662
with this alone. Every other call, and every call while a script's own torch.compile traces,
gets what autocast's own kernel does: floating inputs cast to the autocast dtype, then the
operator with autocast excluded.

``nn.MultiheadAttention``'s self-attention projects query, key and value with one packed linear
layer and hands out three slices of its output; in backward each slice's gradient becomes a
zero-filled tensor of the whole projection, and the three are added. While patched, in grad
mode, :func:`in_projection_packed` gives the same three tensors from ``unbind``, whose backward
writes the three gradients into one tensor: the same values, without the zeros and the sums.
Inside an accelerated model's forward under nanopatch's bf16 autocast, where the layer is
``batch_first`` (its input reaches the projection as a transposed view), the projection is
computed in the input's own layout, one product with the bias folded in, instead of a product
over the view and a separate bias add (the bench's transformer step about 2% faster on a 2-core
AMX Xeon); the values are then stock's within bf16 rounding, the bias added before the product
is rounded rather than after. Anywhere else (a script's own autocast) it is stock's to the bit.

Without dropout, ``scaled_dot_product_attention`` on CPU takes torch's fused (flash) kernel,
whose backward is slow in bf16: on a 2-core AMX Xeon, for a ViT's 197 tokens (batch 32, 12
heads) its forward and backward took 99 ms against 42 ms for the same attention as bf16
products, and a whole ViT-S/16 training step ran 1.29x faster with the products. For long
sequences it is the other way round (1024 tokens: the fused kernel 0.6x the products' time),
and the products keep the attention weights for the backward, where the fused kernel keeps one
number per row. So inside a mask region (a paired model's training forward), a bf16 call
without dropout whose inputs need a gradient (any mask :func:`eligible` takes, or grouped
keys and values with ``enable_gqa`` and no mask) is timed once per shape, forward and backward
on random tensors of its shapes, the fused kernel against the products (:func:`plain_pays`);
the products are used only where they took at most :data:`PLAIN_WINS_BELOW` of the kernel's
time, and the choice is kept in ``attention.json`` of nanopatch's cache folder for this torch,
CPU and thread count, so later runs on the machine make the same one. The products are the
dropout path's without the mask: the scores in bf16 (the kernel keeps them in fp32), within
bf16's rounding of stock's values. Grouped keys and values are not repeated: the query heads
that share one are stacked as rows of one product.
"""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import torch

from nanopatch.foundation import learning, records

from . import amp, compiled_masks, dropout
from .plan import compiling, local, tls

try:  # imported with torch itself; looked up once, not at every attention call
    from torch._subclasses.fake_tensor import is_fake as _is_fake
except ImportError:  # pragma: no cover - every torch nanopatch supports has it
    _is_fake = None

_aten = torch.ops.aten
_installed: list[Any] = []  # the journal's entry while the kernel is registered
_causal: dict[tuple[int, int, torch.dtype, int], torch.Tensor] = {}  # additive causal masks, by shape

#: attention without dropout goes to bf16 products only where they took at most this share of
#: the fused kernel's time (forward and backward): a clear win, so that one machine keeps one
#: choice from run to run
PLAIN_WINS_BELOW = 0.85
#: calls with more attention weights than this (over the batch and heads) keep the fused kernel:
#: the products keep the weights for the backward (bf16: 128 MiB at this many)
PLAIN_MAX_SCORES = 1 << 26
#: the timing's rounds (each: the fused kernel, then the products), and the time after which it
#: stops with the rounds it has
TIMING_ROUNDS = 3
TIMING_BUDGET_S = 3.0
#: where the choices are kept for later runs, in nanopatch's cache folder
RECORD_FILE = "attention.json"
#: shapes timed at most per process (sequences padded to each batch's longest give a new shape
#: per length): a shape after these, not on record, keeps the fused kernel untimed
MAX_TIMED = 32


def eligible(
    query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: Any, is_causal: bool, gqa: bool, traced: bool = False
) -> bool:
    """Whether a call can take the bf16 path (anything else goes to the operator unchanged).
    ``traced``: the tensors are torch.compile's stand-ins (fake or functional tensors)."""
    if gqa or not isinstance(dropout_p, float) or not dropout.drawable(dropout_p):
        return False
    return _bf16_tensors((query, key, value), traced) and _shapes_fit(
        query, key, value, attn_mask, is_causal, False, traced
    )


def _bf16_tensors(tensors: tuple, traced: bool) -> bool:
    return all(
        _tensor(t, traced) and not t.is_nested and t.device.type == "cpu" and t.dtype == torch.bfloat16 and t.dim() >= 3
        for t in tensors
    )


def _mask_fits(attn_mask: Any, scores: tuple, is_causal: bool, traced: bool) -> bool:
    """Whether the products can apply ``attn_mask`` to scores of shape ``scores``: none, or a
    bool or bf16 (additive) mask that broadcasts to them, without ``is_causal``."""
    if attn_mask is None:
        return True
    if is_causal or not _tensor(attn_mask, traced) or attn_mask.device.type != "cpu":
        return False  # stock raises for a mask with is_causal: let it
    if attn_mask.dtype not in (torch.bool, torch.bfloat16):
        return False
    try:
        return torch.broadcast_shapes(attn_mask.shape, scores) == scores
    except RuntimeError:
        return False


def plain_eligible(
    query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: Any, is_causal: bool, gqa: bool
) -> bool:
    """Whether a call without dropout can be computed as bf16 products (:func:`plain_attention`):
    bf16 inputs of which one needs a gradient, in grad mode; with ``gqa``, four dimensions, the
    query heads a multiple of the key heads, and no mask; at most :data:`PLAIN_MAX_SCORES`
    attention weights."""
    if type(dropout_p) not in (float, int) or dropout_p != 0:
        return False
    tensors = (query, key, value)
    if not _bf16_tensors(tensors, False) or not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return False
    return query.shape[:-1].numel() * key.shape[-2] <= PLAIN_MAX_SCORES and _shapes_fit(
        query, key, value, attn_mask, is_causal, gqa, False
    )


def _shapes_fit(query, key, value, attn_mask, is_causal: bool, gqa: bool, traced: bool) -> bool:
    """Whether the products can take these shapes: the same batch (with ``gqa``: four
    dimensions, the query heads a multiple of the key heads, and no mask), keys and values of
    one length, the query's width in the keys, at least :data:`dropout.MIN_ELEMENTS` attention
    weights, and a mask :func:`_mask_fits` takes."""
    width, keys = query.shape[-1], key.shape[-2]
    if key.shape[-1] != width or value.shape[-2] != keys:
        return False
    if gqa:
        if attn_mask is not None or not query.dim() == key.dim() == value.dim() == 4:
            return False
        heads, shared = query.shape[1], key.shape[1]
        if (
            shared == 0
            or heads % shared
            or value.shape[1] != shared
            or not query.shape[0] == key.shape[0] == value.shape[0]
        ):
            return False
    elif key.shape[:-2] != query.shape[:-2] or value.shape[:-2] != query.shape[:-2]:
        return False
    if query.shape[:-1].numel() * keys < dropout.MIN_ELEMENTS:
        return False
    return _mask_fits(attn_mask, (*query.shape[:-1], keys), is_causal, traced)


def _tensor(value: Any, traced: bool) -> bool:
    """A plain tensor; while a graph is traced, any tensor (torch.compile's stand-ins are
    subclasses)."""
    return isinstance(value, torch.Tensor) if traced else type(value) is torch.Tensor


def _causal_bias(length: int, keys: int, dtype: torch.dtype, traced: bool = False, groups: int = 1) -> torch.Tensor:
    """The additive mask of ``is_causal`` (query i sees keys 0..i, as torch aligns it), stacked
    ``groups`` times (the rows of query heads that share keys); built in the graph (not kept)
    while torch.compile traces."""
    found = None if traced else _causal.get((length, keys, dtype, groups))
    if found is None:
        found = torch.ones(length, keys, dtype=torch.bool).tril().logical_not()
        found = torch.zeros(length, keys, dtype=dtype).masked_fill_(found, float("-inf"))
        if groups > 1:
            found = found.repeat(groups, 1)
        if traced:
            return found
        if len(_causal) > 8:
            _causal.clear()
        _causal[(length, keys, dtype, groups)] = found
    return found


def attention(
    query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale: float | None, traced: bool = False
) -> torch.Tensor:
    """``scaled_dot_product_attention`` with dropout, in bf16 products (the module docstring).
    ``traced``: written for a graph nanopatch compiles (the dropout as ``F.dropout``, which
    :mod:`.compiled_masks` gives nanopatch's masks, for Inductor to fuse)."""
    batch, length, out_width = query.shape[:-2], query.shape[-2], value.shape[-1]
    probs, v = _weights(query, key, value, attn_mask, is_causal, scale, traced)
    if traced:
        return torch.bmm(torch.nn.functional.dropout(probs, dropout_p), v).view(*batch, length, out_width)
    keep = dropout.keep_mask(probs.shape, 1.0 - dropout_p)
    # the mask as bytes: a product with uint8 runs in vector code, with bool (or where) it does not
    out = torch.bmm(probs * keep.view(torch.uint8), v).mul_(1.0 / (1.0 - dropout_p))
    return out.view(*batch, length, out_width)


def plain_attention(
    query, key, value, attn_mask, is_causal: bool, scale: float | None, gqa: bool, hides: bool | None = None
) -> torch.Tensor:
    """``scaled_dot_product_attention`` without dropout, in bf16 products (the module docstring):
    with ``gqa``, the query heads that share a key head are rows of one product. ``hides``:
    :func:`_hides_a_row` of the mask, where the caller has it."""
    groups = query.shape[1] // key.shape[1] if gqa else 1
    probs, v = _weights(query, key, value, attn_mask, is_causal, scale, False, groups, hides)
    return torch.bmm(probs, v).view(*query.shape[:-1], value.shape[-1])


def _weights(
    query, key, value, attn_mask, is_causal: bool, scale: float | None, traced: bool, groups: int = 1, hides=None
):
    """The attention weights (softmax of the scaled, masked scores) as bf16 products, with the
    values as the product with them takes them: (n, groups * length, keys) and (n, keys, width),
    n the batch times the key heads."""
    batch, length, width = query.shape[:-2], query.shape[-2], query.shape[-1]
    keys, out_width = key.shape[-2], value.shape[-1]
    # contiguous first: the products then read them (and k transposed) without a strided copy each
    q = query.reshape(-1, groups * length, width).contiguous()
    k = key.reshape(-1, keys, width).contiguous().transpose(1, 2)
    v = value.reshape(-1, keys, out_width).contiguous()
    scale = width**-0.5 if scale is None else scale
    if attn_mask is None and not is_causal:
        bias = torch.empty(q.shape[0], groups * length, keys, dtype=query.dtype)
        scores = torch.baddbmm(bias, q, k, beta=0.0, alpha=scale)
    else:
        if attn_mask is None:
            bias = _causal_bias(length, keys, query.dtype, traced, groups).expand(q.shape[0], groups * length, keys)
        else:
            if attn_mask.dtype == torch.bool:
                fill = attn_mask.logical_not()
                bias = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill_(fill, float("-inf"))
            else:
                bias = attn_mask
            bias = bias.expand(*batch, length, keys).reshape(-1, length, keys)
        scores = torch.baddbmm(bias, q, k, alpha=scale)
    # a row of scores that is -inf throughout (a mask hiding every key from a query) would make
    # softmax NaN: stock's math path gives such a row zeros (its safe softmax: three more passes
    # over the scores and one more in the backward), and so does this, where the mask hides one
    if hides is None:
        hides = _hides_a_row(attn_mask, traced)
    probs = _aten._safe_softmax(scores, -1) if hides else torch.softmax(scores, -1)
    return probs, v


class Timing(NamedTuple):
    """The fused kernel against the products, for one shape of call: whether the products are
    used, and the best forward-and-backward times (ms; None where the timing failed)."""

    products: bool
    products_ms: float | None
    fused_ms: float | None


#: a shape past :data:`MAX_TIMED` (and a timing that failed): the fused kernel
UNTIMED = Timing(False, None, None)
#: the choice for each shape of call timed (or read from the record) in this process
_timings: dict[tuple, Timing] = {}
_timing_lock = threading.Lock()


def _signature(query, key, value, attn_mask, is_causal: bool, gqa: bool, hides: bool) -> tuple:
    mask = None
    if attn_mask is not None:
        kind = str(attn_mask.dtype).replace("torch.", "")
        mask = (kind, tuple(attn_mask.shape), hides, attn_mask.requires_grad)
    return (tuple(query.shape), tuple(key.shape), tuple(value.shape), bool(is_causal), mask, bool(gqa))


def plain_pays(query, key, value, attn_mask, is_causal: bool, scale: float | None, gqa: bool, hides: bool) -> bool:
    """Whether the products took at most :data:`PLAIN_WINS_BELOW` of the fused kernel's time for
    calls of this shape (timed once per shape on this machine, torch and thread count); ``hides``:
    :func:`_hides_a_row` of the mask."""
    signature = _signature(query, key, value, attn_mask, is_causal, gqa, hides)
    found = _timings.get(signature)
    if found is None:
        with _timing_lock:
            found = _timings.get(signature)
            if found is None:
                found = _timings[signature] = _recorded_or_timed(
                    signature, query, key, value, attn_mask, is_causal, scale
                )
    return found.products


def _recorded_or_timed(signature: tuple, query, key, value, attn_mask, is_causal: bool, scale: float | None) -> Timing:
    record_key = f"{dropout.machine_key(torch.get_num_threads())}|{signature!r}"
    record = records.read_record(record_key, RECORD_FILE)
    try:
        if type(record["products"]) is bool:  # type: ignore[index]
            return Timing(
                record["products"],  # type: ignore[index]
                dropout.optional_ms(record.get("products_ms")),  # type: ignore[union-attr]
                dropout.optional_ms(record.get("fused_ms")),  # type: ignore[union-attr]
            )
    except (TypeError, KeyError, ValueError, AttributeError):
        pass
    if sum(t.fused_ms is not None for t in _timings.values()) >= MAX_TIMED:
        return UNTIMED
    found = time_both(query, key, value, attn_mask, is_causal, scale, signature[-1])
    if found.fused_ms is not None:
        records.write_record(record_key, found._asdict(), RECORD_FILE)
    return found


def time_both(query, key, value, attn_mask, is_causal: bool, scale: float | None, gqa: bool) -> Timing:
    """The fused kernel and the products, forward and backward, on random tensors of the call's
    shapes (the call's own mask), alternately, best of :data:`TIMING_ROUNDS` each (not the run's
    backward passes); the fused kernel wherever the timing fails."""
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(t.shape, generator=generator).to(t.dtype).requires_grad_() for t in (query, key, value)]
    mask = None if attn_mask is None else attn_mask.detach().requires_grad_(attn_mask.requires_grad)
    # a learned mask (a relative position bias) gets its gradient too: torch's math path then
    # runs instead of the fused kernel, as in the run
    differentiated = [*inputs, mask] if mask is not None and mask.requires_grad else inputs

    def fused() -> None:
        out = _aten.scaled_dot_product_attention.default(*inputs, mask, 0.0, is_causal, scale=scale, enable_gqa=gqa)
        torch.autograd.grad(out, differentiated, torch.ones_like(out))

    def products() -> None:
        out = plain_attention(*inputs, mask, is_causal, scale, gqa)
        torch.autograd.grad(out, differentiated, torch.ones_like(out))

    best = {fused: float("inf"), products: float("inf")}
    try:
        # the timing's own graph: not the run's backward passes, and its saved tensors kept as they
        # are (inside activation checkpointing's forward, its hooks would take them for the replay);
        # no function mode of the call's (the first call's rescue.Rescue) costs either side time
        with (
            learning.internal(),
            torch.enable_grad(),
            amp.outside_autocast(),
            _own_saved_tensors(),
            torch._C.DisableTorchFunction(),
        ):
            start = time.perf_counter()
            fused()
            products()  # first use: the kernels' set-up, fresh memory
            for _ in range(TIMING_ROUNDS):
                for run in (fused, products):
                    began = time.perf_counter()
                    run()
                    best[run] = min(best[run], time.perf_counter() - began)
                if time.perf_counter() - start > TIMING_BUDGET_S:
                    break
    except Exception:  # the call itself then goes to the operator, which says what is wrong
        return UNTIMED
    ours, theirs = best[products], best[fused]
    return Timing(ours <= PLAIN_WINS_BELOW * theirs, round(ours * 1e3, 3), round(theirs * 1e3, 3))


def _own_saved_tensors() -> Any:
    return torch.autograd.graph.saved_tensors_hooks(_as_is, _as_is)


def _as_is(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def timings() -> list[str]:
    """The shapes of attention without dropout timed in this process, with the choice made."""
    lines, untimed = [], 0
    for (query, _key, _value, causal, mask, gqa), found in list(_timings.items()):
        if found.fused_ms is None:
            untimed += 1
            continue
        what = ", causal" if causal else f", {'learned ' if mask[3] else ''}{mask[0]} mask" if mask is not None else ""
        what += ", grouped keys" if gqa else ""
        chosen = "bf16 products" if found.products else "torch's fused kernel"
        lines.append(
            f"query {list(query)}{what}: {chosen} (products {found.products_ms:.1f} ms, "
            f"fused kernel {found.fused_ms:.1f} ms, forward and backward)"
        )
    if untimed:
        lines.append(
            f"{untimed} more shape{'s' if untimed != 1 else ''} not timed (past {MAX_TIMED} timed, or the "
            "timing failed): torch's fused kernel"
        )
    return lines


def _hides_a_row(attn_mask: Any, traced: bool) -> bool:
    """Whether ``attn_mask`` (as :func:`eligible` took it) hides every key from some query: a
    bool mask with a row of False, an additive one with a row of -inf; a causal row always sees
    its first key. While a graph is traced the values are unknown: True."""
    if attn_mask is None:
        return False
    if traced:
        return True
    if attn_mask.dtype == torch.bool:
        return not bool(attn_mask.any(-1).all())
    return bool((attn_mask == float("-inf")).all(-1).any())


def _kernel(
    keyset: Any,
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    dtype = amp.current_dtype()
    query, key, value, attn_mask = (amp.autocast_cast(t, dtype) for t in (query, key, value, attn_mask))
    with amp.outside_autocast():
        if compiling() or _fake(query):  # a graph being traced: stock's operators to fuse, but in bf16
            if (
                compiled_masks.ours()
                and dtype == torch.bfloat16
                and eligible(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, traced=True)
            ):
                return attention(query, key, value, attn_mask, dropout_p, is_causal, scale, traced=True)
        elif dropout.in_region() and dtype == torch.bfloat16:
            if not dropout.disabled[0] and eligible(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
                dropout.note_drawn()
                return attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
            if plain_eligible(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
                hides = _hides_a_row(attn_mask, False)
                if plain_pays(query, key, value, attn_mask, is_causal, scale, enable_gqa, hides):
                    local.attention_products = tls("attention_products", 0) + 1
                    return plain_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa, hides)
        return _aten.scaled_dot_product_attention.default(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )


def _fake(tensor: Any) -> bool:
    """Whether ``tensor`` is torch.compile's stand-in: AOTAutograd traces the graph's operators
    with fake tensors, and on torch 2.8 ``torch.compiler.is_compiling()`` is False there."""
    return _is_fake is not None and isinstance(tensor, torch.Tensor) and _is_fake(tensor)


def in_projection_packed(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.nn.functional._in_projection_packed`` for self-attention in grad mode (the module
    docstring); anything else is the stock function's."""
    q, k, v, *rest = args
    if q is k and k is v and not kwargs and torch.is_grad_enabled() and type(q) is torch.Tensor and not q.is_nested:
        width = q.size(-1)
        if len(rest) == 2 and rest[1] is not None and _batch_first_view(q) and tls("ours", 0) > 0:
            # the layer's own (batch, sequence) layout: one product with the bias folded in
            projected = torch.nn.functional.linear(q.transpose(0, 1), *rest).transpose(0, 1)
        else:
            projected = torch.nn.functional.linear(q, *rest)
        return tuple(part.contiguous() for part in projected.unflatten(-1, (3, width)).unbind(-2))
    return wrapped(*args, **kwargs)


def _batch_first_view(q: torch.Tensor) -> bool:
    """Whether ``q`` is (sequence, batch, width) as a transposed view of a contiguous (batch,
    sequence, width) tensor: what ``nn.MultiheadAttention(batch_first=True)`` hands on."""
    return (
        q.dim() == 3 and q.size(0) > 1 and q.size(1) > 1 and not q.is_contiguous() and q.transpose(0, 1).is_contiguous()
    )


def install() -> bool:
    """Register the kernel while the training target is applied (an entry of the patch
    engine's journal: unregistered at unpatch, which gives autocast its own kernel back)."""
    return dropout.register(
        _installed,
        "scaled_dot_product_attention",
        _kernel,
        "AutocastCPU",
        "attention with dropout stays stock",
        "bf16 dropout attention",
        undo=_causal.clear,
    )
