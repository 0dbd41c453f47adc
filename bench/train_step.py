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
  Its warm-up lasts until nanopatch has measured bf16 against fp32 for the model (at most
  16 steps), so the timed steps run what nanopatch decided.
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

import argparse
import gc
import importlib.util
import json
import os
import platform
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/harness/, when imported from elsewhere

import harness as h

STOCK, BY_HAND, PATCHED, COMPILE = "stock", "by-hand", "patched", "compile"
IPEX, IPEX_STOCK = "ipex", "ipex-stock"
LIGHTNING, LIGHTNING_PATCHED = "lightning-bf16", "lightning-bf16-patched"
BY_HAND_TCMALLOC = "by-hand-tcmalloc"
#: patched, with a forward hook that detaches the first layer's output (no gradient reaches it):
#: a variant that does not learn as stock, for the test suite
BROKEN = "broken"
VARIANTS = (STOCK, BY_HAND, BY_HAND_TCMALLOC, PATCHED, COMPILE, IPEX, IPEX_STOCK, LIGHTNING, LIGHTNING_PATCHED)
HIDDEN_VARIANTS = (BROKEN,)
DEFAULT_VARIANTS = (STOCK, BY_HAND, BY_HAND_TCMALLOC, PATCHED, COMPILE, IPEX, LIGHTNING)
#: the by-hand edit and the allocator PyTorch's CPU guide has users preload (found by nanopatch.runtime)
BY_HAND_VARIANTS = (BY_HAND, BY_HAND_TCMALLOC)
#: variant -> patch_torch() keyword arguments; None: nanopatch is not imported at all
PATCH_OPTIONS: dict[str, dict[str, Any] | None] = {
    STOCK: None,
    BY_HAND: None,
    PATCHED: {},
    COMPILE: {"compile": "default"},
    IPEX: {},
    IPEX_STOCK: None,
    LIGHTNING: None,
    LIGHTNING_PATCHED: {},
    BY_HAND_TCMALLOC: None,
    BROKEN: {},
}
IPEX_VARIANTS = (IPEX, IPEX_STOCK)
#: trained by a Lightning Trainer(precision="bf16-mixed") rather than the script's own loop
LIGHTNING_VARIANTS = (LIGHTNING, LIGHTNING_PATCHED)
LIGHTNING_PRECISION = "bf16-mixed"
MODELS = ("resnet18", "resnet50", "transformer", "siamese")
HIDDEN_MODELS = ("tiny",)  # a small CNN, for the test suite
#: model -> minimum patched/stock ratio, from the issue. Printed, never asserted.
TARGETS = {"resnet18": 2.5, "resnet50": 2.5, "transformer": 1.8, "siamese": 1.0}
#: model -> minimum patched/by-hand ratio, from the issue (part 5). Printed, never asserted.
TARGETS_BY_HAND = {"resnet18": 1.10, "resnet50": 1.10, "transformer": 1.25}
#: every variant nanopatch patched should be at least as fast as Lightning's own bf16-mixed (printed only)
TARGET_X_LIGHTNING = 1.0
PROFILE_TOP = 15  # --profile: the ops shown, by self CPU time
CLASSES = 1000
VOCAB = 8192
SIAMESE_BATCH = 64  # the script's default --batch-size
SEED = 20250
COMPILE_EXTRA_WARMUP = 3  # torch.compile traces and compiles forward and backward in the first steps
SETTLE_S = 0.3  # pause before each request: the previous worker's OpenMP threads stop spinning
#: the sizes: full, and --quick
SHAPES = {
    False: {"image_size": 224, "image_batch": 32, "seq": 256, "text_batch": 8},
    True: {"image_size": 112, "image_batch": 8, "seq": 64, "text_batch": 8},
}
DEFAULTS = {
    False: {"rounds": 5, "steps": 3, "warmup": 2, "learning_steps": h.LEARNING_STEPS[False]},
    True: {"rounds": 3, "steps": 1, "warmup": 1, "learning_steps": h.LEARNING_STEPS[True]},
}


