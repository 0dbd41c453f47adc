"""working_weights' two variants of train_step's by-hand step: bf16 autocast, and the prototype that
keeps bf16 working copies of the weights; their runs and first steps.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import harness as h

from families.train_step import models as ts

VARIANTS = ("autocast", "working-weights")


class Prototype:
    """One variant's model, optimizer and step."""

    def __init__(self, model: str, shape: dict[str, int], working_weights: bool) -> None:
        import torch
        from torch import nn

        self.job = ts.Job(model, shape, by_hand=True)
        self.pairs: list[tuple[Any, str, Any, Any]] = []
        if working_weights:
            for module in self.job.model.modules():
                if isinstance(module, nn.Embedding):
                    continue
                for name, weight in module._parameters.items():
                    if weight is None or weight.dim() < 2:
                        continue
                    copy = weight.detach().to(torch.bfloat16).requires_grad_()
                    copy.register_post_accumulate_grad_hook(self._to_master(weight))
                    self.pairs.append((module, name, weight, copy))

    @staticmethod
    def _to_master(weight):
        def hook(copy) -> None:
            grad = copy.grad.float()
            if weight.grad is None:
                weight.grad = grad
            else:
                weight.grad.add_(grad)
            copy.grad = None

        return hook

    def step(self) -> float:
        import torch

        from nanopatch.targets.training import dropout

        job = self.job
        job.optimizer.zero_grad(set_to_none=True)
        inputs = job.inputs
        if inputs.dim() == 4:  # each batch converted, as in bench/train_step.py's by-hand step
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for module, name, _, copy in self.pairs:
                module._parameters[name] = copy
            try:
                with dropout.region():  # fast masks, as in a model nanopatch accelerates
                    output = job.model(inputs)
            finally:
                for module, name, weight, _ in self.pairs:
                    module._parameters[name] = weight
            loss = job.criterion(output.reshape(-1, output.shape[-1]), job.targets.reshape(-1))
        loss.backward()
        job.optimizer.step()
        if self.pairs:
            with torch.no_grad():
                torch._foreach_copy_([c for *_, c in self.pairs], [w for _, _, w, _ in self.pairs])
        return loss.item()


def learning_steps(proto: Prototype, steps: int) -> list[dict[str, Any]]:
    """The prototype's first ``steps`` steps from the seed, recorded for the learning check."""
    import torch

    torch.manual_seed(ts.SEED)  # both variants draw the same dropout masks
    with h.Learning(steps, [proto.job.model]).start() as learning:
        for _ in range(steps):
            proto.step()
            learning.after_step()
    return learning.record


def run(args) -> dict[str, Any]:
    from nanopatch.runtime import malloc
    from nanopatch.targets.training import dropout

    done, what = malloc.keep_freed_memory()
    h.log(what if done else f"malloc left as it is: {what}")
    if not dropout.install():  # the fast mask kernel, as patch_torch() registers it (it says why not)
        h.log("fast dropout masks off: torch cannot register the mask kernel")
    rows = []
    for model in args.models:
        shape = ts.SHAPES[args.quick]
        protos, records = {}, {}
        for variant in VARIANTS:
            protos[variant] = Prototype(model, shape, variant == "working-weights")
            records[variant] = learning_steps(protos[variant], args.learning_steps)
        for proto in protos.values():
            for _ in range(args.warmup):
                proto.step()
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for index in range(args.rounds):
            for variant in h.rotated(VARIANTS, index):
                proto = protos[variant]
                start = time.perf_counter()
                for _ in range(args.steps):
                    proto.step()
                rates[variant].append(args.steps * proto.job.samples_per_step / (time.perf_counter() - start))
        base = statistics.median(rates["autocast"])
        for variant in VARIANTS:
            rate = statistics.median(rates[variant])
            r = h.row(
                "working_weights",
                model,
                variant,
                rate,
                ts.unit(model),
                rate / base,
                stock=variant == "autocast",
                rates=rates[variant],
                weights_in_bf16=len(protos[variant].pairs),
            )
            rows.append(h.learning_row(r, records[variant], records["autocast"], "autocast"))
        del protos
    return {
        "bench": "working_weights",
        "machine": h.machine_facts("torch"),
        "malloc": what,
        "fast_dropout": dropout.installed(),
        "fast_masks_drawn": getattr(dropout.local, "drawn", 0),  # this (the timing) thread's
        "learning_steps": args.learning_steps,
        "rows": rows,
    }
