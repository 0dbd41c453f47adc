"""Training throughput of real framework code: Lightning, the Hugging Face Trainer and timm, stock and under nanopatch.

Each variant runs a training script as its author would write it, unmodified, in a fresh process
(or process group), once per round, the order rotated each round. The scripts (this file run with
``--worker``; the same file and arguments for a group's variants, only the launch differs):

A. **Lightning ResNet-18**, the script a BigDL-Nano user writes: a ``LightningModule`` wrapping
   ``torchvision.models.resnet18(num_classes=10)``, ``training_step`` calling ``self.model(x)``,
   cross-entropy, ``SGD(lr 0.01, momentum 0.9)`` from ``configure_optimizers``, automatic
   optimization, a shuffling ``DataLoader`` over generated images (batch 32 at ``--image-size``,
   224 px by default) and ``Trainer(accelerator="cpu", max_steps=warmup + steps, logger=False,
   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)``:

   * ``stock``: ``python script``; ``bf16-mixed``: the same with ``precision="bf16-mixed"``;
   * ``nanopatch``: ``python -m nanopatch script``; ``nanopatch+bf16-mixed``: both;
   * ``nproc2``: ``python -m nanopatch --nproc 2 script`` (two pinned processes through torchrun);
   * ``nano-trainer``: the script with BigDL-Nano's one changed import, ``from nanopatch.lightning
     import Trainer``, and ``Trainer(precision="bf16", channels_last=True)``, run with ``python
     script`` in the environment ``eval "$(python -m nanopatch --init)"`` gives (what BigDL-Nano
     users did with ``source bigdl-nano-init``); ``nano-trainer-2``: the same with
     ``num_processes=2`` (and ``--init --no-pin-threads``, as ``--init`` advises for several
     processes).

   And the script as written for Lightning's own data parallelism, ``Trainer(devices=2,
   strategy="ddp")``: ``ddp-stock`` (``python script``; Lightning starts the second process) and
   ``ddp-nanopatch`` (``python -m nanopatch script``).
B. **Hugging Face Trainer**: ``BertForSequenceClassification`` built from a ``BertConfig`` (no
   download: 4 layers, hidden 256, 4 heads, intermediate 1024, the default vocabulary), generated
   token ids (sequence 128, batch 16, 2 labels), ``Trainer(TrainingArguments(use_cpu=True,
   max_steps=...))``: ``hf-stock`` and ``hf-nanopatch``; ``hf-bf16`` is the same script with
   ``TrainingArguments(bf16=True)`` (the Trainer's own autocast) and ``hf-bf16-nanopatch`` that
   under nanopatch. ``--hf-model gpt2``: the same four with ``GPT2LMHeadModel`` from a
   ``GPT2Config`` instead (the same layers, width and sequence, GPT-2's vocabulary of 50257,
   the labels the token ids: the causal-LM loss the model computes in its forward).
C. **timm**: ``timm.create_model("resnet18", pretrained=False, num_classes=10)``,
   ``timm.optim.create_optimizer_v2(model, "sgd", lr 0.01, momentum 0.9, weight decay 1e-4)``,
   ``timm.utils.ModelEmaV2`` updated after every step, a hand-written loop over the same generated
   images: ``timm-stock`` and ``timm-nanopatch``; ``timm-autocast`` is the loop with the user's
   own ``torch.autocast("cpu", dtype=torch.bfloat16)`` around forward and loss, and
   ``timm-autocast-nanopatch`` that under nanopatch.

What is timed: ``--steps`` training steps after ``--warmup`` untimed ones (at least 12 outside
``--quick``: nanopatch measures bf16 against fp32 on a model's first steps, up to 12 of them, and
the timed steps run what it decided), from the start of the
first timed step to the end of the last (a Lightning ``Callback``'s ``on_train_batch_start`` /
``on_train_batch_end``, a ``TrainerCallback``'s ``on_step_begin`` / ``on_step_end``, the loop's own
clock for timm): start-up, imports, data generation, model building and warm-up are outside. For
several processes, the rate is the samples of all ranks over the slowest rank's time.

What each worker reports besides its time (asked after the timed steps, or recorded by a passive
probe during them): a forward hook on the model's first convolution (the first ``nn.Linear`` for
BERT) records, for every call in the timed steps, the dtype the layer computed in and whether its
input was channels-last: the ``bf16 inside / channels-last inside`` column says whether
acceleration really happened in the model the framework trains. Also torch's threads, the CPU
affinity, the allocator mapped, the process group and whether a DistributedDataParallel exists,
Lightning's strategy and precision, a checksum of the first batch and of the parameters after the
run. The parent checks that every variant ran as it says (stock and bf16-mixed never import
nanopatch, the nanopatch variants do, ``bf16-mixed`` computed in bf16, the probe saw the timed
steps, the process count and world size, and for two processes that their parameters are equal
after the run and that they saw different data) and prints every failed check.

Each variant must learn as stock before it gets a rate: its first run (the first that ran, if
that failed) records its first ``--learning-steps`` optimizer steps from the seed before its
warm-up, with ``nanopatch.learning.Recorder`` around the framework's own loop (parameters named by
the user's model, whatever wraps it), and writes them with its result (rank 0's are judged). The
parent judges them with ``nanopatch.learning.compare`` (the test suite's definition) against its
group's stock, or for two processes against ``ddp-stock`` when it ran (data-parallel ranks see
other batches than one process). A variant that does not learn as stock is printed "does not
learn" with the verdict, and keeps no rate, ratio, target or timing in its row and runs.

``other load`` is the CPU time the rest of the machine took during a run (from ``/proc/stat``,
less this run's own processes), as a share of all CPUs, the most of any round; above 5% the report
warns that the rates are suspect.

    PYTHONPATH=. python bench/frameworks.py [--quick] [--rounds 3] [--steps 5] [--warmup 2]
        [--learning-steps 6] [--variants stock,bf16-mixed,...|lightning,ddp,hf,timm] [--image-size 224]
        [--json PATH]

``--quick``: 2 rounds of 2 steps after 1 warm-up step, 3 learning steps. See bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness as h  # bench/ is this script's folder, first on sys.path
from multi_instance import SETTLE_S, cpu_text, run_env

SEED = 20251
CLASSES = 10
TEXT_LABELS = 2
DISTINCT_IMAGES = 64  # generated images the data set cycles through (its length is what the steps need)
MAX_WORLD = 2  # the data set holds enough batches for every rank of the largest world
#: --tiny (the test suite): sizes that make every script a few seconds
#: the most steps nanopatch's bf16-against-fp32 measurement of a model takes (3 in bf16, fp32's
#: set-up step, 4 of each mode): the least warm-up of a full run, so that its timed steps run
#: what nanopatch decided
TRIAL_SPAN = 12
TINY = {
    "image_size": 32,
    "batch": 4,
    "text_batch": 4,
    "seq_len": 16,
    "bert_layers": 1,
    "bert_hidden": 32,
    "vocab": 1000,
}
FULL = {
    "image_size": 224,
    "batch": 32,
    "text_batch": 16,
    "seq_len": 128,
    "bert_layers": 4,
    "bert_hidden": 256,
    "vocab": 30522,
}
GPT2_VOCAB = 50257  # --hf-model gpt2 outside --tiny
STARTED = time.perf_counter()  # the script's start (for setup_s: imports, data and model building)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    group: str  # lightning, lightning-ddp, hf, timm
    script: str  # the worker's --script
    launcher: tuple[str, ...] = ()  # interpreter options before the script
    precision: str | None = None  # Lightning's Trainer(precision=...); "bf16" for HF's, "autocast" for timm's loop
    processes: int = 1
    patched: bool = False
    nano_processes: int = 0  # nanopatch.lightning.Trainer(num_processes=..., precision="bf16", channels_last=True)
    init: tuple[str, ...] = ()  # the environment of `eval "$(python -m nanopatch --init ...)"` (bigdl-nano-init's)


NANOPATCH = ("-m", "nanopatch")
VARIANTS = {
    v.name: v
    for v in (
        Variant("stock", "lightning", "lightning"),
        Variant("bf16-mixed", "lightning", "lightning", precision="bf16-mixed"),
        Variant("nanopatch", "lightning", "lightning", NANOPATCH, patched=True),
        Variant("nanopatch+bf16-mixed", "lightning", "lightning", NANOPATCH, "bf16-mixed", patched=True),
        Variant("nproc2", "lightning", "lightning", (*NANOPATCH, "--nproc", "2"), processes=2, patched=True),
        Variant("nano-trainer", "lightning", "lightning-nano", patched=True, nano_processes=1, init=("--init",)),
        Variant(
            "nano-trainer-2",
            "lightning",
            "lightning-nano",
            processes=2,
            patched=True,
            nano_processes=2,
            init=("--init", "--no-pin-threads"),
        ),
        Variant("ddp-stock", "lightning-ddp", "lightning-ddp", processes=2),
        Variant("ddp-nanopatch", "lightning-ddp", "lightning-ddp", NANOPATCH, processes=2, patched=True),
        Variant("hf-stock", "hf", "hf"),
        Variant("hf-nanopatch", "hf", "hf", NANOPATCH, patched=True),
        Variant("hf-bf16", "hf", "hf", precision="bf16"),
        Variant("hf-bf16-nanopatch", "hf", "hf", NANOPATCH, "bf16", patched=True),
        Variant("timm-stock", "timm", "timm"),
        Variant("timm-nanopatch", "timm", "timm", NANOPATCH, patched=True),
        Variant("timm-autocast", "timm", "timm", precision="autocast"),
        Variant("timm-autocast-nanopatch", "timm", "timm", NANOPATCH, "autocast", patched=True),
    )
}
#: --variants shorthands
GROUP_ALIASES = {
    **{
        alias: [n for n, v in VARIANTS.items() if v.group == group]
        for alias, group in (("lightning", "lightning"), ("ddp", "lightning-ddp"), ("hf", "hf"), ("timm", "timm"))
    },
    "all": list(VARIANTS),
}
BASELINE = {"lightning": "stock", "lightning-ddp": "ddp-stock", "hf": "hf-stock", "timm": "timm-stock"}
#: processes -> the stock run a variant's learning record is judged against, before its group's own
#: stock: two data-parallel processes see other batches than one, so a 2-process run is compared
#: with stock Lightning's 2-process DDP run (``ddp-stock``) when it ran
LEARNING_BASELINE = {2: "ddp-stock"}
#: the framework's (or the user's) own bf16 autocast: the "x bf16-mixed" / "x hf-bf16" / "x timm-autocast" column
SECOND_BASELINE = {"lightning": "bf16-mixed", "hf": "hf-bf16", "timm": "timm-autocast"}
#: Variant.precision in words
PRECISION_OF = {
    "bf16-mixed": "Lightning's bf16-mixed",
    "bf16": "the Trainer's bf16=True",
    "autocast": "the loop's autocast",
}
UNIT = {"lightning": "img/s", "lightning-ddp": "img/s", "hf": "samples/s", "timm": "img/s"}
#: (variant, against, at least): printed beside the ratios, never asserted
TARGETS = (
    ("nanopatch", "stock", 1.8),
    ("nanopatch", "bf16-mixed", 1.1),
    ("nano-trainer", "stock", 1.8),
    ("nano-trainer", "bf16-mixed", 1.15),
    ("nano-trainer-2", "nano-trainer", 1.0),
    ("ddp-nanopatch", "ddp-stock", 1.0),
    ("hf-nanopatch", "hf-stock", 1.3),
    ("timm-nanopatch", "timm-stock", 1.3),
    # nanopatch with the framework's own precision: at least as fast as either alone
    ("nanopatch+bf16-mixed", "bf16-mixed", 1.0),
    ("nanopatch+bf16-mixed", "nanopatch", 1.0),
    ("hf-bf16-nanopatch", "hf-bf16", 1.0),
    ("hf-bf16-nanopatch", "hf-nanopatch", 1.0),
    ("timm-autocast-nanopatch", "timm-autocast", 1.0),
    ("timm-autocast-nanopatch", "timm-nanopatch", 1.0),
)


# --- the workers: plain training scripts --------------------------------------------------------


class Clock:
    """Times the steps after the learning and warm-up steps: the span from the first timed step's
    start to the last one's end, each step's own time, and the process's CPU time over the span.
    The first ``learning.steps`` steps are recorded for the learning check (``--learn``)."""

    def __init__(self, args: argparse.Namespace, probe: h.Probe, learning: h.Learning) -> None:
        self.learning = learning
        self.warmup, self.steps, self.probe = learning.steps + args.warmup, args.steps, probe
        self.seen = 0
        self.step_s: list[float] = []
        self.first_batch: float | None = None
        self.started = STARTED
        self.first_step_at: float | None = None
        self.t0 = self.t1 = self.cpu0 = self.cpu1 = self.before = 0.0
        self.on_done = None  # called once after the last timed step (facts that need the live run)

    @property
    def done(self) -> bool:
        return self.seen >= self.warmup + self.steps

    def begin(self, batch=None) -> None:
        now = time.perf_counter()
        if self.seen == 0:
            self.first_step_at = now
            if batch is not None:
                self.first_batch = checksum(batch)
        if self.seen == self.warmup:
            self.t0, self.cpu0 = now, time.process_time()
            self.probe.active = True
        self.before = now

    def end(self) -> None:
        now = time.perf_counter()
        if self.seen >= self.warmup:
            self.step_s.append(now - self.before)
        self.seen += 1
        self.learning.after_step()
        if self.seen == self.learning.steps:
            self.learning.stop()
        if self.seen == self.warmup + self.steps:
            self.t1, self.cpu1 = now, time.process_time()
            self.probe.active = False
            if self.on_done is not None:
                self.on_done()

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.t1 - self.t0,
            "cpu_s": self.cpu1 - self.cpu0,
            "step_s": self.step_s,
            "steps_seen": self.seen - self.learning.steps,
            "learning_steps": self.learning.steps,
            "learning": self.learning.record,
            "setup_s": (self.first_step_at or self.started) - self.started,
            "warmup_s": self.t0 - (self.first_step_at or self.t0),
            "first_batch": self.first_batch,
        }


def total_steps(args: argparse.Namespace) -> int:
    """The steps a run takes: the recorded learning steps, the warm-up and the timed steps."""
    return args.learn + args.warmup + args.steps


def checksum(batch) -> float:
    import torch

    tensors = batch.values() if isinstance(batch, dict) else batch
    return float(sum(float(t.double().sum()) for t in tensors if isinstance(t, torch.Tensor)))


def image_loader(args: argparse.Namespace):
    """A shuffling DataLoader over generated images: enough batches for every rank's steps."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class GeneratedImages(Dataset):
        def __init__(self, samples: int) -> None:
            g = torch.Generator().manual_seed(SEED)
            self.images = torch.randn(min(samples, DISTINCT_IMAGES), 3, args.image_size, args.image_size, generator=g)
            self.labels = torch.randint(0, CLASSES, (samples,), generator=g)

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, i: int):
            return self.images[i % len(self.images)], self.labels[i]

    samples = args.batch * total_steps(args) * MAX_WORLD
    return DataLoader(GeneratedImages(samples), batch_size=args.batch, shuffle=True, drop_last=True)