def tiny_model(classes: int = CLASSES):
    """A small CNN (conv-BN-ReLU twice, pooled, linear) for the benches' own end-to-end
    tests; bench/multi_instance.py uses it too."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def siamese_network():
    """The shape of pytorch/examples' ``siamese_network/main.py``: torchvision's ResNet-18 with a
    one-channel first convolution and no classifier, run on each of two 28x28 images, the two
    512-feature vectors concatenated into Linear(1024, 256), ReLU, Linear(256, 1) and a sigmoid
    (trained with ``BCELoss`` and Adadelta there, as here). Small convolutions on small images:
    a model where bf16 does not obviously pay."""
    import torch
    import torchvision
    from torch import nn

    class SiameseNetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            resnet = torchvision.models.resnet18(weights=None)
            resnet.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.features = nn.Sequential(*list(resnet.children())[:-1])
            self.head = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(inplace=True), nn.Linear(256, 1))
            self.sigmoid = nn.Sigmoid()

        def forward(self, first, second):
            pair = torch.cat([self.features(first).flatten(1), self.features(second).flatten(1)], 1)
            return self.sigmoid(self.head(pair))

    return SiameseNetwork()


def describe(model: str, shape: dict[str, int]) -> str:
    if model == "siamese":
        return (
            f"pytorch/examples' siamese network (a 1-channel ResNet-18 on each of two 28x28 images, an MLP and a "
            f"sigmoid), batch {SIAMESE_BATCH} pairs, Adadelta, BCELoss"
        )
    if model == "transformer":
        return (
            f"6-layer nn.TransformerEncoder LM (d_model 512, 8 heads, ff 2048, vocabulary {VOCAB}), batch "
            f"{shape['text_batch']} x {shape['seq']} tokens, AdamW, next-token cross-entropy"
        )
    name = "small CNN (2 convolutions)" if model == "tiny" else f"torchvision {model}"
    return (
        f"{name}, batch {shape['image_batch']} at {shape['image_size']} px, SGD(momentum 0.9), "
        f"cross-entropy over {CLASSES} classes"
    )


def unit(model: str) -> str:
    return {"transformer": "tokens/s", "siamese": "pairs/s"}.get(model, "img/s")


# --- the worker: one variant's training loop -----------------------------------------------


class Job:
    """A model, its optimizer and one synthetic batch, and the training step a script runs;
    ``by_hand``: the script edited for bf16 autocast and channels-last (the ``by-hand`` variant).
    ``optimizer=False``: the optimizer is left for :meth:`make_optimizer` to build later (from a
    LightningModule's ``configure_optimizers``)."""

    def __init__(self, model_name: str, shape: dict[str, int], by_hand: bool = False, optimizer: bool = True) -> None:
        import torch
        from torch import nn

        self.by_hand = by_hand
        self.text = model_name == "transformer"
        self.siamese = model_name == "siamese"
        self.optimizer: Any = None
        torch.manual_seed(SEED)
        if self.siamese:
            self.model = siamese_network()
            self.inputs = tuple(torch.rand(SIAMESE_BATCH, 1, 28, 28) * 255 for _ in range(2))  # MNIST's pixel range
            self.targets = torch.randint(0, 2, (SIAMESE_BATCH,)).float()
            self.samples_per_step = SIAMESE_BATCH
            if by_hand:
                self.model = self.model.to(memory_format=torch.channels_last)
        elif self.text:
            batch, seq = shape["text_batch"], shape["seq"]
            self.model = transformer_lm(seq)
            tokens = torch.randint(0, VOCAB, (batch, seq + 1))
            self.inputs, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            self.samples_per_step = batch * seq
        else:
            batch, size = shape["image_batch"], shape["image_size"]
            if model_name == "tiny":
                self.model = tiny_model()
            else:
                import torchvision

                self.model = getattr(torchvision.models, model_name)(weights=None, num_classes=CLASSES)
            self.inputs = torch.randn(batch, 3, size, size)  # NCHW, as a DataLoader hands every batch
            if by_hand:
                self.model = self.model.to(memory_format=torch.channels_last)
            self.targets = torch.randint(0, CLASSES, (batch,))
            self.samples_per_step = batch
        if optimizer:
            self.make_optimizer(self.model.parameters())
        self.criterion = nn.BCELoss() if self.siamese else nn.CrossEntropyLoss()
        self.model.train()  # as a script's epoch loop does, after building the optimizer

    def make_optimizer(self, parameters):
        """The model's optimizer, over ``parameters``: AdamW for the transformer, SGD otherwise."""
        import torch

        if self.text:
            self.optimizer = torch.optim.AdamW(parameters, lr=1e-4, weight_decay=0.01)
        elif self.siamese:
            self.optimizer = torch.optim.Adadelta(parameters, lr=1.0)
        else:
            self.optimizer = torch.optim.SGD(parameters, lr=0.01, momentum=0.9, weight_decay=1e-4)
        return self.optimizer

    def loss(self, output, targets):
        if self.siamese:
            return self.criterion(output.squeeze(), targets)
        return self.criterion(output.reshape(-1, output.shape[-1]), targets.reshape(-1))

    def forward(self, inputs):
        """The model on a batch: the siamese network takes its two images as two arguments."""
        return self.model(*inputs) if isinstance(inputs, tuple) else self.model(inputs)

    def step(self):
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        inputs = self.inputs
        if self.by_hand and not self.text:  # the edited script converts each batch it is handed
            if self.siamese:
                inputs = tuple(x.contiguous(memory_format=torch.channels_last) for x in inputs)
            else:
                inputs = inputs.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.by_hand):
            output = self.forward(inputs)
            loss = self.loss(output, self.targets)
        loss.backward()
        self.optimizer.step()
        return output, loss


def transformer_lm(seq: int):
    import torch
    from torch import nn

    class TransformerLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 512)
            self.position = nn.Embedding(seq, 512)
            layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(512)
            self.head = nn.Linear(512, VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.embed(tokens) + self.position(positions)
            x = self.encoder(x, mask=self.mask, is_causal=True)
            return self.head(self.norm(x))

    return TransformerLM()


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


#: the roof: torch's ROOF_N x ROOF_N matrix product, timed ROOF_REPS times per dtype (median)
ROOF_N, ROOF_REPS = 2048, 12
#: a dtype whose PROBE_N-square product runs below SLOW_RATE FLOP/s (bf16 emulated on a CPU
#: without native bf16: under 1 GFLOP/s, a 2048-square product taking a minute) is timed at PROBE_N
PROBE_N, SLOW_RATE = 512, 5e9


def matmul_rates() -> dict[str, float]:
    """This machine's matrix-product rate in FLOP/s, bf16 and fp32: the median of
    :data:`ROOF_REPS` timed ``torch.mm`` of two :data:`ROOF_N`-square matrices, after a warm-up,
    with the worker's threads. The roof a training step's model FLOP/s are read against. A
    dtype that a :data:`PROBE_N`-square product shows to be far slower (emulated) is timed at
    that size, 3 times."""
    import torch

    def timed(n: int, dtype: torch.dtype, warmup: int, reps: int) -> float:
        a, b = (torch.randn(n, n).to(dtype) for _ in range(2))
        out = torch.empty(n, n, dtype=dtype)
        for _ in range(warmup):
            torch.mm(a, b, out=out)
        took = []
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            took.append(time.perf_counter() - start)
        return 2 * n**3 / statistics.median(took)

    rates = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        probe = timed(PROBE_N, dtype, 1, 1)
        rates[name] = timed(PROBE_N, dtype, 0, 3) if probe < SLOW_RATE else timed(ROOF_N, dtype, 3, ROOF_REPS)
    return rates


def flops_per_sample(job: Job) -> float | None:
    """The model work of one training step per sample: the FLOPs
    ``torch.utils.flop_counter.FlopCounterMode`` counts (matrix products, convolutions,
    attention; forward and backward) over one step, divided by the samples in it."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter = FlopCounterMode(display=False)
    with counter:
        job.step()[1].item()
    return counter.get_total_flops() / job.samples_per_step


#: warm-up steps a variant may add while nanopatch measures bf16 against fp32 for its model
MAX_TRIAL_STEPS = 16


def measuring() -> bool:
    """Whether nanopatch is still measuring bf16 against fp32 for a model (``status()``'s
    ``bf16_measured``): the steps of that measurement are warm-up, not steady steps."""
    if "nanopatch" not in sys.modules:
        return False
    import nanopatch

    models = nanopatch.status()["targets"].get("training", {}).get("details") or []
    return any(isinstance(m, dict) and m.get("bf16_measured") == "measuring" for m in models)


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MiB."""
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Channel:
    """The parent's requests (JSON lines on stdin) and the answers (JSON lines on the real stdout).
    Only the answers go to the real stdout; anything else printed (by torch, IPEX, Lightning, ...)
    goes to stderr."""

    def __init__(self) -> None:
        self.answers = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def next(self) -> dict[str, Any]:
        """The next request; ``exit`` when the parent closed the pipe."""
        line = sys.stdin.readline()
        return json.loads(line) if line.strip() else {"cmd": "exit"}

    def answer(self, reply: dict[str, Any]) -> None:
        self.answers.write(json.dumps(reply) + "\n")


def apply_patch(options: dict[str, Any] | None) -> None:
    """``nanopatch.patch_torch(**options)``, before the model and optimizer are built; for None,
    check that nanopatch was never imported."""
    if options is None:
        assert "nanopatch" not in sys.modules, "unpatched variant: nanopatch got imported"
        return
    import nanopatch

    nanopatch.patch_torch(**options)


def setup_reply(request: dict[str, Any], job: Job, facts: dict[str, Any], **times: Any) -> dict[str, Any]:
    """The answer to ``setup``: the interpreter, threads, what the step ran (``facts``), the set-up
    ``times`` (import_s, build_s, warmup_step_s) and nanopatch's status where it was applied."""
    import torch

    options = request["patch"]
    if options is None:
        assert "nanopatch" not in sys.modules, "unpatched variant: nanopatch got imported"
    reply: dict[str, Any] = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": h.installed("torchvision"),
        "ipex": h.installed("intel-extension-for-pytorch"),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "allocator": h.mapped_library("tcmalloc") or h.mapped_library("jemalloc") or "glibc",
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "nanopatch_imported": "nanopatch" in sys.modules,
        "samples_per_step": job.samples_per_step,
        **times,
        "observed": facts,
        "peak_rss_mib": rss_mib()[1],
    }
    if options is not None:
        import nanopatch

        status = nanopatch.status()
        reply["nanopatch"] = {
            "patch_torch": options,
            "options": {
                name: {"value": entry["value"], "reason": entry["reason"]}
                for name, entry in status["options"].items()
                if name in ("training", "bf16", "channels_last", "ipex", "compile")
            },
            "targets": {name: target["state"] for name, target in status["targets"].items()},
            "bf16_measured": [
                m.get("bf16_measured") for m in status["targets"].get("training", {}).get("details") or []
            ],
        }
    return reply


