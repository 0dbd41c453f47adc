"""frameworks' timm training script: a timm model trained by a plain loop under autocast."""

from __future__ import annotations

import argparse
import os
from typing import Any

import harness as h

from families.frameworks.kit import Clock, image_loader, param_checksum, process_facts
from families.frameworks.variants import CLASSES, SEED


def _create(timm: Any, name: str, args: argparse.Namespace) -> Any:
    """``name`` built for the run's image side where the model takes one (a vision transformer:
    its position table has one entry per patch); a convolutional net, which takes any side as
    it is and no ``img_size``, as it comes."""
    try:
        return timm.create_model(name, pretrained=False, num_classes=CLASSES, img_size=args.image_size)
    except TypeError:
        return timm.create_model(name, pretrained=False, num_classes=CLASSES)


def timm_worker(args: argparse.Namespace) -> dict[str, Any]:
    import timm
    import torch
    from timm.optim import create_optimizer_v2
    from timm.utils import ModelEmaV2
    from torch import nn

    torch.manual_seed(SEED)
    loader = image_loader(args)
    name = getattr(args, "timm_model", "resnet18")
    model = _create(timm, name, args)
    probe = h.Probe()
    probe.attach(model, nn.Conv2d)
    learning = h.Learning(args.learn, [model])
    clock = Clock(args, probe, learning)
    optimizer = create_optimizer_v2(model, opt="sgd", lr=0.01, momentum=0.9, weight_decay=1e-4)
    model_ema = ModelEmaV2(model, decay=0.9998)
    criterion = nn.CrossEntropyLoss()
    model.train()
    own_autocast = args.precision == "autocast"
    loss_value = None
    facts: dict[str, Any] = {}
    clock.on_done = lambda: facts.update(process_facts(model))
    learning.start()
    while not clock.done:
        for x, y in loader:
            clock.begin((x, y))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=own_autocast):
                output = model(x)
                loss = criterion(output, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model_ema.update(model)
            loss_value = loss.item()
            clock.end()
            if clock.done:
                break
    return {
        "rank": int(os.environ.get("RANK", "0")),
        "samples": clock.steps * args.batch,
        **facts,
        "loss": loss_value,
        "framework": f"timm {timm.__version__} {name}",
        "precision": "autocast" if own_autocast else None,
        "optimizer": type(optimizer).__name__,
        "loader_batches": len(loader),
        "param_checksum": param_checksum(model),
        "probe": probe.as_dict(),
        **clock.as_dict(),
    }
