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
weights, no label smoothing, mean or sum reduction) computes each row's log-sum-exp a few rows
at a time while they are in cache, keeps only those (one float per row), and writes the
gradient in one chunked pass in backward: ``softmax - one_hot``, scaled, zero on ignored rows.
The loss is the same fp32 arithmetic as stock's (sums in another order). Every other call, and
every call while torch.compile traces, gets autocast's own kernel: lower-precision floating
inputs cast to fp32, then the operator.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import amp, dropout
from .plan import compiling, local

_aten = torch.ops.aten
#: fewer classes than this: stock's kernels (the logits of a row fit in cache anyway)
MIN_CLASSES = 4096
#: about this many logits per chunk (1 MiB of fp32: in a core's L2 cache)
CHUNK_ELEMENTS = 1 << 18
_installed: list[Any] = []  # the journal's entry while the kernel is registered


def _rows(classes: int) -> int:
    return max(1, CHUNK_ELEMENTS // classes)


class ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int, mean: bool) -> torch.Tensor:
        rows, classes = logits.shape
        step = _rows(classes)
        lse = torch.empty(rows, dtype=torch.float32)
        for start in range(0, rows, step):
            torch.logsumexp(logits[start : start + step], 1, out=lse[start : start + step])
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1).float()
        total = torch.where(valid, lse - picked, 0.0).sum()
        count = valid.sum()
        ctx.save_for_backward(logits, lse, safe, valid)
        ctx.mean, ctx.count = mean, count
        return (total / count if mean else total).to(logits.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        logits, lse, safe, valid = ctx.saved_tensors
        rows, classes = logits.shape
        step = _rows(classes)
        scale = grad.float() / ctx.count if ctx.mean else grad.float()
        weights = torch.where(valid, scale, 0.0)  # per row: the loss's gradient, 0 where ignored
        out = torch.empty_like(logits)
        for start in range(0, rows, step):
            chunk = slice(start, start + step)
            part = out[chunk]
            torch.sub(logits[chunk], lse[chunk].unsqueeze(1), out=part)
            part.exp_().mul_(weights[chunk].unsqueeze(1).to(part.dtype))
        out.scatter_add_(1, safe.unsqueeze(1), -weights.unsqueeze(1).to(out.dtype))
        return out, None, None, None


def eligible(logits: Any, target: Any, weight: Any, reduction: int, label_smoothing: float) -> bool:
    return (
        type(logits) is torch.Tensor
        and type(target) is torch.Tensor
        and weight is None
        and reduction in (1, 2)
        and label_smoothing == 0.0
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
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
    logits, weight = amp.autocast_cast(logits, torch.float32), amp.autocast_cast(weight, torch.float32)
    with amp.outside_autocast():
        if (
            getattr(local, "ours", 0) > 0
            and torch.is_grad_enabled()
            and not compiling()  # the chunk loop would be unrolled into torch.compile's graph
            and eligible(logits, target, weight, reduction, label_smoothing)
        ):
            return ChunkedCrossEntropy.apply(logits, target, ignore_index, reduction == 1)
        return _aten.cross_entropy_loss.default(logits, target, weight, reduction, ignore_index, label_smoothing)


def install() -> bool:
    """Register the kernel while the training target is applied (an entry of the patch
    engine's journal: unregistered at unpatch, which gives autocast its own kernel back)."""
    return dropout.register(
        _installed, "cross_entropy_loss", _kernel, "AutocastCPU", "cross-entropy stays stock", "chunked cross-entropy"
    )