class Sample:
    """The clock of one ``run`` request, started at construction: wall and CPU time of the steps,
    page faults, memory. :meth:`finish` reads the last step's loss (``.item()``, inside the time)."""

    def __init__(self) -> None:
        self.request_cpu = time.process_time()
        gc.collect()
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.cpu_start = time.process_time()
        self.start = time.perf_counter()

    def finish(self, loss) -> dict[str, Any]:
        value = loss.item()
        elapsed = time.perf_counter() - self.start
        cpu = time.process_time() - self.cpu_start
        current, peak = rss_mib()
        return {
            "elapsed_s": elapsed,
            "cpu_s": cpu,
            "loss": value,
            "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults,
            "rss_mib": current,
            "peak_rss_mib": peak,
            "request_cpu_s": time.process_time() - self.request_cpu,
        }


class Profiling:
    """A ``profile`` request, started at construction: ``steps`` steps under torch.profiler (CPU
    activities; shapes recorded, which gives the kineto events their dtypes)."""

    def __init__(self, steps: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.steps = steps
        gc.collect()
        self.profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        self.request_cpu = time.process_time()
        self.profiler.start()
        self.start = time.perf_counter()

    def finish(self, loss) -> dict[str, Any]:
        loss.item()
        elapsed = time.perf_counter() - self.start
        self.profiler.stop()
        summary = profile_summary(self.profiler, self.steps, elapsed)
        summary["request_cpu_s"] = time.process_time() - self.request_cpu
        return summary


#: the ops whose self time is dtype conversion glue around aten::copy_ (which does the converting)
TO_OPS = ("aten::to", "aten::_to_copy")


def profile_summary(profiler, steps: int, elapsed_s: float) -> dict[str, Any]:
    """Per step: the top :data:`PROFILE_TOP` ops by self CPU time (ms, share of the profiled step's
    wall time, calls), and dtype conversion: the self time of the ``aten::copy_`` calls whose
    destination and source dtypes differ (from the kineto events' recorded dtypes), beside all
    ``aten::copy_`` and the ``aten::to`` / ``aten::_to_copy`` around them. Self CPU time is the
    op's own time on the thread that called it (an intra-op parallel kernel counts once, by its
    wall time), so shares of the step's wall time add up to at most about 100%."""
    step_ms = elapsed_s * 1000 / steps
    dtypes: dict[int, list[str]] = {}
    try:  # private, but it is where the recorded dtypes are: [destination, source, non_blocking]
        for event in profiler.profiler.kineto_results.events():
            if event.name() == "aten::copy_":
                dtypes[event.correlation_id()] = list(event.dtypes())
    except Exception:  # informative only: copies of unknown dtypes are counted apart
        dtypes = {}
    copy_us = convert_us = unknown_us = to_us = 0.0
    pairs: dict[str, float] = {}  # "source -> destination" dtypes: self time of the aten::copy_ calls
    for event in profiler.events():
        if event.name == "aten::copy_":
            copy_us += event.self_cpu_time_total
            pair = dtypes.get(event.id, [])
            if len(pair) >= 2 and pair[0] and pair[1]:
                convert_us += event.self_cpu_time_total if pair[0] != pair[1] else 0.0
                key = f"{short_dtype(pair[1])} -> {short_dtype(pair[0])}"
                pairs[key] = pairs.get(key, 0.0) + event.self_cpu_time_total
            else:
                unknown_us += event.self_cpu_time_total
        elif event.name in TO_OPS:
            to_us += event.self_cpu_time_total
    averages = list(profiler.key_averages())
    averages.sort(key=lambda a: a.self_cpu_time_total, reverse=True)

    def per_step(us: float) -> dict[str, float]:
        ms = us / 1000 / steps
        return {"ms": ms, "share": ms / step_ms if step_ms else 0.0}

    return {
        "steps": steps,
        "step_ms": step_ms,
        "self_ms": sum(a.self_cpu_time_total for a in averages) / 1000 / steps,
        "ops": [
            {
                "name": a.key,
                "self_ms": a.self_cpu_time_total / 1000 / steps,
                "share": a.self_cpu_time_total / 1000 / steps / step_ms if step_ms else 0.0,
                "calls": a.count / steps,
            }
            for a in averages[:PROFILE_TOP]
        ],
        "conversion": {
            "what": "self CPU time of aten::copy_ calls whose destination and source dtypes differ",
            **per_step(convert_us),
            "copy_all": per_step(copy_us),
            "copy_unknown_dtypes": per_step(unknown_us),
            "to_ops": per_step(to_us),
            "copy_by_dtypes": {key: per_step(us) for key, us in sorted(pairs.items(), key=lambda kv: -kv[1])},
        },
    }


def short_dtype(name: str) -> str:
    """A kineto dtype name (``c10::BFloat16``, ``float``) as torch spells it (``bfloat16``, ``float32``)."""
    known = {"c10::BFloat16": "bfloat16", "c10::Half": "float16", "float": "float32", "double": "float64"}
    return known.get(name, name.removeprefix("c10::"))


def answer(runner: Any, request: dict[str, Any]) -> dict[str, Any]:
    """A request after ``setup``: ``run`` or ``profile`` N steps, or measure the ``roof``."""
    if request["cmd"] == "roof":
        return {"matmul_flops": matmul_rates()}
    return runner.run(request["steps"]) if request["cmd"] == "run" else runner.profile(request["steps"])


class StepRunner:
    """The worker of a variant whose loop is the script's own: built and warmed up at ``setup``,
    timed at each ``run``, profiled at ``profile``."""

    def __init__(self) -> None:
        self.job: Job | None = None

    def serve(self, channel: Channel, request: dict[str, Any]) -> None:
        channel.answer(self.setup(request))
        while (request := channel.next())["cmd"] != "exit":
            channel.answer(answer(self, request))

    def setup(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        import torch

        apply_patch(request["patch"])  # before the model and optimizer are built
        imported = time.perf_counter()
        job = self.job = Job(request["model"], request["shape"], by_hand=request.get("by_hand", False))
        if request.get("broken"):
            detach_first_layer(job.model)
        built = time.perf_counter()
        record, learning_s = learning_steps(job, request["learn"])
        warmup_s = []
        while len(warmup_s) < request["warmup"] or (measuring() and len(warmup_s) < MAX_TRIAL_STEPS):
            start = time.perf_counter()
            output, loss = job.step()
            loss.item()
            warmup_s.append(time.perf_counter() - start)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=job.by_hand)  # as the step runs forward
        facts = observed(job, compute_dtype(job.model, job.inputs, autocast), output, loss)
        facts["probe"] = probed_step(job)
        if request.get("count_flops"):
            facts["flops_per_sample"] = flops_per_sample(job)
        times = {
            "import_s": imported - started,
            "build_s": built - imported,
            "learning_step_s": learning_s,
            "warmup_step_s": warmup_s,
        }
        return {**setup_reply(request, job, facts, **times), "learning": record}

    def run(self, steps: int) -> dict[str, Any]:
        assert self.job is not None, "run before setup"
        sample = Sample()
        for _ in range(steps):
            _, loss = self.job.step()
        return sample.finish(loss)

    def profile(self, steps: int) -> dict[str, Any]:
        assert self.job is not None, "profile before setup"
        profiling = Profiling(steps)
        for _ in range(steps):
            _, loss = self.job.step()
        return profiling.finish(loss)


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
                if len(self.warmup_s) < request["warmup"] or (measuring() and len(self.warmup_s) < MAX_TRIAL_STEPS):
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


def worker_main() -> int:
    """Answer the parent's requests, one JSON line each, until it says exit: ``setup`` first, then
    ``run`` or ``profile`` (N steps each). On an error, answer it and exit."""
    channel = Channel()
    request = channel.next()
    if request["cmd"] == "exit":
        return 0
    try:
        if request.get("lightning"):
            lightning_serve(channel, request)
        else:
            StepRunner().serve(channel, request)
    except BaseException as exc:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        channel.answer({"error": f"{type(exc).__name__}: {exc}", "traceback": text})
        return 1
    return 0


# --- the parent: workers, rounds, report ---------------------------------------------------


class WorkerFailed(Exception):
    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class Worker:
    """One variant's persistent process, spoken to in JSON lines over its stdin/stdout."""

    def __init__(self, variant: str, python: str, env: dict[str, str], timeout: float) -> None:
        self.variant, self.timeout = variant, timeout
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            text=True,
        )

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
            if not ready:
                self.proc.kill()
                raise WorkerFailed(f"no answer within {self.timeout:.0f} s (killed)", self.stderr_tail())
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise WorkerFailed(self.exit_reason(), self.stderr_tail())
        try:
            reply = json.loads(line)
        except ValueError:
            raise WorkerFailed(f"answered something else than JSON: {line[:200]!r}", self.stderr_tail()) from None
        if "error" in reply:
            raise WorkerFailed(reply["error"], reply.get("traceback", ""))
        return reply

    def exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            reason = f"killed by {name}{hint}"
        else:
            reason = f"exited with status {code}"
        last = [line for line in self.stderr_tail().splitlines() if line.strip()]
        return f"{reason}: {last[-1].strip()}" if last else reason

    def stderr_tail(self, lines: int = 25) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self.stderr.close()


