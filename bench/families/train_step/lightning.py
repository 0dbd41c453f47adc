"""The Lightning variants' worker: the same job trained by a Lightning Trainer (bf16-mixed)."""

from __future__ import annotations

import time
from typing import Any

import harness as h

from families.train_step.inside import attach_probe, compute_dtype, detach_first_layer, observed, probe_result
from families.train_step.models import Job
from families.train_step.profiling import Profiling
from families.train_step.variants import LIGHTNING_PRECISION
from families.train_step.worker import MAX_TRIAL_STEPS, Channel, Sample, apply_patch, setup_reply


def lightning_serve(channel: Channel, request: dict[str, Any]) -> None:
    """The worker of a Lightning variant. ``Trainer.fit`` runs once, in this main thread as in a
    script, over a DataLoader that yields the job's one synthetic batch for ever; a callback's
    ``on_train_batch_end`` is where the worker answers the parent and waits for its next request.
    A ``run`` of N steps is timed from that hook (once the request is read) to the same hook N
    batches later: N whole iterations of Lightning's loop (batch fetch and transfer, hooks, the
    precision plugin's autocast, the closure with ``training_step``, ``zero_grad`` and
    ``backward``, ``optimizer.step``)."""
    started = time.perf_counter()
    import lightning as L
    import torch

    apply_patch(request["patch"])  # before the model and optimizer are built
    imported = time.perf_counter()
    job = Job(request["model"], request["shape"], optimizer=False)
    if request.get("broken"):
        detach_first_layer(job.model)
    learning = h.Learning(request["learn"], [job.model])

    class Module(L.LightningModule):
        """The script's model, loss and optimizer, as a Lightning user writes them."""

        def __init__(self) -> None:
            super().__init__()
            self.model = job.model
            self.last: tuple[Any, Any] | None = None

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            output = self.model(*inputs) if isinstance(inputs, (tuple, list)) else self.model(inputs)
            loss = job.loss(output, targets)
            self.last = (output, loss)  # for the probe: what the step returned (no extra work)
            return loss

        def configure_optimizers(self):
            return job.make_optimizer(self.parameters())

    class OneBatch(torch.utils.data.IterableDataset):
        """The job's batch, again and again (as every other variant trains on it)."""

        def __iter__(self):
            while True:
                yield job.inputs, job.targets

    class Driver(L.Callback):
        """The learning steps, warm-up, the probes, and the parent's requests, from the end of each
        training batch."""

        def __init__(self) -> None:
            self.learning_s: list[float] = []
            self.warmup_s: list[float] = []
            self.mark = 0.0
            self.built = 0.0
            self.probe: h.Probe | None = None
            self.dtype: str | None = None
            self.pending: Sample | Profiling | None = None
            self.remaining = self.first_step = 0
            self.setup_answered = self.exited = False

        def on_train_start(self, trainer, pl_module) -> None:
            self.built = self.mark = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            loss = outputs["loss"]
            if not self.setup_answered and self.probe is None:  # recording the learning steps, then warming up
                loss.item()
                now = time.perf_counter()
                took, self.mark = now - self.mark, now
                if len(self.learning_s) < request["learn"]:
                    self.learning_s.append(took)
                    learning.after_step()
                    if len(self.learning_s) == request["learn"]:
                        learning.stop()
                    return
                self.warmup_s.append(took)
                if len(self.warmup_s) < request["warmup"] or (h.measuring() and len(self.warmup_s) < MAX_TRIAL_STEPS):
                    return
                # the probes: one extra forward pass in the precision plugin's context, as
                # training_step runs, then a hook inside the model during the next batch
                self.dtype = compute_dtype(job.model, job.inputs, trainer.precision_plugin.forward_context())
                self.probe = attach_probe(job.model)
                return
            if self.probe is not None:  # the probed batch
                loss.item()
                self.probe.detach()
                assert module.last is not None
                facts = observed(job, self.dtype, *module.last)
                facts["probe"] = probe_result(self.probe)
                self.probe = None
                times = {
                    "import_s": imported - started,
                    "build_s": self.built - imported,
                    "learning_step_s": self.learning_s,
                    "warmup_step_s": self.warmup_s,
                }
                reply = setup_reply(request, job, facts, **times)
                reply["learning"] = learning.record
                reply["lightning"] = {
                    "version": L.__version__,
                    "precision": str(trainer.precision),
                    "precision_plugin": type(trainer.precision_plugin).__name__,
                    "strategy": type(trainer.strategy).__name__,
                    # Lightning's autocast re-casts the weights at every use (by-hand's caches them per step)
                    "autocast_cache": getattr(
                        trainer.precision_plugin.autocast_context_manager(), "_cache_enabled", None
                    ),
                }
                channel.answer(reply)
                self.setup_answered = True
            else:
                self.remaining -= 1
                if self.remaining > 0:
                    return
                assert self.pending is not None
                reply = self.pending.finish(loss)
                reply["optimizer_steps"] = trainer.global_step - self.first_step  # Lightning's own count
                channel.answer(reply)
                self.pending = None
            self.next_request(trainer)

        def next_request(self, trainer) -> None:
            ask = channel.next()
            if ask["cmd"] == "exit":
                trainer.should_stop = self.exited = True
                return
            self.remaining = ask["steps"]
            self.first_step = trainer.global_step
            self.pending = Sample() if ask["cmd"] == "run" else Profiling(ask["steps"])

    module = Module()
    driver = Driver()
    trainer = L.Trainer(
        precision=LIGHTNING_PRECISION,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,  # one endless epoch, until the parent says exit
        num_sanity_val_steps=0,
        callbacks=[driver],
    )
    loader = torch.utils.data.DataLoader(OneBatch(), batch_size=None)
    learning.start()  # the optimizer is built inside fit, by configure_optimizers
    try:
        trainer.fit(module, loader)
    finally:
        learning.stop()
    if not driver.exited:
        raise RuntimeError(f"Trainer.fit returned before the parent said exit (global step {trainer.global_step})")