def process_facts(model) -> dict[str, Any]:
    """What this process ran with: queries only, made after (or at the end of) the timed steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    initialised = dist.is_available() and dist.is_initialized()
    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "tcmalloc": h.mapped_library("libtcmalloc") is not None,
        "jemalloc": h.mapped_library("libjemalloc") is not None,
        "process_group": initialised,
        "world_size": dist.get_world_size() if initialised else 1,
        "backend": str(dist.get_backend()) if initialised else None,
        "ddp": any(isinstance(o, DistributedDataParallel) for o in gc.get_objects()),
        "first_weight_channels_last": first_conv_channels_last(model),
    }


def first_conv_channels_last(model) -> bool | None:
    import torch
    from torch import nn

    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is None:
        return None
    w = conv.weight
    return bool(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous())


def param_checksum(model) -> float:
    import torch

    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


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


def hf_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from torch import nn
    from torch.utils.data import Dataset
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    causal = args.hf_model == "gpt2"

    class GeneratedText(Dataset):
        def __init__(self, samples: int, vocab: int) -> None:
            g = torch.Generator().manual_seed(SEED)
            self.ids = torch.randint(1, vocab, (samples, args.seq_len), generator=g)
            self.labels = torch.randint(0, TEXT_LABELS, (samples,), generator=g)

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, i: int):
            ids = self.ids[i]
            label = ids if causal else self.labels[i]  # a causal LM shifts its labels itself
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": label}

    facts: dict[str, Any] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kwargs):
            clock.begin()

        def on_step_end(self, args_, state, control, **kwargs):
            clock.end()

    torch.manual_seed(SEED)
    hidden = args.bert_hidden
    if causal:
        config = GPT2Config(
            n_layer=args.bert_layers,
            n_embd=hidden,
            n_head=max(1, hidden // 64),
            vocab_size=args.vocab,
            n_positions=max(1024, args.seq_len),
        )
        model = GPT2LMHeadModel(config)
    else:
        config = BertConfig(
            num_hidden_layers=args.bert_layers,
            hidden_size=hidden,
            num_attention_heads=max(1, hidden // 64),
            intermediate_size=4 * hidden,
            vocab_size=args.vocab,
            max_position_embeddings=max(512, args.seq_len),
            num_labels=TEXT_LABELS,
        )
        model = BertForSequenceClassification(config)
    probe = h.Probe()
    probe.attach(model, nn.Linear)
    learning = h.Learning(args.learn, [model])
    clock = Clock(args, probe, learning)
    data = GeneratedText(args.text_batch * total_steps(args), config.vocab_size)
    training_args = TrainingArguments(
        output_dir=os.path.join(args.worker, "hf-output"),
        per_device_train_batch_size=args.text_batch,
        max_steps=total_steps(args),
        learning_rate=5e-5,
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=SEED,
        bf16=args.precision == "bf16",
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[StepTimer()])
    clock.on_done = lambda: facts.update(process_facts(model))
    with learning.start():
        output = trainer.train()
    return {
        "rank": int(os.environ.get("RANK", "0")),
        "samples": clock.steps * args.text_batch,
        **facts,
        "loss": float(output.training_loss),
        "framework": f"transformers {transformers.__version__}",
        "precision": "bf16" if training_args.bf16 else None,
        "model_size": f"{'GPT-2' if causal else 'BERT'} {args.bert_layers} layers, hidden {hidden}, "
        f"sequence {args.seq_len}",
        "param_checksum": param_checksum(model),
        "probe": probe.as_dict(),
        **clock.as_dict(),
    }


def timm_worker(args: argparse.Namespace) -> dict[str, Any]:
    import timm
    import torch
    from timm.optim import create_optimizer_v2
    from timm.utils import ModelEmaV2
    from torch import nn

    torch.manual_seed(SEED)
    loader = image_loader(args)
    model = timm.create_model("resnet18", pretrained=False, num_classes=CLASSES)
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
        "framework": f"timm {timm.__version__}",
        "precision": "autocast" if own_autocast else None,
        "optimizer": type(optimizer).__name__,
        "loader_batches": len(loader),
        "param_checksum": param_checksum(model),
        "probe": probe.as_dict(),
        **clock.as_dict(),
    }


_AFFINITY_AT_START: list[int] = []


def write_rank(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Write one training process's result as ``rank<N>.json``, with the facts of its process."""
    import torch

    result.setdefault("affinity_at_start", _AFFINITY_AT_START)
    result.update(
        nanopatch_imported="nanopatch" in sys.modules,
        env={k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "LD_PRELOAD", "LOCAL_RANK", "WORLD_SIZE")},
        torch=torch.__version__,
        pid=os.getpid(),
    )
    Path(args.worker, f"rank{result['rank']}.json").write_text(json.dumps(result))