def ipex_interpreter(given: str | None, env: dict[str, str]) -> tuple[str | None, str]:
    """(python, why) for the ipex variants: ``given`` or else this interpreter, if its IPEX
    matches its torch (nanopatch's own check, from package metadata: importing a mismatched
    IPEX ends the interpreter); (None, why not) otherwise."""
    python = given or sys.executable
    code = "import json; from nanopatch.config import ipex_compatibility as c; print(json.dumps(c()))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        ok, why = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return None, f"could not ask {python} about IPEX: {exc}"
    if ok:
        return python, why
    hint = "" if given else "; give an interpreter that has it with --ipex-python PATH"
    return None, f"{python}: {why}{hint}"


def tcmalloc_library() -> str | None:
    """The tcmalloc shared library the runner would preload, or None."""
    from nanopatch import runtime

    return runtime.find_allocator("tcmalloc")


def variant_env(variant: str, env: dict[str, str], model: str = "") -> dict[str, str]:
    """A variant's worker environment: ``by-hand-tcmalloc`` preloads tcmalloc. The test suite's
    hidden models pin bf16 (``NANOPATCH_BF16=1``): a model that small measures faster in fp32,
    and nanopatch would choose fp32, so what the suite checks (bf16 inside) would depend on timing."""
    if model in HIDDEN_MODELS:
        env = {**env, "NANOPATCH_BF16": "1"}
    if variant != BY_HAND_TCMALLOC:
        return env
    preload = " ".join(p for p in (env.get("LD_PRELOAD", ""), tcmalloc_library() or "") if p)
    return {**env, "LD_PRELOAD": preload}


def failed(error: str, detail: str = "") -> dict[str, Any]:
    return {"status": "failed", "error": error, "detail": detail, "samples": []}


