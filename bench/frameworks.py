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
   under nanopatch; ``hf-nanopatch-compile`` is ``python -m nanopatch --compile=default script``.
   ``--hf-model gpt2``: the same five with ``GPT2LMHeadModel`` from a ``GPT2Config`` instead
   (the same layers, width and sequence, GPT-2's vocabulary of 50257, the labels the token ids:
   the causal-LM loss the model computes in its forward). After the rounds, one more process
   (the script with ``--roof``, run as stock) counts the model's work per sample
   (``FlopCounterMode`` over one forward and backward of a batch, LoRA's frozen weights as they
   run) and times this machine's bf16 and fp32 matrix products (bench/train_step.py's roof): each
   row gets its model GFLOP/s and their fraction of the faster rate.
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

import sys

from families.frameworks.main import main as frameworks_main  # bench/ is this script's folder, first on sys.path


def main(argv: list[str] | None = None) -> int:
    return frameworks_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
