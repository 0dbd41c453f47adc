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
"""

from __future__ import annotations

from typing import Any

import torch

from . import amp, compiled_masks, dropout
from .plan import compiling, tls

try:  # imported with torch itself; looked up once, not at every attention call
    from torch._subclasses.fake_tensor import is_fake as _is_fake
except ImportError:  # pragma: no cover - every torch nanopatch supports has it
    _is_fake = None

_aten = torch.ops.aten
_installed: list[Any] = []  # the journal's entry while the kernel is registered
_causal: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}  # additive causal masks, by shape


def eligible(
    query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: Any, is_causal: bool, gqa: bool, traced: bool = False
) -> bool:
    """Whether a call can take the bf16 path (anything else goes to the operator unchanged).
    ``traced``: the tensors are torch.compile's stand-ins (fake or functional tensors)."""
    if gqa or not isinstance(dropout_p, float) or not dropout.drawable(dropout_p):
        return False
    tensors = (query, key, value)
    if any(not _tensor(t, traced) or t.is_nested or t.device.type != "cpu" for t in tensors):
        return False
    if any(t.dtype != torch.bfloat16 or t.dim() < 3 for t in tensors):
        return False
    batch, length, width = query.shape[:-2], query.shape[-2], query.shape[-1]
    if key.shape[:-2] != batch or value.shape[:-2] != batch or key.shape[-1] != width:
        return False
    if value.shape[-2] != key.shape[-2] or batch.numel() * length * key.shape[-2] < dropout.MIN_ELEMENTS:
        return False
    if attn_mask is None:
        return True
    if is_causal or not _tensor(attn_mask, traced) or attn_mask.device.type != "cpu":
        return False  # stock raises for a mask with is_causal: let it
    if attn_mask.dtype not in (torch.bool, torch.bfloat16):
        return False
    scores = (*batch, length, key.shape[-2])
    try:
        return torch.broadcast_shapes(attn_mask.shape, scores) == scores
    except RuntimeError:
        return False


def _tensor(value: Any, traced: bool) -> bool:
    """A plain tensor; while a graph is traced, any tensor (torch.compile's stand-ins are
    subclasses)."""
    return isinstance(value, torch.Tensor) if traced else type(value) is torch.Tensor


def _causal_bias(length: int, keys: int, dtype: torch.dtype, traced: bool = False) -> torch.Tensor:
    """The additive mask of ``is_causal`` (query i sees keys 0..i, as torch aligns it); built in
    the graph (not kept) while torch.compile traces."""
    found = None if traced else _causal.get((length, keys, dtype))
    if found is None:
        found = torch.ones(length, keys, dtype=torch.bool).tril().logical_not()
        found = torch.zeros(length, keys, dtype=dtype).masked_fill_(found, float("-inf"))
        if traced:
            return found
        if len(_causal) > 8:
            _causal.clear()
        _causal[(length, keys, dtype)] = found
    return found


def attention(
    query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale: float | None, traced: bool = False
) -> torch.Tensor:
    """``scaled_dot_product_attention`` with dropout, in bf16 products (the module docstring).
    ``traced``: written for a graph nanopatch compiles (the dropout as ``F.dropout``, which
    :mod:`.compiled_masks` gives nanopatch's masks, for Inductor to fuse)."""
    batch, length, width = query.shape[:-2], query.shape[-2], query.shape[-1]
    keys, out_width = key.shape[-2], value.shape[-1]
    # contiguous first: the products then read them (and k transposed) without a strided copy each
    q = query.reshape(-1, length, width).contiguous()
    k = key.reshape(-1, keys, width).contiguous().transpose(1, 2)
    v = value.reshape(-1, keys, out_width).contiguous()
    scale = width**-0.5 if scale is None else scale
    if attn_mask is None and not is_causal:
        bias = torch.empty(q.shape[0], length, keys, dtype=query.dtype)
        scores = torch.baddbmm(bias, q, k, beta=0.0, alpha=scale)
    else:
        if attn_mask is None:
            bias = _causal_bias(length, keys, query.dtype, traced)
        elif attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill_(attn_mask.logical_not(), float("-inf"))
        else:
            bias = attn_mask
        bias = bias.expand(*batch, length, keys).reshape(-1, length, keys)
        scores = torch.baddbmm(bias, q, k, alpha=scale)
    # a row of scores that is -inf throughout (a mask hiding every key from a query) would make
    # softmax NaN: stock's math path gives such a row zeros (its safe softmax: three more passes
    # over the scores and one more in the backward), and so does this, where the mask hides one
    probs = _aten._safe_softmax(scores, -1) if _hides_a_row(attn_mask, traced) else torch.softmax(scores, -1)
    if traced:
        return torch.bmm(torch.nn.functional.dropout(probs, dropout_p), v).view(*batch, length, out_width)
    keep = dropout.keep_mask(probs.shape, 1.0 - dropout_p)
    # the mask as bytes: a product with uint8 runs in vector code, with bool (or where) it does not
    out = torch.bmm(probs * keep.view(torch.uint8), v).mul_(1.0 / (1.0 - dropout_p))
    return out.view(*batch, length, out_width)


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
        elif (
            dropout.in_region()
            and not dropout.disabled[0]
            and dtype == torch.bfloat16
            and eligible(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        ):
            dropout.note_drawn()
            return attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
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