def run_model(model: str, variants: list[str], pythons: dict[str, str], skipped: dict[str, str], args, env, log):
    """Start every variant's worker for ``model`` (one after another), then run the rounds.
    ``pythons``: variant -> interpreter; ``skipped``: variant -> why it does not run."""
    shape = SHAPES[args.quick]
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    workers: dict[str, Worker] = {}
    rounds: list[dict[str, Any]] = []
    counter: str | None = None  # the worker that counts the model's FLOPs and measures the roof
    roof: dict[str, float] | None = None
    try:
        for variant in variants:
            if variant in skipped:
                results[variant] = {"status": "skipped", "error": skipped[variant], "samples": []}
                continue
            python = pythons[variant]
            warmup = args.warmup + (COMPILE_EXTRA_WARMUP if variant == COMPILE else 0)
            log(f"{model}: starting {variant} ({python}), {warmup} warm-up step(s)")
            worker = Worker(variant, python, variant_env(variant, env, model), args.timeout)
            request = {
                "cmd": "setup",
                "model": model,
                "shape": shape,
                "warmup": warmup,
                "learn": args.learning_steps,
                "by_hand": variant in BY_HAND_VARIANTS,
                "lightning": variant in LIGHTNING_VARIANTS,
                "broken": variant == BROKEN,
                "count_flops": counter is None and variant not in LIGHTNING_VARIANTS,
            }
            try:
                setup = worker.request({**request, "patch": PATCH_OPTIONS[variant]})
            except WorkerFailed as exc:
                log(f"{model}: {variant} failed: {exc}")
                results[variant] = failed(str(exc), exc.detail)
                worker.close()
                continue
            workers[variant] = worker
            results[variant] = {"status": "ok", "setup": setup, "samples": []}
            if request["count_flops"]:
                counter = variant
        for index in range(args.rounds):
            live = [v for v in variants if v in workers]
            if not live:
                break
            order = h.rotated(live, index)
            rounds.append({"order": order, "loadavg": h.load_average()})
            log(f"{model}: round {index + 1}/{args.rounds}: {', '.join(order)}")
            for variant in order:
                time.sleep(SETTLE_S)
                try:
                    meter = h.LoadMeter()
                    sample = workers[variant].request({"cmd": "run", "steps": args.steps})
                    sample["other_load"] = meter.other_load(sample["request_cpu_s"])
                except WorkerFailed as exc:
                    log(f"{model}: {variant} failed: {exc}")
                    done = results[variant]["samples"]
                    results[variant] = {**failed(str(exc), exc.detail), "setup": results[variant]["setup"]}
                    results[variant]["samples_before_failure"] = done
                    workers.pop(variant).close()
                    continue
                sample["round"] = index
                results[variant]["samples"].append(sample)
        if counter in workers:
            time.sleep(SETTLE_S)
            log(f"{model}: measuring the matmul roof in {counter}'s worker")
            try:
                roof = workers[counter].request({"cmd": "roof"})["matmul_flops"]
            except WorkerFailed as exc:
                log(f"{model}: the roof could not be measured: {exc}")
                workers.pop(counter).close()
        if args.profile:
            for variant in [v for v in variants if v in workers]:
                time.sleep(SETTLE_S)
                log(f"{model}: profiling {variant}, {args.profile} step(s)")
                try:
                    meter = h.LoadMeter()
                    profile = workers[variant].request({"cmd": "profile", "steps": args.profile})
                    profile["other_load"] = meter.other_load(profile["request_cpu_s"])
                    results[variant]["profile"] = profile
                except WorkerFailed as exc:  # the rates stand; the profile is missing
                    log(f"{model}: {variant} failed while profiled: {exc}")
                    results[variant]["profile"] = {"error": str(exc), "detail": exc.detail}
                    workers.pop(variant).close()
    finally:
        for worker in workers.values():
            worker.close()
    flops = results[counter]["setup"]["observed"].get("flops_per_sample") if counter in results else None
    return {
        "description": describe(model, shape),
        "unit": unit(model),
        "shape": shape,
        "rounds": rounds,
        "roof": {"matmul_flops": roof, "n": ROOF_N, "measured_in": counter, "flops_per_sample": flops},
        "seconds": time.perf_counter() - started,
    }, with_roof(summarise(model, results, args.steps), roof, flops)


def with_roof(rows: list[dict[str, Any]], roof: dict[str, float] | None, flops: float | None) -> list[dict[str, Any]]:
    """Each row with a rate gets its model FLOP/s (``rate`` x the model's FLOPs per sample) and
    their fraction of the roof measured in the same run (``roof_fraction``): see :func:`roof_rate`."""
    top = roof_rate(roof)
    for r in rows:
        r["model_flops"] = r["rate"] * flops if r.get("rate") is not None and flops else None
        r["roof_fraction"] = r["model_flops"] / top[1] if r["model_flops"] is not None and top else None
    return rows


def roof_rate(roof: dict[str, float] | None) -> tuple[str, float] | None:
    """The roof: the faster of the machine's bf16 and fp32 matmul rates, with its dtype's name.
    bf16 on a CPU with native bf16 (avx512_bf16, AMX); on one without, bf16 products are
    emulated, far slower than fp32's, and fp32's rate is the most a step can reach."""
    rates = [(name, rate) for name, rate in (roof or {}).items() if rate]
    return max(rates, key=lambda item: item[1]) if rates else None


#: a setup's timing, which a variant that does not learn as stock does not keep
SETUP_TIMING = ("learning_step_s", "warmup_step_s")


