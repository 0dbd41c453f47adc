"""bf16 working weights against bf16 autocast's per-forward weight casts, side by side.

The question this answers: does keeping a bf16 copy of each weight between optimizer steps
(the forward and backward use the copy; gradients reach the fp32 weight in fp32; the copy is
re-cast once after each step, as IPEX's split-bf16 optimizer and apex's O2 master weights do)
make a training step faster than autocast, which casts every fp32 weight in every forward?

Both variants run the step of bench/train_step.py's ``by-hand`` variant (bf16 autocast,
channels-last for image models) in one process, on the same model built from the same seed,
with nanopatch's fast dropout masks and with glibc keeping freed memory (both as
``patch_torch()`` has them), so the only difference is the weights:

* ``autocast``: fp32 weights, cast by autocast in every forward;
* ``working-weights``: the weights of every layer autocast would cast (all parameters of two or
  more dimensions but embeddings') are bf16 leaf tensors put in the modules' parameters for the
  forward, their gradients added to the fp32 weights' ``.grad`` in fp32 by a post-accumulate
  hook; after ``optimizer.step()`` one ``torch._foreach_copy_`` writes the new bf16 copies.

A prototype for measurement: it is not in nanopatch. Before its rounds, each variant records its
first ``--learning-steps`` steps from the seed (``nanopatch.learning.Recorder``), judged against
``autocast``'s with ``nanopatch.learning.compare``: one that does not learn as autocast does gets
no rate. Rounds alternate the variants, the order rotated each round. Prints a Markdown table
(``--json PATH`` for rows in bench/'s schema).

    PYTHONPATH=. python bench/working_weights.py [--models transformer,resnet18] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

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

        from nanopatch.training import dropout

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
    from nanopatch import _malloc
    from nanopatch.training import dropout

    done, what = _malloc.keep_freed_memory()
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


def print_table(report: dict[str, Any]) -> None:
    print("| model | variant | rate | spread | x autocast | bf16 weight copies |")
    print("|---|---|---|---|---|---|")
    for r in report["rows"]:
        if r["rate"] is None:  # does not learn as autocast does: no rate, the verdict instead
            print(f"| {r['group']} | {r['variant']} | {h.DOES_NOT_LEARN} |  |  | {r['weights_in_bf16']} |")
            continue
        low, high = r["spread"]
        print(
            f"| {r['group']} | {r['variant']} | {r['rate']:.1f} {r['unit']} | {low:.1f}-{high:.1f} "
            f"| {r['ratio_to_stock']:.3f}x | {r['weights_in_bf16']} |"
        )
    print(f"\nLearning: {h.first_steps(report['learning_steps'])} of each variant from the seed:\n")
    for r in report["rows"]:
        print(f"- {r['group']}, {h.learning_line(r)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="transformer,resnet18", help="of " + ", ".join(ts.MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--learning-steps",
        type=int,
        help=f"steps each variant records from the seed, judged against autocast's for the learning check "
        f"(default {h.LEARNING_STEPS[False]}; {h.LEARNING_STEPS[True]} with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="the small shapes of train_step.py --quick")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.learning_steps is None:
        args.learning_steps = h.LEARNING_STEPS[args.quick]
    args.models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(args.models) - set(ts.MODELS) - set(ts.HIDDEN_MODELS))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    return h.finish(run(args), args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
