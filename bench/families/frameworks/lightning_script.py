"""frameworks' Lightning training script: a ResNet trained by a Lightning Trainer (one process, DDP,
or nanopatch's trainer).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import harness as h

from families.frameworks.kit import Clock, image_loader, param_checksum, process_facts, total_steps, write_rank
from families.frameworks.variants import CLASSES, SEED


def lightning_worker(args: argparse.Namespace) -> None:
    import lightning as L
    import torch
    import torchvision
    from torch import nn

    class LitResNet(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = torchvision.models.resnet18(num_classes=CLASSES)
            self.criterion = nn.CrossEntropyLoss()

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.criterion(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    torch.manual_seed(SEED)
    loader = image_loader(args)
    module = LitResNet()
    probe = h.Probe()
    learning = h.Learning(args.learn, [module.model])  # parameters named as by the plain model
    clock = Clock(args, probe, learning)
    facts: dict[str, Any] = {}

    class StepTimer(L.Callback):
        def on_train_start(self, trainer, pl_module):
            facts["affinity_at_start"] = sorted(os.sched_getaffinity(0))  # as this rank starts training

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            clock.begin(batch)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if clock.seen + 1 == clock.warmup + clock.steps and isinstance(outputs, dict) and "loss" in outputs:
                facts["loss"] = float(outputs["loss"])
            clock.end()

        def on_train_end(self, trainer, pl_module):
            # in the process that trained: with num_processes=N, a rank the Trainer forked, whose
            # results the script's process after fit does not see
            rank = trainer.global_rank if trainer.world_size > 1 else int(os.environ.get("RANK", "0"))
            write_rank(
                args,
                {
                    "rank": rank,
                    "samples": clock.steps * args.batch,
                    **facts,
                    "framework": f"lightning {L.__version__}",
                    "strategy": type(trainer.strategy).__name__,
                    "precision": str(trainer.precision),
                    "trainer_world_size": trainer.world_size,
                    "param_checksum": param_checksum(module),
                    "probe": probe.as_dict(),
                    **clock.as_dict(),
                },
            )

    probe.attach(module.model, nn.Conv2d)
    extra: dict[str, Any] = {"devices": 2, "strategy": "ddp"} if args.script == "lightning-ddp" else {}
    if args.precision:
        extra["precision"] = args.precision
    Trainer = L.Trainer
    if args.script == "lightning-nano":  # the BigDL-Nano user's one changed import
        from nanopatch.lightning import Trainer

        extra.update(num_processes=args.nano_processes, precision="bf16", channels_last=True)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=total_steps(args),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StepTimer()],
        **extra,
    )
    clock.on_done = lambda: facts.update(process_facts(module), loader_batches=len(trainer.train_dataloader))
    with learning.start():
        trainer.fit(module, loader)
    return None  # each process that trained wrote its result (on_train_end)