def learning_of(variant: str, results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The variant's learning entry: stock's own record, or the variant's judged against it
    (None when the variant never got through its setup)."""
    record = results[variant].get("setup", {}).get("learning")
    stock = results.get(STOCK, {}).get("setup", {}).get("learning")
    return None if record is None else h.learning_entry(record, stock, STOCK)


def summarise(model: str, results: dict[str, dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One row per variant: the median rate over the rounds, its spread, the ratio to stock, and
    the worker's setup and samples; or, for a variant that does not learn as stock, its verdict
    and no rate."""
    rows = []
    for variant, result in results.items():
        common = ("train_step", model, variant)
        learning = learning_of(variant, results)
        extra = {"learning": learning} if learning is not None else {}
        if learning is not None and learning["learns"] is False:  # keeps what it ran, not its samples
            setup = {k: v for k, v in result["setup"].items() if k not in SETUP_TIMING}
            failed = {"error": result["error"]} if result["status"] != "ok" else {}
            r = h.row(*common, None, unit(model), None, status=h.DOES_NOT_LEARN, setup=setup, **extra, **failed)
            rows.append(h.withhold(r))
            continue
        if result["status"] != "ok":
            note = h.one_line(result.get("error") or result["status"])
            rows.append(h.row(*common, None, unit(model), None, stock=variant == STOCK, note=note, **result, **extra))
            continue
        samples, setup = result["samples"], result["setup"]
        rates = [steps * setup["samples_per_step"] / s["elapsed_s"] for s in samples]
        stats = h.spread(rates)
        step_s = statistics.median(s["elapsed_s"] / steps for s in samples)
        untimed = setup["learning_step_s"] + setup["warmup_step_s"]
        extra_s = sum(untimed) - len(untimed) * step_s  # the untimed steps' time beyond as many steady steps
        r = h.row(
            *common,
            stats["median"],
            unit(model),
            None,
            stock=variant == STOCK,
            rates=rates,
            rounds=[s["round"] for s in samples],
            cpu_share=statistics.median(s["cpu_s"] / s["elapsed_s"] / setup["threads"] for s in samples),
            other_load=max((s["other_load"] for s in samples if s["other_load"] is not None), default=None),
            iqr_pct=stats["iqr_pct"],
            step_s=step_s,
            first_step_s=untimed[0] if untimed else None,
            warmup_extra_s=extra_s,
            peak_rss_mib=max(s["peak_rss_mib"] for s in samples),
            target_x_stock=TARGETS.get(model) if variant == PATCHED else None,
            **result,
            **extra,
        )
        if variant == COMPILE:
            r["compile_s"] = extra_s
        rows.append(r)
    stock = next((r for r in rows if r["stock"] and r["rate"] is not None), None)
    h.ratios_to(rows, stock)
    by_hand = next((r for r in rows if r["variant"] == BY_HAND and r["rate"] is not None), None)
    for r in rows:
        r["ratio_to_by_hand"] = None
    h.ratios_to(rows, by_hand, key="ratio_to_by_hand")
    lightning = next((r for r in rows if r["variant"] == LIGHTNING), None)
    tcmalloc = next((r for r in rows if r["variant"] == BY_HAND_TCMALLOC and r["rate"] is not None), None)
    for r in rows:
        if r.get("target_x_stock") is not None and r["ratio_to_stock"] is not None:
            r["met"] = r["ratio_to_stock"] >= r["target_x_stock"]
        r["targets"] = [] if h.learns(r) is False else targets_of(model, r, lightning)
        if r["variant"] == PATCHED and tcmalloc is not None and r["rate"] is not None:
            # not the issue's: nanopatch's own bar, never slower than the hand edit with the allocator
            ratio = r["rate"] / tcmalloc["rate"]
            r["targets"].append({"against": BY_HAND_TCMALLOC, "min": 1.0, "ratio": ratio, "met": ratio >= 1.0})
    return rows


def targets_of(model: str, r: dict[str, Any], lightning: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's targets that apply to row ``r`` (printed, never asserted): ``patched`` against
    stock and against by-hand (the real models); every variant nanopatch patched against
    ``lightning-bf16`` when that ran too (``lightning``: its row). ``met`` is None when either
    side has no rate."""
    out = []

    def check(against: str, minimum: float, ratio: float | None) -> None:
        out.append(
            {"against": against, "min": minimum, "ratio": ratio, "met": None if ratio is None else ratio >= minimum}
        )

    if r["variant"] == PATCHED and model in TARGETS:
        check(STOCK, TARGETS[model], r["ratio_to_stock"])
        if model in TARGETS_BY_HAND:
            check(BY_HAND, TARGETS_BY_HAND[model], r["ratio_to_by_hand"])
    if PATCH_OPTIONS[r["variant"]] is not None and lightning is not None:
        ratio = r["rate"] / lightning["rate"] if lightning["rate"] and r["rate"] is not None else None
        check(LIGHTNING, TARGET_X_LIGHTNING, ratio)
    return out


def ran_as(setup: dict[str, Any]) -> str:
    """A short account of what a variant's step really ran."""
    seen = setup["observed"]
    parts = [f"torch {setup['torch'].split('+')[0]}", f"{seen['compute_dtype'] or '?'} compute"]
    parts.append(f"inside {h.inside(seen['probe'])}" if seen["probe"] else "inside not probed (compiled)")
    if seen["conv_weight_channels_last"] is not None:
        parts.append("channels-last" if seen["conv_weight_channels_last"] else "NCHW")
    if seen["ipex_imported"]:
        parts.append(f"IPEX {setup['ipex']}")
    if seen["dynamo_graphs"]:
        parts.append(f"compiled ({seen['dynamo_graphs']} graphs)")
    if "lightning" in setup:
        parts.append(f"Lightning {setup['lightning']['version']} Trainer, precision {setup['lightning']['precision']}")
    parts.append(f"{seen['loss_dtype']} loss")
    decided = [d for d in setup.get("nanopatch", {}).get("bf16_measured", []) if d]
    if decided:
        parts.append("bf16 " + "; ".join(decided))
    return ", ".join(parts)


def notes_for(rows: list[dict[str, Any]], steps: int) -> list[str]:
    ok = {r["variant"]: r for r in rows if r["status"] == "ok"}
    notes = []
    for variant, result in ok.items():
        state = result["setup"]["nanopatch"]["targets"].get("training") if "nanopatch" in result["setup"] else None
        if "nanopatch" in result["setup"] and state != "patched":
            notes.append(f"`{variant}`: nanopatch's training target is {state}")
        counted = {s["optimizer_steps"] for s in result["samples"] if "optimizer_steps" in s}
        if counted - {steps}:
            notes.append(f"`{variant}`: Lightning counted {sorted(counted)} optimizer steps per sample, not {steps}")
        if result["setup"]["observed"]["loss_dtype"] != "float32":
            notes.append(f"`{variant}`: the loss was computed in {result['setup']['observed']['loss_dtype']}")
    suspects = {v: r for v, r in ok.items() if h.suspect(r)}
    busy = [f"`{v}` CPU {r['cpu_share']:.0%}, other {r.get('other_load') or 0:.0%}" for v, r in suspects.items()]
    if busy:
        notes.append(
            f"CPU below {h.BUSY_CPU_SHARE:.0%} or other load above {h.OTHER_LOAD_WARNING:.0%} ({'; '.join(busy)}): "
            "other processes were taking the cores, so these rates are suspect"
        )
    return notes


def print_markdown(report: dict[str, Any]) -> None:
    machine = report["machine"]
    print("## Training step: stock against nanopatch\n")
    print(h.cpu_line(machine) + f"; memory {machine['mem_total_gib'] or 0:.0f} GiB")
    for python, info in report["interpreters"].items():
        print(
            f"- `{python}` ({', '.join(info['variants'])}): Python {info['python_version']}, torch {info['torch']}, "
            f"torchvision {info['torchvision']}, IPEX {info['ipex'] or '-'}; threads: {info['threads']} intra-op "
            f"(torch's default), {info['interop_threads']} inter-op, affinity CPUs "
            f"{','.join(map(str, info['affinity']))}, OMP_NUM_THREADS {info['omp_num_threads_env'] or 'unset'}"
        )
    print(
        f"- {report['rounds']} rounds x {report['steps']} steps per variant, order rotated each round, one worker "
        f"computing at a time; before them {report['learning_steps']} learning steps and {report['warmup']} warm-up "
        f"steps (+{COMPILE_EXTRA_WARMUP} for compile)"
        f"{'; --quick sizes' if report['quick'] else ''}; 1-min load average at start {machine['loadavg_start']}"
    )
    for model, result in report["models"].items():
        print(f"\n### {model}: {result['description']} ({result['unit']})\n")
        print(roof_line(result.get("roof") or {}, result["unit"]) + "\n")
        print(
            f"| variant | {result['unit']} | min-max | IQR | CPU | x stock | per round | x by-hand | model GFLOP/s "
            "| of roof | first step s | warm-up extra s | peak RSS MiB | ran as |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        rows = [r for r in report["rows"] if r["group"] == model]
        for row in rows:
            variant = row["variant"]
            if row["status"] != "ok":  # failed, skipped, or does not learn (no rate: the verdict instead)
                error = h.cell(row["note"])
                print(f"| {variant} | {row['status']} |  |  |  |  |  |  |  |  |  |  |  | {error} |")
                continue
            per_round = row.get("ratio_per_round") or []
            spread = f"{min(per_round):.2f}-{max(per_round):.2f}" if per_round and variant != STOCK else ""
            cells = [
                variant,
                h.fmt(row["rate"]),
                "-".join(h.fmt(x) for x in row["spread"]),
                f"{row['iqr_pct']:.0f}%",
                f"{row['cpu_share'] * 100:.0f}%",
                ratio_text(row["ratio_to_stock"]),
                spread,
                ratio_text(row.get("ratio_to_by_hand")),
                f"{row['model_flops'] / 1e9:.0f}" if row.get("model_flops") is not None else "",
                f"{row['roof_fraction']:.0%}" if row.get("roof_fraction") is not None else "",
                f"{row['first_step_s']:.1f}" if row["first_step_s"] is not None else "",
                f"{max(0.0, row['warmup_extra_s']):.1f}",
                f"{row['peak_rss_mib']:.0f}",
                ran_as(row["setup"]),
            ]
            print("| " + " | ".join(cells) + " |")
        judged = [r for r in rows if r.get("learning")]
        if judged:
            print(
                f"\nLearning: {h.first_steps(report['learning_steps'])} of each variant from the seed, "
                "judged against stock's by nanopatch.learning (the test suite's definition); a variant that does not "
                "learn as stock gets no rate:\n"
            )
            for r in judged:
                print(f"- {h.learning_line(r)}")
        targets = [f"`{r['variant']}`: {targets_text(r['targets'])}" for r in rows if r.get("targets")]
        if targets:
            print("\nTargets (from the issue; printed, never asserted):\n")
            for line in targets:
                print(f"- {line}")
        notes = notes_for(rows, report["steps"])
        if notes:
            print()
            for note in notes:
                print(f"- {note}")
        for row in rows:
            if row.get("profile"):
                print_profile(model, row)
    print(
        "\nRates: median over the rounds of (steps x samples per step / wall time of the steps). min-max and IQR "
        "(interquartile range / median): the spread of those samples. CPU: the worker's CPU time / (wall time x "
        "its threads); well below 100%, other processes shared the cores. Other load (in the notes): the CPU time "
        "the rest of the machine took during a sample, as a share of all CPUs. x stock, x by-hand: ratios of the "
        "medians; per round: the range of the ratio to stock's sample of the same round. First step: the worker's "
        "first training step (the first learning step). Warm-up extra: the time of the learning and warm-up steps "
        "beyond as many steady steps (for compile: the compile time). Targets are printed, never asserted."
    )
    for note in report["notes"]:
        print(f"\nNote: {note}")
    print(f"\nRun took {report['seconds']:.0f} s.")


def roof_line(roof: dict[str, Any], unit_name: str) -> str:
    """The model's work per sample and the machine's matmul rates it is read against."""
    rates, flops = roof.get("matmul_flops"), roof.get("flops_per_sample")
    work = (
        f"model work {flops / 1e6:,.0f} MFLOP per {unit_name.split('/')[0].rstrip('s')}"
        if flops
        else "model work not counted"
    )
    if not rates:
        return f"Roof not measured; {work}."
    top = roof_rate(rates)
    faster = "bf16" if top and top[0] == "bfloat16" else "fp32 (this CPU's bf16 products are slower)"
    return (
        f"Roof: this machine's {roof['n']}x{roof['n']} matrix product, bf16 {_gflops(rates['bfloat16'])} GFLOP/s, "
        f"fp32 {_gflops(rates['float32'])} GFLOP/s (torch.mm in `{roof['measured_in']}`'s worker, after the rounds); "
        f"{work} (FlopCounterMode over one training step, forward and backward). Model GFLOP/s: rate x model work; "
        f"of roof: their fraction of the faster rate, {faster}."
    )


def _gflops(rate: float) -> str:
    return f"{rate / 1e9:,.0f}" if rate >= 1e10 else f"{rate / 1e9:.2g}"


def ratio_text(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def targets_text(targets: list[dict[str, Any]]) -> str:
    parts = []
    for t in targets:
        against = f"{t['min']:g}x {t['against']}" if t["min"] != 1 else f"{t['against']}"
        verdict = "not run" if t["met"] is None else f"{t['ratio']:.2f}x, {'met' if t['met'] else 'not met'}"
        parts.append(f">= {against}: {verdict}")
    return "; ".join(parts)


def print_profile(model: str, row: dict[str, Any]) -> None:
    """One variant's profile: the top ops by self CPU time and the share of dtype conversion."""
    profile = row["profile"]
    print(f"\n#### Profile: {model}, {row['variant']}\n")
    if "error" in profile:
        print(f"Not profiled: {h.cell(profile['error'])}")
        return
    conversion = profile["conversion"]
    unknown = conversion["copy_unknown_dtypes"]["ms"]
    load = profile.get("other_load")
    if load is not None and load > h.OTHER_LOAD_WARNING:
        print(
            f"**Other processes took {load:.0%} of the machine's CPU time while this was profiled: the times "
            "below are inflated by their contention.**\n"
        )
    print(
        f"{h.plural(profile['steps'], 'step')} under torch.profiler after the timed rounds: "
        f"{profile['step_ms']:.1f} ms per step (unprofiled: {row['step_s'] * 1000:.1f} ms); all ops' self CPU "
        f"{profile['self_ms']:.1f} ms. "
        f"Dtype conversion (self CPU of aten::copy_ with different destination and source dtypes): "
        f"**{conversion['ms']:.1f} ms, {conversion['share']:.0%} of the step**; all aten::copy_ "
        f"{conversion['copy_all']['ms']:.1f} ms ({conversion['copy_all']['share']:.0%}); aten::to + aten::_to_copy "
        f"{conversion['to_ops']['ms']:.1f} ms ({conversion['to_ops']['share']:.0%})"
        + (f"; aten::copy_ of unknown dtypes {unknown:.1f} ms" if unknown else "")
        + ". aten::copy_ by source -> destination dtype: "
        + ", ".join(f"{key} {value['ms']:.2f} ms" for key, value in conversion["copy_by_dtypes"].items())
        + ".\n"
    )
    print("| op | self CPU ms / step | % of step | calls / step |")
    print("|---|---:|---:|---:|")
    for op in profile["ops"]:
        print(f"| `{h.cell(op['name'])}` | {op['self_ms']:.2f} | {op['share']:.1%} | {op['calls']:g} |")


def interpreters(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per interpreter, what its workers reported about themselves (first report wins)."""
    out: dict[str, dict[str, Any]] = {}
    keys = ("python_version", "torch", "torchvision", "ipex", "threads", "interop_threads", "affinity")
    for row in rows:
        if "setup" not in row:
            continue
        setup = row["setup"]
        entry = out.setdefault(setup["python"], {"variants": [], **{k: setup[k] for k in keys}})
        entry["omp_num_threads_env"] = setup["omp_num_threads_env"]
        if row["variant"] not in entry["variants"]:
            entry["variants"].append(row["variant"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, help="timed rounds (default 5; 3 with --quick)")
    parser.add_argument("--steps", type=int, help="training steps per variant and round (default 3; 1 with --quick)")
    parser.add_argument(
        "--warmup",
        type=int,
        help=f"untimed steps after building (default 2; 1 with --quick); compile gets {COMPILE_EXTRA_WARMUP} more",
    )
    parser.add_argument(
        "--learning-steps",
        type=int,
        help=f"steps each variant records from the seed before its warm-up, judged against stock's for the "
        f"learning check (default {h.LEARNING_STEPS[False]}; {h.LEARNING_STEPS[True]} with --quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes to check that it works: 112 px, image batch 8, 64 tokens; 3 rounds of 1 step",
    )
    parser.add_argument(
        "--ipex-python",
        help="interpreter for the ipex variants, whose environment has intel-extension-for-pytorch matching its "
        "torch (default: this one, if it has)",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds a worker may take to answer (default %(default)s)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help=f"after the timed rounds, run N steps of each variant under torch.profiler and report the top "
        f"{PROFILE_TOP} ops by self CPU time and the share of dtype conversion (default: no profile)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # internal: one variant's process
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main()
    models = h.parse_names(args.models, MODELS + HIDDEN_MODELS, "--models", parser, shown=MODELS)
    variants = h.parse_names(args.variants, VARIANTS + HIDDEN_VARIANTS, "--variants", parser, shown=VARIANTS)
    for name, value in DEFAULTS[args.quick].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.rounds, args.steps, args.warmup, args.learning_steps) < 1:
        parser.error("--rounds, --steps, --warmup and --learning-steps must be >= 1")
    if args.profile < 0:
        parser.error("--profile must be >= 0")

    log = h.log
    started = time.perf_counter()
    env = h.clean_env()
    machine = h.machine_facts("intel-extension-for-pytorch")
    pythons = {v: sys.executable for v in variants if v not in IPEX_VARIANTS}
    skipped: dict[str, str] = {}
    notes = []
    if any(v in LIGHTNING_VARIANTS for v in variants) and importlib.util.find_spec("lightning") is None:
        for v in variants:
            if v in LIGHTNING_VARIANTS:
                skipped[v] = "skipped: Lightning is not installed (pip install lightning)"
    if any(v in IPEX_VARIANTS for v in variants):
        ipex_python, why = ipex_interpreter(args.ipex_python, env)
        if ipex_python is None:
            skipped.update({v: f"skipped: {why}" for v in variants if v in IPEX_VARIANTS})
            notes.append(f"the ipex variants are skipped: {why}.")
            log(f"ipex variants skipped: {why}")
        else:
            pythons.update({v: ipex_python for v in variants if v in IPEX_VARIANTS})
            if ipex_python == sys.executable:
                if IPEX in variants and PATCHED in variants:
                    notes.append("`ipex` ran in the same interpreter as `patched`: both are patch_torch() defaults.")
            elif IPEX in variants:
                share = "`ipex-stock` shows that share" if IPEX_STOCK in variants else "add `ipex-stock` to see it"
                notes.append(
                    f"`ipex` runs in {ipex_python} ({why}): its ratio to stock includes the difference between "
                    f"the two interpreters' torch ({share})."
                )
    if BY_HAND_TCMALLOC in variants and tcmalloc_library() is None:
        skipped[BY_HAND_TCMALLOC] = "skipped: no tcmalloc library found (libtcmalloc_minimal4 or gperftools)"
    results, rows = {}, []
    for model in models:
        results[model], model_rows = run_model(model, variants, pythons, skipped, args, env, log)
        rows += model_rows
    report = {
        "benchmark": "train_step",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "quick": args.quick,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "learning_steps": args.learning_steps,
        "compile_extra_warmup": COMPILE_EXTRA_WARMUP,
        "profile_steps": args.profile,
        "targets": {"x_stock": TARGETS, "x_by_hand": TARGETS_BY_HAND, "x_lightning_bf16": TARGET_X_LIGHTNING},
        "seed": SEED,
        "machine": machine,
        "interpreters": interpreters(rows),
        "variant_options": {v: PATCH_OPTIONS[v] for v in variants},
        "models": results,
        "rows": rows,
        "notes": notes,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print_markdown(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
