"""Training-step throughput, stock PyTorch against nanopatch's training patch, side by side.

Times a full training step (``zero_grad``, forward, loss, ``backward``, ``optimizer.step``) as
an unmodified script writes it, on synthetic data with fixed seeds, for:

* ``resnet18`` / ``resnet50``: torchvision's, batch 32 at 224 px, SGD(momentum 0.9),
  cross-entropy over 1000 classes: images/s.
* ``transformer``: a 6-layer ``nn.TransformerEncoder`` language model (embedding + learned
  positions, d_model 512, 8 heads, feed-forward 2048, batch_first, causal mask, vocabulary
  8192), batch 8 x 256 tokens, AdamW, next-token cross-entropy: tokens/s.
* ``siamese``: the shape of pytorch/examples' siamese network (a one-channel ResNet-18 on each of
  two 28x28 images, an MLP, a sigmoid), batch 64 pairs, Adadelta, BCELoss: pairs/s. Small
  convolutions on small images, where bf16 may not pay: nanopatch must never be slower there.

The roof: each model's run measures, in its first plain-loop worker (stock's), this machine's
bf16 and fp32 matrix-product rates (torch's 2048x2048 ``mm``, after the timed rounds, with no
other worker computing) and the model's work per sample (``FlopCounterMode`` over one training
step, forward and backward); every variant's model FLOP/s (rate x work) is printed beside its
fraction of the bf16 rate: how far from the machine's peak the step runs.

in these variants, each in its own persistent worker process:

* ``stock``: nanopatch is never imported (checked).
* ``by-hand``: nanopatch is never imported; the step is edited the way PyTorch's CPU
  performance advice has a user edit it: model and input in channels-last memory (image
  models), forward and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``. The ceiling
  nanopatch aims at without edits: ``patched`` over ``by-hand`` is what the patch costs or adds.
* ``patched``: ``nanopatch.patch_torch()`` (defaults) before the model and optimizer are built.
  Its warm-up lasts until nanopatch has measured bf16 against fp32 and channels-last against
  stock's layout for the model (at most 38 steps), so the timed steps run what nanopatch decided.
* ``compile``: ``nanopatch.patch_torch(compile="default")``; compile time is reported apart.
* ``ipex``: ``nanopatch.patch_torch()`` in an interpreter whose environment has
  intel-extension-for-pytorch built for its torch: this one if it has, or ``--ipex-python``;
  skipped with a note otherwise.
* ``ipex-stock`` (not run by default): nothing patched, in the IPEX interpreter, to tell the
  torch version's share of the ``ipex`` ratio from IPEX's own.
* ``by-hand-tcmalloc``: ``by-hand`` with tcmalloc preloaded (``LD_PRELOAD``), the allocator
  PyTorch's CPU performance guide also has users set up and ``python -m nanopatch`` preloads:
  ``patched`` against it shows what nanopatch adds beyond memory reuse (``patch_torch()`` has
  glibc keep freed memory, see ``malloc_reuse``). Skipped when no tcmalloc is installed.
* ``lightning-bf16``: nanopatch is never imported (checked); the same model, batch, loss and
  optimizer trained by a PyTorch Lightning ``Trainer(precision="bf16-mixed", accelerator="cpu",
  devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
  enable_model_summary=False)`` through a LightningModule whose ``training_step`` calls the model
  and whose ``configure_optimizers`` builds the optimizer: what a framework user gets without
  nanopatch.
* ``lightning-bf16-patched`` (not run by default): the same after ``nanopatch.patch_torch()``.
* ``broken`` (hidden, for the test suite): ``patched`` with a forward hook that detaches the first
  layer's output, a variant that does not learn as stock.

Each variant must learn as stock before it gets a rate: its worker records its first
``--learning-steps`` training steps from the seed (the same model, batch and optimizer as stock's)
with ``nanopatch.learning.Recorder``, before the warm-up, and answers them with its setup; the
parent judges them against stock's with ``nanopatch.learning.compare`` (the test suite's
definition). A variant that does not learn as stock is printed "does not learn" with the verdict,
and its row keeps no rate, ratio, target, timed sample or profile.

How the Lightning variants fit the persistent-worker protocol: ``Trainer.fit`` runs once, in the
worker's main thread as in a script, over a DataLoader (``batch_size=None``) that yields the one
synthetic batch for ever; a Callback's ``on_train_batch_end`` is where the worker counts the
warm-up, runs the probes, answers the parent and blocks reading its next request. A ``run`` of N
steps is timed from that hook (once the request is read) to the same hook N batches later: N
whole iterations of Lightning's own loop (batch fetch and transfer, hooks, the bf16 autocast of
the precision plugin, the closure with ``training_step``, ``zero_grad`` and ``backward``,
``optimizer.step``), each optimizer step exactly once, and nothing but Lightning's loop runs
meanwhile. This real Trainer was preferred to Lightning Fabric (which a request loop could drive
step by step) because Fabric is not what Trainer users run: its loop, hooks and closure-based
optimizer step are the Trainer's cost. No thread is needed: the callback blocks on the request
pipe, the same way the other variants' loops do between requests.

For one model at a time, every variant's worker builds its model and optimizer once, records its
learning steps and warms up (``compile`` gets extra warm-up steps); then in every round the
parent asks each worker in turn, the order rotated each round, to run ``--steps`` steps and
report the time, so only one worker computes at a time and machine drift hits every variant
alike. Workers use torch's default threads (all cores the process may use). A model's workers
are shut down before the next model's start. A worker that fails is reported as failed, with its
error, and the rest go on. Prints a Markdown table: the median rate, its spread, the ratios to ``stock`` and to
``by-hand``, and the issue's targets (printed, never asserted): ``patched`` >= 2.5x stock for
the ResNets, 1.8x for the transformer and 1.0x for the siamese network; ``patched`` >= 1.10x
``by-hand`` for the ResNets and 1.25x for the transformer; every variant nanopatch patched >= ``lightning-bf16``.

``--profile N``: after the timed rounds, each worker runs N more steps under torch.profiler (CPU
activities, shapes recorded) and reports the top ops by self CPU time per step, and the self
time of the ``aten::copy_`` calls that convert between dtypes, as a share of the step. See
bench/README.md.

    PYTHONPATH=. python bench/train_step.py [--quick] [--models resnet18,resnet50,transformer]
        [--variants stock,by-hand,patched,compile,ipex,lightning-bf16] [--rounds 5] [--steps 3]
        [--warmup 2] [--learning-steps 6] [--profile N] [--ipex-python PATH] [--json PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness/, families/: when imported from elsewhere

from families.train_step.main import main as train_step_main


def main(argv: list[str] | None = None) -> int:
    return train_step_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
