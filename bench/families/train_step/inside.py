"""What a train_step worker's step really ran: the dtype and layout its first layer saw (the probe),
and its first steps recorded for the learning check.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import harness as h

from families.train_step.models import Job


def compute_dtype(model, inputs, context=None) -> str | None:
    """The dtype the first convolution or linear layer computes in (bfloat16 under autocast),
    from one extra forward pass without gradients on the eager model (a compiled model's
    ``_orig_mod``), with forward hooks that are removed at once: hooks on the compiled model
    would make torch.compile recompile. Layers are found by class name, so IPEX's replacements
    (``_IPEXConv2d``, ``_IPEXLinear``) count too. ``context``: a context manager the pass runs
    in, as the step runs its forward (bf16 autocast for ``by-hand``, the precision plugin's
    ``forward_context()`` for Lightning)."""
    import contextlib

    import torch

    model = getattr(model, "_orig_mod", model)
    seen: list[Any] = []

    def hook(module, args, output):
        if not seen and isinstance(output, torch.Tensor):
            seen.append(output.dtype)

    layers = [m for m in model.modules() if leaf_layer(m)]
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.no_grad(), context or contextlib.nullcontext():
            model(*inputs) if isinstance(inputs, tuple) else model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return str(seen[0]).replace("torch.", "") if seen else None


def observed(job: Job, compute_dtype: str | None, output, loss) -> dict[str, Any]:
    """What the step really ran, seen from outside the patch."""
    import torch

    conv = next((m for m in job.model.modules() if isinstance(m, torch.nn.Conv2d)), None)
    channels_last = None
    if conv is not None:
        weight = conv.weight
        channels_last = weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    graphs = None
    if "torch._dynamo" in sys.modules:
        try:
            from torch._dynamo.utils import counters

            graphs = int(counters["stats"]["unique_graphs"])
        except Exception:  # private API: only informative
            graphs = None
    return {
        "model_class": f"{type(job.model).__module__}.{type(job.model).__qualname__}",
        "optimizer_class": f"{type(job.optimizer).__module__}.{type(job.optimizer).__qualname__}",
        "compute_dtype": compute_dtype,
        "output_dtype": str(output.dtype).replace("torch.", ""),
        "loss_dtype": str(loss.dtype).replace("torch.", ""),
        "conv_weight_channels_last": channels_last,
        "ipex_imported": "intel_extension_for_pytorch" in sys.modules,
        "dynamo_graphs": graphs,
    }


def probed_step(job: Job) -> dict[str, Any] | None:
    """One untimed training step with a forward hook on the model's first convolution or linear
    layer (by class name, so IPEX's replacements count): the dtype it computed in and whether its
    input was channels-last, seen from inside the model. None when the step ran a compiled graph
    and the hook saw nothing: a hook added to the eager modules does not run inside it."""
    probe = attach_probe(job.model)
    try:
        job.step()[1].item()
    finally:
        probe.detach()
    return probe_result(probe)


def attach_probe(model) -> h.Probe:
    """An active :class:`harness.Probe` on the first convolution or linear layer of the eager
    ``model`` that its forward calls: not a MultiheadAttention's ``out_proj``, whose weight the
    attention uses without calling the layer (a hook there sees nothing)."""
    from torch import nn

    model = getattr(model, "_orig_mod", model)
    skipped = {id(m) for a in model.modules() if isinstance(a, nn.MultiheadAttention) for m in a.modules()}
    probe = h.Probe()
    probe.attach(model, lambda m: leaf_layer(m) and id(m) not in skipped)
    probe.active = True
    return probe


def probe_result(probe: h.Probe) -> dict[str, Any] | None:
    if probe.calls == 0 and "torch._dynamo" in sys.modules:
        return None
    return probe.as_dict()


def leaf_layer(module) -> bool:
    name = type(module).__name__
    return ("Conv" in name or "Linear" in name) and next(module.children(), None) is None


def detach_first_layer(model) -> None:
    """The ``broken`` variant's cut: a forward hook that detaches the output of the first
    convolution or linear layer, so no gradient reaches it (nor anything before it)."""
    layer = next(m for m in model.modules() if leaf_layer(m))
    layer.register_forward_hook(lambda module, args, output: output.detach())


def learning_steps(job: Job, steps: int) -> tuple[list[dict[str, Any]], list[float]]:
    """The first ``steps`` training steps of the job from its seed, recorded for the learning
    check (:class:`harness.Learning`), and the time each took."""
    learning = h.Learning(steps, [job.model]).start()
    took = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            job.step()[1].item()
            took.append(time.perf_counter() - start)
            learning.after_step()
    finally:
        learning.stop()
    return learning.record, took
