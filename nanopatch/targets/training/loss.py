"""Cross-entropy over a large vocabulary inside an accelerated model's training forward, in
cache-sized chunks.

A language model that computes its loss in its own forward (Hugging Face's ``ForCausalLMLoss``,
under nanopatch's bf16 autocast) calls ``cross_entropy`` on fp32 logits of batch x vocabulary.
Stock writes the whole ``log_softmax`` (as large as the logits) and reads it back for the loss;
its backward fills a zero tensor of that size, scatters the targets into it, and reads both
again in ``log_softmax``'s backward: five passes over memory for every row.

While the patch is on, nanopatch registers a kernel for ``aten::cross_entropy_loss`` at the
``AutocastCPU`` dispatch key. Inside nanopatch's autocast in a training forward, an eligible
call (2-D logits with at least :data:`MIN_CLASSES` classes, class-index targets, no class
weights, no label smoothing, mean or sum reduction) runs torch's fused ``log_softmax`` kernel a
few rows at a time while they are in cache, keeps only each row's value at its target, and
writes the gradient in one chunked pass in backward (torch's ``softmax`` kernel, then
``softmax - one_hot``, scaled, zero on ignored rows). The loss is stock's fp32 arithmetic row by
row (the mean over rows summed in another order). A model that hands ``cross_entropy`` its bf16
logits directly (nanoGPT's ``F.cross_entropy(logits.view(-1, V), targets.view(-1))``), which
autocast would copy to fp32 whole, has them read into fp32 a chunk at a time instead: the same
fp32 loss, and their gradient the fp32 one rounded once into bf16, as the cast's backward gives
it. Every other call, and every call while torch.compile traces, gets autocast's own kernel:
lower-precision floating inputs cast to fp32, then the operator.

Hugging Face's causal language models (``LOSS_MAPPING["ForCausalLM"]``: GPT-2, Llama, Mistral,
Qwen, Phi, ...) first copy their bf16 logits to fp32 (``logits.float()``), the largest tensor of
the step (GPT-2 small, 4 x 256 tokens: 206 MB), and the copy's backward casts the fp32 gradient
back to bf16: two passes over it each way beyond the loss's own. While a model of transformers is
accelerated in bf16, that entry of the mapping is :func:`causal_lm_loss`'s wrapper: inside the
model's training forward, on bf16 (or fp16) logits that need a gradient, it computes the same
loss from the bf16 logits directly (:class:`ChunkedCrossEntropy` reads each chunk into an fp32
buffer), labels shifted as transformers shifts them, and writes the gradient in bf16, the fp32
one rounded once, as the cast's backward gives it: the same loss (fp32, sums in another order)
and the same gradient, without the fp32 copy. Only where transformers' own function was checked
to compute the same loss and gradient (once per function, on a small vocabulary); every other
call (fp32 logits, extra arguments other than the flags models pass on, outside a training
forward, while torch.compile traces) is transformers' own. The mapping gets its function back at unpatch.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from nanopatch.foundation import learning
from nanopatch.foundation.log import log_once

from . import amp, dropout
from .plan import compiling, context, local, tls

_aten = torch.ops.aten
#: the lower-precision dtypes whose logits are read into fp32 a chunk at a time
LOWER = (torch.bfloat16, torch.float16)
#: fewer classes than this: stock's kernels (the logits of a row fit in cache anyway)
MIN_CLASSES = 4096
#: a chunk holds at least this many logits (4 MiB of fp32) and this many per intra-op thread
#: (512 KiB: in a core's L2 cache): each chunk is a few kernel calls, whose start-up a smaller
#: chunk pays too often (one row of GPT-2's 50257 classes a chunk ran 2.6x slower than 20 rows)
CHUNK_ELEMENTS = 1 << 20
THREAD_ELEMENTS = 1 << 17
_installed: list[Any] = []  # the journal's entry while the kernel is registered


def _rows(classes: int) -> int:
    return max(1, max(CHUNK_ELEMENTS, THREAD_ELEMENTS * torch.get_num_threads()) // classes)


class ChunkedCrossEntropy(torch.autograd.Function):
    """Cross-entropy of 2-D logits over class indices, a few rows at a time. Each chunk goes
    through torch's own fused kernels while it is in cache: ``log_softmax`` in the forward (the
    loss is its value at the target, the arithmetic of stock's ``cross_entropy``, row by row),
    ``softmax`` in the backward (the gradient is ``softmax - one_hot``, scaled, zero on ignored
    rows). Lower-precision logits (bf16 from a model's head) are read a chunk at a time into an
    fp32 buffer: the loss is the same fp32 arithmetic as on their fp32 copy, and the gradient (in
    the logits' dtype) is the fp32 one rounded once, as a cast's backward would give it. The
    loss is in ``loss_dtype`` (the logits' dtype when None)."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        target: torch.Tensor,
        ignore_index: int,
        mean: bool,
        loss_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        rows, classes = logits.shape
        step = _rows(classes)
        buffer = _buffer(logits, step)
        log_probs = buffer[1] if buffer is not None else torch.empty(min(step, rows), classes, dtype=torch.float32)
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        picked = torch.empty(rows, 1, dtype=torch.float32)
        for start in range(0, rows, step):
            part = logits[start : start + step]
            size = part.shape[0]
            if buffer is not None:
                part = buffer[0][:size].copy_(part)
            _aten._log_softmax.out(part, 1, False, out=log_probs[:size])
            torch.gather(log_probs[:size], 1, safe[start : start + step].unsqueeze(1), out=picked[start : start + step])
        total = torch.where(valid, picked.squeeze(1), 0.0).sum().neg()
        count = valid.sum()
        ctx.save_for_backward(logits, safe, valid)
        ctx.mean, ctx.count = mean, count
        return (total / count if mean else total).to(loss_dtype or logits.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        logits, safe, valid = ctx.saved_tensors
        rows, classes = logits.shape
        step = _rows(classes)
        buffer = _buffer(logits, step)
        scale = grad.float() / ctx.count if ctx.mean else grad.float()
        weights = torch.where(valid, scale, 0.0)  # per row: the loss's gradient, 0 where ignored
        out = torch.empty_like(logits)  # the logits' layout, as autograd expects
        for start in range(0, rows, step):
            chunk = slice(start, start + step)
            if buffer is None:  # contiguous fp32: the softmax written straight into the gradient
                part = _aten._softmax.out(logits[chunk], 1, False, out=out[chunk])
            else:  # in fp32, one-hot included, then rounded once into the gradient
                size = out[chunk].shape[0]
                source = buffer[0][:size].copy_(logits[chunk])
                part = _aten._softmax.out(source, 1, False, out=buffer[1][:size])
            part.mul_(weights[chunk].unsqueeze(1))
            part.scatter_add_(1, safe[chunk].unsqueeze(1), -weights[chunk].unsqueeze(1))
            if buffer is not None:
                out[chunk].copy_(part)
        return out, None, None, None, None


def _buffer(logits: torch.Tensor, step: int) -> torch.Tensor | None:
    """Two contiguous fp32 chunks for lower-precision or strided logits (None for contiguous
    fp32 ones: they are used in place, and their gradient written straight into place)."""
    if logits.dtype == torch.float32 and logits.is_contiguous():
        return None
    return torch.empty(2, min(step, logits.shape[0]), logits.shape[1], dtype=torch.float32)


def eligible(logits: Any, target: Any, weight: Any, reduction: int, label_smoothing: float) -> bool:
    return (
        type(logits) is torch.Tensor
        and type(target) is torch.Tensor
        and weight is None
        and reduction in (1, 2)
        and label_smoothing == 0.0
        and logits.device.type == "cpu"
        and logits.dtype in (torch.float32, *LOWER)
        and logits.dim() == 2
        and logits.shape[1] >= MIN_CLASSES
        and logits.requires_grad
        and target.dtype == torch.int64
        and target.shape == logits.shape[:1]
        and target.device.type == "cpu"
    )


def _kernel(
    keyset: Any,
    logits: Any,
    target: Any,
    weight: Any = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    if (
        getattr(local, "ours", 0) > 0
        and torch.is_grad_enabled()
        and not compiling()  # the chunk loop would be unrolled into torch.compile's graph
        and eligible(logits, target, weight, reduction, label_smoothing)
    ):
        # bf16 logits as they are (no fp32 copy of them all): each chunk is read into fp32, the
        # loss is fp32 and their gradient the fp32 one rounded once, as autocast's cast gives them
        with amp.outside_autocast():
            return ChunkedCrossEntropy.apply(logits, target, ignore_index, reduction == 1, torch.float32)
    logits, weight = amp.autocast_cast(logits, torch.float32), amp.autocast_cast(weight, torch.float32)
    with amp.outside_autocast():
        return _aten.cross_entropy_loss.default(logits, target, weight, reduction, ignore_index, label_smoothing)


def install() -> bool:
    """Register the kernel while the training target is applied (an entry of the patch
    engine's journal: unregistered at unpatch, which gives autocast its own kernel back)."""
    return dropout.register(
        _installed, "cross_entropy_loss", _kernel, "AutocastCPU", "cross-entropy stays stock", "chunked cross-entropy"
    )


# --- transformers' causal-LM loss on the bf16 logits ---------------------------------------

#: where transformers keeps the loss functions its models look up at each call
LOSS_MODULE = "transformers.loss.loss_utils"
CAUSAL_LM = "ForCausalLM"
#: the parameters transformers' function must take (and ``shift_labels``, where it has it)
PARAMETERS = ("logits", "labels", "vocab_size", "num_items_in_batch", "ignore_index")
_causal: list[Any] = []  # the journal's entry while the mapping holds nanopatch's wrapper
_checked: dict[Any, bool] = {}
_lock = threading.Lock()


def install_causal_lm() -> bool:
    """Put the wrapper into transformers' ``LOSS_MAPPING`` (once; an entry of the patch
    engine's journal) where transformers is imported and its function checks out; True while it
    is there."""
    if _causal:
        return True
    mapping = getattr(sys.modules.get(LOSS_MODULE), "LOSS_MAPPING", None)
    original = mapping.get(CAUSAL_LM) if isinstance(mapping, dict) else None
    if original is None or not callable(original):
        return False
    with _lock:
        if _causal:
            return True
        signature = _signature(original)
        if signature is None or not same_loss(original, signature):
            log_once(
                "causal-lm-loss",
                "transformers' %s loss is not the one nanopatch knows: it keeps copying the logits to fp32",
                CAUSAL_LM,
                level=logging.INFO,
            )
            return False
        ours = causal_lm_loss(original, signature)
        mapping[CAUSAL_LM] = ours

        def remove() -> None:
            _causal.clear()
            if mapping.get(CAUSAL_LM) is ours:
                mapping[CAUSAL_LM] = original

        _causal.append(context().on_undo(remove, f"transformers' LOSS_MAPPING[{CAUSAL_LM!r}]: the loss on bf16 logits"))
    return True


def _signature(function: Any) -> inspect.Signature | None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    return signature if all(name in signature.parameters for name in PARAMETERS) else None


def causal_lm_loss(original: Any, signature: inspect.Signature) -> Any:
    """transformers' causal-LM loss ``original``, computed from lower-precision logits directly
    where :func:`_on_logits` takes the call."""

    @functools.wraps(original)
    def loss(*args: Any, **kwargs: Any) -> Any:
        if not compiling() and tls("ours", 0) > 0 and torch.is_grad_enabled():
            value = _on_logits(signature, args, kwargs)
            if value is not None:
                local.logit_losses = tls("logit_losses", 0) + 1
                return value
        return original(*args, **kwargs)

    return loss


def _on_logits(signature: inspect.Signature, args: tuple, kwargs: dict, classes: int = MIN_CLASSES) -> Any:
    """The loss of an eligible call, computed on its logits as they are; None for any other."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    given = dict(bound.arguments)
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extra = given.pop(parameter.name, None) or {}
            if any(value is not None and type(value) not in (bool, int) for value in extra.values()):
                return None  # arguments nanopatch does not know what they would do
        elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            if given.pop(parameter.name, None):
                return None
    logits, labels, vocab = given.pop("logits"), given.pop("labels"), given.pop("vocab_size")
    items, ignore = given.pop("num_items_in_batch"), given.pop("ignore_index")
    shift = given.pop("shift_labels", None)
    if given:  # parameters of another version of transformers
        return None
    if not (
        type(logits) is torch.Tensor
        and logits.device.type == "cpu"
        and logits.dtype in LOWER
        and logits.requires_grad
        and logits.dim() >= 2
        and logits.is_contiguous()
        and type(vocab) is int
        and logits.shape[-1] == vocab >= classes
        and type(ignore) is int
        and (items is None or type(items) in (int, float) or (type(items) is torch.Tensor and items.numel() == 1))
    ):
        return None
    if shift is None:
        if not _labels(labels) or labels.shape != logits.shape[:-1]:
            return None
        shift = F.pad(labels, (0, 1), value=ignore)[..., 1:].contiguous()
    elif not _labels(shift) or not shift.is_contiguous() or shift.numel() * vocab != logits.numel():
        return None
    with amp.outside_autocast():
        value = ChunkedCrossEntropy.apply(logits.view(-1, vocab), shift.view(-1), ignore, items is None, torch.float32)
        if items is not None:
            value = value / (items.to(value.device) if type(items) is torch.Tensor else items)
    return value


def _labels(value: Any) -> bool:
    return type(value) is torch.Tensor and value.dtype == torch.int64 and value.device.type == "cpu"


def same_loss(original: Any, signature: inspect.Signature) -> bool:
    """Whether ``original`` gives :func:`_on_logits`'s loss and gradient on bf16 logits over a
    small vocabulary, with ignored labels, given shifted labels and a token count (once per
    function)."""
    found = _checked.get(original)
    if found is None:
        found = _checked[original] = _check(original, signature)
    return found


def _check(original: Any, signature: inspect.Signature) -> bool:
    g = torch.Generator().manual_seed(0)
    vocab = 40
    logits = (torch.randn(2, 6, vocab, generator=g) * 3).bfloat16()
    labels = torch.randint(0, vocab, (2, 6), generator=g)
    labels[0, 2] = labels[1, 5] = -100
    other = labels.clamp(min=3)  # 3 ignored instead of -100
    calls: list[tuple[torch.Tensor, dict[str, Any]]] = [
        (labels, {}),
        (labels, {"num_items_in_batch": torch.tensor(7)}),
        (labels, {"num_items_in_batch": 9}),
        (other, {"ignore_index": 3}),
    ]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        # the flags a model's forward passes on (peft: output_attentions=None, ...): ignored
        calls.append((labels, {"output_attentions": None, "output_hidden_states": True, "max_length_q": 5}))
    if "shift_labels" in signature.parameters:
        calls.append((labels, {"shift_labels": labels.roll(-1, 1).contiguous()}))
    try:
        # not the run's backward passes (a run's recorder must not see these losses)
        with learning.internal(), torch.autocast("cpu", enabled=False), torch.enable_grad():
            for target, extra in calls:
                theirs_in = logits.clone().requires_grad_()
                ours_in = logits.clone().requires_grad_()
                theirs = original(logits=theirs_in, labels=target, vocab_size=vocab, **extra)
                call = {"logits": ours_in, "labels": target, "vocab_size": vocab, **extra}
                ours = _on_logits(signature, (), call, classes=1)
                if type(theirs) is not torch.Tensor or ours is None or theirs.dtype != ours.dtype:
                    return False
                (their_grad,) = torch.autograd.grad(theirs * 1.5, theirs_in)
                (our_grad,) = torch.autograd.grad(ours * 1.5, ours_in)
                if not torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6) or their_grad.dtype != our_grad.dtype:
                    return False
                if not torch.allclose(our_grad.float(), their_grad.float(), rtol=1 / 128, atol=1e-6):
                    return False
    except Exception:
        return False
    return True