def worker_main(args: argparse.Namespace) -> int:
    _AFFINITY_AT_START[:] = sorted(os.sched_getaffinity(0))
    run = {
        "lightning": lightning_worker,
        "lightning-ddp": lightning_worker,
        "lightning-nano": lightning_worker,
        "hf": hf_worker,
        "timm": timm_worker,
    }
    result = run[args.script](args)
    if result is not None:
        write_rank(args, result)
    return 0


# --- the parent: runs, rounds, report -------------------------------------------------------------


def command(variant: Variant, args: argparse.Namespace, out: str, learn: int = 0) -> list[str]:
    """The variant's command line; ``learn``: the steps it records first for the learning check."""
    worker = [os.path.abspath(__file__), "--worker", out, "--script", variant.script]
    if variant.precision:
        worker += ["--precision", variant.precision]
    if variant.nano_processes:
        worker += ["--nano-processes", str(variant.nano_processes)]
    if learn:
        worker += ["--learn", str(learn)]
    for name in ("steps", "warmup", *TINY):
        worker += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    worker += ["--hf-model", getattr(args, "hf_model", "bert")]
    return [sys.executable, *variant.launcher, *worker]


def init_env(env: dict[str, str], init: Sequence[str]) -> dict[str, str]:
    """``env`` after ``eval "$(python -m nanopatch <init>)"``: its ``export`` lines applied."""
    if not init:
        return env
    text = subprocess.run(
        [sys.executable, "-m", "nanopatch", *init], env=env, capture_output=True, text=True, check=True
    ).stdout
    exports = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            exports[name] = shlex.split(value, comments=True)[0]
    return {**env, **exports}


