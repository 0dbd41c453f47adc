"""The ``lightning`` patch targets: under ``python -m nanopatch --nproc N``, a Lightning
``Trainer`` trains with Lightning's own DDP strategy over nanopatch's processes.

The processes ``--nproc`` starts carry torchrun's environment, which Lightning reads
(``TorchElasticEnvironment``), and nanopatch has initialised the process group already,
which Lightning's DDP strategy takes as it is. Left to its defaults, though, a Trainer on a
CPU picks one device and a single-device strategy: every process would train on its own and
write its own checkpoints and log versions. So a Trainer built in such a process without an
explicit ``strategy``/``devices``/``num_nodes`` gets ``strategy="ddp"``, ``devices`` = the
processes on this node and ``num_nodes`` = the nodes. From there Lightning runs the job as it
runs any DDP job: its DistributedDataParallel, its DistributedSampler, checkpoints and logs
from rank 0, and no learning-rate scaling (nanopatch's auto-LR is for scripts that know
nothing of distributed training; a Lightning script is left to Lightning's semantics).

Applied to ``lightning`` and to ``pytorch_lightning``, whichever the script imports; only in
data-parallel processes (option ``data_parallel``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from nanopatch import engine
from nanopatch.engine import versions

from . import patch as distributed

logger = logging.getLogger("nanopatch")

#: target name -> the module that defines the Trainer it patches
TRAINERS = {
    "lightning": "lightning.pytorch.trainer.trainer",
    "pytorch_lightning": "pytorch_lightning.trainer.trainer",
}

_DEFAULTS = {"strategy": "auto", "devices": "auto", "num_nodes": 1}


def trainer_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Trainer keywords for this process's share of a ``--nproc`` job: the script's own
    where it set them, Lightning's DDP over nanopatch's processes where it left defaults."""
    world = distributed.world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    chosen = {name: kwargs.get(name, default) for name, default in _DEFAULTS.items()}
    if any(chosen[name] != default for name, default in _DEFAULTS.items()):
        return kwargs  # the script chose its own layout: Lightning checks it against torchrun's
    return {**kwargs, "strategy": "ddp", "devices": local, "num_nodes": max(1, world // max(1, local))}


def _trainer_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if distributed.active() and distributed.world_size() > 1 and not args:
        try:
            new = trainer_options(kwargs)
        except Exception:
            logger.exception("nanopatch could not set the Trainer up for data-parallel; it is built as written")
            new = kwargs
        if new is not kwargs:
            logger.info(
                "Lightning Trainer: strategy='ddp', devices=%s, num_nodes=%s over nanopatch's processes",
                new["devices"],
                new["num_nodes"],
            )
            kwargs = new
    return wrapped(*args, **kwargs)


class LightningTrainer(engine.Target):
    """Lightning's ``Trainer`` over nanopatch's processes (registered once per Lightning package,
    named as :data:`TRAINERS` names it)."""

    supported = versions.supported("torch")

    def patch(self, ctx: engine.Context) -> None:
        module = sys.modules.get(TRAINERS[ctx.name])
        if module is None:
            return
        ctx.wrap(module.Trainer, "__init__", _trainer_init)