def run_once(
    variant: Variant, args: argparse.Namespace, env: dict[str, str], workdir: str, learn: int
) -> dict[str, Any]:
    """One fresh process (group) of a variant: its rate, or its error; with the digest of the
    nanopatch source it ran. ``learn``: the steps it records first for the learning check."""
    digest = h.source_digest()
    out = tempfile.mkdtemp(prefix=f"{variant.name}-", dir=workdir)
    argv = command(variant, args, out, learn)
    result = h.run_ranks(
        argv, env=init_env(env, variant.init), out=out, timeout=args.timeout, count="samples", expected=None
    )
    return {**result, "nanopatch_digest": digest}


def facts_of(run: dict[str, Any]) -> dict[str, Any]:
    """What a run's processes ran with, and the checks across its ranks."""
    ranks = run["ranks"]
    probes = [r["probe"] for r in ranks]
    return {
        "processes": len(ranks),
        "ranks": [r["rank"] for r in ranks],
        "framework": ranks[0]["framework"],
        "threads": [r["threads"] for r in ranks],
        "affinity": [cpu_text(r["affinity_at_start"]) for r in ranks],
        "tcmalloc": [r["tcmalloc"] for r in ranks],
        "jemalloc": [r["jemalloc"] for r in ranks],
        "world_size": [r["world_size"] for r in ranks],
        "backend": ranks[0]["backend"],
        "ddp": [r["ddp"] for r in ranks],
        "strategy": ranks[0].get("strategy"),
        "precision": ranks[0].get("precision"),
        "samples_per_rank": [r["samples"] for r in ranks],
        "steps_seen": [r["steps_seen"] for r in ranks],
        "nanopatch_imported": [r["nanopatch_imported"] for r in ranks],
        "first_weight_channels_last": [r["first_weight_channels_last"] for r in ranks],
        "probe": probes[0],
        "inside": h.inside(probes[0]),
        "inside_per_rank": [h.inside(p) for p in probes],
        "loss": [r.get("loss") for r in ranks],
        "env": [r["env"] for r in ranks],
        **h.rank_checks(ranks, "first_batch"),
    }


#: facts that must not change from one round to the next
STABLE = ("processes", "threads", "affinity", "tcmalloc", "world_size", "ddp", "strategy", "precision", "inside")


def problems(v: Variant, d: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The checks: what a variant's details say it did not run as the variant says."""
    found = []
    if not v.patched and any(d["nanopatch_imported"]):
        found.append("nanopatch was imported")
    if v.patched and not all(d["nanopatch_imported"]):
        found.append("nanopatch was not imported")
    if d["processes"] != v.processes:
        found.append(f"{d['processes']} process(es) wrote a result, expected {v.processes}")
    expected_steps = args.warmup + args.steps
    if any(s != expected_steps for s in d["steps_seen"]):
        found.append(f"steps seen {d['steps_seen']}, expected {expected_steps} (warm-up + timed)")
    if any(p == "no call seen" for p in d["inside_per_rank"]):
        found.append("the probe saw no forward call of its layer in the timed steps")
    if v.precision and d["precision"] != v.precision:
        found.append(f"precision {d['precision']}, expected {v.precision}")
    if v.precision and d["probe"]["dtypes"] and set(d["probe"]["dtypes"]) != {"bfloat16"}:
        found.append(f"{v.precision}, but the layer computed in {h.dtype_name(d['probe']['dtypes'])}")
    if v.processes > 1:
        if set(d["world_size"]) != {v.processes}:
            found.append(f"world size {d['world_size']} (expected {v.processes}): not data-parallel")
        if not all(d["ddp"]):
            found.append("no DistributedDataParallel in some rank")
        if d["ranks_in_sync"] is False:
            found.append("ranks' parameters differ after the run (gradients not averaged)")
        if d["ranks_saw_different_data"] is False:
            found.append("ranks saw the same first batch (loader not sharded)")
    elif max(d["world_size"]) != 1:
        found.append(f"world size {d['world_size']}")
    return found


def findings(v: Variant, d: dict[str, Any], cores: int) -> list[str]:
    """What the probe says nanopatch did (or did not do) inside the model, and how the processes
    shared the cores: not failed checks."""
    notes = []
    if sum(d["threads"]) > cores and len(set(d["affinity"])) < d["processes"]:
        notes.append(
            f"{d['processes']} processes x {'/'.join(map(str, sorted(set(d['threads']))))} threads on the same "
            f"{h.plural(cores, 'core')}: oversubscribed"
        )
    if not v.patched or not d["probe"]["calls"]:
        return notes
    if "bfloat16" not in d["probe"]["dtypes"]:
        notes.append(f"not accelerated: the probed layer computed in {h.dtype_name(d['probe']['dtypes'])}")
    elif set(d["probe"]["dtypes"]) == {"bfloat16"} and v.precision:
        whose = PRECISION_OF.get(v.precision, v.precision)
        notes.append(f"bf16 inside may be {whose} alone (the probe cannot tell whose autocast it is)")
    probe = d["probe"]
    if probe["inputs_4d"] and probe["channels_last"] < probe["inputs_4d"]:
        notes.append("the probed convolution's input was not channels-last")
    return notes


def summarise(names: list[str], runs: dict[str, list[dict[str, Any]]], args, cores: int):
    rows, by_name = [], {}
    for name in names:
        v = VARIANTS[name]
        baseline = BASELINE[v.group]
        ok = [r for r in runs[name] if "rate" in r]
        r = h.ranks_row("frameworks", v.group, name, UNIT[v.group], runs[name], cores, stock=name == baseline)
        r["command"] = shlex.join(command(v, args, "OUT"))
        if ok:
            d = r["details"]
            facts = facts_of(ok[-1])
            changed = [f for f in STABLE if any(facts_of(x)[f] != facts[f] for x in ok)]
            d.update(facts, changed_between_rounds=changed)
            d["problems"] = problems(v, d, args) + [f"{f} changed between rounds" for f in changed]
            versions_seen = list(dict.fromkeys(x.get("nanopatch_digest") for x in ok))
            d["nanopatch_digests"] = versions_seen
            if v.patched and len(versions_seen) > 1:
                d["problems"].append(f"nanopatch's source changed between its rounds ({len(versions_seen)} versions)")
            d["findings"] = findings(v, d, cores)
        against = LEARNING_BASELINE.get(v.processes, baseline)
        if h.record_of(runs.get(against, [])) is None:
            against = baseline
        h.learning_row(r, h.record_of(runs[name]), h.record_of(runs.get(against, [])), against)
        rows.append(r)
        by_name[name] = r
    for group, baseline in BASELINE.items():
        in_group = [r for r in rows if r["group"] == group]
        h.ratios_to(in_group, by_name.get(baseline))
        h.ratios_to(in_group, by_name.get(SECOND_BASELINE.get(group, "")), "ratio_to_bf16_mixed")
    for r in rows:
        if r["rate"] is not None:
            r["targets"] = targets_of(r, by_name)
    return rows


def targets_of(row: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for variant, against, at_least in TARGETS:
        other = by_name.get(against)
        if variant != row["variant"] or other is None or not other["rate"]:
            continue
        ratio = row["rate"] / other["rate"]
        out.append({"against": against, "at_least": at_least, "ratio": ratio, "met": ratio >= at_least})
    return out


def ran_with(d: dict[str, Any]) -> str:
    threads = "/".join(map(str, sorted(set(d["threads"]))))
    if d["processes"] == 1:
        parts = [f"1 process, {threads} threads, CPUs {d['affinity'][0]}"]
    else:
        parts = [f"{d['processes']} processes x {threads} threads, CPUs {' | '.join(d['affinity'])}"]
    parts.append("tcmalloc" if all(d["tcmalloc"]) else "jemalloc" if all(d["jemalloc"]) else "glibc malloc")
    if max(d["world_size"]) > 1 or d["processes"] > 1:
        parts.append(f"world {max(d['world_size'])} ({d['backend']}), {'DDP' if all(d['ddp']) else 'no DDP'}")
    if d["strategy"]:
        parts.append(f"{d['strategy']}, precision {d['precision']}")
    return ", ".join(parts)


GROUP_TITLES = {
    "lightning": "A. Lightning: LightningModule(ResNet-18) + Trainer",
    "lightning-ddp": "A. Lightning: Trainer(devices=2, strategy='ddp')",
    "hf": "B. Hugging Face Trainer: a transformers model built from its config (BERT, or GPT-2 with --hf-model gpt2)",
    "timm": "C. timm: create_model + create_optimizer_v2 + ModelEmaV2, hand-written loop",
}


def print_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    print("## Training throughput of framework code: Lightning, Hugging Face Trainer, timm\n")
    print(h.cpu_line(m) + "; " + ", ".join(f"{k} {m[k]}" for k in VERSIONS if m.get(k)))
    print(
        f"- {h.plural(report['rounds'], 'round')} x {h.plural(report['steps'], 'timed step')} per run after "
        f"{report['warmup']} warm-up, each run a fresh process (group), order rotated each round; 1-min load "
        f"average at start {m['loadavg_start']}, at the end {report['loadavg_end']}"
    )
    git = report["git"]
    changes = git["nanopatch_changes"]
    digests = {r.get("nanopatch_digest") for runs in report.get("runs", {}).values() for r in runs}
    print(
        f"- nanopatch from git {(git['commit'] or '?')[:12]} at the start"
        + (f", with uncommitted changes under nanopatch/ ({', '.join(changes)})" if changes else "")
        + (f"; **its source changed during the run** ({len(digests)} versions)" if len(digests) > 1 else "")
    )
    for group, title in GROUP_TITLES.items():
        rows = [r for r in report["rows"] if r["group"] == group]
        if not rows:
            continue
        unit = UNIT[group]
        second = group in SECOND_BASELINE
        print(f"\n### {title}\n\n{report['descriptions'][group]}\n")
        head = ["variant", f"{unit} (median)", "min-max", f"x {BASELINE[group]}"]
        head += [f"x {SECOND_BASELINE[group]}"] if second else []
        head += ["target", "bf16 inside / channels-last inside", "CPU", "other load", "ran with"]
        print("| " + " | ".join(head) + " |")
        print("|---|" + "---:|" * (4 if second else 3) + "---|---|---:|---:|---|")
        for row in rows:
            print("| " + " | ".join(cells(row, second)) + " |")
    print()
    for row in report["rows"]:
        if "problems" not in row.get("details", {}):  # no run of it went through
            continue
        d = row["details"]
        for problem in d["problems"]:
            print(f"- check failed: `{row['variant']}`: {problem}")
        for note in d["findings"]:
            print(f"- `{row['variant']}`: {note}")
        if d["load_warning"]:
            print(f"- warning: `{row['variant']}`: {d['load_warning']}")
    for row in report["rows"]:
        if row.get("failed_runs"):
            print(f"- `{row['variant']}`: {row['failed_runs']} run(s) failed: {h.cell(row['error'])}")
    judged = [r for r in report["rows"] if r.get("learning")]
    if judged:
        print(
            f"\nLearning: {h.first_steps(report['learning_steps'])} of each variant's first run from the "
            "seed (rank 0's), judged against its group's stock (two processes: ddp-stock, when it ran) by "
            "nanopatch.learning (the test suite's definition); a variant that does not learn as stock gets no rate:\n"
        )
        for r in judged:
            print(f"- {h.learning_line(r)}")
    print(
        "\nRate: samples of all processes / the slowest process's time for the timed steps, median over the "
        "rounds. x ...: ratio of the medians (per round in brackets where there were several rounds). target: "
        "from the issue, printed, never asserted. bf16 inside / channels-last inside: what a forward hook on the "
        "model's first convolution (first Linear for BERT) saw in the timed steps: the dtype it computed in and "
        "whether its input was channels-last. CPU: CPU time of the timed steps of all processes / (wall time x "
        "cores). other load: the most CPU time other processes took during one of the variant's runs, as a share "
        "of all CPUs."
    )
    print(f"\nCommand: `{report['command']}`; run took {report['seconds']:.0f} s.")


def cells(row: dict[str, Any], second: bool) -> list[str]:
    if h.learns(row) is False:  # no rate: the verdict instead
        return [row["variant"], h.DOES_NOT_LEARN, *[""] * (7 if second else 6), h.cell(row["note"])]
    if row["rate"] is None:
        return [row["variant"], "failed", *[""] * (7 if second else 6), h.cell(row.get("error", "?"))]
    d = row["details"]
    low, high = row["spread"]

    def ratio(value: float | None, rounds: list[float] | None = None) -> str:
        if value is None:
            return ""
        text = f"{value:.2f}x"
        if rounds and len(rounds) > 1:
            text += f" ({min(rounds):.2f}-{max(rounds):.2f})"
        return text

    out = [
        row["variant"],
        h.fmt(row["rate"]),
        f"{h.fmt(low)}-{h.fmt(high)}",
        ratio(row["ratio_to_stock"], row.get("ratio_per_round")),
    ]
    if second:
        out.append(ratio(row.get("ratio_to_bf16_mixed")))
    targets = [f">= {t['at_least']:g}x {t['against']}: {'met' if t['met'] else 'not met'}" for t in row["targets"]]
    out += [
        "; ".join(targets),
        d["inside"] if len(set(d["inside_per_rank"])) == 1 else " | ".join(d["inside_per_rank"]),
        f"{d['cpu_use'] * 100:.0f}%",
        f"{max(d['other_load']) * 100:.0f}%" if d["other_load"] else "?",
        ran_with(d),
    ]
    return out


VERSIONS = ("torch", "torchvision", "lightning", "transformers", "timm", "accelerate")


def descriptions(args: argparse.Namespace) -> dict[str, str]:
    images = f"batch {args.batch} at {args.image_size} px, generated images, {CLASSES} classes"
    model = (
        "GPT-2 from a GPT2Config (causal-LM loss)"
        if getattr(args, "hf_model", "bert") == "gpt2"
        else "BERT from a BertConfig"
    )
    bert = (
        f"{model}: {args.bert_layers} layers, hidden {args.bert_hidden}, vocabulary {args.vocab}, "
        f"sequence {args.seq_len}, batch {args.text_batch}, generated token ids"
    )
    return {
        "lightning": f"torchvision ResNet-18 in a LightningModule, SGD(momentum 0.9), {images}.",
        "lightning-ddp": f"The same module, Trainer(devices=2, strategy='ddp'), {images} per process.",
        "hf": f"{bert}; Trainer with TrainingArguments(use_cpu=True).",
        "timm": f"timm resnet18, create_optimizer_v2('sgd'), ModelEmaV2 updated every step, {images}.",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_round_options(parser)
    parser.add_argument(
        "--variants",
        default="all",
        help=f"comma-separated, of {', '.join(VARIANTS)}, or the groups {', '.join(GROUP_ALIASES)} "
        "(default: %(default)s)",
    )
    parser.add_argument("--image-size", type=int, help="image side in px for Lightning and timm (default 224)")
    parser.add_argument(
        "--hf-model",
        choices=("bert", "gpt2"),
        default="bert",
        help="the Hugging Face Trainer's model: BERT for sequence classification, or GPT-2 with its "
        "causal-LM loss and 50257-word vocabulary (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    # sizes, for the test suite (--tiny) and the workers
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--text-batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bert-layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bert-hidden", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)  # internal: run as the training script
    parser.add_argument(
        "--script", choices=("lightning", "lightning-ddp", "lightning-nano", "hf", "timm"), help=argparse.SUPPRESS
    )
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--nano-processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--learn", type=int, default=0, help=argparse.SUPPRESS)  # steps recorded first
    args = parser.parse_args(argv)
    h.round_defaults(args)
    if args.hf_model == "gpt2" and args.vocab is None and not args.tiny:
        args.vocab = GPT2_VOCAB
    for name, value in (TINY if args.tiny else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.worker:
        return worker_main(args)
    names = h.parse_names(args.variants, VARIANTS, "--variants", parser, GROUP_ALIASES)
    if min(args.rounds, args.steps, args.warmup, args.learning_steps, *(getattr(args, n) for n in TINY)) < 1:
        parser.error("--rounds, --steps, --warmup, --learning-steps and the sizes must be >= 1")

    log = h.log
    started = time.perf_counter()
    machine = h.machine_facts(*VERSIONS)
    git = machine["git"]
    env = run_env()
    if args.tiny:
        # tiny models measure faster in fp32, and nanopatch would choose it: the suite's run pins bf16
        # so that what it checks (bf16 inside, the same in every launch) does not depend on timing
        env["NANOPATCH_BF16"] = "1"
    elif not args.quick and args.warmup < TRIAL_SPAN:
        log(f"--warmup {args.warmup} -> {TRIAL_SPAN}: the timed steps start after nanopatch's bf16 measurement")
        args.warmup = TRIAL_SPAN
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="nanopatch-frameworks-") as workdir:
        run = h.recording_first(lambda n, learn: run_once(VARIANTS[n], args, env, workdir, learn), args.learning_steps)
        runs, orders = h.interleave(names, args.rounds, run, log, SETTLE_S)
    rows = summarise(names, runs, args, cores)
    runs = {row["variant"]: h.runs_kept(row, runs[row["variant"]]) for row in rows}
    report = {
        "benchmark": "frameworks",
        "machine": machine,
        "command": shlex.join(["python", h.shown_path(__file__), *(sys.argv[1:] if argv is None else argv)]),
        "descriptions": descriptions(args),
        "git": git,
        "sizes": {n: getattr(args, n) for n in TINY},
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "learning_steps": args.learning_steps,
        "quick": args.quick,
        "round_orders": orders,
        "rows": rows,
        "runs": runs,
        "loadavg_end": h.load_average(),
        "seconds": time.perf_counter() - started,
    }
    return h.finish(report, args.json, print_markdown)


if __name__ == "__main__":
    sys.exit(main())
